"""Chapter 7, third part: lossy verifiers, which keep more drafts than min(1, p/q) allows.

Each is a `Rule`, so its tokens per call and the total variation of its output from the target
are computed exactly on the toy; greedy and strict verification as special cases.
"""

import numpy as np

from .block import rule_tokens_per_call
from .exact import speculative_law, target_joint
from .models import BOS, P_MATRIX, draft_matrix
from .rule import Rule, _ratio
from .stats import law_tv
from .theory import PI_P_VECTOR

# ---- Lossy verifiers: rules that keep more than min(1, p/q) allows -------------------------
# Their accept functions read whole rows (…, V), so they serve Rule.tables (exact analysis).


def _entropy(p):
    """H(p) = −Σ p log p along the last axis, (…, 1)."""
    logs = np.log(np.where(p > 0, p, 1))
    return -(p * logs).sum(axis=-1, keepdims=True)


def _argmax_one_hot(p):
    """The one-hot law at argmax p (first index on ties)."""
    return np.eye(p.shape[-1])[np.argmax(p, axis=-1)]


def _medusa_threshold(p, scale=1.0):
    """min(ε, δ·e^{−H(p)}) of rows p, (…, 1); (ε, δ) = scale·(0.09, 0.3), Medusa's."""
    return np.minimum(0.09 * scale, 0.3 * scale * np.exp(-_entropy(p)))


def medusa_rule(scale=1.0):
    """Medusa's rule: keep x iff p(x) > min(ε, δ·e^{−H(p)}), else draw argmax p."""
    return Rule(
        f"Medusa typical, scale {scale:g}",
        accept=lambda p, q: (p > _medusa_threshold(p, scale)) * 1.0,
        correction=lambda p, q: _argmax_one_hot(p),
    )


def threshold_rule(tau):
    """Keep x iff p(x) ≥ τ, in place of the ratio test; on rejection, the residual."""
    return Rule(f"p(x) ≥ {tau:g}", accept=lambda p, q: (p >= tau) * 1.0)


def loosened_rule(t):
    """Thresholds t < 1: keep w.p. min(1, ratio/t), or surely if p(x) ≥ t."""
    return Rule(
        f"thresholds {t:g}",
        accept=lambda p, q: np.maximum(np.minimum(1, _ratio(p, q) / t), (p >= t) * 1.0),
    )


LOSSY_KNOBS = {  # rule family, knob values from lossy to exact (or least lossy)
    "Medusa typical (ε, δ)·s": (medusa_rule, [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]),
    "p(x) ≥ τ": (threshold_rule, [0.02, 0.04, 0.06, 0.1, 0.15, 0.2, 0.3]),
    "thresholds t < 1": (loosened_rule, [0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0]),
}


def rule_output_tv(w, gamma, rule, k=2):
    """TV between the law of the first k tokens from BOS under rule, and the target's."""
    law = speculative_law(k, gamma, w, BOS, rule=rule, exact=False)
    return float(law_tv(law, target_joint(k, BOS, exact=False)))


def lossy_frontier(w=0.3, gamma=3):
    """Rows (family, knob, tokens per call, TV) for every lossy knob value, at (w, γ)."""
    rows = []
    for family, (make, knobs) in LOSSY_KNOBS.items():
        for knob in knobs:
            rule = make(knob)
            rows.append(
                (family, knob, rule_tokens_per_call(w, gamma, rule), rule_output_tv(w, gamma, rule))
            )
    return rows


# ---- Greedy and strict verification as special cases ----------------------------------------


def strict_alpha(w):
    """Strict sampler-match verification: keep x iff x = y, y ~ p fresh; α = Σ_c π(c)·Σ p·q_w."""
    return float(PI_P_VECTOR @ (P_MATRIX[1:] * draft_matrix(w)[1:]).sum(axis=1))
