"""Benchmark lesson 09's GPT: one training step against the same model in PyTorch, and generation
tokens per second with the cache, without it, and in PyTorch.

Run from the repository root (one thread unless ``--threads N``)::

    .venv/bin/python benchmarks/gpt.py             # the shipped model's config; about a minute
    .venv/bin/python benchmarks/gpt.py --quick     # a smaller model: a smoke run
    .venv/bin/python benchmarks/gpt.py --cpu-time  # busy machine: CPU time, not wall time

It prints, from one run: the versions, the BLAS kernel and thread counts (``harness.py``); for
the shipped model's configuration (``mha_course.models.shakespeare.RECIPE``: 2 blocks,
d_model 96, 4 query heads over 2 K/V heads, SwiGLU, RoPE) on a batch of 16 windows of 256
characters in float32: the time of one training step (forward, loss, backward) of the readable
path (``GPT.loss_and_grads``), of the fast path (``gpt_fast.fast_loss_and_grads``, the one the
recipe trains with) and of the same model written in PyTorch (``F.scaled_dot_product_attention``
with ``is_causal`` and ``enable_gqa``, ``F.rms_norm``, ``F.silu``, autograd), with the ratios and
the goal (fast path <= 2.0x PyTorch); then generation of 128 tokens after a 64-token prompt,
greedy: the package with its KV caches (``GPT.generate``), without them (the whole sequence
again at every step), and PyTorch without a cache, in tokens per second. Before timing, the
PyTorch model's loss and gradients are checked equal to the package's (the same model), and the
three generations are checked to give the same tokens.
"""

from __future__ import annotations

import sys

import harness as bench  # benchmarks/harness.py: environment, timing and re-exec helpers

if __name__ == "__main__":
    bench.reexec_without_openblas_overrides(sys.argv[1:])

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from mha_course.models.gpt import GPT, GPTConfig  # noqa: E402
from mha_course.models.gpt_fast import fast_loss_and_grads  # noqa: E402
from mha_course.models.shakespeare import RECIPE  # noqa: E402

torch = bench.torch
GOAL = 2.0


def torch_model(model):
    """The same model in PyTorch, float32, sharing the package model's parameter values."""
    F = torch.nn.functional
    c = model.config
    P = {n: torch.tensor(p, requires_grad=True) for n, p in model.parameters().items()}

    def rope_tables(T):
        j = torch.arange(c.d_k // 2, dtype=torch.float64)
        theta = torch.arange(T, dtype=torch.float64)[:, None] * c.rope_base ** (-2 * j / c.d_k)
        return torch.cos(theta).float(), torch.sin(theta).float()

    def logits_of(tokens):
        B, T = tokens.shape
        cos, sin = rope_tables(T)

        def rope(x):  # half layout, as the package's rope="half"
            a, b = x[..., : c.d_k // 2], x[..., c.d_k // 2 :]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

        x = P["W_E"][tokens]
        for i in range(c.n_layers):
            a = F.rms_norm(x, (c.d_model,), P[f"L{i}.attn_norm"], c.eps)
            q = (a @ P[f"L{i}.W_q"]).view(B, T, c.h, c.d_k).transpose(1, 2)
            k = (a @ P[f"L{i}.W_k"]).view(B, T, c.n_kv_heads, c.d_k).transpose(1, 2)
            v = (a @ P[f"L{i}.W_v"]).view(B, T, c.n_kv_heads, c.d_k).transpose(1, 2)
            heads = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True,
                                                   enable_gqa=True)
            x = x + heads.transpose(1, 2).reshape(B, T, c.d_model) @ P[f"L{i}.W_o"]
            m = F.rms_norm(x, (c.d_model,), P[f"L{i}.mlp_norm"], c.eps)
            x = x + (F.silu(m @ P[f"L{i}.W_gate"]) * (m @ P[f"L{i}.W_up"])) @ P[f"L{i}.W_down"]
        return F.rms_norm(x, (c.d_model,), P["norm_f"], c.eps) @ P["W_U"]

    def step(tokens, targets):
        for p in P.values():
            p.grad = None
        loss = F.cross_entropy(logits_of(tokens).reshape(-1, c.vocab_size), targets.reshape(-1))
        loss.backward()
        return loss.item()

    @torch.no_grad()
    def generate(prompt, n_new):
        seq = prompt
        for _ in range(n_new):
            seq = torch.cat([seq, logits_of(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return seq

    return P, step, generate


def main() -> None:
    parser = bench.common_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller model and batch")
    args = parser.parse_args()
    bench.apply_common_options(parser, args)
    if args.quick:
        config, B, T, prompt_len, n_new = GPTConfig(65, 32, 2, 4, 2, context_length=64), 4, 64, \
            16, 16
    else:
        config, B, T, prompt_len, n_new = GPTConfig(**RECIPE["config"]), 16, 256, 64, 128
    for line in bench.environment_lines(args.threads, args.keep_env):
        print(line)
    print(f"clock: {bench.CLOCK['name']}")
    model = GPT(config, rng=0, dtype=np.float32)
    print(f"model: {config} ({model.n_params:,} parameters), float32; batch {B} x {T}")
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, size=(B, T))
    y = rng.integers(0, config.vocab_size, size=(B, T))
    prompt = rng.integers(0, config.vocab_size, size=(1, prompt_len))
    with threadpool_limits(limits=args.threads, user_api="blas"):
        loss, grads = fast_loss_and_grads(model, x, y)
        funcs = {"readable (GPT.loss_and_grads)": lambda: model.loss_and_grads(x, y),
                 "fast (fast_loss_and_grads)": lambda: fast_loss_and_grads(model, x, y)}
        if torch is not None:
            P, t_step, t_generate = torch_model(model)
            xt, yt = torch.tensor(x), torch.tensor(y)
            t_loss = t_step(xt, yt)
            assert abs(t_loss - loss) < 1e-4, (t_loss, loss)
            worst = max(float(np.abs(grads[n] - P[n].grad.numpy()).max() / np.abs(grads[n]).max())
                        for n in grads)
            assert worst < 1e-3, worst
            print(f"the PyTorch model is the same model: loss {t_loss:.5f} vs {loss:.5f}, "
                  f"largest gradient difference {worst:.1e} of the largest entry")
            funcs["PyTorch (autograd)"] = lambda: t_step(xt, yt)
        times = bench.best_times(funcs)
        print("\none training step (forward + loss + backward):")
        torch_time = times.get("PyTorch (autograd)")
        for name, t in times.items():
            ratio = "" if torch_time is None else f"   {t / torch_time:5.2f}x PyTorch"
            print(f"  {name:32s} {t * 1e3:8.1f} ms{ratio}")
        if torch_time is not None:
            ratio = times["fast (fast_loss_and_grads)"] / torch_time
            print(f"goal: fast path <= {GOAL}x PyTorch: {'met' if ratio <= GOAL else 'NOT met'} "
                  f"({ratio:.2f}x)")

        cached = model.generate(prompt, n_new, temperature=0)
        uncached = model.generate(prompt, n_new, temperature=0, use_cache=False)
        assert (cached == uncached).all()
        gen = {"package, KV cache": lambda: model.generate(prompt, n_new, temperature=0),
               "package, no cache": lambda: model.generate(prompt, n_new, temperature=0,
                                                           use_cache=False)}
        if torch is not None:
            pt = torch.tensor(prompt)
            same = (t_generate(pt, n_new).numpy() == cached).mean()
            print(f"\nPyTorch's greedy tokens equal the package's: {same:.0%} of positions "
                  "(float32 round-off can flip a near-tie)")
            gen["PyTorch, no cache"] = lambda: t_generate(pt, n_new)
        times = bench.best_times(gen, min_runs=2, min_seconds=0.0)
        print(f"generation: {n_new} tokens after a {prompt_len}-token prompt, greedy, batch 1:")
        for name, t in times.items():
            print(f"  {name:20s} {n_new / t:8.0f} tokens/s")
        speedup = times["package, no cache"] / times["package, KV cache"]
        print(f"the cache is {speedup:.1f}x faster than recomputing the sequence at every step")


if __name__ == "__main__":
    main()
