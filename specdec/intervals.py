"""Chapter 9: the race's statistics, apart from any timing.

- `expected_steps`: the target calls a run of N tokens takes under Equation 1's model (each
  draft kept independently with probability α), the last step's overshoot counted, so the
  prediction is exact at the race's own N; as N grows, N / E.
- `prompt_interval`: a setting's speedup over prompts with a t-interval on the prompts' log
  speedups, cut at the most the costs allow; `runs_interval` and `bootstrap`, two intervals
  that cover less than they claim, kept as controls.
- `variance_components` and `coverage`: a race's noise between prompts and between repeats,
  and how often an interval covers a known speedup in synthetic races with that noise.
- `prediction_band`: a prediction's spread from the costs', the loop overhead's and the
  tokens per call's (or α's).
- `summarise` and `confirm`: a race's table of intervals, and its best setting measured again on
  fresh prompts; `plot_prediction`, measured against predicted.
"""

from typing import NamedTuple

import numpy as np
import pandas as pd

from .checks import (
    MAX_STEPS,
    _as_real_array,
    _check_memory,
    _check_nonnegative,
    _check_positive_count,
    _check_unit_interval,
)

# ---- 1. Tokens per call at finite N -----------------------------------------------------------


def expected_steps(alpha, gamma, n_tokens):
    """Expected target calls for one row to reach n_tokens when each draft is kept
    independently with probability α (Equation 1's model), the last step's overshoot included:

    S(n) = 1 + Σ_k P(k) S(n − k),  S(n ≤ 0) = 0,  P(k) = α^(k−1)(1 − α) for k ≤ γ, P(γ+1) = α^γ,

    a step emitting k tokens (k − 1 kept drafts, then one more). S(n) → n / E as n grows."""
    _check_unit_interval(alpha, "alpha")
    _check_positive_count(gamma, "gamma", MAX_STEPS, "draft positions per step")
    _check_positive_count(n_tokens, "n_tokens", MAX_STEPS, "a loop over token counts")
    k = np.arange(1, gamma + 2)  # tokens a step emits
    law = np.where(k <= gamma, float(alpha) ** (k - 1) * (1 - alpha), float(alpha) ** gamma)
    steps = np.zeros(n_tokens + gamma + 1)  # steps[gamma + n] = S(n); S(n ≤ 0) = 0
    for n in range(1, n_tokens + 1):
        steps[gamma + n] = 1 + law @ steps[gamma + n - k]
    return float(steps[-1])


def finite_tokens_per_call(alpha, gamma, n_tokens):
    """Tokens per target call of runs of n_tokens, as the race counts them (n_tokens over the
    expected calls), under Equation 1's i.i.d. model: below E, by the last step's overshoot."""
    return n_tokens / expected_steps(alpha, gamma, n_tokens)


def prediction_band(predictions, slope, se, level=0.95, overheads=()):
    """(low, high): a normal band around the mean of predictions, each made from one of several
    independent measurements of the costs. The delta method adds the part of the tokens per
    call (or of α), (slope · s.e.)² with slope = ∂ prediction / ∂ that, to the costs' part, the
    variance of the predictions' mean; and, given overheads (predictions each made with the
    loop's overhead measured on one prompt, the costs held at their mean), the variance of
    their mean, which is o's part."""
    from scipy.stats import norm

    each = _as_real_array(predictions, "predictions")
    _check_nonnegative(se, "se")
    spread = [each] + ([_as_real_array(overheads, "overheads")] if len(overheads) else [])
    variance = (slope * se) ** 2 + sum(x.var(ddof=1) / len(x) for x in spread if len(x) > 1)
    half = float(norm.ppf(0.5 + level / 2)) * float(np.sqrt(variance))
    return float(each.mean()) - half, float(each.mean()) + half


def expected_inside(table, n_prompts, level=0.95):
    """How many of table's settings an unbiased prediction would fall inside the measured
    interval, on average, given its own band: the sum over settings of 2F(q·s_m / √(s_m² +
    s_p²)) − 1, where s_m is the measurement's standard error (from its t-interval over
    n_prompts prompts, in logs, q its quantile and F the t law of its P − 1 degrees of freedom)
    and s_p the prediction's (from its normal band, relative). Any error of the prediction's
    own makes it fall inside less often than the interval's level, even when it is right on
    average; the wider its band against the interval, the less often.

    Exact when the intervals are as wide as their true standard errors make them. Read off
    measured intervals, whose widths are estimates, it runs low: in simulation, by up to about
    2 % of the settings at 12 prompts and 7 % at 4 (a band up to twice the interval)."""
    from scipy.stats import norm, t

    _check_positive_count(n_prompts, "n_prompts")
    if n_prompts < 2:
        raise ValueError(f"n_prompts must be at least 2 for a t-interval, got {n_prompts}")
    missing = {"low", "high", "predicted", "predicted from", "predicted to"} - set(table)
    if missing:
        raise ValueError(f"table lacks the columns {sorted(missing)}")
    q = float(t.ppf(0.5 + level / 2, n_prompts - 1))
    s_m = np.log(table.high / table.low).to_numpy(float) / (2 * q)
    band = (table["predicted to"] - table["predicted from"]) / table.predicted
    s_p = band.to_numpy(float) / (2 * float(norm.ppf(0.5 + level / 2)))
    return float((2 * t.cdf(q * s_m / np.hypot(s_m, s_p), n_prompts - 1) - 1).sum())


# ---- 2. Intervals, and how often they cover ----------------------------------------------------


def prompt_interval(plain, seconds, level=0.95, cap=np.inf):
    """(speedup, low, high) from runs laid out (..., P prompts, R repeats): each prompt's speedup
    is its plain seconds over its own, summed over its repeats; the speedup is the geometric
    mean over prompts, and the interval a t-interval on the prompts' log speedups (P − 1 degrees
    of freedom), cut at cap, the most the costs allow (`speedup_cap`).

    A prompt's log speedup carries both the prompt's own effect and its repeats' noise, so its
    spread across prompts is the whole variance of the mean, and the interval is for prompts
    like these, not for these prompts only. Leading axes are independent races (vectorised)."""
    plain, seconds = np.asarray(plain, dtype=float), np.asarray(seconds, dtype=float)
    if plain.shape != seconds.shape or plain.ndim < 2 or plain.shape[-2] < 2:
        raise ValueError(
            f"plain and seconds must share a shape (..., P ≥ 2, R), got {plain.shape} and "
            f"{seconds.shape}"
        )
    if not (np.all(plain > 0) and np.all(seconds > 0)):
        raise ValueError("plain and seconds must be positive and finite")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    return _t_interval(np.log(plain.sum(axis=-1) / seconds.sum(axis=-1)), level, cap)  # (..., P)


def runs_interval(plain, seconds, level=0.95, cap=np.inf):
    """The deliberately wrong twin of `prompt_interval`, a negative control: a t-interval that
    counts every run as independent (P·R − 1 degrees of freedom), so it leaves out that runs of
    one prompt share the prompt's effect, and is too narrow when prompts differ."""
    plain, seconds = np.asarray(plain, dtype=float), np.asarray(seconds, dtype=float)
    return _t_interval(np.log(plain / seconds).reshape(*plain.shape[:-2], -1), level, cap)


def _t_interval(logs, level, cap):
    """(exp of the mean, low, high) of a t-interval on logs' last axis, the ends cut at cap."""
    from scipy.stats import t

    n = logs.shape[-1]
    middle = logs.mean(axis=-1)
    half = t.ppf(0.5 + level / 2, n - 1) * logs.std(axis=-1, ddof=1) / np.sqrt(n)
    cut = np.asarray(cap, dtype=float)
    return (
        np.exp(middle),
        np.minimum(np.exp(middle - half), cut),
        np.minimum(np.exp(middle + half), cut),
    )


def bootstrap(plain, seconds, level=0.95, cap=np.inf, n_boot=400, seed=0):
    """(speedup, low, high) by the percentile bootstrap this chapter printed before, from runs
    laid out (..., P, R) as for `prompt_interval`: the ratio of summed seconds, resampling
    prompts, then repeats within each prompt. Kept to measure its coverage beside
    `prompt_interval`'s (`coverage`); no interval on the page uses it."""
    plain, seconds = np.asarray(plain, dtype=float), np.asarray(seconds, dtype=float)
    *lead, p, r = plain.shape
    _check_memory(8 * n_boot * plain.size, "bootstrap")
    rng = np.random.default_rng(seed)
    rows = rng.integers(p, size=(n_boot, p, 1))  # prompts drawn, then repeats within each
    cols = rng.integers(r, size=(n_boot, p, r))
    ratios = plain[..., rows, cols].sum(axis=(-2, -1)) / seconds[..., rows, cols].sum(axis=(-2, -1))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail], axis=-1)  # over the n_boot draws
    ratio = plain.sum(axis=(-2, -1)) / seconds.sum(axis=(-2, -1))
    return ratio, np.minimum(low, cap), np.minimum(high, cap)


class Components(NamedTuple):
    """A race's noise: the spread of a run's log speedup between prompts and between repeats of
    one prompt (standard deviations), and their standardised shapes, pooled over settings."""

    between_prompts: float
    between_repeats: float
    prompt_shape: np.ndarray  # prompts' mean log speedups less the setting's, unit variance
    repeat_shape: np.ndarray  # runs' log speedups less their prompt's mean, unit variance


def variance_components(rows):
    """Components of rows (a race: prompt, repeat, draft, gamma, plain, seconds) by one-way
    analysis of variance in each setting, pooled (mean variance) over settings: between repeats,
    the mean square within prompts; between prompts, (mean square between − within) / R, at
    least 0. Needs two repeats or more of each prompt."""
    within, between, prompt_shape, repeat_shape = [], [], [], []
    for _, runs in rows.groupby(["draft", "gamma"], sort=False):
        plain, seconds = _grid(runs)
        p, r = plain.shape
        if r < 2 or p < 2:
            raise ValueError("variance_components needs two prompts and two repeats or more")
        y = np.log(plain / seconds)  # (P, R): each run's log speedup
        means = y.mean(axis=1)
        ms_within = ((y - means[:, None]) ** 2).sum() / (p * (r - 1))
        ms_between = r * ((means - means.mean()) ** 2).sum() / (p - 1)
        within.append(ms_within)
        between.append(max((ms_between - ms_within) / r, 0.0))
        prompt_shape.append((means - means.mean()) / np.sqrt(ms_between / r or 1.0))
        repeat_shape.append((y - means[:, None]).ravel() / np.sqrt(ms_within or 1.0))
    return Components(
        float(np.sqrt(np.mean(between))),
        float(np.sqrt(np.mean(within))),
        _unit(np.concatenate(prompt_shape)),
        _unit(np.concatenate(repeat_shape)),
    )


def _unit(x):
    """x less its mean, over its root mean square: a shape to resample, variance 1."""
    x = x - x.mean()
    return x / np.sqrt((x**2).mean()) if np.any(x) else x


def synthetic_races(components, prompts, repeats, n_races, speedup, rng, shape="measured"):
    """(plain, seconds), each (n_races, P, R): races whose true speedup is speedup. A prompt's
    speedup is its mean plain time over its mean speculative time, the race's the geometric
    mean of the prompts'. A run's log speedup is μ + a prompt's effect + a repeat's, of the
    components' sizes, with μ set so that the truth is speedup; shape "measured" draws each
    effect from the race's own standardised residuals (their tails as measured), "normal" from
    a normal law. Plain runs take 1 s, so only the ratio's noise is modelled."""
    size = (n_races, prompts, 1), (n_races, prompts, repeats)
    sd = components.between_repeats
    if shape == "measured":
        a, e = (
            rng.choice(s, size=n)
            for s, n in zip((components.prompt_shape, components.repeat_shape), size)
        )
        spread = np.log(np.mean(np.exp(-sd * components.repeat_shape)))  # log E[e^(−σe)]
    elif shape == "normal":
        a, e = (rng.standard_normal(n) for n in size)
        spread = sd**2 / 2
    else:
        raise ValueError(f'shape must be "measured" or "normal", got {shape!r}')
    y = np.log(speedup) + spread + components.between_prompts * a + sd * e
    plain = np.ones(size[1])
    return plain, plain / np.exp(y)


def coverage(
    method,
    components,
    prompts,
    repeats,
    n_races=4000,
    speedup=2.0,
    cap=np.inf,
    seed=0,
    shape="measured",
    level=0.95,
):
    """The fraction of n_races synthetic races (`synthetic_races`, true speedup `speedup`) whose
    interval by method(plain, seconds, level, cap) covers the truth: the method's coverage for a
    design of P prompts × R repeats, with the noise measured in a race. Its Monte Carlo
    standard error is √(C(1 − C) / n_races): 0.0034 at C = 0.95 and 4,000 races."""
    _check_positive_count(n_races, "n_races", 10**5, "races simulated at once")
    _check_memory(3 * 8 * n_races * prompts * repeats, "coverage")
    rng = np.random.default_rng(seed)
    plain, seconds = synthetic_races(components, prompts, repeats, n_races, speedup, rng, shape)
    _, low, high = method(plain, seconds, level, cap)
    return float(np.mean((low <= speedup) & (speedup <= high)))


# ---- 3. A race's table and its verdict ------------------------------------------------------


def _grid(runs):
    """(plain, seconds), each (P, R), of one setting's runs (a prompt and repeat per row)."""
    runs = runs.sort_values(["prompt", "repeat"])
    shape = (runs.prompt.nunique(), runs.repeat.nunique())
    if len(runs) != shape[0] * shape[1]:
        raise ValueError("every prompt needs the same number of repeats")
    return runs.plain.to_numpy().reshape(shape), runs.seconds.to_numpy().reshape(shape)


class Verdict(NamedTuple):
    """The best setting, chosen on the race's prompts and measured again on fresh ones."""

    draft: str
    gamma: int
    speedup: float
    low: float
    high: float
    chosen_at: float  # its speedup on the race's prompts, where it was chosen
    above_cap: bool = False  # measured above what its costs allow: the costs, not the cap, fail


def measured(runs, cap=np.inf, level=0.95):
    """(speedup, low, high, above) of one setting's runs: `prompt_interval` cut at cap, unless
    the speedup itself lies above cap. Then the race refutes the costs the cap was computed
    from, so no cut is made and above is True, for the page to say so."""
    plain, seconds = _grid(runs)
    speedup, low, high = (float(x) for x in prompt_interval(plain, seconds, level))
    if speedup > cap:
        return speedup, low, high, True
    return speedup, min(low, cap), min(high, cap), False


def summarise(rows, caps=None, level=0.95):
    """Every setting's speedup with its interval (`measured`, with caps[(draft, γ)] if given),
    the cap, and whether the speedup lay above it, one row each, in the race's order."""
    table = []
    for (draft, gamma), runs in rows.groupby(["draft", "gamma"], sort=False):
        cap = np.inf if caps is None else caps[draft, int(gamma)]
        speedup, low, high, above = measured(runs, cap, level)
        table.append({"draft": draft, "gamma": int(gamma), "speedup": speedup, "low": low,
                      "high": high, "cap": float(cap), "above cap": above})  # fmt: skip
    return pd.DataFrame(table)


def confirm(table, fresh_rows, cap=np.inf, level=0.95):
    """The Verdict: the setting with the highest speedup in table (the race's prompts), measured
    on fresh_rows, its runs on other prompts, so that picking the best of many noisy settings
    does not inflate the number reported."""
    best = table.loc[table.speedup.idxmax()]
    runs = fresh_rows[(fresh_rows.draft == best.draft) & (fresh_rows.gamma == best.gamma)]
    speedup, low, high, above = measured(runs, cap, level)
    return Verdict(best.draft, int(best.gamma), speedup, low, high, float(best.speedup), above)


def plot_prediction(table, title):
    """Measured speedup (with its 95 % interval) against the speedup predicted from isolated
    costs, one marker per setting, in its draft's colour and marker (`pair.model_style`),
    labelled by its γ, placed clear of the error bars and of the labels before it; on the
    diagonal they agree. The legend sits above the plot."""
    from .pair import model_style
    from .style import new_figure

    fig, ax = new_figure(figsize=(6.4, 6.8))
    fig.set_layout_engine("constrained")
    low = min(table.low.min(), table.predicted.min(), 1.0) * 0.95
    high = max(table.high.max(), table.predicted.max(), 1.0) * 1.05
    span = high - low  # every error bar, then each label placed, as boxes in the axes' units
    placed = [
        ((x - low) / span - 0.012, (x - low) / span + 0.012, (lo - low) / span, (hi - low) / span)
        for x, lo, hi in zip(table.predicted, table.low, table.high)
    ]
    for draft in dict.fromkeys(table.draft):
        rows = table[table.draft == draft]
        ax.errorbar(
            rows.predicted,
            rows.speedup,
            yerr=[rows.speedup - rows.low, rows.high - rows.speedup],
            linestyle="",
            capsize=3,
            label=draft,
            **model_style(draft),
        )
        for x, y, gamma in zip(rows.predicted, rows.speedup, rows.gamma):
            offset = _label_offset((x - low) / span, (y - low) / span, placed)
            ax.annotate(  # on a white ground, so that the diagonal and the bars do not cross it
                f"γ = {gamma}",
                (x, y),
                textcoords="offset points",
                xytext=offset,
                ha="left" if offset[0] > 0 else "right",
                va="center",
                fontsize=13,
                color=model_style(draft)["color"],
                bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none"},
            )
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="measured = predicted")
    ax.axhline(1, color="0.5", linestyle="--", linewidth=1)
    ax.set(
        xlim=(low, high),
        ylim=(low, high),
        xlabel="predicted from isolated costs",
        ylabel="measured (95 % interval)",
    )
    ax.set_title(title)
    fig.legend(loc="outside upper center", ncol=2)
    return fig


def _label_offset(x, y, placed):
    """Offset in points of the label of a point at (x, y), in units of the axes' span: right of
    it, else left, above or below, whichever box clears every box in placed (x0, x1, y0, y1),
    to which its own is added (the first, if none clears). A label spans about 0.13 × 0.045
    of the axes."""
    for dx, dy in [(9, 0), (-9, 0), (9, 16), (-9, 16), (9, -16), (-9, -16)]:
        near, far = x + np.sign(dx) * 0.02, x + np.sign(dx) * 0.15
        box = (min(near, far), max(near, far), y + dy / 400 - 0.023, y + dy / 400 + 0.023)
        if not any(b[0] < box[1] and box[0] < b[1] and b[2] < box[3] and box[2] < b[3]
                   for b in placed):  # fmt: skip
            placed.append(box)
            return dx, dy
    dx, dy = 9, 0
    placed.append((x + 0.02, x + 0.15, y - 0.023, y + 0.023))
    return dx, dy
