"""Chapter 6: sampling settings and the exactness bugs real engines shipped.

A pipeline processes the target's rows (temperature, top-k, top-p, penalties, bfloat16) and
verifies with a `RowRule`; its exact output law is compared with the processed target's, and
`samples_to_detect` sizes the chi-square test that would catch the difference.
"""

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from numbers import Real

import numpy as np
from scipy import optimize, stats

from .checks import _check_count
from .exact import as_fraction, model_matrices
from .models import BOS, CONTEXT_INDEX, TOKEN_INDEX, VOCAB, V, show_token
from .rule import _check_step_args, _normalise_or, _ratio, _residual_weights

# Rows are (N, V) arrays of floats or of Fractions (dtype=object); every step below works on
# both, so the claims that need no irrational number are checked in exact arithmetic.


@dataclass(frozen=True)
class Settings:
    """Sampling settings, applied in engine order: penalty θ, temperature T, top-k, top-p."""

    temperature: Real = 1
    top_k: int | None = None
    top_p: Real | None = None
    penalty: Real = 1  # repetition penalty θ on tokens already in the prefix
    greedy: bool = False  # one-hot at the first argmax after the penalty
    bf16: bool = False  # the final law rounded to bfloat16 and renormalised (floats only)


def _power(rows, exponent):
    """rows ** exponent; an integer exponent keeps Fractions exact, any other gives floats."""
    exponent = Fraction(exponent)
    if exponent.denominator == 1 and rows.dtype == object:
        return rows ** int(exponent)
    return np.asarray(rows, float) ** float(exponent)


def _keep_top(rows, keep_count):
    """Zero all but the keep_count[n] largest entries of each row (ties: the lower token id)."""
    order = np.argsort(-rows, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(rows.shape[1])[None, :], axis=1)
    return np.where(rank < np.reshape(keep_count, (-1, 1)), rows, 0 * rows)


def _top_p_count(rows, top_p):
    """Per row, the fewest largest tokens whose mass reaches top_p of the row's total."""
    ordered = -np.sort(-rows, axis=1)
    mass = np.cumsum(ordered, axis=1)
    below = mass < top_p * mass[:, -1:]  # tokens still needed after these
    return 1 + np.count_nonzero(below, axis=1)


def _bf16(rows):
    """Round float rows to bfloat16 (8 significant bits, to nearest even), as float64."""
    bits = np.asarray(rows, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(float)


def process(rows, seen, settings):
    """Processed law of each row (N, V), with seen (N, V) marking tokens already in the prefix.

    Logits are log-probabilities (all ≤ 0), so the penalty's logit·θ is p^θ, and T gives p^(1/T).
    """
    inverse_t = 1 / as_fraction(settings.temperature)
    weights = np.where(seen, _power(rows, settings.penalty * inverse_t), _power(rows, inverse_t))
    if settings.greedy:
        top = np.arange(rows.shape[1]) == weights.argmax(axis=1)[:, None]
        weights = np.where(top, weights**0, 0 * weights)  # ones and zeros of the rows' type
    if settings.top_k is not None:
        weights = _keep_top(weights, np.full(len(rows), settings.top_k))
    if settings.top_p is not None:
        top_p = as_fraction(settings.top_p) if weights.dtype == object else settings.top_p
        weights = _keep_top(weights, _top_p_count(weights, top_p))
    law = weights / weights.sum(axis=1, keepdims=True)
    if not settings.bf16:
        return law
    rounded = _bf16(law)
    return rounded / rounded.sum(axis=1, keepdims=True)


PROMPT = "to be or no"  # the context of every chapter 6 law; its tokens count for penalties


def _check_prompt(prompt):
    """Raise unless prompt is a non-empty string of the toy's tokens."""
    if not isinstance(prompt, str) or not prompt or any(c not in TOKEN_INDEX for c in prompt):
        raise ValueError(f"prompt must be a non-empty string of tokens from {''.join(VOCAB)!r}")


def _prefixes(length):
    """All V**length token sequences in base-V order, (V**length, length)."""
    every = list(itertools.product(range(V), repeat=length))
    return np.array(every, dtype=np.int64).reshape(V**length, length)


def _seen(prefixes, prompt, upto):
    """(N, V): True where a token occurs in the prompt or in the first `upto` prefix tokens."""
    seen = np.zeros((len(prefixes), V), dtype=bool)
    seen[:, sorted({TOKEN_INDEX[c] for c in prompt})] = True
    for column in prefixes[:, :upto].T:
        seen[np.arange(len(prefixes)), column] = True
    return seen


def _history_rows(prefixes, prompt, w, exact):
    """Raw target and draft rows (N, V) after prompt + each prefix: the bigram of the last token."""
    p, q = model_matrices(w, exact)
    last = prefixes[:, -1] + 1 if prefixes.shape[1] else np.full(1, CONTEXT_INDEX[prompt[-1]])
    return p[last], q[last]


@dataclass(frozen=True)
class RowRule:
    """A verifier by rows: acceptance of every candidate token, and the law after rejecting x."""

    name: str
    accept: Callable = _ratio  # (p, q) rows (N, V) -> acceptance probabilities (N, V)
    correction: Callable = lambda p, q, x: _residual_weights(p, q)  # weights (N, V)
    per_token: bool = False  # the correction depends on the rejected token x (N,)

    def law_after_rejection(self, p, q, miss):
        """Σ_x miss[:, x] · correction law given x, (N, V); miss (N, V) = q(x)·(1 − accept(x))."""
        if not self.per_token:
            return miss.sum(axis=1, keepdims=True) * _normalise_or(self.correction(p, q, None), p)
        total = 0 * p
        for x in range(p.shape[1]):
            law = _normalise_or(self.correction(p, q, np.full(len(p), x)), p)
            total = total + miss[:, x : x + 1] * law
        return total


def _whole_row_accept(p, q):
    """min(1, min_v p(v)/q(v)) over v with q(v) > 0, the same for every token of the row."""
    ratio = np.where(q > 0, p / np.where(q > 0, q, 1), np.inf)
    return np.broadcast_to(np.minimum(1, ratio.min(axis=1, keepdims=True)), p.shape)


def _residual_at_token(p, q, x):
    """p, with max(0, p − q) only at the rejected token x (N,)."""
    rows = np.arange(len(p))
    weights = p.copy()
    weights[rows, x] = np.maximum(p[rows, x] - q[rows, x], 0)
    return weights


FLOAT32_TINY = Fraction(1, 2**126)  # torch.finfo(torch.float32).tiny


def _tiny_clamped(p, q, x):
    """max(p − q, tiny): the residual with every entry clamped to float32's smallest normal."""
    tiny = FLOAT32_TINY if p.dtype == object else float(FLOAT32_TINY)
    return np.maximum(p - q, tiny)


ROW_EXACT = RowRule("Leviathan et al. (correct)")
ROW_BUGS = {
    "softmax residual": RowRule(
        "softmax of the clamped residual",
        correction=lambda p, q, x: np.exp(np.asarray(_residual_weights(p, q), float)),
    ),
    "residual at token": RowRule(
        "draft mass subtracted only at the drafted token",
        correction=_residual_at_token,
        per_token=True,
    ),
    "whole-row test": RowRule("reject if any token has p < u·q", accept=_whole_row_accept),
    "tiny clamp": RowRule("residual clamped to float32 tiny", correction=_tiny_clamped),
    "correction from p": RowRule("on rejection, draw from p", correction=lambda p, q, x: p),
}


@dataclass(frozen=True)
class Pipeline:
    """Who computes what: the user's settings, the draft's, and the rows the verifier is given."""

    name: str
    target: Settings = Settings()  # the user's settings: the output must follow this p'
    draft: Settings = Settings()  # the settings the draft samples with
    ratio_target: Settings | None = None  # the p the verifier gets (None: the user's p')
    ratio_draft: Settings | None = None  # the q of ratio and residual (None: the sampled q')
    rule: RowRule = ROW_EXACT
    stale: bool = False  # the verified rows' penalties use the prefix at the step's start

    def rows(self, prefixes, start, prompt, w, exact):
        """(p the verifier uses, q the draft samples, q the verifier uses), each (N, V)."""
        p, q = _history_rows(prefixes, prompt, w, exact)
        fresh = _seen(prefixes, prompt, prefixes.shape[1])
        stale = _seen(prefixes, prompt, start) if self.stale else fresh
        q_draw = process(q, fresh, self.draft)
        q_seen = q_draw if self.ratio_draft is None else process(q, fresh, self.ratio_draft)
        return process(p, stale, self.ratio_target or self.target), q_draw, q_seen


def processed_target_law(k, settings, prompt=PROMPT, exact=True):
    """The law p' of the next k tokens (V**k,) in base-V order: settings applied at each prefix."""
    _check_count(k, "k")
    _check_prompt(prompt)
    law = np.array([Fraction(1) if exact else 1.0], dtype=object if exact else float)
    for length in range(k):
        prefixes = _prefixes(length)
        p, _ = _history_rows(prefixes, prompt, 0, exact)
        law = (law[:, None] * process(p, _seen(prefixes, prompt, length), settings)).ravel()
    return law


def pipeline_law(k, gamma, w, pipeline, prompt=PROMPT, exact=True):
    """Law (V**k,) of the first k tokens a pipeline emits, every path enumerated, and the
    expected tokens of its first step (complete when k > gamma).

    reach[j] holds, per prefix, the chance that the step begun at length j has kept every draft
    up to that prefix; reach[length] is a step boundary.
    """
    _check_count(k, "k")
    _check_step_args(BOS, gamma, w)
    _check_prompt(prompt)
    reach = {0: np.array([Fraction(1) if exact else 1.0], dtype=object if exact else float)}
    first_step = reach[0][0]
    for length in range(k):
        prefixes, ends = _prefixes(length), 0
        for start, mass in list(reach.items()):
            p, q_draw, q_seen = pipeline.rows(prefixes, start, prompt, w, exact)
            if length - start == gamma:  # every draft kept: the bonus token from p
                ends = ends + (mass[:, None] * p).ravel()
                del reach[start]
                continue
            accept = pipeline.rule.accept(p, q_seen)
            reach[start] = (mass[:, None] * q_draw * accept).ravel()
            first_step += reach[start].sum() if start == 0 else 0
            miss = q_draw * (1 - accept)  # (N, V): drafted x, then rejected
            ends = (
                ends + (mass[:, None] * pipeline.rule.law_after_rejection(p, q_seen, miss)).ravel()
            )
        reach[length + 1] = ends
    return sum(reach.values()), first_step


def law_total_variation(law, reference):
    """½·Σ|law − reference| over aligned outcome arrays (exact for Fractions)."""
    return sum(abs(a - b) for a, b in zip(law, reference)) / 2


DETECT_LEVEL = 1e-3  # the chi-square test that sizes a CI suite: its level ...
DETECT_POWER = 0.8  # ... and the power it should have against a bug


@functools.lru_cache(maxsize=256)
def noncentrality_needed(df, level, power):
    """λ at which Pearson's test on df degrees of freedom at `level` rejects w.p. `power`."""
    critical = stats.chi2.isf(level, df)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e7))


def samples_to_detect(law, reference, level=DETECT_LEVEL, power=DETECT_POWER):
    """Draws a chi-square test of reference needs to reject law w.p. power: (n, reason).

    On the reference's support, n = λ / Σ (law − ref)² / ref (noncentral chi-square); a draw
    the reference forbids fails at once, which takes log(1 − power) / log(1 − forbidden mass).
    """
    law, reference = np.asarray(law, float), np.asarray(reference, float)
    support = reference > 0
    drift = float(((law - reference)[support] ** 2 / reference[support]).sum())
    forbidden = float(law[~support].sum())
    cells = int(support.sum())
    lam = noncentrality_needed(cells - 1, level, power) if cells > 1 else np.inf
    by_chi = lam / drift if drift > 0 else np.inf
    by_forbidden = max(1.0, np.log1p(-power) / np.log1p(-forbidden)) if forbidden > 0 else np.inf
    if by_forbidden < by_chi:
        return float(np.ceil(by_forbidden)), "a forbidden outcome"
    return float(np.ceil(max(by_chi, 1.0))), "chi-square"


def direction_draws(law, reference, level=DETECT_LEVEL, power=DETECT_POWER):
    """Draws a one-sided test of the score along law − ref needs: (z_level + z_power)² divided
    by Σ(law − ref)²/ref, or the draws that see an outcome the reference forbids, if fewer."""
    law, reference = np.asarray(law, float), np.asarray(reference, float)
    support = reference > 0
    drift = float(((law - reference)[support] ** 2 / reference[support]).sum())
    forbidden = float(law[~support].sum())
    shift = (
        stats.norm.isf(level) + stats.norm.ppf(power)
    ) ** 2  # the score's mean, in SEs, squared
    by_chi = shift / drift if drift > 0 else np.inf
    by_forbidden = np.log1p(-power) / np.log1p(-forbidden) if forbidden > 0 else np.inf
    return float(np.ceil(max(1.0, min(by_chi, by_forbidden))))


def _signed(x):
    """A signed decimal without e-notation, two significant digits: '+0.000034'."""
    return np.format_float_positional(x, precision=2, unique=False, fractional=False, sign=True)


USER_SETTINGS = Settings(temperature=Fraction(1, 2), top_k=8, top_p=Fraction(9, 10), penalty=2)
SETTINGS_W = Fraction(3, 10)  # the draft weight of chapter 6


def bug_pipelines(user=USER_SETTINGS):
    """The real bugs of chapter 6, each a change of p, q or the rule: {label: Pipeline}."""
    argmax = replace(user, greedy=True)
    return {
        "argmax draft, softmax q": Pipeline("argmax draft, softmax q", user, argmax, None, user),
        "raw q in the ratio": Pipeline("raw q in the ratio", user, user, None, Settings()),
        "unprocessed target": Pipeline("unprocessed target", user, user, Settings()),
        "argmax target at T > 0": Pipeline("argmax target at T > 0", user, user, argmax),
        "bf16 draft, fp32 ratio": Pipeline(
            "bf16 draft, fp32 ratio", user, replace(user, bf16=True), None, user
        ),
        "stale penalty prefix": Pipeline("stale penalty prefix", user, user, stale=True),
    } | {key: Pipeline(rule.name, user, user, rule=rule) for key, rule in ROW_BUGS.items()}


EXACT_IN_FRACTIONS = ("softmax residual", "bf16 draft, fp32 ratio")  # the float-only bugs


def _outcome(code, k):
    """The k-token string of a base-V code, spaces shown as '␣'."""
    return "".join(show_token(VOCAB[code // V ** (k - 1 - i) % V]) for i in range(k))


def bug_rows(k=3, gamma=2, w=SETTINGS_W, level=DETECT_LEVEL, power=DETECT_POWER):
    """Per bug: exact TV of k tokens from p̃, the most over- and under-made outcome (law − p̃),
    and the draws an omnibus chi-square test over every outcome at `level` needs for `power`,
    beside those of a test aimed at the bug's direction (floats; see tiny_clamp_row)."""
    reference = processed_target_law(k, USER_SETTINGS, exact=False)
    rows = []
    for key, pipeline in bug_pipelines().items():
        if key == "tiny clamp":
            continue
        law = np.asarray(pipeline_law(k, gamma, w, pipeline, exact=False)[0], float)
        n, reason = samples_to_detect(law, reference, level, power)
        gap = law - reference
        high, low = int(gap.argmax()), int(gap.argmin())
        rows.append(
            {
                "bug": key,
                "TV": law_total_variation(law, reference),
                "too often": f"{_outcome(high, k)} ({_signed(gap[high])})",
                "too rarely": f"{_outcome(low, k)} ({_signed(gap[low])})",
                "draws to catch": n,
                "direction-aware draws": direction_draws(law, reference, level, power),
                "caught by": reason,
            }
        )
    return rows


def tiny_clamp_row(k=2, gamma=2, w=SETTINGS_W):
    """The finfo.tiny clamp in Fractions: exact TV of k tokens, and the bound k·V·tiny/min Z."""
    reference = processed_target_law(k, USER_SETTINGS)
    law, _ = pipeline_law(k, gamma, w, bug_pipelines()["tiny clamp"])
    return law_total_variation(law, reference), law, reference
