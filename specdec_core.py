"""The shared core of *Exact by Construction*: models, the rejection rule, exact analysis,
fast Monte Carlo and plots.

Speculative decoding after Leviathan, Kalman & Matias (2023) and Chen et al. (2023), in
Leviathan's letters: p is the target model, q the draft. The target is a Laplace-smoothed
character bigram over an 80-character corpus; the draft mixes it with a unigram,
q_w = w·p + (1 − w)·q0.

Each algorithm appears twice: a literal version that reads like the paper (dictionaries, one
Python call per token) and a vectorised twin in numpy for the Monte Carlo; tests check that
the two agree. Exact results use `fractions.Fraction`, computed from the integer counts.
"""

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import optimize, stats

# --------------------------------------------------------------------------------------------
# The corpus and the two models
# --------------------------------------------------------------------------------------------

CORPUS = "to be or not to be that is the question whether tis nobler in the mind to suffer"
VOCAB = sorted(set(CORPUS))  # the 18 tokens the models can emit
BOS = "^"  # start-of-sequence context, never emitted
CONTEXTS = [BOS] + VOCAB  # the 19 possible "previous token" values
V = len(VOCAB)
TOKEN_INDEX = {tok: i for i, tok in enumerate(VOCAB)}
CONTEXT_INDEX = {ctx: i for i, ctx in enumerate(CONTEXTS)}


def _bigram_counts():
    """Add-one bigram counts, shape (19, 18): row = previous token (CONTEXTS), column = token."""
    counts = np.ones((len(CONTEXTS), V), dtype=np.int64)
    for prev, tok in zip(BOS + CORPUS, CORPUS):
        counts[CONTEXT_INDEX[prev], TOKEN_INDEX[tok]] += 1
    return counts


def _unigram_counts():
    """Add-one unigram counts, shape (18,)."""
    counts = np.ones(V, dtype=np.int64)
    for tok in CORPUS:
        counts[TOKEN_INDEX[tok]] += 1
    return counts


BIGRAM_COUNTS = _bigram_counts()  # (19, 18) integers
UNIGRAM_COUNTS = _unigram_counts()  # (18,) integers
P_MATRIX = BIGRAM_COUNTS / BIGRAM_COUNTS.sum(axis=1, keepdims=True)  # (19, 18), rows sum to 1
Q0_VECTOR = UNIGRAM_COUNTS / UNIGRAM_COUNTS.sum()  # (18,)
P_MATRIX.flags.writeable = False
Q0_VECTOR.flags.writeable = False

# The article's dictionaries: P_TABLE[ctx][tok] and Q0_TABLE[tok].
P_TABLE = {ctx: dict(zip(VOCAB, P_MATRIX[i].tolist())) for i, ctx in enumerate(CONTEXTS)}
Q0_TABLE = dict(zip(VOCAB, Q0_VECTOR.tolist()))

# --------------------------------------------------------------------------------------------
# Checking arguments: every bad input gets a ValueError that names the argument
# --------------------------------------------------------------------------------------------

# Size limits (README, "Limits"): past one, a call fails at once with a ValueError saying why.
MAX_BYTES = 2**30  # working memory one call may allocate: 1 GiB
MAX_LOOP = 10**6  # iterations of a literal loop, 5 to 15 µs each in make bench: seconds
MAX_STEPS = 10**5  # iterations of a loop of array steps or of Theorem 3.8: tens of µs each
MAX_GAMMA = 2**53  # past it γ + 1 is not exact as a float: Eq. (1) and Theorems 3.8, 3.11
MAX_OUTCOMES = 10**6  # outcomes an exact law may list (a dict entry each)
MAX_DRAWS = 10**9  # tokens one Monte Carlo call may draw: about a minute at make bench speed
DRAW_BYTES = 48  # peak working memory of sample_tokens per draw, measured
STEP_BYTES = 64  # working memory of the toy engine per chain and draft position, measured


def _check_context(ctx, name="ctx"):
    """Raise unless ctx is one of CONTEXTS."""
    if not isinstance(ctx, str) or ctx not in CONTEXT_INDEX:
        raise ValueError(f"{name} must be one of {''.join(CONTEXTS)!r}, got {ctx!r}")


def _check_unit_interval(x, name):
    """Raise unless x is a real number in [0, 1] (NaN is not)."""
    if isinstance(x, bool) or not isinstance(x, Real) or not 0 <= x <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")


def _check_count(n, name, limit=None, why=""):
    """Raise unless n is a non-negative integer, and at most limit (for the reason why) if given."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    if limit is not None and n > limit:
        raise ValueError(f"{name} must be at most {limit:,} ({why}), got {n:,}")


def _check_positive_count(n, name, limit=None, why=""):
    """Raise unless n is an integer >= 1, and at most limit (for the reason why) if given."""
    _check_count(n, name, limit, why)
    if n == 0:
        raise ValueError(f"{name} must be at least 1, got 0")


def _check_memory(n_bytes, what):
    """Raise if a call would allocate more than MAX_BYTES of working memory for what."""
    if n_bytes > MAX_BYTES:
        raise ValueError(
            f"{what} would need about {n_bytes / 2**30:,.1f} GiB of working memory, above the "
            f"limit of {MAX_BYTES / 2**30:g} GiB (MAX_BYTES)"
        )


def _as_real_array(x, name):
    """x as a float array of at least one dimension with finite entries, else a ValueError."""
    try:
        array = np.asarray(x)
    except ValueError:  # a ragged nesting of lists
        raise ValueError(f"{name} must be an array of real numbers") from None
    real = array.dtype.kind in "iuf" or (  # integers, floats, or objects such as Fractions
        array.dtype.kind == "O"
        and all(isinstance(v, Real) and not isinstance(v, bool) for v in array.flat)
    )
    if not real:
        raise ValueError(f"{name} must be an array of real numbers, got dtype {array.dtype}")
    array = array.astype(float)
    if array.ndim == 0 or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be a 1-D or larger array of finite numbers, got {x!r}")
    return array


def _check_nonnegative(x, name):
    """Raise unless x is a finite real number >= 0."""
    if isinstance(x, bool) or not isinstance(x, Real) or not 0 <= x < float("inf"):
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")


def _check_rng(rng):
    """Raise unless rng is a numpy Generator (seed it: np.random.default_rng(seed))."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")


def _check_distribution(dist, name="dist"):
    """Raise unless dist maps tokens to non-negative probabilities that sum to 1."""
    numbers = isinstance(dist, dict) and all(
        isinstance(v, Real) and not isinstance(v, bool) for v in dist.values()
    )
    values = np.array(list(dist.values()), dtype=float) if numbers else None
    if values is None or values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be a non-empty dict of finite probabilities (real numbers)")
    if np.any(values < 0) or abs(values.sum() - 1) > 1e-9:
        raise ValueError(f"{name} must have non-negative probabilities summing to 1")


def _check_table(table, name="table"):
    """table as a float array (R, V) of rows that are probability laws, else a ValueError."""
    table = _as_real_array(table, name)
    if table.ndim != 2 or table.size == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array (rows, tokens), got {table.shape}")
    _check_count(table.size, f"{name}.size", MAX_LOOP, "the alias tables are built in Python")
    if np.any(table < 0) or np.any(np.abs(table.sum(axis=1) - 1) > 1e-9):
        raise ValueError(f"{name} must have non-negative rows that each sum to 1 (tolerance 1e-9)")
    return table


def _check_rows(rows, models):
    """Raise unless rows is a 1-D integer array of row numbers of models' tables."""
    if not isinstance(models, ToyModels):
        raise ValueError(f"models must be ToyModels (from toy_models), got {type(models).__name__}")
    n_rows = models.draft.rows
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise ValueError("rows must be a 1-D numpy array of integers")
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
        raise ValueError(f"rows must lie in [0, {n_rows}), got {rows.min()}..{rows.max()}")


def _check_weights(weights):
    """Raise unless weights is a non-empty sequence of distinct draft weights (results key on w)."""
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__") or not len(weights):
        raise ValueError(f"weights must be a non-empty sequence of draft weights, got {weights!r}")
    if len(set(weights)) != len(weights):
        raise ValueError(f"weights must be distinct (results are keyed by w), got {list(weights)}")


def _check_token_rows(tokens, law):
    """(tokens as int64 (N, k), k) for rows of token ids whose length k is that of law's keys."""
    if not isinstance(law, dict) or not law:
        raise ValueError("law must be a non-empty dict {k-character string: probability}")
    k = len(next(iter(law)))
    if any(not isinstance(s, str) or len(s) != k or not set(s) <= set(TOKEN_INDEX) for s in law):
        raise ValueError(f"law's keys must all be strings of {k} tokens from VOCAB")
    _check_count(k, "k, the length of law's keys", 15, "a row is read as a base-18 int64")
    probs = _as_real_array(list(law.values()), "law's probabilities")
    if np.any(probs < 0) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("law's probabilities must be non-negative and sum to 1")
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] != k or tokens.dtype.kind not in "iu" or not tokens.size:
        raise ValueError(
            f"tokens must be a non-empty integer array (N, {k}), as law's keys have {k}"
        )
    if tokens.min() < 0 or tokens.max() >= V:
        raise ValueError(
            f"tokens must be token ids in [0, {V}), got {tokens.min()}..{tokens.max()}"
        )
    return tokens.astype(np.int64), k


# --------------------------------------------------------------------------------------------
# The models, the article's way (dictionaries)
# --------------------------------------------------------------------------------------------


def p_dist(ctx):
    """The target p(· | ctx) as {token: probability}."""
    _check_context(ctx)
    return P_TABLE[ctx]


def q_dist(ctx, w):
    """The draft q_w(· | ctx) = w·p(· | ctx) + (1 − w)·q0 as {token: probability}."""
    _check_context(ctx)
    _check_unit_interval(w, "w")
    p, w = P_TABLE[ctx], float(w)  # float64 even for a float32 or Fraction w
    return {tok: w * p[tok] + (1 - w) * Q0_TABLE[tok] for tok in VOCAB}


def _draw(dist, rng):
    """Inverse-CDF draw from {token: probability}: the first token whose cumulative sum passes r."""
    cumulative = list(itertools.accumulate(dist.values()))
    r = rng.random() * cumulative[-1]  # scaled to the total, so a rounding gap cannot be hit
    return next(tok for tok, acc in zip(dist, cumulative) if r < acc)


def sample_categorical(dist, rng):
    """One token drawn from {token: probability}."""
    _check_distribution(dist)
    _check_rng(rng)
    return _draw(dist, rng)


def autoregressive_sample(n_tokens, ctx, rng):
    """n_tokens drawn one at a time from the target chain p, starting after ctx."""
    _check_count(n_tokens, "n_tokens", MAX_LOOP, "one Python call per token; use sample_tokens")
    _check_context(ctx)
    _check_rng(rng)
    out = []
    for _ in range(n_tokens):
        ctx = _draw(P_TABLE[ctx], rng)
        out.append(ctx)
    return out


# --------------------------------------------------------------------------------------------
# The rejection rule, literal version (Leviathan et al., Algorithm 1)
# --------------------------------------------------------------------------------------------


def residual_dist(ctx, w):
    """norm(max(0, p − q_w)) at ctx; where p = q_w there is nothing to move and we return p."""
    p, q = p_dist(ctx), q_dist(ctx, w)
    raw = {tok: max(0.0, p[tok] - q[tok]) for tok in VOCAB}
    z = sum(raw.values())
    if z == 0:  # p = q: the rejection probability 1 − Σ min(p, q) is 0, so this is never drawn
        return dict(p)
    return {tok: v / z for tok, v in raw.items()}


def _check_step_args(ctx, gamma, w):
    """Raise unless (ctx, gamma, w) are valid arguments of a speculative step."""
    _check_context(ctx)
    _check_count(gamma, "gamma")
    _check_unit_interval(w, "w")


class StepTrace(NamedTuple):
    """One speculative step as it happened: drafts, ratios, uniforms, the last token."""

    ctx: str
    draft: list  # the gamma drafted tokens
    ratios: list  # min(1, p(x)/q(x)) of each drafted token
    uniforms: list  # the uniform r of each ratio test that ran
    accepted: int  # n, the drafts kept
    last: str  # the residual draw after a rejection, or the bonus token from p

    @property
    def tokens(self):
        """The tokens the step emits: the kept drafts, then the last token."""
        return self.draft[: self.accepted] + [self.last]

    @property
    def tests(self):
        """Ratio tests run: min(n + 1, gamma)."""
        return len(self.uniforms)

    @property
    def boxes(self):
        """(token, kind) in display order: drafts tested, the last token, drafts never tested."""
        n, bonus = self.accepted, self.accepted == len(self.draft)
        kinds = ["accepted"] * n + ([] if bonus else ["rejected"])
        drafted = [(x, kind) for x, kind in zip(self.draft, kinds)]
        untested = [(x, "not tested") for x in self.draft[n + 1 :]]
        return drafted + [(self.last, "bonus" if bonus else "resampled")] + untested


def trace_step(ctx, gamma, w, rng):
    """One step of Algorithm 1: draft gamma tokens, keep each w.p. min(1, p/q)."""
    _check_step_args(ctx, gamma, w)
    _check_count(gamma, "gamma", MAX_LOOP, "one Python call per draft token")
    _check_rng(rng)
    draft, q_dists, c = [], [], ctx
    for _ in range(gamma):  # 1. draft gamma tokens, one at a time, from q
        q = q_dist(c, w)
        c = _draw(q, rng)
        draft.append(c)
        q_dists.append(q)
    path = [ctx] + draft  # the context of each of the gamma + 1 positions
    p_dists = [p_dist(c) for c in path]  # 2. one batched target pass over all of them
    ratios = [min(1.0, p[x] / q[x]) for x, p, q in zip(draft, p_dists, q_dists)]
    uniforms, n = [], 0
    for ratio in ratios:  # 3. ratio tests, left to right, a fresh uniform each
        uniforms.append(rng.random())
        if uniforms[-1] >= ratio:  # rejected (never where q(x) <= p(x), ratio 1)
            break
        n += 1
    if n < gamma:  # 4. first rejection: draw from the residual at that position
        last = _draw(residual_dist(path[n], w), rng)
    else:  # 5. all kept: a bonus token from p at position gamma + 1
        last = _draw(p_dists[gamma], rng)
    return StepTrace(ctx, draft, ratios, uniforms, n, last)


def speculative_step(ctx, gamma, w, rng):
    """One step of Algorithm 1: (emitted tokens, drafts kept n, ratio tests run)."""
    step = trace_step(ctx, gamma, w, rng)
    return step.tokens, step.accepted, step.tests


def trace_run(n_steps, gamma, w, ctx, rng):
    """n_steps chained steps from ctx, each a StepTrace (for the figure of a run)."""
    _check_count(n_steps, "n_steps")
    _check_step_args(ctx, gamma, w)
    _check_rng(rng)
    steps = []
    for _ in range(n_steps):
        steps.append(trace_step(ctx, gamma, w, rng))
        ctx = steps[-1].last
    return steps


def speculative_generate(n_tokens, gamma, w, ctx, rng):
    """Chain steps from ctx until n_tokens are out; records (emitted, accepted, tests) per step."""
    _check_count(n_tokens, "n_tokens", MAX_LOOP, "one Python call per token")
    _check_step_args(ctx, gamma, w)
    _check_rng(rng)
    out, steps = [], []
    while len(out) < n_tokens:
        tokens, n, n_tests = speculative_step(ctx, gamma, w, rng)
        steps.append((len(tokens), n, n_tests))
        out.extend(tokens)
        ctx = tokens[-1]
    return out[:n_tokens], steps


# --------------------------------------------------------------------------------------------
# Verifiers as data: the correct rule and deliberately broken ones
# --------------------------------------------------------------------------------------------
# Each function works elementwise on numpy arrays, of floats or of Fractions (dtype=object),
# so the Monte Carlo engine and the exact enumeration run the very same rule.


def _ratio(p, q):
    """min(1, p/q), and 0 where q = 0 (a token the draft cannot produce is rejected)."""
    positive = q > 0
    return np.where(positive, np.minimum(1, p / np.where(positive, q, 1)), 0)


def _normalise_or(weights, fallback):
    """weights / Σ weights along the last axis, or fallback where that sum is 0."""
    z = weights.sum(axis=-1, keepdims=True)
    positive = z > 0
    return np.where(positive, weights / np.where(positive, z, 1), fallback)


def _residual_weights(p, q):
    """max(0, p − q): the mass p has and q lacks."""
    return np.maximum(p - q, 0)


def _sharpened(q):
    """q² renormalised: a draft law at temperature 1/2, not the one the tokens came from."""
    return _normalise_or(q * q, q)


@dataclass(frozen=True)
class Rule:
    """A verifier: keep a draft x w.p. accept(p(x), q(x)), else draw from correction(p, q)."""

    name: str
    accept: Callable = _ratio
    correction: Callable = _residual_weights
    seen_q: Callable = field(default=lambda q: q)  # the draft law the verifier believes in
    shared_uniform: bool = False  # one uniform for all gamma tests of a step

    def correction_law(self, p, q):
        """The law drawn on rejection: correction(p, q) normalised, or p where it has no mass."""
        return _normalise_or(self.correction(p, q), p)

    def tables(self, p, q):
        """For rows of p and the draft q: (acceptance prob of each token, law on rejection)."""
        seen = self.seen_q(q)
        return self.accept(p, seen), self.correction_law(p, seen)


EXACT_RULE = Rule("Leviathan et al. (correct)")
BROKEN_RULES = {
    "accept all": Rule("accept every draft token", accept=lambda p, q: np.ones_like(p)),
    "resample from p": Rule("on rejection, resample from p", correction=lambda p, q: p),
    "wrong q in ratio": Rule("ratio and residual with q sharpened (T = 1/2)", seen_q=_sharpened),
    "one uniform": Rule("one uniform reused for every position", shared_uniform=True),
}


# --------------------------------------------------------------------------------------------
# The vectorised verifier: a batch of B drafts of gamma tokens over a vocabulary of size V
# --------------------------------------------------------------------------------------------


def _accepted_count(accept_x, u):
    """Leading ratio tests passed (B,), from acceptance probs and uniforms, both (B, gamma)."""
    batch, gamma = accept_x.shape
    passed = np.zeros((batch, gamma + 1), dtype=bool)  # a failed sentinel test at the end
    np.less(u, accept_x, out=passed[:, :gamma])  # r < min(1, p/q)
    return passed.argmin(axis=1)  # the first failed test


def _test_uniforms(rng, batch, gamma, rule):
    """The uniforms of the gamma ratio tests, (B, gamma): one per test, or one shared by all."""
    u = rng.random((batch, 1) if rule.shared_uniform else (batch, gamma))
    return np.broadcast_to(u, (batch, gamma))


def _at_least_float64(dtype):
    """dtype promoted to float64 or wider: float32 sums drift, integer differences wrap."""
    return np.promote_types(dtype, np.float64)


CHUNK = 1024  # rows of at least LONG_ROW tokens draw a chunk, then a token within it
LONG_ROW = 4 * CHUNK
GEMV_BELOW = 4096  # shorter rows summed by BLAS gemv, measured faster for 8 to 8,192 tokens


def _row_sums(weights):
    """Σ over the last axis in float64 or wider, (...,): BLAS for short rows, einsum for long."""
    dtype, vocab = _at_least_float64(weights.dtype), weights.shape[-1]
    if vocab >= GEMV_BELOW:  # a few long rows (6 of 32,000): einsum's own loop is faster
        return np.einsum("...v->...", weights, dtype=dtype)
    rows = weights.reshape(math.prod(weights.shape[:-1]), vocab)  # (N, V)
    return (rows @ np.ones(vocab, dtype)).reshape(weights.shape[:-1])  # many short rows: gemv


def _below(u, total):
    """u·total, kept below total: u·total rounds up to a subnormal total of a few ulps."""
    scaled = u * total
    if (scaled < total).all():  # true unless a total is subnormal, as u <= 1 - 2**-53
        return scaled
    return np.minimum(scaled, np.nextafter(total, 0))


def _sample_rows(weights, rng):
    """One inverse-CDF draw from each row of non-negative weights (N, V) with a positive sum."""
    cumulative = weights.cumsum(axis=1)
    scaled = _below(rng.random(len(weights)), cumulative[:, -1])
    return np.count_nonzero(cumulative <= scaled[:, None], axis=1)  # first sum above u·total


def _cumsum_columns(columns):
    """In place, columns (V, N) become their running sums down axis 0, in index order."""
    if len(columns) > columns.shape[1]:  # tall and narrow: numpy's own loop
        return np.cumsum(columns, axis=0, out=columns)
    for above, row in itertools.pairwise(columns):  # short and wide: V vector additions
        np.add(above, row, out=row)
    return columns


def _column_draw(weights, p_n, from_p, u):
    """Inverse-CDF draws (b,) from rows of weights (b, V), or of p_n where from_p or no mass."""
    columns = np.array(weights.T, order="C")  # (V, b), a copy
    bonus = np.flatnonzero(from_p)
    columns[:, bonus] = p_n[bonus].T
    cumulative = _cumsum_columns(columns)  # sums in index order, as cumsum along a row
    empty = cumulative[-1] <= 0
    if empty.any():
        cumulative[:, empty] = _cumsum_columns(np.array(p_n[empty].T, order="C"))
    return np.count_nonzero(cumulative <= _below(u, cumulative[-1]), axis=0)  # first sum above


def _chunked_draw(weights, p_n, from_p, u):
    """_column_draw's draws for long rows (b, V), by _draw_in_chunks one row at a time."""
    from_p = from_p | ~(_row_sums(weights) > 0)  # bonus, or a correction without mass: p
    starts = np.arange(0, weights.shape[1], CHUNK)
    draws = [
        _draw_in_chunks(p if bonus else w, starts, r)
        for w, p, bonus, r in zip(weights, p_n, from_p, u)
    ]
    return np.array(draws, dtype=np.int64)


def _draw_in_chunks(row, starts, u):
    """A token of row (V,) with mass: a chunk by its mass, then a token by the rest of u."""
    masses = np.add.reduceat(row, starts)  # (chunks,)
    ends = np.cumsum(masses)
    scaled = _below(u, ends[-1])
    chunk = np.searchsorted(ends, scaled, side="right")  # the chunk whose mass holds it
    before = ends[chunk - 1] if chunk else 0
    rest = min((scaled - before) / masses[chunk], np.nextafter(1, 0))  # uniform on [0, 1)
    cumulative = np.cumsum(row[starts[chunk] : starts[chunk] + CHUNK])
    return starts[chunk] + np.searchsorted(cumulative, rest * cumulative[-1], side="right")


def _draw_final(weights, p_n, from_p, u):
    """Inverse-CDF draws (b,) from weights (b, V), or from p_n where from_p or no mass."""
    draw = _chunked_draw if p_n.shape[1] >= LONG_ROW else _column_draw
    return draw(weights, p_n, from_p, u)


def _final_token(p_n, q_n, is_bonus, u, rule):
    """The token after the accepted ones (b,): from p for a bonus, else the rule's correction."""
    return _draw_final(rule.correction(p_n, q_n), p_n, is_bonus, u)


def _emitted(draft_tokens, accepted, final):
    """(B, gamma + 1) signed tokens: the accepted draft, the final token, then -1 padding."""
    batch, gamma = draft_tokens.shape
    tokens = np.empty((batch, gamma + 1), dtype=np.int64)
    tokens[:, :gamma] = draft_tokens  # as signed int64: uint8 padding is -1, never 255
    np.copyto(tokens, -1, where=np.arange(gamma + 1) > accepted[:, None])
    tokens[np.arange(batch), accepted] = final
    return tokens


# The checks and the verifier walk the batch in blocks of about BLOCK_BYTES of one input:
# numpy's temporaries stay block-sized, and verify() checks a block just before it verifies it.
BLOCK_BYTES = 2**20


def _blocks(probs):
    """Slices of the batch axis of probs (B, ...), each about BLOCK_BYTES, at least one row."""
    batch = len(probs)
    step = max(1, BLOCK_BYTES // max(1, probs[:1].nbytes))
    return [slice(start, start + step) for start in range(0, batch, step)]


_REAL_KINDS = "fiu"  # float, signed and unsigned integer dtypes; not bool, complex or object


def _is_law(part):
    """True iff every row of part (b, L, V) is >= 0 and sums to 1 ± 1e-6."""
    if part.size and not part.min() >= 0:  # a negative entry or a NaN
        return False
    sums = _row_sums(part)  # an inf entry shows in its row's sum
    return not sums.size or (sums.max() - 1 <= 1e-6 and 1 - sums.min() <= 1e-6)


def _rows_sum_to_one(probs):
    """True iff every row of probs (B, L, V) is >= 0 and sums to 1 ± 1e-6, in one read."""
    return all(_is_law(probs[block]) for block in _blocks(probs))


def _check_probs(probs, name):
    """Raise unless the real rows of probs (B, L, V) are finite, >= 0 and sum to 1."""
    if _rows_sum_to_one(probs):
        return
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"{name} contains NaN or inf")
    if np.any(probs < 0):
        raise ValueError(f"{name} has negative entries")
    raise ValueError(f"{name} has rows that do not sum to 1 (tolerance 1e-6)")


def _check_layout(target_probs, draft_probs, draft_tokens):
    """Raise unless the shapes match, the dtypes are real and every draft token is in range."""
    if target_probs.ndim != 3 or draft_probs.ndim != 3 or draft_tokens.ndim != 2:
        raise ValueError(
            "need target_probs (B, gamma+1, V), draft_probs (B, gamma, V), draft_tokens (B, gamma)"
        )
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]
    if target_probs.shape != (batch, gamma + 1, vocab) or draft_probs.shape != (
        batch,
        gamma,
        vocab,
    ):
        raise ValueError(
            f"shapes do not match: target_probs {target_probs.shape}, draft_probs "
            f"{draft_probs.shape}, draft_tokens {draft_tokens.shape}"
        )
    for probs, name in ((target_probs, "target_probs"), (draft_probs, "draft_probs")):
        if probs.dtype.kind not in _REAL_KINDS:
            raise TypeError(f"{name} must hold real numbers (float or int), got {probs.dtype}")
    if draft_tokens.dtype.kind not in "iu":
        raise ValueError(f"draft_tokens must be integers, got dtype {draft_tokens.dtype}")
    if draft_tokens.size and (draft_tokens.min() < 0 or draft_tokens.max() >= vocab):
        raise ValueError(f"draft_tokens must lie in [0, {vocab})")


def _check_laws(target_probs, draft_probs):
    """Raise unless every row of both inputs is a distribution over the vocabulary."""
    _check_probs(target_probs, "target_probs")
    _check_probs(draft_probs, "draft_probs")


def _check_batch(target_probs, draft_probs, draft_tokens):
    """Raise unless the three arrays are a well-formed batch of distributions and drafts."""
    _check_layout(target_probs, draft_probs, draft_tokens)
    _check_laws(target_probs, draft_probs)


def _checked_batch(target_probs, draft_probs, draft_tokens, rng):
    """The three batch arguments as arrays, after every check of _check_batch and of rng."""
    arrays = np.asarray(target_probs), np.asarray(draft_probs), np.asarray(draft_tokens)
    _check_batch(*arrays)
    _check_rng(rng)
    return arrays


def verify(target_probs, draft_probs, draft_tokens, rng):
    """Speculative verification of a batch: returns accepted (B,) and tokens (B, gamma + 1)."""
    arrays = np.asarray(target_probs), np.asarray(draft_probs), np.asarray(draft_tokens)
    _check_layout(*arrays)
    _check_rng(rng)
    return _verify(*arrays, rng, EXACT_RULE, check_rows=True)  # rows checked block by block


def _rows_at(probs, positions):
    """probs[b, positions[b]] for every b, (B, V): one flat take when probs is contiguous."""
    batch, length, vocab = probs.shape
    rows = np.arange(batch)
    if not probs.flags.c_contiguous:  # e.g. a broadcast view: index it in place, no copy
        return probs[rows, positions]
    flat = probs.reshape(batch * length, vocab)
    index = rows * length + positions  # positions are accepted counts in [0, length)
    return np.take(flat, index, axis=0, mode="clip")  # never clips; skips "raise"'s slow path


def _cell_offsets(batch, gamma, length, vocab):
    """Flat index of probs[b, i, 0] in a C-contiguous (batch, length, vocab) array, (B, gamma)."""
    return (np.arange(batch)[:, None] * length + np.arange(gamma)) * vocab


def _entries(probs, draft_tokens, offsets):
    """probs[b, i, draft_tokens[b, i]] for i < gamma, (B, gamma), given probs' _cell_offsets."""
    batch, gamma = draft_tokens.shape
    if not probs.flags.c_contiguous:
        return probs[np.arange(batch)[:, None], np.arange(gamma), draft_tokens]
    return np.take(probs.reshape(-1), offsets[:batch] + draft_tokens)


def _verify(target_probs, draft_probs, draft_tokens, rng, rule, check_rows=False):
    """verify() for any Rule, a cache-sized block at a time; check_rows: each block's rows first."""
    batch, gamma = draft_tokens.shape
    state = rng.bit_generator.state  # a refused batch draws nothing: restored on an error
    u_tests = _test_uniforms(rng, batch, gamma, rule)  # (B, gamma)
    u_final = rng.random(batch)  # (B,)
    accepted, final = np.empty(batch, dtype=np.int64), np.empty(batch, dtype=np.int64)
    blocks = _blocks(target_probs)
    size, vocab = min(batch, blocks[0].stop) if blocks else 0, target_probs.shape[2]
    offsets = _cell_offsets(size, gamma, gamma + 1, vocab), _cell_offsets(size, gamma, gamma, vocab)
    for block in blocks:
        target, draft = (
            probs[block].astype(_at_least_float64(probs.dtype), copy=False)
            for probs in (target_probs, draft_probs)
        )  # (b, gamma+1, V), (b, gamma, V)
        if check_rows and not (_is_law(target) and _is_law(draft)):
            rng.bit_generator.state = state
            _check_laws(target, draft)  # raises, naming the input and its fault
        probs = target, rule.seen_q(draft)
        accepted[block], final[block] = _verify_block(
            probs, draft_tokens[block], offsets, u_tests[block], u_final[block], rule
        )
    return accepted, _emitted(draft_tokens, accepted, final)


def _verify_block(probs, draft_tokens, offsets, u_tests, u_final, rule):
    """(accepted (b,), final token (b,)) of one block, given its uniforms (b, gamma) and (b,)."""
    (target, seen), gamma = probs, draft_tokens.shape[1]
    p_x, q_x = (_entries(a, draft_tokens, o) for a, o in zip(probs, offsets))  # (b, gamma)
    accepted = _accepted_count(rule.accept(p_x, q_x), u_tests)
    p_n = _rows_at(target, accepted)  # (b, V): the target where the step ends
    q_n = _rows_at(seen, np.minimum(accepted, gamma - 1)) if gamma else p_n
    return accepted, _final_token(p_n, q_n, accepted == gamma, u_final, rule)


# --------------------------------------------------------------------------------------------
# The batched toy engine: many independent chains of the bigram target at once
# --------------------------------------------------------------------------------------------


def draft_matrix(w):
    """q_w for every context, (19, 18): w·P + (1 − w)·q0."""
    _check_unit_interval(w, "w")
    w = float(w)  # float64 tables even for a Fraction or float32 w
    return w * P_MATRIX + (1 - w) * Q0_VECTOR


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


# --------------------------------------------------------------------------------------------
# Exact analysis: every path enumerated, in Fractions from the integer counts
# --------------------------------------------------------------------------------------------

P_FRACTIONS = np.array(
    [[Fraction(int(c), int(row.sum())) for c in row] for row in BIGRAM_COUNTS], dtype=object
)  # (19, 18)
Q0_FRACTIONS = np.array(
    [Fraction(int(c), int(UNIGRAM_COUNTS.sum())) for c in UNIGRAM_COUNTS], dtype=object
)  # (18,)


def as_fraction(x):
    """x as a Fraction; a float is read as its shortest decimal (0.3 -> 3/10)."""
    return x if isinstance(x, (Fraction, Integral)) else Fraction(repr(float(x)))


def model_matrices(w, exact=True):
    """(P, Q_w), both (19, 18): Fractions when exact, else floats."""
    _check_unit_interval(w, "w")
    if not exact:
        return P_MATRIX, draft_matrix(w)
    w = as_fraction(w)
    return P_FRACTIONS, w * P_FRACTIONS + (1 - w) * Q0_FRACTIONS


JOINT_MAX_K = max(k for k in range(20) if V**k <= MAX_OUTCOMES)  # 4: 18^4 = 104,976 outcomes


def target_joint(k, ctx=BOS, exact=True):
    """The target chain's law of its next k tokens after ctx: {k-character string: probability}."""
    _check_count(k, "k", JOINT_MAX_K, f"the law lists 18^k outcomes, at most {MAX_OUTCOMES:,}")
    _check_context(ctx)
    p, _ = model_matrices(0, exact)
    law = {"": Fraction(1) if exact else 1.0}
    for _ in range(k):
        law = {
            s + tok: mass * p[CONTEXT_INDEX[s[-1:] or ctx], t]
            for s, mass in law.items()
            for t, tok in enumerate(VOCAB)
        }
    return law


LAW_MAX_K = 3  # k = 3 enumerates in seconds, k = 4 in about 3 minutes (Fractions, γ = 2)


def speculative_law(k, gamma, w, ctx=BOS, rule=EXACT_RULE, exact=True):
    """Law of the first k tokens of speculative generation from ctx, every draft path enumerated."""
    _check_count(k, "k", LAW_MAX_K, "every draft path is enumerated: k = 4 takes minutes")
    _check_step_args(ctx, gamma, w)
    p, q = model_matrices(w, exact)
    accept, correction = rule.tables(p, q)  # (19, 18) each, per context and drafted token
    law = defaultdict(int)

    def new_step(prefix, c, mass):
        """Start a speculative step at context row c with `prefix` already emitted."""
        if len(prefix) == k:
            law[prefix] += mass
        else:
            draft_walk(prefix, c, 0, mass, 1)

    def draft_walk(prefix, c, depth, draft_mass, passed):
        """Extend an accepted draft; passed = P(the uniform(s) passed every test so far)."""
        if len(prefix) == k:
            law[prefix] += draft_mass * passed
            return
        if depth == gamma:  # all drafts kept: bonus token from p
            for t, tok in enumerate(VOCAB):
                new_step(prefix + tok, t + 1, draft_mass * passed * p[c, t])
            return
        rejected = 0
        for y, tok in enumerate(VOCAB):  # draft y, then test it
            kept = min(passed, accept[c, y]) if rule.shared_uniform else passed * accept[c, y]
            rejected += q[c, y] * (passed - kept)
            draft_walk(prefix + tok, y + 1, depth + 1, draft_mass * q[c, y], kept)
        for t, tok in enumerate(VOCAB):  # first rejection: draw the correction
            new_step(prefix + tok, t + 1, draft_mass * rejected * correction[c, t])

    new_step("", CONTEXT_INDEX[ctx], Fraction(1) if exact else 1.0)
    return dict(law)


def law_difference(law, reference):
    """Largest |law − reference| over the union of their outcomes."""
    keys = set(law) | set(reference)
    return max(abs(law.get(s, 0) - reference.get(s, 0)) for s in keys)


def two_path_identity(w, exact=True):
    """min(p, q) + max(0, p − q) − p for every context and token, (19, 18): zero by the theorem."""
    p, q = model_matrices(w, exact)
    return np.minimum(p, q) + _residual_weights(p, q) - p


# --------------------------------------------------------------------------------------------
# Statistics: how far a sample is from a law, and how far noise alone would put it
# --------------------------------------------------------------------------------------------


class Comparison(NamedTuple):
    """Observed counts of outcomes beside their exact probabilities."""

    labels: list
    exact: np.ndarray  # (K,) probabilities
    counts: np.ndarray  # (K,) observed counts

    @property
    def n(self):
        """Number of draws."""
        return int(self.counts.sum())

    @property
    def empirical(self):
        """Observed frequencies."""
        return self.counts / self.n

    @property
    def max_gap(self):
        """max |p̂ − p|."""
        return float(np.abs(self.empirical - self.exact).max())

    @property
    def tv(self):
        """Total variation ½·Σ|p̂ − p|."""
        return total_variation(self.empirical, self.exact)

    @property
    def p_value(self):
        """Chi-square goodness-of-fit p-value of the counts against the exact law."""
        return chi_square_p_value(self.counts, self.exact)

    @property
    def sigma(self):
        """Standard error of each frequency under the exact law, √(p(1 − p)/n)."""
        return np.sqrt(self.exact * (1 - self.exact) / self.n)

    @property
    def pearson_residuals(self):
        """(count − n·p)/√(n·p) per outcome; their squares sum to Pearson's statistic."""
        expected = self.n * self.exact
        return (self.counts - expected) / np.sqrt(expected)

    @property
    def chi_square(self):
        """Pearson's statistic Σ (count − n·p)² / (n·p), on len(counts) − 1 degrees of freedom."""
        return float(stats.chisquare(self.counts, self.exact * self.n).statistic)


def total_variation(a, b):
    """½·Σ|a − b|."""
    a, b = _as_real_array(a, "a"), _as_real_array(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {a.shape} and {b.shape}")
    return 0.5 * float(np.abs(a - b).sum())


def chi_square_p_value(counts, probs):
    """p-value of Pearson's chi-square test of counts against probs (scipy)."""
    counts, probs = _as_real_array(counts, "counts"), _as_real_array(probs, "probs")
    if counts.shape != probs.shape or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("counts and probs must have one shape and probs must sum to 1")
    if np.any(counts < 0) or np.any(probs <= 0) or counts.sum() == 0:
        raise ValueError(
            "counts must be >= 0, not all 0, and probs > 0 (drop outcomes of probability 0)"
        )
    return float(stats.chisquare(counts, probs * counts.sum()).pvalue)


def compare(tokens, law):
    """Comparison of sampled token rows (N, k) against {k-string: probability}."""
    tokens, k = _check_token_rows(tokens, law)
    labels = sorted(law)
    exact = np.array([float(law[s]) for s in labels])
    codes = np.zeros(len(tokens), dtype=np.int64)
    for column in tokens.T:  # each row read as a base-V number
        codes = codes * V + column
    order = np.array(  # ascending, as VOCAB is sorted
        [sum(TOKEN_INDEX[ch] * V ** (k - 1 - i) for i, ch in enumerate(s)) for s in labels]
    )
    slot = np.minimum(np.searchsorted(order, codes), len(order) - 1)  # (N,) each row's label
    if np.any(order[slot] != codes):
        raise ValueError("tokens contain an outcome that law does not list (probability 0)")
    return Comparison(labels, exact, np.bincount(slot, minlength=len(labels)))


def noise_reference(probs, n, rng, reps=2000):
    """Mean and 95th percentile of max-gap and TV for n exact draws from probs (multinomial)."""
    probs = _as_real_array(probs, "probs")
    if probs.ndim != 1 or np.any(probs < 0) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be a 1-D array of non-negative probabilities summing to 1")
    _check_positive_count(n, "n", 2**62, "numpy's multinomial counts in int64")
    _check_positive_count(reps, "reps")
    _check_memory(reps * probs.size * 8 * 4, f"noise_reference with reps={reps:,}")
    _check_rng(rng)
    freq = rng.multinomial(n, probs, size=reps) / n  # (reps, K)
    gap = np.abs(freq - probs)
    max_gap, tv = gap.max(axis=1), 0.5 * gap.sum(axis=1)
    return {
        "mean_max_gap": float(max_gap.mean()),
        "q95_max_gap": float(np.quantile(max_gap, 0.95)),
        "mean_tv": float(tv.mean()),
        "q95_tv": float(np.quantile(tv, 0.95)),
    }


def noise_bands(probs, n, rng, reps=2000):
    """Under n exact draws from probs: 95th percentile of max |p̂ − p|/σ; mean, sd of the TV."""
    probs = np.asarray(probs, float)
    if probs.ndim != 1 or np.any(probs <= 0) or np.any(probs >= 1) or abs(probs.sum() - 1) > 1e-9:
        raise ValueError("probs must be a 1-D array of probabilities in (0, 1) summing to 1")
    _check_count(n, "n")
    if n == 0:
        raise ValueError("n must be at least 1")
    _check_count(reps, "reps")
    _check_rng(rng)
    freq = rng.multinomial(n, probs, size=reps) / n  # (reps, K)
    gap = np.abs(freq - probs)
    z = gap / np.sqrt(probs * (1 - probs) / n)
    tv = 0.5 * gap.sum(axis=1)
    return {
        "q95_max_z": float(np.quantile(z.max(axis=1), 0.95)),
        "mean_tv": float(tv.mean()),
        "sd_tv": float(tv.std()),
    }


def law_tv(law, reference):
    """Total variation ½·Σ|law − reference| between two laws over strings."""
    keys = set(law) | set(reference)
    return sum(abs(law.get(s, 0) - reference.get(s, 0)) for s in keys) / 2


# --------------------------------------------------------------------------------------------
# What draft quality buys: acceptance, tokens per call, walltime (Leviathan et al., Section 3)
# --------------------------------------------------------------------------------------------


def beta_exact(ctx, w):
    """β(ctx) = Σ_x min(p(x | ctx), q_w(x | ctx)): a draft's survival chance at ctx."""
    p, q = p_dist(ctx), q_dist(ctx, w)
    return sum(min(p[t], q[t]) for t in VOCAB)


def _stationary(transition, tol=1e-15, max_iter=10_000):
    """Stationary law of a row-stochastic matrix by power iteration: π ← π·T."""
    pi = np.full(len(transition), 1 / len(transition))
    for _ in range(max_iter):
        new = pi @ transition
        if np.abs(new - pi).max() < tol:
            return new / new.sum()
        pi = new
    raise RuntimeError("power iteration did not converge")


TOKEN_TRANSITION = P_MATRIX[1:]  # (18, 18): p(next token | previous token), BOS dropped
PI_P_VECTOR = _stationary(TOKEN_TRANSITION)  # (18,)
PI_P = dict(zip(VOCAB, PI_P_VECTOR.tolist()))  # the target chain's long-run context law


def alpha_exact(w):
    """α(w) = Σ_ctx π_p(ctx)·β(ctx, w): β averaged over the contexts the target visits.

    Leviathan et al.'s α = E(β). Not exactly the long-run accepted-per-test rate of
    the speculative chain, which tests no bonus position (see chain_stats).
    """
    alpha = sum(PI_P[ctx] * beta_exact(ctx, w) for ctx in VOCAB)
    return min(alpha, 1.0)  # rounding may put the sum a hair above 1


def beta_vector(w, exact=True):
    """β(ctx, w) = Σ_x min(p, q_w) for every context, (19,): Fractions when exact."""
    p, q = model_matrices(w, exact)
    return np.minimum(p, q).sum(axis=1)


def stationary_exact():
    """π_p in Fractions: solve π·(T − I) = 0 with Σπ = 1 by Gaussian elimination."""
    n = V
    # rows: the n balance equations with the last replaced by Σπ = 1; augmented column last
    system = [
        [P_FRACTIONS[1 + j, i] - (i == j) for j in range(n)] + [Fraction(0)] for i in range(n)
    ]
    system[-1] = [Fraction(1)] * n + [Fraction(1)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if system[r][col] != 0)
        system[col], system[pivot] = system[pivot], system[col]
        system[col] = [v / system[col][col] for v in system[col]]
        for r in range(n):
            if r != col and system[r][col] != 0:
                factor = system[r][col]
                system[r] = [a - factor * b for a, b in zip(system[r], system[col])]
    return np.array([row[-1] for row in system], dtype=object)


def alpha_fraction(w):
    """α(w) in exact rational arithmetic: π_p (Fractions) · β(·, w) (Fractions)."""
    return stationary_exact() @ beta_vector(w)[1:]


def expected_tokens(alpha, gamma):
    """Eq. (1): E[tokens/step] = (1 − α^(γ+1))/(1 − α) = Σ_{i=0..γ} α^i."""
    _check_unit_interval(alpha, "alpha")
    _check_count(gamma, "gamma", MAX_GAMMA, "past it γ + 1 is not exact as a float")
    if gamma < 64:  # the sum form is stable near α = 1, where the closed form divides 0 by 0
        return sum(alpha**i for i in range(gamma + 1)) * 1.0
    if alpha == 1:
        return gamma + 1.0
    drop = float(1 - alpha)  # the closed form, with expm1 and log1p to stay exact near α = 1
    return -math.expm1((gamma + 1) * math.log1p(-drop)) / drop


def walltime_speedup(alpha, gamma, c):
    """Theorem 3.8: (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
    _check_nonnegative(c, "c")
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def measured_cost_speedup(tokens_per_step, gamma, c, v):
    """The book's measured-cost form: E[tokens] / (γc + v(γ)); Theorem 3.8 when v = 1."""
    _check_count(gamma, "gamma")
    ok = isinstance(tokens_per_step, Real) and not isinstance(tokens_per_step, bool)
    if not ok or not 1 - 1e-9 <= tokens_per_step <= gamma + 1 + 1e-9:
        raise ValueError(f"tokens_per_step must lie in [1, gamma + 1], got {tokens_per_step!r}")
    _check_nonnegative(c, "c")
    if isinstance(v, bool) or not isinstance(v, Real) or not 0 < v < float("inf"):
        raise ValueError(f"v must be a positive finite number, got {v!r}")
    return tokens_per_step / (gamma * c + v)


def operations_increase(alpha, gamma, c_hat):
    """Theorem 3.11: (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))."""
    _check_nonnegative(c_hat, "c_hat")
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha, c, max_gamma=30):
    """The γ ≤ max_gamma maximising Theorem 3.8; 0: do not speculate; ties: smaller."""
    _check_count(max_gamma, "max_gamma", MAX_GAMMA, "past it γ + 1 is not exact as a float")
    _check_unit_interval(alpha, "alpha")
    _check_nonnegative(c, "c")
    if alpha == 1 or c == 0:  # then the speedup is monotone in γ: it rises iff α > c
        return max_gamma if alpha > c else 0
    # past γ = α/((1 − α)c) the speedup is below 1/((1 − α)(γc + 1)) <= 1, its value at γ = 0
    beyond = alpha >= max_gamma * (1 - alpha) * c  # that γ lies past max_gamma
    last = max_gamma if beyond else int(alpha / ((1 - alpha) * c)) + 1
    if last > MAX_STEPS:
        raise ValueError(f"max_gamma: the optimum may lie anywhere up to {last:,} (MAX_STEPS)")
    speedups = [walltime_speedup(alpha, g, c) for g in range(last + 1)]
    return int(np.argmax(speedups))


class ChainStats(NamedTuple):
    """Exact long-run per-step averages of the speculative chain."""

    tokens_per_step: float
    accepted_per_step: float
    tests_per_step: float

    @property
    def acceptance_rate(self):
        """Accepted drafts per ratio test."""
        return self.accepted_per_step / self.tests_per_step if self.tests_per_step else 1.0


def chain_stats(w, gamma):
    """Exact long-run ChainStats of the toy at weight w, from markov_chain_stats."""
    _check_unit_interval(w, "w")
    _check_count(gamma, "gamma")
    return markov_chain_stats(P_MATRIX[1:], draft_matrix(w)[1:], gamma)


def markov_chain_stats(p, q, gamma):
    """Exact long-run ChainStats for tables p, q (V, V), from each step's last token.

    Kernel M = Σ_{n<γ} Kⁿ·diag(1 − β)·R + K^γ·P: K = min(p, q) keeps, R the residual.
    """
    p, q = _check_tables(p, q)
    _check_count(gamma, "gamma", MAX_STEPS, "one V × V matrix step per draft position")
    keep = np.minimum(p, q)  # kept-draft kernel: token -> next token
    reject = 1 - keep.sum(axis=1)  # (V,) 1 − β
    residual = EXACT_RULE.correction_law(p, q)
    n = len(p)
    reach = np.eye(n)  # reach[c, d]: P(from c, k drafts kept, the k-th is d)
    kernel = np.zeros((n, n))
    tests = np.zeros(n)
    accepted = np.zeros(n)
    for _ in range(gamma):
        tests += reach.sum(axis=1)
        kernel += (reach * reject) @ residual
        reach = reach @ keep
        accepted += reach.sum(axis=1)
    kernel += reach @ p  # all gamma kept: bonus from p
    kernel /= kernel.sum(axis=1, keepdims=True)  # rows sum to 1 (rounding drifts over many γ)
    pi = _stationary(kernel)
    return ChainStats(float(pi @ accepted) + 1, float(pi @ accepted), float(pi @ tests))


# --------------------------------------------------------------------------------------------
# Any draft, any bigram target: α for other drafts, a target whose β is correlated, estimating α
# --------------------------------------------------------------------------------------------

MAX_TABLE = 64  # largest vocabulary the exact chain analysis accepts


def _check_tables(p, q):
    """(p, q) as float arrays (V, V), rows laws, 1 ≤ V ≤ MAX_TABLE; else ValueError naming one."""
    tables = []
    for name, table in (("p", p), ("q", q)):
        table = np.asarray(table, dtype=float)
        if table.ndim != 2 or table.shape[0] != table.shape[1] or not 0 < len(table) <= MAX_TABLE:
            raise ValueError(f"{name} must be a square table (V, V), 1 <= V <= {MAX_TABLE}")
        if not np.all(np.isfinite(table)) or np.any(table < 0):
            raise ValueError(f"{name} must hold finite non-negative probabilities")
        if np.abs(table.sum(axis=1) - 1).max() > 1e-9:
            raise ValueError(f"each row of {name} must sum to 1")
        tables.append(table)
    if tables[0].shape != tables[1].shape:
        raise ValueError("p and q must have one shape")
    return tables


def alpha_of(p, q):
    """α = Σ_ctx π_p(ctx)·Σ_x min(p(x | ctx), q(x | ctx)) for bigram tables (V, V)."""
    p, q = _check_tables(p, q)
    return float(_stationary(p) @ np.minimum(p, q).sum(axis=1))


UNIFORM_DRAFT = np.full((V, V), 1 / V)  # q(x | ctx) = 1/18: no knowledge at all


def unsmoothed_models():
    """(bigram, unigram as a table), both (18, 18), from the raw counts without add-one."""
    bigram = BIGRAM_COUNTS[1:] - 1  # every token is followed by something in the corpus
    unigram = UNIGRAM_COUNTS - 1
    return bigram / bigram.sum(axis=1, keepdims=True), np.tile(unigram / unigram.sum(), (V, 1))


REGIME_TOKENS = ["a", "b", "X", "Y"]  # a, b: the easy regime; X, Y: the hard one


def regime_models(stay=0.9, slip=0.05):
    """(p, q), (4, 4): a sticky target (regime kept w.p. stay); q swaps its hard rows.

    Easy regime: the draft is the target (β = 1). Hard regime: the draft predicts
    the wrong hard token (β = 1 − stay + 2·slip).
    """
    _check_unit_interval(stay, "stay")
    if not 0 <= slip <= stay / 2:
        raise ValueError(f"slip must be a number in [0, stay/2], got {slip!r}")
    leave = (1 - stay) / 2
    easy = [stay / 2, stay / 2, leave, leave]
    hard_x = [leave, leave, stay - slip, slip]
    hard_y = [leave, leave, slip, stay - slip]
    p = np.array([easy, easy, hard_x, hard_y])
    return p, p[[0, 1, 3, 2]]


def alpha_estimate(p, q, n_chains, n_tokens, rng):
    """(mean, s.e.) of β over contexts the target p generates, chains started from π_p.

    Unbiased for α: every visited context has law π_p. The s.e. is the spread of
    the n_chains chain means, so correlation along a chain is accounted for.
    Limits: 2 ≤ n_chains, 1 ≤ n_tokens, n_chains·n_tokens ≤ 1e8; tables up to MAX_TABLE.
    """
    p, q = _check_tables(p, q)
    _check_count(n_tokens, "n_tokens")
    _check_rng(rng)
    if isinstance(n_chains, bool) or not isinstance(n_chains, Integral) or n_chains < 2:
        raise ValueError(f"n_chains must be an integer >= 2, got {n_chains!r}")
    if n_tokens < 1 or n_chains * n_tokens > 10**8:
        raise ValueError("n_tokens must be >= 1 and n_chains·n_tokens at most 1e8")
    beta = np.minimum(p, q).sum(axis=1)  # (V,)
    cumulative = np.cumsum(p, axis=1)  # (V, V)
    last = len(p) - 1  # the clips guard against a cumulative sum rounded below 1
    start = np.searchsorted(np.cumsum(_stationary(p)), rng.random(n_chains))
    ctx = np.minimum(start, last)  # (n_chains,) contexts drawn from π_p
    total = np.zeros(n_chains)
    for _ in range(n_tokens):
        total += beta[ctx]
        u = rng.random(n_chains)[:, None]  # (n_chains, 1)
        ctx = np.minimum((u > cumulative[ctx]).sum(axis=1), last)  # next contexts
    means = total / n_tokens
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(n_chains))


def oracle_tokens(alpha):
    """Leviathan et al. §3.5: with an oracle for γ, E[tokens/step] = 1/(1 − α) (i.i.d. β)."""
    _check_unit_interval(alpha, "alpha")
    if alpha == 1:
        raise ValueError("alpha must be below 1 for the oracle's 1/(1 − alpha)")
    return 1 / (1 - alpha)


def oracle_speedup(alpha, c):
    """With the oracle, α/(1 − α) drafts per step on average: 1 / (1 − α + cα)."""
    _check_nonnegative(c, "c")
    return oracle_tokens(alpha) / (c * alpha * oracle_tokens(alpha) + 1)


def implied_cost(alpha, gamma, speedup):
    """The c at which Theorem 3.8 gives `speedup`: (E[tokens]/speedup − 1)/γ."""
    _check_nonnegative(speedup, "speedup")
    if gamma < 1 or speedup == 0:
        raise ValueError("gamma must be >= 1 and speedup > 0")
    return (expected_tokens(alpha, gamma) / speedup - 1) / gamma


# --------------------------------------------------------------------------------------------
# Sampling settings, the bugs real engines shipped, and an audit for any verifier (chapter 6)
# --------------------------------------------------------------------------------------------
# Rows are (N, V) arrays of floats or of Fractions (dtype=object); every step below works on
# both, so the claims that need no irrational number are checked in exact arithmetic.


@dataclass(frozen=True)
class Settings:
    """Sampling settings, applied in engine order: penalty θ, temperature T, top-k, top-p."""

    temperature: Real = 1
    top_k: int | None = None
    top_p: Real | None = None
    penalty: Real = 1  # repetition penalty θ on tokens already in the prefix
    greedy: bool = False  # one-hot at the first argmax after the penalty
    bf16: bool = False  # the final law rounded to bfloat16 and renormalised (floats only)


def _power(rows, exponent):
    """rows ** exponent; an integer exponent keeps Fractions exact, any other gives floats."""
    exponent = Fraction(exponent)
    if exponent.denominator == 1 and rows.dtype == object:
        return rows ** int(exponent)
    return np.asarray(rows, float) ** float(exponent)


def _keep_top(rows, keep_count):
    """Zero all but the keep_count[n] largest entries of each row (ties: the lower token id)."""
    order = np.argsort(-rows, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(rows.shape[1])[None, :], axis=1)
    return np.where(rank < np.reshape(keep_count, (-1, 1)), rows, 0 * rows)


def _top_p_count(rows, top_p):
    """Per row, the fewest largest tokens whose mass reaches top_p of the row's total."""
    ordered = -np.sort(-rows, axis=1)
    mass = np.cumsum(ordered, axis=1)
    below = mass < top_p * mass[:, -1:]  # tokens still needed after these
    return 1 + np.count_nonzero(below, axis=1)


def _bf16(rows):
    """Round float rows to bfloat16 (8 significant bits, to nearest even), as float64."""
    bits = np.asarray(rows, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(float)


def process(rows, seen, settings):
    """Processed law of each row (N, V), with seen (N, V) marking tokens already in the prefix.

    Logits are log-probabilities (all ≤ 0), so the penalty's logit·θ is p^θ, and T gives p^(1/T).
    """
    inverse_t = 1 / as_fraction(settings.temperature)
    weights = np.where(seen, _power(rows, settings.penalty * inverse_t), _power(rows, inverse_t))
    if settings.greedy:
        top = np.arange(rows.shape[1]) == weights.argmax(axis=1)[:, None]
        weights = np.where(top, weights**0, 0 * weights)  # ones and zeros of the rows' type
    if settings.top_k is not None:
        weights = _keep_top(weights, np.full(len(rows), settings.top_k))
    if settings.top_p is not None:
        top_p = as_fraction(settings.top_p) if weights.dtype == object else settings.top_p
        weights = _keep_top(weights, _top_p_count(weights, top_p))
    law = weights / weights.sum(axis=1, keepdims=True)
    if not settings.bf16:
        return law
    rounded = _bf16(law)
    return rounded / rounded.sum(axis=1, keepdims=True)


PROMPT = "to be or no"  # the context of every chapter 6 law; its tokens count for penalties


def _check_prompt(prompt):
    """Raise unless prompt is a non-empty string of the toy's tokens."""
    if not isinstance(prompt, str) or not prompt or any(c not in TOKEN_INDEX for c in prompt):
        raise ValueError(f"prompt must be a non-empty string of tokens from {''.join(VOCAB)!r}")


def _prefixes(length):
    """All V**length token sequences in base-V order, (V**length, length)."""
    every = list(itertools.product(range(V), repeat=length))
    return np.array(every, dtype=np.int64).reshape(V**length, length)


def _seen(prefixes, prompt, upto):
    """(N, V): True where a token occurs in the prompt or in the first `upto` prefix tokens."""
    seen = np.zeros((len(prefixes), V), dtype=bool)
    seen[:, sorted({TOKEN_INDEX[c] for c in prompt})] = True
    for column in prefixes[:, :upto].T:
        seen[np.arange(len(prefixes)), column] = True
    return seen


def _history_rows(prefixes, prompt, w, exact):
    """Raw target and draft rows (N, V) after prompt + each prefix: the bigram of the last token."""
    p, q = model_matrices(w, exact)
    last = prefixes[:, -1] + 1 if prefixes.shape[1] else np.full(1, CONTEXT_INDEX[prompt[-1]])
    return p[last], q[last]


@dataclass(frozen=True)
class RowRule:
    """A verifier by rows: acceptance of every candidate token, and the law after rejecting x."""

    name: str
    accept: Callable = _ratio  # (p, q) rows (N, V) -> acceptance probabilities (N, V)
    correction: Callable = lambda p, q, x: _residual_weights(p, q)  # weights (N, V)
    per_token: bool = False  # the correction depends on the rejected token x (N,)

    def law_after_rejection(self, p, q, miss):
        """Σ_x miss[:, x] · correction law given x, (N, V); miss (N, V) = q(x)·(1 − accept(x))."""
        if not self.per_token:
            return miss.sum(axis=1, keepdims=True) * _normalise_or(self.correction(p, q, None), p)
        total = 0 * p
        for x in range(p.shape[1]):
            law = _normalise_or(self.correction(p, q, np.full(len(p), x)), p)
            total = total + miss[:, x : x + 1] * law
        return total


def _whole_row_accept(p, q):
    """min(1, min_v p(v)/q(v)) over v with q(v) > 0, the same for every token of the row."""
    ratio = np.where(q > 0, p / np.where(q > 0, q, 1), np.inf)
    return np.broadcast_to(np.minimum(1, ratio.min(axis=1, keepdims=True)), p.shape)


def _residual_at_token(p, q, x):
    """p, with max(0, p − q) only at the rejected token x (N,)."""
    rows = np.arange(len(p))
    weights = p.copy()
    weights[rows, x] = np.maximum(p[rows, x] - q[rows, x], 0)
    return weights


FLOAT32_TINY = Fraction(1, 2**126)  # torch.finfo(torch.float32).tiny


def _tiny_clamped(p, q, x):
    """max(p − q, tiny): the residual with every entry clamped to float32's smallest normal."""
    tiny = FLOAT32_TINY if p.dtype == object else float(FLOAT32_TINY)
    return np.maximum(p - q, tiny)


ROW_EXACT = RowRule("Leviathan et al. (correct)")
ROW_BUGS = {
    "softmax residual": RowRule(
        "softmax of the clamped residual",
        correction=lambda p, q, x: np.exp(np.asarray(_residual_weights(p, q), float)),
    ),
    "residual at token": RowRule(
        "draft mass subtracted only at the drafted token",
        correction=_residual_at_token,
        per_token=True,
    ),
    "whole-row test": RowRule("reject if any token has p < u·q", accept=_whole_row_accept),
    "tiny clamp": RowRule("residual clamped to float32 tiny", correction=_tiny_clamped),
    "correction from p": RowRule("on rejection, draw from p", correction=lambda p, q, x: p),
}


@dataclass(frozen=True)
class Pipeline:
    """Who computes what: the user's settings, the draft's, and the rows the verifier is given."""

    name: str
    target: Settings = Settings()  # the user's settings: the output must follow this p'
    draft: Settings = Settings()  # the settings the draft samples with
    ratio_target: Settings | None = None  # the p the verifier gets (None: the user's p')
    ratio_draft: Settings | None = None  # the q of ratio and residual (None: the sampled q')
    rule: RowRule = ROW_EXACT
    stale: bool = False  # the verified rows' penalties use the prefix at the step's start

    def rows(self, prefixes, start, prompt, w, exact):
        """(p the verifier uses, q the draft samples, q the verifier uses), each (N, V)."""
        p, q = _history_rows(prefixes, prompt, w, exact)
        fresh = _seen(prefixes, prompt, prefixes.shape[1])
        stale = _seen(prefixes, prompt, start) if self.stale else fresh
        q_draw = process(q, fresh, self.draft)
        q_seen = q_draw if self.ratio_draft is None else process(q, fresh, self.ratio_draft)
        return process(p, stale, self.ratio_target or self.target), q_draw, q_seen


def processed_target_law(k, settings, prompt=PROMPT, exact=True):
    """The law p' of the next k tokens (V**k,) in base-V order: settings applied at each prefix."""
    _check_count(k, "k")
    _check_prompt(prompt)
    law = np.array([Fraction(1) if exact else 1.0], dtype=object if exact else float)
    for length in range(k):
        prefixes = _prefixes(length)
        p, _ = _history_rows(prefixes, prompt, 0, exact)
        law = (law[:, None] * process(p, _seen(prefixes, prompt, length), settings)).ravel()
    return law


def pipeline_law(k, gamma, w, pipeline, prompt=PROMPT, exact=True):
    """Law (V**k,) of the first k tokens a pipeline emits, every path enumerated, and the
    expected tokens of its first step (complete when k > gamma).

    reach[j] holds, per prefix, the chance that the step begun at length j has kept every draft
    up to that prefix; reach[length] is a step boundary.
    """
    _check_count(k, "k")
    _check_step_args(BOS, gamma, w)
    _check_prompt(prompt)
    reach = {0: np.array([Fraction(1) if exact else 1.0], dtype=object if exact else float)}
    first_step = reach[0][0]
    for length in range(k):
        prefixes, ends = _prefixes(length), 0
        for start, mass in list(reach.items()):
            p, q_draw, q_seen = pipeline.rows(prefixes, start, prompt, w, exact)
            if length - start == gamma:  # every draft kept: the bonus token from p
                ends = ends + (mass[:, None] * p).ravel()
                del reach[start]
                continue
            accept = pipeline.rule.accept(p, q_seen)
            reach[start] = (mass[:, None] * q_draw * accept).ravel()
            first_step += reach[start].sum() if start == 0 else 0
            miss = q_draw * (1 - accept)  # (N, V): drafted x, then rejected
            ends = (
                ends + (mass[:, None] * pipeline.rule.law_after_rejection(p, q_seen, miss)).ravel()
            )
        reach[length + 1] = ends
    return sum(reach.values()), first_step


def law_total_variation(law, reference):
    """½·Σ|law − reference| over aligned outcome arrays (exact for Fractions)."""
    return sum(abs(a - b) for a, b in zip(law, reference)) / 2


DETECT_LEVEL = 1e-3  # the chi-square test that sizes a CI suite: its level ...
DETECT_POWER = 0.8  # ... and the power it should have against a bug


@functools.lru_cache(maxsize=256)
def noncentrality_needed(df, level, power):
    """λ at which Pearson's test on df degrees of freedom at `level` rejects w.p. `power`."""
    critical = stats.chi2.isf(level, df)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e7))


def samples_to_detect(law, reference, level=DETECT_LEVEL, power=DETECT_POWER):
    """Draws a chi-square test of reference needs to reject law w.p. power: (n, reason).

    On the reference's support, n = λ / Σ (law − ref)² / ref (noncentral chi-square); a draw
    the reference forbids fails at once, which takes log(1 − power) / log(1 − forbidden mass).
    """
    law, reference = np.asarray(law, float), np.asarray(reference, float)
    support = reference > 0
    drift = float(((law - reference)[support] ** 2 / reference[support]).sum())
    forbidden = float(law[~support].sum())
    cells = int(support.sum())
    lam = noncentrality_needed(cells - 1, level, power) if cells > 1 else np.inf
    by_chi = lam / drift if drift > 0 else np.inf
    by_forbidden = max(1.0, np.log1p(-power) / np.log1p(-forbidden)) if forbidden > 0 else np.inf
    if by_forbidden < by_chi:
        return float(np.ceil(by_forbidden)), "a forbidden outcome"
    return float(np.ceil(max(by_chi, 1.0))), "chi-square"


def rule_verifier(rule):
    """A verify_fn that runs a RowRule on a batch, with verify()'s checks and interface."""

    def verify_fn(target_probs, draft_probs, draft_tokens, rng):
        """Speculative verification of a batch under the rule; (accepted, tokens)."""
        target_probs, draft_probs, draft_tokens = _checked_batch(
            target_probs, draft_probs, draft_tokens, rng
        )
        batch, gamma = draft_tokens.shape
        vocab = target_probs.shape[2]
        p, q = target_probs[:, :gamma].reshape(-1, vocab), draft_probs.reshape(-1, vocab)
        accept = np.asarray(rule.accept(p, q)).reshape(batch, gamma, vocab)
        offsets = _cell_offsets(batch, gamma, gamma, vocab)
        accept_x = _entries(np.ascontiguousarray(accept), draft_tokens, offsets)  # (B, gamma)
        accepted = _accepted_count(accept_x, rng.random((batch, gamma)))
        last = np.minimum(accepted, gamma - 1)
        p_n = _rows_at(target_probs, accepted)  # (B, V)
        q_n = _rows_at(draft_probs, last) if gamma else p_n
        x_n = draft_tokens[np.arange(batch), last] if gamma else np.zeros(batch, int)
        weights = rule.correction(p_n, q_n, x_n)  # drawn from p for a bonus or without mass
        final = _draw_final(weights, p_n, accepted == gamma, rng.random(batch))
        return accepted, _emitted(draft_tokens, accepted, final)

    verify_fn.__name__ = verify_fn.__qualname__ = f"rule_verifier({rule.name!r})"
    return verify_fn


def greedy_target_verifier(target_probs, draft_probs, draft_tokens, rng):
    """verify() given the target's argmax as a one-hot p: argmax verification at T > 0."""
    target_probs = np.asarray(target_probs)
    if target_probs.ndim != 3:
        raise ValueError("need target_probs (B, gamma+1, V)")
    one_hot = np.arange(target_probs.shape[2]) == target_probs.argmax(axis=2)[..., None]
    return verify(one_hot.astype(float), draft_probs, draft_tokens, rng)


AUDIT_LEVEL = 1e-3  # chance that the whole audit fails an exact verifier
AUDIT_TV = 0.02  # a verifier whose law is this far off in one scenario ...
AUDIT_POWER = 0.99  # ... fails that scenario with at least this probability
AUDIT_MIN_EXPECTED = 5  # cells expecting fewer draws are pooled into one
AUDIT_SEED = 2026  # the scenarios' models are fixed; audit_verifier's seed drives the draws


USER_SETTINGS = Settings(temperature=Fraction(1, 2), top_k=8, top_p=Fraction(9, 10), penalty=2)
SETTINGS_W = Fraction(3, 10)  # the draft weight of chapter 6


def bug_pipelines(user=USER_SETTINGS):
    """The real bugs of chapter 6, each a change of p, q or the rule: {label: Pipeline}."""
    argmax = replace(user, greedy=True)
    return {
        "argmax draft, softmax q": Pipeline("argmax draft, softmax q", user, argmax, None, user),
        "raw q in the ratio": Pipeline("raw q in the ratio", user, user, None, Settings()),
        "unprocessed target": Pipeline("unprocessed target", user, user, Settings()),
        "argmax target at T > 0": Pipeline("argmax target at T > 0", user, user, argmax),
        "bf16 draft, fp32 ratio": Pipeline(
            "bf16 draft, fp32 ratio", user, replace(user, bf16=True), None, user
        ),
        "stale penalty prefix": Pipeline("stale penalty prefix", user, user, stale=True),
    } | {key: Pipeline(rule.name, user, user, rule=rule) for key, rule in ROW_BUGS.items()}


EXACT_IN_FRACTIONS = ("softmax residual", "bf16 draft, fp32 ratio")  # the float-only bugs


def _outcome(code, k):
    """The k-token string of a base-V code, spaces shown as '␣'."""
    return "".join(show_token(VOCAB[code // V ** (k - 1 - i) % V]) for i in range(k))


def bug_rows(k=3, gamma=2, w=SETTINGS_W, level=DETECT_LEVEL, power=DETECT_POWER):
    """Per bug: exact TV of k tokens from p', the most over- and under-made outcome, and the
    draws a chi-square test at `level` needs for `power` (floats; see tiny_clamp_row)."""
    reference = processed_target_law(k, USER_SETTINGS, exact=False)
    rows = []
    for key, pipeline in bug_pipelines().items():
        if key == "tiny clamp":
            continue
        law = np.asarray(pipeline_law(k, gamma, w, pipeline, exact=False)[0], float)
        n, reason = samples_to_detect(law, reference, level, power)
        gap = law - reference
        rows.append(
            {
                "bug": key,
                "TV": law_total_variation(law, reference),
                "too often": f"{_outcome(int(gap.argmax()), k)} ({gap.max():+.2g})",
                "too rarely": f"{_outcome(int(gap.argmin()), k)} ({gap.min():+.2g})",
                "draws to catch": n,
                "caught by": reason,
            }
        )
    return rows


def tiny_clamp_row(k=2, gamma=2, w=SETTINGS_W):
    """The finfo.tiny clamp in Fractions: exact TV of k tokens, and the bound k·V·tiny/min Z."""
    reference = processed_target_law(k, USER_SETTINGS)
    law, _ = pipeline_law(k, gamma, w, bug_pipelines()["tiny clamp"])
    return law_total_variation(law, reference), law, reference


class Scenario(NamedTuple):
    """A small model: row [i, prev] is the law at position i after token prev (prev 0 at i = 0)."""

    name: str
    target: np.ndarray  # (gamma + 1, V, V)
    draft: np.ndarray  # (gamma, V, V)


def _dirichlet(rng, shape, support=None):
    """Random rows (..., V) from a flat Dirichlet; zero outside the boolean support (..., V)."""
    rows = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])
    if support is not None:
        rows = np.where(support, rows + 0.05, 0)
        rows /= rows.sum(axis=-1, keepdims=True)
    return rows


def _sparse_support(rng, shape, keep):
    """A random boolean support (..., V) with `keep` tokens in each row."""
    order = rng.random(shape).argsort(axis=-1)
    return order < keep


def _one_hot(rng, shape):
    """Random one-hot rows (..., V)."""
    return (np.arange(shape[-1]) == rng.integers(shape[-1], size=shape[:-1])[..., None]) * 1.0


@functools.cache
def audit_scenarios():
    """The fixed adversarial scenarios of audit_verifier, built from AUDIT_SEED."""
    rng = np.random.default_rng(AUDIT_SEED)
    binary_p, binary_q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
    p3 = _dirichlet(rng, (3, 5, 5))
    return [
        Scenario(
            "random rows, V = 4, γ = 3", _dirichlet(rng, (4, 4, 4)), _dirichlet(rng, (3, 4, 4))
        ),
        Scenario(
            "zeros in p and q, V = 6, γ = 2",
            _dirichlet(rng, (3, 6, 6), _sparse_support(rng, (3, 6, 6), 3)),
            _dirichlet(rng, (2, 6, 6), _sparse_support(rng, (2, 6, 6), 3)),
        ),
        Scenario("p = q, V = 5, γ = 2", p3, p3[:2]),
        Scenario("one-hot p, V = 8, γ = 2", _one_hot(rng, (3, 8, 8)), _dirichlet(rng, (2, 8, 8))),
        Scenario("one-hot q, V = 4, γ = 3", _dirichlet(rng, (4, 4, 4)), _one_hot(rng, (3, 4, 4))),
        Scenario(
            "disjoint supports, V = 6, γ = 2",
            _dirichlet(rng, (3, 6, 6), np.arange(6) < 3),
            _dirichlet(rng, (2, 6, 6), np.arange(6) >= 3),
        ),
        Scenario("γ = 5, V = 2", _dirichlet(rng, (6, 2, 2)), _dirichlet(rng, (5, 2, 2))),
        Scenario(
            "γ = 1, V = 50, 6 tokens per row",
            _dirichlet(rng, (2, 50, 50), _sparse_support(rng, (2, 50, 50), 6)),
            _dirichlet(rng, (1, 50, 50), _sparse_support(rng, (1, 50, 50), 6)),
        ),
        Scenario(
            "Sun et al.'s binary example, γ = 2",
            np.broadcast_to(binary_p, (3, 2, 2)),
            np.broadcast_to(binary_q, (2, 2, 2)),
        ),
    ]


def scenario_law(scenario):
    """The target's exact joint law of gamma + 1 tokens, (V**(gamma+1),) in base-V order."""
    vocab = scenario.target.shape[1]
    law, last = np.ones(1), np.zeros(1, dtype=np.int64)
    for rows in scenario.target:  # (V, V) for this position
        law = (law[:, None] * rows[last]).ravel()
        last = np.tile(np.arange(vocab), len(last))
    return law


def audit_draws(law, level, tv=AUDIT_TV, power=AUDIT_POWER):
    """Draws that fail a law off by TV ≥ tv w.p. ≥ power, and the pooled cells' mass.

    Cauchy–Schwarz: Σ (a − b)² / b ≥ (Σ |a − b|)² = 4·TV², so λ ≥ 4·n·TV² for every
    alternative. Pooling cells of mass m can hide at most m of the TV, so size for tv − m.
    """
    cells = int((law > 0).sum())
    lam = noncentrality_needed(max(cells - 1, 1), level, power)
    n = lam / (4 * tv**2)
    pooled = float(law[(law > 0) & (n * law < AUDIT_MIN_EXPECTED)].sum())
    n_forbidden = np.log1p(-power) / np.log1p(-tv)  # an alternative with its TV all forbidden
    return int(np.ceil(max(lam / (4 * (tv - pooled) ** 2), n_forbidden))), pooled


@functools.lru_cache(maxsize=64)
def _samplers(scenario_index):
    """Alias samplers of the scenario's draft and target tables, one per position."""
    scenario = audit_scenarios()[scenario_index]
    return [RowSampler(rows) for rows in scenario.draft], [RowSampler(r) for r in scenario.target]


def _scenario_batch(index, n, rng):
    """Drafts (n, gamma) from q, and the target (n, gamma+1, V) and draft rows along them."""
    scenario, (draft_samplers, _) = audit_scenarios()[index], _samplers(index)
    gamma, vocab = scenario.draft.shape[:2]
    path = np.zeros((n, gamma + 1), dtype=np.int64)  # the token before each position
    for i in range(gamma):
        path[:, i + 1] = draft_samplers[i](path[:, i], rng.random(n))
    rows = path + vocab * np.arange(gamma + 1)  # row i·V + prev of the stacked tables
    target_rows = np.take(scenario.target.reshape(-1, vocab), rows, axis=0)
    draft_rows = np.take(scenario.draft.reshape(-1, vocab), rows[:, :gamma], axis=0)
    return target_rows, draft_rows, path[:, 1:].copy()


def _output_problem(result, drafts, vocab):
    """What is wrong with a verify_fn result, or None; then (accepted, tokens) as int64."""
    n, gamma = drafts.shape
    if not isinstance(result, tuple) or len(result) != 2:
        return "did not return a pair (accepted, tokens)", None, None
    accepted, tokens = np.asarray(result[0]), np.asarray(result[1])
    if accepted.shape != (n,) or tokens.shape != (n, gamma + 1):
        return (
            f"returned shapes {accepted.shape}, {tokens.shape}; need {(n,)}, {(n, gamma + 1)}",
            None,
            None,
        )
    if accepted.dtype.kind not in "iu" or tokens.dtype.kind not in "iu":
        return f"returned dtypes {accepted.dtype}, {tokens.dtype}; need integers", None, None
    accepted, tokens = accepted.astype(np.int64), tokens.astype(np.int64)
    if accepted.min() < 0 or accepted.max() > gamma:
        return f"accepted outside [0, {gamma}]", None, None
    kept = np.arange(gamma) < accepted[:, None]
    if np.any(tokens[:, :gamma][kept] != drafts[kept]):
        return "tokens[:accepted] differ from the drafts", None, None
    final = tokens[np.arange(n), accepted]
    if final.min() < 0 or final.max() >= vocab:
        return f"emitted an impossible token (outside [0, {vocab}))", None, None
    if np.any(tokens[np.arange(gamma + 1) > accepted[:, None]] != -1):
        return "tokens after the final one are not -1", None, None
    return None, accepted, tokens


def _completed_codes(index, accepted, tokens, rng):
    """Complete each step to gamma + 1 tokens with fresh target draws; base-V codes (n,)."""
    target_samplers = _samplers(index)[1]
    vocab = target_samplers[0].vocab
    codes = tokens[:, 0].copy()
    for j in range(1, tokens.shape[1]):
        fresh = target_samplers[j](tokens[:, j - 1], rng.random(len(tokens)))
        tokens[:, j] = np.where(j > accepted, fresh, tokens[:, j])
        codes = codes * vocab + tokens[:, j]
    return codes


def _pearson_pooled(counts, law):
    """Pearson's statistic with cells expecting < AUDIT_MIN_EXPECTED pooled: (stat, df)."""
    n = counts.sum()
    expected = n * law
    big = expected >= AUDIT_MIN_EXPECTED
    observed = np.append(counts[big], counts[(law > 0) & ~big].sum())
    expected = np.append(expected[big], expected[(law > 0) & ~big].sum())
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


def _audit_row(verify_fn, index, level, rng):
    """One scenario: draw, verify, check the output, complete, test. A dict for the table."""
    scenario = audit_scenarios()[index]
    law = scenario_law(scenario)
    n, pooled = audit_draws(law, level)
    row = {"scenario": scenario.name, "draws": n, "statistic": np.nan, "critical": np.nan}
    target_rows, draft_rows, drafts = _scenario_batch(index, n, rng)
    try:
        result = verify_fn(target_rows, draft_rows, drafts.copy(), rng)
    except Exception as error:  # the audit reports any failure of the verifier, never crashes
        return row | {"passed": False, "finding": f"raised {type(error).__name__}: {error}"}
    problem, accepted, tokens = _output_problem(result, drafts, target_rows.shape[2])
    if problem:
        return row | {"passed": False, "finding": problem}
    counts = np.bincount(_completed_codes(index, accepted, tokens, rng), minlength=law.size)
    if counts[law == 0].sum():
        return row | {
            "passed": False,
            "finding": f"{counts[law == 0].sum()} outcomes of probability 0",
        }
    stat, df = _pearson_pooled(counts, law)
    critical = float(stats.chi2.isf(level, df)) if df > 0 else np.inf
    verdict = "law matches" if stat <= critical else "law differs from the target's"
    return row | {
        "statistic": stat,
        "critical": critical,
        "passed": stat <= critical,
        "finding": verdict,
    }


class AuditReport(NamedTuple):
    """audit_verifier's answer: passed only if every scenario passed; one table row each."""

    passed: bool
    table: pd.DataFrame


def audit_verifier(verify_fn, seed=0):
    """Run verify_fn on every audit scenario and test the law of what it emits (AuditReport).

    Each scenario tests at AUDIT_LEVEL / #scenarios (Bonferroni), so an exact verifier fails the
    audit with probability ≤ AUDIT_LEVEL; a law off by TV ≥ AUDIT_TV in a scenario fails it
    with probability ≥ AUDIT_POWER (noncentral chi-square, the Cauchy–Schwarz bound).
    """
    if not callable(verify_fn):
        raise TypeError(f"verify_fn must be callable, got {type(verify_fn).__name__}")
    _check_count(seed, "seed")
    rng = np.random.default_rng(seed)
    scenarios = audit_scenarios()
    level = AUDIT_LEVEL / len(scenarios)
    rows = []
    for index, scenario in enumerate(scenarios):
        try:
            rows.append(_audit_row(verify_fn, index, level, rng))
        except Exception as error:  # e.g. a verifier that broke the generator it was handed
            rows.append(
                {"scenario": scenario.name, "passed": False, "finding": f"audit stopped: {error!r}"}
            )
    table = pd.DataFrame(
        rows, columns=["scenario", "draws", "statistic", "critical", "passed", "finding"]
    )
    return AuditReport(bool(table["passed"].all()), table)


# --------------------------------------------------------------------------------------------
# Beyond one draft (chapter 7): several candidates, whole blocks, lossy verifiers
# --------------------------------------------------------------------------------------------
# One position, k candidates: a rule is a state (p_i, q_i, ...) that each rejection updates.
# The exact law enumerates every candidate sequence; the engine runs the same rule on a batch.


def _keep(p_x, q_x):
    """min(1, p(x)/q(x)), and 0 where q(x) = 0: one candidate's acceptance probability."""
    return min(1, p_x / q_x) if q_x > 0 else 0 * p_x


def _zeroed(law, x):
    """law with token x set to 0, not renormalised."""
    out = law.copy()
    out[x] = 0
    return out


def _drop(law, x):
    """law with token x removed and renormalised (law itself if nothing is left)."""
    return _normalise_or(_zeroed(law, x), law)


def _spectr_rho(p, q, k):
    """SpecTr's ρ*: the smallest ρ ≥ 1 with 1 − (1 − β(ρ))^k ≤ ρ·β(ρ), β(ρ) = Σ min(q, p/ρ)."""

    def gap(rho):
        beta = np.minimum(q, p / rho).sum()
        return rho * beta - (1 - (1 - beta) ** k)  # increasing in ρ

    lo, hi = 1 + 0 * p[0], 2 + 0 * p[0]  # the number type of p: Fraction or float
    if gap(lo) >= 0:
        return lo
    while gap(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(60):  # bisection; hi always satisfies the inequality
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gap(mid) >= 0 else (mid, hi)
    return hi


def _spectr_start(p, q, k):
    """SpecTr's state: (p, q, ρ*, c) with c = (1 − (1 − β)^k)/β, the accepted mass per unit."""
    rho = _spectr_rho(p, q, k)
    beta = np.minimum(q, p / rho).sum()
    return p, q, rho, (1 - (1 - beta) ** k) / beta if beta > 0 else 0 * beta


def _spectr_final(state):
    """SpecTr's residual ∝ p − min(q, p/ρ)·c (nonnegative for ρ ≥ ρ*)."""
    p, q, rho, c = state
    return _normalise_or(np.maximum(p - np.minimum(q, p / rho) * c, 0), p)


class MultiDraft(NamedTuple):
    """A verifier of k candidates for one position: how they come, are tested, and end."""

    name: str
    draws: str  # "iid": X_i ~ q; "without": q without the earlier X; "top-k": q's k largest
    accept: Callable  # (state, x) -> probability of keeping candidate x
    reject: Callable  # (state, x) -> the state after x is rejected
    final: Callable  # state -> the law drawn when every candidate is rejected
    start: Callable = lambda p, q, k: (p, q)  # the state before the first candidate
    merges: bool = False  # reject ignores x, so the enumeration can merge rejected branches


MULTI_DRAFT_RULES = {
    "SpecInfer": MultiDraft(  # Miao et al., Alg. 2: p ← norm(max(0, p − q)) after a rejection
        "SpecInfer multi-step (i.i.d.)",
        "iid",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), s[1]),
        lambda s: s[0],
        merges=True,
    ),
    "without replacement": MultiDraft(  # Yang et al.; Jeon et al.: renormalise q as well
        "recursive, without replacement",
        "without",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), _drop(s[1], x)),
        lambda s: s[0],
    ),
    "broken: q not renormalised": MultiDraft(
        "without replacement, q not renormalised",
        "without",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), _zeroed(s[1], x)),
        lambda s: s[0],
    ),
    "EAGLE-2 top-k": MultiDraft(  # q = 1 for the draft's deterministic top-k
        "EAGLE-2 top-k, q = 1",
        "top-k",
        lambda s, x: s[0][x],
        lambda s, x: (_drop(s[0], x), s[1]),
        lambda s: s[0],
    ),
    "SpecTr": MultiDraft(  # Sun et al. 2023: k-sequential selection with ρ*
        "SpecTr k-sequential (i.i.d.)",
        "iid",
        lambda s, x: _keep(s[0][x], s[2] * s[1][x]),
        lambda s, x: s,
        _spectr_final,
        start=_spectr_start,
        merges=True,
    ),
}
EXACT_MULTI_DRAFT = ["SpecInfer", "without replacement", "EAGLE-2 top-k", "SpecTr"]


def _top_k_order(q):
    """Tokens by decreasing q(x), ties by index: the order of deterministic top-k children."""
    return sorted(range(len(q)), key=lambda x: (-q[x], x))


def _next_candidates(draws, q, drawn):
    """[(x, P(next candidate = x))] given the candidates drawn so far."""
    if draws == "iid":
        return [(x, q[x]) for x in range(len(q)) if q[x] > 0]
    if draws == "top-k":
        order = _top_k_order(q)
        return [(order[len(drawn)], 1)] if len(drawn) < len(order) else []
    rest = q.copy()
    rest[list(drawn)] = 0
    z = rest.sum()
    return [(x, rest[x] / z) for x in range(len(q)) if rest[x] > 0]


def multi_draft_law(rule, p, q, k):
    """Exact law of (chosen, token), (k + 1, V): row i keeps candidate i, row k the final draw."""
    table = np.zeros((k + 1, len(p)), dtype=object) + 0 * p[0]

    def walk(i, state, drawn, mass):
        """Add the outcomes after i rejected candidates `drawn`, reached with probability mass."""
        options = _next_candidates(rule.draws, q, drawn) if i < k else []
        if not options:
            table[k] += mass * rule.final(state)
            return
        rejected = 0
        for x, d in options:
            keep = rule.accept(state, x)
            table[i, x] += mass * d * keep
            if rule.merges:
                rejected += d * (1 - keep)
            elif keep != 1:
                walk(i + 1, rule.reject(state, x), drawn + (x,), mass * d * (1 - keep))
        if rule.merges and rejected != 0:
            walk(i + 1, rule.reject(state, None), drawn, mass * rejected)

    walk(0, rule.start(p, q, k), (), 1 + 0 * p[0])
    return table


def multi_draft_acceptance(rule, p, q, k):
    """P(a candidate is kept) = Σ of rows 0..k−1 of multi_draft_law."""
    return multi_draft_law(rule, p, q, k)[:k].sum()


def pair_cover_slack(p, q):
    """min over token sets S (not ∅, not all) of P(X1 or X2 in S) − p(S), X1, X2 i.i.d. q.

    By Hall's theorem an exact rule can always output one of its two candidates iff this is ≥ 0.
    """
    p, q = np.asarray(p, float), np.asarray(q, float)
    if len(p) > 20:
        raise ValueError(f"p has {len(p)} tokens; the 2^V subsets are enumerated only for V <= 20")
    sets = (np.arange(1, 2 ** len(p) - 1)[:, None] >> np.arange(len(p))) & 1  # (2^V − 2, V)
    return float((1 - (1 - sets @ q) ** 2 - sets @ p).min())


def candidate_pair_law(q, draws):
    """Law of the two candidates (X1, X2), (V, V): i.i.d., without replacement, or q's top two."""
    q = np.asarray(q, dtype=float)
    if draws == "iid":
        return np.outer(q, q)
    if draws == "without":
        first = np.where(q < 1, q / np.where(q < 1, 1 - q, 1), 0)  # q(a)/(1 − q(a))
        return np.where(np.eye(len(q), dtype=bool), 0, first[:, None] * q[None, :])
    law = np.zeros((len(q), len(q)))
    a, b = _top_k_order(q)[:2]
    law[a, b] = 1
    return law


def optimal_pair_acceptance(p, pair_law):
    """Max P(output ∈ {X1, X2}) over exact rules: a linear programme over candidate pairs.

    Variables a1[x1, x2], a2[x1, x2] >= 0: the mass of pair (x1, x2) that outputs x1, resp. x2.
    a1 + a2 <= pair_law (per pair), and the kept mass into each token y is at most p(y); the
    rest of p is drawn from norm(p − kept), so every feasible point is an exact rule.
    """
    from scipy.optimize import linprog
    from scipy.sparse import eye, hstack, kron, vstack

    n = len(p)
    pairs = eye(n * n, format="csr")
    first = kron(eye(n), np.ones((1, n)))  # (V, V²): pairs with x1 = y
    second = kron(np.ones((1, n)), eye(n))  # (V, V²): pairs with x2 = y
    constraints = vstack([hstack([pairs, pairs]), hstack([first, second])])
    bounds = np.concatenate([np.asarray(pair_law, float).ravel(), np.asarray(p, float)])
    result = linprog(-np.ones(2 * n * n), A_ub=constraints, b_ub=bounds, method="highs")
    if not result.success:
        raise RuntimeError(f"linprog failed: {result.message}")
    return -float(result.fun)


def _check_multi_draft(target_probs, draft_probs, draft_tokens, replacement):
    """Raise unless the arrays are (B, V), (B, V), (B, k ≥ 1), checked as verify checks them."""
    if target_probs.ndim != 2 or draft_probs.ndim != 2 or draft_tokens.ndim != 2:
        raise ValueError("need target_probs (B, V), draft_probs (B, V), draft_tokens (B, k)")
    (batch, k), vocab = draft_tokens.shape, target_probs.shape[1]
    if target_probs.shape != (batch, vocab) or draft_probs.shape != (batch, vocab) or k < 1:
        raise ValueError(
            f"shapes do not match (k >= 1 needed): target_probs {target_probs.shape}, "
            f"draft_probs {draft_probs.shape}, draft_tokens {draft_tokens.shape}"
        )
    _check_batch(  # the per-array checks of verify, on broadcast views (no copies)
        np.broadcast_to(target_probs[:, None], (batch, k + 1, vocab)),
        np.broadcast_to(draft_probs[:, None], (batch, k, vocab)),
        draft_tokens,
    )
    if not replacement and k > 1:
        ordered = np.sort(draft_tokens, axis=1)
        if np.any(ordered[:, 1:] == ordered[:, :-1]):
            raise ValueError("draft_tokens repeat a token in a row, but replacement=False")


def multi_draft_verify(target_probs, draft_probs, draft_tokens, rng, replacement=True):
    """k candidates for one position: (chosen (B,), tokens (B,)); chosen = −1 for the final draw.

    replacement=True: SpecInfer's multi-step rule for i.i.d. candidates. replacement=False: the
    candidates were drawn without replacement, and q is renormalised after each rejection.
    """
    target_probs, draft_probs = np.asarray(target_probs), np.asarray(draft_probs)
    draft_tokens = np.asarray(draft_tokens)
    _check_multi_draft(target_probs, draft_probs, draft_tokens, replacement)
    _check_rng(rng)
    batch, k = draft_tokens.shape
    rows = np.arange(batch)
    p, q = target_probs.astype(float), draft_probs.astype(float)  # (B, V) each, updated
    chosen = np.full(batch, -1, dtype=np.int64)
    u = rng.random((batch, k))
    for i in range(k):
        x = draft_tokens[:, i]
        open_ = chosen < 0
        keep = open_ & (u[:, i] < _ratio(p[rows, x], q[rows, x]))
        chosen[keep] = i
        still = (chosen < 0)[:, None]
        p = np.where(still, EXACT_RULE.correction_law(p, q), p)  # p ← norm(max(0, p − q))
        if not replacement:
            q = np.where(still, _normalise_or(np.where(np.eye(q.shape[1])[x] > 0, 0, q), q), q)
    tokens = draft_tokens[rows, np.maximum(chosen, 0)]
    final = _sample_rows(p, rng)
    return chosen, np.where(chosen >= 0, tokens, final)


# ---- Block verification (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro & Suresh, 2025) ----


def _path_ratio(target, draft, tokens):
    """p(X_i)/q(X_i) along each draft path, (N, γ); 0 where q(X_i) = 0."""
    gamma = tokens.shape[1]
    p_x = np.take_along_axis(target[:, :gamma], tokens[..., None], axis=2)[..., 0]
    q_x = np.take_along_axis(draft, tokens[..., None], axis=2)[..., 0]
    positive = q_x > 0
    return np.where(positive, p_x / np.where(positive, q_x, 1), 0 * p_x)


def _block_h(target, draft, tokens):
    """Sun et al.'s h_i, (N, γ + 1), and the excess max(p_i·p(· | X^i) − q(· | X^i), 0).

    p_0 = 1, p_i = min(p_{i−1}·p(X_i)/q(X_i), 1); h_i = Z_i/(Z_i + 1 − p_i) with
    Z_i = Σ_x max(p_i·p(x | X^i) − q(x | X^i), 0) for i < γ (0/0 read as 1), h_γ = p_γ.
    """
    n, gamma = tokens.shape
    ratio = _path_ratio(target, draft, tokens)
    weight = [np.ones(n, dtype=target.dtype)]  # p_0 = 1
    for i in range(gamma):
        weight.append(np.minimum(weight[-1] * ratio[:, i], 1))
    weight = np.stack(weight, axis=1)  # (N, γ + 1)
    excess = np.maximum(weight[:, :gamma, None] * target[:, :gamma] - draft, 0)  # (N, γ, V)
    z = excess.sum(axis=2)
    denominator = z + 1 - weight[:, :gamma]
    h = np.where(denominator > 0, z / np.where(denominator > 0, denominator, 1), 1)
    return np.concatenate([h, weight[:, gamma:]], axis=1), excess


def _block_tables(target, draft, tokens):
    """h_i, (N, γ + 1), and the law drawn when τ = i, (N, γ + 1, V): the residual, or p at γ."""
    h, excess = _block_h(target, draft, tokens)
    gamma = tokens.shape[1]
    return h, np.concatenate([_normalise_or(excess, target[:, :gamma]), target[:, gamma:]], axis=1)


def _tau_law_block(h):
    """P(τ = i) = h_i·Π_{j>i} (1 − h_j): τ is the largest i with η_i ≤ h_i, (N, γ + 1)."""
    ones = np.ones((len(h), 1), dtype=h.dtype)
    survive = np.concatenate([np.cumprod(1 - h[:, :0:-1], axis=1)[:, ::-1], ones], axis=1)
    return h * survive


def _per_token_tables(target, draft, tokens, rule=EXACT_RULE):
    """Per-token verification on the same paths: P(τ = i), (N, γ + 1), and the laws drawn."""
    gamma = tokens.shape[1]
    accept, correction = rule.tables(target[:, :gamma], draft)  # (N, γ, V) each
    keep = np.take_along_axis(accept, tokens[..., None], axis=2)[..., 0]  # (N, γ)
    ones = np.ones((len(tokens), 1), dtype=target.dtype)
    reach = np.concatenate([ones, np.cumprod(keep, axis=1)], axis=1)  # (N, γ + 1): P(τ ≥ i)
    stop = reach * np.concatenate([1 - keep, ones], axis=1)
    return stop, np.concatenate([correction, target[:, gamma:]], axis=1)


def block_verify(target_probs, draft_probs, draft_tokens, rng):
    """Block verification of a batch (Sun et al. 2025): accepted (B,), tokens (B, gamma + 1)."""
    target_probs, draft_probs, draft_tokens = _checked_batch(
        target_probs, draft_probs, draft_tokens, rng
    )
    batch, gamma = draft_tokens.shape
    rows = np.arange(batch)
    target_probs = np.asarray(target_probs, dtype=float)
    h, excess = _block_h(target_probs, np.asarray(draft_probs, dtype=float), draft_tokens)
    passed = rng.random((batch, gamma)) < h[:, 1:]  # (B, γ): η_i < h_i
    last = gamma - np.argmax(passed[:, ::-1], axis=1) if gamma else 0  # largest i that passed
    accepted = np.where(passed.any(axis=1), last, 0)
    p_end = target_probs[rows, accepted]  # (B, V)
    if gamma:  # residual max(p_τ·p − q, 0) at τ < γ; p itself at τ = γ
        residual = _normalise_or(excess[rows, np.minimum(accepted, gamma - 1)], p_end)
        p_end = np.where((accepted < gamma)[:, None], residual, p_end)
    return accepted, _emitted(draft_tokens, accepted, _sample_rows(p_end, rng))


class DraftPaths(NamedTuple):
    """Every draft path of one step: tokens (N, γ), their q-probability, and the rows seen."""

    tokens: np.ndarray  # (N, γ)
    prob: np.ndarray  # (N,) Π q(X_i | X^{i−1})
    target: np.ndarray  # (N, γ + 1, V) p(· | X^i)
    draft: np.ndarray  # (N, γ, V) q(· | X^i)


@functools.lru_cache(maxsize=8)
def _all_paths(gamma, vocab):
    """Every draft path of gamma ≥ 1 tokens, (vocab^gamma, gamma), read-only (cached)."""
    _check_count(gamma, "gamma")
    if gamma < 1:
        raise ValueError(f"gamma must be at least 1 for a block, got {gamma}")
    tokens = np.indices((vocab,) * gamma).reshape(gamma, -1).T.copy()
    tokens.flags.writeable = False
    return tokens


def _with_prob(tokens, target, draft):
    """DraftPaths with each path's probability Π q(X_i | X^{i−1})."""
    picked = np.take_along_axis(draft, tokens[..., None], axis=2)[..., 0]
    return DraftPaths(tokens, np.prod(picked, axis=1), target, draft)


def draft_paths(target_row, draft_row, gamma, vocab):
    """DraftPaths of autoregressive models given as functions prefix (tuple) -> row (V,)."""
    tokens = _all_paths(gamma, vocab)
    target = np.array([[target_row(tuple(t[:i])) for i in range(gamma + 1)] for t in tokens])
    draft = np.array([[draft_row(tuple(t[:i])) for i in range(gamma)] for t in tokens])
    return _with_prob(tokens, target, draft)


def step_outcomes(paths, block=True):
    """P(τ = i) per path, (N, γ + 1), and the laws drawn, (N, γ + 1, V): block or per token."""
    if block:
        h, laws = _block_tables(paths.target, paths.draft, paths.tokens)
        return _tau_law_block(h), laws
    return _per_token_tables(paths.target, paths.draft, paths.tokens)


def expected_accepted(paths, block=True):
    """E[τ]: the expected number of accepted draft tokens in one step."""
    tau, _ = step_outcomes(paths, block)
    return (paths.prob[:, None] * tau * np.arange(tau.shape[1])).sum()


def step_law(paths, block=True):
    """Law of the tokens one step emits, {tuple: probability}: the kept drafts, then one more."""
    tau, laws = step_outcomes(paths, block)
    law = defaultdict(int)
    for tokens, mass, stops, finals in zip(paths.tokens, paths.prob, tau, laws):
        for i, stop in enumerate(stops):
            if stop != 0:
                for y, prob in enumerate(finals[i]):
                    law[(*tokens[:i], y)] += mass * stop * prob
    return dict(law)


def completed_law(law, target_row, length):
    """{tuple of `length` tokens: probability}: each emitted string completed by target draws."""
    out = defaultdict(int)
    todo = list(law.items())
    while todo:
        prefix, mass = todo.pop()
        if len(prefix) == length:
            out[prefix] += mass
        else:
            todo.extend((prefix + (y,), mass * pr) for y, pr in enumerate(target_row(prefix)))
    return dict(out)


def toy_completed_law(w, gamma, ctx=BOS, block=True, exact=True):
    """(law, reference), each (V,)·(γ + 1): one step from ctx completed by target draws, and p's.

    The emitted strings of length i + 1 are summed over the drafts after position i, then each
    is extended by the bigram target to γ + 1 tokens (an array version of completed_law).
    """
    paths, _ = toy_block_paths(w, gamma, ctx, exact)
    p, _ = model_matrices(w, exact)
    tau, laws = step_outcomes(paths, block)
    weighted = paths.prob[:, None, None] * tau[:, :, None] * laws  # (N, γ + 1, V)
    law = 0
    for i in range(gamma + 1):
        part = weighted[:, i].reshape((V,) * i + (V ** (gamma - i), V)).sum(axis=i)
        for _ in range(gamma - i):  # complete: next token from p(· | last token)
            part = part[..., None] * p[1:]
        law = law + part
    reference = p[CONTEXT_INDEX[ctx]]
    for _ in range(gamma):
        reference = reference[..., None] * p[1:]
    return law, reference


def ideal_block_bound(paths, target_row):
    """Σ_i Σ_{x^i} min(P_q(x^i), P_p(x^i)): no exact verifier keeps more drafts on average."""
    gamma = paths.tokens.shape[1]
    total = 0
    for i in range(1, gamma + 1):
        q_prefix, p_prefix = defaultdict(int), {}
        for tokens, mass in zip(paths.tokens, paths.prob):
            q_prefix[tuple(tokens[:i])] += mass
        for prefix in q_prefix:
            p_prefix[prefix] = np.prod([target_row(prefix[:j])[prefix[j]] for j in range(i)])
        total += sum(min(q_prefix[s], p_prefix[s]) for s in q_prefix)
    return total


def binary_example():
    """Sun et al.'s example: q = (2/3, 1/3), p = (1/3, 2/3) at every position, γ = 2."""
    p = np.array([Fraction(1, 3), Fraction(2, 3)], dtype=object)
    q = np.array([Fraction(2, 3), Fraction(1, 3)], dtype=object)
    return draft_paths(lambda prefix: p, lambda prefix: q, 2, 2), (lambda prefix: p)


def toy_rows(w, ctx=BOS, exact=True):
    """(target_row, draft_row) of the toy after ctx: functions of the drafted prefix."""
    p, q = model_matrices(w, exact)

    def row(matrix):
        return lambda prefix: matrix[CONTEXT_INDEX[VOCAB[prefix[-1]]] if prefix else ctx_row]

    ctx_row = CONTEXT_INDEX[ctx]
    return row(p), row(q)


def toy_block_paths(w, gamma, ctx=BOS, exact=True):
    """DraftPaths of the toy from ctx (built by indexing the tables), and its target_row."""
    _check_context(ctx)
    p, q = model_matrices(w, exact)
    tokens = _all_paths(gamma, V)
    start = np.full((len(tokens), 1), CONTEXT_INDEX[ctx])
    rows = np.concatenate([start, tokens + 1], axis=1)  # (N, γ + 1) context row at each position
    return _with_prob(tokens, p[rows], q[rows[:, :gamma]]), toy_rows(w, ctx, exact)[0]


def random_pair_gains(n_pairs, gamma=3, vocab=3, seed=0, concentration=0.5):
    """E[τ] block − E[τ] per token for n_pairs random autoregressive (p, q), (n_pairs,).

    Each model has its own Dirichlet(concentration) row for every prefix of length ≤ gamma.
    """
    _check_count(n_pairs, "n_pairs")
    rng = np.random.default_rng(seed)
    tokens = _all_paths(gamma, vocab)  # (N, γ)
    codes = np.zeros((len(tokens), gamma + 1), dtype=np.int64)  # prefix id at each position
    for i in range(gamma):  # prefix ids: 1 + base-vocab code, offset by length
        codes[:, i + 1] = codes[:, i] * vocab + tokens[:, i] + 1
    n_prefixes = int(codes.max()) + 1
    rows = rng.dirichlet(np.full(vocab, concentration), (n_pairs, 2, n_prefixes))
    target = rows[:, 0][:, codes].reshape(-1, gamma + 1, vocab)  # (n_pairs·N, γ + 1, V)
    draft = rows[:, 1][:, codes[:, :gamma]].reshape(-1, gamma, vocab)
    paths = _with_prob(np.tile(tokens, (n_pairs, 1)), target, draft)
    gains = [step_outcomes(paths, block)[0] * np.arange(gamma + 1) for block in (True, False)]
    per_path = paths.prob * (gains[0] - gains[1]).sum(axis=1)
    return per_path.reshape(n_pairs, -1).sum(axis=1)


def _lazy_stationary(kernel):
    """A stationary law of kernel, by power iteration on (kernel + I)/2, aperiodic by design."""
    return _stationary((kernel + np.eye(len(kernel))) / 2)


def _chain_tokens_per_call(start_outcomes):
    """Long-run tokens per call from {context row c: (P(τ = i, last = y | c) (γ+1, V))}."""
    kernel = np.array([start_outcomes[c].sum(axis=0) for c in range(1, len(CONTEXTS))])
    tokens = np.array(
        [
            (start_outcomes[c].sum(axis=1) * np.arange(1, start_outcomes[c].shape[0] + 1)).sum()
            for c in range(1, len(CONTEXTS))
        ]
    )
    return float(_lazy_stationary(kernel) @ tokens)


def toy_tokens_per_call(w, gamma, block=True):
    """Exact long-run tokens per target call on the toy (float): per-token or block verification."""
    _check_unit_interval(w, "w")
    _check_count(gamma, "gamma")
    outcomes = {}
    for c, ctx in enumerate(CONTEXTS[1:], start=1):
        paths, _ = toy_block_paths(w, gamma, ctx, exact=False)
        tau, laws = step_outcomes(paths, block)
        outcomes[c] = np.einsum("n,ni,niv->iv", paths.prob, tau, laws)  # (γ + 1, V)
    return _chain_tokens_per_call(outcomes)


# ---- Lossy verifiers: rules that keep more than min(1, p/q) allows -------------------------
# Their accept functions read whole rows (…, V), so they serve Rule.tables (exact analysis).


def _entropy(p):
    """H(p) = −Σ p log p along the last axis, (…, 1)."""
    logs = np.log(np.where(p > 0, p, 1))
    return -(p * logs).sum(axis=-1, keepdims=True)


def _argmax_one_hot(p):
    """The one-hot law at argmax p (first index on ties)."""
    return np.eye(p.shape[-1])[np.argmax(p, axis=-1)]


def _medusa_threshold(p, scale=1.0):
    """min(ε, δ·e^{−H(p)}) of rows p, (…, 1); (ε, δ) = scale·(0.09, 0.3), Medusa's."""
    return np.minimum(0.09 * scale, 0.3 * scale * np.exp(-_entropy(p)))


def medusa_rule(scale=1.0):
    """Medusa's rule: keep x iff p(x) > min(ε, δ·e^{−H(p)}), else draw argmax p."""
    return Rule(
        f"Medusa typical, scale {scale:g}",
        accept=lambda p, q: (p > _medusa_threshold(p, scale)) * 1.0,
        correction=lambda p, q: _argmax_one_hot(p),
    )


def threshold_rule(tau):
    """Keep x iff p(x) ≥ τ, in place of the ratio test; on rejection, the residual."""
    return Rule(f"p(x) ≥ {tau:g}", accept=lambda p, q: (p >= tau) * 1.0)


def loosened_rule(t):
    """Thresholds t < 1: keep w.p. min(1, ratio/t), or surely if p(x) ≥ t."""
    return Rule(
        f"thresholds {t:g}",
        accept=lambda p, q: np.maximum(np.minimum(1, _ratio(p, q) / t), (p >= t) * 1.0),
    )


LOSSY_KNOBS = {  # rule family, knob values from lossy to exact (or least lossy)
    "Medusa typical (ε, δ)·s": (medusa_rule, [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]),
    "p(x) ≥ τ": (threshold_rule, [0.02, 0.04, 0.06, 0.1, 0.15, 0.2, 0.3]),
    "thresholds t < 1": (loosened_rule, [0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0]),
}


def rule_tokens_per_call(w, gamma, rule=EXACT_RULE):
    """Exact long-run tokens per target call of a per-token Rule on the toy (float)."""
    _check_unit_interval(w, "w")
    _check_count(gamma, "gamma")
    p, q = P_MATRIX[1:], draft_matrix(w)[1:]  # (18, 18): token contexts
    accept, correction = rule.tables(p, q)
    keep = q * accept  # draft kept, token -> next token
    reject = 1 - keep.sum(axis=1)
    reach, kernel, tokens = np.eye(V), np.zeros((V, V)), np.ones(V)
    for _ in range(gamma):
        kernel += (reach * reject) @ correction
        reach = reach @ keep
        tokens += reach.sum(axis=1)
    kernel += reach @ p
    return float(_lazy_stationary(kernel) @ tokens)


def rule_output_tv(w, gamma, rule, k=2):
    """TV between the law of the first k tokens from BOS under rule, and the target's."""
    law = speculative_law(k, gamma, w, BOS, rule=rule, exact=False)
    return float(law_tv(law, target_joint(k, BOS, exact=False)))


def lossy_frontier(w=0.3, gamma=3):
    """Rows (family, knob, tokens per call, TV) for every lossy knob value, at (w, γ)."""
    rows = []
    for family, (make, knobs) in LOSSY_KNOBS.items():
        for knob in knobs:
            rule = make(knob)
            rows.append(
                (family, knob, rule_tokens_per_call(w, gamma, rule), rule_output_tv(w, gamma, rule))
            )
    return rows


# ---- Greedy and strict verification as special cases ----------------------------------------


def strict_alpha(w):
    """Strict sampler-match verification: keep x iff x = y, y ~ p fresh; α = Σ_c π(c)·Σ p·q_w."""
    return float(PI_P_VECTOR @ (P_MATRIX[1:] * draft_matrix(w)[1:]).sum(axis=1))


# ---- Chapter 7's experiments and figures ----------------------------------------------------

MD_CTX, MD_W = "t", Fraction(3, 10)  # the one position of the multi-draft tables
MD_KS = (1, 2, 3, 4)
MD_FRACTION_LIMIT = 3  # rules that branch per candidate run in Fractions up to this k
BLOCK_GAMMA = 3
BLOCK_WEIGHTS = [0.0, 0.3, 0.6, 0.9, 1.0]
RANDOM_PAIRS = 2000


def multi_draft_rows(ctx=MD_CTX, w=MD_W, ks=MD_KS):
    """Per rule and k: acceptance, max |law − p|, TV(law, p), and whether it ran in Fractions."""
    rows = []
    for key, rule in MULTI_DRAFT_RULES.items():
        for k in ks:
            exact = rule.merges or rule.draws == "top-k" or k <= MD_FRACTION_LIMIT
            p, q = (m[CONTEXT_INDEX[ctx]] for m in model_matrices(w, exact))
            table = multi_draft_law(rule, p, q, k)
            gap = np.abs(table.sum(axis=0) - p)
            rows.append(
                {
                    "rule": key,
                    "k": k,
                    "acceptance": float(table[:k].sum()),
                    "max |Δ|": float(gap.max()),
                    "TV": float(gap.sum() / 2),
                    "Fractions": bool(exact),
                }
            )
    return rows


def pair_optima(ctx=MD_CTX, w=MD_W):
    """The LP optimum for k = 2 under each way of drawing the pair: {draws: acceptance}."""
    p, q = (m[CONTEXT_INDEX[ctx]] for m in model_matrices(w, exact=False))
    return {
        d: optimal_pair_acceptance(p, candidate_pair_law(q, d)) for d in ("iid", "without", "top-k")
    }


def block_sweep(weights=BLOCK_WEIGHTS, gamma=BLOCK_GAMMA):
    """{w: (per-token, block)} exact long-run tokens per call on the toy."""
    return {w: (rule_tokens_per_call(w, gamma), toy_tokens_per_call(w, gamma)) for w in weights}


SHORT_NAMES = {  # legend labels that fit a phone
    "without replacement": "without repl.",
    "broken: q not renormalised": "broken (q not renorm.)",
    "Medusa typical (ε, δ)·s": "Medusa (ε, δ)·s",
    "thresholds t < 1": "thresholds t",
}


def plot_multi_draft_acceptance(rows, optima):
    """Acceptance against k per multi-draft rule, LP optima as stars; below, minus SpecInfer's."""
    fig, (ax, gap) = _new_figure(
        nrows=2, figsize=(6.4, 7.8), gridspec_kw={"height_ratios": [3, 2], "hspace": 0.5}
    )
    base = {r["k"]: r["acceptance"] for r in rows if r["rule"] == "SpecInfer"}
    for key, marker in zip(MULTI_DRAFT_RULES, ["o", "s", "v", "D", "^"]):
        mine = [r for r in rows if r["rule"] == key]
        dash = ":" if key.startswith("broken") else "-"
        x, y = [r["k"] for r in mine], [r["acceptance"] for r in mine]
        (line,) = ax.plot(x, y, dash, marker=marker, label=SHORT_NAMES.get(key, key))
        if key != "EAGLE-2 top-k":  # far below the others: it would flatten the panel
            excess = [a - base[k] for k, a in zip(x, y)]
            gap.plot(x, excess, dash, marker=marker, color=line.get_color())
    ax.plot(
        [2, 2],
        [optima["iid"], optima["top-k"]],
        "*",
        color="black",
        markersize=15,
        label="LP optimum, k = 2",
    )
    title = f"k drafts at '{MD_CTX}', w = {float(MD_W):g}"
    ax.set(xlabel="candidates k", ylabel="P(a candidate is kept)", title=title)
    gap.set(xlabel="candidates k", ylabel="difference", title="Acceptance minus SpecInfer's")
    for axes in (ax, gap):
        axes.set_xticks(list(MD_KS))
    fig.legend(loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.1))
    return fig


def plot_block_gains(gains):
    """Histogram of E[accepted] block − per token over random pairs."""
    fig, ax = _new_figure()
    ax.hist(gains, bins=40, color=OKABE_ITO[0])
    ax.axvline(0, color="black", linewidth=1)
    ax.set(
        xlabel="gain in kept drafts per step",
        ylabel="random pairs",
        title=f"Block − per-token, {len(gains):,} pairs",
    )
    return fig


def plot_block_tokens_vs_w(sweep, gamma=BLOCK_GAMMA):
    """Exact tokens per call against w: per-token as a line, block as markers and dashes."""
    fig, ax = _new_figure()
    grid = np.linspace(0, 1, 51)
    ax.plot(
        grid, [rule_tokens_per_call(w, gamma) for w in grid], color=OKABE_ITO[0], label="per-token"
    )
    ax.plot(list(sweep), [b for _, b in sweep.values()], "s--", color=OKABE_ITO[1], label="block")
    ax.set(
        xlabel="draft weight w",
        ylabel="tokens per target call",
        title=f"Exact tokens per call, γ = {gamma}",
    )
    ax.legend()
    return fig


def plot_lossy_frontier(rows, exact_points):
    """Tokens per call against TV from p: lossy knobs as marked lines, exact rules at TV = 0."""
    fig, ax = _new_figure(figsize=(6.4, 5.2))
    for family, marker, dash in zip(LOSSY_KNOBS, ["o", "s", "^"], ["-", "--", ":"]):
        mine = [r for r in rows if r[0] == family]
        x, y = [r[3] for r in mine], [r[2] for r in mine]
        ax.plot(x, y, dash, marker=marker, label=SHORT_NAMES.get(family, family))
    for (name, value), colour in zip(exact_points.items(), [OKABE_ITO[7], OKABE_ITO[3]]):
        ax.plot([0], [value], "*", markersize=16, color=colour, label=name)
    ax.set(
        xlabel="TV of the first two tokens from p",
        ylabel="tokens per target call",
        title="Lossy verifiers: speed against error",
    )
    fig.legend(loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.22))
    return fig


# --------------------------------------------------------------------------------------------
# The book's experiments: each seeded, so two builds give the same numbers
# --------------------------------------------------------------------------------------------

N_DRAWS = 200_000
SEEDS = {
    "sampling": 11,
    "one_token": 12,
    "joint": 13,
    "sweep": 14,
    "noise": 15,
    "literal": 17,
    "trace": 18,
    "race_replicates": 19,
}
SWEEP_WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
SWEEP_CHAINS = 200  # independent chains per weight in the sweep


def sampling_check(ctx="t", n_draws=N_DRAWS, seed=SEEDS["sampling"]):
    """Comparison of n_draws vectorised draws from p(· | ctx) against p."""
    tokens = sample_tokens(n_draws, ctx, np.random.default_rng(seed))
    return compare(tokens[:, None], target_joint(1, ctx, exact=False))


def one_token_check(rule=EXACT_RULE, n_draws=N_DRAWS, seed=SEEDS["one_token"]):
    """Comparison of the first token of gamma = 1 steps from 't' at w = 0.3 against p(· | t)."""
    tokens = simulate_prefixes(n_draws, 1, 1, 0.3, "t", np.random.default_rng(seed), rule)
    return compare(tokens, target_joint(1, "t", exact=False))


def joint_check(rule=EXACT_RULE, n_draws=N_DRAWS, seed=SEEDS["joint"]):
    """Comparison of the first two tokens from BOS (gamma = 2, w = 0.3) against the target joint."""
    tokens = simulate_prefixes(n_draws, 2, 2, 0.3, BOS, np.random.default_rng(seed), rule)
    return compare(tokens, target_joint(2, BOS, exact=False))


def acceptance_sweep(gamma=4, n_tokens=N_DRAWS, n_chains=SWEEP_CHAINS, seed=SEEDS["sweep"]):
    """{w: RunTotals} for w in SWEEP_WEIGHTS, each of n_tokens over n_chains chains from BOS."""
    _check_count(n_tokens, "n_tokens")
    _check_positive_count(n_chains, "n_chains")
    _check_count(seed, "seed")
    per_chain = -(-n_tokens // n_chains)  # ceil: at least n_tokens in all
    rng = np.random.default_rng(seed)
    return simulate_generation(n_chains, per_chain, gamma, SWEEP_WEIGHTS, rng)


def control_rows(alpha=1e-3):
    """Per verifier, correct or broken: the joint test (passes if p > alpha) and the exact error."""
    _check_unit_interval(alpha, "alpha")
    target = target_joint(2, BOS)
    rows = []
    for name, rule in [("correct rule", EXACT_RULE), *BROKEN_RULES.items()]:
        sampled = joint_check(rule)
        law = speculative_law(2, 2, Fraction(3, 10), BOS, rule=rule)
        rows.append(
            {
                "verifier": name,
                "sampled TV": sampled.tv,
                "chi-square": sampled.chi_square,
                "p-value": sampled.p_value,
                "passes": sampled.p_value > alpha,
                "exact TV": float(law_tv(law, target)),
                "exact max |Δ|": float(law_difference(law, target)),
            }
        )
    return rows


# What the article reports, for side-by-side tables (its own random streams, so only the size of
# a noise-driven number is comparable, not its digits).
ARTICLE = {
    "sampling_max_gap": 0.00076,
    "one_token_max_gap": 0.00146,
    "joint_tv": 0.01523,
    "alpha_w0": 0.726,
    "tokens_w0": 2.92,
    "tokens_w1": 5.0,
    "tokens_w09": 4.7336,
    "speedup_w09_c010": 3.381,
    "speedup_w09_c025": 2.367,
    "speedup_w0_c010": 2.080,
    "speedup_w0_c025": 1.456,
    "pairs_seen": 324,
    "acceptance_gap_bound": 0.004,
    "tokens_gap_bound": 0.01,
}

# Measured α of real draft/target pairs, Leviathan et al. Table 3 (temperature 0, temperature 1).
REAL_PAIR_ALPHAS = [
    ("GPT-like 97M", "unigram", 0.03, 0.03),
    ("GPT-like 97M", "bigram", 0.05, 0.05),
    ("GPT-like 97M", "GPT-like 6M", 0.88, 0.89),
    ("T5-XXL EnDe", "unigram", 0.08, 0.07),
    ("T5-XXL EnDe", "bigram", 0.20, 0.19),
    ("T5-XXL EnDe", "T5-small", 0.75, 0.62),
    ("T5-XXL EnDe", "T5-base", 0.80, 0.68),
    ("T5-XXL EnDe", "T5-large", 0.82, 0.71),
    ("T5-XXL CNNDM", "unigram", 0.13, 0.08),
    ("T5-XXL CNNDM", "bigram", 0.23, 0.16),
    ("T5-XXL CNNDM", "T5-small", 0.65, 0.53),
    ("T5-XXL CNNDM", "T5-base", 0.73, 0.55),
    ("T5-XXL CNNDM", "T5-large", 0.74, 0.56),
    ("LaMDA 137B", "LaMDA 100M", 0.61, 0.57),
    ("LaMDA 137B", "LaMDA 2B", 0.71, 0.71),
    ("LaMDA 137B", "LaMDA 8B", 0.75, 0.74),
]

# Leviathan et al. Table 1 (c = ĉ = 0): (α, γ) -> (increase in operations, speed) as printed.
TABLE1 = {
    (0.6, 2): (1.53, 1.96),
    (0.7, 3): (1.58, 2.53),
    (0.8, 2): (1.23, 2.44),
    (0.8, 5): (1.63, 3.69),
    (0.9, 2): (1.11, 2.71),
    (0.9, 10): (1.60, 6.86),
}

# Leviathan et al. Table 2 (T5-XXL, T5-small draft): (task, temperature, gamma, alpha, speedup).
TABLE2 = [
    ("EnDe", 0, 7, 0.75, 3.4),
    ("EnDe", 1, 7, 0.62, 2.6),
    ("CNNDM", 0, 5, 0.65, 3.1),
]

# Speedups other systems report for themselves (each cited in chapter 5): (system, draft, claim).
REPORTED_SYSTEMS = [
    ("Leviathan et al. (T5-XXL)", "smaller T5 checkpoint", "2×–3× walltime, identical outputs"),
    ("Chen et al. (Chinchilla 70B)", "4B model, K = 4", "2–2.5× decoding"),
    ("Medusa-1 / Medusa-2", "extra decoding heads, tree attention", "over 2.2× / 2.3–3.6×"),
    ("EAGLE (LLaMA2-Chat 70B)", "drafting on the target's features", "2.7–3.5× latency"),
    ("Draft & Verify (LLaMA-2)", "the target with layers skipped", "up to 1.99×"),
    (
        "Lookahead decoding",
        "n-grams from the target itself, no draft model",
        "up to 1.8× (MT-bench), up to 4× (multi-GPU code)",
    ),
    ("gpt-fast", "CodeLlama-7B for CodeLlama-34B", "about 2× tokens/s"),
    ("gpt-fast", "TinyLlama-1B for Llama-7B", "about 1.3× tokens/s"),
    (
        "vLLM, low load",
        "draft model (ShareGPT) / n-gram (CNN/DailyMail)",
        "up to 1.5× / up to 2.8×",
    ),
    ("vLLM, high load", "the same", "slower than without speculation"),
]


# --------------------------------------------------------------------------------------------
# Figures: one look for the whole book
# --------------------------------------------------------------------------------------------

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
BOOK_STYLE = {  # sized to be read on a phone: a 6.4-inch figure shows at 342 px wide there
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,  # displayed at 100 px per inch, stored at 200 (retina PNG, below)
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 14,
    "axes.titlesize": 14.5,
    "axes.labelsize": 14,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 11.5,
    "lines.linewidth": 2,
    "lines.markersize": 7,
    "svg.hashsalt": "exact-by-construction",
    "axes.prop_cycle": __import__("cycler").cycler(color=OKABE_ITO),
}


def show_token(tok):
    """A token as printed in figures and tables: the space as '␣'."""
    return "␣" if tok == " " else tok


def _use_retina_png():
    """In a notebook, show figures as PNG at twice their display resolution (sharp on phones)."""
    from IPython import get_ipython
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    if get_ipython() is not None:
        set_matplotlib_formats("retina")


def _new_figure(ncols=1, nrows=1, figsize=None, **kwargs):
    """A figure in the book's style, kept out of pyplot: it shows only where it is displayed."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    mpl.rcParams.update(BOOK_STYLE)
    _use_retina_png()
    fig = Figure(figsize=figsize)  # not registered with pyplot, so a folded cell shows no copy
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _token_axis(ax, labels=VOCAB, axis="x"):
    """Label an axis with the tokens, space shown as '␣'."""
    ticks, names = range(len(labels)), [show_token(t) for t in labels]
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, names)


def _legend_on_top(ax, ncol=2):
    """A legend in head room added above the data."""
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)
    ax.legend(ncol=ncol, loc="upper right")


def plot_target_heatmap(label_above=0.15):
    """Heatmap of the 19 × 18 target probabilities p(x | ctx); cells ≥ label_above carry values."""
    fig, ax = _new_figure(figsize=(6.4, 6.4))
    image = ax.imshow(P_MATRIX, cmap="viridis")
    for (i, j), prob in np.ndenumerate(P_MATRIX):
        if prob >= label_above:
            ax.text(j, i, f"{prob:.2f}"[1:], ha="center", va="center", fontsize=10)
    _token_axis(ax)
    _token_axis(ax, CONTEXTS, axis="y")
    ax.grid(False)
    ax.set(xlabel="next token x", ylabel="context (previous token)", title="Target p(x | context)")
    fig.colorbar(image, ax=ax, shrink=0.7, label="probability")
    return fig


def plot_draft_mixture(ctx="t", weights=(0.0, 0.3, 0.7, 1.0)):
    """Markers of q_w(· | ctx) for several w, from the unigram (w = 0) to the target (w = 1)."""
    _check_context(ctx)
    fig, ax = _new_figure()
    x, shift = np.arange(V), 0.6 / len(weights)
    for i, (w, marker) in enumerate(zip(weights, "os^D")):
        label = f"w = {w:g}" + {0.0: " (unigram q0)", 1.0: " (target p)"}.get(w, "")
        ax.plot(
            x + (i - (len(weights) - 1) / 2) * shift,
            draft_matrix(w)[CONTEXT_INDEX[ctx]],
            marker,
            markersize=6,
            label=label,
        )
    _token_axis(ax)
    ax.set(
        xlabel="token x",
        ylabel=f"q_w(x | {show_token(ctx)})",
        title=f"The draft after '{show_token(ctx)}' as w moves from 0 to 1",
    )
    _legend_on_top(ax)
    return fig


def plot_residuals(comparison, title):
    """Frequency − exact probability per outcome (×1000), with the ±2σ band, σ = √(p(1 − p)/n)."""
    fig, ax = _new_figure()
    x = np.arange(len(comparison.labels))
    gap, band = 1000 * (comparison.empirical - comparison.exact), 2000 * comparison.sigma
    ax.fill_between(x, -band, band, step="mid", color="grey", alpha=0.25, label="±2σ band")
    ax.axhline(0, color="black", linewidth=0.8)
    inside = np.abs(gap) <= band
    ax.plot(x[inside], gap[inside], "o", color=OKABE_ITO[0], label="inside the band")
    ax.plot(x[~inside], gap[~inside], "X", color=OKABE_ITO[3], markersize=9, label="outside")
    ax.set_xticks(x, [show_token(s) for s in comparison.labels])
    ax.set(xlabel="token x", ylabel="(frequency − p) × 1000", title=title)
    _legend_on_top(ax, ncol=3)
    return fig


STEP_STYLE = {  # the colours of Leviathan et al.'s illustration, and a hatch for each kind
    "accepted": {"facecolor": OKABE_ITO[2], "hatch": ""},
    "rejected": {"facecolor": OKABE_ITO[3], "hatch": "xx"},
    "resampled": {"facecolor": OKABE_ITO[0], "hatch": ".."},
    "bonus": {"facecolor": OKABE_ITO[5], "hatch": "//"},
    "not tested": {"facecolor": "white", "hatch": "", "linestyle": "--"},
}


def plot_step_trace(steps):
    """Each step of a run as a row of boxes: accepted, rejected, resampled, bonus, not tested."""
    from matplotlib.patches import Patch, Rectangle

    fig, ax = _new_figure(figsize=(6.4, 0.65 * len(steps) + 1.9))
    for row, step in enumerate(steps):
        for col, (token, kind) in enumerate(step.boxes):
            style = STEP_STYLE[kind]
            ax.add_patch(Rectangle((col + 0.05, row - 0.4), 0.9, 0.8, edgecolor="black", **style))
            ax.text(
                col + 0.5, row, show_token(token), ha="center", va="center", fontsize=15,
                color="grey" if kind == "not tested" else "black",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "linewidth": 0},
            )  # fmt: skip
    width = max(len(step.boxes) for step in steps)
    ax.set(xlim=(0, width), ylim=(len(steps) - 0.5, -0.5))
    ax.set_xticks([])
    ax.set_yticks(range(len(steps)), [f"{i + 1}" for i in range(len(steps))])
    ax.grid(False)
    ax.spines[["left", "bottom"]].set_visible(False)
    ax.set(xlabel="the step's tokens, left to right", ylabel="step")
    ax.set_title(f"{len(steps)} speculative steps, γ = {len(steps[0].draft)}")
    handles = [Patch(edgecolor="black", label=kind, **style) for kind, style in STEP_STYLE.items()]
    ax.legend(handles=handles, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    return fig


def plot_two_paths(ctx="t", w=0.3):
    """Per token: min(p, q) kept directly plus max(0, p − q) from the residual, against p and q."""
    _check_context(ctx)
    p, q = P_MATRIX[CONTEXT_INDEX[ctx]], draft_matrix(w)[CONTEXT_INDEX[ctx]]
    kept, moved = np.minimum(p, q), _residual_weights(p, q)
    fig, ax = _new_figure()
    x = np.arange(V)
    ax.bar(x, kept, color=OKABE_ITO[0], label="min(p, q): drafted, kept")
    ax.bar(x, moved, bottom=kept, color=OKABE_ITO[1], hatch="//", label="max(0, p − q): residual")
    ax.plot(x, p, "_", color="black", markersize=14, markeredgewidth=2.5, label="p (target)")
    ax.plot(x, q, "o", color=OKABE_ITO[4], markersize=5, label="q (draft)")
    _token_axis(ax)
    ax.set(
        xlabel="token x",
        ylabel="probability",
        title=f"Two paths to each token after '{show_token(ctx)}' (w = {w:g})",
    )
    _legend_on_top(ax)
    return fig


def plot_joint_difference(comparison, limit=4):
    """Heatmap of (count − n·p)/√(n·p) over the 18 × 18 two-token outcomes after BOS."""
    z = comparison.pearson_residuals.reshape(V, V)
    fig, ax = _new_figure(figsize=(6.4, 5.6))
    image = ax.imshow(z, cmap="RdBu_r", vmin=-limit, vmax=limit)
    _token_axis(ax)
    _token_axis(ax, axis="y")
    ax.grid(False)
    ax.set(
        xlabel="second token x₂",
        ylabel="first token x₁",
        title=f"Standardised residuals, first two tokens after {BOS}",
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label="(count − n·p) / √(n·p)")
    return fig


def plot_controls(rows, noise_q95):
    """Total variation of each verifier's 200,000-draw sample on a log axis, against noise."""
    fig, ax = _new_figure()
    names = [r["verifier"] for r in rows]
    tvs = [r["sampled TV"] for r in rows]
    for name, tv, row in zip(names, tvs, rows):
        passes = row["passes"]
        ax.barh(
            name,
            tv,
            color=OKABE_ITO[2] if passes else OKABE_ITO[3],
            hatch="" if passes else "xx",
            label="passes the test" if passes else "fails the test",
        )
    ax.axvline(noise_q95, color="black", linestyle="--", label="95 % of noise-only TVs")
    ax.set_xscale("log")
    ticks = [0.01, 0.02, 0.05, 0.1, 0.2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks], minor=False)
    ax.set_xticks([], minor=True)
    ax.set_xlim(0.01, 0.4)
    ax.invert_yaxis()
    ax.set(
        xlabel="total variation to the target joint (log scale)",
        ylabel="verifier",
        title="The same test on the correct rule and four broken ones",
    )
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.4, -0.2))
    return fig


DASHES = ["-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)), (0, (3, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def _series(i, n_points=None):
    """Style of the i-th line: colour, dash and marker, so lines differ without colour."""
    style = {"color": OKABE_ITO[i % 7], "linestyle": DASHES[i % 6], "marker": MARKERS[i % 7]}
    if n_points:  # a marker every sixth of the line, staggered so markers do not pile up
        step = max(1, n_points // 6)
        style["markevery"] = ((i * step) // 7 % step, step)
    return style


def sweep_standard_errors(run, w, gamma):
    """(s.e. of accepted/test, s.e. of tokens/step) at w; tests and steps as i.i.d.

    Tests: √(α(1 − α)/tests). Steps: s.d. of Eq. (1)'s capped geometric / √steps.
    """
    alpha = alpha_exact(w)
    counts = np.arange(1, gamma + 2)  # 1 .. γ + 1 tokens per step
    probs = np.append(alpha ** np.arange(gamma) * (1 - alpha), alpha**gamma)  # (γ + 1,)
    sd = np.sqrt(max(probs @ counts**2 - (probs @ counts) ** 2, 0.0))
    se_rate = np.sqrt(alpha * (1 - alpha) / run.tests)
    return float(se_rate), float(sd / np.sqrt(run.steps))


def plot_sweep_residuals(sweep, gamma=4):
    """Measured − exact chain value over the sweep, in standard errors, with the ±2 band."""
    fig, ax = _new_figure()
    weights = [w for w in sweep if w < 1]  # at w = 1 every test passes: no noise to scale by
    z_rate, z_tokens = [], []
    for w in weights:
        run, chain = sweep[w], chain_stats(w, gamma)
        se_rate, se_tokens = sweep_standard_errors(run, w, gamma)
        z_rate.append((run.acceptance_rate - chain.acceptance_rate) / se_rate)
        z_tokens.append((run.tokens_per_step - chain.tokens_per_step) / se_tokens)
    ax.axhspan(-2, 2, color="grey", alpha=0.15, label="±2 standard errors (95 %)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.plot(weights, z_rate, "o", color=OKABE_ITO[0], label="accepted / test")
    ax.plot(weights, z_tokens, "s", color=OKABE_ITO[3], mfc="none", label="tokens / step")
    ax.set(
        ylim=(-4, 5.5),
        xlabel="draft weight w",
        ylabel="(measured − exact) / s.e.",
        title="Sweep against the exact chain, in standard errors",
    )
    ax.legend(ncol=2, loc="upper center")
    return fig


def plot_tokens_vs_w(sweep, gamma=4, gammas=(1, 2, 3, 4, 6, 8)):
    """Eq. (1) with exact α(w) for several γ as lines; the measured γ sweep as crosses."""
    fig, ax = _new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 101)
    alphas = [alpha_exact(w) for w in grid]
    for i, g in enumerate(gammas):
        tokens = [expected_tokens(a, g) for a in alphas]
        ax.plot(grid, tokens, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.plot(
        list(sweep),
        [t.tokens_per_step for t in sweep.values()],
        "x",
        color="black",
        markersize=9,
        markeredgewidth=2,
        label=f"measured, γ = {gamma}",
    )
    ax.set(xlabel="draft weight w", ylabel="tokens per target call", title="Tokens per call")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_regime_tokens(max_gamma=8, stay=0.9):
    """The regime target: Eq. (1) with the exact α against the exact chain, for γ = 1..max."""
    p, q = regime_models(stay=stay)
    alpha = alpha_of(p, q)
    gammas = np.arange(1, max_gamma + 1)
    chain = [markov_chain_stats(p, q, int(g)) for g in gammas]
    fig, ax = _new_figure()
    ax.plot(
        gammas,
        [expected_tokens(alpha, int(g)) for g in gammas],
        label="Eq. (1) with α",
        **_series(1),
    )
    ax.plot(gammas, [c.tokens_per_step for c in chain], label="exact chain", **_series(0))
    ax.set(
        xlabel="draft tokens per step γ",
        ylabel="tokens per target call",
        title=f"Sticky regimes (stay = {stay:g}): α = {alpha:.2f}",
    )
    ax.legend()
    return fig


def plot_tokens_vs_gamma(weights=(0.0, 0.5, 0.9, 1.0), max_gamma=10):
    """Eq. (1) against γ for several draft weights."""
    fig, ax = _new_figure()
    gammas = np.arange(max_gamma + 1)
    for i, w in enumerate(weights):
        a = alpha_exact(w)
        tokens = [expected_tokens(a, int(g)) for g in gammas]
        ax.plot(gammas, tokens, markersize=5, label=f"w = {w:g} (α = {a:.3f})", **_series(i))
    ax.set(xlabel="draft tokens per step γ", ylabel="tokens per target call", title="Against γ")
    ax.legend()
    return fig


def plot_expected_tokens_vs_alpha(gammas=(1, 2, 3, 5, 7, 10)):
    """Leviathan et al.'s Figure 2: Eq. (1) against α for several γ; this toy's α range shaded."""
    fig, ax = _new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 201)
    for i, g in enumerate(gammas):
        tokens = [expected_tokens(a, g) for a in grid]
        ax.plot(grid, tokens, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.axvspan(alpha_exact(0), 1, color="grey", alpha=0.15, label="this toy")
    ax.set(xlabel="α", ylabel="expected tokens per step", title="After Leviathan et al., Fig. 2")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_speedup_vs_w(sweep, gamma=4, costs=(0.0, 0.05, 0.1, 0.25, 0.5)):
    """Theorem 3.8 against w for several c: exact α(w) as dashed lines, measured as markers."""
    fig, ax = _new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 101)
    alphas = [alpha_exact(w) for w in grid]
    for i, c in enumerate(costs):
        style = _series(i)
        ax.plot(
            grid,
            [walltime_speedup(a, gamma, c) for a in alphas],
            color=style["color"],
            linestyle=style["linestyle"],
            label=f"c = {c:g}",
        )
        ax.plot(
            list(sweep),
            [t.tokens_per_step / (gamma * c + 1) for t in sweep.values()],
            linestyle="none",
            color=style["color"],
            marker=style["marker"],
            markersize=5,
        )
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set(xlabel="draft weight w", ylabel="projected speedup", title=f"Speedup, γ = {gamma}")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_speedup_heatmap(max_gamma=30, max_cost=0.3):
    """Best speedup over γ on an (α, c) grid; the no-gain region α ≤ c (Corollary 3.9) in grey."""
    from matplotlib import patheffects
    from matplotlib.colors import LogNorm

    alphas, costs = np.linspace(0, 0.99, 199), np.linspace(0, max_cost, 121)
    gammas = np.arange(max_gamma + 1)
    tokens = np.cumsum(alphas[None, :] ** gammas[:, None], axis=0)  # (G, A): Eq. (1), sum form
    best = (tokens[None] / (gammas[None, :, None] * costs[:, None, None] + 1)).max(axis=1)  # (C, A)
    fig, ax = _new_figure(figsize=(6.4, 4.8))
    ax.set_facecolor("0.82")  # where the speedup is 1 the mesh is masked: grey shows through
    gain = np.ma.masked_where(best <= 1 + 1e-9, best)
    image = ax.pcolormesh(alphas, costs, gain, cmap="YlGnBu", shading="auto", norm=LogNorm(1, 30))
    halo = [patheffects.withStroke(linewidth=3, foreground="white")]
    levels = ax.contour(
        alphas, costs, best, levels=[1.25, 1.5, 2, 3, 5, 10], colors="black", linewidths=1
    )
    for text in ax.clabel(levels, fmt="%g×", fontsize=11):
        text.set_path_effects(halo)
    ax.plot([0, max_cost], [0, max_cost], "--", color="black", linewidth=1.5)
    ax.text(0.03, 0.8 * max_cost, "α ≤ c:\nno γ helps", fontsize=12)
    ax.set(xlabel="α", ylabel="cost ratio c", title="Best projected speedup over γ ≤ 30")
    ax.grid(False)
    bar = fig.colorbar(image, ax=ax, ticks=[1, 1.5, 2, 3, 5, 10, 20, 30])
    bar.ax.set_yticklabels(["1×", "1.5×", "2×", "3×", "5×", "10×", "20×", "30×"])
    bar.set_label("best speedup (log scale)")
    return fig


def plot_optimal_gamma(costs=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5)):
    """Leviathan et al.'s Figure 3: the optimal γ against α for several c."""
    fig, ax = _new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 0.99, 199)
    for i, c in enumerate(costs):
        style = _series(i, len(grid))
        ax.step(
            grid,
            [optimal_gamma(a, c) for a in grid],
            where="post",
            label=f"c = {c:g}",
            markersize=5,
            **style,
        )
    ax.set(xlabel="α", ylabel="optimal γ", title="Optimal γ (after Leviathan et al., Fig. 3)")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_operations_increase(gammas=(1, 2, 3, 5, 7, 10), c_hat=0.0):
    """Leviathan et al.'s Figure 4, right half: the increase in operations against α."""
    fig, ax = _new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 0.99, 100)
    for i, g in enumerate(gammas):
        ops = [operations_increase(a, g, c_hat) for a in grid]
        ax.plot(grid, ops, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.set(
        xlabel="α",
        ylabel="increase in operations",
        title=f"Arithmetic per token, ĉ = {c_hat:g} (after Fig. 4)",
    )
    _legend_on_top(ax, ncol=3)
    return fig


def plot_real_pairs():
    """Measured α of real draft/target pairs (Leviathan et al., Table 3) beside the toy's."""
    fig, ax = _new_figure(figsize=(6.4, 6.4))
    short = {"GPT-like 97M": "GPT 97M", "T5-XXL EnDe": "EnDe", "T5-XXL CNNDM": "CNNDM"}
    labels = [f"{short.get(target, target)} ← {draft}" for target, draft, _, _ in REAL_PAIR_ALPHAS]
    y = np.arange(len(labels))
    ax.axvspan(alpha_exact(0), 1, color="grey", alpha=0.15, label="this toy: α(w)")
    ax.axvline(
        alpha_of(*unsmoothed_models()),
        color="black",
        linestyle=":",
        linewidth=1.5,
        label="toy without smoothing, w = 0",
    )
    ax.plot([r[2] for r in REAL_PAIR_ALPHAS], y, "o", color=OKABE_ITO[0], label="temperature 0")
    ax.plot(
        [r[3] for r in REAL_PAIR_ALPHAS],
        y,
        "s",
        color=OKABE_ITO[3],
        markerfacecolor="none",
        markeredgewidth=2,
        label="temperature 1",
    )
    ax.set_yticks(y, labels, fontsize=11)
    ax.invert_yaxis()
    ax.set(xlim=(0, 1), xlabel="α", ylabel="target ← draft", title="Real pairs and this toy")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    return fig


def plot_panel(w=0.9, gamma=4, c=0.1):
    """Projected speedup against γ at one (w, c): the chosen γ, the best γ and §3.5's oracle."""
    alpha = alpha_exact(w)
    fig, ax = _new_figure()
    best = optimal_gamma(alpha, c)
    gammas = np.arange(max(11, gamma + 1, best + 1))
    speedups = [walltime_speedup(alpha, int(g), c) for g in gammas]
    ax.plot(gammas, speedups, "o-", color=OKABE_ITO[0], markersize=5, label="Theorem 3.8")
    chosen = {"color": OKABE_ITO[3], "markersize": 12, "label": f"γ = {gamma}"}
    ax.plot([gamma], [speedups[gamma]], "o", **chosen)
    ax.plot([best], [speedups[best]], "*", color="black", markersize=14, label=f"best γ = {best}")
    if alpha < 1:
        ax.axhline(oracle_speedup(alpha, c), color=OKABE_ITO[2], linestyle="--", label="oracle γ")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set(
        xlabel="γ",
        ylabel="projected speedup",
        title=f"w = {w:g}, c = {c:g}: γ = {gamma} gives {speedups[gamma]:.2f}×",
    )
    _legend_on_top(ax, ncol=2)
    return fig


def widget_panel():
    """Sliders for w, γ and c that redraw plot_panel on release (live kernel; needs ipywidgets)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    on_release = {"continuous_update": False}  # one redraw per move, not one per tick
    sliders = {
        "w": widgets.FloatSlider(value=0.9, min=0, max=1, step=0.05, description="w", **on_release),
        "gamma": widgets.IntSlider(value=4, min=0, max=10, description="γ", **on_release),
        "c": widgets.FloatSlider(value=0.1, min=0, max=1, step=0.01, description="c", **on_release),
    }

    def redraw(**values):
        figure = plot_panel(**values)
        display(figure)
        plt.close(figure)

    return widgets.VBox(
        [widgets.HBox(list(sliders.values())), widgets.interactive_output(redraw, sliders)]
    )


def plot_bug_power(rows):
    """Each bug's exact TV (top) and the draws a chi-square test needs (bottom), log scales."""
    fig, (top, bottom) = _new_figure(nrows=2, figsize=(5.0, 7.8))
    rows = sorted(rows, key=lambda r: r["TV"])
    y = np.arange(len(rows))
    chi = np.array([r["caught by"] == "chi-square" for r in rows])
    for ax, key, label, title in (
        (top, "TV", "exact TV from p′ (three tokens)", "How far each bug moves the law"),
        (
            bottom,
            "draws to catch",
            f"draws for {DETECT_POWER:.0%} power at level {DETECT_LEVEL:g}",
            "What a test needs",
        ),
    ):
        values = np.array([r[key] for r in rows])
        ax.hlines(y, values.min() / 3, values, color="0.8", linewidth=1)
        ax.scatter(values[chi], y[chi], marker="o", s=60, label="caught by chi-square")
        ax.scatter(
            values[~chi],
            y[~chi],
            marker="s",
            s=60,
            color=OKABE_ITO[3],
            label="caught by a forbidden outcome",
        )
        ax.set(xscale="log", xlabel=label, ylabel="bug", title=title)
        ax.set_yticks(y, [r["bug"] for r in rows])
    bottom.legend(loc="upper center", bbox_to_anchor=(0.35, -0.22), ncol=1)
    fig.tight_layout()
    return fig


# Every figure of the book, by name: `make figures` writes each one to figures/.
FIGURES = {
    "ch1-target-heatmap": plot_target_heatmap,
    "ch1-draft-mixture": plot_draft_mixture,
    "ch1-sampling-check": lambda: plot_residuals(
        sampling_check(), "200,000 draws after context 't'"
    ),
    "ch2-step-trace": lambda: plot_step_trace(
        trace_run(5, 4, 0.3, BOS, np.random.default_rng(SEEDS["trace"]))
    ),
    "ch2-two-paths": plot_two_paths,
    "ch2-one-token-check": lambda: plot_residuals(
        one_token_check(), "First token of 200,000 γ = 1 steps after 't'"
    ),
    "ch3-joint-difference": lambda: plot_joint_difference(joint_check()),
    "ch3-controls": lambda: plot_controls(
        control_rows(),
        noise_reference(joint_check().exact, N_DRAWS, np.random.default_rng(SEEDS["noise"]))[
            "q95_tv"
        ],
    ),
    "ch4-sweep-residuals": lambda: plot_sweep_residuals(acceptance_sweep()),
    "ch4-tokens-vs-w": lambda: plot_tokens_vs_w(acceptance_sweep()),
    "ch4-tokens-vs-gamma": plot_tokens_vs_gamma,
    "ch4-regime-tokens": plot_regime_tokens,
    "ch4-fig2-tokens-vs-alpha": plot_expected_tokens_vs_alpha,
    "ch5-speedup-vs-w": lambda: plot_speedup_vs_w(acceptance_sweep()),
    "ch5-speedup-heatmap": plot_speedup_heatmap,
    "ch5-fig3-optimal-gamma": plot_optimal_gamma,
    "ch5-fig4-operations": plot_operations_increase,
    "ch5-real-pairs": plot_real_pairs,
    "ch5-panel": plot_panel,
    "ch6-bug-power": lambda: plot_bug_power(bug_rows()),
    "ch7-multi-draft": lambda: plot_multi_draft_acceptance(multi_draft_rows(), pair_optima()),
    "ch7-block-gains": lambda: plot_block_gains(random_pair_gains(RANDOM_PAIRS)),
    "ch7-block-tokens": lambda: plot_block_tokens_vs_w(block_sweep()),
    "ch7-lossy-frontier": lambda: plot_lossy_frontier(
        lossy_frontier(),
        {
            "per-token (exact)": rule_tokens_per_call(0.3, BLOCK_GAMMA),
            "block (exact)": toy_tokens_per_call(0.3, BLOCK_GAMMA),
        },
    ),
}
