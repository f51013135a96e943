"""Serving many requests: static batching, continuous batching and chunked prefill.

Taught in ``notebooks/10_serving.ipynb`` (§2). :func:`serve` runs a real decoder over a
:class:`~mha_course.serving.paged.PagedStore` for a list of :class:`Request` s, pass after
pass, and keeps a simulated clock: each pass takes the time a :class:`CostModel` gives it (its
constants are measured on the machine, :func:`fit_cost_model`), so latencies are reproducible
while the tokens are the model's own. Policies, as the papers name them:

- ``"static"``: up to ``max_batch`` waiting requests form a batch, prefilled together and
  decoded until the *last* of them finishes; finished ones keep their slot (a padded batch) and
  nobody joins until the batch is done;
- ``"continuous"``: iteration-level scheduling (Orca, Yu et al., OSDI 2022): after every pass
  finished requests leave and waiting ones join, their whole prompt prefilled in the same pass
  as the others' decode tokens;
- ``"chunked"``: chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024): a pass holds at
  most ``token_budget`` tokens, decode tokens first, the rest filled with chunks of prompts, so
  a long prompt no longer stalls the running requests for one long pass.

Every request samples with its own generator (``seed``), one uniform number per token, so its
output is token for token the one it gets alone
(:func:`~mha_course.serving.decoder.generate_alone`).
A request joins only when the pool has blocks for its prompt and all its new tokens (no
preemption). With a :class:`~mha_course.serving.prefix_cache.PrefixCache`, a request starts on
the cached blocks of its longest cached prefix and prefills only the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .._validate import fail, validate_positive_int
from .decoder import sample_token
from .paged import PagedStore

POLICIES = ("static", "continuous", "chunked")


@dataclass
class Request:
    """One request: its prompt (token ids), how many tokens to generate, when it arrives."""

    rid: int
    prompt: np.ndarray
    max_new_tokens: int
    arrival: float = 0.0
    temperature: float = 0.0
    seed: int | None = None


@dataclass
class CostModel:
    """Seconds of one pass: ``fixed + per_sequence·seqs + per_token·tokens + per_pair·pairs``.

    ``fixed`` is paid once per pass whatever its size (the weights read, the framework's
    overhead), ``per_sequence`` by each sequence in it (its own attention call), ``per_token``
    by every token (its projections and MLP), ``per_pair`` by every query-key pair attention
    computes.
    """

    fixed: float
    per_sequence: float
    per_token: float
    per_pair: float

    def pass_time(self, n_sequences: int, n_tokens: int, n_pairs: int) -> float:
        return (self.fixed + self.per_sequence * n_sequences + self.per_token * n_tokens
                + self.per_pair * n_pairs)


def pairs_of(start: int, T: int) -> int:
    """Query-key pairs of a chunk of ``T`` new tokens over ``start`` cached ones (causal)."""
    return T * start + T * (T + 1) // 2


def fit_cost_model(samples) -> CostModel:
    """Least squares through measured passes: ``(sequences, tokens, pairs, seconds)`` each.

    Coefficients are clipped at 0 (a pass never gets cheaper with more work).

    Examples
    --------
    >>> truth = CostModel(1e-3, 3e-4, 2e-5, 1e-8)
    >>> shapes = [(1, 1, 10), (8, 8, 80), (2, 64, 5000), (16, 16, 400000), (1, 128, 9000)]
    >>> fit = fit_cost_model([(b, n, p, truth.pass_time(b, n, p)) for b, n, p in shapes])
    >>> fitted = (fit.fixed, fit.per_sequence, fit.per_token, fit.per_pair)
    >>> [round(v / w, 6) for v, w in zip(fitted, (1e-3, 3e-4, 2e-5, 1e-8))]
    [1.0, 1.0, 1.0, 1.0]
    """
    A = np.array([[1.0, b, n, p] for b, n, p, _ in samples])
    t = np.array([s[-1] for s in samples], dtype=float)
    if len(A) < 4:
        raise fail("fit_cost_model", f"got {len(A)} samples; expected at least 4")
    coef = np.linalg.lstsq(A, t, rcond=None)[0]
    return CostModel(*(max(float(c), 0.0) for c in coef))


@dataclass
class RequestResult:
    """What one request got: its tokens and when they came (seconds on the simulated clock)."""

    rid: int
    tokens: list
    arrival: float
    token_times: list
    prefix_hit_tokens: int = 0

    @property
    def ttft(self) -> float:
        """Time to first token: from arrival to the first generated token."""
        return self.token_times[0] - self.arrival

    @property
    def tpot(self) -> float:
        """Time per output token after the first (0 for a single token)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else 0.0

    @property
    def gaps(self) -> np.ndarray:
        """The times between consecutive tokens."""
        return np.diff(self.token_times)


@dataclass
class ServeResult:
    """The requests' results and a log of every pass."""

    policy: str
    requests: dict
    passes: list = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(r.token_times[-1] for r in self.requests.values())

    def summary(self) -> dict:
        """Throughput (output tokens per second), mean TTFT, mean TPOT, p99 inter-token gap."""
        results = list(self.requests.values())
        tokens = sum(len(r.tokens) for r in results)
        gaps = np.concatenate([r.gaps for r in results] + [np.zeros(0)])
        return {"throughput": tokens / self.makespan,
                "ttft_mean": float(np.mean([r.ttft for r in results])),
                "ttft_p90": float(np.percentile([r.ttft for r in results], 90)),
                "tpot_mean": float(np.mean([r.tpot for r in results])),
                "gap_p99": float(np.percentile(gaps, 99)) if gaps.size else 0.0,
                "passes": len(self.passes), "output_tokens": tokens}


class _Running:
    """A request being served: its sequence in the store, its progress, its generator."""

    def __init__(self, request: Request, seq, hit_tokens: int, blocks_needed: int):
        self.request, self.seq = request, seq
        self.prompt = np.asarray(request.prompt)
        self.done = hit_tokens  # prompt tokens whose keys and values are in the cache
        self.hit_tokens = hit_tokens
        self.out: list[int] = []
        self.times: list[float] = []
        self.rng = np.random.default_rng(request.seed)
        self.blocks_needed = blocks_needed

    @property
    def prefilling(self) -> bool:
        return self.done < len(self.prompt)

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.request.max_new_tokens

    def next_chunk(self, limit=None) -> np.ndarray:
        if self.prefilling:
            end = len(self.prompt) if limit is None else min(len(self.prompt), self.done + limit)
            return self.prompt[self.done:end]
        return np.array([self.out[-1]])

    def outstanding_blocks(self, store: PagedStore) -> int:
        """Blocks it may still take from the free list."""
        private = len(self.seq.block_table) - self.hit_tokens // store.block_size
        return max(0, self.blocks_needed - private)


def serve(decoder, requests, policy: str = "continuous", *, cost: CostModel, max_batch: int = 8,
          token_budget: int = 64, n_blocks: int = 256, block_size: int = 16,
          prefix_cache=None) -> ServeResult:
    """Serve ``requests`` with ``decoder`` under ``policy``; see the module docstring.

    Parameters
    ----------
    decoder : Decoder
    requests : list of Request
    policy : {"static", "continuous", "chunked"}
    cost : CostModel
        The time of each pass on the simulated clock.
    max_batch : int
        Most requests served at once.
    token_budget : int
        Most tokens in a pass (``"chunked"`` only); at least ``max_batch``.
    n_blocks, block_size : int
        The paged KV cache (every layer).
    prefix_cache : PrefixCache, optional
        Built over the same store parameters; reused and filled as requests come.

    Returns
    -------
    ServeResult

    Raises
    ------
    ValueError
        On an unknown policy, a budget below ``max_batch``, or a request that cannot fit in
        the pool even alone.
    """
    func = "serve"
    if policy not in POLICIES:
        raise fail(func, f"policy={policy!r}; expected one of {POLICIES}")
    max_batch = validate_positive_int(func, "max_batch", max_batch)
    token_budget = validate_positive_int(func, "token_budget", token_budget)
    if policy == "chunked" and token_budget < max_batch:
        raise fail(func, f"token_budget={token_budget} must be at least max_batch={max_batch}: "
                         "every running request's decode token goes into each pass")
    store = prefix_cache.store if prefix_cache is not None else PagedStore(
        decoder, n_blocks, block_size)
    waiting = deque(sorted(requests, key=lambda r: (r.arrival, r.rid)))
    for r in waiting:
        if store.blocks_for(len(r.prompt) + r.max_new_tokens) > store.n_blocks:
            raise fail(func, f"request {r.rid} needs {len(r.prompt) + r.max_new_tokens} "
                             f"positions, more than the pool's {store.n_blocks} blocks of "
                             f"{store.block_size}")
    running: list[_Running] = []
    results: dict = {}
    passes: list = []
    clock = 0.0

    def admit():
        while waiting and waiting[0].arrival <= clock and len(running) < max_batch:
            r = waiting[0]
            blocks = prefix_cache.lookup(r.prompt) if prefix_cache is not None else []
            need = store.blocks_for(len(r.prompt) + r.max_new_tokens) - len(blocks)
            outstanding = sum(s.outstanding_blocks(store) for s in running)
            while (store.free_blocks - outstanding < need and prefix_cache is not None
                   and prefix_cache.evict_one(keep=blocks)):
                pass
            if store.free_blocks - outstanding < need:
                return
            waiting.popleft()
            seq = store.new_sequence(blocks)
            running.append(_Running(r, seq, len(blocks) * store.block_size, need))

    while waiting or running:
        if policy == "static":
            if not running:
                admit()
        else:
            admit()
        if not running:  # idle until the next arrival
            clock = max(clock, waiting[0].arrival)
            continue
        work, padding = [], 0
        if policy == "chunked":
            budget = token_budget
            for s in running:
                if not s.prefilling:
                    work.append((s, s.next_chunk()))
                    budget -= 1
            for s in running:
                if s.prefilling and budget > 0:
                    chunk = s.next_chunk(budget)
                    work.append((s, chunk))
                    budget -= len(chunk)
        else:
            for s in running:
                if s.finished:
                    padding += 1  # static batching: a finished request still fills its slot
                else:
                    work.append((s, s.next_chunk()))
        logits = decoder.step_many([c for _, c in work], [s.seq for s, _ in work],
                                   last_only=True)
        n_tokens = sum(len(c) for _, c in work) + padding
        n_pairs = sum(pairs_of(s.seq.length - len(c), len(c)) for s, c in work)
        start = clock
        clock += cost.pass_time(len(work) + padding, n_tokens, n_pairs)
        passes.append({"start": start, "end": clock, "tokens": n_tokens, "pairs": n_pairs,
                       "sequences": len(work),
                       "prefill_tokens": sum(len(c) for s, c in work if s.prefilling)})
        for (s, chunk), row in zip(work, logits, strict=True):
            if s.prefilling:
                s.done += len(chunk)
                if s.prefilling:
                    continue  # more of the prompt to go: nothing sampled yet
                if prefix_cache is not None:
                    prefix_cache.insert(s.prompt, s.seq)
            s.out.append(sample_token(row, s.request.temperature, s.rng))
            s.times.append(clock)
        for s in list(running):
            if s.finished and (policy != "static" or all(o.finished for o in running)):
                results[s.request.rid] = RequestResult(s.request.rid, s.out, s.request.arrival,
                                                       s.times, s.hit_tokens)
                store.free(s.seq)
                running.remove(s)
    return ServeResult(policy, dict(sorted(results.items())), passes)


def make_workload(n_requests: int, vocab_tokens, *, rng, rate: float, short=(8, 32),
                  long=(96, 160), long_share: float = 0.2, new_tokens=(8, 40),
                  temperature: float = 0.0) -> list[Request]:
    """A seeded workload: Poisson arrivals, a mix of short and long prompts.

    Arrivals: exponential gaps of mean ``1 / rate`` seconds. Prompt lengths: with probability
    ``long_share`` uniform on ``long``, else uniform on ``short`` (both inclusive); new tokens
    uniform on ``new_tokens``. Each prompt is a slice of ``vocab_tokens`` (a token stream such
    as the validation text) at a random offset; request ``i`` samples with seed ``i``.
    """
    rng = np.random.default_rng(rng)
    stream = np.asarray(vocab_tokens)
    t, out = 0.0, []
    for i in range(n_requests):
        t += rng.exponential(1.0 / rate)
        lo, hi = long if rng.random() < long_share else short
        n = int(rng.integers(lo, hi + 1))
        offset = int(rng.integers(0, len(stream) - n))
        out.append(Request(i, stream[offset:offset + n], int(rng.integers(new_tokens[0],
                           new_tokens[1] + 1)), t, temperature, seed=i))
    return out
