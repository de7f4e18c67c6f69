"""The two models, the sampler and argument checking (chapter 1)."""

from fractions import Fraction

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT

import specdec_core as sc


def test_vocabulary_and_contexts():
    assert len(sc.CORPUS) == 80
    assert len(sc.VOCAB) == 18 and sc.VOCAB == sorted(sc.VOCAB)
    assert sc.CONTEXTS == [sc.BOS] + sc.VOCAB and sc.BOS not in sc.VOCAB


def test_target_is_the_add_one_bigram():
    # recount every pair straight from the corpus, independently of the core's loop
    for ctx in sc.CONTEXTS:
        counts = sc.BIGRAM_COUNTS[sc.CONTEXT_INDEX[ctx]]
        expected = {
            tok: (
                1 + sum(1 for a, b in zip(sc.BOS + sc.CORPUS, sc.CORPUS) if a == ctx and b == tok)
            )
            / counts.sum()
            for tok in sc.VOCAB
        }
        assert sc.p_dist(ctx) == pytest.approx(expected, abs=1e-15)
    assert sc.P_MATRIX.sum(axis=1) == pytest.approx(np.ones(19))


def test_unigram_and_draft_mixture():
    assert sum(sc.Q0_TABLE.values()) == pytest.approx(1)
    assert sc.Q0_TABLE[" "] == pytest.approx((1 + sc.CORPUS.count(" ")) / (18 + 80))
    q = sc.q_dist("t", 0.3)
    for tok in sc.VOCAB:
        assert q[tok] == pytest.approx(0.3 * sc.p_dist("t")[tok] + 0.7 * sc.Q0_TABLE[tok])
    assert sc.q_dist("e", 1) == sc.p_dist("e")
    assert sc.q_dist("e", 0) == pytest.approx(sc.Q0_TABLE)
    assert sc.draft_matrix(0.3)[sc.CONTEXT_INDEX["t"]] == pytest.approx(list(q.values()))


def test_fraction_tables_match_the_float_tables():
    assert sc.P_FRACTIONS.sum(axis=1).tolist() == [Fraction(1)] * 19
    assert np.array(sc.P_FRACTIONS, dtype=float) == pytest.approx(sc.P_MATRIX, abs=1e-16)
    assert sc.as_fraction(0.3) == Fraction(3, 10)


def test_autoregressive_sample_is_seeded_and_valid(rng):
    first = sc.autoregressive_sample(50, "t", np.random.default_rng(5))
    again = sc.autoregressive_sample(50, "t", np.random.default_rng(5))
    assert first == again and len(first) == 50 and set(first) <= set(sc.VOCAB)
    assert sc.autoregressive_sample(0, sc.BOS, rng) == []


def _literal_counts(n, rng, dist):
    """Counts of n literal sample_categorical draws, in VOCAB order."""
    draws = [sc.sample_categorical(dist, rng) for _ in range(n)]
    return np.array([draws.count(tok) for tok in sc.VOCAB])


def test_literal_sampler_matches_its_law_and_rejects_another(rng):
    law = sc.p_dist("t")
    counts = _literal_counts(20_000, rng, law)
    exact = np.array(list(law.values()))
    assert sc.chi_square_p_value(counts, exact) > P_PASS
    # negative control: the same counts against the law after 'h' must be rejected
    wrong = np.array(list(sc.p_dist("h").values()))
    assert sc.chi_square_p_value(counts, wrong) < P_REJECT


def test_vectorised_sampler_matches_the_literal_one():
    draws = sc.sample_tokens(200_000, "t", np.random.default_rng(1))
    fast = np.bincount(draws, minlength=18)
    literal = _literal_counts(20_000, np.random.default_rng(2), sc.p_dist("t"))
    # two-sample chi-square (contingency table): same law?
    from scipy.stats import chi2_contingency

    assert chi2_contingency(np.stack([fast, literal])).pvalue > P_PASS
    shifted = _literal_counts(20_000, np.random.default_rng(2), sc.q_dist("t", 0.5))
    assert chi2_contingency(np.stack([fast, shifted])).pvalue < P_REJECT


def test_sampling_check_is_reproducible():
    a, b = sc.sampling_check(), sc.sampling_check()
    assert a.counts.tolist() == b.counts.tolist() and a.n == sc.N_DRAWS
    assert a.p_value > P_PASS


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sc.p_dist("z"), "ctx"),
        (lambda: sc.p_dist(3), "ctx"),
        (lambda: sc.q_dist("t", 1.5), "w"),
        (lambda: sc.q_dist("t", -0.1), "w"),
        (lambda: sc.q_dist("t", float("nan")), "w"),
        (lambda: sc.q_dist("t", "0.3"), "w"),
        (lambda: sc.autoregressive_sample(-1, "t", np.random.default_rng(0)), "n_tokens"),
        (lambda: sc.autoregressive_sample(2.5, "t", np.random.default_rng(0)), "n_tokens"),
        (lambda: sc.autoregressive_sample(True, "t", np.random.default_rng(0)), "n_tokens"),
        (lambda: sc.autoregressive_sample(3, "?", np.random.default_rng(0)), "ctx"),
        (lambda: sc.autoregressive_sample(3, "t", 42), "rng"),
        (lambda: sc.sample_categorical({"a": 0.5, "b": 0.6}, np.random.default_rng(0)), "dist"),
        (lambda: sc.sample_categorical({"a": -0.5, "b": 1.5}, np.random.default_rng(0)), "dist"),
        (lambda: sc.sample_categorical({}, np.random.default_rng(0)), "dist"),
        (lambda: sc.sample_categorical([0.5, 0.5], np.random.default_rng(0)), "dist"),
        (lambda: sc.draft_matrix(2), "w"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
