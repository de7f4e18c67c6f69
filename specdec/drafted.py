"""Chapter 6: drafter mode, drafts of any number audited by what must hold whatever the number.

A drafter may stop early (transformers 4.45's confidence stop, any end-of-sequence stop), so the
number of drafts may depend on the drafted tokens, and the per-position laws of the engine suite
no longer hold. What holds whatever decides the number, as long as the decision at a position
depends only on the tokens before it: each draft is a draw from the q row the drafter returns
(its randomized probability integral transform is uniform, position by position), and the
emitted tokens at each position follow the target's row there. `run_drafted` runs a drafter and
a verifier on a Scenario; `drafted_rows` tests the record; `exercised` says what was reached.
"""

import functools
from typing import NamedTuple

import numpy as np
from scipy import stats

from .pipelines import noncentrality_needed
from .projections import (
    MIN_EXPECTED,
    POWER,
    Cells,
    Scenario,
    _batches,
    _call,
    _drafter_of,
    _zipf,
    exact_chi_square,
    output_problem,
    pearson_test,
    sized_tv,
)
from .projections import _law as _law_rows

DRAFTED_SEED = 2030  # confidence_scenario's rows are fixed

DRAFT_PIT_BINS = 20  # at most this many equal bins of a position's transforms, each expecting ≥ 20
Q_TOLERANCE = 1e-3  # a drafter's q row may sum to 1 within this (float32 rows over 128k ids)
NO_ANSWER = (None, None, None)  # _drafter_answer's drafts, q and lengths, when there is a problem


class Drafted(NamedTuple):
    """Drafter mode's record of a scenario, per request r and step s: the number of drafts
    (R, n), each draft's probability integral transform under its q row (R, n, γ; NaN where
    none was drafted), and the emitted tokens (R, n, γ + 1; −1 after the last)."""

    lengths: np.ndarray
    transforms: np.ndarray
    emitted: np.ndarray


def drafter_components(scenario):
    """Drafter mode's statistics of a scenario: (request, component, position) for each."""
    gamma = scenario.gamma
    out = []
    for r in range(len(scenario.target)):
        out += [(r, f"draft at {i} against the drafter's q", i) for i in range(gamma)]
        out += [(r, f"emitted token at {j} against p", j) for j in range(gamma + 1)]
    return out


def _where(request, step, position=None):
    """'step 3 of request 1, position 2' for a message."""
    at = f"step {step} of request {request}"
    return at if position is None else f"{at}, position {position}"


def _drafter_answer(answer, draft, ids, first_step):
    """The drafter's answer read: drafts (B, γ) as int64, their q rows (B, γ, V) and lengths
    (B,); or a problem naming the row. answer: drafts, or (drafts, q)."""
    requests = int(ids.max()) + 1
    batch, gamma, vocab = draft.shape
    drafts, q = answer if isinstance(answer, tuple | list) and len(answer) == 2 else (answer, None)
    try:
        drafts = np.asarray(drafts)
        q = draft if q is None else np.asarray(q)
    except (TypeError, ValueError) as error:
        return f"drafter returned something that is not arrays: {error}", *NO_ANSWER
    if drafts.shape != (batch, gamma) or drafts.dtype.kind not in "iu":
        shape = f"{drafts.shape} {drafts.dtype}"
        return f"drafter returned drafts {shape}; need integers {(batch, gamma)}", *NO_ANSWER
    drafts = drafts.astype(np.int64)
    lengths = (drafts >= 0).sum(axis=1)
    holes = (drafts >= 0) != (np.arange(gamma) < lengths[:, None])
    if holes.any() or lengths.min() < 1:
        b = int(np.flatnonzero(holes.any(axis=1) | (lengths < 1))[0])
        where = _where(ids[b], first_step + b // requests)
        return f"drafter returned −1 before a draft, or no draft, at {where}", *NO_ANSWER
    if drafts.max() >= vocab:
        b, i = np.argwhere(drafts >= vocab)[0]
        where = _where(ids[b], first_step + b // requests, i)
        return f"drafter returned token {drafts[b, i]} at {where}, outside [0, {vocab})", *NO_ANSWER
    if q.shape != draft.shape or q.dtype.kind != "f":
        return f"drafter returned q {q.shape} {q.dtype}; need floats {draft.shape}", *NO_ANSWER
    drafted = np.arange(gamma) < lengths[:, None]  # (B, γ)
    sums = q.sum(axis=2, dtype=np.float64)
    bad = {
        "holds NaN or infinity": ~np.isfinite(sums),
        "has a negative entry": (q < 0).any(axis=2) & np.isfinite(sums),
        f"sums to 1 only within {abs(sums - 1).max():.3g} (more than {Q_TOLERANCE:g})": np.abs(
            sums - 1
        )
        > Q_TOLERANCE,
    }
    for what, rows in bad.items():
        rows = rows & drafted
        if rows.any():
            b, i = np.argwhere(rows)[0]
            return (
                f"drafter's q row at {_where(ids[b], first_step + b // requests, i)} {what}",
                *NO_ANSWER,
            )
    at = np.take_along_axis(q, np.maximum(drafts, 0)[..., None], axis=2)[..., 0]
    if np.any(drafted & (at <= 0)):
        b, i = np.argwhere(drafted & (at <= 0))[0]
        where = _where(ids[b], first_step + b // requests, i)
        return (
            f"drafter drew token {drafts[b, i]}, which its q gives probability 0, at {where}",
            *NO_ANSWER,
        )
    return None, drafts, q, lengths


def _transforms(drafts, q, lengths, rng):
    """Randomized probability integral transforms (B, γ) of the drafts under their q rows,
    (F(x − 1) + u·q(x)) / Σq: exactly uniform when x is a draw from the row; NaN past a row's
    last draft."""
    q = np.asarray(q, np.float64)
    x = np.maximum(drafts, 0)[..., None]
    at = np.take_along_axis(q, x, axis=2)[..., 0]
    below = np.take_along_axis(np.cumsum(q, axis=2), x, axis=2)[..., 0] - at
    u = (below + rng.random(drafts.shape) * at) / q.sum(axis=2)
    return np.where(np.arange(drafts.shape[1]) < lengths[:, None], np.clip(u, 0, 1), np.nan)


def run_drafted(verify_fn, scenario, rng, drafter):
    """Drafter mode on a scenario: drafter(draft_probs (B, γ, V), rng) returns the drafts
    (B, γ), −1 after a row's last (at least one), or (drafts, q) with q (B, γ, V) the rows it
    drew them from; q is the scenario's draft rows otherwise. The steps of each length k go to
    verify_fn with the q rows cut to k. A Drafted record, or a problem naming the row."""
    requests, gamma, vocab = scenario.draft.shape
    target, draft, ids = _batches(scenario)
    lengths = np.zeros((requests, scenario.steps), dtype=np.int64)
    transforms = np.full((requests, scenario.steps, gamma), np.nan)
    emitted = np.full((requests, scenario.steps, gamma + 1), -1, dtype=np.int64)
    per_batch = len(ids) // requests
    for start in range(0, scenario.steps, per_batch):
        rounds = min(per_batch, scenario.steps - start)
        b = rounds * requests
        answer = drafter(draft[:b], rng)
        problem, drafts, q, drawn = _drafter_answer(answer, draft[:b], ids[:b], start)
        if problem:
            return problem
        out = np.full((b, gamma + 1), -1, dtype=np.int64)
        for k in np.unique(drawn):
            rows = slice(None) if drawn.min() == gamma else np.flatnonzero(drawn == k)
            cut = drafts[rows, :k]
            result = _call(verify_fn, target[:b][rows, : k + 1], q[rows, :k], cut, rng)
            problem, _, tokens = output_problem(result, cut, vocab)
            if problem:
                return f"with {k} draft{'s' * (k > 1)}: {problem}"
            out[rows, : k + 1] = tokens
        steps = slice(start, start + rounds)
        for name, value in (("lengths", drawn), ("emitted", out)):
            value = value.reshape(rounds, requests, *value.shape[1:]).swapaxes(0, 1)
            {"lengths": lengths, "emitted": emitted}[name][:, steps] = value
        pit = _transforms(drafts, q, drawn, rng).reshape(rounds, requests, gamma)
        transforms[:, steps] = pit.swapaxes(0, 1)
    return Drafted(lengths, transforms, emitted)


def _pit_test(values, level, rng):
    """The exact chi-square test of transforms (n,) against the uniform law, over equal bins
    (at most DRAFT_PIT_BINS, each expecting ≥ MIN_EXPECTED): a dict for the audit's table."""
    n = len(values)
    bins = int(np.clip(n // MIN_EXPECTED, 2, DRAFT_PIT_BINS))
    counts = np.bincount(np.minimum((values * bins).astype(int), bins - 1), minlength=bins)
    law = np.full(bins, 1 / bins)
    worst = int(np.argmax(np.abs(counts / n - law)))
    stat = float(exact_chi_square(counts, law, rng.random(bins - 1)))
    p_value, critical = float(stats.chi2.sf(stat, bins - 1)), float(stats.chi2.isf(level, bins - 1))
    passed = p_value >= level
    return {
        "draws": n,
        "worst cell": f"transform in [{worst / bins:.2f}, {(worst + 1) / bins:.2f})",
        "observed": float(counts[worst] / n),
        "exact": float(law[worst]),
        "statistic": stat,
        "critical": critical,
        "p-value": p_value,
        "passed": passed,
        "finding": "drafts match the q returned"
        if passed
        else "drafts are not draws from the q the drafter returned (their transforms are not "
        "uniform)",
        "sized for TV": float(np.sqrt(noncentrality_needed(bins - 1, level, POWER) / (4 * n))),
    }


NOT_REACHED = "not exercised: no step reached this position"


def drafted_rows(scenario, record, level, rng):
    """Drafter mode's rows: per request, each draft position's transforms against the uniform
    law, and each position's emitted tokens against p there (a position never reached passes,
    and says so). Both hold whatever decides the number of drafts, as long as the decision at
    a position depends only on the tokens before it."""
    p = _law_rows(scenario.target)
    rows = []
    for r, component, at in drafter_components(scenario):
        row = {"scenario": scenario.name, "request": r, "component": component}
        if component.startswith("draft"):
            values = record.transforms[r, :, at]
            values = values[~np.isnan(values)]
        else:
            values = record.emitted[r, :, at]
            values = values[values >= 0]
        if not len(values):
            rows.append(row | {"draws": 0, "passed": True, "finding": NOT_REACHED})
        elif component.startswith("draft"):
            rows.append(row | _pit_test(values, level, rng))
        else:
            cells = Cells(p[r, at], len(values))
            test = pearson_test(cells, values, level, rng)
            test["sized for TV"] = sized_tv(cells, len(values), level)
            rows.append(row | test)
    return rows


def exercised(scenario, record):
    """A line saying how many steps drafted each number of tokens, how many drafts and emitted
    tokens each position's statistics saw (over the requests), and what was never reached."""
    gamma = scenario.gamma
    counts = np.bincount(record.lengths.ravel(), minlength=gamma + 1)[1:]
    said = "; ".join(f"{k} → {n:,}" for k, n in enumerate(counts, 1))
    line = f"  Drafter mode, {scenario.name}: steps by number of drafts: {said}"
    longest = int(np.flatnonzero(counts)[-1]) + 1  # every step drafts at least one token
    if longest < gamma:  # a gap: positions no step reached
        line += f"; no step drafted more than {longest}: draft positions {longest} to "
        line += f"{gamma - 1} were never audited"
    drafts = (~np.isnan(record.transforms)).sum(axis=(0, 1))
    emitted = (record.emitted >= 0).sum(axis=(0, 1))
    line += f". Draws audited by position, drafts: {', '.join(f'{n:,}' for n in drafts)}"
    return line + f"; emitted tokens: {', '.join(f'{n:,}' for n in emitted)}"


@functools.cache
def confidence_scenario(steps=2_000):
    """Two requests of Zipf rows over V = 16, γ = 3, the draft near the target: a drafter that
    stops below confidence 0.08 drafts 1, 2 and 3 tokens, each in a good share of the steps."""
    rng = np.random.default_rng(DRAFTED_SEED)
    target = _zipf(rng, (2, 4, 16), 1.0)
    return Scenario("Zipf rows, V = 16, γ = 3", target, _drafter_of(rng, target[:, :3], 0.5), steps)
