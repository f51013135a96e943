"""The checks of lesson 07's kernel exercises (07.7 to 07.11): each passes a right kernel and
names each classic wrong one, run through Triton's interpreter.

Each wrong kernel is the right one with a ``MISTAKE`` constexpr switched on (:class:`Mistake`
passes it at launch), so the test shows the check catches that one mistake: the accumulator not
rescaled when the running max grows, the log-sum-exp not written or in base 2, the causal mask
off by one on the diagonal or aligned top-left, the GQA head mapped by ``i % g`` or K/V read as
if copied, a tail block read or written past the end, the backward's weights not recomputed from the
saved log-sum-exp or D not subtracted. What every kernel shares (a masked tile load and store,
the running max/sum/output at the start, the online-softmax step) is written once as Triton
helpers; each kernel writes out only the part its mistakes are in. The generic contract
(``tests/check_contract.py``) is bound to :data:`CORRECT` by :class:`TestContract`.

Without triton or torch the module is skipped with one line, unless
``MHA_COURSE_REQUIRE_TRITON=1`` (CI): then it fails.
"""

from __future__ import annotations

import os

import pytest
from check_contract import CheckContract

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels on the CPU

TRITON_MISSING = ("install the 'kernels' extra (pip install -e '.[kernels]') to run the Triton "
                  "kernel exercises' checks")
try:
    import torch  # noqa: F401
    import triton
    import triton.language as tl
    from triton.runtime.jit import KernelInterface
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("MHA_COURSE_REQUIRE_TRITON") == "1":
        raise ImportError(f"MHA_COURSE_REQUIRE_TRITON=1 but {exc}; {TRITON_MISSING}") from exc
    pytest.skip(TRITON_MISSING, allow_module_level=True)

from mha_course import checks  # noqa: E402
from mha_course.checks import CheckFailed, kernels  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("TRITON_INTERPRET is not 1: these tests run kernels in Triton's interpreter",
                allow_module_level=True)


class Mistake(KernelInterface):
    """A kernel launched with ``MISTAKE=n``: the right kernel with one classic mistake."""

    def __init__(self, kernel, mistake):
        self.kernel, self.mistake = kernel, mistake

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, MISTAKE=self.mistake, **kwargs)


# ------------------------------------------------------------------ what every kernel shares
@triton.jit
def _tile(P, idx, n, D: tl.constexpr):
    """Rows ``idx`` of the row-major (n, D) matrix at ``P``; zeros for rows at or past ``n``."""
    offs_d = tl.arange(0, D)
    return tl.load(P + idx[:, None] * D + offs_d[None, :], mask=idx[:, None] < n, other=0.0)


@triton.jit
def _store_tile(P, idx, n, x, D: tl.constexpr):
    """Write ``x`` to rows ``idx`` of the (n, D) matrix at ``P``, none at or past ``n``."""
    offs_d = tl.arange(0, D)
    tl.store(P + idx[:, None] * D + offs_d[None, :], x, mask=idx[:, None] < n)


@triton.jit
def _start(BLOCK_M: tl.constexpr, D: tl.constexpr):
    """The running max, sum and output of a query block before any key: -inf, 0, 0."""
    return (tl.full((BLOCK_M,), float("-inf"), tl.float32), tl.zeros((BLOCK_M,), tl.float32),
            tl.zeros((BLOCK_M, D), tl.float32))


@triton.jit
def _online_step(s, v, m_i, l_i, acc):
    """Fold one key tile (scores ``s``, values ``v``) into the running max, sum and output."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)


# ------------------------------------------------------------------ kernels with switches
@triton.jit
def _flash(Q, K, V, O, LSE, T, S, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr = 0):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _tile(Q, rows, T, D)
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in range(0, S, BLOCK_N):  # the online step written out: its mistakes are here
        cols = start_n + tl.arange(0, BLOCK_N)
        k, v = _tile(K, cols, S, D), _tile(V, cols, S, D)
        s = tl.where(cols[None, :] < S, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        if MISTAKE == 3:
            alpha = tl.exp(m_new - m_i)
        p = tl.exp(s - m_new[:, None])
        if MISTAKE == 2:
            l_i = l_i + tl.sum(p, 1)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        if MISTAKE == 1:
            acc = acc + tl.dot(p, v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    o = acc if MISTAKE == 4 else acc / l_i[:, None]
    if MISTAKE == 8:
        tl.store(O + rows[:, None] * D + tl.arange(0, D)[None, :], o)
    else:
        _store_tile(O, rows, T, o, D)
    if MISTAKE == 6:
        tl.store(LSE + rows, (m_i + tl.log(l_i)) * 1.4426950408889634, mask=rows < T)
    elif MISTAKE == 7:
        tl.store(LSE + rows, tl.log(l_i), mask=rows < T)
    elif MISTAKE != 5:
        tl.store(LSE + rows, m_i + tl.log(l_i), mask=rows < T)


@triton.jit
def _causal(Q, K, V, O, LSE, T, S, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr = 0):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = _tile(Q, rows, T, D)
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + offs_n
        if MISTAKE == 1:
            visible = cols[None, :] < rows[:, None] + (S - T)
        elif MISTAKE == 2:
            visible = cols[None, :] <= rows[:, None]
        elif MISTAKE == 3:
            visible = cols[None, :] <= rows[:, None] + (S - T) + 1
        elif MISTAKE == 4:
            visible = offs_n[None, :] <= tl.arange(0, BLOCK_M)[:, None] + (S - T)
        else:
            visible = cols[None, :] <= rows[:, None] + (S - T)
        s = tl.where(visible & (cols[None, :] < S),
                     tl.dot(q, tl.trans(_tile(K, cols, S, D))) * scale, float("-inf"))
        m_i, l_i, acc = _online_step(s, _tile(V, cols, S, D), m_i, l_i, acc)
    _store_tile(O, rows, T, acc / l_i[:, None], D)
    tl.store(LSE + rows, m_i + tl.log(l_i), mask=rows < T)


@triton.jit
def _gqa(Q, K, V, O, T, S, scale, H, G, D: tl.constexpr, BLOCK_M: tl.constexpr,
         BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr = 0):
    head = tl.program_id(1)
    if MISTAKE == 1:
        kv = head % G
    elif MISTAKE == 2:
        kv = head // G
    elif MISTAKE == 3:
        kv = head
    else:
        kv = head // (H // G)
    Q += head * T * D
    O += head * T * D
    K += kv * S * D
    V += kv * S * D
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _tile(Q, rows, T, D)
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        s = tl.where(cols[None, :] < S, tl.dot(q, tl.trans(_tile(K, cols, S, D))) * scale,
                     float("-inf"))
        m_i, l_i, acc = _online_step(s, _tile(V, cols, S, D), m_i, l_i, acc)
    _store_tile(O, rows, T, acc / l_i[:, None], D)


@triton.jit
def _tail(Q, K, V, O, T, S, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr = 0):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = _tile(Q, rows, T, D)
    m_i, l_i, acc = _start(BLOCK_M, D)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        if MISTAKE == 1:
            k = tl.load(K + cols[:, None] * D + offs_d[None, :])
        else:
            k = _tile(K, cols, S, D)
        if MISTAKE == 2:
            v = tl.load(V + cols[:, None] * D + offs_d[None, :])
        else:
            v = _tile(V, cols, S, D)
        s = tl.dot(q, tl.trans(k)) * scale
        if MISTAKE != 3:
            s = tl.where((cols < S)[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc)
    if MISTAKE == 4:
        tl.store(O + rows[:, None] * D + offs_d[None, :], acc / l_i[:, None])
    else:
        _store_tile(O, rows, T, acc / l_i[:, None], D)


@triton.jit
def _backward(Q, K, V, DO, LSE, DELTA, DK, DV, T, S, scale, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr = 0):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k, v = _tile(K, cols, S, D), _tile(V, cols, S, D)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    for start_m in range(0, T, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q, do = _tile(Q, rows, T, D), _tile(DO, rows, T, D)
        lse = tl.load(LSE + rows, mask=rows < T, other=0.0)
        delta = tl.load(DELTA + rows, mask=rows < T, other=0.0)
        inside = (rows[:, None] < T) & (cols[None, :] < S)
        s = tl.where(inside, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        if MISTAKE == 1:  # a softmax of this key tile alone
            e = tl.exp(s - tl.max(s, 1)[:, None])
            p = e / tl.sum(e, 1)[:, None]
            p = tl.where(rows[:, None] < T, p, 0.0)
        elif MISTAKE == 2:
            p = tl.exp(s)
        else:
            p = tl.exp(s - lse[:, None])
        dv += tl.dot(tl.trans(p), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * dp if MISTAKE == 3 else p * (dp - delta[:, None])
        if MISTAKE == 4:
            dk += tl.dot(tl.trans(ds), q)
        else:
            dk += tl.dot(tl.trans(ds), q) * scale
    if MISTAKE == 5:
        tl.store(DK + cols[:, None] * D + tl.arange(0, D)[None, :], dk)
    else:
        _store_tile(DK, cols, S, dk, D)
    _store_tile(DV, cols, S, dv, D)


CORRECT = {
    "07.7": ("check_online_softmax_kernel", _flash),
    "07.8": ("check_causal_mask_tile", _causal),
    "07.9": ("check_gqa_head_map", _gqa),
    "07.10": ("check_tail_block_masks", _tail),
    "07.11": ("check_backward_from_lse", _backward),
}


class TestContract(CheckContract):
    MODULE, CORRECT = kernels, CORRECT


# ------------------------------------------------------------------ each mistake, named
MISTAKES = [
    ("07.7", 1, r"accumulator is not rescaled when the running max grows"),
    ("07.7", 2, r"l is not rescaled when the running max grows"),
    ("07.7", 3, r"rescaling factor is upside down"),
    ("07.7", 4, r"O is the unnormalised acc"),
    ("07.7", 5, r"LSE .*still all NaN.*log-sum-exp was not written"),
    ("07.7", 6, r"LSE is in base 2"),
    ("07.7", 7, r"LSE is log\(l_i\) alone"),
    ("07.7", 8, r"wrote past the end of O.*mask=rows\[:, None\] < T"),
    ("07.8", 1, r"the diagonal is excluded"),
    ("07.8", 2, r"aligned top-left"),
    ("07.8", 3, r"one key too wide"),
    ("07.8", 4, r"offsets inside the tile"),
    ("07.9", 1, r"read K/V heads \[0, 1, 0, 1, 0, 1\].*i % g interleaves"),
    ("07.9", 2, r"read K/V heads \[0, 0, 1, 1, 2, 2\].*only 2.*i // g divides"),
    ("07.9", 3, r"read K/V heads \[0, 1, 2, 3, 4, 5\].*copied to h heads"),
    ("07.10", 1, r"read past the end of K.*mask=cols\[:, None\] < S, other=0.0"),
    ("07.10", 2, r"read past the end of V.*0 × NaN"),
    ("07.10", 3, r"scores were not set to -inf"),
    ("07.10", 4, r"wrote past the end of O.*store of the last query block"),
    ("07.11", 1, r"DV .*softmax of each key tile alone"),
    ("07.11", 2, r"DV .*the weights are exp\(s\)"),
    ("07.11", 3, r"DK .*D was not subtracted"),
    ("07.11", 4, r"DK .*missing the scale"),
    ("07.11", 5, r"wrote past the end of DK"),
]


@pytest.mark.parametrize(("ex", "mistake", "named"), MISTAKES,
                         ids=[f"{e}-{m}" for e, m, _ in MISTAKES])
def test_each_classic_mistake_fails_and_is_named(ex, mistake, named, capsys):
    name, kernel = CORRECT[ex]
    with pytest.raises(CheckFailed, match=rf"^Exercise {ex}: (?s:.*){named}"):
        getattr(checks, name)(Mistake(kernel, mistake))
    assert capsys.readouterr().out == ""


def test_the_stub_inside_a_kernel_passes_through_as_not_attempted():
    """The generated exercise raises the stub inside the kernel: the interpreter wraps it in an
    InterpreterError, which the check unwraps so the checker reports "not attempted"."""

    @triton.jit
    def stub(Q, K, V, O, LSE, T, S, scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
        for _ in range(0, S, BLOCK_N):
            raise NotImplementedError("Exercise 07.7: the online-softmax step")

    with pytest.raises(NotImplementedError, match=r"^Exercise 07.7: the online-softmax step$"):
        checks.check_online_softmax_kernel(stub)


def test_importing_the_package_does_not_import_triton():
    import subprocess
    import sys

    code = "import sys, mha_course, mha_course.checks; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
