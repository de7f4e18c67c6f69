"""The traced step, the standardised residuals and the noise bands of chapters 1–3."""

import numpy as np
import pytest
from conftest import P_PASS

import specdec_core as sc

# ---- the traced step ------------------------------------------------------------------------


def test_the_trace_and_the_step_use_the_same_draws():
    for seed in range(30):
        trace = sc.trace_step("t", 3, 0.3, np.random.default_rng(seed))
        tokens, n, n_tests = sc.speculative_step("t", 3, 0.3, np.random.default_rng(seed))
        assert (trace.tokens, trace.accepted, trace.tests) == (tokens, n, n_tests)


def test_each_traced_test_keeps_exactly_when_its_uniform_is_below_the_ratio():
    rng = np.random.default_rng(1)
    for step in sc.trace_run(300, 4, 0.3, sc.BOS, rng):
        n = step.accepted
        assert all(r < a for r, a in zip(step.uniforms[:n], step.ratios[:n]))
        if n < 4:
            assert step.uniforms[n] >= step.ratios[n] and step.tests == n + 1
        p = sc.p_dist(step.ctx)
        q = sc.q_dist(step.ctx, 0.3)
        x = step.draft[0]
        assert step.ratios[0] == min(1.0, p[x] / q[x])


def test_boxes_list_every_draft_once_and_one_last_token():
    kinds_seen = set()
    for step in sc.trace_run(200, 4, 0.3, sc.BOS, np.random.default_rng(2)):
        kinds = [kind for _, kind in step.boxes]
        kinds_seen |= set(kinds)
        assert len(kinds) == 5 and kinds.count("accepted") == step.accepted
        assert kinds.count("bonus") + kinds.count("resampled") == 1
        assert kinds.count("rejected") == (step.accepted < 4)
        assert kinds.count("not tested") == max(0, 4 - step.accepted - 1)
        assert [t for t, k in step.boxes if k in ("accepted", "bonus", "resampled")] == step.tokens
    assert kinds_seen == set(sc.STEP_STYLE)


def test_a_run_chains_each_step_from_the_last_token():
    steps = sc.trace_run(20, 2, 0.5, "t", np.random.default_rng(3))
    assert steps[0].ctx == "t"
    assert all(b.ctx == a.last for a, b in zip(steps, steps[1:]))
    assert sc.trace_run(0, 2, 0.5, "t", np.random.default_rng(3)) == []


def test_the_books_trace_figure_shows_a_rejection_and_a_bonus():
    steps = sc.trace_run(5, 4, 0.3, sc.BOS, np.random.default_rng(sc.SEEDS["trace"]))
    kinds = {kind for step in steps for _, kind in step.boxes}
    assert {"rejected", "resampled", "bonus"} <= kinds


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.trace_step("Z", 2, 0.3, np.random.default_rng(0)), "ctx"),
        (lambda: sc.trace_run(-1, 2, 0.3, "t", np.random.default_rng(0)), "n_steps"),
        (lambda: sc.trace_run(2, 2, 0.3, "t", None), "rng"),
        (lambda: sc.trace_run(2, 2, 1.5, "t", np.random.default_rng(0)), "w"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ---- standardised residuals and noise bands --------------------------------------------------


def test_pearson_residuals_square_to_pearsons_statistic():
    joint = sc.joint_check()
    assert np.sum(joint.pearson_residuals**2) == pytest.approx(joint.chi_square)
    one = sc.one_token_check()
    assert one.sigma == pytest.approx(np.sqrt(one.exact * (1 - one.exact) / one.n))


def test_residual_cells_outside_two_agree_with_noise_and_a_broken_rule_fails():
    # Under the exact law each of the 324 cells is outside ±2 with probability about 0.0455, so
    # the count is about Binomial(324, 0.0455): mean 14.7, sd 3.75. Pass below mean + 5 sd (33.5);
    # a correct sampler exceeds that with probability far below P_PASS.
    limit = 324 * 0.0455 + 5 * np.sqrt(324 * 0.0455 * (1 - 0.0455))
    assert np.sum(np.abs(sc.joint_check().pearson_residuals) > 2) < limit
    # negative control: the subtlest broken verifier puts many more cells outside
    broken = sc.joint_check(sc.BROKEN_RULES["one uniform"])
    assert np.sum(np.abs(broken.pearson_residuals) > 2) > limit


def test_noise_band_of_the_largest_gap_matches_the_independent_approximation():
    check = sc.sampling_check()
    bands = sc.noise_bands(check.exact, check.n, np.random.default_rng(0), reps=4000)
    # Šidák: 18 independent normals stay within ±z in 95 % of runs for z = 2.99. With 4,000
    # replicates the simulated quantile has a standard error of about 0.03; allow 0.15.
    assert bands["q95_max_z"] == pytest.approx(2.99, abs=0.15)
    assert bands["mean_tv"] == pytest.approx(
        0.5 * np.sum(np.sqrt(2 * check.exact * (1 - check.exact) / (np.pi * check.n))), rel=0.05
    )
    assert 0 < bands["sd_tv"] < bands["mean_tv"]


def test_the_books_sampling_check_lies_inside_its_band_and_a_shifted_law_does_not():
    check = sc.sampling_check()
    bands = sc.noise_bands(check.exact, check.n, np.random.default_rng(sc.SEEDS["noise"]))
    z = np.abs(check.empirical - check.exact) / check.sigma
    assert check.p_value > P_PASS and z.max() < bands["q95_max_z"] + 2
    # negative control: the same counts against the draft's law are far outside the band
    q = np.array(list(sc.q_dist("t", 0.9).values()))
    assert (np.abs(check.empirical - q) / np.sqrt(q * (1 - q) / check.n)).max() > 10


@pytest.mark.parametrize(
    "probs, n, match",
    [([0.5, 0.6], 10, "probs"), ([1.0, 0.0], 10, "probs"), ([0.5, 0.5], 0, "n"),
     ([0.5, 0.5], -1, "n")],
)  # fmt: skip
def test_noise_bands_refuse_bad_input(probs, n, match):
    with pytest.raises(ValueError, match=match):
        sc.noise_bands(probs, n, np.random.default_rng(0))
