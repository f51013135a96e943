"""Protection without a sandbox: each kernel runs as a fresh unprivileged user of its own.

Not taught in a lesson: part of the checker (see :mod:`mha_course.grading`; the
"Trust model" of docs/instructors.md says the same for instructors).
Where bubblewrap is missing or forbidden (a Docker or
Gradescope container, whose default seccomp profile refuses the user namespaces it needs) the
kernel still must not read the solutions or the assignment, nor write the instructor's files.
When the checker runs as root, as Gradescope and Docker do, that holds by plain file
permissions:

- **a user of its own** (:class:`Accounts`): every run's kernel gets a user and group id no
  file and no other process has (from a block high in the id range, ``--jobs`` runs at a time
  get different ids), no supplementary groups, ``no_new_privs`` (a set-uid program gives it
  nothing) and no capabilities (Linux clears them all when every uid of a root process becomes
  non-zero). The kernel starts as root only for what runs before any learner code
  (:func:`drop_privileges`, called first thing by :mod:`mha_course.grading.running.kernel`): it
  copies
  its connection file into its working folder, then changes user for good.
- **private files** (:class:`Lockdown`): for that user only the "other" permission bits count,
  so each private path it could reach (the solutions, the assignment and probes files, the
  submissions) loses them for the command's duration and gets them back at its end; a path
  already out of reach (a 0700 home, a 0700 parent folder) is left as it is. The checker reads
  all of them before any kernel starts and keeps reading as root. A folder that holds the
  Python the kernel runs cannot lose them (the report says so); the run's own folder is
  traversable but its ``run/`` folder (the notebook with the expected outputs, pytest's files)
  is the checker's alone.
- **what it writes** (:func:`sweep`): the kernel can write only its working folder and
  world-writable folders (``/tmp``, ``/var/tmp``, ``/dev/shm``; a root-owned checkout is
  read-only to it). After each run every process of its user is killed and every file it left
  in those folders (and in the course checkout, should one of its folders be world-writable)
  is removed and reported by path. ``RLIMIT_NPROC`` now counts that user's processes only, so
  the process limit holds without a cgroup.

Not root (a laptop), none of this is possible: the kernel runs as the checker's user, can read
whatever that user can (the solutions included) and write it. Then the checker restores the
files it snapshotted (the package, the solutions, the assignment, the submissions), reports
every other file of the checkout that changed, and says plainly that nothing else holds
(:func:`mha_course.grading.running.check.Checker.create`). ``MHA_COURSE_KERNEL_USER=same`` asks for
that behaviour as root too (the tests of the unprotected path use it).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

#: The environment variable an instructor may set: ``same`` runs kernels as the checker's user.
USER_ENV = "MHA_COURSE_KERNEL_USER"
#: The environment variable that tells the kernel the ``uid:gid`` to become (set by the checker).
DROP_ENV = "MHA_COURSE_RUN_AS"
#: Where the ids of kernels' users are taken from (the first block inside the id maps), and how
#: many there are (more than any number of runs at a time).
ID_BLOCKS = (2_000_000_000, 3_000_000_000, 60_000)
ID_SLOTS = 512
#: The world-writable folders a kernel's user may write, swept after every run.
SWEPT = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
PR_SET_NO_NEW_PRIVS = 38
#: How the checker's own temporary run folders are named (:mod:`mha_course.grading.running.run`).
RUN_PREFIX = "mha-course-check-"


def _mapped(path: str) -> list[tuple[int, int]]:
    """``[(first id, count)]`` usable in this user namespace (``/proc/self/uid_map``)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return [(0, 2**32 - 1)]
    ranges = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            ranges.append((int(parts[0]), int(parts[2])))
    return ranges


def _inside_maps(first: int, count: int) -> bool:
    return all(any(lo <= first and first + count <= lo + n for lo, n in _mapped(f"/proc/self/{m}"))
               for m in ("uid_map", "gid_map"))


class Accounts:
    """The ids kernels run as: :meth:`lease` one per run, :meth:`release` it after."""

    def __init__(self, base: int):
        self.base = base
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._next = itertools.cycle(range(ID_SLOTS))

    @classmethod
    def find(cls) -> tuple[Accounts | None, str]:
        """``(accounts, "")`` where kernels can run as users of their own, else ``(None, why)``.

        Needs root (on Linux); the first block of :data:`ID_BLOCKS` inside this namespace's id
        maps is used, and a probe checks that such a user can start this Python with NumPy and
        ipykernel (a Python under a private home folder cannot be).
        """
        if os.environ.get(USER_ENV, "").strip().lower() == "same":
            return None, f"{USER_ENV}=same was set"
        if not sys.platform.startswith("linux") or not hasattr(os, "geteuid"):
            return None, "kernels run as your own user on this system (not Linux)"
        if os.geteuid() != 0:
            return None, ("the checker is not root, so kernels run as your own user and can "
                          "read and write what you can")
        base = next((b for b in ID_BLOCKS if _inside_maps(b, ID_SLOTS)), None)
        if base is None:
            return None, "no block of unused user ids is mapped in this container"
        try:
            probe = subprocess.run([sys.executable, "-c", "import numpy, ipykernel"],
                                   user=base, group=base, extra_groups=[], cwd="/",
                                   capture_output=True, timeout=120, check=False,
                                   env={k: v for k, v in os.environ.items()
                                        if k != "PYTHONPATH"} | {"HOME": "/"})
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"a kernel cannot run as an unprivileged user here ({exc})"
        if probe.returncode != 0:
            err = probe.stderr.decode("utf-8", "replace").strip().splitlines()
            return None, ("an unprivileged user cannot run this Python with NumPy and ipykernel "
                          f"({err[-1] if err else probe.returncode}); install the course where "
                          "every user can read it (not under a private home folder)")
        return cls(base), ""

    def lease(self) -> int:
        """An id no run uses now; its leftover processes, if any, are killed first."""
        with self._lock:
            for _ in range(ID_SLOTS):
                uid = self.base + next(self._next)
                if uid not in self._busy:
                    self._busy.add(uid)
                    break
            else:
                raise RuntimeError("more runs at a time than kernel user ids")
        kill_user(uid)
        return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._busy.discard(uid)


def kill_user(uid: int) -> None:
    """SIGKILL every process running as ``uid`` (what a run of that user left behind)."""
    import psutil

    for _ in range(20):
        found = []
        for proc in psutil.process_iter(["uids"]):
            try:
                if proc.info["uids"] is not None and uid in proc.info["uids"]:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        if not found:
            return
        for proc in found:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def prepare_run_folder(root: Path, run: Path, work: Path, uid: int) -> None:
    """Make the run's folder traversable, ``run/`` the checker's alone, ``work/`` the kernel's."""
    os.chmod(root, 0o711)
    os.chmod(run, 0o700)
    os.chown(work, uid, uid)
    os.chmod(work, 0o700)


def drop_privileges(spec: str | None, argv: list) -> None:
    """In the kernel, before any learner code: become ``uid:gid`` of ``spec`` for good.

    The connection file (``-f FILE`` in ``argv``, written by the checker for root only) is
    copied into the working folder first, readable by the new user alone, and ``argv`` points
    at the copy. Raises ``SystemExit`` when the user cannot be changed: the kernel never runs
    learner code as root.
    """
    if not spec:
        return
    try:
        uid, gid = (int(x) for x in spec.split(":"))
        if "-f" in argv:
            at = argv.index("-f") + 1
            source = Path(argv[at])
            copy = Path.cwd() / "kernel-connection.json"
            copy.write_bytes(source.read_bytes())
            os.chown(copy, uid, gid)
            os.chmod(copy, 0o600)
            argv[at] = str(copy)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
            raise OSError("the ids did not change")
    except (OSError, ValueError) as exc:
        raise SystemExit(f"the kernel could not become an unprivileged user: {exc}") from None


def _other_reaches(path: Path) -> bool:
    """Whether a user that is neither the owner nor in the group can read ``path``: every
    parent folder has its other-x bit and the path itself other-r (or other-x, a folder)."""
    try:
        for parent in reversed(path.parents):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IROTH | stat.S_IXOTH | stat.S_IWOTH))


@dataclass
class Locked:
    path: Path
    mode: int


class Lockdown:
    """Private paths out of the kernel users' reach for one command (see the module docstring).

    A path none but its owner (and group) can reach is left alone. A folder that holds the
    Python the kernel runs (``keep_open``: a ``.venv`` in the checkout) keeps its other-x bit
    only (it can be passed through, not listed), and each of its entries is made private in
    turn, but for the way to that Python. :meth:`close` (also run at exit) gives every path its
    permission bits back.
    """

    def __init__(self, paths, keep_open=()):
        self.locked: list[Locked] = []
        self.notes: list[str] = []
        self._keep = [Path(p).resolve() for p in keep_open]
        for path in dict.fromkeys(Path(p).resolve() for p in paths):
            if path.exists() and _other_reaches(path):
                self._lock(path)
        import atexit

        atexit.register(self.close)

    def _lock(self, path: Path) -> None:
        try:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
        except OSError:
            return
        if stat.S_ISLNK(os.lstat(path).st_mode) or not mode & 0o007:
            return
        if any(p == path or p in path.parents for p in self._keep):
            return  # the Python the kernel runs, or inside it
        holds = path.is_dir() and any(path in p.parents for p in self._keep)
        try:
            os.chmod(path, (mode & ~0o007) | (0o001 if holds else 0))
        except OSError as exc:
            self.notes.append(f"{path} stays readable to the kernel ({exc})")
            return
        self.locked.append(Locked(path, mode))
        if holds:
            try:
                entries = sorted(path.iterdir())
            except OSError:
                return
            for entry in entries:
                self._lock(entry)

    def close(self) -> None:
        while self.locked:
            item = self.locked.pop()
            try:
                os.chmod(item.path, item.mode)
            except OSError:
                pass


@dataclass(frozen=True)
class Written:
    """A file a kernel's user left outside its working folder (found by :func:`sweep`)."""

    path: Path
    during: str

    def describe(self) -> str:
        who = f"while {self.during} was being checked" if self.during else "during the check"
        return f"{self.path}: written by a kernel {who}; removed"


def _owned(path: Path, uid: int) -> bool:
    try:
        return os.lstat(path).st_uid == uid
    except OSError:
        return False


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass


def sweep(uid: int, roots=SWEPT, skip=(), depth: int = 6) -> list[Path]:
    """Remove what ``uid`` wrote under ``roots``; return the paths removed.

    Only folders that user could write are looked into (world-writable ones, and the ones it
    made, which go as a whole); ``skip`` folders (the runs' own folders) are not entered.
    """
    found = []
    skip = {Path(p).resolve() for p in skip}

    def visit(folder: Path, level: int) -> None:
        if level > depth or folder in skip or folder.name.startswith(RUN_PREFIX):
            return
        try:
            entries = list(os.scandir(folder))
            mode = os.stat(folder).st_mode
        except OSError:
            return
        writable = bool(mode & stat.S_IWOTH)
        for entry in entries:
            path = Path(entry.path)
            if path in skip:
                continue
            if writable and _owned(path, uid):
                found.append(path)
                _remove(path)
                continue
            try:
                if entry.is_dir(follow_symlinks=False) and os.stat(path).st_mode & stat.S_IXOTH:
                    visit(path, level + 1)
            except OSError:
                continue

    for root in roots:
        root = Path(root)
        if root.is_dir():
            visit(root.resolve(), 0)
    return found
