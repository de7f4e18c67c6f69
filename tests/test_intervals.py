"""Chapter 9's race, its statistics: the finite-N prediction against a simulated i.i.d. chain,
the interval's coverage simulated for its design, the physical cap, the prediction's band and
the verdict measured on fresh prompts; each beside a control the same check rejects."""

import numpy as np
import pandas as pd
import pytest

import specdec_core as sc
from specdec import intervals, race


def simulated_steps(alpha, gamma, n_tokens, rows, rng):
    """Target calls each of rows i.i.d. runs takes to emit n_tokens: a step keeps each of its
    γ drafts with probability α until the first rejection, then adds one token."""
    kept = np.minimum(rng.geometric(1 - alpha, size=(rows, n_tokens)) - 1, gamma)  # (rows, N)
    emitted = np.cumsum(kept + 1, axis=1)  # tokens after each step; N steps always suffice
    return (emitted < n_tokens).sum(axis=1) + 1  # the first step reaching n_tokens


@pytest.mark.parametrize("alpha, gamma", [(0.79, 4), (0.79, 2), (0.45, 3), (0.95, 6)])
def test_expected_steps_match_a_simulated_iid_chain_and_n_over_e_does_not(alpha, gamma):
    """40,000 simulated runs of 40 tokens: the mean steps' s.e. is sd/200, with sd at most 2.1
    here (measured), so 0.011; the exact S(N) must lie within 4 s.e. of the mean. N/E, which
    leaves out the last step's overshoot, lies 0.1 to 0.5 steps away, over 9 s.e. (the control)."""
    steps = simulated_steps(alpha, gamma, 40, 40_000, np.random.default_rng(3))
    se = steps.std(ddof=1) / np.sqrt(len(steps))
    exact = intervals.expected_steps(alpha, gamma, 40)
    assert abs(steps.mean() - exact) < 4 * se
    assert abs(steps.mean() - 40 / sc.expected_tokens(alpha, gamma)) > 8 * se
    assert intervals.finite_tokens_per_call(alpha, gamma, 40) == pytest.approx(40 / exact)


def test_expected_steps_at_the_edges_and_in_the_long_run():
    """α = 0: one token a step; α = 1: γ + 1 tokens a step, the last one cut; as N grows, S(N)
    grows by N/E per token (the renewal theorem), while its offset from N/E stays bounded."""
    assert intervals.expected_steps(0.0, 4, 37) == pytest.approx(37)
    assert intervals.expected_steps(1.0, 4, 37) == pytest.approx(8)  # ceil(37 / 5)
    slope = intervals.expected_steps(0.7, 3, 2_000) - intervals.expected_steps(0.7, 3, 1_000)
    assert slope == pytest.approx(1_000 / sc.expected_tokens(0.7, 3), rel=1e-9)
    for args, name in [((1.5, 4, 10), "alpha"), ((0.5, 0, 10), "gamma"), ((0.5, 4, 0), "n_tokens"),
                       ((0.5, 4, 10**7), "n_tokens")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            intervals.expected_steps(*args)


def test_predict_counts_the_last_steps_overshoot():
    """With calls all that costs, the prediction is N over S(N) steps' cost, below Theorem 3.8
    (N/E steps) at N = 40; Equation 1's E as tokens gives Theorem 3.8 back (the control)."""
    costs = race.Costs({1: 1.0, 5: 1.0}, {"d": 0.1}, {"target": 0.0, "d": 0.0})
    finite = race.predict(costs, 0.0, 0.0, 0.79, "d", 4, 40)
    assert finite == pytest.approx(40 / (intervals.expected_steps(0.79, 4, 40) * 1.4), rel=1e-12)
    theorem = sc.walltime_speedup(0.79, 4, 0.1)
    eq1 = race.predict(costs, 0.0, 0.0, 0.79, "d", 4, 40, tokens=sc.expected_tokens(0.79, 4))
    assert eq1 == pytest.approx(theorem, rel=1e-12) and finite < 0.97 * theorem


# ---- the interval's coverage -------------------------------------------------------------------

# A race's noise of the size measured on this machine (a run's log speedup: 0.05 to 0.1 between
# prompts, 0.03 to 0.08 between repeats), with heavy tails: shapes from a t law with 3 degrees of
# freedom, scaled to variance 1.
_TAILS = np.random.default_rng(11).standard_t(3, size=(2, 4_000))
NOISE = intervals.Components(0.08, 0.05, intervals._unit(_TAILS[0]), intervals._unit(_TAILS[1]))
# Prompts that differ far more than repeats do: where an interval that ignores prompts fails.
PROMPTY = intervals.Components(0.10, 0.02, NOISE.prompt_shape, NOISE.repeat_shape)


@pytest.mark.parametrize("prompts, repeats", [(4, 2), (12, 3)])
@pytest.mark.parametrize("shape", ["measured", "normal"])
def test_the_prompt_interval_covers_at_its_level_for_both_designs(prompts, repeats, shape):
    """4,000 synthetic races, true speedup 2: a 95 % interval's coverage has Monte Carlo s.e.
    0.0034, so 0.93 is 6 s.e. below 0.95. The same races through `runs_interval`, which treats
    a prompt's runs as independent (the control), cover at most 0.85 when prompts differ."""
    got = intervals.coverage(intervals.prompt_interval, NOISE, prompts, repeats, shape=shape)
    assert got >= 0.93
    narrow = intervals.coverage(intervals.runs_interval, PROMPTY, prompts, 6, shape=shape)
    assert narrow < 0.85


def test_coverage_counts_misses_a_half_width_interval_shows_them():
    """The coverage simulation can fail: an interval at level 0.5 called 95 % covers near 0.5
    (0.40 to 0.60 at 4,000 races, 30 s.e.); the nominal one covers at least 0.93."""
    half = intervals.coverage(intervals.prompt_interval, NOISE, 6, 3, level=0.5)
    assert 0.40 < half < 0.60
    assert intervals.coverage(intervals.prompt_interval, NOISE, 6, 3) >= 0.93


def test_the_bootstrap_this_page_used_before_covers_less_than_its_level():
    """Its percentile interval over 3 prompts × 2 repeats spans little more than the lowest and
    highest prompt: simulated on 1,000 races (s.e. 0.014) it covers under 0.88, where the
    t-interval covers at least 0.93 (the control: the simulation can pass an interval)."""
    assert intervals.coverage(intervals.bootstrap, NOISE, 3, 2, n_races=1_000) < 0.88
    assert intervals.coverage(intervals.prompt_interval, NOISE, 3, 2, n_races=1_000) >= 0.93
    plain, seconds = intervals.synthetic_races(NOISE, 3, 2, 1, 2.0, np.random.default_rng(0))
    ratio, low, high = intervals.bootstrap(plain[0], seconds[0])
    assert low < ratio < high and ratio == pytest.approx(plain.sum() / seconds.sum())


def _frame(plain, seconds):
    """One setting's race rows from (P, R) arrays of seconds."""
    p, r = np.indices(plain.shape)
    columns = {"prompt": p, "repeat": r, "plain": plain, "seconds": seconds}
    return pd.DataFrame({k: v.ravel() for k, v in columns.items()}).assign(draft="d", gamma=2)


def test_variance_components_recover_a_known_race_and_not_a_swapped_one():
    """A synthetic race of 300 prompts × 4 repeats with 0.08 between prompts and 0.05 between
    repeats: the one-way analysis recovers each within 10 % (its s.e. is about 4 %); the
    swapped pair (the control) is 60 % off."""
    rng = np.random.default_rng(4)
    plain, seconds = intervals.synthetic_races(NOISE, 300, 4, 1, 2.0, rng, "normal")
    rows = _frame(plain[0], seconds[0])
    got = intervals.variance_components(rows)
    assert got.between_prompts == pytest.approx(0.08, rel=0.1)
    assert got.between_repeats == pytest.approx(0.05, rel=0.1)
    assert got.between_prompts != pytest.approx(0.05, rel=0.1)
    assert np.std(got.prompt_shape) == pytest.approx(1) and len(got.repeat_shape) == 1_200
    with pytest.raises(ValueError, match="two repeats"):
        intervals.variance_components(rows[rows.repeat == 0])


def test_prompt_interval_refuses_bad_input_naming_it():
    ok = np.ones((3, 2))
    for plain, seconds, match in [(ok, np.ones((3, 3)), "share a shape"), (np.ones((1, 2)),
                                  np.ones((1, 2)), "P ≥ 2"), (ok, -ok, "positive")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            intervals.prompt_interval(plain, seconds)
    with pytest.raises(ValueError, match="level"):
        intervals.prompt_interval(ok, ok, level=95)
    with pytest.raises(ValueError, match="shape"):
        intervals.coverage(intervals.prompt_interval, NOISE, 3, 2, shape="uniform")


# ---- the physical cap ---------------------------------------------------------------------------


def test_the_cap_is_gamma_plus_one_tokens_a_call_at_the_pages_costs():
    """The issue's example: c = 0.055, v(3) = 1.13, o = 0.07 and o_plain = 0.0077 T(1), no
    prefill, 40 tokens at γ = 3 in 10 steps: 4 · 1.0077 / (3 · 0.055 + 1.13 + 0.07) = 2.953.
    Any α < 1 predicts less (the control: the cap is not a prediction)."""
    costs = race.Costs({1: 1.0, 4: 1.13}, {"d": 0.055}, {"target": 0.0, "d": 0.0})
    cap = race.speedup_cap(costs, 0.0077, 0.07, "d", 3, 40)
    assert cap == pytest.approx(4 * 1.0077 / (3 * 0.055 + 1.13 + 0.07), rel=1e-12)
    assert race.predict(costs, 0.0077, 0.07, 0.99, "d", 3, 40) < cap
    assert race.speedup_cap(costs, 0.0077, 0.07, "d", 3, 41) < cap  # 11 steps for 41 tokens


def test_no_interval_reaches_past_the_cap_and_the_cut_keeps_coverage():
    """True speedup 2 with a cap of 2.1 and wide noise (3 prompts × 2 repeats): uncut, most
    intervals reach past 2.1 (the control); cut, none does, and coverage stays above 0.93."""
    noisy = intervals.Components(0.15, 0.1, NOISE.prompt_shape, NOISE.repeat_shape)
    plain, seconds = intervals.synthetic_races(noisy, 3, 2, 2_000, 2.0, np.random.default_rng(5))
    _, _, uncut = intervals.prompt_interval(plain, seconds)
    _, low, high = intervals.prompt_interval(plain, seconds, cap=2.1)
    assert np.mean(uncut > 2.1) > 0.5 and high.max() <= 2.1 and (low <= high).all()
    assert intervals.coverage(intervals.prompt_interval, noisy, 3, 2, cap=2.1) >= 0.93


def test_a_speedup_above_its_cap_refutes_the_costs_and_keeps_its_interval():
    """A race whose speedup, 2, is above a cap of 1.5 computed from costs: cutting would give
    1.5–1.5 around 2, so the interval is kept whole and flagged; with a cap of 2.5 above the
    speedup (the control) the same runs are cut and not flagged."""
    plain, seconds = intervals.synthetic_races(NOISE, 4, 2, 1, 2.0, np.random.default_rng(6))
    runs = _frame(plain[0], seconds[0])
    speedup, low, high, above = intervals.measured(runs, cap=1.5)
    assert (
        above
        and speedup > 1.5
        and (low, high) == pytest.approx(intervals.prompt_interval(plain[0], seconds[0])[1:])
    )
    speedup, low, high, above = intervals.measured(runs, cap=speedup * 1.01)
    assert not above and high == pytest.approx(speedup * 1.01)


# ---- the prediction's band and the verdict ------------------------------------------------------


def test_the_prediction_band_adds_alpha_and_the_costs_spread():
    """Identical predictions and no α error give a band of width 0; α's s.e. alone gives
    ±1.96·slope·s.e.; the costs' spread alone ±1.96·sd/√k; together the root sum of squares."""
    assert intervals.prediction_band([2.0, 2.0, 2.0], 5.0, 0.0) == pytest.approx((2.0, 2.0))
    low, high = intervals.prediction_band([2.0, 2.0], 5.0, 0.01)
    assert high - 2.0 == pytest.approx(1.959964 * 0.05, rel=1e-5)
    low, high = intervals.prediction_band([1.9, 2.1], 0.0, 0.0)
    half = 1.959964 * np.std([1.9, 2.1], ddof=1) / np.sqrt(2)
    assert (low, high) == pytest.approx((2.0 - half, 2.0 + half), rel=1e-5)
    low, high = intervals.prediction_band([1.9, 2.1], 5.0, 0.01)
    assert high - 2.0 == pytest.approx(np.hypot(half, 1.959964 * 0.05), rel=1e-5)
    with pytest.raises(ValueError, match="se"):
        intervals.prediction_band([2.0], 1.0, -0.1)


def test_the_prediction_band_adds_the_loop_overheads_spread():
    """Predictions made with each prompt's o add the variance of their mean; the control, the
    same call without them, is narrower by exactly that part."""
    with_o = intervals.prediction_band([1.9, 2.1], 0.0, 0.0, overheads=[1.8, 2.0, 2.2])
    without = intervals.prediction_band([1.9, 2.1], 0.0, 0.0)
    costs = np.var([1.9, 2.1], ddof=1) / 2
    o_part = np.var([1.8, 2.0, 2.2], ddof=1) / 3
    assert with_o[1] - 2.0 == pytest.approx(1.959964 * np.sqrt(costs + o_part), rel=1e-5)
    assert without[1] - 2.0 == pytest.approx(1.959964 * np.sqrt(costs), rel=1e-5)
    with pytest.raises(ValueError, match="overheads"):
        intervals.prediction_band([2.0], 0.0, 0.0, overheads=[2.0, float("nan")])


def test_the_verdict_is_chosen_on_the_race_and_measured_on_fresh_prompts():
    """A setting lucky on the race's prompts is chosen there, and reported as measured on the
    fresh ones (the control: its race-prompt number, kept as chosen_at, is not reported)."""
    rows = pd.DataFrame(
        [
            {
                "prompt": p,
                "repeat": r,
                "draft": d,
                "gamma": 2,
                "plain": 2.0,
                "seconds": (0.9 + 0.01 * p) if d == "lucky" else 1.0,
                "calls": 10,
            }  # fmt: skip
            for p in range(3)
            for r in range(2)
            for d in ("lucky", "steady")
        ]
    )
    table = intervals.summarise(rows, {("lucky", 2): 5.0, ("steady", 2): 5.0})
    fresh = rows[rows.draft == "lucky"].assign(seconds=lambda f: 1.4 + 0.01 * f.prompt)
    verdict = intervals.confirm(table, fresh)
    assert verdict.draft == "lucky" and verdict.chosen_at == pytest.approx(2 / 0.91, rel=1e-3)
    assert verdict.speedup == pytest.approx(2 / 1.41, rel=1e-3)
    assert verdict.low < verdict.speedup < verdict.high
    assert list(table.cap) == [5.0, 5.0]


def test_the_prediction_figure_labels_each_point_by_gamma():
    table = pd.DataFrame({"draft": ["bigram", "bigram", "draft1-2000"], "gamma": [2, 4, 3]})
    table["predicted"], table["speedup"], table["low"], table["high"] = 1.2, 1.3, 1.1, 1.5
    fig = intervals.plot_prediction(table, "t")
    labels = sorted(text.get_text() for text in fig.axes[0].texts)
    assert labels == ["γ = 2", "γ = 3", "γ = 4"]


def _judged(s_m, s_p, n_prompts=12, races=20_000, seed=5):
    """Simulated settings whose prompts' log speedups and prediction are off by normal errors
    of s.d. s_m·√P (so the mean's is s_m) and s_p, around a true speedup of 2: the table
    `expected_inside` reads, with intervals as wide as the true s_m makes them, and how many
    predictions fell inside their measured interval (whose width is estimated)."""
    from scipy.stats import t

    rng = np.random.default_rng(seed)
    logs = np.log(2) + s_m * np.sqrt(n_prompts) * rng.normal(size=(races, n_prompts))
    _, low, high = intervals._t_interval(logs, 0.95, np.inf)
    predicted = 2 * np.exp(s_p * rng.normal(size=races))
    inside = int(((predicted >= low) & (predicted <= high)).sum())
    half = 1.96 * s_p * predicted
    middle, width = logs.mean(axis=1), t.ppf(0.975, n_prompts - 1) * s_m
    table = pd.DataFrame({"low": np.exp(middle - width), "high": np.exp(middle + width)})
    table["predicted"] = predicted
    table["predicted from"], table["predicted to"] = predicted - half, predicted + half
    return table, inside


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5])
def test_expected_inside_counts_what_an_unbiased_prediction_with_its_band_achieves(ratio):
    """20,000 simulated settings, 12 prompts, the prediction's error s_p = ratio · s_m: the
    expected count matches the count inside to within 1 % of the settings. The count's noise is
    at most √(20000 · 0.25) ≈ 71 (0.35 %), so 1 % is about 3 s.e.; the band's normal half-width
    read back as s_p is exact. The control: the same formula with the normal law in place of
    the t law (2Φ(·) − 1), off by 2.2 % of the settings at ratio 0 and 2.8 % at 1."""
    from scipy.stats import norm, t

    table, inside = _judged(0.02, 0.02 * ratio)
    n = len(table)
    assert abs(intervals.expected_inside(table, 12) - inside) < 0.01 * n
    if ratio < 1.5:
        q = t.ppf(0.975, 11)
        normal = n * (2 * norm.cdf(q / np.hypot(1, ratio)) - 1)
        assert abs(normal - inside) > 0.01 * n


def test_expected_inside_refuses_a_table_it_cannot_read():
    table, _ = _judged(0.02, 0.02, races=10)
    with pytest.raises(ValueError, match="n_prompts"):
        intervals.expected_inside(table, 1)
    with pytest.raises(ValueError, match="predicted to"):
        intervals.expected_inside(table.drop(columns="predicted to"), 12)
