"""Lessons 14 and 15, the interview drill: its rapid questions (lesson 14 and its deep dives 14a,
14b and 14c) are folded, linked, mapped and counted where lesson 14 points to them, its catalogue
(lesson 15) lists the drill's exercises, and an instructor can bundle drill exercises with
``assign`` and check the result like any other (end to end, once).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
from pathlib import Path

import nbformat
import pytest

from mha_course.grading.authoring.notebooks import ExerciseError, info
from mha_course.grading.cli import lesson_notebook, main

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "15_interview_drill.ipynb"
SOLUTIONS = ROOT / "solutions" / "15_interview_drill.ipynb"
#: The rapid questions: lesson 14's, then its optional deep dives' (numbered on from lesson 14's).
QUESTIONS = [ROOT / "notebooks" / "14_rapid_questions.ipynb",
             *sorted((ROOT / "notebooks" / "deep_dives").glob("14[a-z]_*.ipynb"))]


def _lesson():
    return nbformat.read(LESSON, as_version=4)


def _drill_map() -> dict[int, tuple[str, str]]:
    """The DRILL dicts of the question notebooks (each one's first cell that defines it), merged."""
    drill = {}
    for path in QUESTIONS:
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if c.cell_type == "code" and "DRILL = {" in c.source)
        tree = ast.parse(cell.source)
        node = next(n for n in tree.body
                    if isinstance(n, ast.Assign) and n.targets[0].id == "DRILL")
        part = ast.literal_eval(node.value)
        assert not set(part) & set(drill), f"{path.name} maps questions mapped before"
        drill.update(part)
    return drill


def _questions() -> dict[int, tuple[str, Path]]:
    """{question number: (its markdown, question and folded answer; the notebook it is in)}."""
    found = {}
    for path in QUESTIONS:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        parts = re.split(r"(?m)^\*\*Q(\d+)\. ", text)
        for n, body in zip(parts[1::2], parts[2::2], strict=True):
            assert int(n) not in found, f"Q{n} twice"
            found[int(n)] = (body, path)
    return found


#: A link to a lesson (``05_x.ipynb``) or a deep dive (``deep_dives/13b_x.ipynb``, or from a deep
#: dive ``../05_x.ipynb`` and ``13b_x.ipynb``): the path, and the lesson number it belongs to.
LINK = re.compile(r"\]\(((?:\.\./|deep_dives/)?(\d\d)[a-z]?_\w+\.ipynb)(?:#[^)]*)?\)")


def test_at_least_25_rapid_questions_each_with_a_folded_answer_and_a_link_to_its_lesson():
    questions, drill = _questions(), _drill_map()
    assert len(questions) >= 25
    assert sorted(questions) == list(range(1, len(questions) + 1)) == sorted(drill)
    for n, (body, path) in questions.items():
        answer = body.split("<details><summary>Answer</summary>", 1)
        assert len(answer) == 2 and "</details>" in answer[1], f"Q{n} has no folded answer"
        links = LINK.findall(answer[1])  # anchors allowed
        assert links, f"Q{n}'s answer links no lesson"
        for link, _ in links:
            assert (path.parent / link).is_file(), f"Q{n}: no notebook {link}"
        lessons = [lesson for _, lesson in links]
        assert drill[n][1] in lessons, f"Q{n} is mapped to lesson {drill[n][1]}, links {lessons}"


def test_every_numbers_question_has_a_self_check_in_the_outputs():
    outputs = "".join(o.get("text", "") for path in QUESTIONS
                      for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"
                      for o in c.outputs)
    for n, (kind, _) in _drill_map().items():
        if kind == "numbers":
            assert f"Q{n} self-check: " in outputs, f"Q{n} asks for a number and computes none"


_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
         "eighty": 80, "ninety": 90}
_UNITS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9}


def _number(words: str) -> int:
    """``Fifty-six`` -> 56 (the counts lesson 14 spells out: 20 to 99)."""
    tens, _, units = words.lower().partition("-")
    return _TENS[tens] + (_UNITS[units] if units else 0)


def test_lesson_14_counts_and_links_the_questions_of_its_deep_dives():
    # "Thirty-eight more questions are in ... 14a and 14b" stayed true only until 14c came.
    lesson = nbformat.read(QUESTIONS[0], as_version=4)
    deep_dives = QUESTIONS[1:]
    in_deep_dives = sum(path in deep_dives for _, path in _questions().values())
    opening, last = lesson.cells[0].source, lesson.cells[-1].source
    said = re.search(r"([A-Z][a-z]+(?:-[a-z]+)?) more questions are in the optional deep", opening)
    assert said and _number(said.group(1)) == in_deep_dives, (
        f"lesson 14 says {said and said.group(1)!r} more questions; its deep dives hold "
        f"{in_deep_dives}")
    printed = "".join(o.get("text", "") for c in lesson.cells if c.cell_type == "code"
                      for o in c.outputs)
    assert re.findall(r"\((\d+) more in deep dives", printed) == [str(in_deep_dives)]
    for path in deep_dives:
        link = f"](deep_dives/{path.name})"
        assert link in opening and link in last, f"lesson 14 does not point to {path.name}"


def test_number_words():
    assert [_number(w) for w in ("Thirty-eight", "Fifty-six", "forty")] == [38, 56, 40]


def test_the_catalogue_lists_every_spot_the_bug_exercise_of_the_solutions():
    text = "\n".join(c.source for c in _lesson().cells if c.cell_type == "markdown")
    listed = re.findall(r"(?m)^\| (15\.\d+) \|", text)
    nb = nbformat.read(SOLUTIONS, as_version=4)
    broken = [info(c)["exercise"] for c in nb.cells if info(c).get("kind") == "broken"]
    assert listed == broken and len(broken) >= 10


def _cli(*args) -> tuple[int, str]:
    buf, old = io.StringIO(), Path.cwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main([str(a) for a in args])
    finally:
        os.chdir(old)
    return code, buf.getvalue()


def test_an_instructor_bundles_drill_exercises_and_checks_the_answers(tmp_path):
    out = tmp_path / "drill.ipynb"
    code, text = _cli("assign", "15.4", "15.1", "15.15", "-o", out)
    assert code == 0, text
    bundle = nbformat.read(out, as_version=4)
    assert bundle.metadata["mha_course"]["assignment"] == ["15.1", "15.4", "15.15"]
    kinds = [(info(c).get("exercise"), info(c).get("kind")) for c in bundle.cells]
    assert ("15.1", "broken") in kinds and ("15.4", "broken") in kinds  # the broken code comes too
    assert "### BEGIN SOLUTION" not in out.read_text()

    # A learner answers 15.1 and 15.15 with the solutions and leaves 15.4 alone.
    solution = {info(c)["exercise"]: c.source for c in nbformat.read(SOLUTIONS, as_version=4).cells
                if info(c).get("role") == "solution"}
    for cell in bundle.cells:
        if info(cell).get("role") == "solution" and info(cell)["exercise"] != "15.4":
            cell.source = solution[info(cell)["exercise"]]
    done = tmp_path / "drill_done.ipynb"
    nbformat.write(bundle, done)
    code, text = _cli("check", done)
    assert code == 1, text  # one exercise not attempted
    for ex, verdict in (("15.1", "passed"), ("15.4", "not attempted"), ("15.15", "passed")):
        assert re.search(rf"Exercise {re.escape(ex)} +{verdict}", text), text


def test_an_old_drill_id_says_where_the_exercise_moved(tmp_path):
    # An instructor's saved command from before wave 3, when the drill was lesson 09. Its ids
    # 09.1 to 09.5 are lesson 09's own exercises again (the tiny GPT); 09.14 is not.
    old = "0" + "9.14"  # spelled so that the drill's renumbering script leaves it alone
    code, text = _cli("assign", old, "15.9", "-o", tmp_path / "old.ipynb")
    assert code == 2 and not (tmp_path / "old.ipynb").exists()
    assert (f"{old} is now 15.14 (the interview drill moved from lesson 0" + "9 to lesson 13; "
            "then wave 4: the drill is lesson 15" in text)


def test_an_old_drill_id_that_lesson_09_uses_again_says_so(tmp_path):
    # The same saved command with 09.3: it assigns lesson 09's top-p exercise, and says that the
    # drill exercise that used to carry the id is 15.3 now.
    old = "0" + "9.3"
    code, text = _cli("assign", old, "-o", tmp_path / "old.ipynb")
    assert code == 0 and (tmp_path / "old.ipynb").exists(), text
    assert (f"note: {old} is an exercise of lesson 0" + "9 now; the exercise that was "
            f"{old} before is now 15.3") in text


def test_make_check_for_the_drills_old_lesson_names_its_new_number(tmp_path):
    # A course folder whose lesson 09 has no exercises (before wave 3's tiny GPT gave lesson 09
    # exercises of its own again): `make check EX=09` says where the drill went. Read from the
    # folder alone, so no notebook is run.
    old = "0" + "9"
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "15_interview_drill.ipynb").touch()
    with pytest.raises(ExerciseError) as raised:
        lesson_notebook(old, tmp_path)
    assert f"the interview drill moved from lesson {old} to lesson 13, then 15" in str(raised.value)
    assert "make check EX=15" in str(raised.value)
    # with a lesson 09 of its own, EX=09 is that lesson's notebook
    (tmp_path / "exercises" / f"{old}_tiny_gpt.ipynb").touch()
    assert lesson_notebook(old, tmp_path).name == f"{old}_tiny_gpt.ipynb"
