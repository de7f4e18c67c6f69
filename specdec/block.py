"""Chapter 7, second part: block verification (Sun et al., 2025) against per-token verification.

Every draft path of a step is enumerated with its probability, so both verifiers' step laws and
long-run tokens per call are exact; `block_verify` runs a batch.
"""

import functools
from collections import defaultdict
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .checks import _check_count, _check_unit_interval
from .exact import model_matrices
from .models import BOS, CONTEXT_INDEX, CONTEXTS, P_MATRIX, VOCAB, V, _check_context, draft_matrix
from .rule import EXACT_RULE, _normalise_or
from .theory import _stationary
from .verify import _checked_batch, _emitted, _sample_rows

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


BLOCK_GAMMA = 3
BLOCK_WEIGHTS = [0.0, 0.3, 0.6, 0.9, 1.0]
RANDOM_PAIRS = 2000


def block_sweep(weights=BLOCK_WEIGHTS, gamma=BLOCK_GAMMA):
    """{w: (per-token, block)} exact long-run tokens per call on the toy."""
    return {w: (rule_tokens_per_call(w, gamma), toy_tokens_per_call(w, gamma)) for w in weights}
