"""Triton's own compiler on the FlashAttention kernels, for an NVIDIA GPU, without one: their
PTX, Triton's GPU IR and what a launch needs.

Taught in ``notebooks/deep_dives/07c_triton_kernels.ipynb`` (lesson 07's deep dive, section 6:
the same source the interpreter runs is one a GPU can run). The kernels are those of
:mod:`mha_course.kernels.triton_flash`, which re-exports :func:`compile_for_gpu` and
:class:`GpuBuild`. Needs the ``kernels`` extra (triton, torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from .._validate import fail
from .triton_common import block_d, check_block, require_triton

__all__ = ["KERNELS", "GpuBuild", "compile_for_gpu"]

KERNELS = {  # name -> (the kernel in triton_flash, its pointer arguments)
    "forward": ("_flash_fwd_kernel", {"Q", "K", "V", "O", "LSE"}),
    "backward_dkdv": ("_bwd_dkdv_kernel", {"Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV"}),
    "backward_dq": ("_bwd_dq_kernel", {"Q", "K", "V", "DO", "LSE", "DELTA", "DQ"}),
}


@dataclass
class GpuBuild:
    """What :func:`compile_for_gpu` returns: the PTX and Triton's GPU IR of one kernel, and
    what its launch needs (bytes of shared memory per program, warps, pipelining stages)."""

    kernel: str
    arch: int
    ptx: str
    ttgir: str
    shared: int
    num_warps: int
    num_stages: int


def compile_for_gpu(kernel="forward", *, causal=False, block_m=64, block_n=64, d=64,
                    num_warps=4, num_stages=3, arch=90):
    """Compile one of the kernels for an NVIDIA GPU, without one: Triton's own compiler.

    The source is the one the interpreter runs; the compiler turns it into Triton's GPU IR
    (``ttgir``: the layouts of each block across the warps) and PTX, the GPU's assembly, which
    shows what it becomes (``cp.async``: the loads ``num_stages`` pipelines; ``ex2.approx``:
    the exponentials). The compilation runs in a fresh Python (a process that runs the
    interpreter cannot also compile), in seconds to a minute per kernel.

    Parameters
    ----------
    kernel : {"forward", "backward_dkdv", "backward_dq"}
    causal, block_m, block_n, d
        As :func:`~mha_course.kernels.triton_flash.flash_forward` (``d`` is padded to a power
        of two >= 16).
    num_warps, num_stages, arch : int
        Warps per program, software-pipelining stages, the target's compute capability times
        ten (80 an A100, 90 an H100).

    Returns
    -------
    GpuBuild
    """
    func = "compile_for_gpu"
    require_triton()
    if kernel not in KERNELS:
        raise fail(func, f"kernel is {kernel!r}; expected one of {sorted(KERNELS)}")
    block_m = check_block(func, "block_m", block_m)
    block_n = check_block(func, "block_n", block_n)
    for name, value in (("d", d), ("num_warps", num_warps), ("num_stages", num_stages),
                        ("arch", arch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(func, f"{name} is {value!r}; expected an integer >= 1")
    request = dict(kernel=kernel, causal=bool(causal), block_m=block_m, block_n=block_n,
                   block_d=block_d(d), num_warps=num_warps, num_stages=num_stages, arch=arch)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                         if p)}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    result = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom mha_course.kernels import triton_compile, "
         "triton_flash\ntriton_compile._compile_main(triton_flash, sys.argv[1])",
         json.dumps(request)],
        capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{func}: Triton's compiler failed:\n{result.stderr[-4000:]}")
    return GpuBuild(**json.loads(result.stdout.strip().splitlines()[-1]))


def _compile_main(kernels, request: str) -> None:
    """:func:`compile_for_gpu`'s other half, in the fresh Python: compile the kernel of module
    ``kernels`` (:mod:`~mha_course.kernels.triton_flash`) the request names, print JSON."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    r = json.loads(request)
    name, pointers = KERNELS[r["kernel"]]
    fn = getattr(kernels, name)
    constexprs = dict(CAUSAL=r["causal"], BLOCK_M=r["block_m"], BLOCK_N=r["block_n"],
                      BLOCK_D=r["block_d"])
    signature = {a: "constexpr" if a in constexprs else "*fp32" if a in pointers
                 else "fp32" if a == "sm_scale" else "i32" for a in fn.arg_names}
    source = ASTSource(fn, signature,
                       constexprs={(fn.arg_names.index(a),): v for a, v in constexprs.items()})
    built = triton.compile(source, target=GPUTarget("cuda", r["arch"], 32),
                           options={"num_warps": r["num_warps"], "num_stages": r["num_stages"]})
    print(json.dumps(dict(kernel=r["kernel"], arch=r["arch"], ptx=built.asm["ptx"],
                          ttgir=built.asm["ttgir"], shared=built.metadata.shared,
                          num_warps=built.metadata.num_warps,
                          num_stages=built.metadata.num_stages)))
