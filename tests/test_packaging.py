"""Packaging: environment.yml and pyproject.toml agree, the import stays light, and the
parity tests cannot be skipped silently in CI.

pyproject.toml is read with ``tomllib`` (Python >= 3.11; on 3.10 ``tomli`` is used when
installed, otherwise those tests skip). environment.yml is read with a small line reader, so
PyYAML is not needed; when PyYAML happens to be installed the reader is checked against it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mha_course

ROOT = Path(__file__).resolve().parents[1]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"
CORE_MODULES = ["softmax", "attention", "multihead", "cost", "naive"]


def load_pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs Python 3.11+")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def requirement_name(spec: str) -> str:
    """'numpy>=1.24' -> 'numpy'; names normalised as in PEP 503."""
    name = re.split(r"[<>=!~;\[\s]", spec.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def environment_dependencies(text: str) -> list[str]:
    """The top-level items of environment.yml's ``dependencies:`` list (not the pip: sublist)."""
    items, inside, indent = [], False, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if re.match(r"^dependencies:\s*$", line):
            inside = True
            continue
        if inside and re.match(r"^\S", line):  # the next top-level key ends the list
            break
        match = re.match(r"^(\s*)-\s+(.*?)\s*(#.*)?$", line)
        if inside and match:
            indent = len(match.group(1)) if indent is None else indent
            if len(match.group(1)) == indent and not match.group(2).endswith(":"):
                items.append(match.group(2))
    return items


def runtime_names(specs) -> set[str]:
    return {requirement_name(s) for s in specs} - {"python", "pip"}


def test_environment_yml_and_pyproject_name_the_same_runtime_packages():
    conda = runtime_names(environment_dependencies((ROOT / "environment.yml").read_text()))
    pip = runtime_names(load_pyproject()["project"]["dependencies"])
    assert conda, "no runtime packages found in environment.yml"
    assert conda == pip, (
        f"only in environment.yml: {sorted(conda - pip)}; only in pyproject.toml: "
        f"{sorted(pip - conda)}"
    )


def test_runtime_packages_are_the_ones_the_course_needs():
    pip = runtime_names(load_pyproject()["project"]["dependencies"])
    assert {"numpy", "matplotlib", "ipywidgets", "jupyterlab"} <= pip
    assert "torch" not in pip  # torch is the optional 'reference' extra, not a runtime need
    # the checker installs with the course (a `make lab` environment checks and grades), the
    # browser tools do not
    assert {"nbval", "pytest", "nbformat", "psutil", "pyzmq"} <= pip
    assert not {"playwright", "voila", "hypothesis", "ruff"} & pip


def test_environment_reader_agrees_with_yaml():
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "environment.yml").read_text()
    parsed = yaml.safe_load(text)["dependencies"]
    assert environment_dependencies(text) == [d for d in parsed if isinstance(d, str)]


def test_environment_reader_on_a_known_file():
    text = textwrap.dedent(
        """\
        # comment
        name: x
        dependencies:
          - python>=3.10
          - numpy >=1.24  # a comment
          - pip
          - Foo_Bar==1.0
          - pip:
              - -e .
              - requests
        channels:
          - conda-forge
        """
    )
    assert environment_dependencies(text) == ["python>=3.10", "numpy >=1.24", "pip", "Foo_Bar==1.0"]
    assert runtime_names(environment_dependencies(text)) == {"numpy", "foo-bar"}


def test_python_lower_bound_is_the_same_in_both_files():
    env = environment_dependencies((ROOT / "environment.yml").read_text())
    python = [s for s in env if requirement_name(s) == "python"]
    assert python, "environment.yml does not pin python"
    conda_bound = re.search(r">=\s*([\d.]+)", python[0]).group(1)
    pip_bound = re.search(r">=\s*([\d.]+)", load_pyproject()["project"]["requires-python"]).group(1)
    assert conda_bound == pip_bound


def test_extras_hold_the_test_tools_and_the_reference():
    extras = load_pyproject()["project"]["optional-dependencies"]
    assert {"pytest", "hypothesis", "nbval", "ruff"} <= runtime_names(extras["test"])
    assert runtime_names(extras["reference"]) == {"torch"}
    # the Triton kernels (issue 35): pinned, and torch beside triton for its interpreter
    assert sorted(extras["kernels"]) == ["torch==2.13.0", "triton==3.9.0"]


def test_make_test_installs_the_kernels_extra_and_ci_requires_it():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("$(VENV)/.installed-test:", 1)[1].split("\n\n", 1)[0]
    assert "pip install -e '.[test,kernels]'" in recipe
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export MHA_COURSE_REQUIRE_TRITON=1" in ci
    assert "pip install -q torch==2.13.0" in ci


def test_torch_marker_is_registered():
    markers = load_pyproject()["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.split(":")[0].strip() == "torch" for m in markers)


def test_package_version_matches_pyproject():
    assert mha_course.__version__ == load_pyproject()["project"]["version"]


def test_public_names_exist():
    for name in mha_course.__all__:
        assert hasattr(mha_course, name), name


@pytest.mark.parametrize("module", CORE_MODULES)
def test_each_core_module_names_the_lesson_that_teaches_it(module):
    doc = __import__(f"mha_course.{module}", fromlist=["_"]).__doc__
    match = re.search(r"Taught in ``?notebooks/(\d\d_\w+\.ipynb)", doc or "")
    assert match, f"mha_course.{module}'s docstring does not name its lesson"


def package_map() -> dict[str, tuple[str, list[str]]]:
    """The maintainer's "Map of the package" (docs/maintainers.md): {path: (lesson, [tests])}."""
    text = (ROOT / "docs" / "maintainers.md").read_text(encoding="utf-8")
    section = text.split("### Map of the package", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`mha_course/"):
            rows[cells[0].strip("`")] = (cells[2], re.findall(r"`([\w.]+\.py)`", cells[3]))
    return rows


#: The package's wings, in the order imports point: a module may import its own wing and the
#: wings after it in this list, never one before it (the top level, "", is the attention itself).
WINGS = ["widgets", "grading", "checks", "models", "serving", "parallel", "variants", "kernels",
         ""]
#: Wings mapped module by module in the maintainer's map; the others appear as one row each.
MAPPED_WINGS = ["models", "serving", "widgets", "parallel", "variants", "kernels"]


def package_units() -> dict[str, Path]:
    """Each top-level module, each module of the mapped wings, and each other sub-package."""
    pkg = ROOT / "mha_course"
    units = {f"mha_course/{p.name}": p for p in pkg.glob("*.py")
             if p.name not in ("__init__.py", "__main__.py")}
    for wing in MAPPED_WINGS:
        units.update({f"mha_course/{wing}/{p.name}": p for p in (pkg / wing).glob("*.py")
                      if p.name != "__init__.py"})
    units.update({f"mha_course/{p.name}/": p / "__init__.py" for p in pkg.iterdir()
                  if (p / "__init__.py").is_file() and p.name not in MAPPED_WINGS})
    return units


def wing_of(module: str) -> str:
    """``mha_course.models.gpt`` -> ``models``; a top-level module -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in WINGS else ""


def package_imports():
    """(importing module, imported module) for every import between package modules."""
    import ast

    pkg = ROOT / "mha_course"
    for path in sorted(pkg.rglob("*.py")):
        if "voila_app" in path.parts or path.name in ("__init__.py", "__main__.py"):
            continue  # an __init__ only re-exports, __main__ is the command line's entry point,
            # voila.py is Voila's settings file
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: -node.level]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" for a in node.names]
                targets = [n if (ROOT / Path(*n.split("."))).with_suffix(".py").is_file()
                           or (ROOT / Path(*n.split("."))).is_dir() else target for n in names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == "mha_course":
                    yield module, target


def test_imports_point_down_the_wings():
    """widgets -> grading -> checks -> models -> the attention: never the other way."""
    rank = {wing: i for i, wing in enumerate(WINGS)}
    up = [f"{src} imports {dst}" for src, dst in package_imports()
          if rank[wing_of(dst)] < rank[wing_of(src)]]
    assert not up, "imports pointing up the wings: " + "; ".join(up)


def test_the_import_check_sees_imports_that_point_up():
    assert wing_of("mha_course.models.gpt") == "models"
    assert wing_of("mha_course.attention") == ""
    assert wing_of("mha_course.widgets") == ""  # the wing's __init__ is only a re-export
    pairs = list(package_imports())
    assert ("mha_course.widgets.app", "mha_course.models.tasks") in pairs  # down: allowed
    assert any(src.startswith("mha_course.models.") and wing_of(dst) == ""
               for src, dst in pairs)


def test_the_top_level_holds_at_most_22_entries():
    """The top level shows the architecture: the attention's modules and one folder per wing."""
    pkg = ROOT / "mha_course"
    entries = sorted(p.name for p in pkg.iterdir() if p.name != "__pycache__"
                     and (p.suffix == ".py" or (p / "__init__.py").is_file()))
    assert len(entries) <= 22, f"{len(entries)} entries at the top level: {entries}"
    wings = {p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    assert wings == set(WINGS[:-1]), f"wings on disk {sorted(wings)} != WINGS {WINGS[:-1]}"


def test_every_wing_says_what_lives_there_and_what_it_may_import():
    for wing in WINGS[:-1]:
        doc = (ROOT / "mha_course" / wing / "__init__.py").read_text(encoding="utf-8")
        doc = doc.split('"""')[1]
        assert "import" in doc, f"mha_course/{wing}/__init__.py does not say what it may import"


def lesson_named(doc: str) -> str:
    """The lesson a docstring names first ("03", "app"), or "—" when it names none."""
    match = re.search(r"``notebooks/(?:deep_dives/)?(\d\d)[a-z]?_\w+\.ipynb``"
                      r"|``notebooks/(app)\.ipynb``", doc)
    return (match.group(1) or match.group(2)) if match else "—"


def test_readme_map_lists_every_module_with_its_lesson_and_tests():
    rows, units = package_map(), package_units()
    assert sorted(rows) == sorted(units), "the maintainer's map and the package's modules differ"
    for path, (lesson, tests) in rows.items():
        doc = units[path].read_text(encoding="utf-8").split('"""')[1]
        if path.endswith("/"):  # checks/ and grading/ serve every lesson
            assert lesson in ("—", lesson_named(doc)), f"{path}: README says {lesson}"
        else:
            assert lesson_named(doc) == lesson, f"{path}: README says {lesson}"
        match = re.search(r"``notebooks/((?:deep_dives/)?\d\d[a-z]?_\w+\.ipynb|app\.ipynb)``", doc)
        if match:
            named = match.group(1)
            assert (ROOT / "notebooks" / named).is_file(), f"{path}: its lesson {named} is missing"
        elif not path.endswith("/"):
            raise AssertionError(f"{path}: its docstring names no lesson")
        assert tests, f"{path}: no test file in the maintainer's map"
        for test in tests:
            assert (ROOT / "tests" / test).is_file(), f"{path}: {test} does not exist"


def test_importing_the_package_loads_no_plotting_widgets_or_torch():
    code = (
        "import sys, mha_course, mha_course.naive\n"
        "heavy = [m for m in ('matplotlib', 'ipywidgets', 'torch') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "", f"import mha_course loads {result.stdout.strip()}"


# ------------------------------------------------------------------ the torch fixture's guard
@pytest.fixture
def project_without_torch(tmp_path):
    """A copy of our conftest, a test that needs torch, and a `torch` that fails to import."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_needs_torch.py").write_text("def test_uses_torch(torch):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    fake = tmp_path / "fake_site"
    fake.mkdir()
    (fake / "torch.py").write_text("raise ImportError('torch is not installed (test stub)')\n")
    return tmp_path


def run_pytest(project, require):
    env = {k: v for k, v in os.environ.items() if k != "MHA_COURSE_REQUIRE_TORCH"}
    env["PYTHONPATH"] = str(project / "fake_site")
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # faster: no nbval, playwright, ...
    if require:
        env["MHA_COURSE_REQUIRE_TORCH"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(project)],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )


def test_missing_torch_skips_parity_tests_with_install_hint(project_without_torch):
    result = run_pytest(project_without_torch, require=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "pip install -e '.[reference]'" in result.stdout


def test_missing_torch_fails_parity_tests_when_ci_requires_it(project_without_torch):
    result = run_pytest(project_without_torch, require=True)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "MHA_COURSE_REQUIRE_TORCH=1" in result.stdout
    assert "skipped" not in result.stdout


# ------------------------------------------------------------------ the README's lesson path
def reading_minutes(path: Path) -> int:
    """The README's estimate of a lesson's time: 120 words a minute of its text and half a minute
    per code cell, rounded to 5 minutes."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    words = sum(len(re.findall(r"\w+", "".join(c["source"]))) for c in nb["cells"]
                if c["cell_type"] == "markdown")
    code = sum(c["cell_type"] == "code" for c in nb["cells"])
    return 5 * round((words / 120 + code / 2) / 5)


def readme_lessons() -> dict[str, tuple[int, int]]:
    """{lesson file: (minutes, exercises)} from the README's lesson tables (deep dives too, as
    ``deep_dives/NNx_name.ipynb``, with 0 exercises)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The lessons", 1)[1].split("\n## ", 1)[0]
    return {m[0]: (int(m[1]), int(m[2] or 0)) for m in re.findall(
        r"^\| `notebooks/((?:deep_dives/)?\d\d[a-z]?_\w+\.ipynb)` \|.*\| (\d+) min"
        r"(?: \+ (\d+) exercises| \+ no exercises)? \|$", section, flags=re.M)}


def test_readme_lists_every_lesson_and_deep_dive_in_order_with_its_time_and_exercises():
    listed = readme_lessons()
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    dives = sorted(f"deep_dives/{p.name}" for p in (ROOT / "notebooks/deep_dives").glob("*.ipynb"))
    assert [n for n in listed if "/" not in n] == lessons, "the README's lessons differ"
    assert sorted(n for n in listed if "/" in n) == dives, "the README's deep dives differ"
    for name, (minutes, exercises) in listed.items():
        estimate = reading_minutes(ROOT / "notebooks" / name)
        assert abs(minutes - estimate) <= 5, f"{name}: README says {minutes} min, about {estimate}"
        solution = ROOT / "solutions" / Path(name).name
        ids = set()
        if solution.is_file():
            nb = json.loads(solution.read_text(encoding="utf-8"))
            ids = {c["metadata"]["mha_course"]["exercise"] for c in nb["cells"]
                   if "exercise" in c.get("metadata", {}).get("mha_course", {})}
        assert exercises == len(ids), f"{name}: README says {exercises} exercises, not {len(ids)}"


def _minutes(names) -> float:
    """Unrounded reading minutes of lessons and deep dives named ``07`` or ``07a``."""
    total = 0.0
    for token in names:
        folder = ROOT / "notebooks" / ("deep_dives" if token[-1].isalpha() else "")
        (path,) = folder.glob(f"{token}_*.ipynb")
        nb = json.loads(path.read_text(encoding="utf-8"))
        words = sum(len(re.findall(r"\w+", "".join(c["source"]))) for c in nb["cells"]
                    if c["cell_type"] == "markdown")
        total += words / 120 + sum(c["cell_type"] == "code" for c in nb["cells"]) / 2
    return total


def test_readme_study_plans_say_what_their_lessons_take():
    """Issue 34 item 6: the plans (a weekend, a week, by role) with the time each takes."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Study plans", 1)[1].split("\n## ", 1)[0]
    plans = re.findall(r"^\| \*\*(.+?)\*\* \| [^|]* \| ((?:\d\d[a-z]?,? ?)+) \| (\d+) h (\d+) min",
                       section, flags=re.M)
    names = [name.lower() for name, *_ in plans]
    assert len(plans) >= 5 and any("weekend" in n for n in names) and any("week" in n
                                                                           for n in names)
    for role in ("research", "serving", "training"):
        assert any(role in n for n in names), f"no study plan for the {role} role"
    for name, lessons, hours, mins in plans:
        tokens = re.findall(r"\d\d[a-z]?", lessons)
        said = 60 * int(hours) + int(mins)
        assert abs(said - _minutes(tokens)) <= 5, (
            f"plan {name!r}: README says {hours} h {mins} min, the lessons take "
            f"{_minutes(tokens):.0f} min")


def test_readme_groups_the_lessons_into_the_course_parts():
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("## The lessons", 1)[1]
    for part in ("Part I", "Part II", "Part III", "interview (14, 15)"):
        assert part in text.split("\n## ", 1)[0], f"the lesson path has no {part}"


def test_readme_headline_times_are_the_lessons_reading_times():
    """The first screen's "7 h 40 min of reading" and "29 optional deep dives add ..." stay true."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    core = re.search(r"The course takes (\d+) h (\d+) min of reading\*\* on the core path", text)
    dives = re.search(r"(\d+) optional deep dives add (\d+) h(?: (\d+) min)?", text)
    assert core and dives, "the README's first screen does not say how long the course takes"
    lessons = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    extra = sorted(p.name[:3] for p in (ROOT / "notebooks/deep_dives").glob("*.ipynb"))
    assert abs(60 * int(core[1]) + int(core[2]) - _minutes(lessons)) <= 5
    assert int(dives[1]) == len(extra)
    assert abs(60 * int(dives[2]) + int(dives[3] or 0) - _minutes(extra)) <= 5
