"""Chapter 7, first part: several draft candidates at one position.

Each multi-draft rule is a state that every rejection updates; `multi_draft_law` enumerates
every candidate sequence exactly, `multi_draft_verify` runs a batch, and a linear program gives
the best acceptance any rule could reach with two candidates.
"""

from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .checks import _check_rng
from .exact import model_matrices
from .models import CONTEXT_INDEX
from .rule import EXACT_RULE, _normalise_or, _ratio
from .verify import _check_batch, _sample_rows

# One position, k candidates: a rule is a state (p_i, q_i, ...) that each rejection updates.
# The exact law enumerates every candidate sequence; the engine runs the same rule on a batch.


def _keep(p_x, q_x):
    """min(1, p(x)/q(x)), and 0 where q(x) = 0: one candidate's acceptance probability."""
    return min(1, p_x / q_x) if q_x > 0 else 0 * p_x


def _zeroed(law, x):
    """law with token x set to 0, not renormalised."""
    out = law.copy()
    out[x] = 0
    return out


def _drop(law, x):
    """law with token x removed and renormalised (law itself if nothing is left)."""
    return _normalise_or(_zeroed(law, x), law)


def _spectr_rho(p, q, k):
    """SpecTr's ρ*: the smallest ρ ≥ 1 with 1 − (1 − β(ρ))^k ≤ ρ·β(ρ), β(ρ) = Σ min(q, p/ρ)."""

    def gap(rho):
        beta = np.minimum(q, p / rho).sum()
        return rho * beta - (1 - (1 - beta) ** k)  # increasing in ρ

    lo, hi = 1 + 0 * p[0], 2 + 0 * p[0]  # the number type of p: Fraction or float
    if gap(lo) >= 0:
        return lo
    while gap(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(60):  # bisection; hi always satisfies the inequality
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gap(mid) >= 0 else (mid, hi)
    return hi


def _spectr_start(p, q, k):
    """SpecTr's state: (p, q, ρ*, c) with c = (1 − (1 − β)^k)/β, the accepted mass per unit."""
    rho = _spectr_rho(p, q, k)
    beta = np.minimum(q, p / rho).sum()
    return p, q, rho, (1 - (1 - beta) ** k) / beta if beta > 0 else 0 * beta


def _spectr_final(state):
    """SpecTr's residual ∝ p − min(q, p/ρ)·c (nonnegative for ρ ≥ ρ*)."""
    p, q, rho, c = state
    return _normalise_or(np.maximum(p - np.minimum(q, p / rho) * c, 0), p)


class MultiDraft(NamedTuple):
    """A verifier of k candidates for one position: how they come, are tested, and end."""

    name: str
    draws: str  # "iid": X_i ~ q; "without": q without the earlier X; "top-k": q's k largest
    accept: Callable  # (state, x) -> probability of keeping candidate x
    reject: Callable  # (state, x) -> the state after x is rejected
    final: Callable  # state -> the law drawn when every candidate is rejected
    start: Callable = lambda p, q, k: (p, q)  # the state before the first candidate
    merges: bool = False  # reject ignores x, so the enumeration can merge rejected branches


MULTI_DRAFT_RULES = {
    "SpecInfer": MultiDraft(  # Miao et al., Alg. 2: p ← norm(max(0, p − q)) after a rejection
        "SpecInfer multi-step (i.i.d.)",
        "iid",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), s[1]),
        lambda s: s[0],
        merges=True,
    ),
    "without replacement": MultiDraft(  # Yang et al.; Jeon et al.: renormalise q as well
        "recursive, without replacement",
        "without",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), _drop(s[1], x)),
        lambda s: s[0],
    ),
    "broken: q not renormalised": MultiDraft(
        "without replacement, q not renormalised",
        "without",
        lambda s, x: _keep(s[0][x], s[1][x]),
        lambda s, x: (EXACT_RULE.correction_law(*s), _zeroed(s[1], x)),
        lambda s: s[0],
    ),
    "EAGLE-2 top-k": MultiDraft(  # q = 1 for the draft's deterministic top-k
        "EAGLE-2 top-k, q = 1",
        "top-k",
        lambda s, x: s[0][x],
        lambda s, x: (_drop(s[0], x), s[1]),
        lambda s: s[0],
    ),
    "SpecTr": MultiDraft(  # Sun et al. 2023: k-sequential selection with ρ*
        "SpecTr k-sequential (i.i.d.)",
        "iid",
        lambda s, x: _keep(s[0][x], s[2] * s[1][x]),
        lambda s, x: s,
        _spectr_final,
        start=_spectr_start,
        merges=True,
    ),
}
EXACT_MULTI_DRAFT = ["SpecInfer", "without replacement", "EAGLE-2 top-k", "SpecTr"]


def _top_k_order(q):
    """Tokens by decreasing q(x), ties by index: the order of deterministic top-k children."""
    return sorted(range(len(q)), key=lambda x: (-q[x], x))


def _next_candidates(draws, q, drawn):
    """[(x, P(next candidate = x))] given the candidates drawn so far."""
    if draws == "iid":
        return [(x, q[x]) for x in range(len(q)) if q[x] > 0]
    if draws == "top-k":
        order = _top_k_order(q)
        return [(order[len(drawn)], 1)] if len(drawn) < len(order) else []
    rest = q.copy()
    rest[list(drawn)] = 0
    z = rest.sum()
    return [(x, rest[x] / z) for x in range(len(q)) if rest[x] > 0]


def multi_draft_law(rule, p, q, k):
    """Exact law of (chosen, token), (k + 1, V): row i keeps candidate i, row k the final draw."""
    table = np.zeros((k + 1, len(p)), dtype=object) + 0 * p[0]

    def walk(i, state, drawn, mass):
        """Add the outcomes after i rejected candidates `drawn`, reached with probability mass."""
        options = _next_candidates(rule.draws, q, drawn) if i < k else []
        if not options:
            table[k] += mass * rule.final(state)
            return
        rejected = 0
        for x, d in options:
            keep = rule.accept(state, x)
            table[i, x] += mass * d * keep
            if rule.merges:
                rejected += d * (1 - keep)
            elif keep != 1:
                walk(i + 1, rule.reject(state, x), drawn + (x,), mass * d * (1 - keep))
        if rule.merges and rejected != 0:
            walk(i + 1, rule.reject(state, None), drawn, mass * rejected)

    walk(0, rule.start(p, q, k), (), 1 + 0 * p[0])
    return table


def multi_draft_acceptance(rule, p, q, k):
    """P(a candidate is kept) = Σ of rows 0..k−1 of multi_draft_law."""
    return multi_draft_law(rule, p, q, k)[:k].sum()


def pair_cover_slack(p, q):
    """min over token sets S (not ∅, not all) of P(X1 or X2 in S) − p(S), X1, X2 i.i.d. q.

    By Hall's theorem an exact rule can always output one of its two candidates iff this is ≥ 0.
    """
    p, q = np.asarray(p, float), np.asarray(q, float)
    if len(p) > 20:
        raise ValueError(f"p has {len(p)} tokens; the 2^V subsets are enumerated only for V <= 20")
    sets = (np.arange(1, 2 ** len(p) - 1)[:, None] >> np.arange(len(p))) & 1  # (2^V − 2, V)
    return float((1 - (1 - sets @ q) ** 2 - sets @ p).min())


def candidate_pair_law(q, draws):
    """Law of the two candidates (X1, X2), (V, V): i.i.d., without replacement, or q's top two."""
    q = np.asarray(q, dtype=float)
    if draws == "iid":
        return np.outer(q, q)
    if draws == "without":
        first = np.where(q < 1, q / np.where(q < 1, 1 - q, 1), 0)  # q(a)/(1 − q(a))
        return np.where(np.eye(len(q), dtype=bool), 0, first[:, None] * q[None, :])
    law = np.zeros((len(q), len(q)))
    a, b = _top_k_order(q)[:2]
    law[a, b] = 1
    return law


def optimal_pair_acceptance(p, pair_law):
    """Max P(output ∈ {X1, X2}) over exact rules: a linear programme over candidate pairs.

    Variables a1[x1, x2], a2[x1, x2] >= 0: the mass of pair (x1, x2) that outputs x1, resp. x2.
    a1 + a2 <= pair_law (per pair), and the kept mass into each token y is at most p(y); the
    rest of p is drawn from norm(p − kept), so every feasible point is an exact rule.
    """
    from scipy.optimize import linprog
    from scipy.sparse import eye, hstack, kron, vstack

    n = len(p)
    pairs = eye(n * n, format="csr")
    first = kron(eye(n), np.ones((1, n)))  # (V, V²): pairs with x1 = y
    second = kron(np.ones((1, n)), eye(n))  # (V, V²): pairs with x2 = y
    constraints = vstack([hstack([pairs, pairs]), hstack([first, second])])
    bounds = np.concatenate([np.asarray(pair_law, float).ravel(), np.asarray(p, float)])
    result = linprog(-np.ones(2 * n * n), A_ub=constraints, b_ub=bounds, method="highs")
    if not result.success:
        raise RuntimeError(f"linprog failed: {result.message}")
    return -float(result.fun)


def _check_multi_draft(target_probs, draft_probs, draft_tokens, replacement):
    """Raise unless the arrays are (B, V), (B, V), (B, k ≥ 1), checked as verify checks them."""
    if target_probs.ndim != 2 or draft_probs.ndim != 2 or draft_tokens.ndim != 2:
        raise ValueError("need target_probs (B, V), draft_probs (B, V), draft_tokens (B, k)")
    (batch, k), vocab = draft_tokens.shape, target_probs.shape[1]
    if target_probs.shape != (batch, vocab) or draft_probs.shape != (batch, vocab) or k < 1:
        raise ValueError(
            f"shapes do not match (k >= 1 needed): target_probs {target_probs.shape}, "
            f"draft_probs {draft_probs.shape}, draft_tokens {draft_tokens.shape}"
        )
    _check_batch(  # the per-array checks of verify, on broadcast views (no copies)
        np.broadcast_to(target_probs[:, None], (batch, k + 1, vocab)),
        np.broadcast_to(draft_probs[:, None], (batch, k, vocab)),
        draft_tokens,
    )
    if not replacement and k > 1:
        ordered = np.sort(draft_tokens, axis=1)
        if np.any(ordered[:, 1:] == ordered[:, :-1]):
            raise ValueError("draft_tokens repeat a token in a row, but replacement=False")


def multi_draft_verify(target_probs, draft_probs, draft_tokens, rng, replacement=True):
    """k candidates for one position: (chosen (B,), tokens (B,)); chosen = −1 for the final draw.

    replacement=True: SpecInfer's multi-step rule for i.i.d. candidates. replacement=False: the
    candidates were drawn without replacement, and q is renormalised after each rejection.
    """
    target_probs, draft_probs = np.asarray(target_probs), np.asarray(draft_probs)
    draft_tokens = np.asarray(draft_tokens)
    _check_multi_draft(target_probs, draft_probs, draft_tokens, replacement)
    _check_rng(rng)
    batch, k = draft_tokens.shape
    rows = np.arange(batch)
    p, q = target_probs.astype(float), draft_probs.astype(float)  # (B, V) each, updated
    chosen = np.full(batch, -1, dtype=np.int64)
    u = rng.random((batch, k))
    for i in range(k):
        x = draft_tokens[:, i]
        open_ = chosen < 0
        keep = open_ & (u[:, i] < _ratio(p[rows, x], q[rows, x]))
        chosen[keep] = i
        still = (chosen < 0)[:, None]
        p = np.where(still, EXACT_RULE.correction_law(p, q), p)  # p ← norm(max(0, p − q))
        if not replacement:
            q = np.where(still, _normalise_or(np.where(np.eye(q.shape[1])[x] > 0, 0, q), q), q)
    tokens = draft_tokens[rows, np.maximum(chosen, 0)]
    final = _sample_rows(p, rng)
    return chosen, np.where(chosen >= 0, tokens, final)


# ---- The chapter's tables ---------------------------------------------------------------------

MD_CTX, MD_W = "t", Fraction(3, 10)  # the one position of the multi-draft tables
MD_KS = (1, 2, 3, 4)
MD_FRACTION_LIMIT = 3  # rules that branch per candidate run in Fractions up to this k


def multi_draft_rows(ctx=MD_CTX, w=MD_W, ks=MD_KS):
    """Per rule and k: acceptance, max |law − p|, TV(law, p), and whether it ran in Fractions."""
    rows = []
    for key, rule in MULTI_DRAFT_RULES.items():
        for k in ks:
            exact = rule.merges or rule.draws == "top-k" or k <= MD_FRACTION_LIMIT
            p, q = (m[CONTEXT_INDEX[ctx]] for m in model_matrices(w, exact))
            table = multi_draft_law(rule, p, q, k)
            gap = np.abs(table.sum(axis=0) - p)
            rows.append(
                {
                    "rule": key,
                    "k": k,
                    "acceptance": float(table[:k].sum()),
                    "max |Δ|": float(gap.max()),
                    "TV": float(gap.sum() / 2),
                    "Fractions": bool(exact),
                }
            )
    return rows


def pair_optima(ctx=MD_CTX, w=MD_W):
    """The LP optimum for k = 2 under each way of drawing the pair: {draws: acceptance}."""
    p, q = (m[CONTEXT_INDEX[ctx]] for m in model_matrices(w, exact=False))
    return {
        d: optimal_pair_acceptance(p, candidate_pair_law(q, d)) for d in ("iid", "without", "top-k")
    }
