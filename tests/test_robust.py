"""Bad input, edge cases and size limits (issue 14), grouped by function. Each test failed on the
code before the fix: a silent wrong answer, a deep numpy error, or a call that never returned."""

import time
from fractions import Fraction

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT

import specdec_core as sc


def fails_at_once(call, *words):
    """call raises a ValueError whose message has every word, in well under a second."""
    start = time.perf_counter()
    with pytest.raises(ValueError) as error:
        call()
    assert time.perf_counter() - start < 1.0, "the check must come before any work"
    for word in words:
        assert word in str(error.value), (word, str(error.value))


# ---- compare ---------------------------------------------------------------------------------


def test_compare_counts_every_row():
    law = sc.target_joint(1, "t", exact=False)
    comparison = sc.compare(np.array([[0], [5], [17]]), law)
    assert comparison.n == 3 and comparison.counts[[0, 5, 17]].tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    "tokens, law, words",
    [
        (np.array([[0], [5], [18]]), sc.target_joint(1, "t", exact=False), ["[0, 18)"]),
        (np.array([[0], [-1]]), sc.target_joint(1, "t", exact=False), ["[0, 18)"]),
        (np.array([[0, 1]]), sc.target_joint(1, "t", exact=False), ["tokens", "(N, 1)"]),
        (np.array([[0.0]]), sc.target_joint(1, "t", exact=False), ["integer"]),
        (np.zeros((0, 1), int), sc.target_joint(1, "t", exact=False), ["non-empty"]),
        (np.array([[0]]), {"a": 0.5, "bc": 0.5}, ["law's keys"]),
        (np.array([[0]]), {"Z": 1.0}, ["law's keys"]),
        (np.array([[0]]), {" ": 0.5, "a": 0.6}, ["sum to 1"]),
        (np.array([[1]]), {" ": 1.0}, ["does not list"]),
        (np.array([[0]]), {}, ["non-empty dict"]),
    ],
)
def test_compare_refuses_tokens_or_laws_that_do_not_match(tokens, law, words):
    fails_at_once(lambda: sc.compare(tokens, law), *words)


# ---- RowSampler ------------------------------------------------------------------------------


def test_row_sampler_refuses_rows_that_are_not_laws():
    fails_at_once(lambda: sc.RowSampler(np.array([[1.0, 3.0]])), "sum to 1")
    fails_at_once(lambda: sc.RowSampler(np.array([[1.5, -0.5]])), "non-negative")
    fails_at_once(lambda: sc.RowSampler(np.array([0.5, 0.5])), "2-D")
    fails_at_once(lambda: sc.RowSampler(np.array([[np.nan, 1.0]])), "finite")
    fails_at_once(lambda: sc.RowSampler(np.full((1, sc.MAX_LOOP + 1), 0.0)), "at most")


def test_row_sampler_draws_a_valid_row_law():
    """The control: a row [1/4, 3/4] draws token 1 three times in four (chi-square at P_PASS)."""
    sampler = sc.RowSampler(np.array([[0.25, 0.75]]))
    rng = np.random.default_rng(0)
    counts = np.bincount(sampler(np.zeros(100_000, int), rng.random(100_000)), minlength=2)
    assert sc.chi_square_p_value(counts, [0.25, 0.75]) > P_PASS
    assert sc.chi_square_p_value(counts, [0.5, 0.5]) < P_REJECT  # what [[1, 3]] used to give


# ---- chi_square_p_value, total_variation, noise_reference, control_rows -------------------


@pytest.mark.parametrize(
    "counts, probs, word",
    [
        ([-5, 10], [0.5, 0.5], "counts"),
        ([0, 0], [0.5, 0.5], "counts"),
        ([3, 4], [1.0, 0.0], "probs"),
        ([3, np.nan], [0.5, 0.5], "counts"),
        (["3", "4"], [0.5, 0.5], "counts"),
        ([3, 4], None, "probs"),
    ],
)
def test_chi_square_refuses_negative_counts_and_zero_probabilities(counts, probs, word):
    fails_at_once(lambda: sc.chi_square_p_value(counts, probs), word)


@pytest.mark.parametrize(
    "a, b, word",
    [(None, None, "a"), ([0.5, 0.5], None, "b"), ([1j, 0], [1, 0], "a"), ([0.5], "x", "b")],
)
def test_total_variation_refuses_what_is_not_an_array_of_numbers(a, b, word):
    fails_at_once(lambda: sc.total_variation(a, b), word)


def test_total_variation_takes_fractions():
    assert sc.total_variation([Fraction(1, 3), Fraction(2, 3)], [0.5, 0.5]) == pytest.approx(1 / 6)


def test_noise_reference_needs_a_draw_and_a_repetition():
    rng = np.random.default_rng(0)
    fails_at_once(lambda: sc.noise_reference([0.5, 0.5], 10, rng, reps=0), "reps", "at least 1")
    fails_at_once(lambda: sc.noise_reference([0.5, 0.5], 0, rng), "n must be at least 1")
    fails_at_once(lambda: sc.noise_reference([0.5, 0.5], 10, rng, reps=10**9), "GiB")
    assert sc.noise_reference([0.5, 0.5], 10, rng, reps=1)["q95_tv"] >= 0


@pytest.mark.parametrize("alpha", [float("nan"), -0.1, 1.5, "0.01"])
def test_control_rows_refuses_a_bad_level(alpha):
    fails_at_once(lambda: sc.control_rows(alpha=alpha), "alpha")


# ---- toy_step --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows, word",
    [
        (np.array([-1, 0]), "[0, 19)"),
        (np.array([19]), "[0, 19)"),
        (np.array([0.0]), "integers"),
        (np.zeros((2, 2), int), "1-D"),
        ([0, 1], "numpy array"),
    ],
)
def test_toy_step_refuses_rows_outside_the_tables(rows, word):
    models = sc.toy_models((0.3,))
    fails_at_once(lambda: sc.toy_step(rows, 2, models, np.random.default_rng(0)), word)


def test_toy_step_checks_its_other_arguments():
    rows, rng = np.zeros(3, np.int32), np.random.default_rng(0)
    fails_at_once(lambda: sc.toy_step(rows, 2, "models", rng), "models")
    fails_at_once(lambda: sc.toy_step(rows, -1, sc.toy_models((0.3,)), rng), "gamma")
    fails_at_once(
        lambda: sc.toy_step(np.zeros(10**6, np.int32), 10**4, sc.toy_models((0.3,)), rng), "GiB"
    )
    accepted, draft, final = sc.toy_step(rows, 2, sc.toy_models((0.3,)), rng)
    assert accepted.shape == (3,) and draft.shape == (3, 2) and final.shape == (3,)


# ---- acceptance_sweep, RunTotals, simulate_generation ----------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"n_tokens": -5}, ["n_tokens", "-5"]),
        ({"n_tokens": 2.5}, ["n_tokens", "2.5"]),
        ({"n_chains": 0}, ["n_chains", "at least 1"]),
        ({"n_chains": -1}, ["n_chains"]),
        ({"seed": "x"}, ["seed"]),
        ({"gamma": -1}, ["gamma"]),
    ],
)
def test_acceptance_sweep_refuses_bad_sizes(kwargs, words):
    fails_at_once(lambda: sc.acceptance_sweep(**kwargs), *words)


def test_an_empty_run_has_no_rates_and_says_so():
    empty = sc.RunTotals(0, 0, 0, 0)
    for rate in ("tokens_per_step", "acceptance_rate"):
        fails_at_once(lambda rate=rate: getattr(empty, rate), "no steps")
    assert sc.steps_totals([]) == empty
    no_tests = sc.RunTotals(steps=5, tokens=5, accepted=0, tests=0)  # γ = 0: no draft to fail
    assert no_tests.tokens_per_step == 1.0 and no_tests.acceptance_rate == 1.0


def test_simulate_generation_refuses_duplicate_or_missing_weights():
    rng = np.random.default_rng(0)
    fails_at_once(lambda: sc.simulate_generation(5, 10, 2, [0.3, 0.3], rng), "distinct")
    fails_at_once(lambda: sc.simulate_generation(5, 10, 2, [0.5, Fraction(1, 2)], rng), "distinct")
    fails_at_once(lambda: sc.simulate_generation(5, 10, 2, [], rng), "non-empty")
    fails_at_once(lambda: sc.simulate_generation(5, 10, 2, 0.3, rng), "sequence")
    totals = sc.simulate_generation(5, 10, 2, [0.3, 0.7], rng)
    assert list(totals) == [0.3, 0.7]


def test_simulate_generation_takes_fraction_weights_like_floats():
    exact = sc.simulate_generation(20, 50, 2, [Fraction(3, 10)], np.random.default_rng(1))
    floats = sc.simulate_generation(20, 50, 2, [0.3], np.random.default_rng(1))
    assert list(exact.values()) == list(floats.values())


# ---- types: chain_stats, sample_categorical, plots -------------------------------------------


def test_chain_stats_takes_a_fraction():
    assert sc.chain_stats(Fraction(3, 10), 4) == sc.chain_stats(0.3, 4)
    assert sc.draft_matrix(Fraction(3, 10)).dtype == np.float64


def test_sample_categorical_takes_the_cores_float32_draft():
    law = sc.q_dist("t", np.float32(0.3))
    assert all(type(v) is float for v in law.values())
    assert sc.sample_categorical(law, np.random.default_rng(0)) in sc.VOCAB


@pytest.mark.parametrize("dist", [{"a": "1"}, {"a": True}, {"a": 1j}, {"a": None}, {}])
def test_sample_categorical_refuses_values_that_are_not_numbers(dist):
    fails_at_once(lambda: sc.sample_categorical(dist, np.random.default_rng(0)), "dist")


@pytest.mark.parametrize("plot", [sc.plot_two_paths, sc.plot_draft_mixture])
def test_plots_of_one_context_name_a_bad_one(plot):
    fails_at_once(lambda: plot(ctx="Z"), "ctx", "'Z'")


# ---- size limits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: sc.sample_tokens(10**8, "t", np.random.default_rng(0)), ["GiB", "MAX_BYTES"]),
        (lambda: sc.autoregressive_sample(10**12, "t", np.random.default_rng(0)), ["at most"]),
        (lambda: sc.speculative_step("t", 10**9, 0.5, np.random.default_rng(0)), ["gamma"]),
        (lambda: sc.speculative_generate(10**9, 2, 0.5, "t", np.random.default_rng(0)), ["n_tok"]),
        (lambda: sc.expected_tokens(0.5, 2**60), ["gamma", "float"]),
        (lambda: sc.walltime_speedup(0.5, 2**60, 0.1), ["gamma"]),
        (lambda: sc.optimal_gamma(0.5, 0.1, max_gamma=2**60), ["max_gamma"]),
        (lambda: sc.optimal_gamma(1 - 1e-9, 1e-9, max_gamma=10**12), ["max_gamma", "MAX_STEPS"]),
        (lambda: sc.chain_stats(0.5, 10**9), ["gamma", "matrix"]),
        (lambda: sc.target_joint(k=10**9), ["k", "outcomes"]),
        (lambda: sc.target_joint(k=5), ["k", "outcomes"]),
        (lambda: sc.speculative_law(10**9, 2, 0.3), ["k", "enumerated"]),
        (lambda: sc.speculative_law(4, 2, 0.3), ["k", "enumerated"]),
        (lambda: sc.simulate_generation(2**63, 10, 2, [0.3], np.random.default_rng(0)), ["GiB"]),
        (lambda: sc.simulate_generation(10, 10**9, 2, [0.3], np.random.default_rng(0)), ["n_tok"]),
        (lambda: sc.simulate_generation(10**5, 10**5, 2, [0.3], np.random.default_rng(0)), ["dr"]),
        (lambda: sc.simulate_prefixes(10**9, 2, 2, 0.3, "t", np.random.default_rng(0)), ["GiB"]),
        (lambda: sc.simulate_prefixes(10, 10**4, 2, 0.3, "t", np.random.default_rng(0)), ["k"]),
    ],
)
def test_each_size_limit_fails_at_once_and_says_why(call, words):
    fails_at_once(call, *words)


def test_optimal_gamma_at_tiny_costs_neither_overflows_nor_divides_by_zero():
    assert sc.optimal_gamma(0.5, 1e-320) == 30 and sc.optimal_gamma(0.9, 5e-324) == 30
    fails_at_once(lambda: sc.optimal_gamma(0.5, 5e-324, max_gamma=10**9), "MAX_STEPS")


def test_sizes_at_the_limits_still_run():
    assert len(sc.target_joint(sc.JOINT_MAX_K, exact=False)) == sc.V**sc.JOINT_MAX_K
    assert sc.optimal_gamma(0.5, 0.1, max_gamma=10**9) == sc.optimal_gamma(0.5, 0.1)
    assert sc.chain_stats(1.0, 1000).tokens_per_step == pytest.approx(1001)


def test_optimal_gamma_closed_forms_and_search_agree_with_the_plain_search():
    """Against a literal argmax over every γ: the early stop and the monotone cases agree."""
    for alpha in (0.0, 0.2, 0.5, 0.8, 0.95, 1.0):
        for c in (0.0, 0.01, 0.1, 0.5, 1.0, 2.0):
            plain = int(np.argmax([sc.walltime_speedup(alpha, g, c) for g in range(61)]))
            if c == 0 and 0 < alpha < 1:  # Σ α^i stops growing in floats; the true optimum is 60
                plain = 60
            assert sc.optimal_gamma(alpha, c, max_gamma=60) == plain, (alpha, c)


def test_equation_one_at_large_gamma_is_the_closed_form():
    assert sc.expected_tokens(0.5, 10**12) == 2.0
    assert sc.expected_tokens(1.0, 10**12) == 10**12 + 1
    assert sc.expected_tokens(Fraction(1, 2), 10**6) == 2.0
    for alpha in (0.1, 0.5, 0.9, 0.999, 1 - 1e-12):  # the two forms meet at γ = 64
        summed = sum(alpha**i for i in range(65))
        assert sc.expected_tokens(alpha, 64) == pytest.approx(summed, rel=1e-13)
    assert sc.walltime_speedup(0.5, 10**12, 0) == 2.0
