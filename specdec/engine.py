"""Chapters 1–4: the batched toy engine: an alias sampler and many chains stepped at once.

Monte Carlo runs here: independent chains of the bigram target advanced together in numpy,
one uniform per draw, through the same `Rule` objects that the exact enumeration uses.
"""

import functools
from typing import NamedTuple

import numpy as np

from .checks import (
    DRAW_BYTES,
    MAX_DRAWS,
    MAX_STEPS,
    STEP_BYTES,
    _check_count,
    _check_memory,
    _check_rng,
)
from .models import (
    BOS,
    CONTEXT_INDEX,
    CONTEXTS,
    P_MATRIX,
    V,
    _check_context,
    _check_table,
    _check_weights,
    draft_matrix,
)
from .rule import EXACT_RULE, _check_step_args
from .verify import _accepted_count, _test_uniforms


def _check_rows(rows, models):
    """Raise unless rows is a 1-D integer array of row numbers of models' tables."""
    if not isinstance(models, ToyModels):
        raise ValueError(f"models must be ToyModels (from toy_models), got {type(models).__name__}")
    n_rows = models.draft.rows
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ValueError("rows must be a 1-D numpy array of integers")
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
        raise ValueError(f"rows must lie in [0, {n_rows}), got {rows.min()}..{rows.max()}")


def _alias_table(probs):
    """Walker's alias table for one law: column j keeps j w.p. keep[j], else gives alias[j]."""
    n = len(probs)
    scaled = (np.asarray(probs, dtype=float) * n).tolist()
    keep, alias = [1.0] * n, list(range(n))
    small = [j for j in range(n) if scaled[j] < 1]
    large = [j for j in range(n) if scaled[j] >= 1]
    while small and large:  # Vose: pair each under-full column with an over-full one
        j, big = small.pop(), large.pop()
        keep[j], alias[j] = scaled[j], big
        scaled[big] -= 1 - scaled[j]
        (small if scaled[big] < 1 else large).append(big)
    return keep, alias


class RowSampler:
    """O(1) draws from the rows of a fixed table (R, V) by the alias method, one uniform each."""

    def __init__(self, table):
        table = _check_table(table)
        self.rows, self.vocab = table.shape
        keep, alias = zip(*map(_alias_table, table))
        self.threshold = np.concatenate(keep) + np.tile(
            np.arange(self.vocab), self.rows
        )  # j + keep[j]
        self.alias = np.concatenate(alias).astype(np.int32)  # (R·V,)

    def __call__(self, rows, u):
        """One token from each table row in rows (B,), using the uniforms u (B,)."""
        scaled = u * self.vocab
        column = scaled.astype(np.int32)  # uniform column j; its fractional part decides
        cell = rows * self.vocab + column
        return np.where(scaled < self.threshold[cell], column, self.alias[cell])


class ToyModels(NamedTuple):
    """Per-context tables for several draft weights: row m·19 + c is context c under weights[m]."""

    accept: np.ndarray  # (M·19·18,) flat: acceptance prob of token t drafted at row r, [r·18 + t]
    draft: RowSampler  # draws from q_w
    final: RowSampler  # rows 0..M·19−1: the rule's correction; then the bonus law p


@functools.lru_cache(maxsize=32)
def toy_models(weights, rule=EXACT_RULE):
    """ToyModels for the draft weights in the tuple `weights` under `rule` (cached)."""
    p = np.tile(P_MATRIX, (len(weights), 1))
    q = np.concatenate([draft_matrix(w) for w in weights])
    accept, correction = rule.tables(p, q)
    return ToyModels(accept.ravel(), RowSampler(q), RowSampler(np.concatenate([correction, p])))


def toy_step(rows, gamma, models, rng, rule=EXACT_RULE):
    """One step per chain at table row `rows` (B,): (accepted, draft (B, gamma), final)."""
    _check_rows(rows, models)
    _check_count(gamma, "gamma")
    _check_memory(len(rows) * (gamma + 1) * STEP_BYTES, "toy_step")
    _check_rng(rng)
    return _toy_step(rows, gamma, models, rng, rule)


def _toy_step(rows, gamma, models, rng, rule):
    """toy_step() without the checks, for the engine's loops (their callers checked once)."""
    batch = len(rows)
    u = rng.random((gamma + 1, batch))  # one uniform per draft, one for the final draw
    block = rows - rows % len(CONTEXTS)  # first row of each chain's model
    path = np.empty((batch, gamma + 1), dtype=np.int32)  # table row at each position
    path[:, 0] = rows
    for i in range(gamma):  # draft gamma tokens: token t is context row t + 1
        path[:, i + 1] = block + 1 + models.draft(path[:, i], u[i])
    draft = path[:, 1:] - block[:, None] - 1  # (B, gamma) token ids
    accept_x = models.accept[path[:, :-1] * V + draft]  # (B, gamma)
    accepted = _accepted_count(accept_x, _test_uniforms(rng, batch, gamma, rule))
    end = path[np.arange(batch), accepted]  # row where the step ends
    final = models.final(end + models.draft.rows * (accepted == gamma), u[gamma])
    return accepted, draft, final


TARGET_SAMPLER = RowSampler(P_MATRIX)


def sample_tokens(n_draws, ctx, rng):
    """n_draws independent tokens from p(· | ctx), vectorised; token ids (n_draws,)."""
    _check_count(n_draws, "n_draws")
    _check_memory(n_draws * DRAW_BYTES, f"sample_tokens({n_draws:,})")
    _check_context(ctx)
    _check_rng(rng)
    return TARGET_SAMPLER(np.full(n_draws, CONTEXT_INDEX[ctx]), rng.random(n_draws))


def simulate_prefixes(n_runs, k, gamma, w, ctx, rng, rule=EXACT_RULE):
    """First k tokens of n_runs independent speculative generations from ctx, (n_runs, k)."""
    _check_count(n_runs, "n_runs")
    _check_count(k, "k", 1000, "at every step the prefix loop visits each of the k slots")
    _check_step_args(ctx, gamma, w)
    _check_memory(n_runs * (8 * k + (gamma + 2) * STEP_BYTES), "simulate_prefixes")
    _check_rng(rng)
    models = toy_models((w,), rule)
    out = np.full((n_runs, k), -1, dtype=np.int64)
    filled = np.zeros(n_runs, dtype=np.int64)
    rows = np.full(n_runs, CONTEXT_INDEX[ctx], dtype=np.int32)
    active = np.arange(n_runs) if k else np.arange(0)
    while active.size:
        accepted, draft, final = _toy_step(rows[active], gamma, models, rng, rule)
        start = filled[active]
        for j in range(k):  # slot j holds this step's token number j − start, if it emitted one
            offset = j - start
            token = np.where(offset == accepted, final, -1)
            if gamma:
                kept = draft[np.arange(active.size), np.clip(offset, 0, gamma - 1)]
                token = np.where((offset >= 0) & (offset < accepted), kept, token)
            out[active, j] = np.where(offset >= 0, token, out[active, j])
        rows[active] = final + 1
        filled[active] += accepted + 1
        active = active[filled[active] < k]
    return out


class RunTotals(NamedTuple):
    """Totals over speculative steps: how many steps, tokens, accepted drafts and ratio tests."""

    steps: int
    tokens: int
    accepted: int
    tests: int

    @property
    def tokens_per_step(self):
        """Mean tokens per target call; undefined (ValueError) for a run of no steps."""
        self._check_not_empty()
        return self.tokens / self.steps

    @property
    def acceptance_rate(self):
        """Accepted drafts per ratio test; 1.0 if the steps ran no test (γ = 0): none failed."""
        self._check_not_empty()
        return self.accepted / self.tests if self.tests else 1.0

    def _check_not_empty(self):
        """Raise for a run of no steps, whose per-step and per-test rates are 0/0."""
        if self.steps == 0:
            raise ValueError("a run of no steps has no tokens per step and no acceptance rate")


def steps_totals(steps):
    """RunTotals of the literal speculative_generate's step records."""
    emitted, accepted, tests = (sum(col) for col in zip(*steps)) if steps else (0, 0, 0)
    return RunTotals(len(steps), emitted, accepted, tests)


def simulate_generation(n_chains, n_tokens, gamma, weights, rng, rule=EXACT_RULE):
    """{w: RunTotals} of n_chains chains from BOS per w, each stepped until it has n_tokens."""
    _check_count(n_chains, "n_chains")
    _check_count(n_tokens, "n_tokens", MAX_STEPS, "one array step per token at worst")
    _check_weights(weights)
    for w in weights:
        _check_step_args(BOS, gamma, w)
    _check_memory(len(weights) * n_chains * (gamma + 2) * STEP_BYTES, "simulate_generation")
    _check_count(
        len(weights) * n_chains * n_tokens,
        "len(weights)·n_chains·n_tokens",
        MAX_DRAWS,
        "tokens one call may draw, about a minute",
    )
    _check_rng(rng)
    models = toy_models(tuple(weights), rule)
    model = np.repeat(np.arange(len(weights), dtype=np.int32), n_chains)  # (M·n_chains,) each w
    block = model * len(CONTEXTS)
    rows = block.copy()  # every chain starts at BOS
    tokens, steps, full_steps = (np.zeros(len(rows), dtype=np.int64) for _ in range(3))
    active = np.arange(len(rows)) if n_tokens else np.arange(0)
    while active.size:
        accepted, _, final = _toy_step(rows[active], gamma, models, rng, rule)
        rows[active] = block[active] + 1 + final
        tokens[active] += accepted + 1
        steps[active] += 1
        full_steps[active] += accepted == gamma  # no failed test in that step
        active = active[tokens[active] < n_tokens]
    per_model = [
        np.bincount(model, weights=x, minlength=len(weights)).astype(np.int64)
        for x in (steps, tokens, tokens - steps, tokens - full_steps)
    ]
    return {w: RunTotals(*map(int, column)) for w, column in zip(weights, zip(*per_model))}
