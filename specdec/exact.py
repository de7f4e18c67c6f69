"""Chapters 2–3: exact laws, every path of the algorithm enumerated in Fractions.

The tables come from the integer counts, so a law computed here is exact, not a float that
happens to agree.
"""

from collections import defaultdict
from fractions import Fraction
from numbers import Integral

import numpy as np

from .checks import MAX_OUTCOMES, _check_count, _check_unit_interval
from .models import (
    BIGRAM_COUNTS,
    BOS,
    CONTEXT_INDEX,
    P_MATRIX,
    UNIGRAM_COUNTS,
    VOCAB,
    V,
    _check_context,
    draft_matrix,
)
from .rule import EXACT_RULE, _check_step_args, _residual_weights

P_FRACTIONS = np.array(
    [[Fraction(int(c), int(row.sum())) for c in row] for row in BIGRAM_COUNTS], dtype=object
)  # (19, 18)
Q0_FRACTIONS = np.array(
    [Fraction(int(c), int(UNIGRAM_COUNTS.sum())) for c in UNIGRAM_COUNTS], dtype=object
)  # (18,)


def as_fraction(x):
    """x as a Fraction; a float is read as its shortest decimal (0.3 -> 3/10)."""
    return x if isinstance(x, (Fraction, Integral)) else Fraction(repr(float(x)))


def model_matrices(w, exact=True):
    """(P, Q_w), both (19, 18): Fractions when exact, else floats."""
    _check_unit_interval(w, "w")
    if not exact:
        return P_MATRIX, draft_matrix(w)
    w = as_fraction(w)
    return P_FRACTIONS, w * P_FRACTIONS + (1 - w) * Q0_FRACTIONS


JOINT_MAX_K = max(k for k in range(20) if V**k <= MAX_OUTCOMES)  # 4: 18^4 = 104,976 outcomes


def target_joint(k, ctx=BOS, exact=True):
    """The target chain's law of its next k tokens after ctx: {k-character string: probability}."""
    _check_count(k, "k", JOINT_MAX_K, f"the law lists 18^k outcomes, at most {MAX_OUTCOMES:,}")
    _check_context(ctx)
    p, _ = model_matrices(0, exact)
    law = {"": Fraction(1) if exact else 1.0}
    for _ in range(k):
        law = {
            s + tok: mass * p[CONTEXT_INDEX[s[-1:] or ctx], t]
            for s, mass in law.items()
            for t, tok in enumerate(VOCAB)
        }
    return law


LAW_MAX_K = 3  # k = 3 enumerates in seconds, k = 4 in about 3 minutes (Fractions, γ = 2)


def speculative_law(k, gamma, w, ctx=BOS, rule=EXACT_RULE, exact=True):
    """Law of the first k tokens of speculative generation from ctx, every draft path enumerated."""
    _check_count(k, "k", LAW_MAX_K, "every draft path is enumerated: k = 4 takes minutes")
    _check_step_args(ctx, gamma, w)
    p, q = model_matrices(w, exact)
    accept, correction = rule.tables(p, q)  # (19, 18) each, per context and drafted token
    law = defaultdict(int)

    def new_step(prefix, c, mass):
        """Start a speculative step at context row c with `prefix` already emitted."""
        if len(prefix) == k:
            law[prefix] += mass
        else:
            draft_walk(prefix, c, 0, mass, 1)

    def draft_walk(prefix, c, depth, draft_mass, passed):
        """Extend an accepted draft; passed = P(the uniform(s) passed every test so far)."""
        if len(prefix) == k:
            law[prefix] += draft_mass * passed
            return
        if depth == gamma:  # all drafts kept: bonus token from p
            for t, tok in enumerate(VOCAB):
                new_step(prefix + tok, t + 1, draft_mass * passed * p[c, t])
            return
        rejected = 0
        for y, tok in enumerate(VOCAB):  # draft y, then test it
            kept = min(passed, accept[c, y]) if rule.shared_uniform else passed * accept[c, y]
            rejected += q[c, y] * (passed - kept)
            draft_walk(prefix + tok, y + 1, depth + 1, draft_mass * q[c, y], kept)
        for t, tok in enumerate(VOCAB):  # first rejection: draw the correction
            new_step(prefix + tok, t + 1, draft_mass * rejected * correction[c, t])

    new_step("", CONTEXT_INDEX[ctx], Fraction(1) if exact else 1.0)
    return dict(law)


def law_difference(law, reference):
    """Largest |law − reference| over the union of their outcomes."""
    keys = set(law) | set(reference)
    return max(abs(law.get(s, 0) - reference.get(s, 0)) for s in keys)


def two_path_identity(w, exact=True):
    """min(p, q) + max(0, p − q) − p for every context and token, (19, 18): zero by the theorem."""
    p, q = model_matrices(w, exact)
    return np.minimum(p, q) + _residual_weights(p, q) - p
