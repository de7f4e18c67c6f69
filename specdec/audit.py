"""Chapter 6: `audit_verifier`, a test of any verifier with `verify`'s interface.

Two suites. "small": nine Markov scenarios whose completed joint law is enumerated; draws sized
so that a law off by AUDIT_TV in a scenario fails it with probability at least AUDIT_POWER.
"engine": the engine-shaped `Scenario`s of `projections`, tested by their exact projections.
Every statistic is `exact_chi_square`, whose null law is exactly chi-square at any count, so an
exact verifier fails the whole audit with probability at most AUDIT_LEVEL over the audit's seeds
(Bonferroni over every statistic), with no large-sample approximation.

Drafter mode (`drafter=`): the drafts come from the user's drafter, which may stop early (a
confidence stop, an end-of-sequence stop), so the number of drafts may depend on the drafted
tokens. Only what must hold whatever the stopping rule is tested: each draft is a draw from the q
row the drafter returns (a randomized probability integral transform, position by position), and
the emitted tokens at each position follow the target's row there.

The audit needs numpy and scipy only: pandas is imported when a report's `table` is read.
"""

import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import stats

from .checks import _check_count
from .drafted import drafted_rows, drafter_components, exercised, run_drafted
from .engine import RowSampler
from .harness import AUDIT_TIMEOUT, THREADS, Fault, Remote, Sandbox
from .pipelines import ROW_BUGS, ROW_EXACT, noncentrality_needed
from .projections import (
    POWER,
    Scenario,
    _projections_of,
    _statistics,
    component_rows,
    components,
    direction_weights,
    engine_scenarios,
    exact_chi_square,
    exact_scores,
    output_problem,
    run_scenario,
)
from .stats import clopper_pearson

AUDIT_LEVEL = 1e-3  # chance that the whole audit fails an exact verifier
AUDIT_TV = 0.08  # a verifier whose law is this far off in one scenario ...
AUDIT_POWER = 0.99  # ... fails that scenario with at least this probability
AUDIT_MIN_EXPECTED = 2  # cells expecting fewer draws are pooled into one (for power, not level)
AUDIT_SEED = 2026  # the scenarios' models are fixed; audit_verifier's seed drives the draws


class MarkovScenario(NamedTuple):
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
        MarkovScenario(
            "random rows, V = 4, γ = 3", _dirichlet(rng, (4, 4, 4)), _dirichlet(rng, (3, 4, 4))
        ),
        MarkovScenario(
            "zeros in p and q, V = 6, γ = 2",
            _dirichlet(rng, (3, 6, 6), _sparse_support(rng, (3, 6, 6), 3)),
            _dirichlet(rng, (2, 6, 6), _sparse_support(rng, (2, 6, 6), 3)),
        ),
        MarkovScenario("p = q, V = 5, γ = 2", p3, p3[:2]),
        MarkovScenario(
            "one-hot p, V = 8, γ = 2", _one_hot(rng, (3, 8, 8)), _dirichlet(rng, (2, 8, 8))
        ),
        MarkovScenario(
            "one-hot q, V = 4, γ = 3", _dirichlet(rng, (4, 4, 4)), _one_hot(rng, (3, 4, 4))
        ),
        MarkovScenario(
            "disjoint supports, V = 6, γ = 2",
            _dirichlet(rng, (3, 6, 6), np.arange(6) < 3),
            _dirichlet(rng, (2, 6, 6), np.arange(6) >= 3),
        ),
        MarkovScenario("γ = 5, V = 2", _dirichlet(rng, (6, 2, 2)), _dirichlet(rng, (5, 2, 2))),
        MarkovScenario(
            "γ = 1, V = 50, 6 tokens per row",
            _dirichlet(rng, (2, 50, 50), _sparse_support(rng, (2, 50, 50), 6)),
            _dirichlet(rng, (1, 50, 50), _sparse_support(rng, (1, 50, 50), 6)),
        ),
        MarkovScenario(
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


def _pooled_cells(law, n):
    """Cells for n draws: outcomes expected ≥ AUDIT_MIN_EXPECTED times alone, the other possible
    ones pooled into one. The cell of each outcome (−1: probability 0), and the cells' law."""
    alone = n * law >= AUDIT_MIN_EXPECTED
    pooled = (law > 0) & ~alone
    cell = np.full(law.size, -1)
    cell[alone] = np.arange(int(alone.sum()))
    cell[pooled] = int(alone.sum())
    return cell, np.bincount(cell[law > 0], weights=law[law > 0])


def audit_draws(law, level, tv=AUDIT_TV, power=AUDIT_POWER):
    """The fewest draws that fail a law off by TV ≥ tv w.p. ≥ power, and the pooled cells' mass.

    Cauchy–Schwarz: Σ (a − b)² / b ≥ (Σ |a − b|)² = 4·TV², so λ ≥ 4·n·TV² for every
    alternative. Pooling cells of mass m can hide at most m of the TV, so n must reach
    λ / (4·(tv − m(n))²), with m(n) the mass pooled at n draws: the smallest such n, by bisection
    (m falls as n grows). With one possible outcome only a forbidden one shows: that count.
    """
    n_forbidden = int(np.ceil(np.log1p(-power) / np.log1p(-tv)))  # all the TV on forbidden
    if (law > 0).sum() < 2:
        return n_forbidden, 0.0
    lam = noncentrality_needed(int((law > 0).sum()) - 1, level, power)

    def pooled(n):
        return float(law[(law > 0) & (n * law < AUDIT_MIN_EXPECTED)].sum())

    def enough(n):
        return pooled(n) < tv and n >= lam / (4 * (tv - pooled(n)) ** 2)

    low, high = int(lam / (4 * tv**2)), int(np.ceil(AUDIT_MIN_EXPECTED / law[law > 0].min()))
    high = max(high, low + 1, int(np.ceil(lam / (4 * tv**2))))
    while high - low > 1:  # enough(high) holds, enough(low) does not
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return max(high, n_forbidden), pooled(high)


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


def verifier_law(scenario, rule=ROW_EXACT, verified=None, bonus_before=False):
    """The exact completed law (V**(γ+1),) of a verifier on a small scenario: drafts from q, the
    RowRule run on the target rows as `verified` maps them (None: as they are), the bonus drawn
    at the row before the last if bonus_before, every step completed by the target."""
    target, draft = scenario.target, scenario.draft
    gamma, vocab = draft.shape[:2]
    verified = verified or (lambda rows: rows)
    alive, done = np.ones(1), np.zeros(1)  # per prefix: every draft kept; or final token out
    last, before = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    for i in range(gamma):
        p, q = verified(target[i][last]), draft[i][last]  # (N, V) along each prefix
        accept = np.asarray(rule.accept(p, q), float)
        rejected = alive[:, None] * rule.law_after_rejection(p, q, q * (1 - accept))
        done = (done[:, None] * target[i][last]).ravel() + rejected.ravel()
        alive = (alive[:, None] * q * accept).ravel()
        before, last = np.repeat(last, vocab), np.tile(np.arange(vocab), len(last))
    bonus = verified(target[gamma - 1][before] if bonus_before else target[gamma][last])
    return (done[:, None] * target[gamma][last]).ravel() + (alive[:, None] * bonus).ravel()


def _one_hot_rows(rows):
    """Each row (N, V) as a one-hot at its first argmax."""
    return (np.arange(rows.shape[-1]) == rows.argmax(axis=-1)[..., None]) * 1.0


DIRECTION_SOURCES = {  # the moves that fix the small suite's one-degree-of-freedom directions
    **{key: {"rule": rule} for key, rule in ROW_BUGS.items() if key != "tiny clamp"},
    "argmax target at T > 0": {"verified": _one_hot_rows},
    "bonus from the last draft position": {"bonus_before": True},
}
DIRECTION = "completed law along direction"  # a statistic's name: what it measures, not a cause
DIRECTION_NAMES = {bug: f"{DIRECTION} {i}" for i, bug in enumerate(DIRECTION_SOURCES, 1)}
DIRECTIONS = {DIRECTION_NAMES[bug]: move for bug, move in DIRECTION_SOURCES.items()}


@functools.cache
def _directions(index):
    """{name: (law − exact law) on the possible outcomes} of the bugs that move scenario index."""
    scenario = audit_scenarios()[index]
    law = scenario_law(scenario)
    out = {}
    for name, bug in DIRECTIONS.items():
        gap = (verifier_law(scenario, **bug) - law)[law > 0]
        gap -= law[law > 0] * gap.sum()  # the move given no forbidden draw (those fail at once)
        if np.abs(gap).sum() > 1e-9:  # a bug that leaves this scenario's law alone is no test
            out[name] = gap
    return out


def small_statistics():
    """The small suite's statistics: one joint-law test per scenario and one per direction."""
    return len(audit_scenarios()) + sum(len(_directions(i)) for i in range(len(audit_scenarios())))


def _small_scores(counts, law, rng):
    """Exact scores (..., C − 1) of completed counts (..., K) over the pooled cells of law for
    their n draws (all the same), with the cell of each outcome and the cells' law."""
    cell, cell_law = _pooled_cells(law, int(counts.sum(axis=-1).flat[0]))
    pooled = np.zeros(counts.shape[:-1] + (cell_law.size,), dtype=np.int64)
    np.add.at(pooled, (..., cell[law > 0]), counts[..., law > 0])
    u = rng.random(counts.shape[:-1] + (cell_law.size - 1,))
    return exact_scores(pooled, cell_law, u), cell[law > 0], cell_law


def _small_tests(index, counts, level, rng):
    """The small scenario's statistics on completed counts (..., K): {component: (statistic
    (...), critical value, degrees of freedom, TV sized for)}; df 0: no test."""
    law, n = scenario_law(audit_scenarios()[index]), int(counts.sum(axis=-1).flat[0])
    z, cell, cell_law = _small_scores(counts, law, rng)
    df = cell_law.size - 1
    out = {SMALL_COMPONENT: ((z**2).sum(axis=-1), float(stats.chi2.isf(level, df)), df, AUDIT_TV)}
    shift = stats.norm.isf(level / 2) + stats.norm.ppf(AUDIT_POWER)  # two-sided, 1 df
    for name, gap in _directions(index).items():
        gap = np.bincount(cell, weights=gap, minlength=cell_law.size)  # over the pooled cells
        w = direction_weights(cell_law, gap) if df else None
        if w is None:  # all of the bug's move inside one pooled cell: nothing to test
            out[name] = (np.zeros(z.shape[:-1]), np.inf, 0, np.nan)
            continue
        share = shift / np.sqrt(n * (gap**2 / cell_law).sum())  # of the bug's law, mixed in
        tv = share * np.abs(gap).sum() / 2
        out[name] = ((z @ w) ** 2, float(stats.chi2.isf(level, 1)), 1, float(tv))
    return out


def _outcome_name(code, length, vocab):
    """A base-V outcome code as its tokens: 'tokens (2, 0, 1)'."""
    digits = [code // vocab ** (length - 1 - i) % vocab for i in range(length)]
    return f"tokens {tuple(digits)}"


SMALL_COMPONENT = "joint law, completed to γ + 1 tokens"


def _audit_row(verify_fn, index, level, rng):
    """One small scenario: draw, verify, check the output, complete, test. Rows for the table:
    one for the joint law and one per direction, or one that names what went wrong."""
    scenario = audit_scenarios()[index]
    law = scenario_law(scenario)
    n, pooled = audit_draws(law, level)
    row = {
        "scenario": scenario.name,
        "request": 0,
        "component": SMALL_COMPONENT,
        "draws": n,
        "statistic": np.nan,
        "critical": np.nan,
        "sized for TV": AUDIT_TV,
    }
    target_rows, draft_rows, drafts = _scenario_batch(index, n, rng)
    try:
        result = verify_fn(target_rows, draft_rows, drafts.copy(), rng)
    except Exception as error:  # the audit reports any failure of the verifier, never crashes
        return [row | {"passed": False, "finding": f"raised {type(error).__name__}: {error}"}]
    problem, accepted, tokens = output_problem(result, drafts, target_rows.shape[2])
    if problem:
        return [row | {"passed": False, "finding": problem}]
    counts = np.bincount(_completed_codes(index, accepted, tokens, rng), minlength=law.size)
    gamma, vocab = scenario.draft.shape[:2]
    share = counts / n
    worst = int(np.argmax(np.abs(share - law)))
    row |= {
        "worst cell": _outcome_name(worst, gamma + 1, vocab),
        "observed": float(share[worst]),
        "exact": float(law[worst]),
    }
    if counts[law == 0].sum():
        forbidden = counts[law == 0].sum()
        return [row | {"passed": False, "finding": f"{forbidden} draws of probability 0"}]
    rows = []
    for component, (stat, critical, df, tv) in _small_tests(index, counts, level, rng).items():
        line = row | {"component": component, "sized for TV": tv}
        if component != SMALL_COMPONENT:
            line |= {"worst cell": np.nan, "observed": np.nan, "exact": np.nan}
        if not df:  # one possible outcome, or a move all inside one pooled cell
            finding = "no draw of probability 0" if component == SMALL_COMPONENT else "no test"
            rows.append(line | {"p-value": 1.0, "passed": True, "finding": finding})
            continue
        stat = float(stat)
        differs = (
            "law differs from the exact one"
            if df > 1
            else "the completed law moved along this fixed direction (a 1-degree-of-freedom "
            "projection of the cells' deviations from the exact law)"
        )
        rows.append(
            line
            | {
                "statistic": stat,
                "critical": critical,
                "p-value": float(stats.chi2.sf(stat, df)),
                "passed": stat <= critical,
                "finding": "law matches" if stat <= critical else differs,
            }
        )
    return rows


COLUMNS = [
    "scenario",
    "request",
    "component",
    "draws",
    "statistic",
    "critical",
    "p-value",
    "sized for TV",
    "passed",
    "finding",
    "worst cell",
    "observed",
    "exact",
]


SHOWN_FAILURES = 8  # the printout diagnoses at most this many failed statistics


def _value(row, key):
    """row[key], NaN where the row has no such entry."""
    return row.get(key, np.nan)


class AuditReport:
    """audit_verifier's answer: passed only if every statistic passed.

    rows: one dict per statistic (or one per scenario that stopped at its first finding);
    planned: {scenario: statistics planned}; notes: lines on what the run exercised; warnings:
    {text: count} the verifier's own code issued, kept apart from the verdict. `table` holds
    the rows as a pandas DataFrame (pandas is imported then, never by the audit itself).
    """

    def __init__(self, rows, planned=None, notes=(), warnings=None):
        prefix = f"raised {Fault.__name__}: "  # a failed child reads as what happened
        self.rows = []
        for row in rows:
            row = {"request": 0} | dict(row)
            if isinstance(row.get("finding"), str):
                row["finding"] = row["finding"].replace(prefix, "")
            self.rows.append(row)
        self.passed = all(bool(row["passed"]) for row in self.rows)
        self.planned = dict(planned or {})
        self.notes, self.warnings = list(notes), dict(warnings or {})

    @functools.cached_property
    def table(self):
        """The rows as a DataFrame, one per statistic, in COLUMNS."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=COLUMNS)

    def _collapsed(self):
        """A line explaining why fewer rows than planned statistics, or None."""
        seen = {}
        for row in self.rows:
            seen[row["scenario"]] = seen.get(row["scenario"], 0) + 1
        short = [name for name, n in self.planned.items() if seen.get(name, 0) < n]
        if not short:
            return None
        planned = sum(self.planned.values())
        return (
            f"  {len(self.rows)} rows, not the {planned} statistics planned: "
            f"{len(short)} scenario{'s' * (len(short) != 1)} stopped at the first finding (an "
            "error, an output of the wrong form, or a draw of probability 0), reported as one "
            f"row in place of its statistics: {'; '.join(short)}"
        )

    def __repr__(self):
        """A readable summary: the verdict, then each failed statistic with its diagnosis."""
        failed = [row for row in self.rows if not row["passed"]]
        scenarios = len({row["scenario"] for row in self.rows})
        lines = [
            f"{'PASSED' if self.passed else 'FAILED'}: {len(failed)} of {len(self.rows)} "
            f"statistics failed, {scenarios} scenario{'s' * (scenarios != 1)} "
            f"(false-alarm level {AUDIT_LEVEL:g} over all of them)"
        ]
        collapsed = self._collapsed()
        lines += [collapsed] if collapsed else []
        lines += self.notes
        for row in failed[:SHOWN_FAILURES]:
            lines.append(
                f"- {row['scenario']}, request {row['request']}, {row['component']}: "
                f"{row['finding']}"
            )
            worst = _value(row, "worst cell")
            if isinstance(worst, str) and worst != "none":
                lines.append(
                    f"    differs most at {worst}: observed "
                    f"{row['observed']:.4f}, exact {row['exact']:.4f}"
                )
            if _value(row, "statistic") == _value(row, "statistic"):  # not NaN
                lines.append(
                    f"    chi-square {row['statistic']:.1f} (critical {row['critical']:.1f}), "
                    f"p-value {row['p-value']:.2g}"
                )
        if len(failed) > SHOWN_FAILURES:
            lines.append(f"... and {len(failed) - SHOWN_FAILURES} more failed rows in .table")
        if self.warnings:
            count = sum(self.warnings.values())
            lines.append(
                f"The verifier's own code issued {count} warning{'s' * (count != 1)} "
                f"({len(self.warnings)} distinct), not part of the verdict: .warnings lists them "
                "(--verbose on the command line)."
            )
        if len(lines) > 1:  # the verdict is the last line too, where a log is read from the end
            lines.append(lines[0].split(" (")[0])
        return "\n".join(lines)

    __str__ = __repr__


def _markov_rows(verify_fn, level, rng):
    """The small suite's rows, one per statistic (or one per scenario, naming what went wrong)."""
    rows = []
    for index, scenario in enumerate(audit_scenarios()):
        try:
            rows.extend(_audit_row(verify_fn, index, level, rng))
        except Exception as error:  # e.g. a verifier that broke the generator it was handed
            rows.append(
                {
                    "scenario": scenario.name,
                    "component": SMALL_COMPONENT,
                    "passed": False,
                    "finding": f"audit stopped: {error!r}",
                }
            )
    return rows


def _scenario_rows(verify_fn, scenario, level, rng, drafter):
    """One scenario's rows, one per statistic; one row naming the fault if the output is bad;
    and the lines that say what drafter mode exercised."""
    try:
        run = run_scenario if drafter is None else run_drafted
        result = run(verify_fn, scenario, rng, drafter)
    except Exception as error:  # the audit reports any failure of the verifier, never crashes
        result = f"raised {type(error).__name__}: {error}"
    if isinstance(result, str):
        row = {"scenario": scenario.name, "component": "output", "passed": False}
        return [row | {"finding": result}], []
    if drafter is None:
        return component_rows(scenario, *result, level, rng), []
    return drafted_rows(scenario, result, level, rng), [exercised(scenario, result)]


def drafter_mode_rates(drafter, scenario, runs, seed=0, verify_fn=None):
    """The share of `runs` seeded audits in drafter mode (drafter with verify_fn, the book's
    verify by default) that fail, run in this process (no child): the false-alarm rate of a
    correct drafter, or the power against a broken one. (failures, runs)."""
    from .verify import verify

    verify_fn = verify if verify_fn is None else verify_fn
    level = AUDIT_LEVEL / len(drafter_components(scenario))
    failures = 0
    for run in range(runs):
        rng = np.random.default_rng([seed, run])
        record = run_drafted(verify_fn, scenario, rng, drafter)
        failed = isinstance(record, str)
        failed = failed or not all(r["passed"] for r in drafted_rows(scenario, record, level, rng))
        failures += failed
    return failures, runs


SUITES = ("small", "engine")


def _chosen(suite, scenarios, drafter):
    """The scenarios to run (None: the small suite), after checking the arguments."""
    if scenarios is not None:
        scenarios = list(scenarios)
        if not scenarios or not all(isinstance(s, Scenario) for s in scenarios):
            raise TypeError("scenarios must be a non-empty list of Scenario")
        return scenarios
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    if suite == "small":
        if drafter is not None:
            raise ValueError("drafter needs fixed-row scenarios: suite='engine' or scenarios=")
        return None
    return engine_scenarios()


def _sandboxed(verify_fn, drafter, timeout, threads):
    """The sandbox that runs verify_fn and drafter in a child process, and their stand-ins."""
    if isinstance(verify_fn, Remote):  # already held by a child (the command line's)
        return verify_fn.sandbox, verify_fn, drafter
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    functions = {"verifier": verify_fn, "drafter": drafter}
    sandbox = Sandbox(lambda: functions, timeout, threads=threads)
    return sandbox, sandbox.function("verifier"), drafter and sandbox.function("drafter")


def planned_statistics(suite="small", scenarios=None, drafter=False):
    """{scenario name: statistics planned}: what a run of the suite (or scenarios) tests."""
    if scenarios is None and suite == "small":
        return {s.name: 1 + len(_directions(i)) for i, s in enumerate(audit_scenarios())}
    count = drafter_components if drafter else components
    planned = {}
    for scenario in engine_scenarios() if scenarios is None else scenarios:
        planned[scenario.name] = planned.get(scenario.name, 0) + len(count(scenario))
    return planned


def audit_verifier(
    verify_fn,
    suite="small",
    scenarios=None,
    seed=0,
    drafter=None,
    timeout=AUDIT_TIMEOUT,
    threads=THREADS,
):
    """Run verify_fn on a suite's scenarios and test the law of what it emits (AuditReport).

    Every statistic tests at AUDIT_LEVEL / (number of statistics) (Bonferroni), so an exact
    verifier fails the audit with probability ≤ AUDIT_LEVEL. Small suite: a completed law off by
    TV ≥ AUDIT_TV in a scenario fails w.p. ≥ AUDIT_POWER (noncentral chi-square, Cauchy–Schwarz).
    Engine suite: each row states the TV over its cells that it catches w.p. ≥ 0.99.
    With drafter(draft_probs, rng) -> drafts (B, γ), or (drafts, q): the drafts come from it
    (end to end), a row may end in −1 after fewer drafts, and drafter mode's statistics are
    tested (run_drafted, drafted_rows). verify_fn and drafter run in a child process
    (harness.Sandbox) on `threads` threads (0: as their libraries set them), which may take
    `timeout` seconds in all; one that hangs, exits, is killed or runs out of memory fails its
    scenario.
    """
    if not callable(verify_fn):
        raise TypeError(f"verify_fn must be callable, got {type(verify_fn).__name__}")
    if drafter is not None and not callable(drafter):
        raise TypeError(f"drafter must be callable, got {type(drafter).__name__}")
    _check_count(seed, "seed")
    chosen = _chosen(suite, scenarios, drafter)
    own = not isinstance(verify_fn, Remote)  # else the command line's child, closed there
    sandbox, verify_fn, drafter = _sandboxed(verify_fn, drafter, timeout, threads)
    rng = np.random.default_rng(seed)
    planned = planned_statistics(suite, chosen, drafter is not None)
    notes = []
    if chosen is None:
        rows = _markov_rows(verify_fn, AUDIT_LEVEL / small_statistics(), rng)
    else:
        level, rows = AUDIT_LEVEL / sum(planned.values()), []
        for scenario in chosen:
            more, said = _scenario_rows(verify_fn, scenario, level, rng, drafter)
            rows, notes = rows + more, notes + said
    if own:
        sandbox.close()
    return AuditReport(rows, planned, notes, sandbox.warnings)


# ---- what a run can see, and how often an exact verifier fails one ----------------------------


def detectable(report):
    """What the run behind report could see, in one line per suite: its sizing, from the table."""
    table = report.table
    small = table[table["component"] == SMALL_COMPONENT]
    toward = table["component"].str.startswith(DIRECTION, na=False)
    bugs = table[toward]["sized for TV"].dropna()
    engine = table[(table["component"] != SMALL_COMPONENT) & ~toward]["sized for TV"].dropna()
    lines = []
    if len(small):
        lines.append(
            f"Sized to see: a completed law at TV ≥ {AUDIT_TV:g} from the exact one in any of "
            f"these {len(small)} scenarios, w.p. ≥ {AUDIT_POWER:g} each; smaller errors and "
            "anything outside these scenarios may pass."
        )
    if len(bugs):
        lines.append(
            f"Sized to see: along {len(bugs)} fixed directions (each the move of a known bug), "
            f"a verifier that follows that law some of the time, from TV {bugs.median():.2g} "
            "(median; "
            f"{bugs.min():.2g} to {bugs.max():.2g}), w.p. ≥ {AUDIT_POWER:g}."
        )
    if len(engine):
        lines.append(
            f"Sized to see: in each of {len(engine)} statistics, a law at TV ≥ its 'sized for TV' "
            f"over its own cells (median {engine.median():.2g}, {engine.min():.2g} to "
            f"{engine.max():.2g}), w.p. ≥ {POWER:g}; smaller errors, mass moved within a pooled "
            "range and dependence across positions may pass."
        )
    return "\n".join(lines)


def suite_draws(suite):
    """The requests a suite hands the verifier in one run (one call each for a batch-1 engine)."""
    if suite == "small":
        level = AUDIT_LEVEL / small_statistics()
        return sum(audit_draws(scenario_law(s), level)[0] for s in audit_scenarios())
    return sum(len(s.target) * s.steps for s in engine_scenarios())


FALSE_ALARMS = Path(__file__).parent / "data" / "audit_false_alarms.txt"  # written by make bench


def false_alarm_record(path=FALSE_ALARMS):
    """null_false_alarms' results as `make bench` wrote them, {suite: dict}; ValueError if they
    were made for other draws or another level than the suites have now."""
    record = {}
    for line in Path(path).read_text().splitlines():
        if line and not line.startswith("#"):
            fields = dict(item.split("=", 1) for item in line.split())
            record[fields["suite"]] = {
                k: v if k == "suite" else float(v) for k, v in fields.items()
            }
    for suite in SUITES:
        got = record.get(suite, {})
        if got.get("draws") != suite_draws(suite) or got.get("level") != AUDIT_LEVEL:
            raise ValueError(f"{path} is stale for the {suite} suite: run make bench")
    return record


def _null_small(runs, level, rng):
    """Alarms (runs,) of the small suite on an exact verifier: each scenario's completed counts
    drawn from its law (multinomial), tested by the audit's own _small_tests."""
    alarm = np.zeros(runs, dtype=bool)
    for index in range(len(audit_scenarios())):
        counts = _null_counts(index, level, rng, runs)
        for stat, critical, df, _ in _small_tests(index, counts, level, rng).values():
            alarm |= (stat > critical) if df else False
    return alarm


def _small_testable(level):
    """How many small-suite statistics can fail without a forbidden draw (df ≥ 1)."""
    rng = np.random.default_rng(0)  # the test's degrees of freedom do not depend on the draws
    return sum(
        df > 0
        for i in range(len(audit_scenarios()))
        for *_, df, _ in _small_tests(i, _null_counts(i, level, rng), level, rng).values()
    )


def _null_counts(index, level, rng, runs=1):
    """Completed counts (runs, K) of an exact verifier in small scenario index."""
    law = scenario_law(audit_scenarios()[index])
    counts = np.zeros((runs, law.size), dtype=np.int64)
    possible = law[law > 0] / law[law > 0].sum()
    counts[:, law > 0] = rng.multinomial(audit_draws(law, level)[0], possible, size=runs)
    return counts


def _null_engine(runs, level, rng, scenarios):
    """Alarms (runs,) of the engine suite on an exact verifier: per request the lengths from
    the length law, then each statistic's cell counts from its law given its draws."""
    alarm = np.zeros(runs, dtype=bool)
    for scenario in scenarios:
        laws = _projections_of(scenario)
        lengths = {}  # request -> accepted counts (runs, γ + 1)
        for r, component, k, cells, _ in _statistics(scenario):
            if r not in lengths:
                lengths[r] = rng.multinomial(scenario.steps, laws["length"][r], size=runs)
            counts = lengths[r]
            reach = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1]  # steps reaching k, (runs, γ+1)
            if cells.size < 2:
                continue
            if component == "length law" or component.startswith("acceptance"):
                outcomes = counts  # lengths; or (rejected at k, kept at k) among steps reaching k
                if component != "length law":
                    outcomes = np.stack([reach[:, k] - reach[:, k + 1], reach[:, k + 1]], axis=1)
                used = cells.cell >= 0
                observed = np.zeros((runs, cells.size), dtype=np.int64)
                np.add.at(observed, (slice(None), cells.cell[used]), outcomes[:, used])
            else:  # tokens: kept drafts at k, the residual at k, or the bonus after γ kept
                if component == "bonus":
                    n = counts[:, -1]
                else:
                    n = reach[:, k + 1] if component.startswith("kept") else counts[:, k]
                observed = rng.multinomial(n, cells.law)
            stat = exact_chi_square(observed, cells.law, rng.random((runs, cells.size - 1)))
            drawn = observed.sum(axis=1) > 0
            alarm |= drawn & (stat > stats.chi2.isf(level, cells.size - 1))
    return alarm


def null_false_alarms(suite="small", runs=10_000, seed=0, level=AUDIT_LEVEL, batch=2_000):
    """Simulated runs of a suite on an exact verifier: the share that fails, with its exact
    (Clopper–Pearson) 95 % interval, and 1 − (1 − level/S)^T, the rate if the T statistics
    (of S) that can fail without a forbidden draw were independent; Bonferroni bounds it by level.

    The statistics see what an exact verifier's output gives them, drawn from the exact laws
    directly (no verifier is called): the run-wise false-alarm rate over seeds.
    """
    _check_count(runs, "runs")
    _check_count(seed, "seed")
    _check_count(batch, "batch")
    if not (isinstance(level, float | int) and 0 < level < 1) or batch < 1:
        raise ValueError(f"need 0 < level < 1 and batch ≥ 1, got level={level!r}, batch={batch}")
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {SUITES}, got {suite!r}")
    rng = np.random.default_rng(seed)
    if suite == "small":
        count = small_statistics()
        simulate = functools.partial(_null_small, level=level / count)
        testable = _small_testable(level / count)
    else:
        count = sum(len(components(s)) for s in engine_scenarios())
        simulate = functools.partial(
            _null_engine, level=level / count, scenarios=engine_scenarios()
        )
        testable = sum(c.size > 1 for s in engine_scenarios() for *_, c, _ in _statistics(s))
    alarms = sum(
        int(simulate(min(batch, runs - start), rng=rng).sum()) for start in range(0, runs, batch)
    )
    low, high = clopper_pearson(alarms, runs)
    return {
        "suite": suite,
        "runs": runs,
        "alarms": alarms,
        "rate": alarms / max(runs, 1),
        "low": low,
        "high": high,
        "statistics": count,
        "testable": int(testable),  # the others have one cell: only a forbidden draw fails them
        "design": float(-np.expm1(testable * np.log1p(-level / count))),  # if independent
    }
