"""Chapter 6: engine-shaped audit scenarios and exact projections of a verifier's output law.

A `Scenario` is a batch of requests, each with target rows (γ+1, V) and draft rows (γ, V) that do
not depend on the drafted tokens. The rule's output then factorises by position: position i
keeps its draft w.p. β_i = Σ min(p_i, q_i), a kept draft follows min(p_i, q_i)/β_i, the token at
the first rejection follows max(0, p_i − q_i)/(1 − β_i), and the bonus follows p_γ. These laws
are exact at any vocabulary; each is tested over cells fixed in advance by `exact_chi_square`,
whose law under the exact law is chi-square on (cells − 1) degrees of freedom exactly.
"""

import functools
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .pipelines import _bf16, noncentrality_needed
from .verify import _below

MIN_EXPECTED = 20  # a cell expects at least this many draws: single tokens, or pooled id ranges
MAX_SINGLE = 64  # at most this many tokens get a cell of their own (the most probable)
MAX_RANGES = 32  # the other tokens pool into at most this many ranges of ids
BATCH_BYTES = 2**26  # the batches handed to the verifier hold about this much target and draft
# (2**28 took 3 times the memory and, at a tenth of the engine suite, 3 times the time: fresh
# pages are slow to fault in; the full suite's time is the same within 10 %)
POWER = 0.99  # each statistic's power is stated at this level, against the TV it is sized for


@dataclass(frozen=True, eq=False)
class Scenario:
    """R requests: target rows (R, γ+1, V), draft rows (R, γ, V), each verified `steps` times."""

    name: str
    target: np.ndarray  # (R, gamma + 1, V), as the verifier receives them (float32 allowed)
    draft: np.ndarray  # (R, gamma, V)
    steps: int = 2000  # verification steps per request

    def __post_init__(self):
        """Refuse rows that are not laws over one vocabulary, naming the argument."""
        target, draft = np.asarray(self.target), np.asarray(self.draft)
        if target.ndim != 3 or draft.ndim != 3:
            raise ValueError("Scenario needs target (R, gamma+1, V) and draft (R, gamma, V)")
        requests, length, vocab = target.shape
        if draft.shape != (requests, length - 1, vocab) or length < 1:
            raise ValueError(f"Scenario: target {target.shape} and draft {draft.shape} differ")
        for rows, name in ((target, "target"), (draft, "draft")):
            if rows.dtype.kind != "f" or not np.all(rows >= 0):
                raise ValueError(f"Scenario {name} must hold non-negative floats")
            if rows.size and np.abs(rows.sum(axis=2, dtype=float) - 1).max() > 1e-6:
                raise ValueError(f"Scenario {name} rows must sum to 1 (tolerance 1e-6)")
        if not isinstance(self.steps, int | np.integer) or self.steps < 1:
            raise ValueError(f"Scenario steps must be a positive integer, got {self.steps!r}")
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "draft", draft)

    @property
    def gamma(self):
        """Draft tokens per step."""
        return self.draft.shape[1]


def _law(rows):
    """Rows (..., V) in float64, each divided by its sum: the law of the rows as passed."""
    rows = np.asarray(rows, float)
    return rows / rows.sum(axis=-1, keepdims=True)


@functools.cache
def _projections_of(scenario):
    """Exact laws (floats), per request: β (R, γ), length (R, γ+1), kept and residual
    (R, γ, V), bonus (R, V)."""
    p, q = _law(scenario.target), _law(scenario.draft)
    overlap = np.minimum(p[:, :-1], q)  # (R, gamma, V)
    beta = np.minimum(overlap.sum(axis=2), 1)  # (R, gamma)
    reach = np.cumprod(np.concatenate([np.ones((len(p), 1)), beta], axis=1), axis=1)
    length = reach * np.append(1 - beta, np.ones((len(p), 1)), axis=1)  # P(A = k)
    residual = np.maximum(p[:, :-1] - q, 0)
    return {
        "beta": beta,
        "reach": reach,  # P(A ≥ k), (R, γ+1)
        "length": length,
        "kept": overlap / np.where(beta > 0, beta, 1)[..., None],
        "residual": residual / np.maximum(residual.sum(axis=2, keepdims=True), 1e-300),
        "bonus": p[:, -1],
    }


def projections(scenario):
    """The exact projections of a scenario's output law, as a dict of float arrays."""
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be a Scenario, got {type(scenario).__name__}")
    return _projections_of(scenario)


class Cells:
    """Cells fixed from the exact law alone: likely tokens alone, the rest pooled by id range."""

    def __init__(self, law, n_expected):
        """law (K,) over tokens (or lengths); n_expected: the draws the test expects."""
        law = np.asarray(law, float)
        self.cell = np.full(law.size, -1)  # -1: probability 0, any draw there fails at once
        single = law * n_expected >= MIN_EXPECTED
        if single.sum() > MAX_SINGLE:
            single[np.argsort(-law)[MAX_SINGLE:]] = False
        singles = np.flatnonzero(single)
        self.cell[singles] = np.arange(len(singles))
        rest = np.flatnonzero((law > 0) & ~single)
        mass = law[rest].sum()
        ranges = min(MAX_RANGES, int(n_expected * mass // (2 * MIN_EXPECTED)))
        if len(rest) and ranges:  # equal-mass ranges of ids, each expecting ≥ MIN_EXPECTED
            before = np.cumsum(law[rest]) - law[rest]
            self.cell[rest] = len(singles) + np.minimum(before / mass * ranges, ranges - 1)
        elif len(rest):  # too little mass for a cell of its own: it joins the least likely one
            self.cell[rest] = int(np.argmin(law[singles])) if len(singles) else 0
        used = law > 0  # number the cells 0, 1, ... in order, with no empty one
        self.cell[used] = np.unique(self.cell[used], return_inverse=True)[1]
        self.law = np.bincount(self.cell[used], weights=law[used])  # (C,)
        self.size = len(self.law)

    def counts(self, tokens):
        """Draws per cell (C,), and the draws on tokens of probability 0."""
        cell = self.cell[tokens]
        return np.bincount(cell[cell >= 0], minlength=self.size), int((cell < 0).sum())

    def name(self, index, unit="token"):
        """The tokens of a cell: 'token 17' or 'ids 1,024–2,047 (pooled, 812 tokens)'."""
        ids = np.flatnonzero(self.cell == index)
        if not len(ids):  # a law with no mass: every draw is forbidden
            return "none"
        if len(ids) == 1:
            return f"{unit} {ids[0]:,}"
        return f"{unit}s {ids[0]:,}–{ids[-1]:,} (pooled, {len(ids):,} of them)"


def sized_tv(cells, n_expected, level, power=POWER):
    """TV over the cells that n draws catch w.p. power: λ = 4·n·t² (Cauchy–Schwarz)."""
    if cells.size < 2 or n_expected <= 0:
        return float("nan")
    return float(np.sqrt(noncentrality_needed(cells.size - 1, level, power) / (4 * n_expected)))


def exact_scores(counts, law, u):
    """Scores z (..., C − 1) of counts (..., C) against law (C,), exactly i.i.d. N(0, 1) under it.

    Cell j's count given the cells before it is binomial (the draws left, law_j / Σ_{i≥j} law_i);
    its randomized probability integral transform, F(k − 1) + u_j·P(k) with u_j uniform (..., C−1),
    is then exactly uniform and independent of the cells before, so z_j = Φ⁻¹ of it is exactly
    N(0, 1), i.i.d. over j, at any count: no large-sample approximation.
    """
    counts, law = np.asarray(counts, np.int64), np.asarray(law, float)
    left = counts.sum(axis=-1, keepdims=True) - np.cumsum(counts, axis=-1) + counts  # cells ≥ j
    tail = np.cumsum(law[::-1])[::-1]  # Σ_{i≥j} law_i
    share = np.clip(law[:-1] / np.maximum(tail[:-1], 1e-300), 0, 1)
    k, trials = counts[..., :-1], left[..., :-1]
    share, u = np.broadcast_to(share, k.shape), np.broadcast_to(u, k.shape)
    at = stats.binom.pmf(k, trials, share)
    lower = stats.binom.cdf(k - 1, trials, share) + u * at  # the transform, U
    upper = 1 - lower  # 1 − U, recomputed from the upper tail where rounding would show
    far = upper < 1e-6
    upper[far] = stats.binom.sf(k[far], trials[far], share[far]) + (1 - u[far]) * at[far]
    # A transform of 0 (a count the law gives probability 0, or below 1e-300) would give an
    # infinite score, and inf · 0 a NaN in a direction's weighted sum: 1e-300 caps |z| at 37.0,
    # which changes the null law by less than 1e-300 and still fails any statistic.
    tail = np.maximum(np.minimum(lower, upper), 1e-300)
    return np.where(upper < lower, 1.0, -1.0) * stats.norm.isf(tail)


def exact_chi_square(counts, law, u):
    """Σ z_j² of exact_scores: exactly chi-square on C − 1 degrees of freedom under law, at any
    count. Each z_j² has the noncentrality of Pearson's component, so the power is Pearson's."""
    return (exact_scores(counts, law, u) ** 2).sum(axis=-1)


def direction_weights(law, direction):
    """Unit weights w (C − 1,) with Σ w_j z_j the score of exact_scores along direction (C,)
    (an alternative law minus law): exactly N(0, 1) under law, shifted by √(n Σ d²/law) under
    law + d for large n (z_j is, to first order, the standardized residual of cell j given the
    cells after it). None if the direction has no weight."""
    law, direction = np.asarray(law, float), np.asarray(direction, float)
    tail = np.cumsum(law[::-1])[::-1][:-1]  # Σ_{i≥j} law_i
    share = law[:-1] / tail
    after = np.cumsum(direction[::-1])[::-1][1:]  # Σ_{i>j} d_i
    spread = tail * share * (1 - share)
    w = np.where(spread > 0, ((1 - share) * direction[:-1] - share * after), 0)
    w = w / np.sqrt(np.where(spread > 0, spread, 1))
    norm = float(np.sqrt((w**2).sum()))
    return w / norm if norm > 1e-12 else None


def pearson_test(cells, tokens, level, rng, unit="token"):
    """The exact chi-square test of tokens (n,) against the cells' law, its randomization from
    rng: a dict for the audit's table."""
    counts, forbidden = cells.counts(tokens)
    n = counts.sum()
    observed, exact = counts / max(n, 1), cells.law
    worst = int(np.argmax(np.abs(observed - exact))) if n else 0
    row = {
        "draws": int(len(tokens)),
        "worst cell": cells.name(worst, unit),
        "observed": float(observed[worst]) if n else float("nan"),
        "exact": float(exact[worst]) if cells.size else 0.0,
        "statistic": float("nan"),
        "critical": float("nan"),
        "p-value": float("nan"),
    }
    if forbidden:
        bad = int(tokens[cells.cell[tokens] < 0][0])
        finding = f"{forbidden} draws of probability 0 (first: {unit} {bad:,})"
        return row | {"passed": False, "p-value": 0.0, "finding": finding}
    if cells.size < 2 or n == 0:
        return row | {"passed": True, "finding": "too few draws for a test (only the zeros)"}
    stat = float(exact_chi_square(counts, cells.law, rng.random(cells.size - 1)))
    p_value = float(stats.chi2.sf(stat, cells.size - 1))
    critical = float(stats.chi2.isf(level, cells.size - 1))
    finding = "law matches" if p_value >= level else "law differs from the exact one"
    return row | {
        "statistic": stat,
        "critical": critical,
        "p-value": p_value,
        "passed": p_value >= level,
        "finding": finding,
    }


def components(scenario):
    """The statistics of a scenario: (request, component, position) for each, in order."""
    gamma = scenario.gamma
    out = []
    for r in range(len(scenario.target)):
        out.append((r, "length law", None))
        for k in range(gamma):
            out += [(r, f"acceptance at {k}", k), (r, f"kept drafts at {k}", k)]
            out.append((r, f"residual at {k}", k))
        out.append((r, "bonus", gamma))
    return out


def _events(component, k, accepted, tokens):
    """The draws a component tests: accepted counts, or tokens at position k, (n,)."""
    if component == "length law":
        return accepted
    if component.startswith("acceptance"):
        return (accepted[accepted >= k] > k).astype(np.int64)  # 1: kept
    if component.startswith("kept"):
        return tokens[accepted > k, k]
    if component.startswith("residual"):
        return tokens[accepted == k, k]
    return tokens[accepted == len(tokens[0]) - 1, -1]  # the bonus


def _exact(component, law, r, k, steps):
    """(law of the component's draws, expected draws) for request r."""
    reach, beta = law["reach"][r], law["beta"][r]
    if component == "length law":
        return law["length"][r], steps
    if component.startswith("acceptance"):
        return np.array([1 - beta[k], beta[k]]), steps * reach[k]
    if component.startswith("kept"):
        return law["kept"][r, k], steps * reach[k + 1]
    if component.startswith("residual"):
        return law["residual"][r, k], steps * reach[k] * (1 - beta[k])
    return law["bonus"][r], steps * reach[-1]


def _statistics(scenario):
    """(request, component, position, cells, expected draws) of each statistic, in order."""
    law = _projections_of(scenario)
    for r, component, k in components(scenario):
        exact, n_expected = _exact(component, law, r, k, scenario.steps)
        yield r, component, k, Cells(exact, n_expected), n_expected


def _unit(component):
    """What a component's cells hold, for the diagnosis."""
    if component == "length law":
        return "length"
    return "outcome (1 kept)" if component.startswith("acceptance") else "token"


def power_rows(scenario, level):
    """Per statistic: expected draws, cells, and the TV over them caught w.p. POWER."""
    return [
        {
            "scenario": scenario.name,
            "request": r,
            "component": component,
            "expected draws": float(n),
            "cells": cells.size,
            "sized for TV": sized_tv(cells, n, level),
        }
        for r, component, _, cells, n in _statistics(scenario)
    ]


def component_rows(scenario, accepted, tokens, level, rng):
    """One table row per statistic of the scenario, from accepted (R, n) and tokens (R, n, γ+1);
    rng randomizes the exact tests."""
    rows = []
    for r, component, k, cells, n_expected in _statistics(scenario):
        events = _events(component, k, accepted[r], tokens[r])
        rows.append(
            {"scenario": scenario.name, "request": r, "component": component}
            | pearson_test(cells, events, level, rng, _unit(component))
            | {"sized for TV": sized_tv(cells, n_expected, level)}
        )
    return rows


# ---- how many draws catch chapter 6's bugs: an omnibus test, and one aimed at the bug ------


# ---- engine-shaped rows, seeded ---------------------------------------------------------------

ENGINE_SEED = 2027  # the engine scenarios' rows are fixed; the audit's seed drives the draws


def _zipf(rng, shape, exponent=1.1):
    """Zipf-like rows (..., V): mass ∝ rank^(−exponent), ranks assigned to random ids."""
    vocab = shape[-1]
    weights = np.arange(1, vocab + 1, dtype=float) ** -exponent
    rows = weights[rng.random(shape).argsort(axis=-1)]
    return rows / rows.sum(axis=-1, keepdims=True)


def _drafter_of(rng, target, spread):
    """Draft rows near the target rows (..., V): log q = log p + spread·N(0, 1), renormalised."""
    logq = np.log(np.maximum(target, 1e-300)) + spread * rng.standard_normal(target.shape)
    q = np.where(target > 0, np.exp(logq - logq.max(axis=-1, keepdims=True)), 0)
    return q / q.sum(axis=-1, keepdims=True)


def _processed(rows, temperature, top_k, top_p):
    """rows^(1/T), then top-k, then top-p, renormalised (ties: any order), (..., V)."""
    weights = rows ** (1 / temperature)
    order = np.argsort(-weights, axis=-1)
    ordered = np.take_along_axis(weights, order, axis=-1)
    mass = np.cumsum(ordered, axis=-1) / ordered.sum(axis=-1, keepdims=True)
    keep = (np.arange(rows.shape[-1]) < top_k) & (
        mass - ordered / ordered.sum(-1, keepdims=True) < top_p
    )
    kept = np.zeros_like(weights)
    np.put_along_axis(kept, order, np.where(keep, ordered, 0), axis=-1)
    return kept / kept.sum(axis=-1, keepdims=True)


def _bf16_softmax(logits):
    """Rows from logits rounded to bfloat16, softmax in float32, as engines hold them, (..., V)."""
    logits = _bf16(logits)
    z = np.exp((logits - logits.max(axis=-1, keepdims=True)).astype(np.float32))
    return (z / z.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)


def _one_hot_like(rows):
    """One-hot rows (..., V) at each row's argmax: greedy decoding's target."""
    return (np.arange(rows.shape[-1]) == rows.argmax(axis=-1)[..., None]) * 1.0


@functools.cache
def engine_scenarios():
    """The engine suite: large and peaked vocabularies, long drafts, mixed batches, greedy,
    processed, float32 and bfloat16 rows; built from ENGINE_SEED."""
    rng = np.random.default_rng(ENGINE_SEED)
    big = _zipf(rng, (2, 3, 128_256))
    mixed = _zipf(rng, (8, 6, 32_000), 1.2)
    spreads = np.array([0.1, 0.3, 0.6, 1.0, 1.5, 2.0, 3.0, 5.0])[:, None, None]
    long = _zipf(rng, (2, 9, 2_048), 0.9)
    greedy = _zipf(rng, (2, 5, 32_000))
    raw = _zipf(rng, (2, 4, 32_000))
    processed = _processed(raw, 0.7, 50, 0.9)
    draft_processed = _processed(_drafter_of(rng, raw[:, :3], 0.3), 1.0, 40, 0.95)
    logits = np.log(_zipf(rng, (2, 4, 32_000)))
    bf16 = _bf16_softmax(logits)
    bf16_draft = _bf16_softmax(logits[:, :3] + 0.5 * rng.standard_normal((2, 3, 32_000)))
    equal = _zipf(rng, (2, 7, 8_192))
    return [
        Scenario(
            "V = 128,256, Zipf rows over permuted ids, γ = 2",
            big,
            _drafter_of(rng, big[:, :2], 1.0),
            steps=4_500,
        ),
        Scenario(
            "V = 2,048, γ = 8, rows differ by position",
            long,
            _drafter_of(rng, long[:, :8], 0.4),
            steps=25_000,
        ),
        Scenario(
            "V = 32,000, 8 requests of different acceptance, γ = 5",
            mixed,
            _drafter_of(rng, mixed[:, :5], spreads),
            steps=1_500,
        ),
        Scenario(
            "one-hot (greedy) target, V = 32,000, γ = 4",
            _one_hot_like(greedy),
            0.6 * _one_hot_like(greedy[:, :4]) + 0.4 * _drafter_of(rng, greedy[:, :4], 0.5),
            steps=2_000,
        ),
        Scenario(
            "temperature 0.7, top-k 50, top-p 0.9, V = 32,000, γ = 3",
            processed,
            draft_processed,
            steps=3_000,
        ),
        Scenario("bfloat16 logits, float32 rows, V = 32,000, γ = 3", bf16, bf16_draft, steps=3_000),
        Scenario("p = q, V = 8,192, γ = 6", equal, equal[:, :6].copy(), steps=3_000),
    ]


# ---- running a verifier on a scenario ----------------------------------------------------------


def output_problem(result, drafts, vocab):
    """What is wrong with a verifier's (accepted, tokens), or None; then both as int64 arrays.

    Any array-like pair is read (numpy, lists, torch tensors on the CPU), integers or floats
    holding integers.
    """
    n, gamma = drafts.shape
    try:
        accepted, tokens = (np.asarray(part) for part in result)
    except (TypeError, ValueError):
        return "did not return a pair (accepted, tokens)", None, None
    if accepted.shape != (n,) or tokens.shape != (n, gamma + 1):
        shapes = f"{accepted.shape}, {tokens.shape}; need {(n,)}, {(n, gamma + 1)}"
        return f"returned shapes {shapes}", None, None
    for part in (accepted, tokens):
        integral = part.dtype.kind in "iu" or (
            part.dtype.kind == "f" and np.array_equal(part, np.round(part))
        )
        if not integral:
            return f"returned dtype {part.dtype} holding non-integers", None, None
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


def _draw_drafts(cumulative, ids, rng):
    """Drafts (b, γ) for requests ids (b,): inverse CDF of the draft rows' sums (R, γ, V)."""
    u = rng.random((len(ids), cumulative.shape[1]))
    tokens = np.empty(u.shape, dtype=np.int64)
    for r, rows in enumerate(cumulative):
        mine = ids == r
        for i, row in enumerate(rows):  # the first running sum above u·total
            tokens[mine, i] = np.searchsorted(row, _below(u[mine, i], row[-1]), side="right")
    return tokens


def _drafter_problem(drafts, shape, vocab):
    """What is wrong with a drafter's tokens, or None; then the tokens as int64."""
    drafts = np.asarray(drafts)
    if drafts.shape != shape or drafts.dtype.kind not in "iu":
        return f"drafter returned {drafts.shape} {drafts.dtype}; need integers {shape}", None
    if drafts.size and (drafts.min() < 0 or drafts.max() >= vocab):
        return f"drafter returned tokens outside [0, {vocab})", None
    return None, drafts.astype(np.int64)


def _batches(scenario):
    """Read-only batches of the scenario's requests, interleaved: target, draft, request ids."""
    requests = len(scenario.target)
    per_request = scenario.target[0].nbytes + scenario.draft[0].nbytes
    size = requests * max(1, min(scenario.steps, BATCH_BYTES // (requests * per_request)))
    ids = np.arange(size) % requests
    arrays = [np.take(rows, ids, axis=0) for rows in (scenario.target, scenario.draft)]
    for array in arrays:
        array.setflags(write=False)  # a verifier that writes into them gets copies (_call)
    return *arrays, ids


def _call(verify_fn, target, draft, drafts, rng):
    """verify_fn on read-only rows; on writable copies if it writes into its inputs."""
    try:
        return verify_fn(target, draft, drafts.copy(), rng)
    except ValueError as error:
        if "read-only" not in str(error):
            raise
    return verify_fn(target.copy(), draft.copy(), drafts.copy(), rng)  # fresh rows each call


def run_scenario(verify_fn, scenario, rng, drafter=None):
    """Verify each request `steps` times: accepted (R, n) and tokens (R, n, γ+1), or a problem.

    The audit draws the drafts from the draft rows, unless a drafter(draft_probs, rng) does.
    """
    requests, gamma, vocab = scenario.draft.shape
    target, draft, ids = _batches(scenario)
    cumulative = np.cumsum(_law(scenario.draft), axis=2)  # (R, gamma, V)
    accepted = np.empty((requests, scenario.steps), dtype=np.int64)
    tokens = np.empty((requests, scenario.steps, gamma + 1), dtype=np.int64)
    for start in range(0, scenario.steps, len(ids) // requests):
        rounds = min(len(ids) // requests, scenario.steps - start)
        b = rounds * requests
        if drafter is None:
            drafts = _draw_drafts(cumulative, ids[:b], rng)
        else:
            problem, drafts = _drafter_problem(drafter(draft[:b], rng), (b, gamma), vocab)
            if problem:
                return problem
        result = _call(verify_fn, target[:b], draft[:b], drafts, rng)
        problem, kept, emitted = output_problem(result, drafts, vocab)
        if problem:
            return problem
        accepted[:, start : start + rounds] = kept.reshape(rounds, requests).T
        tokens[:, start : start + rounds] = emitted.reshape(rounds, requests, -1).swapaxes(0, 1)
    return accepted, tokens
