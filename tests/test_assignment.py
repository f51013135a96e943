"""The exercise catalog (grading/catalog.py) and the instructor's assignment file (assignment.py).

Both are the data the grading tools share: assign, check --assignment, the gradebook, the
nbgrader and Gradescope exports. Fast: no kernel is started here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mha_course.grading.authoring.assignment import (
    Assignment,
    assignment_path_for,
    from_dict,
    load_assignment,
    make_assignment,
    parse_due,
    parse_points,
    save_assignment,
)
from mha_course.grading.authoring.catalog import (
    ExerciseInfo,
    exercise_of_check,
    exercise_of_function,
    exercises,
    parse_ids,
)
from mha_course.grading.authoring.notebooks import moved_id, moved_message

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "solutions"


@pytest.fixture(scope="module")
def catalog():
    return exercises(ROOT / "solutions")


def test_the_catalog_reads_every_exercise_with_title_stars_points_checks_and_functions(catalog):
    assert catalog["03.1"] == ExerciseInfo("03.1", "03", "Scaled scores", 1, 1,
                                           ("check_attention_scores",), ("attention_scores",))
    assert catalog["03.2"].stars == 2 and catalog["03.2"].points == 2
    assert catalog["04.5"].title == "Multi-head attention from the article's per-head weights"
    assert catalog["04.5"].stars == 3 and catalog["04.5"].points == 3
    assert catalog["15.3"].checks == ("check_mask_after_softmax",)
    assert catalog["15.3"].functions == ("masked_attention",)
    assert catalog["15.15"].label.startswith("15.15 ★★★ Timed build")
    ids = list(catalog)
    assert ids == sorted(ids, key=lambda x: (int(x[:2]), int(x[3:])))
    for info in catalog.values():  # every exercise can be matched without its metadata
        assert info.title and 1 <= info.stars <= 3 and info.points == info.stars, info
        assert info.checks and info.functions, info
    # no two exercises share a check or a function name: matching by name is unambiguous
    checks = [c for info in catalog.values() for c in info.checks]
    assert len(checks) == len(set(checks))


def test_the_fixture_catalog_counts_a_variable_answer_as_what_the_learner_writes():
    fixture = exercises(FIXTURES)
    assert list(fixture) == ["97.1", "98.1", "98.2"]
    assert fixture["98.2"].functions == ("answer",) and fixture["98.2"].points == 2
    assert fixture["98.1"].checks == ("check_double",)


def test_ids_are_read_as_instructors_type_them(catalog):
    assert parse_ids("3.1, 03.2 4.5") == ["03.1", "03.2", "04.5"]
    assert parse_ids(["4.5,3.1", "3.1"]) == ["03.1", "04.5"]
    assert parse_ids("03", known=catalog)[:2] == ["03.1", "03.2"]
    assert len(parse_ids("3", known=catalog)) == 6
    with pytest.raises(ValueError, match="unknown exercise '03.9'; known exercises: 01.1"):
        parse_ids("3.9", known=catalog)
    with pytest.raises(ValueError, match=r"09.14 is now 15.14 \(the interview drill moved"):
        parse_ids("9.14", known=catalog)  # 09.1-09.5 are lesson 09's own exercises
    assert parse_ids("9.3", known=catalog) == ["09.3"]
    with pytest.raises(ValueError, match="'x1' is not an exercise id"):
        parse_ids("x1")
    with pytest.raises(ValueError, match="no exercise ids given"):
        parse_ids(" , ")
    with pytest.raises(ValueError, match="lesson 42 has no exercises"):
        parse_ids("42", known=catalog)


def test_wave_4s_moved_ids_are_explained(catalog):
    """Issue 34 split lesson 11 (precision is lesson 12), made the 2025 block lesson 13 and the
    drill lesson 15: an id from before says where its exercise went, or, where the id names
    another exercise now, notes it."""
    assert catalog["12.1"].functions == ("accumulator_stall",)  # was 11.5
    assert catalog["13.1"].title == "Soft-capped attention weights"  # was 12.1
    assert catalog["15.3"].checks == ("check_mask_after_softmax",)  # was 13.3
    with pytest.raises(ValueError, match=r"11.5 is now 12.1 \(wave 4"):
        parse_ids("11.5", known=catalog)
    with pytest.raises(ValueError, match=r"12.4 is now 13.4 \(wave 4"):
        parse_ids("12.4", known=catalog)
    assert moved_message("13.3", list(catalog)) == (
        "note: 13.3 is an exercise of lesson 13 now; the exercise that was 13.3 before is now 15.3")
    assert moved_message("12.2", list(catalog)).startswith("note: 12.2 is an exercise of lesson 12")
    assert moved_message("11.2", list(catalog)) is None  # stayed in lesson 11
    assert moved_id("9.3".zfill(4)) == "15.3"  # a wave-2 drill id, through both moves


def test_cells_are_matched_to_exercises_by_the_names_they_call_or_define(catalog):
    lesson = {x: e for x, e in catalog.items() if x.startswith("15.")}
    assert exercise_of_check("checks.check_mask_after_softmax(masked_attention)", lesson) == "15.3"
    assert exercise_of_function("import numpy as np\ndef masked_attention(q, k, v, mask):\n"
                                "    return q", lesson) == "15.3"
    assert exercise_of_function("def helper(x):\n    return x", lesson) is None
    assert exercise_of_check("print(1)", lesson) is None


def test_an_assignment_takes_points_from_stars_unless_the_instructor_sets_them(catalog):
    hw = make_assignment("3.1 3.2 4.1 4.5", catalog, title="Week 2", due="2025-03-14")
    assert hw.exercises == ("03.1", "03.2", "04.1", "04.5")
    assert hw.points == {"03.1": 1, "03.2": 2, "04.1": 1, "04.5": 3}
    assert hw.max_points == 7 and hw.due == "2025-03-14T23:59:59"
    hw = make_assignment(["3.1", "4.5"], catalog, points="03.1=2,4.5=4")
    assert hw.points == {"03.1": 2, "04.5": 4} and hw.max_points == 6
    with pytest.raises(ValueError, match="--points names 03.3, which the assignment does not"):
        make_assignment("3.1", catalog, points="3.3=1")
    with pytest.raises(ValueError, match="not ID=POINTS"):
        parse_points("03.1:2")
    with pytest.raises(ValueError, match="'x' is not a number"):
        parse_points("03.1=x")
    with pytest.raises(ValueError, match=">= 0"):
        parse_points("03.1=-1")
    assert parse_points("3.1=0.5") == {"03.1": 0.5}


def test_due_dates_are_iso_8601_with_a_clear_error_otherwise():
    assert parse_due("2025-03-14T23:59") == "2025-03-14T23:59:00"
    assert parse_due("2025-03-14T23:59+01:00") == "2025-03-14T23:59:00+01:00"
    assert parse_due("") is None and parse_due(None) is None
    with pytest.raises(ValueError, match="'14/03/2025' is not an ISO 8601 date"):
        parse_due("14/03/2025")


def test_the_file_round_trips_refuses_to_overwrite_and_names_what_is_wrong(tmp_path, catalog):
    hw = make_assignment("3.1 4.5", catalog, points="4.5=4", title="Week 2 — attention",
                         due="2025-03-14", notebook="hw.ipynb", probe_seed=7)
    path = assignment_path_for(tmp_path / "hw.ipynb")
    assert path.name == "hw.assignment.json"
    save_assignment(hw, path)
    assert load_assignment(path) == hw
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "mha-course-assignment" and data["version"] == 1
    assert data["exercises"] == [{"id": "03.1", "points": 1}, {"id": "04.5", "points": 4}]
    assert "—" in path.read_text(encoding="utf-8")  # UTF-8, not escaped
    with pytest.raises(ValueError, match="already exists; use --force"):
        save_assignment(hw, path)
    save_assignment(Assignment(("03.1",), {"03.1": 1}), path, force=True)
    assert load_assignment(path).exercises == ("03.1",)

    bad = {
        "not json": ("{", "not valid JSON (Expecting property name enclosed in double quotes "
                          "at line 1, column 2)"),
        "a list": ("[]", "not an assignment (expected a JSON object)"),
        "another format": ('{"format": "x"}', "not an assignment file"),
        "newer": (json.dumps({**data, "version": 2}), "written by a newer mha-course"),
        "typo": (json.dumps({**data, "exercize": []}), "unknown field exercize"),
        "no exercises": (json.dumps({**data, "exercises": []}), '"exercises" must be a non-empty'),
        "bad id": (json.dumps({**data, "exercises": [{"id": "3.1", "points": 1}]}),
                   "exercises[0].id '3.1' is not an id"),
        "twice": (json.dumps({**data, "exercises": [{"id": "03.1", "points": 1}] * 2}),
                  "03.1 is listed twice"),
        "bad points": (json.dumps({**data, "exercises": [{"id": "03.1", "points": "2"}]}),
                       "exercises[0].points must be a number"),
        "bad due": (json.dumps({**data, "due": "soon"}), '"due": due date \'soon\''),
        "bad seed": (json.dumps({**data, "probe_seed": -1}), '"probe_seed" must be an integer'),
    }
    for case, (text, message) in bad.items():
        target = tmp_path / f"{case}.assignment.json"
        target.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError) as err:
            load_assignment(target)
        assert message in str(err.value) and str(target) in str(err.value), (case, err.value)
    with pytest.raises(ValueError, match="no such assignment file"):
        load_assignment(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="a notebook without an assignment"):
        notebook = tmp_path / "plain.ipynb"
        notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4}', encoding="utf-8")
        load_assignment(notebook)
    assert from_dict(data, "x").probe_seed == 7
