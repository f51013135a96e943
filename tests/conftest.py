"""Shared fixtures for the test suite.

- ``torch``: the PyTorch module for the parity tests. Without torch the tests that use it are
  skipped with a message saying how to install it, except when ``MHA_COURSE_REQUIRE_TORCH=1``
  (``.ci/run`` sets it): then a missing torch is a failure, so CI cannot pass with the parity
  tests silently skipped.
- ``triton_flash``: :mod:`mha_course.kernels.triton_flash` for the Triton kernels' tests (triton
  and torch, the ``kernels`` extra), skipped without them except when
  ``MHA_COURSE_REQUIRE_TRITON=1`` (``.ci/run`` sets it), the same way.
- ``rng``: a seeded NumPy generator, fresh for each test.
- :func:`random_layer`: a ``MultiHeadAttention`` whose every parameter is random and nonzero
  (imported by the test modules as ``from conftest import random_layer``).
- Hypothesis settings: few, small examples and no deadline, so the suite stays fast on a shared
  2-core machine. Run ``pytest --hypothesis-profile=thorough`` for a longer search.

Nothing here changes global state such as ``torch.set_default_dtype``: parity tests build their
float64 tensors explicitly.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from mha_course import MultiHeadAttention

TORCH_MISSING = (
    "install the 'reference' extra (pip install -e '.[reference]') to run the parity tests"
)

TRITON_MISSING = (
    "install the 'kernels' extra (pip install -e '.[kernels]') to run the Triton kernels' tests"
)

settings.register_profile(
    "course",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile("course")


def import_torch_or_skip():
    """Return the ``torch`` module; skip the test without it, or fail when CI requires it."""
    try:
        import torch
    except ImportError as exc:
        if os.environ.get("MHA_COURSE_REQUIRE_TORCH") == "1":
            pytest.fail(
                f"MHA_COURSE_REQUIRE_TORCH=1 but torch cannot be imported ({exc}); "
                + TORCH_MISSING,
                pytrace=False,
            )
        pytest.skip(TORCH_MISSING)
    return torch


@pytest.fixture(scope="session")
def torch():
    """PyTorch, for the parity tests (see the module docstring for skip versus fail)."""
    return import_torch_or_skip()


def import_triton_flash_or_skip():
    """Return :mod:`mha_course.kernels.triton_flash`; skip without triton and torch, or fail when
    CI requires them (``MHA_COURSE_REQUIRE_TRITON=1``)."""
    from mha_course.kernels import triton_flash

    if not triton_flash.HAS_TRITON:
        if os.environ.get("MHA_COURSE_REQUIRE_TRITON") == "1":
            pytest.fail(
                "MHA_COURSE_REQUIRE_TRITON=1 but triton or torch cannot be imported "
                f"({triton_flash.IMPORT_ERROR}); " + TRITON_MISSING,
                pytrace=False,
            )
        pytest.skip(TRITON_MISSING)
    return triton_flash


@pytest.fixture(scope="session")
def triton_flash():
    """The Triton kernels' module, for their tests (see the module docstring for skip versus
    fail)."""
    return import_triton_flash_or_skip()


@pytest.fixture
def rng():
    """A seeded generator, so every failure reproduces."""
    return np.random.default_rng(20240611)


def random_layer(rng, bias=False, n_kv_heads=None, *, d_model, h, d_k=None, d_v=None, **options):
    """A layer with N(0, 1/d_model) weights and (with ``bias``) nonzero biases, so every term
    of every parameter matters in a comparison. ``options`` go to the constructor (``rope``).

    Test modules bind their sizes once, e.g.
    ``random_layer = functools.partial(conftest.random_layer, d_model=7, h=4, d_k=6, d_v=9)``.
    """
    layer = MultiHeadAttention(d_model, h, d_k, d_v, bias=bias, rng=rng, n_kv_heads=n_kv_heads,
                               **options)
    for name, p in layer.parameters().items():
        setattr(layer, name, rng.normal(size=p.shape) / np.sqrt(d_model))
    return layer


# The end-to-end runs: each starts kernels, a JupyterLab, a browser, nbgrader or a virtual
# environment, and together they take most of `make test`'s time. `pytest -m slow` runs only them,
# `pytest -m "not slow"` everything else (a maintainer's quick loop); `make test` runs both.
SLOW_FILES = {
    "test_exercise_tools.py", "test_grading.py", "test_export_gradescope.py",
    "test_export_nbgrader.py", "test_sandbox.py", "test_limits.py", "test_trial_checker.py",
    "test_trial_exports.py", "test_protection.py",
}
SLOW_TESTS = {  # single end-to-end tests in files that are otherwise fast
    "test_the_checkers_kernel_sends_threads_subprocesses_and_late_callbacks_as_background",
    "test_a_correct_notebook_with_background_output_gets_full_marks_and_the_same_rows",
    "test_the_wheel_ships_the_references_and_no_solution",  # they build a wheel with pip
    "test_a_learner_with_only_the_wheel_checks_their_notebook",
}


def pytest_collection_modifyitems(config, items):
    """Mark the end-to-end tests ``slow``: the files above, single tests, the browser tests.

    Also skip the Triton kernels' doctests (``triton_flash``'s, ``traffic.count_traffic``'s)
    without triton and torch (``pytest --doctest-modules mha_course``), unless
    ``MHA_COURSE_REQUIRE_TRITON=1``."""
    triton_missing = None
    for item in items:
        if (item.name.startswith(("mha_course.kernels.triton_flash",
                                  "mha_course.kernels.traffic.count_traffic"))
                and os.environ.get("MHA_COURSE_REQUIRE_TRITON") != "1"):
            if triton_missing is None:
                from mha_course.kernels import triton_flash

                triton_missing = not triton_flash.HAS_TRITON
            if triton_missing:
                item.add_marker(pytest.mark.skip(reason=TRITON_MISSING))
        path = getattr(item, "path", None)
        in_browser = path is not None and path.parent.name == "browser"
        if ((path is not None and path.name in SLOW_FILES) or in_browser
                or item.name.split("[")[0] in SLOW_TESTS
                or item.get_closest_marker("browser") is not None):
            item.add_marker(pytest.mark.slow)
