"""Chapter 6: `audit_verifier`, a test of any verifier with `verify`'s interface.

Nine scenarios with exact laws; draws sized so that an exact verifier fails with probability
at most AUDIT_LEVEL, and one off by AUDIT_TV in a scenario fails it with probability at least
AUDIT_POWER, within the chi-square approximations.
"""

import functools
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from .checks import _check_count
from .engine import RowSampler
from .pipelines import noncentrality_needed
from .verify import (
    _accepted_count,
    _cell_offsets,
    _checked_batch,
    _draw_final,
    _emitted,
    _entries,
    _rows_at,
    verify,
)


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
