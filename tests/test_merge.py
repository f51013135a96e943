"""Answers found where learners put them: the notebook the checker runs, built in milliseconds.

``merge_learner`` puts a learner's cells into a copy of the reference (see
``mha_course.grading.running.merge``); these tests build both notebooks by hand, so no kernel runs.
``tests/test_exercise_tools.py`` runs the same cases end to end.
"""

from __future__ import annotations

import copy

import nbformat
import pytest

from mha_course.grading.authoring.generate import make_exercise_notebook
from mha_course.grading.running.merge import classify, merge_learner


def cell(kind, source, cell_id, **meta):
    made = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(source)
    made.id = cell_id
    if meta:
        made.metadata["mha_course"] = meta
    return made


def solution(exercise, body, cell_id):
    return cell("code", f"### BEGIN SOLUTION\n{body}\n### END SOLUTION", cell_id,
                exercise=exercise, role="solution", task=f"do {exercise}")


REF = nbformat.v4.new_notebook(cells=[
    cell("code", "import numpy as np", "setup", role="setup"),
    cell("markdown", "## 01.1", "t1", exercise="01.1", role="task"),
    solution("01.1", "x = 1", "a"),
    cell("code", "check_x(x)", "ac", exercise="01.1", role="check"),
    cell("code", "print(x)", "demo"),
    cell("markdown", "## 01.2", "t2", exercise="01.2", role="task"),
    solution("01.2", "y = 2", "b"),
    cell("code", "check_y(y)", "bc", exercise="01.2", role="check"),
])


def learner(**answers):
    """The exercise notebook (stubs), with ``answers`` typed into the solution cells by id."""
    nb = make_exercise_notebook(REF)
    for c in nb.cells:
        if c.id in answers:
            c.source = answers[c.id]
    return nb


def insert(nb, before_id, source, cell_id):
    index = next(i for i, c in enumerate(nb.cells) if c.id == before_id)
    nb.cells.insert(index, cell("code", source, cell_id))
    return nb


def ran(merged):
    """(role, label, source) of every code cell the checker runs, in order."""
    code = [c for c in merged.notebook.cells if c.cell_type == "code"]
    assert len(code) == len(merged.roles)
    return [(r.exercise, r.role, c.source) for c, r in zip(code, merged.roles, strict=True)]


def test_the_learners_own_cells_run_before_their_answers_in_order():
    """Issue 10, problem 5: `import math` in the learner's own cell used to be dropped."""
    nb = learner(a="x = math.floor(helper())")
    insert(nb, "t1", "import math", "mine-1")
    insert(nb, "ac", "def helper():\n    return 1.5", "mine-2")
    merged = merge_learner(REF, nb)
    assert ran(merged)[:5] == [
        (None, "setup", "import numpy as np"),
        ("01.1", "own", "import math"),
        ("01.1", "solution", "x = math.floor(helper())"),
        ("01.1", "own", "def helper():\n    return 1.5"),
        ("01.1", "check", "check_x(x)"),
    ]
    assert merged.roles[1].label == "your cell `import math`"
    assert merged.notebook.cells[2].metadata["tags"] == ["nbval-ignore-output"]
    assert not merged.missing and not merged.notes


def test_a_cell_whose_metadata_was_lost_is_matched_by_its_id():
    nb = learner(a="x = 1")
    next(c for c in nb.cells if c.id == "a").metadata = {}
    assert ("01.1", "solution", "x = 1") in ran(merge_learner(REF, nb))


def test_an_answer_in_a_copied_cell_wins_over_the_stub_left_behind():
    nb = learner()
    stub = next(c for c in nb.cells if c.id == "b")
    copied = copy.deepcopy(stub)
    copied.id, copied.source = "my-copy", "y = 2"
    nb.cells.insert(nb.cells.index(stub) + 1, copied)
    merged = merge_learner(REF, nb)
    assert [s for x, role, s in ran(merged) if x == "01.2" and role == "solution"] == ["y = 2"]
    assert not merged.notes


def test_several_answers_all_run_in_order_with_a_note():
    """A wrong duplicate below the right answer used to pass: now it is what gets checked."""
    nb = learner(a="x = 1")
    right = next(c for c in nb.cells if c.id == "a")
    wrong = copy.deepcopy(right)
    wrong.id, wrong.source = "dup", "x = 2"
    nb.cells.insert(nb.cells.index(right) + 2, wrong)  # below the check cell
    merged = merge_learner(REF, nb)
    answers = [(r.label, s) for (_, role, s), r in zip(ran(merged), merged.roles, strict=True)
               if role == "solution" and r.exercise == "01.1"]
    assert answers == [("your solution cell (cell 3, answer 1 of 2)", "x = 1"),
                       ("your solution cell (cell 5, answer 2 of 2)", "x = 2")]
    assert merged.notes == {"01.1": ["cells 3 and 5 of your notebook all answer Exercise 01.1; "
                                     "they ran in that order, so the last one's definitions "
                                     "were checked"]}


def test_a_deleted_solution_cell_is_missing_and_gets_the_stub():
    nb = learner(a="x = 1")
    nb.cells = [c for c in nb.cells if c.id != "b"]
    merged = merge_learner(REF, nb)
    assert merged.missing == {"01.2"}
    stub = 'raise NotImplementedError("Exercise 01.2: do 01.2")'
    assert ("01.2", "solution", stub) in ran(merged)


def test_an_exercise_stubbed_after_a_crash_gets_no_learner_cell():
    nb = insert(learner(a="import os\nos._exit(1)"), "t1", "import math", "mine")
    merged = merge_learner(REF, nb, stubbed={"01.1"})
    assert [(x, role) for x, role, _ in ran(merged)][:3] == [
        (None, "setup"), ("01.1", "solution"), ("01.1", "check")]
    assert "NotImplementedError" in ran(merged)[1][2]


def test_cells_after_the_last_answer_and_cells_of_unattempted_exercises_do_not_run():
    nb = learner(a="x = 1")
    nb.cells.append(cell("code", "print('scratch')\nraise ValueError('oops')", "scratch"))
    insert(nb, "b", "import heavy_thing", "before-stub")  # 01.2 is still the stub
    merged = merge_learner(REF, nb)
    sources = [s for _, _, s in ran(merged)]
    assert "import heavy_thing" not in sources and not any("scratch" in s for s in sources)


def test_a_changed_setup_cell_runs_as_the_learners_own_after_the_reference_one():
    nb = learner(a="x = math.pi")
    next(c for c in nb.cells if c.id == "setup").source = "import numpy as np\nimport math"
    merged = merge_learner(REF, nb)
    assert ran(merged)[:3] == [(None, "setup", "import numpy as np"),
                               ("01.1", "own", "import numpy as np\nimport math"),
                               ("01.1", "solution", "x = math.pi")]
    assert merged.roles[1].label == "your changed setup cell `import numpy as np`"


def test_reference_cells_without_an_id_are_recognised_by_their_source():
    nb = learner(a="x = 1")
    for c in nb.cells:
        if c.id == "demo":
            c.id = "other-id"
    kinds = [(c.kind, c.exercise) for c in classify(REF, nb)]
    assert kinds == [("answer", "01.1"), ("check", "01.1"), ("answer", "01.2"),
                     ("check", "01.2")]


@pytest.mark.parametrize("marker", ["# NBVAL_SKIP", "# NBVAL_IGNORE_OUTPUT"])
def test_nbval_markers_in_the_learners_cells_are_neutralised(marker):
    nb = learner(a=f"{marker}\nx = 1")
    insert(nb, "a", f"{marker}\nimport math", "mine")
    sources = [s for _, _, s in ran(merge_learner(REF, nb))]
    assert f"# ({marker[2:]} ignored by the checker)\nx = 1" in sources
    assert f"# ({marker[2:]} ignored by the checker)\nimport math" in sources
