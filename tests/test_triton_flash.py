"""The Triton kernels (mha_course.kernels.triton_flash) against the package's NumPy references.

Run by Triton's interpreter on a machine without a GPU (the module sets ``TRITON_INTERPRET=1``
itself), so the shapes stay small. Skipped with one line without the ``kernels`` extra, unless
``MHA_COURSE_REQUIRE_TRITON=1`` (CI).
"""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import (
    attention_backward,
    causal_mask,
    scaled_dot_product_attention,
    tiled_attention,
)

ATOL = 2e-5  # float32: a few units in the last place of sums over <= 128 terms

# (B, h, g, T, S, d, causal, block_m, block_n): odd lengths, T != S both ways, GQA h=4 with
# g=2 and g=1, causal and not, blocks 16 and 32, d padded (24) and not
SHAPES = [
    (1, 2, 1, 5, 7, 16, True, 16, 16),
    (2, 4, 2, 37, 29, 16, False, 16, 32),
    (1, 4, 2, 45, 23, 32, True, 32, 16),  # T > S causal: the first 22 queries see no key
    (1, 4, 1, 19, 40, 16, True, 16, 16),
    (1, 2, 2, 33, 33, 24, True, 32, 32),
    (1, 4, 4, 50, 17, 16, False, 32, 16),
]


def _random_shapes(n, seed=35):
    """Unseen shapes, drawn once with a fixed seed: lengths 1..70, d in {16, 20, 32}, h/g from
    {(1, 1), (2, 1), (4, 2), (4, 1), (4, 4)}, causal or not, blocks 16 or 32."""
    rng = np.random.default_rng(seed)
    heads = [(1, 1), (2, 1), (4, 2), (4, 1), (4, 4)]
    shapes = []
    for _ in range(n):
        h, g = heads[rng.integers(len(heads))]
        T, S = (int(x) for x in rng.integers(1, 71, size=2))
        shapes.append((int(rng.integers(1, 3)), h, g, T, S, int(rng.choice([16, 20, 32])),
                       bool(rng.integers(2)), int(rng.choice([16, 32])),
                       int(rng.choice([16, 32]))))
    return shapes


SHAPES += _random_shapes(6)
IDS = [f"B{s[0]}h{s[1]}g{s[2]}T{s[3]}S{s[4]}d{s[5]}{'c' if s[6] else ''}m{s[7]}n{s[8]}"
       for s in SHAPES]


def random_qkv(torch, B, h, g, T, S, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, h, T, d, generator=gen), torch.randn(B, g, S, d, generator=gen),
            torch.randn(B, g, S, d, generator=gen))


def expand_heads(x, h):
    """(B, g, S, d) -> (B, h, S, d) as NumPy: each K/V head repeated for its group (reference
    only; the kernel never copies)."""
    return np.repeat(x.numpy(), h // x.shape[1], axis=1)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_forward_equals_tiled_attention_and_its_lse(triton_flash, torch, shape):
    B, h, g, T, S, d, causal, bm, bn = shape
    q, k, v = random_qkv(torch, B, h, g, T, S, d)
    o, lse = triton_flash.flash_forward(q, k, v, causal=causal, block_m=bm, block_n=bn)
    ref_o, ref_lse = tiled_attention(q.numpy(), expand_heads(k, h), expand_heads(v, h),
                                     causal=causal, block_size=16, return_lse=True)
    assert o.shape == (B, h, T, d) and lse.shape == (B, h, T)
    np.testing.assert_allclose(o.numpy(), ref_o, rtol=0, atol=ATOL)
    # -inf (a query with no allowed key) in the same places, the finite values equal
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=0, atol=ATOL)
    if causal and T > S:
        assert np.isneginf(lse.numpy()[..., : T - S]).all()
        assert (o.numpy()[..., : T - S, :] == 0).all()


def reference_backward(q, k, v, do, causal):
    """The package's backward (attention_backward on the weights of the package's attention),
    with dk and dv summed over each group's query heads."""
    B, h, T, d = q.shape
    g, S = k.shape[1], k.shape[2]
    mask = causal_mask(T, S) if causal else None
    kk, vv = expand_heads(k, h), expand_heads(v, h)
    _, weights = scaled_dot_product_attention(q.numpy(), kk, vv, mask=mask)
    dq, dk, dv = attention_backward(do.numpy(), q.numpy(), kk, vv, weights)
    return (dq, dk.reshape(B, g, h // g, S, d).sum(axis=2),
            dv.reshape(B, g, h // g, S, d).sum(axis=2))


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_backward_equals_the_packages_backward_pass(triton_flash, torch, shape):
    B, h, g, T, S, d, causal, bm, bn = shape
    q, k, v = random_qkv(torch, B, h, g, T, S, d, seed=1)
    do = torch.randn(B, h, T, d, generator=torch.Generator().manual_seed(2))
    o, lse = triton_flash.flash_forward(q, k, v, causal=causal, block_m=bm, block_n=bn)
    grads = triton_flash.flash_backward(q, k, v, o, lse, do, causal=causal, block_m=bm,
                                        block_n=bn)
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference_backward(q, k, v, do, causal),
                               strict=True):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=ATOL, err_msg=name)


# ------------------------------------------------------------------ memory traffic
# (B, h, g, T, S, d, causal, block_m, block_n): T a multiple of the blocks and not, causal with
# T = S, T < S and T > S, GQA
TRAFFIC = [
    (1, 1, 1, 32, 32, 16, False, 16, 16),
    (1, 1, 1, 64, 64, 16, False, 16, 16),
    (1, 1, 1, 64, 64, 16, False, 32, 32),
    (1, 2, 1, 37, 53, 16, False, 16, 32),
    (1, 1, 1, 64, 64, 16, True, 16, 16),
    (1, 4, 2, 45, 23, 32, True, 32, 16),
    (1, 2, 2, 19, 40, 24, True, 16, 32),
]


@pytest.mark.parametrize("shape", TRAFFIC, ids=[f"T{s[3]}S{s[4]}{'c' if s[6] else ''}m{s[7]}n{s[8]}"
                                                for s in TRAFFIC])
def test_counted_bytes_equal_the_closed_forms(triton_flash, torch, shape):
    B, h, g, T, S, d, causal, bm, bn = shape
    q, k, v = random_qkv(torch, B, h, g, T, S, d)
    sizes, blocks = (B, h, g, T, S, d), dict(causal=causal, block_m=bm, block_n=bn)
    with triton_flash.count_traffic() as fwd:
        o, lse = triton_flash.flash_forward(q, k, v, **blocks)
    assert fwd.total == triton_flash.flash_forward_bytes(*sizes, **blocks)
    # the writes alone: o and lse, once
    assert fwd.stored == 4 * B * h * T * (d + 1)
    with triton_flash.count_traffic() as std:
        triton_flash.standard_attention(q, k, v, **blocks)
    assert std.total == triton_flash.standard_attention_bytes(*sizes, **blocks)
    assert set(std.per_kernel) == {"std_scores_kernel", "std_softmax_kernel", "std_pv_kernel"}
    with triton_flash.count_traffic() as bwd:
        triton_flash.flash_backward(q, k, v, o, lse, torch.ones_like(o), **blocks)
    assert bwd.total == triton_flash.flash_backward_bytes(*sizes, **blocks)
    assert sum(sum(c) for c in bwd.per_kernel.values()) == bwd.total


def test_flash_moves_fewer_bytes_than_standard_attention_and_the_gap_grows_with_n(
        triton_flash, torch):
    """Theorem 2 on the kernels: standard attention's bytes grow as N² (the scores and weights,
    4 bytes × 4 passes), FlashAttention's as N²·d/block_m; at N = 32 and 64 the ratio is
    counted, beyond it the closed forms (equal to the counts above) carry it."""
    ratios = []
    for n in (32, 64):
        q, k, v = random_qkv(torch, 1, 1, 1, n, n, 16)
        with triton_flash.count_traffic() as fwd:
            triton_flash.flash_forward(q, k, v, block_m=32, block_n=32)
        with triton_flash.count_traffic() as std:
            triton_flash.standard_attention(q, k, v, block_m=32, block_n=32)
        ratios.append(std.total / fwd.total)
    assert 1 < ratios[0] < ratios[1]
    # a bigger block (more SRAM) moves fewer bytes; the standard count does not depend on it
    # beyond the re-reads of q, k, v
    f = triton_flash.flash_forward_bytes
    assert f(1, 1, 1, 4096, 4096, 64, block_m=128) < f(1, 1, 1, 4096, 4096, 64, block_m=64)
    assert f(1, 1, 1, 4096, 4096, 64, causal=True) < 0.6 * f(1, 1, 1, 4096, 4096, 64)


def test_masked_elements_move_no_bytes_and_the_interpreter_is_restored(triton_flash, torch):
    from triton.runtime import interpreter

    q, k, v = random_qkv(torch, 1, 1, 1, 1, 1, 16)  # one query, one key: 15/16 of a tile masked
    with triton_flash.count_traffic() as traffic:
        triton_flash.flash_forward(q, k, v)
    assert traffic.loaded == 4 * 3 * 16  # q, k, v: one row of 16 floats each
    assert traffic.stored == 4 * (16 + 1)
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    with triton_flash.count_traffic() as outside:
        pass
    triton_flash.flash_forward(q, k, v)  # after the block: not counted
    assert outside.total == 0 and traffic.total == 4 * (3 * 16 + 17)
    with triton_flash.count_traffic() as outer:
        with triton_flash.count_traffic() as inner:
            triton_flash.flash_forward(q, k, v)
        triton_flash.flash_forward(q, k, v)
    assert inner.total == traffic.total and outer.total == 2 * traffic.total
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)


def test_standard_attention_equals_tiled_attention(triton_flash, torch):
    q, k, v = random_qkv(torch, 1, 4, 2, 37, 29, 16)
    for causal in (False, True):
        o = triton_flash.standard_attention(q, k, v, causal=causal, block_m=16, block_n=32)
        ref = tiled_attention(q.numpy(), expand_heads(k, 4), expand_heads(v, 4), causal=causal)
        np.testing.assert_allclose(o.numpy(), ref, rtol=0, atol=ATOL)


# ------------------------------------------------------------------ bad input
def test_bad_shapes_raise_value_errors_naming_the_function_argument_and_shapes(
        triton_flash, torch):
    q, k, v = random_qkv(torch, 1, 4, 2, 8, 8, 16)
    f = triton_flash.flash_forward
    cases = [
        (lambda: f(q[0], k, v),
         r"flash_forward: q has shape \(4, 8, 16\); expected \(B, h, T, d\)"),
        (lambda: f(q, k[..., :8], v), r"flash_forward: k has shape \(1, 2, 8, 8\); expected "
                                      r"\(B, g, S, d\) with B=1, d=16 \(from q\)"),
        (lambda: f(q, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16)),
         r"flash_forward: k has shape \(1, 3, 8, 16\);.* g dividing h=4"),
        (lambda: f(q, k, v[:, :, :5]), r"flash_forward: v has shape \(1, 2, 5, 16\); expected "
                                       r"\(B, g, S, d\) = \(1, 2, 8, 16\) \(from k\)"),
        (lambda: f(q.double(), k, v), r"flash_forward: q has dtype torch.float64; expected "
                                      r"torch.float32"),
        (lambda: f(q.numpy(), k, v), r"flash_forward: q is a ndarray; expected a torch tensor"),
        (lambda: f(q, k, v, block_m=24), r"flash_forward: block_m is 24; expected a power of two"),
        (lambda: f(q, k, v, block_n=8), r"flash_forward: block_n is 8; expected a power of two"),
        (lambda: f(q, k, v, num_warps=0), r"flash_forward: num_warps is 0; expected an integer"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    o, lse = f(q, k, v)
    with pytest.raises(ValueError, match=r"flash_backward: lse has shape \(1, 4, 7\); expected "
                                         r"\(B, h, T\) = \(1, 4, 8\) \(from q\)"):
        triton_flash.flash_backward(q, k, v, o, lse[..., :7], o)
    with pytest.raises(ValueError, match=r"flash_backward: do has shape \(1, 4, 8, 8\)"):
        triton_flash.flash_backward(q, k, v, o, lse, o[..., :8])


# ------------------------------------------------------------------ the optional dependency
def test_without_triton_the_tests_skip_with_one_line_unless_ci_requires_them(tmp_path):
    """A `triton` and a `torch` that fail to import: the fixture skips with the install hint,
    or fails when MHA_COURSE_REQUIRE_TRITON=1."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text((root / "tests" / "conftest.py").read_text())
    (tmp_path / "test_needs_triton.py").write_text(
        "def test_uses_kernels(triton_flash):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    fake = tmp_path / "fake_site"
    fake.mkdir()
    for name in ("triton", "torch"):  # neither imports (a fake torch also keeps it quick)
        (fake / f"{name}.py").write_text(f"raise ImportError('{name} is not installed (stub)')\n")
    env = {k: v for k, v in os.environ.items() if k != "MHA_COURSE_REQUIRE_TRITON"}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(root)])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               str(tmp_path)]
    skipped = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout and "pip install -e '.[kernels]'" in skipped.stdout
    failed = subprocess.run(command, cwd=tmp_path, env={**env, "MHA_COURSE_REQUIRE_TRITON": "1"},
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "MHA_COURSE_REQUIRE_TRITON=1" in failed.stdout
    assert "skipped" not in failed.stdout


def test_the_traffic_formulas_work_without_triton_or_torch(tmp_path):
    """mha_course.kernels.traffic imports neither: with a triton and a torch that fail to import
    the closed forms still compute, and count_traffic with the interpreter off refuses before it
    imports triton."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for name in ("triton", "torch"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('{name} is not installed')\n")
    code = ("import sys\nfrom mha_course.kernels import traffic\n"
            "print(traffic.flash_forward_bytes(1, 1, 1, 20, 20, 16),\n"
            "      traffic.standard_attention_bytes(1, 1, 1, 20, 20, 16),\n"
            "      traffic.flash_backward_bytes(1, 2, 1, 20, 20, 16, causal=True))\n"
            "try:\n    traffic.count_traffic().__enter__()\n"
            "except RuntimeError as exc:\n    print(str(exc).split(':')[0])\n"
            "print(sorted(m for m in ('triton', 'torch') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root)])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    from mha_course.kernels import traffic

    assert result.stdout.splitlines() == [
        f"{traffic.flash_forward_bytes(1, 1, 1, 20, 20, 16)} "
        f"{traffic.standard_attention_bytes(1, 1, 1, 20, 20, 16)} "
        f"{traffic.flash_backward_bytes(1, 2, 1, 20, 20, 16, causal=True)}",
        "count_traffic", "[]"]
    assert traffic.flash_forward_bytes(1, 1, 1, 20, 20, 16) == 7760


# ------------------------------------------------------------------ the GPU benchmark
def test_the_gpu_benchmark_says_it_needs_a_gpu_and_exits_0_on_a_cpu():
    import subprocess
    import sys
    from pathlib import Path

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: run benchmarks/triton_flash.py itself")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "triton_flash.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmarks/triton_flash.py needs a CUDA GPU")
    assert "nothing timed" in lines[0] or "install" in lines[0]


# ------------------------------------------------------------------ the same source on a GPU
@pytest.mark.slow
def test_the_kernels_compile_for_a_gpu_without_one(triton_flash, tmp_path, monkeypatch):
    """Triton's compiler, not its interpreter, turns the forward kernel into PTX for an H100
    (sm_90): the source the interpreter runs is one a GPU can run. (The backward's kernels
    compile too, ``compile_for_gpu("backward_dkdv")``; one kernel keeps this test short.)"""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a throwaway cache
    for name in ("forward",):
        built = triton_flash.compile_for_gpu(name, causal=True, block_m=64, block_n=64, d=64,
                                             num_stages=2)
        assert (built.kernel, built.arch, built.num_warps, built.num_stages) == (name, 90, 4, 2)
        assert ".target sm_90" in built.ptx and "ex2.approx.f32" in built.ptx
        assert built.shared >= 2 * 64 * 64 * 4  # at least a K and a V block in shared memory
        assert "cp.async" in built.ptx or "cp.async.bulk" in built.ptx


def test_compile_for_gpu_refuses_an_unknown_kernel(triton_flash):
    with pytest.raises(ValueError, match=r"compile_for_gpu: kernel is 'fwd'; expected one of"):
        triton_flash.compile_for_gpu("fwd")


def test_triton_imported_too_early_without_a_gpu_is_said_plainly(triton_flash):
    import os
    import subprocess
    import sys
    from pathlib import Path

    if not triton_flash.INTERPRETED:
        pytest.skip("the kernels run compiled here")
    code = ("import triton, torch\nfrom mha_course.kernels import triton_flash as tf\n"
            "q = torch.zeros(1, 1, 4, 16)\ntf.flash_forward(q, q, q)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode != 0
    assert "RuntimeError: triton was imported before mha_course.kernels.triton_flash" in (
        result.stderr)
