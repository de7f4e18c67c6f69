"""Chapter 6: verifiers and drafters to audit, correct ones and ones with bugs planted in them.

`rule_verifier` runs any RowRule (the exact one or chapter 3's broken ones) with `verify`'s
interface; `greedy_target_verifier` verifies against the target's argmax. `loop_verify` is a
correct verifier written position by position, with hooks where `ENGINE_BUGS` plant the bugs
that show only at engine scale. `sample_drafter` drafts with fresh noise for the end-to-end
mode, `reusing_drafter` shares its noise with the verifier, `confidence_drafter` stops early as
transformers 4.45 does (correct), and `greedy_assistant_drafter` is transformers 4.44.2's bug.
"""

import numpy as np

from .verify import (
    _accepted_count,
    _below,
    _cell_offsets,
    _checked_batch,
    _draw_final,
    _emitted,
    _entries,
    _rows_at,
    verify,
)

# ---- verifiers of any RowRule, and of the target's argmax -------------------------------------


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


# ---- verifiers written position by position, and engine bugs planted in them ------------------


def _draw(weights, u):
    """One inverse-CDF draw from each row of weights (b, V) with a positive sum, (b,)."""
    cumulative = np.cumsum(weights, axis=1)
    return np.count_nonzero(cumulative <= _below(u, cumulative[:, -1])[:, None], axis=1)


def loop_verify(target_probs, draft_probs, draft_tokens, rng, row=None, bonus=None, kept=None):
    """A correct verifier written position by position; row(i), bonus(γ) and kept(weights, i)
    choose the rows read and the residual's tokens, so engine bugs can be planted in it."""
    p, q = np.asarray(target_probs, float), np.asarray(draft_probs, float)  # (B, γ+1, V), (B, γ, V)
    batch, gamma = draft_tokens.shape
    at = np.arange(batch)
    tokens = np.full((batch, gamma + 1), -1)
    accepted = np.full(batch, gamma)
    for i in range(gamma):
        j = i if row is None else row(i)
        x, alive = draft_tokens[:, i], accepted == gamma
        keep = rng.random(batch) * q[at, j, x] < p[at, j, x]  # r < p(x)/q(x)
        tokens[alive & keep, i] = x[alive & keep]
        stop = alive & ~keep
        residual = np.maximum(p[stop, j] - q[stop, j], 0)  # (b, V)
        residual = residual if kept is None else kept(residual, i)
        residual[residual.sum(axis=1) <= 0] = p[stop, j][residual.sum(axis=1) <= 0]  # no mass: p
        tokens[stop, i] = _draw(residual, rng.random(int(stop.sum())))
        accepted[stop] = i
    last = accepted == gamma
    bonus_row = gamma if bonus is None else bonus(gamma)
    tokens[last, gamma] = _draw(p[last, bonus_row], rng.random(int(last.sum())))
    return accepted, tokens


def _below_1024(weights, i):
    """The residual's weights with every id from 1,024 on dropped (a kernel's short loop)."""
    weights = weights.copy()
    weights[:, 1024:] = 0
    return np.where(weights.sum(axis=1, keepdims=True) > 0, weights, 1.0)


ENGINE_BUGS = {  # verifiers that pass the small suite's scenarios or show only at engine scale
    "residual ignores ids ≥ 1,024": lambda *a: loop_verify(*a, kept=_below_1024),
    "rows past position 5 from a buffer of 6": lambda *a: loop_verify(*a, row=lambda i: min(i, 5)),
    "bonus from the last draft position": lambda *a: loop_verify(*a, bonus=lambda g: max(g - 1, 0)),
}


# ---- drafters for the end-to-end mode: one correct, one that reuses its noise ---------------


def sample_drafter(draft_probs, rng):
    """Drafts (B, γ) from draft rows (B, γ, V): one fresh uniform per token, inverse CDF."""
    rows = np.asarray(draft_probs, float)
    batch, gamma, vocab = rows.shape
    return _draw(rows.reshape(-1, vocab), rng.random(batch * gamma)).reshape(batch, gamma)


def reusing_drafter(draft_probs, rng):
    """sample_drafter, then the generator put back as it was: the verifier reuses its uniforms."""
    state = rng.bit_generator.state
    drafts = sample_drafter(draft_probs, rng)
    rng.bit_generator.state = state  # the bug: noise shared between drafter and verifier
    return drafts


def confidence_drafter(threshold):
    """A drafter that stops once it drafts a token its q gives less than threshold, as
    transformers 4.45's `assistant_confidence_threshold` (ConfidenceCriteria) does: drafts
    (B, γ) with −1 after each row's stop, and the q rows it drew from. Correct: the number of
    drafts depends on the drafted tokens, never on the verifier's uniforms."""

    def drafter(draft_probs, rng):
        """sample_drafter's drafts, cut after the first with q(x) < threshold."""
        q = np.asarray(draft_probs, float)
        drafts = sample_drafter(q, rng)
        low = np.take_along_axis(q, drafts[..., None], axis=2)[..., 0] < threshold  # (B, γ)
        stopped = np.cumsum(low, axis=1) - low > 0  # a low-confidence draft came before
        return np.where(stopped, -1, drafts), draft_probs

    drafter.__name__ = drafter.__qualname__ = f"confidence_drafter({threshold:g})"
    return drafter


def greedy_assistant_drafter(draft_probs, rng):
    """transformers 4.44.2's bug (issue 32867): the assistant drafts its argmax, but reports
    its softmax as q, so the ratio p(x)/q(x) is taken for a token q did not sample."""
    return np.asarray(draft_probs).argmax(axis=2), draft_probs
