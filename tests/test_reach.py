"""generation_test's reach (chapter 9) and the Clopper–Pearson interval it is reported with
(issue 34, item 7): the dose–response machinery, each check beside a control that fails it."""

import json

import numpy as np
import pytest
from scipy import stats

import specdec.exactness as ex
import specdec_core as sc
from specdec.pair import load_pair

PAIR = load_pair()
MAIN = "draft1-2000"
SPACE = PAIR.index[" "]


# ---- Clopper–Pearson ------------------------------------------------------------------------


def test_clopper_pearson_matches_its_closed_forms_and_scipy():
    # at k = 0 and k = n the beta quantiles have closed forms: 1 − (α/2)^(1/n) and (α/2)^(1/n)
    assert sc.clopper_pearson(20, 20) == pytest.approx((0.025 ** (1 / 20), 1.0), rel=1e-12)
    assert sc.clopper_pearson(0, 20) == pytest.approx((0.0, 1 - 0.025 ** (1 / 20)), rel=1e-12)
    assert sc.clopper_pearson(20, 20)[0] == pytest.approx(0.8316, abs=1e-4)  # "20 of 20"
    for k, n in [(5, 10), (1, 7), (79, 100_000), (13, 20)]:
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        assert sc.clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert sc.clopper_pearson(5, 10, 0.99)[0] < sc.clopper_pearson(5, 10)[0]  # wider


def coverage(interval, n, p):
    """The exact probability, over k ~ Binomial(n, p), that interval(k, n) holds p."""
    k = np.arange(n + 1)
    held = np.array([lo <= p <= hi for lo, hi in (interval(int(j), n) for j in k)])
    return float(stats.binom.pmf(k, n, p)[held].sum())


def wald(k, n):
    """The normal-approximation interval p̂ ± 1.96·√(p̂(1 − p̂)/n): the control."""
    p = k / n
    half = 1.96 * np.sqrt(p * (1 - p) / n)
    return p - half, p + half


def test_clopper_pearson_covers_at_its_level_where_the_normal_interval_does_not():
    grid = np.linspace(0.01, 0.99, 99)
    assert min(coverage(sc.clopper_pearson, 20, p) for p in grid) >= 0.95  # exact, no noise
    assert min(coverage(wald, 20, p) for p in grid) < 0.5  # the control: at p near 0 or 1


@pytest.mark.parametrize("k, n", [(-1, 5), (6, 5), (1, 0), (1.5, 4), (True, 4)])
def test_clopper_pearson_refuses_counts_that_are_not_k_of_n(k, n):
    with pytest.raises(ValueError):
        sc.clopper_pearson(k, n)


@pytest.mark.parametrize("confidence", [0, 1, 1.5, float("nan")])
def test_clopper_pearson_refuses_a_confidence_outside_0_1(confidence):
    with pytest.raises(ValueError, match="confidence"):
        sc.clopper_pearson(3, 5, confidence)


# ---- the planted bugs, diluted; the shifted target -------------------------------------------

SMALL = {"n_prompts": 16, "n_tokens": 16}


def test_a_bug_at_fraction_one_is_the_bug_planted_everywhere():
    prompts = PAIR.encode(PAIR.heldout_text[:64]).reshape(4, 16)
    runs = [
        subject.run(prompts, 24, 4, np.random.default_rng(3), MAIN)
        for subject in (ex.BrokenPair(PAIR, "one uniform"), ex.BrokenPair(PAIR, "one uniform", 1))
    ]
    assert np.array_equal(runs[0].tokens, runs[1].tokens)


def test_a_diluted_bug_changes_only_some_steps():
    """At f = 0.5 the run differs from both the exact run and the bug everywhere (same seed)."""
    prompts = PAIR.encode(PAIR.heldout_text[:256]).reshape(16, 16)

    def tokens(subject):
        return subject.run(prompts, 32, 4, np.random.default_rng(5), MAIN).tokens

    exact, half, full = (
        tokens(s)
        for s in (
            PAIR,
            ex.BrokenPair(PAIR, "residual from p", 0.5),
            ex.BrokenPair(PAIR, "residual from p"),
        )
    )
    assert not np.array_equal(half, exact) and not np.array_equal(half, full)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01, float("nan"), True])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="fraction"):
        ex.BrokenPair(PAIR, "residual from p", fraction)


def test_the_exact_draft_bug_has_no_fraction():
    with pytest.raises(ValueError, match="fraction"):
        ex.BrokenPair(PAIR, "draft cache not rolled back", 0.5)


def test_a_full_shift_emits_only_its_token_and_a_small_one_does_not():
    prompts = PAIR.encode(PAIR.heldout_text[:64]).reshape(4, 16)
    full = ex.ShiftedPair(PAIR, SPACE, 1.0).generate(prompts, 20, 4, np.random.default_rng(0), MAIN)
    assert (full == SPACE).all()  # the verifier was handed the point mass at the space
    small = ex.ShiftedPair(PAIR, SPACE, 0.01).generate(
        prompts, 20, 4, np.random.default_rng(0), MAIN
    )
    assert not (small == SPACE).all()  # the control


@pytest.mark.parametrize("token, epsilon", [(-1, 0.1), (10**6, 0.1), (0, 0), (0, 1.5)])
def test_a_shift_outside_the_vocabulary_or_0_1_is_refused(token, epsilon):
    with pytest.raises(ValueError):
        ex.ShiftedPair(PAIR, token, epsilon)


def test_the_dose_machinery_rejects_the_exact_pair_at_its_level_and_a_full_bug_always():
    """At the level 0.25 and a small size, the exact pair is rejected in about a quarter of 40
    seeds: Binomial(40, 0.25) puts 99.9 % of its mass in [3, 19] (the band, from the binomial
    quantiles below). The control: the residual bug in every step, at 64 prompts (p below 1e-6
    at seed 0 in test_pair_robust.py), is rejected at every one of 5 seeds."""
    seeds, level = range(40), 0.25
    low, high = stats.binom.ppf([0.0005, 0.9995], len(seeds), level)
    exact = ex.rejections(PAIR, MAIN, 4, seeds, level=level, **SMALL)
    k = sum(not r["passed"] for r in exact)
    assert low <= k <= high, (k, low, high)
    assert [r["seed"] for r in exact] == list(seeds)
    bug = ex.BrokenPair(PAIR, "residual from p")
    runs = ex.rejections(bug, MAIN, 4, range(5), level=level, n_prompts=64)
    assert sum(not r["passed"] for r in runs) == 5


def test_smallest_detected_picks_the_least_effect_at_the_power():
    assert ex.smallest_detected([0.04, 0.02, 0.01], [10, 9, 3], [10, 10, 10]) == 0.02
    assert ex.smallest_detected([0.04, 0.01], [8, 9], [10, 10]) == 0.01  # not monotone
    assert ex.smallest_detected([0.04, 0.02], [8, 5], [10, 10]) is None  # the control


def test_a_stored_dose_run_reproduces():
    """One stored run of scripts/generation_dose.py, rerun at the default size."""
    record = json.loads(ex.DOSE_RECORD.read_text())
    assert (record["draft"], record["gamma"], record["n_prompts"]) == (MAIN, 4, 256)
    epsilon, runs = min(record["shift"].items())  # the smallest shift stored
    result = ex.generation_test(ex.ShiftedPair(PAIR, SPACE, float(epsilon)), MAIN, 4, seed=0)
    stored = runs[0]
    assert stored["seed"] == 0 and ex.reproduces(result, stored)
    assert not ex.reproduces(result, stored | {"calls": stored["calls"] + 1})  # the control
