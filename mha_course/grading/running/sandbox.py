"""Isolation of a learner's code: private copies of the package, and the bubblewrap sandbox.

Not taught in a lesson: part of the checker (see :mod:`mha_course.grading`; the
"Trust model" of docs/instructors.md says the same for instructors).
Learner code runs in one process only, the notebook's
kernel, and each nbval run gets its own temporary folder (:class:`RunFolders`):

- ``run/``: the notebook, pytest's files; the pytest process (trusted) works here. The kernel
  is never told this folder, and in the sandbox cannot see it.
- ``lib/``: a private copy of the ``mha_course`` package, written from the snapshot the checker
  took when it started (:class:`Library`); both pytest and the kernel import the course from
  here (``PYTHONPATH``), and the kernel imports the checks before any learner code runs
  (:mod:`mha_course.grading.running.kernel`). A file a submission changes on disk is never read by
  another submission's run.
- ``work/``: the kernel's working folder without the sandbox. In the sandbox the kernel works
  in ``/tmp/work`` instead, inside its private ``/tmp``: one ``tmpfs`` of the disk limit's size.
- ``k/``: the kernel's connection file (and, in the sandbox, its IPC sockets).

Where bubblewrap works (:func:`find_sandbox`), the kernel runs under :func:`bwrap_command`: the
whole file system read-only except its private ``/tmp`` and ``k/``, ``/run`` and the folders
the checker is told to hide (the course checkout with its solutions, the submissions) replaced
by empty ones, no network, its own process, IPC and cgroup namespaces, no capabilities; the
sandbox dies with the process that started it. The probe that decides whether bubblewrap works
runs the same command as a real run (the Python installation bound back where a hidden folder or
``/tmp`` holds it), so a checkout under ``/tmp`` is sandboxed too. What the kernel may use
(memory, processes, disk) is in :mod:`mha_course.grading.running.limits`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import py_compile
import shutil
import site
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .account import DROP_ENV
from .limits import ENV, Enforcement, Limits, kernel_env, launcher

#: The module the kernel is started with (it imports the checks, then starts ipykernel).
KERNEL_MODULE = "mha_course.grading.running.kernel"
#: Where the kernel works inside the sandbox: in its private /tmp (one tmpfs, the disk limit).
SANDBOX_WORK = "/tmp/work"
#: Shown once per command when learners' code runs without a sandbox (completed by the reason).
UNSANDBOXED = ("learners' code runs WITHOUT a sandbox: {reason}; it can read and write whatever "
               "you can (see the trust model in docs/instructors.md)")
#: Shown instead when, without a sandbox, each kernel runs as a user of its own (root only).
OWN_USER = ("learners' code runs without a sandbox ({reason}), each kernel as an unprivileged "
            "user of its own: it cannot read the solutions, the assignment or the submissions, "
            "nor write your files (see the trust model in docs/instructors.md)")
#: The environment variable that turns the sandbox off (``off``), as ``--no-sandbox`` does.
SANDBOX_ENV = "MHA_COURSE_SANDBOX"


@dataclass(frozen=True)
class Library:
    """A snapshot of the ``mha_course`` package: ``{relative path: bytes}``, with compiled code.

    Taken once when the checker starts; :meth:`write` puts a fresh copy into each run's folder.
    The compiled files are unchecked-hash ``.pyc`` files, so neither process recompiles them.
    """

    files: dict

    @classmethod
    def snapshot(cls, package_dir: str | Path | None = None) -> Library:
        """Read the package (default: the one this module belongs to) and compile it."""
        package_dir = Path(package_dir or Path(__file__).resolve().parents[2])
        files = {}
        with tempfile.TemporaryDirectory(prefix="mha-course-pyc-") as tmp:
            for path in sorted(package_dir.rglob("*")):
                rel = path.relative_to(package_dir.parent)
                if (not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc"
                        or rel.parts[1:3] == ("grading", "references")):  # the checker's alone
                    continue
                files[rel.as_posix()] = path.read_bytes()
                if path.suffix != ".py":
                    continue
                cached = Path(importlib.util.cache_from_source(str(rel)))
                out = Path(tmp) / cached
                py_compile.compile(str(path), cfile=str(out), dfile=str(rel), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
                files[cached.as_posix()] = out.read_bytes()
        return cls(files)

    def write(self, folder: Path) -> None:
        """Write the copy into ``folder`` (which then holds ``mha_course/``)."""
        for rel, data in self.files.items():
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def changed(self, package_dir: Path) -> list[str]:
        """Source files of ``package_dir`` that differ from the snapshot (tamper detection)."""
        return files_changed({package_dir.parent / rel: data for rel, data in self.files.items()
                              if not rel.endswith(".pyc")})


def files_changed(snapshot: dict[Path, bytes]) -> list[str]:
    """The paths of ``snapshot`` whose file no longer holds the bytes recorded (or is gone)."""
    found = []
    for path, data in snapshot.items():
        try:
            same = Path(path).read_bytes() == data
        except OSError:
            same = False
        if not same:
            found.append(str(path))
    return found


#: The suffix of the file that keeps the bytes a file held when it was restored.
CHANGED_SUFFIX = ".changed-during-check"


@dataclass(frozen=True)
class Change:
    """A watched file found changed after a run (see :class:`FileGuard`)."""

    path: Path
    #: The submissions whose checks were running since the file was last seen unchanged.
    during: tuple
    #: Where the changed bytes were kept (None: the file was gone, or it was left as it is).
    kept: Path | None = None
    restored: bool = False
    #: Why it could not be restored ("" when it was, or was left on purpose).
    error: str = ""

    def describe(self) -> str:
        """One line for the report: ``PATH: changed while A was being checked; restored ...``."""
        during = sorted(self.during)
        who = (f"while {', '.join(during)} {'was' if len(during) == 1 else 'were'} being checked"
               if during else "during the check")
        if self.error:
            return f"{self.path}: changed {who}; it could not be restored ({self.error})"
        if not self.restored:
            return f"{self.path}: changed {who}; left as it is now"
        kept = (f", the changed bytes kept in {self.kept.name} beside it" if self.kept
                else " (it had been deleted)")
        return f"{self.path}: changed {who}; restored as it was before the check{kept}"


def _readable_notebook(data: bytes | None) -> bool:
    try:
        nb = json.loads(data.decode("utf-8")) if data is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(nb, dict) and isinstance(nb.get("cells"), list)


def _free_name(path: Path) -> Path:
    """``NAME.changed-during-check``, or ``...-2``, ``-3`` when it exists."""
    candidate, n = path.with_name(path.name + CHANGED_SUFFIX), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}{CHANGED_SUFFIX}-{n}")
    return candidate


class FileGuard:
    """Snapshots of the files no check may change, taken before any learner code runs.

    After every run :meth:`verify` compares each file with its snapshot. Where a kernel could
    have written it (``restore=True``: the checker runs unsandboxed), a changed file is put
    back as it was, byte for byte and with its time stamp, and the bytes found are kept beside
    it in ``NAME.changed-during-check``; a deleted file is written back. A learner's own
    notebook (``own=True``, one notebook checked by itself) that still reads as a notebook is
    left as it is: it is their save from an editor (and their code could only have written
    their own file); the report says so. In the sandbox no kernel can write these files, so a
    change comes from outside (an editor) and is only reported.
    """

    def __init__(self, restore: bool = False):
        self.restore = restore
        self._files: dict[Path, tuple[bytes, int | None, bool]] = {}
        self._lock = threading.Lock()
        self.changes: list[Change] = []

    def add(self, path, data: bytes | None = None, own: bool = False) -> None:
        """Watch ``path`` (its bytes now, or ``data`` read earlier); a missing file is skipped."""
        path = Path(path)
        try:
            if data is None:
                data = path.read_bytes()
            mtime = path.stat().st_mtime_ns
        except OSError:
            return
        with self._lock:
            self._files.setdefault(path, (data, mtime, own))

    def __len__(self) -> int:
        return len(self._files)

    def paths(self) -> list[Path]:
        """The files watched."""
        with self._lock:
            return list(self._files)

    def report(self, changes) -> None:
        """Add ``changes`` found by other means (what a kernel wrote elsewhere) to the report."""
        with self._lock:
            self.changes += list(changes)

    def verify(self, during=()) -> list[Change]:
        """Compare every file with its snapshot; restore or report each change (see above)."""
        found = []
        with self._lock:
            for path, (data, mtime, own) in list(self._files.items()):
                try:
                    now = path.read_bytes()
                except OSError:
                    now = None
                if now == data:
                    continue
                change = self._handle(path, data, mtime, own, now, tuple(during))
                if not change.restored and not change.error:
                    self._files[path] = (now, None, own)  # report it once, not after every run
                found.append(change)
            self.changes += found
        return found

    def _handle(self, path, data, mtime, own, now, during) -> Change:
        if not self.restore or (own and _readable_notebook(now)):
            return Change(path, during)
        kept = None
        try:
            if now is not None:
                kept = _free_name(path)
                kept.write_bytes(now)
            tmp = path.with_name(f".{path.name}.mha-course-restore")
            tmp.write_bytes(data)
            if mtime is not None:
                os.utime(tmp, ns=(mtime, mtime))
            os.replace(tmp, path)
        except OSError as exc:
            return Change(path, during, kept, error=str(exc))
        return Change(path, during, kept, restored=True)


#: Folders a tree watch does not look into (caches, environments, version control).
UNWATCHED = {".git", ".venv", "venv", "__pycache__", ".ipynb_checkpoints", ".pytest_cache",
             ".ruff_cache", "node_modules", "build", "dist"}


@dataclass(frozen=True)
class TreeChange:
    """A file of a watched tree that appeared, changed or went during the check."""

    path: Path
    what: str
    during: tuple

    def describe(self) -> str:
        during = sorted(self.during)
        who = (f"while {', '.join(during)} {'was' if len(during) == 1 else 'were'} being checked"
               if during else "during the check")
        return f"{self.path}: {self.what} {who}; left as it is (look at it)"


class TreeWatch:
    """The size and time stamp of every file under some folders (the course checkout, the
    submissions), looked at again after every run: where learners' kernels run as the
    checker's own user, what a submission wrote there is reported by path (files a
    :class:`FileGuard` watches are restored by it, and left out here)."""

    def __init__(self, folders, skip=()):
        self.folders = [Path(f).resolve() for f in dict.fromkeys(folders) if Path(f).is_dir()]
        self.skip = {Path(p).resolve() for p in skip}
        self._lock = threading.Lock()
        self._state = self._scan()

    #: At most this many files per folder are watched (a home folder given by mistake).
    LIMIT = 50_000

    def _scan(self) -> dict:
        state = {}
        for folder in self.folders:
            count = 0
            for root, dirs, files in os.walk(folder):
                count += len(files)
                if count > self.LIMIT:
                    break
                dirs[:] = [d for d in dirs if d not in UNWATCHED]
                for name in files:
                    path = Path(root) / name
                    if path.suffix == ".pyc" or CHANGED_SUFFIX in str(path):
                        continue
                    try:
                        st = path.lstat()
                    except OSError:
                        continue
                    state[path] = (st.st_size, st.st_mtime_ns)
        return state

    def look(self, during=(), skip=()) -> list[TreeChange]:
        """What appeared, changed or went since the last look (less the ``skip`` files)."""
        skip = {Path(p).resolve() for p in skip} | self.skip
        with self._lock:
            now = self._scan()
            found = []
            for path in sorted(set(now) | set(self._state)):
                if path in skip:
                    continue
                if path not in self._state:
                    found.append(TreeChange(path, "written", tuple(during)))
                elif path not in now:
                    found.append(TreeChange(path, "deleted", tuple(during)))
                elif now[path] != self._state[path]:
                    found.append(TreeChange(path, "changed", tuple(during)))
            self._state = now
            return found


@dataclass(frozen=True)
class RunFolders:
    """The folders of one run (see the module docstring)."""

    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def kernel(self) -> Path:
        return self.root / "k"

    def make(self) -> RunFolders:
        for folder in (self.run, self.lib, self.work, self.kernel):
            folder.mkdir(parents=True, exist_ok=True)
        return self


def _base_args(bwrap: str) -> list[str]:
    args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]  # root in the sandbox could otherwise remount rw
    return args


def choose_sandbox(enabled: bool = True) -> tuple[str | None, str]:
    """:func:`find_sandbox`, unless :data:`SANDBOX_ENV` is ``off`` (read at every call)."""
    if enabled and os.environ.get(SANDBOX_ENV, "").strip().lower() == "off":
        return None, f"{SANDBOX_ENV}=off was set"
    return find_sandbox(enabled)


@functools.lru_cache(maxsize=4)
def find_sandbox(enabled: bool = True) -> tuple[str | None, str]:
    """``(bwrap path, "")`` when each run can be sandboxed, else ``(None, why not)``.

    Bubblewrap is tried once per process (a container without user namespaces has the binary
    but cannot use it), with the command a real run uses: the same mounts, this Python bound
    back where ``/tmp`` or the hidden checkout holds it, and a disk-limited ``/tmp``.
    """
    if not enabled:
        return None, "--no-sandbox was given"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, ("bwrap (bubblewrap) is not installed; on Debian or Ubuntu: "
                      "apt-get install bubblewrap")
    with tempfile.TemporaryDirectory(prefix="mha-course-probe-") as tmp:
        folders = RunFolders(Path(tmp)).make()
        checkout = Path(__file__).resolve().parents[3]
        command = bwrap_command(bwrap, folders, hidden=(checkout,), disk=16 * 1024**2)
        try:
            probe = subprocess.run(command + [sys.executable, "-c", "pass"],
                                   capture_output=True, timeout=60, check=False,
                                   cwd=folders.work)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"bwrap cannot start a sandbox here ({exc})"
    if probe.returncode != 0:
        err = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"bwrap cannot start a sandbox here ({err[-1] if err else probe.returncode})"
    return bwrap, ""


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def python_paths() -> list[Path]:
    """What the kernel's Python needs to read: the prefixes and the site-packages folders."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), *site.getsitepackages()]
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        paths.append(site.getusersitepackages())
    paths += [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    found = []
    for raw in paths:
        for path in (Path(raw), Path(raw).resolve()):
            if path.is_dir() and path not in found:
                found.append(path)
    return found


def bwrap_command(bwrap: str, folders: RunFolders, hidden=(), disk: int | None = None
                  ) -> list[str]:
    """The ``bwrap ... --`` prefix that sandboxes the kernel of the run in ``folders``.

    ``hidden`` folders (the course checkout, the submissions) are replaced by empty ones; the
    Python installation is bound back read-only where it lies inside one of them (a ``.venv``
    in the checkout). The private ``/tmp`` (the kernel's home and working folder) is a tmpfs of
    ``disk`` bytes (None: the tmpfs default, half the memory).
    """
    masks = [Path("/tmp")]
    if Path("/run").is_dir() and not Path("/run").is_symlink():
        masks.append(Path("/run"))  # sockets of system services: a way out without a network
    for raw in hidden:
        path = Path(raw).resolve()
        if path.is_dir() and path != Path("/"):
            masks.append(path)
    masks = sorted(set(masks), key=lambda p: len(p.parts))
    masks = [m for i, m in enumerate(masks) if not any(_inside(m, o) for o in masks[:i])]
    args = _base_args(bwrap)
    for mask in masks:
        if mask == Path("/tmp") and disk:
            args += ["--size", str(int(disk))]
        args += ["--tmpfs", str(mask)]
    exposed = [p for p in python_paths() if any(_inside(p, m) for m in masks)]
    exposed = sorted(exposed, key=lambda p: len(p.parts))
    exposed = [p for i, p in enumerate(exposed) if not any(_inside(p, o) for o in exposed[:i])]
    for path in exposed:
        args += ["--ro-bind", str(path), str(path)]
    lib, kernel = (str(p.resolve()) for p in (folders.lib, folders.kernel))
    args += ["--ro-bind", lib, lib, "--bind", kernel, kernel, "--dir", SANDBOX_WORK]
    for mask in masks:  # the empty folders are read-only too; /tmp is the kernel's own
        if mask != Path("/tmp"):
            args += ["--remount-ro", str(mask)]
    args += ["--setenv", "HOME", "/tmp", "--setenv", "IPYTHONDIR", "/tmp/.ipython",
             "--setenv", "MPLCONFIGDIR", "/tmp/.matplotlib",
             "--unsetenv", "JPY_PARENT_PID",  # its parent is the sandbox's init, not pytest
             "--chdir", SANDBOX_WORK, "--"]
    return args


def kernel_spec(folders: RunFolders, bwrap: str | None, hidden=(), limits: Limits | None = None,
                enforcement: Enforcement | None = None, cgroups=None,
                account: int | None = None) -> dict:
    """How the nbval plugin starts the kernel (``--mha-kernel``): argv, transport, folders.

    In the sandbox the kernel has no network, so it talks to pytest over IPC sockets in ``k/``
    and is interrupted by a message rather than a signal (the signal would reach bwrap).
    ``limits`` are applied as :mod:`~mha_course.grading.running.limits` says: the kernel joins its
    ``cgroups`` (a :class:`~mha_course.grading.running.limits.KernelCgroups`) before anything runs,
    and
    sets its own rlimits (the environment variable ``MHA_COURSE_LIMITS``). ``account``: without
    the sandbox, the user (and group) id the kernel becomes before any learner code runs
    (:mod:`mha_course.grading.running.account`); its home is then its working folder, and the
    process
    limit is its own ``RLIMIT_NPROC`` (that user runs nothing else).
    """
    limits = limits or Limits(None, None, None)
    enforcement = enforcement or Enforcement()
    kernel = folders.kernel.resolve()
    inner = [sys.executable, "-m", KERNEL_MODULE, "-f", "{connection_file}"]
    prefix = launcher(cgroups.procs_files() if cgroups is not None else ())
    own_user = bwrap is None and account is not None
    env = {ENV: kernel_env(limits, nproc=own_user or (bwrap is not None
                                                      and enforcement.nproc_in_sandbox))}
    if own_user:
        work = str(folders.work.resolve())
        env.update({DROP_ENV: f"{account}:{account}", "HOME": work, "USER": "mha-kernel",
                    "LOGNAME": "mha-kernel", "IPYTHONDIR": f"{work}/.ipython",
                    "MPLCONFIGDIR": f"{work}/.matplotlib", "TMPDIR": work})
    spec = {"cwd": str(folders.work.resolve()), "connection_file": str(kernel / "kernel.json"),
            "env": env, "limits": {"memory": limits.memory, "processes": limits.processes,
                                   "disk": limits.disk},
            "cgroups": [str(f) for f in cgroups.unique()] if cgroups is not None else []}
    if bwrap is None:
        return {**spec, "argv": prefix + inner, "interrupt_mode": "signal", "transport": "tcp",
                "ip": "127.0.0.1"}
    return {**spec, "argv": prefix + bwrap_command(bwrap, folders, hidden, limits.disk) + inner,
            "interrupt_mode": "message", "transport": "ipc", "ip": str(kernel / "ipc")}
