"""The rejection rule: literal step, vectorised engine, exact enumeration, broken verifiers."""

from fractions import Fraction

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT
from scipy.stats import chi2_contingency

import specdec_core as sc

# ---- the literal rule ---------------------------------------------------------------------


@pytest.mark.parametrize("ctx", ["t", sc.BOS, " "])
@pytest.mark.parametrize("w", [0.0, 0.3, 0.9])
def test_residual_is_the_normalised_positive_part(ctx, w):
    p, q = sc.p_dist(ctx), sc.q_dist(ctx, w)
    raw = {tok: max(0.0, p[tok] - q[tok]) for tok in sc.VOCAB}
    residual = sc.residual_dist(ctx, w)
    assert sum(residual.values()) == pytest.approx(1)
    assert residual == pytest.approx({t: v / sum(raw.values()) for t, v in raw.items()})


def test_residual_where_p_equals_q_is_p_and_never_nan():
    for ctx in sc.CONTEXTS:
        residual = sc.residual_dist(ctx, 1.0)
        assert residual == sc.p_dist(ctx)
        assert not np.isnan(list(residual.values())).any()


def test_step_shapes_and_counts(rng):
    for _ in range(200):
        tokens, n, n_tests = sc.speculative_step("t", 3, 0.3, rng)
        assert len(tokens) == n + 1 and 0 <= n <= 3 and n_tests == min(n + 1, 3)
        assert all(isinstance(tok, str) and tok in sc.VOCAB for tok in tokens)


def test_gamma_zero_is_plain_sampling(rng):
    assert all(sc.speculative_step("e", 0, 0.3, rng)[1:] == (0, 0) for _ in range(50))
    first = [sc.speculative_step("t", 0, 0.3, rng)[0][0] for _ in range(20_000)]
    counts = np.array([first.count(tok) for tok in sc.VOCAB])
    assert sc.chi_square_p_value(counts, list(sc.p_dist("t").values())) > P_PASS


def test_w_one_accepts_every_draft(rng):
    for _ in range(200):
        tokens, n, n_tests = sc.speculative_step(sc.BOS, 4, 1.0, rng)
        assert (len(tokens), n, n_tests) == (5, 4, 4)


def test_generate_cuts_to_length_and_records_each_step(rng):
    tokens, steps = sc.speculative_generate(101, 4, 0.3, sc.BOS, rng)
    assert len(tokens) == 101 and sum(s[0] for s in steps) >= 101
    assert all(emitted == kept + 1 for emitted, kept, _ in steps)
    assert sc.speculative_generate(0, 4, 0.3, sc.BOS, rng) == ([], [])


def test_literal_one_token_step_follows_p_not_q():
    rng = np.random.default_rng(3)
    first = [sc.speculative_step("t", 1, 0.3, rng)[0][0] for _ in range(30_000)]
    counts = np.array([first.count(tok) for tok in sc.VOCAB])
    assert sc.chi_square_p_value(counts, list(sc.p_dist("t").values())) > P_PASS
    # negative control: the same counts are far from the draft they were proposed by
    assert sc.chi_square_p_value(counts, list(sc.q_dist("t", 0.3).values())) < P_REJECT


def _literal_pairs(n, rng):
    """Pair counts (324,) of the first two tokens of n literal generations (gamma 2, w 0.3)."""
    codes = []
    for _ in range(n):
        a, b = sc.speculative_generate(2, 2, 0.3, sc.BOS, rng)[0]
        codes.append(sc.TOKEN_INDEX[a] * sc.V + sc.TOKEN_INDEX[b])
    return np.bincount(codes, minlength=sc.V * sc.V)


def test_literal_and_vectorised_generation_agree():
    literal = _literal_pairs(20_000, np.random.default_rng(4))
    fast = sc.joint_check(n_draws=sc.N_DRAWS).counts
    assert chi2_contingency(np.stack([literal, fast])).pvalue > P_PASS
    broken = sc.joint_check(sc.BROKEN_RULES["one uniform"], n_draws=sc.N_DRAWS).counts
    assert chi2_contingency(np.stack([literal, broken])).pvalue < P_REJECT


# ---- exactness, in Fractions ----------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("w", [Fraction(0), Fraction(3, 10), Fraction(1)])
@pytest.mark.parametrize("ctx", [sc.BOS, "t"])
def test_speculative_law_equals_target_exactly(gamma, w, ctx):
    law = sc.speculative_law(2, gamma, w, ctx)
    assert all(isinstance(v, Fraction) for v in law.values())
    assert law == sc.target_joint(2, ctx)


def test_three_tokens_exactly():
    assert sc.speculative_law(3, 3, Fraction(1, 2), "e") == sc.target_joint(3, "e")


def test_two_path_identity_is_zero_in_fractions():
    for w in (Fraction(0), Fraction(1, 7), Fraction(3, 10), Fraction(1)):
        assert not np.any(sc.two_path_identity(w) != 0)


@pytest.mark.parametrize("name", list(sc.BROKEN_RULES))
def test_each_broken_rule_is_exactly_wrong(name):
    law = sc.speculative_law(2, 2, Fraction(3, 10), sc.BOS, rule=sc.BROKEN_RULES[name])
    assert sum(law.values()) == 1  # still a distribution...
    assert sc.law_tv(law, sc.target_joint(2)) > Fraction(1, 100)  # ...but not the target's


# ---- the statistical test and its negative controls --------------------------------------


def test_correct_rule_passes_the_joint_test():
    assert sc.joint_check().p_value > P_PASS


@pytest.mark.parametrize("name", list(sc.BROKEN_RULES))
def test_broken_rules_fail_the_same_test(name):
    assert sc.joint_check(sc.BROKEN_RULES[name]).p_value < P_REJECT


def test_gamma_one_check_passes_and_accept_all_fails():
    assert sc.one_token_check().p_value > P_PASS
    assert sc.one_token_check(sc.BROKEN_RULES["accept all"]).p_value < P_REJECT


# ---- statistics helpers --------------------------------------------------------------------


def test_total_variation_and_chi_square_helpers():
    assert sc.total_variation([0.5, 0.5], [1.0, 0.0]) == 0.5
    assert sc.chi_square_p_value([50, 50], [0.5, 0.5]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="probs"):
        sc.chi_square_p_value([1, 2], [0.5, 0.6])
    with pytest.raises(ValueError, match="one shape"):
        sc.total_variation([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match="probs"):
        sc.noise_reference([0.5, 0.6], 100, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n must"):
        sc.noise_reference([0.5, 0.5], -1, np.random.default_rng(0))
    reference = sc.noise_reference([0.5, 0.5], 10_000, np.random.default_rng(0), reps=500)
    # for a fair coin |p̂ − ½| has mean sqrt(1/(2π n)) ≈ 0.004 at n = 10,000
    assert reference["mean_max_gap"] == pytest.approx(np.sqrt(1 / (2 * np.pi * 10_000)), rel=0.1)


# ---- bad input -----------------------------------------------------------------------------

G = np.random.default_rng(0)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.speculative_step("t", -1, 0.3, G), "gamma"),
        (lambda: sc.speculative_step("t", 1.5, 0.3, G), "gamma"),
        (lambda: sc.speculative_step("t", 2, 1.3, G), "w"),
        (lambda: sc.speculative_step("t", 2, -0.3, G), "w"),
        (lambda: sc.speculative_step("Z", 2, 0.3, G), "ctx"),
        (lambda: sc.speculative_step("t", 2, 0.3, None), "rng"),
        (lambda: sc.speculative_generate(-5, 2, 0.3, "t", G), "n_tokens"),
        (lambda: sc.speculative_generate(5, -2, 0.3, "t", G), "gamma"),
        (lambda: sc.speculative_generate(0, 2, 0.3, "Z", G), "ctx"),
        (lambda: sc.residual_dist("Z", 0.3), "ctx"),
        (lambda: sc.residual_dist("t", 2), "w"),
        (lambda: sc.speculative_law(2, -1, 0.3), "gamma"),
        (lambda: sc.speculative_law(-2, 1, 0.3), "k"),
        (lambda: sc.speculative_law(2, 1, 0.3, "Z"), "ctx"),
        (lambda: sc.target_joint(2, "Z"), "ctx"),
        (lambda: sc.two_path_identity(-1), "w"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
