"""Chapter 1: the corpus, the toy target p and the draft q_w = w·p + (1 − w)·q0.

The target is a Laplace-smoothed character bigram over an 80-character corpus (18 tokens); the
draft mixes it with the unigram q0. The article's way: dictionaries, and a literal sampler
that draws one token per Python call.
"""

import itertools
from numbers import Real

import numpy as np

from .checks import MAX_LOOP, _as_real_array, _check_count, _check_rng, _check_unit_interval

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


def _check_context(ctx, name="ctx"):
    """Raise unless ctx is one of CONTEXTS."""
    if not isinstance(ctx, str) or ctx not in CONTEXT_INDEX:
        raise ValueError(f"{name} must be one of {''.join(CONTEXTS)!r}, got {ctx!r}")


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


# ---- The models, the article's way (dictionaries) -----------------------------------------------


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


def draft_matrix(w):
    """q_w for every context, (19, 18): w·P + (1 − w)·q0."""
    _check_unit_interval(w, "w")
    w = float(w)  # float64 tables even for a Fraction or float32 w
    return w * P_MATRIX + (1 - w) * Q0_VECTOR


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


def show_token(tok):
    """A token as printed in figures and tables: the space as '␣'."""
    return "␣" if tok == " " else tok
