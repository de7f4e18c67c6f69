"""Chapters 1–4: the book's seeded experiments, so two builds give the same numbers."""

from fractions import Fraction

import numpy as np

from .checks import _check_count, _check_positive_count, _check_unit_interval
from .engine import sample_tokens, simulate_generation, simulate_prefixes
from .exact import law_difference, speculative_law, target_joint
from .models import BOS
from .rule import BROKEN_RULES, EXACT_RULE
from .stats import compare, law_tv

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
