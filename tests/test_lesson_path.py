"""The path a learner finishes (issue 34): every notebook fits one sitting, the numbered lessons
together fit a working day, and each lesson stands on what it or an earlier lesson taught.

- **Time.** The README's rule (120 words a minute of markdown, half a minute per code cell) gives
  each notebook's reading time: at most 45 minutes for every lesson, deep dive and appendix, and
  at most 8 hours for the numbered lessons together (the core path).
- **Opening.** Each lesson and deep dive opens with its question and the list of its sections,
  numbered as its headings are (``## 1. ...``, ``## 2. ...``).
- **Deep dives** (``notebooks/deep_dives/NNx_*.ipynb``) are optional: each says so, links the
  lesson it extends, is linked from that lesson, and ends by linking back.
- **No forward references.** A notebook imports only package modules whose docstring names its
  lesson or an earlier one (a deep dive ``07a`` counts as lesson 07).
- **Inline before import.** A package name that a lesson teaches (its module's docstring names
  that lesson first) is shown equal to the lesson's own code: some code cell of the lesson or
  of its deep dives uses the name next to an equality check. Loaders of shipped data
  (``load_*``) are exempt: their recipes' tests check what they load.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks"
LESSONS = sorted(NB.glob("[0-9][0-9]_*.ipynb"))
DEEP_DIVES = sorted((NB / "deep_dives").glob("*.ipynb"))
ALL = sorted(NB.rglob("*.ipynb"))
MAX_MINUTES = 45
MAX_CORE_MINUTES = 8 * 60


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell) -> str:
    return "".join(cell["source"])


def minutes(path: Path) -> float:
    """Reading minutes by the README's rule, unrounded."""
    cells = _cells(path)
    words = sum(len(re.findall(r"\w+", _source(c))) for c in cells if c["cell_type"] == "markdown")
    return words / 120 + sum(c["cell_type"] == "code" for c in cells) / 2


# ------------------------------------------------------------------------------------ time
@pytest.mark.parametrize("path", ALL, ids=_rel)
def test_every_notebook_fits_one_sitting(path):
    assert minutes(path) <= MAX_MINUTES, (
        f"{_rel(path)} takes {minutes(path):.1f} min by the README's rule, over {MAX_MINUTES}: "
        "split it where its topics part or move what is not its question into a deep dive")


def test_the_numbered_lessons_together_take_at_most_8_hours():
    total = sum(minutes(p) for p in LESSONS)
    assert len(LESSONS) >= 13
    assert total <= MAX_CORE_MINUTES, f"the core path takes {total / 60:.2f} h"


def test_minutes_follow_the_readme_rule():
    assert minutes(LESSONS[0]) == pytest.approx(
        sum(len(re.findall(r"\w+", _source(c))) for c in _cells(LESSONS[0])
            if c["cell_type"] == "markdown") / 120
        + sum(c["cell_type"] == "code" for c in _cells(LESSONS[0])) / 2)


# --------------------------------------------------------------------------------- opening
HEADING = re.compile(r"^## (\d+)\. (.+?)\s*$", re.M)


def _plain(text: str) -> str:
    """Markdown text without emphasis, code marks and link targets, spaces collapsed."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return " ".join(re.sub(r"[*`]", "", text).split())


def opening_problems(cells) -> list[str]:
    """What is wrong with a notebook's opening cell, against its numbered headings."""
    first = _source(cells[0]) if cells and cells[0]["cell_type"] == "markdown" else ""
    problems = []
    if not re.match(r"# \d\d[a-z]? · ", first):
        problems.append("the first cell does not open with '# NN · title'")
    question = first.split("**The question.**", 1)
    if len(question) < 2 or "?" not in question[1].split("**Sections.**", 1)[0]:
        problems.append("no '**The question.**' sentence with a question mark")
    headings = [(int(n), t) for c in cells if c["cell_type"] == "markdown"
                for n, t in HEADING.findall(_source(c))]
    if [n for n, _ in headings] != list(range(1, len(headings) + 1)):
        problems.append(f"headings are not numbered 1..N: {[n for n, _ in headings]}")
    sections = first.split("**Sections.**", 1)
    if len(sections) < 2:
        return [*problems, "no '**Sections.**' list"]
    items = re.findall(r"^(\d+)\. (.+(?:\n(?! *\n)(?!\d+\. ).+)*)", sections[1], re.M)
    if [int(n) for n, _ in items] != [n for n, _ in headings]:
        problems.append(f"the list numbers {[int(n) for n, _ in items]} are not the "
                        f"headings' {[n for n, _ in headings]}")
    for (n, title), (_, item) in zip(headings, items, strict=False):
        if _plain(title) not in _plain(item):
            problems.append(f"item {n} does not name its heading {title!r}")
    return problems


@pytest.mark.parametrize("path", LESSONS + DEEP_DIVES, ids=_rel)
def test_each_lesson_opens_with_its_question_and_its_numbered_sections(path):
    problems = opening_problems(_cells(path))
    assert not problems, f"{_rel(path)}: " + "; ".join(problems)


def test_the_opening_check_sees_a_missing_section_and_a_renamed_one():
    def md(text):
        return {"cell_type": "markdown", "source": text}
    good = [md("# 01 · T\n\n**The question.** Why?\n\n**Sections.**\n1. Alpha `a`\n2. Beta — "
               "gloss\n"), md("## 1. Alpha `a`\n\ntext"), md("## 2. Beta\n## Summary")]
    assert opening_problems(good) == []
    assert opening_problems([*good, md("## 3. Gamma")])
    renamed = [good[0], good[1], md("## 2. Delta")]
    assert any("Delta" in p for p in opening_problems(renamed))
    assert opening_problems([md("# 01 · T\n\n**Sections.**\n1. Alpha"), good[1]])


# ------------------------------------------------------------------------------ deep dives
def _lesson_of(deep_dive: Path) -> Path | None:
    return next((p for p in LESSONS if p.name[:2] == deep_dive.name[:2]), None)


def test_deep_dives_exist_and_are_named_for_the_lesson_they_extend():
    assert DEEP_DIVES, "no deep dive in notebooks/deep_dives/"
    for path in DEEP_DIVES:
        assert re.fullmatch(r"\d\d[a-z]_\w+\.ipynb", path.name), path.name
        assert _lesson_of(path), f"{path.name}: no lesson {path.name[:2]} to extend"


@pytest.mark.parametrize("path", DEEP_DIVES, ids=_rel)
def test_each_deep_dive_is_optional_linked_from_its_lesson_and_links_back(path):
    lesson = _lesson_of(path)
    first, last = _source(_cells(path)[0]), _source(_cells(path)[-1])
    assert "Optional deep dive" in first, f"{path.name}: its first cell does not say it is optional"
    assert f"](../{lesson.name}" in first, f"{path.name}: its first cell links no {lesson.name}"
    assert "## Next" in last and f"](../{lesson.name}" in last, (
        f"{path.name}: its last cell should be a '## Next' linking back to {lesson.name}")
    text = "\n".join(_source(c) for c in _cells(lesson) if c["cell_type"] == "markdown")
    assert f"](deep_dives/{path.name}" in text, f"{lesson.name} does not link {path.name}"


def test_no_numbered_lesson_needs_a_deep_dive():
    """A lesson may link a deep dive; it never imports or runs one."""
    for path in LESSONS:
        code = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "code")
        assert "deep_dives" not in code, f"{path.name} reads a deep dive in its code"


# ----------------------------------------------------------------------- forward references
def _module_file(mod: str) -> Path | None:
    base = ROOT / Path(*mod.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@cache
def module_lesson(mod: str) -> int | None:
    """The first lesson a module's docstring names (``lesson 07``, ``notebooks/07_...``)."""
    f = _module_file(mod)
    if f is None:
        return None
    doc = ast.get_docstring(ast.parse(f.read_text(encoding="utf-8"))) or ""
    nums = [int(n) for n in re.findall(r"notebooks/(?:deep_dives/)?(\d\d)[a-z]?_", doc)]
    nums += [int(n) for n in re.findall(r"[Ll]essons? (\d\d)\b", doc)]
    return min(nums) if nums else None


@cache
def _reexports(pkg: str) -> dict[str, str]:
    f = _module_file(pkg)
    out = {}
    if f is not None and f.name == "__init__.py":
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    out[alias.asname or alias.name] = f"{pkg}.{node.module}"
    return out


def imported(code: str) -> list[tuple[str, str]]:
    """``(name, defining module)`` of each package name a notebook's code imports."""
    found = []
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, a.name) for a in node.names if a.name.startswith("mha_course")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("mha_course"):
            table = _reexports(node.module)
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                mod = sub if _module_file(sub) else table.get(alias.name, node.module)
                found.append((alias.asname or alias.name, mod))
    return found


def forward_references(path: Path) -> list[str]:
    number = int(path.name[:2])
    out = []
    for cell in _cells(path):
        if cell["cell_type"] != "code":
            continue
        for name, mod in imported(_source(cell)):
            taught = module_lesson(mod)
            if taught is not None and taught > number:
                out.append(f"{name} from {mod} (lesson {taught:02d})")
    return out


@pytest.mark.parametrize("path", LESSONS + DEEP_DIVES, ids=_rel)
def test_no_lesson_imports_what_a_later_lesson_teaches(path):
    found = forward_references(path)
    assert not found, f"{_rel(path)} imports what a later lesson teaches: " + "; ".join(found)


def test_the_forward_reference_check_sees_one():
    assert module_lesson("mha_course.backward") == 8
    assert ("trained_models", "mha_course.models.trained_models") in imported(
        "from mha_course.models import trained_models")
    assert module_lesson("mha_course.models.trained_models") > 5


# ------------------------------------------------------------------------ inline, then import
SKIP_WINGS = ("mha_course.checks", "mha_course.grading", "mha_course.widgets")
EQUALITY = re.compile(r"allclose|array_equal|assert_allclose|isclose|assert_equal|==")


def unproved_names(number: int, notebooks: list[Path]) -> list[str]:
    """Names taught in lesson ``number`` that its notebooks import but never check for equality."""
    code = [_source(c) for p in notebooks for c in _cells(p) if c["cell_type"] == "code"]
    missing = []
    for cell in code:
        for name, mod in imported(cell):
            if (mod.startswith(SKIP_WINGS) or name == mod or module_lesson(mod) != number
                    or name.isupper() or name.startswith("load_")):  # loaders of shipped data
                continue
            if not any(re.search(rf"\b{re.escape(name)}\b", c) and EQUALITY.search(c)
                       for c in code):
                missing.append(f"{name} ({mod})")
    return sorted(set(missing))


@pytest.mark.parametrize("lesson", LESSONS, ids=_rel)
def test_what_a_lesson_teaches_is_shown_equal_before_it_is_used(lesson):
    number = int(lesson.name[:2])
    notebooks = [lesson] + [p for p in DEEP_DIVES if p.name[:2] == lesson.name[:2]]
    missing = unproved_names(number, notebooks)
    assert not missing, (f"{lesson.name} imports what it teaches without showing it equal to "
                         "its own code: " + ", ".join(missing))
