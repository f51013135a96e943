"""Checking a learner's notebook: the loop that merges, runs nbval and decides.

A :class:`Checker` is made once per command: it takes the snapshots every check of the batch
runs against (the solutions, the package, nbval's sanitize file) and finds the sandbox. Its
:meth:`Checker.check` finds the solution a learner's notebook answers, puts the learner's cells
into a copy of it (:mod:`~mha_course.grading.running.merge`), runs strict nbval on the copy in a
subprocess (:mod:`~mha_course.grading.running.run`) and turns nbval's per-cell records into one
verdict per exercise (:mod:`~mha_course.grading.reporting.verdicts`). When the kernel is lost
during an
exercise (it died, or ignored the interrupt after a timeout), the later cells ran in a dead
kernel: the notebook is run again with that exercise stubbed out, so a crash or a hang loses
only the exercise that caused it, in a lesson notebook as in an assignment bundle.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

from ..authoring.assignment import NOTEBOOK_KEY, Assignment
from ..authoring.bundle import build_bundle
from ..authoring.catalog import exercises
from ..authoring.generate import SANITIZE, load_solutions
from ..authoring.notebooks import (
    ID_RE,
    ExerciseError,
    course_root,
    info,
    lesson_of,
    nb_info,
    read_notebook,
)
from ..reporting.verdicts import NotebookResult, Verdict, judge_run
from .account import Accounts, Lockdown
from .limits import Limits, find_enforcement
from .merge import course_sources, merge_learner, normalised, reference_for
from .run import DEFAULT_TIMEOUT, Isolation, run_nbval
from .sandbox import (
    CHANGED_SUFFIX,
    OWN_USER,
    UNSANDBOXED,
    Change,
    FileGuard,
    Library,
    TreeWatch,
    choose_sandbox,
    python_paths,
)

#: The pytest plugin of grading mode (checks run in the grader, see grading/grader.py).
GRADER_PLUGIN = "mha_course.grading.running.grader"
#: The package the checker belongs to: its snapshot is what every run imports.
PACKAGE_DIR = Path(__file__).resolve().parents[2]
MISSING = ("your notebook has no solution cell for this exercise (deleted?); copy the cell back "
           "from the exercise notebook")
#: The verdict message of a missing exercise when the whole notebook is the wrong one.
NOT_IN_WRONG_NOTEBOOK = "not in the notebook handed in: it is the wrong notebook (see the note)"
#: How the note on a wrong notebook starts (the report prints it first).
WRONG_NOTEBOOK = "wrong notebook: "
#: How a note on changed notebook metadata or check cells starts.
TAMPERED = "ignored: "


@dataclass(frozen=True)
class KeptChange(Change):
    """A submission changed during the check: restored, its changed bytes kept with the results."""

    def describe(self) -> str:
        if self.error or not self.restored or self.kept is None:
            return super().describe()
        during = sorted(self.during)
        who = (f"while {', '.join(during)} {'was' if len(during) == 1 else 'were'} being checked"
               if during else "during the check")
        return (f"{self.path}: changed {who}; restored as it was before the check, the changed "
                f"bytes kept in {self.kept} (nothing is written into the submissions folder)")


class KeepAside(FileGuard):
    """A :class:`~mha_course.grading.running.sandbox.FileGuard` that keeps the changed bytes of the
    submissions it was told about (:meth:`keep_aside`) in the folder ``keep``, beside the
    results, never in the submissions folder (other files: as FileGuard does, beside them)."""

    def __init__(self, restore: bool = False, keep: Path | None = None):
        super().__init__(restore)
        self.keep = Path(keep) if keep is not None else None
        self._aside: set[Path] = set()

    def keep_aside(self, path) -> None:
        """Keep what ``path`` (a submission) holds after a change in :attr:`keep`."""
        self._aside.add(Path(path))

    def _kept_name(self, path: Path) -> Path:
        candidate, n = self.keep / path.name, 1
        while candidate.exists():
            n += 1
            candidate = self.keep / f"{path.stem}-{n}{path.suffix}"
        return candidate

    def _handle(self, path, data, mtime, own, now, during) -> Change:
        if (self.keep is None or path not in self._aside or now is None or own
                or not self.restore):
            return super()._handle(path, data, mtime, own, now, during)
        try:
            self.keep.mkdir(parents=True, exist_ok=True)
            kept = self._kept_name(path)
            kept.write_bytes(now)
        except OSError as exc:
            kept, problem = None, f"the changed bytes could not be kept in {self.keep}: {exc}"
        else:
            problem = ""
        done = super()._handle(path, data, mtime, own, None, during)  # restore; keeps nothing
        return KeptChange(done.path, done.during, kept, done.restored,
                          done.error or problem)


def keep_folder(csv: Path) -> Path:
    """Where the bytes of submissions that changed during the check are kept: beside the CSV,
    in a folder named after it (``results.csv`` -> ``results.changed-during-check/``)."""
    return csv.with_name(csv.stem + CHANGED_SUFFIX)


def wrong_notebook(learner, assignment: Assignment, solutions: dict, missing) -> str:
    """Grading mode: a note when ``learner`` is another notebook than the assignment's ("" if
    not): its metadata (or its exercise cells) name another lesson's exercise notebook or
    another assignment, and most of the assignment's exercises (``missing``) are not in it."""
    wanted = list(assignment.exercises)
    gone = [x for x in wanted if x in set(missing)]
    if len(gone) * 2 <= len(wanted):
        return ""
    meta = nb_info(learner)
    theirs = meta.get("assignment")
    if isinstance(theirs, list) and theirs:
        if [str(x) for x in theirs] == wanted:
            return ""
        what = ("another assignment's notebook (exercises "
                f"{' '.join(str(x) for x in theirs)})")
    else:
        lesson = meta.get("lesson")
        if not isinstance(lesson, str) or lesson not in solutions:
            lessons = {lesson_of(info(c)["exercise"]) for c in learner.cells
                       if isinstance(info(c).get("exercise"), str)
                       and ID_RE.match(info(c)["exercise"])}
            lesson = lessons.pop() if len(lessons) == 1 else None
        if lesson not in solutions:
            return ""
        what = f"exercises/{solutions[lesson][0].name} (lesson {lesson}'s exercise notebook)"
    name = assignment.notebook or "notebook"
    if assignment.title:
        name += f' ("{assignment.title}")'
    return (f"{WRONG_NOTEBOOK}this looks like {what}, not the assignment {name}: "
            f"{len(gone)} of its {len(wanted)} exercises are not in it ({' '.join(gone)}); "
            "hand in the assignment's notebook")


def _metadata_points(spec) -> dict | None:
    """``{id: points}`` of an assignment's copy in notebook metadata, or None if unreadable."""
    items = spec.get("exercises") if isinstance(spec, dict) else None
    if not isinstance(items, list):
        return None
    points = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            return None
        points[item["id"]] = item.get("points")
    return points


def tampering(learner, ref, assignment: Assignment) -> list[str]:
    """Grading mode: what the learner's notebook changed that grading ignores, as notes: the
    exercise list or the points in its metadata, a check cell that is not the course's."""
    meta = nb_info(learner)
    wanted = list(assignment.exercises)
    notes = []
    theirs = meta.get("assignment")
    if theirs is not None and theirs != wanted:
        shown = " ".join(map(str, theirs)) if isinstance(theirs, list) else repr(theirs)
        notes.append(f"{TAMPERED}the notebook's metadata lists the exercises {shown or '(none)'}"
                     f", not the assignment's {' '.join(wanted)}; graded against the assignment")
    if NOTEBOOK_KEY in meta:
        points = _metadata_points(meta[NOTEBOOK_KEY])
        if points is None:
            notes.append(f"{TAMPERED}the notebook's metadata {NOTEBOOK_KEY} is not the "
                         "assignment's; the assignment file's points count")
        else:
            diffs = [f"{x}: {points[x]!r}" for x in points
                     if x not in assignment.points or points[x] != assignment.points[x]]
            diffs += [f"{x}: none" for x in wanted if x not in points]
            if diffs:
                notes.append(f"{TAMPERED}the notebook's metadata gives other points ("
                             + ", ".join(diffs) + "); the assignment file's points count")
    checks = {c.get("id"): c for c in ref.cells if info(c).get("role") == "check"}
    by_exercise = {}
    for cell in ref.cells:
        if info(cell).get("role") == "check":
            by_exercise.setdefault(info(cell)["exercise"], []).append(normalised(cell.source))
    changed = []
    for number, cell in enumerate(learner.cells, start=1):
        if cell.cell_type != "code":
            continue
        ref_cell = checks.get(cell.get("id")) if cell.get("id") else None
        exercise = (info(ref_cell) if ref_cell is not None else info(cell)).get("exercise")
        if ref_cell is None and info(cell).get("role") != "check":
            continue
        if exercise in by_exercise and normalised(cell.source) not in by_exercise[exercise]:
            changed.append(f"{exercise} (cell {number})")
    if changed:
        notes.append(f"{TAMPERED}the check cell of Exercise {', '.join(changed)} is not the "
                     "course's; the course's check ran instead")
    return notes


def _bytes_of(path: Path) -> bytes | None:
    """A private file's bytes (None: a folder, or unreadable)."""
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


@functools.lru_cache(maxsize=2)
def package_snapshot(package_dir: str) -> Library:
    """One snapshot of the package per process (it lives in memory, never re-read)."""
    return Library.snapshot(package_dir)


#: Exercises whose check cell still runs in the learner's kernel in grading mode, and why: the
#: grader sends arguments by value, and these checks read what the learner's function did to an
#: argument object (not an array) as it ran. Their verdicts are right, but they can be talked
#: into passing as a learner's own check can (see the trust model in docs/instructors.md).
IN_KERNEL = {
    "11.2": "its check reads the byte counters of the simulated devices the function sends "
            "through",
}


@dataclass
class Checker:
    """What every check of one command runs against, taken when the command starts."""

    solutions: dict
    solutions_dir: Path
    isolation: Isolation
    timeout: float = DEFAULT_TIMEOUT
    #: Why learners' code runs unsandboxed ("" when it runs in the sandbox).
    unsandboxed: str = ""
    #: ``{path: bytes}`` of files no check may change (the solutions, the submissions).
    watched: dict = field(default_factory=dict)
    #: Grading mode: the assignment every submission is graded against (None: learner mode).
    assignment: Assignment | None = None
    #: Grading mode: the instructor's probes file, as text (see mha_course.grading.running.grader).
    probes: str | None = None
    #: Without the sandbox, as root: the paths made private for the command (call :meth:`close`).
    lockdown: Lockdown | None = None

    @classmethod
    def create(cls, solutions_dir=None, timeout: float = DEFAULT_TIMEOUT, sandbox: bool = True,
               hidden=(), sanitize: Path | None = None, assignment: Assignment | None = None,
               probes: str | None = None, limits: Limits | None = None,
               keep: Path | None = None, private=()) -> Checker:
        """Snapshot the solutions, the package and the sanitize file; find the sandbox.

        ``hidden`` folders (the submissions) are hidden from the sandboxed kernel, as are the
        course checkout, the solutions and the home folder. With an ``assignment`` the checker
        is in grading mode: every notebook is graded against it, and the checks run in the
        grader (:mod:`mha_course.grading.running.grader`), not in the learner's kernel. ``limits``
        (default: 4 GiB, 256 processes, 1 GiB of disk per kernel) bound every kernel
        (:mod:`mha_course.grading.running.limits`). ``keep``: the folder where the changed bytes of
        a
        submission that changed during the check are kept (:func:`keep_folder`; None: beside it).

        Without the sandbox, as root, each kernel runs as an unprivileged user of its own
        (:mod:`mha_course.grading.running.account`): the solutions, the ``hidden`` folders and the
        ``private`` paths (the assignment, probes and roster files; folders) are made unreadable
        to it until :meth:`close`. The private files are read now, before any learner code
        runs, and watched like the solutions: a change is restored and reported, and never used.
        Not root, the kernel runs as you, and only the watching holds.
        """
        root = course_root()
        submissions = tuple(hidden)
        solutions_dir = Path(solutions_dir) if solutions_dir is not None else root / "solutions"
        if sanitize is None and (root / "tests" / "nbval_sanitize.cfg").is_file():
            sanitize = root / "tests" / "nbval_sanitize.cfg"
        elif sanitize is None and (solutions_dir / SANITIZE).is_file():
            sanitize = solutions_dir / SANITIZE  # the references a wheel ships
        solutions = load_solutions(solutions_dir)
        watched = {p: p.read_bytes() for p, _ in solutions.values()}
        bwrap, why = choose_sandbox(sandbox)
        private = {Path(p): _bytes_of(Path(p)) for p in private}
        accounts, lockdown = None, None
        if bwrap is None:
            accounts, _ = Accounts.find()
        hidden = tuple(dict.fromkeys([root, solutions_dir, PACKAGE_DIR.parent, Path.home(),
                                      *hidden]))
        if assignment is not None:
            unknown = [x for x in assignment.exercises if x not in exercises(solutions)]
            if unknown:
                raise ExerciseError(f"the assignment has exercises the solutions do not: "
                                    f"{' '.join(unknown)}")
        limits = limits if limits is not None else Limits()
        library = package_snapshot(str(PACKAGE_DIR))
        guard = KeepAside(restore=bwrap is None, keep=keep)  # only unsandboxed kernels write
        for path, data in watched.items():
            guard.add(path, data)
        for rel, data in library.files.items():
            if not rel.endswith(".pyc"):
                guard.add(PACKAGE_DIR.parent / rel, data)
        if sanitize:
            guard.add(sanitize)
        for path, data in private.items():
            if data is not None:
                guard.add(path, data)
        tree = None
        if bwrap is None and accounts is None:  # the kernel runs as you: report what it wrote
            checkout = [root] if (root / "solutions").is_dir() else []
            tree = TreeWatch([*checkout, solutions_dir, *submissions])
        if accounts is not None:
            lockdown = Lockdown([solutions_dir, Path.home(), *submissions, *private],
                                keep_open=python_paths())
        isolation = Isolation(library,
                              Path(sanitize).read_text(encoding="utf-8") if sanitize else None,
                              bwrap, hidden, (GRADER_PLUGIN,) if assignment is not None else (),
                              limits,
                              find_enforcement(limits, bwrap is not None, accounts is not None),
                              guard,
                              accounts, (root,) if accounts is not None else (),
                              tree)
        return cls(solutions, solutions_dir, isolation, timeout, why, watched, assignment,
                   probes, lockdown)

    def notes(self) -> list[str]:
        """What the command says first: how learners' code runs here, what is not enforced."""
        if self.unsandboxed and not self.own_users:
            return [UNSANDBOXED.format(reason=self.unsandboxed)]
        first = [OWN_USER.format(reason=self.unsandboxed)] if self.unsandboxed else []
        locked = self.lockdown.notes if self.lockdown is not None else []
        return [*first, *locked, *self.isolation.enforcement.missing]

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def own_users(self) -> bool:
        """Whether kernels run as users of their own (no sandbox, the checker is root)."""
        return self.isolation.accounts is not None

    def close(self) -> None:
        """Give the paths made private for this command their permission bits back."""
        if self.lockdown is not None:
            self.lockdown.close()

    @functools.cached_property
    def catalog(self) -> dict:
        """``{id: ExerciseInfo}`` of the solutions."""
        return exercises(self.solutions)

    @functools.cached_property
    def course(self) -> frozenset:
        """The course's own code cells (a lesson's demo cells are not a learner's cells)."""
        return course_sources(self.solutions)

    @functools.cached_property
    def graded_bundle(self):
        """Grading mode: the assignment's reference, its check cells marked for the grader."""
        ref = build_bundle(self.assignment.exercises, self.solutions, stub=False)
        remote = sorted({f for x in self.assignment.exercises for f in self.catalog[x].functions})
        ref.metadata["mha_course"]["grader"] = {"remote": remote, "probes": self.probes,
                                                "probe_seed": self.assignment.probe_seed}
        for cell in ref.cells:
            if info(cell).get("role") == "check" and info(cell).get("exercise") not in IN_KERNEL:
                cell.metadata["mha_course"]["grader"] = True
        return ref

    def reference(self, learner, path: Path):
        """``(reference notebook, label, catalog for matching by name or None)``."""
        if self.assignment is None:
            return (*reference_for(learner, path, self.solutions), None)
        title = self.assignment.title or "the assignment"
        label = f"{title} ({' '.join(self.assignment.exercises)})"
        graded = {x: self.catalog[x] for x in self.assignment.exercises}
        return self.graded_bundle, label, graded

    def watch(self, paths, own: bool = False) -> None:
        """Read ``paths`` (submissions) now, before any learner code runs.

        :meth:`check` then grades these bytes, whatever a submission checked earlier writes to
        a classmate's file, and :meth:`changed` reports such a write; without the sandbox the
        file is also restored (see :class:`~mha_course.grading.running.sandbox.FileGuard`). ``own``:
        the learner's own notebook, checked by itself (a save from their editor is kept).
        """
        for path in paths:
            try:
                data = self.watched.setdefault(Path(path), Path(path).read_bytes())
            except OSError:
                continue
            self.isolation.guard.add(path, data, own=own)
            if isinstance(self.isolation.guard, KeepAside):
                self.isolation.guard.keep_aside(path)

    def changed(self) -> list[str]:
        """Files changed on disk since the snapshots (the package, solutions, submissions), each
        with the submissions that were being checked meanwhile and what was done about it.

        In the sandbox no kernel can change them (an editor can); without it, a submission's
        code can, and the file is restored. Every verdict was computed from the snapshots.
        """
        self.isolation.guard.verify(())
        return [change.describe() for change in self.isolation.guard.changes]

    def check(self, path: str | Path) -> NotebookResult:
        """Check one learner notebook; never writes ``path``.

        Raises
        ------
        ExerciseError
            For a missing, broken or foreign notebook (the caller reports it).
        """
        path = Path(path)
        learner = read_notebook(path, self.watched.get(path))  # as it was when the batch began
        ref, label, graded = self.reference(learner, path)
        order = []
        for cell in ref.cells:
            exercise = info(cell).get("exercise")
            if exercise and exercise not in order:
                order.append(exercise)
        decided: dict[str, Verdict] = {}
        for _ in range(len(order) + 1):
            merged = merge_learner(ref, learner, stubbed=set(decided), catalog=graded,
                                   course=self.course if graded else frozenset())
            records, backstop = run_nbval(merged.notebook, self.timeout, self.isolation,
                                          who=str(path))
            run = judge_run(order, merged.roles, records, self.timeout, backstop, decided)
            if run.error:
                return NotebookResult(path, label, [Verdict(x, "error", run.error) for x in order],
                                      error=run.error)
            if (run.lost_at is None or run.lost_at == order[-1] or backstop
                    or run.lost_at in decided):
                break
            decided[run.lost_at] = run.verdicts[run.lost_at]  # run again with it stubbed out
        verdicts = dict(run.verdicts)
        missing = {x for x in merged.missing if x not in decided}
        wrong = (wrong_notebook(learner, self.assignment, self.solutions, missing)
                 if self.assignment is not None else "")
        for exercise in missing:
            verdicts[exercise] = Verdict(exercise, "missing",
                                         NOT_IN_WRONG_NOTEBOOK if wrong else MISSING)
        for exercise, notes in merged.notes.items():
            verdict = verdicts[exercise]
            verdicts[exercise] = dataclasses.replace(verdict, notes=notes + verdict.notes)
        notes = ([wrong] if wrong else []) + list(run.notes)
        if self.assignment is not None:
            notes += tampering(learner, ref, self.assignment)
        if merged.ignored:
            notes.append(f"your notebook also answers {' '.join(merged.ignored)}, which "
                         f"{'is' if len(merged.ignored) == 1 else 'are'} not part of this "
                         "assignment: not graded")
        return NotebookResult(path, label, [verdicts[x] for x in order], notes=notes)


def check_notebook(path: str | Path, solutions_dir: str | Path | None = None,
                   timeout: float = DEFAULT_TIMEOUT, sanitize: Path | None = None,
                   sandbox: bool = True) -> NotebookResult:
    """Check one learner notebook against its solution (a :class:`Checker` of its own)."""
    checker = Checker.create(solutions_dir, timeout, sandbox, hidden=(Path(path).parent,),
                             sanitize=sanitize)
    return checker.check(path)
