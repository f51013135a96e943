"""Packaging: environment.yml and pyproject.toml agree, the import stays light, and the
parity tests cannot be skipped silently in CI.

pyproject.toml is read with ``tomllib`` (Python >= 3.11; on 3.10 ``tomli`` is used when
installed, otherwise those tests skip). environment.yml is read with a small line reader, so
PyYAML is not needed; when PyYAML happens to be installed the reader is checked against it.
"""

from __future__ import annotations

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
    """README's "Map of the package": {path: (lesson, [test files])}."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Map of the package", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`mha_course/"):
            rows[cells[0].strip("`")] = (cells[2], re.findall(r"`([\w.]+\.py)`", cells[3]))
    return rows


def package_units() -> dict[str, Path]:
    """Each top-level module of the package, and each sub-package as one unit."""
    pkg = ROOT / "mha_course"
    units = {f"mha_course/{p.name}": p for p in pkg.glob("*.py")
             if p.name not in ("__init__.py", "__main__.py")}
    units.update({f"mha_course/{p.name}/": p / "__init__.py" for p in pkg.iterdir()
                  if (p / "__init__.py").is_file()})
    return units


def test_readme_map_lists_every_module_with_its_lesson_and_tests():
    rows, units = package_map(), package_units()
    assert sorted(rows) == sorted(units), "README's map and the package's modules differ"
    for path, (lesson, tests) in rows.items():
        doc = units[path].read_text(encoding="utf-8").split('"""')[1]
        match = re.search(r"Taught in ``notebooks/(\d\d)_\w+\.ipynb``", doc)
        assert (match.group(1) if match else "—") == lesson, f"{path}: README says {lesson}"
        if match:
            named = re.search(r"Taught in ``notebooks/(\d\d_\w+\.ipynb)``", doc).group(1)
            assert (ROOT / "notebooks" / named).is_file(), f"{path}: its lesson {named} is missing"
        assert tests, f"{path}: no test file in README's map"
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
