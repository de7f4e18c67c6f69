"""Chapter 7: multi-draft, block and lossy verifiers, checked exactly and by sampling."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
from conftest import P_PASS, P_REJECT

import specdec_core as sc
from specdec.block import _block_tables, _tau_law_block
from specdec.multidraft import _drop, _spectr_final, _spectr_rho, _spectr_start, _top_k_order
from specdec.verify import _sample_rows

F = Fraction


def rows_at(ctx, w, exact=True):
    """(p, q_w) at one context."""
    return tuple(m[sc.CONTEXT_INDEX[ctx]] for m in sc.model_matrices(w, exact))


# ---- several drafts for one position --------------------------------------------------------


@pytest.mark.parametrize("key", sc.EXACT_MULTI_DRAFT)
@pytest.mark.parametrize("ctx, w, k", [("t", F(3, 10), 2), (sc.BOS, F(0), 2), ("t", F(3, 10), 3)])
def test_exact_multi_draft_rules_give_p_exactly(key, ctx, w, k):
    p, q = rows_at(ctx, w)
    table = sc.multi_draft_law(sc.MULTI_DRAFT_RULES[key], p, q, k)
    assert table.sum() == 1 and all(isinstance(v, F) for v in table.ravel() if v != 0)
    assert (table.sum(axis=0) == p).all()  # difference exactly 0


@pytest.mark.parametrize("k", [2, 3])
def test_forgetting_to_renormalise_q_changes_the_law(k):
    p, q = rows_at("t", F(3, 10))
    law = sc.multi_draft_law(sc.MULTI_DRAFT_RULES["broken: q not renormalised"], p, q, k).sum(0)
    assert law.sum() == 1 and sum(abs(law - p)) / 2 > F(1, 1000)


def test_spectr_residual_at_rho_star_is_the_positive_part_of_p_minus_rho_q():
    p, q = rows_at("t", 0.3, exact=False)
    for k in (2, 3, 4):
        state = _spectr_start(p, q, k)
        rho = state[2]
        beta = np.minimum(q, p / rho).sum()
        assert 1 - (1 - beta) ** k == pytest.approx(rho * beta, abs=1e-12)  # ρ* solves it
        expected = np.maximum(p - rho * q, 0) / np.maximum(p - rho * q, 0).sum()
        assert np.allclose(_spectr_final(state), expected, atol=1e-9)
    assert _spectr_rho(p, q, 1) == 1  # one candidate: the single-draft rule


def test_eagle_top_k_accepts_exactly_the_target_mass_of_the_top_k():
    p, q = rows_at("t", F(3, 10))
    order = _top_k_order(q)
    for k in (1, 2, 3, 4):
        rule = sc.MULTI_DRAFT_RULES["EAGLE-2 top-k"]
        assert sc.multi_draft_acceptance(rule, p, q, k) == sum(p[order[:k]])


def test_one_candidate_rules_reduce_to_the_single_draft_rule():
    p, q = rows_at("t", F(3, 10))
    beta = np.minimum(p, q).sum()
    for key in ("SpecInfer", "without replacement", "SpecTr"):
        assert sc.multi_draft_acceptance(sc.MULTI_DRAFT_RULES[key], p, q, 1) == beta


def test_the_lp_bounds_every_rule_and_is_reached_where_hall_allows():
    p, q = rows_at("t", 0.3, exact=False)
    optima = {
        d: sc.optimal_pair_acceptance(p, sc.candidate_pair_law(q, d))
        for d in ("iid", "without", "top-k")
    }
    accept = {key: sc.multi_draft_acceptance(r, p, q, 2) for key, r in sc.MULTI_DRAFT_RULES.items()}
    assert accept["SpecInfer"] <= optima["iid"] + 1e-9 and accept["SpecTr"] <= optima["iid"] + 1e-9
    assert accept["without replacement"] <= optima["without"] + 1e-9
    assert accept["EAGLE-2 top-k"] == pytest.approx(optima["top-k"], abs=1e-9)
    assert sc.pair_cover_slack(p, q) > 0 and optima["iid"] == pytest.approx(1, abs=1e-9)
    # where Hall's condition fails (a unigram draft at BOS), the optimum is below 1
    p0, q0 = rows_at(sc.BOS, 0.0, exact=False)
    assert sc.pair_cover_slack(p0, q0) < 0
    assert sc.optimal_pair_acceptance(p0, sc.candidate_pair_law(q0, "iid")) < 1 - 1e-3


def random_pq(rng, vocab):
    """A random pair of full-support laws."""
    p, q = rng.dirichlet(np.ones(vocab), size=2)
    return p, q


def sampled_candidates(rng, q, size, k, replacement):
    """(size, k) candidates from q, i.i.d. or without replacement."""
    if replacement:
        return rng.choice(len(q), size=(size, k), p=q)
    keys = np.log(rng.random((size, len(q)))) / q  # Efraimidis–Spirakis: top-k keys
    return np.argsort(-keys, axis=1)[:, :k]


@pytest.mark.parametrize("replacement", [True, False])
def test_multi_draft_verify_samples_the_enumerated_law(replacement):
    rng = np.random.default_rng(70 + replacement)
    vocab, k, size = 5, 3, 200_000
    p, q = random_pq(rng, vocab)
    draws = sampled_candidates(rng, q, size, k, replacement)
    chosen, tokens = sc.multi_draft_verify(
        np.broadcast_to(p, (size, vocab)),
        np.broadcast_to(q, (size, vocab)),
        draws,
        rng,
        replacement=replacement,
    )
    assert ((chosen < 0) | (tokens == draws[np.arange(size), np.maximum(chosen, 0)])).all()
    row = np.where(chosen < 0, k, chosen)
    counts = np.bincount(row * vocab + tokens, minlength=(k + 1) * vocab)
    key = "SpecInfer" if replacement else "without replacement"
    law = sc.multi_draft_law(sc.MULTI_DRAFT_RULES[key], p, q, k).astype(float).ravel()
    possible = law > 0
    assert counts[~possible].sum() == 0  # impossible outcomes never happen
    assert sc.chi_square_p_value(counts[possible], law[possible] / law[possible].sum()) > P_PASS
    # negative control: the same counts against a different rule's exact law are rejected
    other = "SpecTr" if replacement else "broken: q not renormalised"
    wrong = sc.multi_draft_law(sc.MULTI_DRAFT_RULES[other], p, q, k).astype(float).ravel()
    kept = wrong > 0
    assert sc.chi_square_p_value(counts[kept], wrong[kept] / wrong[kept].sum()) < P_REJECT


def test_multi_draft_verify_output_law_is_p():
    rng = np.random.default_rng(72)
    p, q = random_pq(rng, 6)
    size = 200_000
    draws = sampled_candidates(rng, q, size, 2, False)
    _, tokens = sc.multi_draft_verify(
        np.tile(p, (size, 1)), np.tile(q, (size, 1)), draws, rng, replacement=False
    )
    counts = np.bincount(tokens, minlength=6)
    assert sc.chi_square_p_value(counts, p) > P_PASS
    assert sc.chi_square_p_value(counts, q) < P_REJECT  # negative control: the draft's law


def _md_valid(size=4, vocab=5, k=2):
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(vocab), size=(2, size))
    return p, q, np.tile(np.arange(k), (size, 1))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: (a[0][:, :3], a[1], a[2]), "shapes do not match"),
        (lambda a: (a[0], a[1], a[2][:, :0]), "k >= 1"),
        (lambda a: (a[0][0], a[1], a[2]), "need target_probs"),
        (lambda a: (a[0] * 2, a[1], a[2]), "sum to 1"),
        (lambda a: (a[0], np.where(a[1] > 0, np.nan, 0), a[2]), "NaN or inf"),
        (lambda a: (a[0], a[1], a[2] + 5), r"\[0, 5\)"),
        (lambda a: (a[0], a[1], a[2].astype(float)), "integers"),
    ],
)
def test_multi_draft_verify_refuses_bad_input(change, message):
    with pytest.raises(ValueError, match=message):
        sc.multi_draft_verify(*change(_md_valid()), np.random.default_rng(0))


def test_multi_draft_verify_refuses_repeats_without_replacement_and_a_bad_rng():
    p, q, tokens = _md_valid()
    with pytest.raises(ValueError, match="repeat"):
        sc.multi_draft_verify(p, q, np.zeros_like(tokens), np.random.default_rng(0), False)
    sc.multi_draft_verify(p, q, np.zeros_like(tokens), np.random.default_rng(0), True)
    with pytest.raises(ValueError, match="rng"):
        sc.multi_draft_verify(p, q, tokens, 3)


# ---- block verification ---------------------------------------------------------------------


def test_the_papers_binary_example_exactly():
    paths, target_row = sc.binary_example()
    assert sc.expected_accepted(paths, block=False) == F(10, 9)
    assert sc.expected_accepted(paths, block=True) == F(11, 9)
    assert sc.ideal_block_bound(paths, target_row) == F(12, 9)


def exact_target_joint(target_row, length, vocab):
    """{tuple: probability} of `length` tokens drawn from the autoregressive target."""
    law = {}
    for s in itertools.product(range(vocab), repeat=length):
        law[s] = np.prod([target_row(s[:j])[s[j]] for j in range(length)])
    return law


def random_fraction_model(rng, vocab, gamma, low=0):
    """Random autoregressive (target_row, draft_row) with rational rows (zeros when low = 0)."""
    prefixes = [t for i in range(gamma + 1) for t in itertools.product(range(vocab), repeat=i)]

    def law():
        counts = rng.integers(low, 4, vocab)
        counts[rng.integers(vocab)] += 1
        return np.array([F(int(c), int(counts.sum())) for c in counts], dtype=object)

    p_rows, q_rows = ({s: law() for s in prefixes} for _ in range(2))
    return (lambda s: p_rows[tuple(int(x) for x in s)]), (
        lambda s: q_rows[tuple(int(x) for x in s)]
    )


@pytest.mark.parametrize("block", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_and_per_token_steps_are_exact_in_fractions(block, seed):
    rng = np.random.default_rng(seed)
    target_row, draft_row = random_fraction_model(rng, 3, 3)
    paths = sc.draft_paths(target_row, draft_row, 3, 3)
    completed = sc.completed_law(sc.step_law(paths, block), target_row, 4)
    reference = exact_target_joint(target_row, 4, 3)
    assert sc.law_difference(completed, reference) == 0


def test_a_block_step_that_draws_from_p_after_a_rejection_is_not_exact():
    rng = np.random.default_rng(3)
    target_row, draft_row = random_fraction_model(rng, 3, 2, low=1)
    paths = sc.draft_paths(target_row, draft_row, 2, 3)
    h, _ = _block_tables(paths.target, paths.draft, paths.tokens)
    tau = _tau_law_block(h)
    law = {}
    for tokens, mass, stops, rows in zip(paths.tokens, paths.prob, tau, paths.target):
        for i, stop in enumerate(stops):  # negative control: p in place of the residual
            for y, prob in enumerate(rows[i]):
                key = (*tokens[:i], y)
                law[key] = law.get(key, 0) + mass * stop * prob
    completed = sc.completed_law(law, target_row, 3)
    assert sc.law_tv(completed, exact_target_joint(target_row, 3, 3)) > F(1, 1000)


def test_block_verification_is_exact_on_the_toy_at_gamma_3():
    law, reference = sc.toy_completed_law(F(3, 10), 3)  # about a minute in Fractions
    assert (law == reference).all()
    law, reference = sc.toy_completed_law(0.3, 3, block=False, exact=False)
    assert np.abs(law - reference).max() < 1e-15  # the per-token rule through the same code


def test_the_array_completion_agrees_with_the_dictionary_one():
    paths, target_row = sc.toy_block_paths(F(1, 2), 2)
    completed = sc.completed_law(sc.step_law(paths), target_row, 3)
    law, _ = sc.toy_completed_law(F(1, 2), 2)
    assert all(law[s] == v for s, v in completed.items()) and len(completed) == law.size


def test_block_never_keeps_fewer_than_per_token_and_never_more_than_the_ideal():
    gains = sc.random_pair_gains(300, seed=5)
    assert gains.min() >= -1e-12 and gains.mean() > 0.01
    rng = np.random.default_rng(6)
    for _ in range(5):
        target_row, draft_row = random_fraction_model(rng, 3, 3)
        paths = sc.draft_paths(target_row, draft_row, 3, 3)
        token, block = (sc.expected_accepted(paths, b) for b in (False, True))
        assert token <= block <= sc.ideal_block_bound(paths, target_row)


def test_block_tokens_per_call_equals_per_token_analysis_and_beats_it():
    for w in (0.0, 0.5):
        chain = sc.chain_stats(w, 3).tokens_per_step
        assert sc.toy_tokens_per_call(w, 3, block=False) == pytest.approx(chain, rel=1e-12)
        assert sc.rule_tokens_per_call(w, 3) == pytest.approx(chain, rel=1e-12)
        assert sc.toy_tokens_per_call(w, 3) > chain + 0.01


def sampled_paths(rng, paths, size):
    """size draft paths drawn from q, with their rows: (target, draft, tokens)."""
    prob = paths.prob.astype(float)
    index = rng.choice(len(prob), size=size, p=prob / prob.sum())
    as_float = [np.asarray(a, dtype=float) for a in (paths.target, paths.draft)]
    return as_float[0][index], as_float[1][index], paths.tokens[index]


def outcome_counts(accepted, emitted, vocab):
    """Counts of each emitted string, keyed as in step_law."""
    counts = {}
    for n, row in zip(accepted, emitted):
        key = tuple(int(t) for t in row[: n + 1])
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_block_verify_samples_the_enumerated_step_law():
    rng = np.random.default_rng(73)
    target_row, draft_row = random_fraction_model(rng, 3, 3)
    paths = sc.draft_paths(target_row, draft_row, 3, 3)
    target, draft, tokens = sampled_paths(rng, paths, 100_000)
    accepted, emitted = sc.block_verify(target, draft, tokens, rng)
    counts = outcome_counts(accepted, emitted, 3)
    for block, check in ((True, lambda pv: pv > P_PASS), (False, lambda pv: pv < P_REJECT)):
        law = sc.step_law(paths, block)  # False: the per-token law, a negative control
        keys = [s for s in law if law[s] > 0]
        assert set(counts) <= set(keys)
        observed = np.array([counts.get(s, 0) for s in keys])
        expected = np.array([float(law[s]) for s in keys])
        assert check(sc.chi_square_p_value(observed, expected / expected.sum()))


def test_block_verify_edge_cases():
    rng = np.random.default_rng(8)
    q = rng.dirichlet(np.ones(5), size=(50, 3))
    p = np.concatenate([q, rng.dirichlet(np.ones(5), size=(50, 1))], axis=1)
    tokens = np.array([[rng.choice(5, p=r) for r in rows] for rows in q])
    accepted, _ = sc.block_verify(p, q, tokens, rng)
    assert (accepted == 3).all()  # p = q: the whole block is kept
    accepted, emitted = sc.block_verify(p[:, :1], q[:, :0], tokens[:, :0], rng)
    assert (accepted == 0).all() and (emitted[:, 0] >= 0).all()  # gamma = 0: a draw from p
    one_hot = np.eye(5)[[[4, 1, 2, 3]]]
    accepted, emitted = sc.block_verify(one_hot, one_hot[:, :3], np.array([[4, 1, 2]]), rng)
    assert accepted.tolist() == [3] and emitted.tolist() == [[4, 1, 2, 3]]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: (a[0][:, :2], a[1], a[2]), "shapes do not match"),
        (lambda a: (a[0][0], a[1], a[2]), "need target_probs"),
        (lambda a: (a[0] * 2, a[1], a[2]), "sum to 1"),
        (lambda a: (a[0], -a[1], a[2]), "negative"),
        (lambda a: (a[0], a[1], a[2] + 9), r"\[0, 4\)"),
    ],
)
def test_block_verify_refuses_bad_input_like_verify(change, message):
    rng = np.random.default_rng(0)
    arrays = (
        rng.dirichlet(np.ones(4), (3, 3)),
        rng.dirichlet(np.ones(4), (3, 2)),
        np.zeros((3, 2), dtype=int),
    )
    for fn in (sc.verify, sc.block_verify):
        with pytest.raises(ValueError, match=message):
            fn(*change(arrays), rng)
    with pytest.raises(ValueError, match="rng"):
        sc.block_verify(*arrays, None)


# ---- lossy verifiers, greedy and strict -----------------------------------------------------


def test_every_lossy_knob_has_positive_tv_and_the_exact_ones_none():
    for family, knob, tokens, tv in sc.lossy_frontier():
        exact = family == "thresholds t < 1" and knob == 1.0
        assert (tv < 1e-12) if exact else (tv > 1e-3), (family, knob)
        assert 1 <= tokens <= 4 + 1e-9
    target = sc.target_joint(2)
    law = sc.speculative_law(2, 3, F(3, 10), rule=sc.loosened_rule(1))
    assert sc.law_difference(law, target) == 0  # t = 1 is the exact rule, in Fractions


def test_medusa_defaults_accept_every_token_on_the_toy():
    accept, _ = sc.medusa_rule(1.0).tables(sc.P_MATRIX, sc.draft_matrix(0.3))
    assert (accept == 1).all()
    accept, _ = sc.medusa_rule(3.0).tables(sc.P_MATRIX, sc.draft_matrix(0.3))
    assert (accept == 0).any()


def test_greedy_target_and_one_hot_draft_reduce_the_rule():
    p, q = rows_at("t", F(3, 10))
    a = int(np.argmax(p.astype(float)))
    greedy = np.array([F(int(i == a)) for i in range(sc.V)], dtype=object)
    accept, residual = sc.EXACT_RULE.tables(greedy, q)
    assert (accept == greedy).all() and (residual == greedy).all()  # accept iff x = a, else a
    b = 3
    one_hot = np.array([F(int(i == b)) for i in range(sc.V)], dtype=object)
    accept, residual = sc.EXACT_RULE.tables(p, one_hot)
    assert accept[b] == p[b] and (residual == _drop(p, b)).all()


def test_strict_verification_accepts_less_than_the_rule():
    for w in (0.0, 0.3, 0.9):
        assert sc.strict_alpha(w) < sc.alpha_exact(w)
    direct = sum(
        sc.PI_P[c] * sum(sc.p_dist(c)[t] * sc.q_dist(c, 0.3)[t] for t in sc.VOCAB) for c in sc.VOCAB
    )
    assert sc.strict_alpha(0.3) == pytest.approx(direct, rel=1e-12)


def test_chapter_7_exercise_eagle_top_4_at_w_1():
    p, q = rows_at("t", F(1))
    rule = sc.MULTI_DRAFT_RULES["EAGLE-2 top-k"]
    assert sc.multi_draft_acceptance(rule, p, q, 4) == F(15, 29) == sum(sorted(p)[-4:])


def block_verify_correcting_from_p(target_probs, draft_probs, draft_tokens, rng):
    """block_verify, except that a rejection is corrected by a fresh draw from p (a bug)."""
    accepted, tokens = sc.block_verify(target_probs, draft_probs, draft_tokens, rng)
    rows = np.arange(len(accepted))
    rejected = rows[accepted < draft_tokens.shape[1]]
    fresh = _sample_rows(target_probs[rejected, accepted[rejected]], rng)
    tokens[rejected, accepted[rejected]] = fresh
    return accepted, tokens


def test_block_verify_passes_chapter_6_audit_and_its_broken_twin_does_not():
    assert sc.audit_verifier(sc.block_verify).passed
    report = sc.audit_verifier(block_verify_correcting_from_p)
    assert not report.passed and not report.table["passed"].all()
