"""Chapter 8's transformer: the KV cache against a full recompute, rollback, the emitted law,
and the measured-cost form of Theorem 3.8. No test asserts a time."""

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT

import specdec_core as sc
from specdec import transformer as tt

SMALL = tt.Config(d_model=16, n_layers=2, n_heads=4, max_len=32, dtype="float64")


def sequence(n, seed=0):
    """n random input ids (context rows), BOS first, shape (1, n)."""
    ids = np.random.default_rng(seed).integers(1, len(sc.CONTEXTS), size=(1, n))
    ids[0, 0] = 0
    return ids


def full_logits(ids):
    """Logits of every position by one call on an empty cache: no cache reuse at all."""
    return tt.TinyTransformer(SMALL, batch=len(ids)).forward(ids)


def test_cache_gives_the_full_recompute_one_position_at_a_time():
    ids = sequence(12)
    net = tt.TinyTransformer(SMALL)
    incremental = np.concatenate([net.forward(ids[:, i : i + 1]) for i in range(12)], axis=1)
    assert np.allclose(incremental, full_logits(ids), rtol=0, atol=1e-10)


def test_cache_gives_the_full_recompute_in_chunks():
    ids = sequence(12)
    net = tt.TinyTransformer(SMALL)
    chunks = [net.forward(ids[:, a:b]) for a, b in ((0, 5), (5, 6), (6, 12))]
    assert np.allclose(np.concatenate(chunks, axis=1), full_logits(ids), rtol=0, atol=1e-10)


def test_a_corrupted_cache_is_caught():
    """Negative control: the comparison above fails when the cache holds wrong keys."""
    ids = sequence(8)
    net = tt.TinyTransformer(SMALL)
    net.forward(ids[:, :4])
    net.keys[:, :, 1] += 1.0
    assert not np.allclose(net.forward(ids[:, 4:]), full_logits(ids)[:, 4:], atol=1e-6)


def test_rollback_forgets_the_rejected_positions():
    ids, other = sequence(10, seed=1), sequence(10, seed=2)
    net = tt.TinyTransformer(SMALL)
    net.forward(np.concatenate([ids[:, :6], other[:, 6:9]], axis=1))  # 3 positions to reject
    net.rollback(6)
    after = net.forward(ids[:, 6:])
    assert net.lengths.tolist() == [10]
    assert np.allclose(after, full_logits(ids)[:, 6:], rtol=0, atol=1e-10)


def test_rollback_per_sequence_in_a_batch():
    ids = np.concatenate([sequence(9, seed=s) for s in (3, 4)])
    net = tt.TinyTransformer(SMALL, batch=2)
    net.forward(ids[:, :7])
    net.rollback(np.array([3, 5]))
    first = net.forward(np.stack([ids[0, 3:5], ids[1, 5:7]]))
    full = full_logits(ids)
    assert np.allclose(first[0], full[0, 3:5], atol=1e-10)
    assert np.allclose(first[1], full[1, 5:7], atol=1e-10)


def test_a_batch_call_gives_each_sequence_its_own_logits():
    """One call over B sequences (one matrix product over B·n rows) equals B separate calls."""
    ids = np.concatenate([sequence(6, seed=s) for s in (5, 6, 7)])
    together = full_logits(ids)
    alone = np.concatenate([full_logits(ids[i : i + 1]) for i in range(3)])
    assert np.allclose(together, alone, rtol=0, atol=1e-10)
    assert not np.allclose(together, alone[::-1], atol=1e-6)  # control: rows do differ


def test_without_rollback_the_answer_changes():
    """Negative control: skipping the rollback leaves rejected keys visible."""
    ids, other = sequence(10, seed=1), sequence(10, seed=2)
    net = tt.TinyTransformer(SMALL)
    net.forward(np.concatenate([ids[:, :6], other[:, 6:9]], axis=1))
    assert not np.allclose(net.forward(ids[:, 6:7]), full_logits(ids)[:, 6:7], atol=1e-6)


@pytest.mark.parametrize(
    "bad, error",
    [
        (dict(d_model=10, n_heads=4), ValueError),
        (dict(n_layers=0), ValueError),
        (dict(max_len=2.5), ValueError),
        (dict(dtype="float16"), ValueError),
    ],
)
def test_config_rejects_bad_sizes(bad, error):
    with pytest.raises(error):
        tt.Config(**bad)


def test_forward_and_rollback_reject_bad_input():
    net = tt.TinyTransformer(SMALL)
    with pytest.raises(ValueError, match="ids"):
        net.forward(np.array([[19]]))
    with pytest.raises(TypeError, match="ids"):
        net.forward(np.array([[0.5]]))
    with pytest.raises(ValueError, match="max_len"):
        net.forward(np.zeros((1, 33), dtype=int))
    net.forward(np.zeros((1, 3), dtype=int))
    with pytest.raises(ValueError, match="lengths"):
        net.rollback(4)
    with pytest.raises(TypeError, match="config"):
        tt.TinyTransformer({"d_model": 16})


def test_float32_stays_float32():
    net = tt.TinyTransformer(tt.Config(d_model=16, n_layers=1, n_heads=2, max_len=8))
    assert net.forward(sequence(3)).dtype == np.float32


def test_generation_reports_the_toy_law_and_counts_tokens():
    target, draft = tt.law_models(SMALL, SMALL, 0.5)
    run = tt.speculative(target, draft, 20, 3, np.random.default_rng(1))
    assert run.tokens.shape == (1, 20) and run.tokens.min() >= 0 and run.tokens.max() < sc.V
    assert 20 <= run.emitted[0] <= 23 and run.steps <= 20
    assert target.net.lengths[0] == run.emitted[0]  # the cache holds all but the last token
    plain = tt.autoregressive(target, 20, np.random.default_rng(1))
    assert plain.tokens.shape == (1, 20) and plain.steps == 20


def test_draft_equal_to_target_accepts_everything():
    target, draft = tt.law_models(SMALL, SMALL, 1.0)
    run = tt.speculative(target, draft, 20, 4, np.random.default_rng(2))
    assert run.steps == 4 and run.emitted[0] == 20  # 5 tokens per step, every draft kept


# Chapter 3's joint test through the transformers: 20,000 runs, first two tokens against the
# target joint (324 cells). Under exactness the chi-square p-value is uniform, so P_PASS fails
# a correct sampler with probability 0.001; the broken rule must fall below P_REJECT.
N_RUNS = 20_000


def test_speculative_generation_through_the_transformer_emits_exactly_p():
    assert tt.exactness_check(N_RUNS).p_value > P_PASS


@pytest.mark.parametrize("name", ["resample from p", "one uniform"])
def test_the_same_check_rejects_a_broken_verifier(name):
    assert tt.exactness_check(N_RUNS, rule=sc.BROKEN_RULES[name]).p_value < P_REJECT


def test_measured_cost_form_is_theorem_3_8_at_v_equal_1():
    for alpha in (0.0, 0.3, 0.726, 0.95, 1.0):
        for gamma in (1, 2, 4, 7):
            for c in (0.0, 0.05, 0.5):
                tokens = sc.expected_tokens(alpha, gamma)
                general = sc.measured_cost_speedup(tokens, gamma, c, 1.0)
                assert general == pytest.approx(sc.walltime_speedup(alpha, gamma, c), rel=1e-12)


def test_measured_cost_form_falls_as_verification_costs_more():
    fast = sc.measured_cost_speedup(4.0, 4, 0.1, 1.0)
    assert sc.measured_cost_speedup(4.0, 4, 0.1, 2.5) == pytest.approx(fast * 1.4 / 2.9)


@pytest.mark.parametrize(
    "args",
    [
        (0.5, 4, 0.1, 1.0),
        (6.0, 4, 0.1, 1.0),
        (3.0, 4, -0.1, 1.0),
        (3.0, 4, 0.1, 0.0),
        (3.0, 4, 0.1, float("nan")),
        (3.0, -1, 0.1, 1.0),
        (True, 4, 0.1, 1.0),
    ],
)
def test_measured_cost_form_rejects_bad_input(args):
    with pytest.raises(ValueError):
        sc.measured_cost_speedup(*args)


def test_race_rows_put_the_two_predictions_beside_the_measurement():
    point = tt.RacePoint(0.9, 4, 0.005, 4.7, 30, 0.002)  # 0.2 T(1) outside calls per step
    race = tt.Race(0.010, [point], {1: 0.010, 5: 0.020}, 0.001, 0.0005, (0.009, 0.011))
    (row,) = tt.race_rows(race)
    assert row["measured"] == pytest.approx(2.0)
    assert row["c"] == pytest.approx(0.1) and row["v(gamma)"] == pytest.approx(2.0)
    assert row["o"] == pytest.approx(0.2) and row["o plain"] == pytest.approx(0.05)
    expected = sc.chain_stats(0.9, 4).tokens_per_step
    assert row["measured-cost form"] == pytest.approx(expected * 1.05 / 2.6)
    assert row["form without o"] == pytest.approx(expected / 2.4)
    assert row["error"] == pytest.approx(row["measured-cost form"] / 2.0 - 1)
    assert row["theorem 3.8"] == pytest.approx(sc.walltime_speedup(sc.alpha_exact(0.9), 4, 0.1))


def test_the_measured_cost_form_counts_the_time_outside_model_calls():
    assert sc.measured_cost_speedup(3.0, 4, 0.1, 1.2, 0.4, 0.1) == pytest.approx(3.3 / 2.0)
    assert sc.measured_cost_speedup(3.0, 4, 0.1, 1.2) == pytest.approx(3.0 / 1.6)
    with pytest.raises(ValueError, match="overhead"):
        sc.measured_cost_speedup(3.0, 4, 0.1, 1.2, -0.1)


def test_machine_names_cpu_blas_and_threads():
    info = tt.machine()
    assert info["threads"] == 1 and info["cpu"] and info["blas"]


def test_exercise_break_even_v_gives_a_speedup_of_exactly_one():
    expected, gamma, c = sc.chain_stats(0.9, 4).tokens_per_step, 4, 0.12
    v_star = expected - gamma * c
    assert sc.measured_cost_speedup(expected, gamma, c, v_star) == pytest.approx(1.0)
    assert sc.measured_cost_speedup(expected, gamma, c, 0.9 * v_star) > 1


def test_chapter_8_computing_solutions_run():
    """The python blocks in chapter 8's exercise solutions run and their assertions hold."""
    text = (Path(__file__).resolve().parents[1] / "book" / "ch8_stopwatch.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text.split("## Exercises", 1)[1], flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(re.sub(r"^ {3}", "", block, flags=re.M), "ch8", "exec"), {"sc": sc})
