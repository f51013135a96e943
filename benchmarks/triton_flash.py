"""Benchmark the Triton FlashAttention forward on a GPU: its time, torch's SDPA and the floor.

The kernel is ``mha_course.kernels.triton_flash.flash_forward`` (lesson 07's deep dive,
``notebooks/deep_dives/07c_triton_kernels.ipynb``). It needs a CUDA GPU and the ``kernels``
extra; on a machine without a GPU it prints one line saying so and exits 0 (the kernels'
correctness and their byte counts are tested in Triton's interpreter,
``tests/test_triton_flash.py``).

Run from the repository root::

    .venv/bin/python benchmarks/triton_flash.py            # N = 1024, 2048, 4096, 8192
    .venv/bin/python benchmarks/triton_flash.py --quick    # N = 1024 and 2048
    .venv/bin/python benchmarks/triton_flash.py --causal --heads 32 --kv-heads 8

Shapes: q (B, h, N, d), k and v (B, g, N, d), float32 (the kernel's dtype; its matrix products
are exact float32, ``input_precision="ieee"``, not TF32). For each N it prints:

- the kernel's forward time (``triton.testing.do_bench``: the median over repeats, after a
  warm-up that compiles it) for the block sizes given (``--blocks``, default 64; ``--warps``
  and ``--stages`` set ``num_warps`` and ``num_stages``); a block that does not fit the
  device's shared memory is said so and skipped;
- the ratio to ``torch.nn.functional.scaled_dot_product_attention`` restricted to its fused
  kernels (memory-efficient or flash: no (N, N) matrix in memory), with ``enable_gqa`` (or, if
  no fused kernel takes it, K and V expanded to h heads before timing, said in the output);
- the ratio to the *bandwidth floor*: the bytes the kernel must move at least (q, k, v read
  once, o and lse written once) divided by the device's memory bandwidth, from a table of
  devices by name or, for a device not in it, measured by a large device-to-device copy; and
  the floor of the bytes the kernel's blocks actually load (K and V once per query block,
  ``flash_forward_bytes``; a GPU's L2 cache serves some of those re-reads, so the first floor
  is the one to beat);
- the arithmetic intensity (FLOPs per byte moved) that places it on the device's roofline.

Timings come from one run; ratios are meaningful, single times indicative.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

#: Peak memory bandwidth (bytes/s) of common devices, by a substring of torch's device name
#: (vendors' data sheets). The first match wins, so the more specific names come first.
BANDWIDTH = [
    ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
    ("GH200", 4.0e12), ("B200", 8.0e12), ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12), ("A10G", 6.0e11), ("A10", 6.0e11), ("L40S", 8.64e11), ("L40", 8.64e11),
    ("L4", 3.0e11), ("T4", 3.2e11), ("V100", 9.0e11), ("RTX 4090", 1.008e12),
    ("RTX 3090", 9.36e11), ("A6000", 7.68e11),
]

NEEDS_GPU = "benchmarks/triton_flash.py needs a CUDA GPU"


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="N = 1024 and 2048 only")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--blocks", type=int, nargs="+", default=[64],
                        help="block_m = block_n values to time")
    parser.add_argument("--warps", type=int, default=None, help="num_warps (Triton's default)")
    parser.add_argument("--stages", type=int, default=None,
                        help="num_stages (Triton's default)")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="memory bandwidth in GB/s (default: the table, else measured)")
    return parser.parse_args(argv)


def gpu_or_reason() -> str | None:
    """None when a CUDA GPU and the kernels extra are here; otherwise why not, in a few words."""
    try:
        import torch
    except ImportError:
        return "and PyTorch (pip install -e '.[kernels]'); torch is not installed"
    if not torch.cuda.is_available():
        return "(torch.cuda.is_available() is False here); nothing timed"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "and Triton (pip install -e '.[kernels]'); triton is not installed"
    return None


def device_bandwidth(torch, given_gbs):
    """(bytes per second, where it came from)."""
    if given_gbs:
        return given_gbs * 1e9, "given"
    name = torch.cuda.get_device_name()
    for key, bw in BANDWIDTH:
        if key in name:
            return bw, f"{name}, data sheet"
    import triton.testing

    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * x.numel() / (ms * 1e-3), f"{name}, measured by a 256 MiB copy"


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    reason = gpu_or_reason()
    if reason is not None:
        print(f"{NEEDS_GPU} {reason}.")
        return 0
    # Only now import the kernels: on a machine without CUDA the module would pick the
    # interpreter, so the check above comes first.
    import torch
    import triton
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mha_course.kernels import triton_flash as tf

    B, h, d = args.batch, args.heads, args.d
    g = args.kv_heads or h
    bandwidth, source = device_bandwidth(torch, args.bandwidth)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {source}: "
          f"{bandwidth / 1e9:.0f} GB/s")
    print(f"q (B={B}, h={h}, N, d={d}), k and v (B, g={g}, N, d), float32, "
          f"{'causal' if args.causal else 'no mask'}; times are medians of do_bench")
    sizes = (1024, 2048) if args.quick else (1024, 2048, 4096, 8192)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in sizes:
        q = torch.randn(B, h, n, d, device="cuda", generator=gen)
        k = torch.randn(B, g, n, d, device="cuda", generator=gen)
        v = torch.randn(B, g, n, d, device="cuda", generator=gen)

        def sdpa(q, k, v, gqa):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=args.causal, enable_gqa=gqa)

        fused = functools.partial(sdpa, q, k, v, g != h)
        try:
            ref = fused()
        except RuntimeError:  # no fused kernel takes enable_gqa here: expand K/V beforehand
            fused = functools.partial(sdpa, q, k.repeat_interleave(h // g, 1),
                                      v.repeat_interleave(h // g, 1), False)
            ref = fused()
            print(f"N={n}: SDPA's fused kernels refuse enable_gqa; K and V expanded for it")
        t_sdpa = triton.testing.do_bench(fused, return_mode="median") * 1e-3
        compulsory = 4 * (2 * B * h * n * d + B * h * n + 2 * B * g * n * d)
        flops = 4 * B * h * n * n * d * (0.5 if args.causal else 1.0)
        for block in args.blocks:
            run = functools.partial(tf.flash_forward, q, k, v, causal=args.causal,
                                    block_m=block, block_n=block, num_warps=args.warps,
                                    num_stages=args.stages)
            try:
                err = (run()[0] - ref).abs().max().item()
            except triton.runtime.errors.OutOfResources as exc:  # e.g. shared memory
                print(f"N={n:5d} block {block:3d}: does not fit this GPU ({exc})")
                continue
            t = triton.testing.do_bench(run, return_mode="median") * 1e-3
            blocks_bytes = tf.flash_forward_bytes(B, h, g, n, n, d, causal=args.causal,
                                                  block_m=block, block_n=block)
            print(f"N={n:5d} block {block:3d}: {t * 1e3:8.3f} ms, {t / t_sdpa:5.2f}x SDPA fused "
                  f"({t_sdpa * 1e3:.3f} ms), {t / (compulsory / bandwidth):6.1f}x the bandwidth "
                  f"floor ({compulsory / bandwidth * 1e6:.1f} µs for {compulsory / 1e6:.1f} MB), "
                  f"{t / (blocks_bytes / bandwidth):5.1f}x its blocks' floor, intensity "
                  f"{flops / compulsory:.0f} FLOP/B (compulsory) "
                  f"{flops / blocks_bytes:.0f} (blocks), max |o - SDPA| {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
