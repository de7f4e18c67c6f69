"""Chapters 2–3: the rejection rule, literally (Leviathan et al., Algorithm 1), and as data.

The literal step reads like the paper, one Python call per draft token. `Rule` states a
verifier as its accept and correction functions, so the exact enumeration and the vectorised
engine run the same rule; `BROKEN_RULES` are the deliberately wrong ones that chapter 3's tests
must reject.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .checks import MAX_LOOP, _check_count, _check_rng, _check_unit_interval
from .models import VOCAB, _check_context, _draw, p_dist, q_dist


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


# ---- Verifiers as data: the correct rule and deliberately broken ones ---------------------------
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
