"""The vectorised engine: `verify` on any distributions, and agreement with the literal loops."""

import warnings

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT
from scipy.stats import chi2_contingency

import specdec.verify
import specdec_core as sc
from specdec.rule import _residual_weights
from specdec.verify import _draw_in_chunks, _sample_rows, _verify


def random_rows(rng, shape, zeros=False):
    """Random distributions along the last axis (Dirichlet), optionally with some exact zeros."""
    rows = rng.dirichlet(np.ones(shape[-1]) * 0.7, size=shape[:-1])
    if zeros:
        rows = np.where(rng.random(shape) < 0.2, 0.0, rows)
        rows[..., 0] += 1e-3  # keep every row non-empty
        rows /= rows.sum(axis=-1, keepdims=True)
    return rows


def batch(rng, size, gamma, vocab, zeros=False):
    """B copies of one position-wise fixed (p, q), and draft tokens drawn from q."""
    p = random_rows(rng, (gamma + 1, vocab), zeros)
    q = random_rows(rng, (gamma, vocab), zeros)
    tokens = np.stack([rng.choice(vocab, size=size, p=q[i]) for i in range(gamma)], axis=1)
    return (
        p,
        q,
        np.broadcast_to(p, (size, gamma + 1, vocab)),
        np.broadcast_to(q, (size, gamma, vocab)),
        tokens,
    )


def outcome_law(p, q):
    """Exact law of (accepted n, emitted token t), (gamma + 1, V), for position-wise fixed p and q.

    P(n = k, t) = Π_{i<k} β_i · max(0, p_k(t) − q_k(t)) for k < γ, and Π_{i<γ} β_i · p_γ(t),
    with β_i = Σ_x min(p_i(x), q_i(x)).
    """
    gamma = len(q)
    beta = np.minimum(p[:gamma], q).sum(axis=1)
    reach = np.concatenate([[1.0], np.cumprod(beta)])  # P(first k drafts kept)
    law = np.vstack(
        [reach[k] * np.maximum(p[k] - q[k], 0) for k in range(gamma)] + [reach[gamma] * p[gamma]]
    )
    return law


@pytest.mark.parametrize(
    "vocab, gamma, zeros, block_rows",
    [(5, 1, False, None), (12, 3, True, None), (30, 5, False, None), (50, 2, True, None)]
    + [(50, 2, True, 40)],  # 40 batch rows a block, fewer than V: numpy's cumsum down columns
)
def test_verify_reproduces_the_exact_outcome_law(monkeypatch, vocab, gamma, zeros, block_rows):
    if block_rows:
        monkeypatch.setattr(specdec.verify, "BLOCK_BYTES", block_rows * (gamma + 1) * vocab * 8)
    rng = np.random.default_rng(vocab * 10 + gamma)
    p, q, target, draft, tokens = batch(rng, 200_000, gamma, vocab, zeros)
    accepted, emitted = sc.verify(target, draft, tokens, rng)
    final = emitted[np.arange(len(emitted)), accepted]
    counts = np.bincount(accepted * vocab + final, minlength=(gamma + 1) * vocab)
    law = outcome_law(p, q).ravel()
    assert law.sum() == pytest.approx(1)
    assert counts[law == 0].sum() == 0  # impossible outcomes never happen
    kept = law > 0
    assert sc.chi_square_p_value(counts[kept], law[kept] / law[kept].sum()) > P_PASS
    # negative control: the law with the residual replaced by p (a broken verifier) is rejected
    wrong = np.vstack(
        [
            outcome_law(p, q)[:gamma].sum(axis=1, keepdims=True) * p[:gamma],
            outcome_law(p, q)[gamma:],
        ]
    ).ravel()
    assert sc.chi_square_p_value(counts[kept], wrong[kept] / wrong[kept].sum()) < P_REJECT


def test_the_emitted_tokens_are_the_kept_draft_then_one_more():
    rng = np.random.default_rng(1)
    _, _, target, draft, tokens = batch(rng, 1000, 4, 9)
    accepted, emitted = sc.verify(target, draft, tokens, rng)
    for n, row, drafted in zip(accepted, emitted, tokens):
        assert (row[:n] == drafted[:n]).all() and 0 <= row[n] < 9 and (row[n + 1 :] == -1).all()


def test_identical_target_and_draft_accept_everything_without_warnings():
    rng = np.random.default_rng(2)
    q = random_rows(rng, (64, 3, 7), zeros=True)
    p = np.concatenate([q, random_rows(rng, (64, 1, 7))], axis=1)
    tokens = np.array([[rng.choice(7, p=row) for row in rows] for rows in q])
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        accepted, emitted = sc.verify(p, q, tokens, rng)
    assert (accepted == 3).all() and not np.isnan(emitted).any()


def test_a_token_the_draft_cannot_produce_is_rejected():
    p = np.full((1, 2, 3), 1 / 3)
    q = np.array([[[0.5, 0.5, 0.0]]])
    for seed in range(50):
        accepted, _ = sc.verify(p, q, np.array([[2]]), np.random.default_rng(seed))
        assert accepted[0] == 0


def test_perfect_one_hot_match_returns_the_draft_and_the_bonus():
    vocab, gamma = 6, 3
    draft_tokens = np.array([[4, 1, 5]])
    q = np.eye(vocab)[draft_tokens]  # (1, 3, 6) one-hot at the drafted tokens
    p = np.eye(vocab)[[[4, 1, 5, 2]]]  # the target agrees, then wants 2
    accepted, emitted = sc.verify(p, q, draft_tokens, np.random.default_rng(0))
    assert accepted.tolist() == [gamma] and emitted.tolist() == [[4, 1, 5, 2]]


def test_early_mismatch_stops_there_and_emits_the_targets_token():
    vocab = 6
    draft_tokens = np.array([[4, 1, 5]])
    q = np.eye(vocab)[draft_tokens]
    p = np.eye(vocab)[[[4, 3, 5, 2]]]  # disagrees at the second position, wants 3
    accepted, emitted = sc.verify(p, q, draft_tokens, np.random.default_rng(0))
    assert accepted.tolist() == [1] and emitted.tolist() == [[4, 3, -1, -1]]


def test_seeded_calls_are_deterministic():
    rng = np.random.default_rng(3)
    _, _, target, draft, tokens = batch(rng, 500, 3, 8)
    first = sc.verify(target, draft, tokens, np.random.default_rng(11))
    second = sc.verify(target, draft, tokens, np.random.default_rng(11))
    assert all((a == b).all() for a, b in zip(first, second))


def _contiguous_batch(seed, size, gamma, vocab):
    """A C-contiguous batch: random target and draft rows with zeros, drafts drawn from q."""
    rng = np.random.default_rng(seed)
    target = random_rows(rng, (size, gamma + 1, vocab), zeros=True)
    draft = random_rows(rng, (size, gamma, vocab), zeros=True)
    tokens = _sample_rows(draft.reshape(-1, vocab), rng).reshape(size, gamma)
    return target, draft, tokens


@pytest.mark.parametrize("vocab, gamma", [(18, 4), (3, 1), (300, 2), (40, 0)])
def test_verify_gives_the_same_tokens_for_any_block_size_and_memory_layout(
    monkeypatch, vocab, gamma
):
    arrays = _contiguous_batch(vocab + gamma, 500, gamma, vocab)
    runs = []
    # one batch row a block (rows longer than the block: numpy's cumsum along each row), a
    # few rows, and the whole batch in one block (rows shorter: the column-by-column sums)
    for block_bytes in (1, 2**14, 2**30):
        monkeypatch.setattr(specdec.verify, "BLOCK_BYTES", block_bytes)
        for layout in (np.ascontiguousarray, np.asfortranarray):  # a flat take, or indexing
            target, draft = layout(arrays[0]), layout(arrays[1])
            runs.append(sc.verify(target, draft, arrays[2], np.random.default_rng(9)))
    for accepted, tokens in runs[1:]:
        assert (accepted == runs[0][0]).all() and (tokens == runs[0][1]).all()
    # control: the same comparison tells another seed's run apart
    other = sc.verify(*arrays, np.random.default_rng(10))
    assert not (other[1] == runs[0][1]).all()


@pytest.mark.parametrize(
    "name, position", [("target_probs", (499, 3, 5)), ("draft_probs", (250, 0, 0))]
)
def test_a_refused_batch_leaves_the_generator_as_it_found_it(monkeypatch, name, position):
    monkeypatch.setattr(
        specdec.verify, "BLOCK_BYTES", 2**12
    )  # many blocks: the bad row is read late
    target, draft, tokens = _contiguous_batch(11, 500, 3, 18)
    rng = np.random.default_rng(12)
    before = rng.bit_generator.state
    sc.verify(target, draft, tokens, rng)
    assert rng.bit_generator.state != before  # control: an accepted batch draws uniforms
    before = rng.bit_generator.state
    arrays = {"target_probs": target, "draft_probs": draft}
    arrays[name][position] = np.nan
    with pytest.raises(ValueError, match=f"{name} contains NaN"):
        sc.verify(*arrays.values(), tokens, rng)
    assert rng.bit_generator.state == before


def test_verify_takes_float32_rows_of_an_engine_sized_vocabulary():
    vocab = 32_000
    draft = np.full((4, 2, vocab), 1 / vocab, dtype=np.float32)  # uniform rows, rounded to float32
    target = np.full((4, 3, vocab), 1 / vocab, dtype=np.float32)
    # summed in float32 by einsum, as the previous check did, these rows miss 1 by 1.9e-5, past
    # the 1e-6 tolerance; the float64 sum of the same float32 entries misses it by 4.7e-8
    assert abs(np.einsum("...v->...", draft) - 1).min() > 1e-6
    assert abs(draft.astype(float).sum(axis=-1) - 1).max() < 1e-7
    tokens = np.arange(8).reshape(4, 2)
    accepted, _ = sc.verify(target, draft, tokens, np.random.default_rng(13))
    assert (accepted == 2).all()  # p = q: every draft is kept
    draft[3, 1, 0] += 2e-6  # control: a row off by 2e-6 is still refused
    with pytest.raises(ValueError, match="draft_probs has rows that do not sum to 1"):
        sc.verify(target, draft, tokens, np.random.default_rng(13))


def _long_row(rng, vocab=5000, density=0.3):
    """A long row with exact zeros and mass in every chunk, the short last one included."""
    row = np.where(rng.random(vocab) < density, rng.random(vocab), 0.0)
    row[[0, 1023, 1024, 2500, 4095, 4096, vocab - 1]] = [0.3, 0.01, 0.2, 0.1, 0.05, 0.1, 0.02]
    return row / row.sum()


def test_a_long_row_draws_the_same_tokens_chunk_by_chunk_as_in_one_pass():
    rng = np.random.default_rng(14)
    row, wrong = _long_row(rng), _long_row(rng)
    grid = (np.arange(20_000) + 0.5) / 20_000  # uniforms spread over [0, 1)
    starts = np.arange(0, len(row), sc.CHUNK)  # 4 chunks of 1,024 and one of 904

    def one_pass(weights):
        """The inverse CDF of weights at each grid point, from one cumulative sum."""
        cumulative = np.cumsum(weights)
        return np.searchsorted(cumulative, grid * cumulative[-1], side="right")

    chunked = np.array([_draw_in_chunks(row, starts, u) for u in grid])
    assert (chunked == one_pass(row)).all()
    assert (row[chunked] > 0).all()  # never a zero-probability token
    assert not (chunked == one_pass(wrong)).all()  # control: another row's draws differ


def test_a_uniform_just_below_a_chunk_boundary_stays_in_its_chunk():
    # rows over many orders of magnitude, with zeros; at such a uniform the rest of u, rescaled
    # to the chunk, can round up to 1, and unclipped it would step past the chunk's last token
    # (in these 320 rows it did once, onto a token of weight 0)
    rng = np.random.default_rng(7)
    for _ in range(320):
        vocab = int(rng.integers(4096, 20_000))
        row = rng.random(vocab) ** rng.integers(1, 30)
        row[rng.random(vocab) < rng.random()] = 0.0
        starts = np.arange(0, vocab, sc.CHUNK)
        ends = np.cumsum(np.add.reduceat(row, starts))
        for end in ends:
            below = np.nextafter(end / ends[-1], 0)
            for u in (below, np.nextafter(below, 0)):
                token = _draw_in_chunks(row, starts, min(u, np.nextafter(1, 0)))
                assert token < vocab and row[token] > 0


def test_seeded_outputs_are_those_of_the_previous_verify():
    # commit e128b2f's verify on this batch: the uniforms are drawn in the same order
    rng = np.random.default_rng(17)
    target = rng.dirichlet(np.ones(6) * 0.7, size=(8, 4))
    draft = rng.dirichlet(np.ones(6) * 0.7, size=(8, 3))
    tokens = _sample_rows(draft.reshape(-1, 6), rng).reshape(8, 3)
    accepted, emitted = sc.verify(target, draft, tokens, np.random.default_rng(18))
    assert accepted.tolist() == [1, 1, 0, 3, 1, 1, 0, 1]
    assert emitted.tolist() == [
        [0, 5, -1, -1], [2, 2, -1, -1], [3, -1, -1, -1], [4, 2, 0, 0],
        [1, 1, -1, -1], [4, 1, -1, -1], [2, -1, -1, -1], [4, 1, -1, -1],
    ]  # fmt: skip


@pytest.mark.parametrize("vocab", [50, 5000])  # the column draw, and the chunked one
def test_a_residual_of_a_few_subnormal_ulps_still_gives_a_token_inside_the_vocabulary(vocab):
    p = np.zeros((60, 2, vocab))
    p[:, :, 0], p[:, :, 10] = 1.0, 1.5e-323  # the residual's whole mass: 3 ulps at token 10
    q = np.zeros((60, 1, vocab))
    q[:, :, 0], q[:, :, 11] = 1.0, 1.5e-323
    accepted, emitted = sc.verify(p, q, np.full((60, 1), 11), np.random.default_rng(20))
    # p(11) = 0 rejects every draft; u·total rounds up to the total for some u, where a count
    # of the sums at most u·total gave V (the previous version returned 50 in 8 of these 60)
    assert (accepted == 0).all() and (emitted[:, 0] == 10).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.longdouble])
def test_integer_and_long_double_rows_are_verified_in_at_least_float64(dtype):
    p = np.zeros((100, 2, 6), dtype)
    p[:, :, 3] = 1  # the target is sure of 3
    q = np.zeros((100, 1, 6), dtype)
    q[:, :, 5] = 1  # the draft is sure of 5
    accepted, emitted = sc.verify(p, q, np.full((100, 1), 5), np.random.default_rng(21))
    # in uint8, p − q wraps to 255 at token 5; the previous version summed that in int64 and
    # emitted 5 in some rows
    assert (accepted == 0).all() and (emitted[:, 0] == 3).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint8, np.float64, np.longdouble])
def test_the_rule_sees_rows_in_float64_or_wider(dtype):
    seen = []

    def correction(p, q):
        """The exact residual, noting the dtype the verifier hands the rule."""
        seen.append(p.dtype)
        return _residual_weights(p, q)

    spy = sc.Rule("spy", correction=correction)
    p = np.zeros((4, 2, 6), dtype)
    p[:, :, 3] = 1
    q = np.zeros((4, 1, 6), dtype)
    q[:, :, 5] = 1
    _verify(p, q, np.full((4, 1), 5), np.random.default_rng(22), spy, check_rows=True)
    # float32 running sums put the drawn law of a 32,000-token softmax row 1.5e-4 to 2e-4 off in
    # total variation (5e-6 to 6e-6 by chunks of 1,024), for three rows of normal logits with
    # standard deviation 3; unsigned differences wrap around
    assert seen == [np.promote_types(dtype, np.float64)]


def test_a_negative_entry_is_refused_even_when_its_row_sums_to_1():
    target, draft, tokens = _valid()
    target[0, 0, :2] = [1.2, -0.2]
    target[0, 0, 2:] = 0
    with pytest.raises(ValueError, match="target_probs has negative entries"):
        sc.verify(target, draft, tokens, np.random.default_rng(0))


def test_verify_at_a_long_vocabulary_reproduces_the_exact_outcome_law():
    rng = np.random.default_rng(15)
    p = np.stack([_long_row(rng, density=0.002) for _ in range(2)])  # (gamma + 1, V), gamma = 1
    q = _long_row(rng, density=0.002)[None]  # about 16 tokens each: a few counts per cell
    size, vocab = 10_000, p.shape[1]
    tokens = rng.choice(vocab, size=(size, 1), p=q[0])
    accepted, emitted = sc.verify(
        np.broadcast_to(p, (size, 2, vocab)), np.broadcast_to(q, (size, 1, vocab)), tokens, rng
    )
    final = emitted[np.arange(size), accepted]
    counts = np.bincount(accepted * vocab + final, minlength=2 * vocab)
    law = outcome_law(p, q).ravel()
    assert counts[law == 0].sum() == 0
    kept = law > 0
    assert sc.chi_square_p_value(counts[kept], law[kept] / law[kept].sum()) > P_PASS
    # control: the law with the residual replaced by p is rejected by the same test
    wrong = np.vstack([outcome_law(p, q)[:1].sum() * p[:1], outcome_law(p, q)[1:]]).ravel()
    assert sc.chi_square_p_value(counts[kept], wrong[kept] / wrong[kept].sum()) < P_REJECT


@pytest.mark.parametrize("vocab", [50, 5000])  # the column draw, and the chunked one
def test_a_rejection_with_an_empty_residual_draws_from_p(vocab):
    p = np.zeros((4, 2, vocab))
    p[:, :, 7] = 1.0  # the target is sure of token 7, and the draft agrees: max(p − q, 0) = 0
    q = p[:, :1].copy()
    accepted, emitted = sc.verify(p, q, np.full((4, 1), 3), np.random.default_rng(16))
    assert (accepted == 0).all()  # q(3) = 0: the drafted 3 is rejected ...
    assert (emitted == [7, -1]).all()  # ... and p, not the empty residual, gives the token


def test_read_only_and_broadcast_inputs():
    rng = np.random.default_rng(4)
    p, q, target, draft, tokens = batch(rng, 100, 2, 5)  # target and draft are broadcast views
    tokens = tokens.copy()
    tokens.setflags(write=False)
    accepted, _ = sc.verify(target, draft, tokens, rng)
    assert accepted.shape == (100,)


def test_gamma_zero_is_a_plain_draw_from_p():
    rng = np.random.default_rng(5)
    p = random_rows(rng, (1, 7))
    accepted, emitted = sc.verify(
        np.broadcast_to(p, (100_000, 1, 7)),
        np.zeros((100_000, 0, 7)),
        np.zeros((100_000, 0), dtype=int),
        rng,
    )
    assert (accepted == 0).all()
    assert sc.chi_square_p_value(np.bincount(emitted[:, 0], minlength=7), p[0]) > P_PASS


def _valid(gamma=2, vocab=4, size=3):
    rng = np.random.default_rng(0)
    _, _, target, draft, tokens = batch(rng, size, gamma, vocab)
    return target.copy(), draft.copy(), tokens.copy()


def _with(index, value, array_index=0):
    arrays = list(_valid())
    arrays[array_index] = arrays[array_index].astype(float if array_index < 2 else arrays[2].dtype)
    arrays[array_index][index] = value
    return arrays


@pytest.mark.parametrize(
    "arrays, message",
    [
        (_with((0, 0, 0), 0.9), "sum to 1"),
        (_with((0, 0, 0), -0.1), "negative"),
        (_with((0, 0, 0), np.nan), "NaN or inf"),
        (_with((1, 1, 1), np.inf, 1), "NaN or inf"),
        (_with((0, 0), 4, 2), r"\[0, 4\)"),
        (_with((0, 0), -1, 2), r"\[0, 4\)"),
        ([_valid()[0], _valid(gamma=3)[1], _valid()[2]], "shapes do not match"),
        ([_valid()[0], _valid()[1], _valid(size=5)[2]], "shapes do not match"),
        ([_valid()[0][0], _valid()[1], _valid()[2]], "need target_probs"),
        ([_valid()[0], _valid()[1], _valid()[2].astype(float)], "integers"),
    ],
)
def test_bad_input_raises_a_clear_error(arrays, message):
    with pytest.raises(ValueError, match=message):
        sc.verify(*arrays, np.random.default_rng(0))


def test_verify_needs_a_generator():
    with pytest.raises(ValueError, match="rng"):
        sc.verify(*_valid(), 7)


# ---- the batched toy engine against the literal loops -------------------------------------


def test_batched_one_token_steps_match_the_literal_step():
    rng = np.random.default_rng(6)
    literal = [sc.speculative_step("t", 1, 0.3, rng)[0][0] for _ in range(20_000)]
    literal_counts = np.array([literal.count(tok) for tok in sc.VOCAB])
    fast = sc.one_token_check().counts
    assert chi2_contingency(np.stack([literal_counts, fast])).pvalue > P_PASS
    shifted = sc.one_token_check(sc.BROKEN_RULES["accept all"]).counts
    assert chi2_contingency(np.stack([literal_counts, shifted])).pvalue < P_REJECT


def test_row_sampler_draws_each_row_law():
    rng = np.random.default_rng(7)
    table = random_rows(rng, (3, 11), zeros=True)
    sampler = sc.RowSampler(table)
    for row in range(3):
        draws = sampler(np.full(100_000, row), rng.random(100_000))
        counts = np.bincount(draws, minlength=11)
        assert counts[table[row] == 0].sum() == 0
        kept = table[row] > 0
        assert (
            sc.chi_square_p_value(counts[kept], table[row][kept] / table[row][kept].sum()) > P_PASS
        )


def test_generation_totals_are_consistent():
    totals = sc.simulate_generation(50, 100, 3, [0.0, 1.0], np.random.default_rng(8))
    for run in totals.values():
        assert run.tokens >= 50 * 100 and run.tokens == run.steps + run.accepted
        assert run.tests <= 3 * run.steps
    assert totals[1.0].acceptance_rate == 1.0 and totals[1.0].tokens_per_step == 4.0


class AlmostOne(np.random.Generator):
    """A generator whose every uniform is the largest double below 1."""

    def random(self, size=None, dtype=np.float64, out=None):
        """Uniforms pinned at the top of [0, 1)."""
        return np.full(size, np.nextafter(1.0, 0.0)) if size is not None else np.nextafter(1.0, 0)


def test_a_zero_probability_token_is_never_drawn_even_at_the_top_of_the_unit_interval():
    rng = AlmostOne(np.random.PCG64(0))
    law = {"a": 0.7, "b": 0.2, "c": 0.1, "d": 0.0}  # 0.7 + 0.2 + 0.1 rounds to 1 − 2⁻⁵³
    assert sum(law.values()) == np.nextafter(1.0, 0.0)  # so an unscaled r could pass them all
    assert sc.sample_categorical(law, rng) == "c"
    p = np.array([[[0.7, 0.2, 0.1, 0.0]]])  # gamma = 0: one bonus draw from p
    _, emitted = sc.verify(p, np.zeros((1, 0, 4)), np.zeros((1, 0), dtype=int), rng)
    assert emitted.tolist() == [[2]]
