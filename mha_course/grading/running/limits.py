"""Limits on what one submission's kernel may use: memory, processes and disk (beside the time).

Not taught in a lesson: part of the checker (see :mod:`mha_course.grading`; the
"Trust model" of docs/instructors.md says the same for instructors).
Every kernel the checker starts gets the same
:class:`Limits` (``python -m mha_course check --memory 4G --processes 256 --disk 1G``); the
cell timeout is the fourth limit. What enforces each one depends on the machine, and is found
once per command (:func:`find_enforcement`):

- **processes**: a fork bomb must stop. As root, ``RLIMIT_NPROC`` does not apply (the kernel
  exempts uid 0 of the first user namespace, capabilities or not), so where the checker can make
  a cgroup (root on Linux, cgroup v1's ``pids`` hierarchy or a v2 tree with the controller
  enabled) each kernel gets one with ``pids.max``; it counts threads too. Elsewhere, inside the
  sandbox, the kernel sets ``RLIMIT_NPROC`` itself (:mod:`mha_course.grading.running.kernel`) once
  it
  is in bubblewrap's user namespace, where Linux counts only that sandbox's processes.
- **memory**: every process of the kernel gets ``RLIMIT_AS`` (a NumPy allocation past it raises
  ``MemoryError`` and the kernel lives on); with a cgroup, the whole process tree is bounded too
  (``memory.limit_in_bytes`` or ``memory.max``), so forked copies cannot add up past it.
- **disk**: in the sandbox, ``/tmp``, the home folder and the working folder are one ``tmpfs``
  of that size (``bwrap --size``); everywhere, ``RLIMIT_FSIZE`` caps every file the kernel
  writes.

:func:`limit_message` turns what a cell raised into the words the report shows ("the memory
limit of 4 GiB per kernel was reached (--memory)"). This module imports nothing from the
package, so the kernel can use it before anything else.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: Defaults: what one kernel may use (``check --memory``, ``--processes``, ``--disk``).
DEFAULT_MEMORY = 4 * 1024**3
DEFAULT_PROCESSES = 256
DEFAULT_DISK = 1024**3
#: The environment variable that tells the kernel its rlimits (set by :func:`kernel_env`).
ENV = "MHA_COURSE_LIMITS"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_size(text: str) -> int:
    """``"4G"``, ``"512M"``, ``"1.5GiB"``, ``"1000000"`` -> bytes.

    >>> parse_size("4G"), parse_size("512MiB"), parse_size("10")
    (4294967296, 536870912, 10)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size: write it as 4G, 512M or a number of bytes")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value < 1:
        raise ValueError(f"{text!r} is not a size: it must be at least one byte")
    return int(value)


def size_text(n: int) -> str:
    """Bytes as a short text.

    >>> size_text(4 * 1024**3), size_text(1536 * 1024**2), size_text(1000)
    ('4 GiB', '1.5 GiB', '1000 bytes')
    """
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


@dataclass(frozen=True)
class Limits:
    """What one kernel may use; ``None`` means no limit of that kind."""

    memory: int | None = DEFAULT_MEMORY
    processes: int | None = DEFAULT_PROCESSES
    disk: int | None = DEFAULT_DISK

    def describe(self) -> str:
        """``"memory 4 GiB, 256 processes, disk 1 GiB"`` for the report's header."""
        parts = [f"memory {size_text(self.memory)}" if self.memory else "memory unlimited",
                 f"{self.processes} processes" if self.processes else "processes unlimited",
                 f"disk {size_text(self.disk)}" if self.disk else "disk unlimited"]
        return ", ".join(parts)


@dataclass(frozen=True)
class Enforcement:
    """How this machine enforces :class:`Limits` (see the module docstring).

    ``cgroups`` maps a controller (``"pids"``, ``"memory"``) to ``(folder, v2)``: where a
    cgroup per kernel can be made, and whether it is cgroup v2; ``nproc_in_sandbox`` says
    ``RLIMIT_NPROC`` works inside the sandbox (not root); ``missing`` lists what is not
    enforced, in words.
    """

    cgroups: dict = field(default_factory=dict)
    nproc_in_sandbox: bool = False
    missing: tuple = ()


def _own_cgroup(controller: str) -> tuple[Path, str] | None:
    """``(mount point, this process's cgroup path)`` for a v1 ``controller``, or v2's."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            mount = CGROUP_ROOT / controller
            if mount.is_dir():
                return mount, path
    for line in lines:
        if line.startswith("0::"):
            for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                if (mount / "cgroup.controllers").is_file():
                    return mount, line[3:]
    return None


def _limit_file(controller: str, v2: bool) -> str:
    if controller == "pids":
        return "pids.max"
    return "memory.max" if v2 else "memory.limit_in_bytes"


def _usable_parent(controller: str) -> tuple[Path, bool] | None:
    """``(folder, is cgroup v2)`` in which a cgroup with ``controller`` can be made, or None."""
    own = _own_cgroup(controller)
    if own is None:
        return None
    mount, path = own
    parent = mount / path.lstrip("/")
    v2 = (mount / "cgroup.controllers").is_file()
    try:
        if v2 and controller not in (parent / "cgroup.subtree_control").read_text().split():
            return None  # not delegated to our subtree (enabling it would move our processes)
    except OSError:
        return None
    probe = parent / f"mha-course-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return None
    try:
        (probe / _limit_file(controller, v2)).write_text("1000\n")
        return parent, v2
    except OSError:
        return None
    finally:
        _remove(probe)


def find_enforcement(limits: Limits, sandboxed: bool, own_user: bool = False) -> Enforcement:
    """Which mechanism enforces each limit here, and what is missing (in words).

    ``own_user``: each kernel runs as a user of its own (no sandbox, as root; see
    :mod:`mha_course.grading.running.account`), so its ``RLIMIT_NPROC`` counts its processes only.
    """
    cgroups = {}
    if os.name == "posix" and hasattr(os, "geteuid"):
        for controller, wanted in (("pids", limits.processes), ("memory", limits.memory)):
            if wanted:
                found = _usable_parent(controller)
                if found is not None:
                    cgroups[controller] = found
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    nproc = sandboxed and not root
    missing = []
    if limits.processes and "pids" not in cgroups and not nproc and not own_user:
        why = ("as root RLIMIT_NPROC does not apply and no pids cgroup can be made here"
               if root else "without the sandbox RLIMIT_NPROC would count all your processes")
        missing.append(f"the process limit is not enforced ({why})")
    if limits.disk and not sandboxed:
        missing.append("without the sandbox only the size of each file is limited, not the "
                       "total a submission writes")
    return Enforcement(cgroups, nproc, tuple(missing))


class KernelCgroups:
    """The cgroups of one kernel (one per controller), made before it starts, removed after."""

    def __init__(self, limits: Limits, enforcement: Enforcement):
        self.folders: dict[str, Path] = {}
        name = f"mha-course-{uuid.uuid4().hex[:12]}"
        for controller, (parent, v2) in enforcement.cgroups.items():
            folder = parent / name
            value = limits.processes if controller == "pids" else limits.memory
            try:
                folder.mkdir(exist_ok=True)  # cgroup v2: one folder for both controllers
                (folder / _limit_file(controller, v2)).write_text(f"{value}\n")
            except OSError:
                if folder not in self.folders.values():
                    _remove(folder)
                continue
            self.folders[controller] = folder

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a kernel's launcher writes its pid into."""
        return [str(folder / "cgroup.procs") for folder in self.unique()]

    def unique(self) -> list[Path]:
        return list(dict.fromkeys(self.folders.values()))

    def hit(self) -> list[str]:
        """The limits that fired in these cgroups, as ``"processes"`` / ``"memory"``."""
        return [k for k, v in cgroup_events(self.unique()).items() if v > 0]

    def kill(self, rounds: int = 200) -> None:
        """SIGKILL every process in the cgroups until none is left (a fork bomb refills)."""
        for folder in self.unique():
            if (folder / "cgroup.kill").exists():
                try:
                    (folder / "cgroup.kill").write_text("1\n")
                except OSError:
                    pass
            for _ in range(rounds):
                pids = _pids_in(folder)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the cgroups."""
        self.kill()
        for folder in self.unique():
            _remove(folder)
        self.folders = {}


def cgroup_events(folders) -> dict[str, int]:
    """``{"processes": forks refused, "memory": processes killed for memory}`` in ``folders``."""
    counts = {"processes": 0, "memory": 0}
    for folder in map(Path, folders):
        counts["processes"] += _event_count(folder / "pids.events", "max")
        counts["memory"] += max(_event_count(folder / "memory.oom_control", "oom_kill"),
                                _event_count(folder / "memory.events", "oom_kill"))
    return counts


def _pids_in(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _event_count(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _remove(folder: Path) -> None:
    for _ in range(100):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # its last processes are still exiting


#: The shell prefix that puts the kernel into its cgroups before anything else runs (bwrap
#: forks at once, so the kernel cannot be moved there after it started).
JOIN_CGROUPS = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; '
                'shift; exec "$@"')


def launcher(procs_files) -> list[str]:
    """``sh -c ... FILES -- `` (then the kernel's command): join the cgroups, then exec."""
    files = list(procs_files)
    return ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *files, "--"] if files else []


def kernel_env(limits: Limits, nproc: bool) -> str:
    """The value of :data:`ENV` for the kernel: which rlimits it sets on itself."""
    parts = []
    if limits.memory:
        parts.append(f"as={limits.memory}")
    if limits.disk:
        parts.append(f"fsize={limits.disk}")
    if limits.processes and nproc:
        parts.append(f"nproc={limits.processes}")
    return ",".join(parts)


def apply_rlimits(spec: str | None) -> None:
    """Set the rlimits of :func:`kernel_env` on this process (the kernel, before any learner
    code runs). A limit cannot be raised again without privileges, which the sandbox drops."""
    if not spec:
        return
    import resource  # POSIX only; the kernel runs there whenever a limit is set

    names = {"as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE,
             "nproc": resource.RLIMIT_NPROC}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if key in names and value.isdigit():
            try:
                _, hard = resource.getrlimit(names[key])
                want = int(value)
                if hard != resource.RLIM_INFINITY:
                    want = min(want, hard)
                resource.setrlimit(names[key], (want, want))
            except (OSError, ValueError):
                continue  # a system that cannot set this one (macOS and RLIMIT_AS): not here


def limit_message(limits: Limits, ename: str, evalue: str) -> str | None:
    """Which limit a cell's error shows was reached, in the report's words, or None.

    >>> limit_message(Limits(), "MemoryError", "Unable to allocate 80.0 GiB")
    'the memory limit of 4 GiB per kernel was reached (raise it with --memory)'
    >>> limit_message(Limits(), "BlockingIOError", "[Errno 11] Resource temporarily unavailable")
    'the process limit of 256 per kernel was reached (raise it with --processes)'
    >>> limit_message(Limits(), "ValueError", "bad shape") is None
    True

    In grading mode the check runs in the grader, and the learner's error reaches the record
    inside the check's verdict:

    >>> limit_message(Limits(), "CheckFailed", "Exercise 03.1: your function raised "
    ...               "MemoryError: Unable to allocate 1.00 GiB")
    'the memory limit of 4 GiB per kernel was reached (raise it with --memory)'
    """
    text = f"{ename}: {evalue}"
    if (ename == "MemoryError" or "raised MemoryError" in text) and limits.memory:
        return memory_words(limits)
    again = (f"[Errno {errno.EAGAIN}]" in text or "can't start new thread" in text
             or "Resource temporarily unavailable" in text)
    if again and limits.processes:
        return process_words(limits)
    if (f"[Errno {errno.ENOSPC}]" in text or f"[Errno {errno.EFBIG}]" in text
            or f"[Errno {errno.EDQUOT}]" in text) and limits.disk:
        return (f"the disk limit of {size_text(limits.disk)} per kernel was reached (raise it "
                "with --disk)")
    return None


def memory_words(limits: Limits) -> str:
    return (f"the memory limit of {size_text(limits.memory)} per kernel was reached (raise it "
            "with --memory)")


def process_words(limits: Limits) -> str:
    return (f"the process limit of {limits.processes} per kernel was reached (raise it with "
            "--processes)")
