"""Every committed notebook is tidy (``mha_course.grading.authoring.tidy``) and was run top to
bottom.

Tidy: the kernelspec ipykernel installs (so JupyterLab does not rewrite the file on open), no
per-cell timing metadata, no saved widget state or live-widget output, nbval markers as cell tags
only. Run: lessons and solutions were executed from a fresh kernel (execution counts 1..N), so
the outputs nbval compares are the ones a learner sees. ``make notebook NB=...`` does both.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from mha_course.grading.authoring.tidy import problems

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(
    p.relative_to(ROOT).as_posix()
    for folder in ("notebooks", "notebooks/deep_dives", "solutions", "exercises")
    for p in (ROOT / folder).glob("*.ipynb")
)


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_is_tidy(path):
    found = problems(nbformat.read(ROOT / path, as_version=4))
    assert not found, f"{path} (run `make notebook NB={path}`): " + "; ".join(found[:5])


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.startswith("exercises/")])
def test_lessons_and_solutions_were_run_top_to_bottom(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path}: execution counts {counts[:8]}...; re-run it with `make notebook NB={path}`")


# notebooks/ holds the numbered lessons, their deep dives (notebooks/deep_dives/) and the app's
# notebook (app.ipynb, served by `make app`): all keep their ignored outputs few; only lessons link
# exercises.
IN_NOTEBOOKS = [p for p in NOTEBOOKS if p.startswith("notebooks/")]
LESSONS = [p for p in IN_NOTEBOOKS if re.fullmatch(r"notebooks/\d\d_\w+\.ipynb", p)]
MAX_IGNORED_OUTPUTS = 3  # timings and live widget views only
# Deep dive 07a is the performance lab: its timings are the point (the timed cells, and the
# contenders' count, which is one fewer on a machine without PyTorch).
MAX_IGNORED_OUTPUTS_IN = {"notebooks/deep_dives/07a_performance_lab.ipynb": 6}


def _tagged(nb, tag):
    return [i for i, c in enumerate(nb.cells) if tag in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", IN_NOTEBOOKS)
def test_lesson_ignores_few_outputs_and_raises_at_most_once(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    ignored = _tagged(nb, "nbval-ignore-output")
    allowed = MAX_IGNORED_OUTPUTS_IN.get(path, MAX_IGNORED_OUTPUTS)
    assert len(ignored) <= allowed, f"{path}: cells {ignored} ignore their output"
    raising = _tagged(nb, "raises-exception")
    assert len(raising) <= 1, f"{path}: cells {raising} raise on purpose; one per lesson"


@pytest.mark.parametrize("path", LESSONS)
def test_lesson_ends_by_linking_its_exercises(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    last = nb.cells[-1]
    number = Path(path).name[:2]
    links = re.findall(r"\]\((\.\./exercises/[^)]+\.ipynb)\)", last.source)
    if not list((ROOT / "solutions").glob(f"{number}_*.ipynb")):  # a lesson without exercises
        assert last.cell_type == "markdown" and not links, f"{path}: it has no exercises to link"
        return
    assert last.cell_type == "markdown" and links, (
        f"{path}: the last cell should link ../exercises/{number}_*.ipynb")
    for link in links:
        target = (ROOT / "notebooks" / link).resolve()
        assert target.name.startswith(number) and target.is_file(), f"{path}: {link} is missing"


def test_make_lint_runs_ruff_on_the_notebooks_too():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    ruff_line = next(line for line in recipe.splitlines() if "ruff check" in line)
    for folder in ("notebooks", "solutions", "exercises", "mha_course", "tests"):
        assert folder in ruff_line.split(), f"make lint does not check {folder}/"
    pyproject = (ROOT / "pyproject.toml").read_text()
    excluded = re.findall(r"^(?:extend-)?exclude\s*=\s*\[(.*?)\]", pyproject, re.MULTILINE | re.S)
    for folder in ("notebooks", "solutions", "exercises"):
        assert not any(folder in block for block in excluded), f"ruff excludes {folder}/"


LINK = re.compile(
    r"\]\(((?:\.\./){0,2}(?:notebooks/|exercises/|solutions/)?(?:deep_dives/)?\d\d[a-z]?_\w+\.ipynb)"
    r"(?:#[^)]*)?\)")


def _links(text: str) -> list[str]:
    return LINK.findall(text)


def test_every_link_to_a_lesson_or_exercise_notebook_points_to_one_that_exists():
    """The course may have gaps in its numbering (wave 3 moved the drill to 13 before lessons 09
    to 12 arrived), but nothing may point to a notebook that does not exist."""
    missing = []
    for path in NOTEBOOKS:
        nb = nbformat.read(ROOT / path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "markdown":
                continue
            for link in _links(cell.source):
                if not ((ROOT / path).parent / link).resolve().is_file():
                    missing.append(f"{path} cell {i}: {link}")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in re.findall(r"`((?:notebooks|exercises|solutions)/\d\d_\w+\.ipynb)`", readme):
        if not (ROOT / name).is_file():
            missing.append(f"README.md: {name}")
    assert not missing, "links to notebooks that do not exist: " + "; ".join(missing)


def test_the_link_check_sees_a_missing_lesson():
    assert _links("see [lesson 09](09_tiny_gpt.ipynb#3-training) and "
                  "[the drill](../exercises/15_interview_drill.ipynb)") == [
        "09_tiny_gpt.ipynb", "../exercises/15_interview_drill.ipynb"]


def test_each_lesson_ends_with_a_link_to_the_following_lesson_that_exists():
    for here, after in zip(LESSONS, LESSONS[1:], strict=False):
        last = nbformat.read(ROOT / here, as_version=4).cells[-1].source
        assert Path(after).name in _links(last), (
            f"{here}: its last cell should link the next lesson, {Path(after).name}")


#: An absolute path of the machine a notebook ran on, where a saved output names a file: one of
#: the usual homes of a checkout or a temporary file, or any folder holding installed packages.
#: It may follow a terminal colour code (IPython's tracebacks colour file names), not a word or
#: a relative path.
MACHINE_PATH = re.compile(r"(?:(?<=\x1b\[\dm)|(?<=\x1b\[\d\dm)|(?<![\w.~/-]))"
                          r"(?:/(?:work|tmp|root|home|Users)/"
                          r"|(?:/[\w.+@~-]+)+/(?:site|dist)-packages/)")


def _output_texts(output) -> list[str]:
    texts = [output.get("text", ""), output.get("evalue", ""), *output.get("traceback", [])]
    texts += [v for k, v in output.get("data", {}).items() if k.startswith("text/")]
    return [t if isinstance(t, str) else "".join(t) for t in texts]


def machine_paths(nb) -> list[str]:
    """``cell N: PATH...`` for each saved output that names a path of the machine it ran on."""
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            for text in _output_texts(output):
                for match in MACHINE_PATH.finditer(text):
                    end = re.search(r"[\s'\"\x1b:]|$", text[match.end():]).start()
                    found.append(f"cell {index}: {text[match.start():match.end() + end]}")
    return found


def test_no_saved_output_names_a_path_of_the_machine_it_ran_on():
    """Tracebacks saved in ten lessons named the maintainers' checkouts (/work/wt/claims-rest/...);
    `python -m mha_course tidy` saves them as mha_course/... and <site-packages>/...."""
    found = [f"{path} {line}" for path in NOTEBOOKS
             for line in machine_paths(nbformat.read(ROOT / path, as_version=4))]
    assert not found, ("saved outputs name paths of the machine they ran on (run `python -m "
                       "mha_course tidy NOTEBOOK`):\n" + "\n".join(found[:20]))


def test_the_path_check_sees_a_traceback_a_warning_and_an_error_message():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("/work/ in prose is fine"), nbformat.v4.new_code_cell(
        outputs=[nbformat.v4.new_output("error", ename="E", evalue="no '/home/ana/x.txt'",
                                        traceback=["\x1b[32m/work/wt/a/mha_course/x.py:3\x1b[39m"]),
                 nbformat.v4.new_output("stream", name="stderr",
                                        text="/opt/venv/lib/site-packages/np/w.py:1: Warning\n"),
                 nbformat.v4.new_output("execute_result", execution_count=1,
                                        data={"text/plain": "PosixPath('/tmp/run')"})]),
        nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
            "stream", name="stdout", text="mha_course/x.py, <site-packages>/np/w.py, "
            "https://example.org/home/work/, a/tmp/b, ratio 1/tmp/\n")])]
    assert machine_paths(nb) == ["cell 1: /home/ana/x.txt", "cell 1: /work/wt/a/mha_course/x.py",
                                 "cell 1: /opt/venv/lib/site-packages/np/w.py",
                                 "cell 1: /tmp/run"]


DRILL = "15_interview_drill.ipynb"


def _solution_exercises() -> dict[str, dict[str, dict]]:
    """{notebook name: {exercise id: its cells' mha_course metadata, merged}} from solutions/."""
    found = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("mha_course", {})
            if "exercise" in meta:
                found.setdefault(path.name, {}).setdefault(meta["exercise"], {}).update(meta)
    return found


def test_readme_counts_the_exercises_that_solutions_holds():
    """The README said "4 to 6 exercises each in lessons 01 to 09" when lessons 10 to 12 had
    arrived, and "14 spot-the-bug exercises" when the drill had 25 (newcomer trial item 4)."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    lessons = _solution_exercises()
    drill = lessons.pop(DRILL)  # the last stop
    counts = [len(ids) for ids in lessons.values()]
    last = max(lessons)[:2]
    said = re.search(r"(\d+) to (\d+) exercises each in lessons 01 to (\d\d)", readme)
    assert said, "README: the sentence '<min> to <max> exercises each in lessons 01 to <NN>'"
    assert [int(g) for g in said.groups()] == [min(counts), max(counts), int(last)], (
        f"README says {said.group(0)!r}; solutions/ has {min(counts)} to {max(counts)} "
        f"exercises each in lessons 01 to {last} ({sum(counts)} in all)")
    in_all = re.search(r"(\d+) to \d+ exercises each in lessons 01 to \d\d, (\d+) in all", readme)
    assert in_all is None or int(in_all.group(2)) == sum(counts), (
        f"README says {in_all.group(0)!r}; solutions/ has {sum(counts)}")
    bugs = sum(meta.get("kind") == "broken" for meta in drill.values())
    others = len(drill) - bugs
    assert others == 1, f"the drill has {others} exercises that are not spot-the-bug, not 1"
    for number in re.findall(r"(\d+) spot-the-bug exercises", readme):
        assert int(number) == bugs, f"README: {number} spot-the-bug exercises, not {bugs}"
    assert re.search(rf"drill of {bugs} spot-the-bug exercises and a timed build", readme), (
        f"README: the drill of {bugs} spot-the-bug exercises and a timed build")
