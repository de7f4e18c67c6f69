"""Chapters 4–5: what draft quality buys (Leviathan et al., Section 3).

β and α exactly, Equation 1's expected tokens per call, the exact Markov chain of the steps,
Theorem 3.8's walltime speedup and Corollary 3.9's optimal γ, and α for any bigram pair.
"""

import math
from fractions import Fraction
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np

from .checks import (
    MAX_GAMMA,
    MAX_STEPS,
    _check_count,
    _check_nonnegative,
    _check_rng,
    _check_unit_interval,
)
from .exact import P_FRACTIONS, model_matrices
from .models import BIGRAM_COUNTS, P_MATRIX, UNIGRAM_COUNTS, VOCAB, V, draft_matrix, p_dist, q_dist
from .rule import EXACT_RULE


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


def measured_cost_speedup(tokens_per_step, gamma, c, v, overhead=0.0, plain_overhead=0.0):
    """The book's measured-cost form: E[tokens]·(1 + o_plain) / (γc + v(γ) + o), every time in
    units of one target call T(1); o per step and o_plain per plain token are the time spent
    outside model calls. Theorem 3.8 when v = 1 and o = o_plain = 0."""
    _check_count(gamma, "gamma")
    ok = isinstance(tokens_per_step, Real) and not isinstance(tokens_per_step, bool)
    if not ok or not 1 - 1e-9 <= tokens_per_step <= gamma + 1 + 1e-9:
        raise ValueError(f"tokens_per_step must lie in [1, gamma + 1], got {tokens_per_step!r}")
    _check_nonnegative(c, "c")
    for value, name in ((overhead, "overhead"), (plain_overhead, "plain_overhead")):
        _check_nonnegative(value, name)
    if isinstance(v, bool) or not isinstance(v, Real) or not 0 < v < float("inf"):
        raise ValueError(f"v must be a positive finite number, got {v!r}")
    return tokens_per_step * (1 + plain_overhead) / (gamma * c + v + overhead)


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


# ---- Any draft, any bigram target: α for other drafts, a correlated β, estimating α ---------

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
