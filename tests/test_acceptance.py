"""What draft quality buys: β, α, Eq. (1), the exact chain, Theorems 3.8 and 3.11 (chapters 4-5)."""

from fractions import Fraction

import numpy as np
import pytest

import specdec_core as sc

# α(0) in exact rational arithmetic, printed once from sc.alpha_fraction(0) and pinned here.
ALPHA0_FLOAT = 0.7258311865862119


def test_stationary_law_three_ways():
    values, vectors = np.linalg.eig(sc.TOKEN_TRANSITION.T)
    leading = np.real(vectors[:, np.argmax(np.real(values))])
    assert sc.PI_P_VECTOR == pytest.approx(leading / leading.sum(), abs=1e-13)
    exact = sc.stationary_exact()
    assert sum(exact) == 1 and all(exact @ sc.P_FRACTIONS[1:] == exact)  # π T = π exactly
    assert sc.PI_P_VECTOR == pytest.approx(exact.astype(float), abs=1e-15)


def test_alpha_at_zero_is_pinned():
    assert float(sc.alpha_fraction(0)) == pytest.approx(ALPHA0_FLOAT, abs=1e-15)
    assert sc.alpha_exact(0) == pytest.approx(ALPHA0_FLOAT, abs=1e-14)


def test_beta_is_the_overlap():
    p, q = sc.p_dist("t"), sc.q_dist("t", 0.3)
    assert sc.beta_exact("t", 0.3) == pytest.approx(sum(min(p[x], q[x]) for x in sc.VOCAB))
    assert sc.beta_exact("t", 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("w", [Fraction(k, 10) for k in range(11)] + [Fraction(1, 3)])
def test_alpha_identity_holds_exactly(w):
    assert (sc.beta_vector(w) == w + (1 - w) * sc.beta_vector(0)).all()
    assert sc.alpha_fraction(w) == w + (1 - w) * sc.alpha_fraction(0)


def test_equation_one():
    assert sc.expected_tokens(0.5, 2) == 1.75
    for alpha in (0.0, 0.3, 0.72, 0.99):
        for gamma in range(8):
            closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
            assert sc.expected_tokens(alpha, gamma) == pytest.approx(closed, rel=1e-12)
    assert sc.expected_tokens(1, 4) == 5 and sc.expected_tokens(1.0, 0) == 1
    assert sc.expected_tokens(sc.alpha_exact(1.0), 4) == pytest.approx(5, abs=1e-12)


def test_theorem_3_8_and_corollary_3_9():
    assert sc.walltime_speedup(0.8, 5, 0) == pytest.approx((1 - 0.8**6) / 0.2)
    assert sc.walltime_speedup(0.5, 3, 0.1) == pytest.approx((1 - 0.5**4) / (0.5 * 1.3))
    grid = np.linspace(0, 0.98, 50)
    for alpha in grid:
        for c in grid:
            assert (sc.optimal_gamma(alpha, c) >= 1) == (alpha > c)  # speculation pays iff α > c


def test_table_1_to_two_decimals():
    for (alpha, gamma), (ops, speed) in sc.TABLE1.items():
        assert round(sc.operations_increase(alpha, gamma, 0), 2) == ops
        assert round(sc.walltime_speedup(alpha, gamma, 0), 2) == speed


def test_t5_bigram_example():
    assert sc.walltime_speedup(0.2, 3, 0) == pytest.approx(1.248)


def test_chain_stats_edge_cases_and_closeness_to_equation_one():
    assert sc.chain_stats(1.0, 4).tokens_per_step == pytest.approx(5)
    assert sc.chain_stats(0.3, 0).tokens_per_step == pytest.approx(1)
    for w in (0.0, 0.5, 0.9):
        chain = sc.chain_stats(w, 4)
        assert chain.tokens_per_step == pytest.approx(
            sc.expected_tokens(sc.alpha_exact(w), 4), abs=2e-3
        )
        assert chain.acceptance_rate == pytest.approx(sc.alpha_exact(w), abs=2e-4)


def test_literal_generation_matches_the_exact_chain():
    """A literal 40,000-token run: tokens per step within 5 standard errors of the exact chain."""
    tokens, steps = sc.speculative_generate(40_000, 4, 0.3, sc.BOS, np.random.default_rng(9))
    run = sc.steps_totals(steps)
    chain = sc.chain_stats(0.3, 4)
    sd = np.std([s[0] for s in steps])  # per-step token count; steps are nearly independent
    assert abs(run.tokens_per_step - chain.tokens_per_step) < 5 * sd / np.sqrt(run.steps)


def test_measured_sweep_within_sampling_noise():
    """The vectorised sweep against exact values, with tolerances derived from the noise.

    Acceptance per test is a mean of Bernoulli(β) outcomes: its standard error is at most
    sqrt(α(1−α)/tests). Tokens per step is a mean over steps of a count in 1..γ+1 whose standard
    deviation is at most that of the capped geometric under α; we allow 5 standard errors (a
    two-sided 5-sigma band; the seed is fixed, so the outcome is the same on every run).
    """
    for w, run in sc.acceptance_sweep().items():
        alpha, chain = sc.alpha_exact(w), sc.chain_stats(w, 4)
        se_rate = np.sqrt(alpha * (1 - alpha) / run.tests) + 1e-12
        assert abs(run.acceptance_rate - chain.acceptance_rate) < 5 * se_rate
        counts = np.arange(1, 6)
        probs = np.array([alpha ** (k - 1) * (1 - alpha) for k in range(1, 5)] + [alpha**4])
        sd = np.sqrt(probs @ counts**2 - (probs @ counts) ** 2)
        assert (
            abs(run.tokens_per_step - chain.tokens_per_step) < 5 * sd / np.sqrt(run.steps) + 1e-12
        )


def test_sweep_negative_control():
    """The same tolerance rejects a sweep run through a verifier that accepts every draft."""
    alpha = sc.alpha_exact(0.3)
    accept_all = sc.simulate_generation(
        200, 1000, 4, [0.3], np.random.default_rng(1), sc.BROKEN_RULES["accept all"]
    )[0.3]
    assert abs(accept_all.acceptance_rate - alpha) > 5 * np.sqrt(
        alpha * (1 - alpha) / accept_all.tests
    )


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.expected_tokens(1.2, 3), "alpha"),
        (lambda: sc.expected_tokens(-0.1, 3), "alpha"),
        (lambda: sc.expected_tokens(float("nan"), 3), "alpha"),
        (lambda: sc.expected_tokens(0.5, -1), "gamma"),
        (lambda: sc.walltime_speedup(0.5, 3, -0.1), "c"),
        (lambda: sc.walltime_speedup(0.5, 3, float("inf")), "c"),
        (lambda: sc.walltime_speedup(0.5, -3, 0.1), "gamma"),
        (lambda: sc.operations_increase(0.5, 3, -1), "c_hat"),
        (lambda: sc.optimal_gamma(0.5, -0.2), "c"),
        (lambda: sc.optimal_gamma(1.5, 0.2), "alpha"),
        (lambda: sc.alpha_exact(1.1), "w"),
        (lambda: sc.beta_exact("t", -0.5), "w"),
        (lambda: sc.beta_exact("?", 0.5), "ctx"),
        (lambda: sc.chain_stats(0.5, -1), "gamma"),
        (lambda: sc.chain_stats(2, 1), "w"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# α of other drafts against the book's target, printed once from sc.alpha_of and pinned here.
ALPHA_UNIFORM = 0.8516783336803573
ALPHA_UNSMOOTHED = 0.3288199992895711


def test_alpha_of_agrees_with_alpha_exact_and_pins_other_drafts():
    unigram = np.tile(sc.Q0_VECTOR, (sc.V, 1))
    assert sc.alpha_of(sc.P_MATRIX[1:], unigram) == pytest.approx(sc.alpha_exact(0), abs=1e-13)
    assert sc.alpha_of(sc.P_MATRIX[1:], sc.UNIFORM_DRAFT) == pytest.approx(ALPHA_UNIFORM, abs=1e-12)
    assert sc.alpha_of(*sc.unsmoothed_models()) == pytest.approx(ALPHA_UNSMOOTHED, abs=1e-12)
    assert sc.alpha_of(sc.P_MATRIX[1:], sc.P_MATRIX[1:]) == pytest.approx(1)


def test_the_uniform_draft_agrees_more_than_the_unigram():
    """The article's 'cheapest, worst-agreeing model' is not the worst: the uniform beats it."""
    assert sc.alpha_of(sc.P_MATRIX[1:], sc.UNIFORM_DRAFT) > sc.alpha_exact(0) + 0.1


def regime_gap(stay):
    """Eq. (1) with the average α over the exact chain's tokens per step, minus 1."""
    p, q = sc.regime_models(stay=stay)
    chain = sc.markov_chain_stats(p, q, 4)
    return sc.expected_tokens(sc.alpha_of(p, q), 4) / chain.tokens_per_step - 1


def test_regime_target_breaks_equation_one_by_ten_percent():
    assert regime_gap(0.9) >= 0.10  # sticky regimes: β correlated from position to position


def test_regime_gap_negative_control():
    """Without stickiness (stay = 0.5, the regime redrawn at every token) the same bound fails."""
    assert regime_gap(0.5) < 0.10


def test_markov_chain_stats_is_chain_stats_on_the_toy():
    for w in (0.0, 0.4):
        generic = sc.markov_chain_stats(sc.P_MATRIX[1:], sc.draft_matrix(w)[1:], 3)
        assert generic == pytest.approx(tuple(sc.chain_stats(w, 3)), abs=1e-15)


def test_alpha_estimator_recovers_alpha_and_rejects_the_logged_rate():
    """β averaged over target-generated contexts, against α: within 4 standard errors.

    The error is the spread of 1000 independent chain means (each chain starts from π_p, so the
    estimate is unbiased); a 4-SE band fails by chance with probability 6e-5. Negative control:
    the same band rejects the per-test acceptance an engine logs (accepted / tests).
    """
    p, q = sc.regime_models()
    alpha = sc.alpha_of(p, q)
    estimate, se = sc.alpha_estimate(p, q, 1000, 200, np.random.default_rng(21))
    assert abs(estimate - alpha) < 4 * se
    logged = sc.markov_chain_stats(p, q, 4).acceptance_rate
    assert abs(logged - alpha) > 4 * se


def test_oracle_and_implied_cost():
    assert sc.oracle_tokens(0.75) == pytest.approx(4)
    assert sc.expected_tokens(0.75, 200) == pytest.approx(sc.oracle_tokens(0.75))
    assert sc.implied_cost(0.75, 7, 3.4) == pytest.approx(0.00838, abs=1e-5)  # T5-small EnDe
    c = 0.02
    speed = sc.walltime_speedup(0.7, 5, c)
    assert sc.implied_cost(0.7, 5, speed) == pytest.approx(c)


RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.alpha_of(np.ones((3, 2)) / 2, np.ones((3, 2)) / 2), "p"),
        (lambda: sc.alpha_of(sc.P_MATRIX[1:], np.ones((18, 18))), "q"),
        (lambda: sc.alpha_of(sc.P_MATRIX[1:], np.full((4, 4), 0.25)), "shape"),
        (lambda: sc.markov_chain_stats(np.full((2, 2), np.nan), np.eye(2), 2), "p"),
        (lambda: sc.regime_models(stay=1.5), "stay"),
        (lambda: sc.regime_models(slip=0.6), "slip"),
        (lambda: sc.alpha_estimate(*sc.regime_models(), 1, 10, RNG), "n_chains"),
        (lambda: sc.alpha_estimate(*sc.regime_models(), 10, 0, RNG), "n_tokens"),
        (lambda: sc.alpha_estimate(*sc.regime_models(), 10, 10, 0), "rng"),
        (lambda: sc.oracle_tokens(1.0), "alpha"),
        (lambda: sc.implied_cost(0.5, 0, 2.0), "gamma"),
    ],
)
def test_new_functions_name_bad_arguments(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_chapter_4_exercises():
    unigram = np.tile(sc.Q0_VECTOR, (sc.V, 1))
    half = sc.alpha_of(sc.P_MATRIX[1:], 0.5 * unigram + 0.5 * sc.UNIFORM_DRAFT)
    assert 0.5 * (sc.alpha_exact(0) + ALPHA_UNIFORM) < half < ALPHA_UNIFORM  # concave in q
    alpha0 = sc.alpha_exact(0)
    assert next(g for g in range(50) if sc.expected_tokens(alpha0, g) > 3) == 5
    assert 0 < regime_gap(0.5) < regime_gap(0.9)


def test_chapter_5_exercises():
    assert sc.optimal_gamma(0.8, 0.05) == 8
    assert sc.implied_cost(0.62, 7, 2.6) < 0 < sc.implied_cost(0.625, 7, 2.6)  # within rounding
    # the best γ never decreases as c falls (exercise 3), checked on a grid
    for alpha in np.linspace(0.05, 0.95, 19):
        best = [sc.optimal_gamma(float(alpha), c) for c in np.linspace(0.5, 0, 51)]
        assert best == sorted(best)


def test_real_pairs_below_the_toy():
    """Chapter 5's caption: 11 of the 20 model-draft α values lie below α(0)."""
    model = [a for _, d, *ts in sc.REAL_PAIR_ALPHAS if d not in ("unigram", "bigram") for a in ts]
    assert (sum(a < sc.alpha_exact(0) for a in model), len(model)) == (11, 20)


def test_equation_one_is_exact_when_beta_does_not_depend_on_the_context():
    """Context-free p and q: β is the same at every test, and the chain gives Eq. (1) exactly."""
    p = np.tile([0.5, 0.3, 0.2], (3, 1))
    q = np.tile([0.2, 0.3, 0.5], (3, 1))
    alpha = sc.alpha_of(p, q)
    for gamma in (1, 4, 7):
        chain = sc.markov_chain_stats(p, q, gamma)
        assert chain.tokens_per_step == pytest.approx(sc.expected_tokens(alpha, gamma), abs=1e-12)
        assert chain.acceptance_rate == pytest.approx(alpha, abs=1e-12)
