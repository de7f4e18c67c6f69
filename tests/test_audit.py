"""Chapter 6: sampling settings exactly, the bugs' exact laws, the power formula, the audit."""

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

import specdec_core as sc
from specdec import audit
from specdec.audit import _pooled_cells

S = sc.USER_SETTINGS
W = sc.SETTINGS_W


# ---- sampling settings, exactly (Fractions) -------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 2])
def test_processed_target_is_the_output_law_exactly(gamma):
    reference = sc.processed_target_law(2, S)
    law, _ = sc.pipeline_law(2, gamma, W, sc.Pipeline("correct", S, S))
    assert sum(reference) == 1 and sc.law_total_variation(law, reference) == 0
    # negative control: the same enumeration sees a raw-q ratio as a different law
    broken, _ = sc.pipeline_law(2, gamma, W, sc.bug_pipelines()["raw q in the ratio"])
    assert sc.law_total_variation(broken, reference) > Fraction(1, 100)


def test_draft_settings_change_acceptance_never_the_law():
    reference = sc.processed_target_law(2, S)
    kept = []
    for t in (Fraction(1, 3), Fraction(1)):
        law, first_step = sc.pipeline_law(
            2, 1, W, sc.Pipeline("d", S, sc.replace(S, temperature=t))
        )
        assert sc.law_total_variation(law, reference) == 0
        kept.append(first_step)
    assert kept[0] != kept[1]


def test_greedy_draft_is_exact_when_reported_one_hot_and_not_as_softmax():
    reference = sc.processed_target_law(2, S)
    greedy = sc.replace(S, greedy=True)
    law, _ = sc.pipeline_law(2, 1, W, sc.Pipeline("one-hot", S, greedy))
    assert sc.law_total_variation(law, reference) == 0
    wrong, _ = sc.pipeline_law(2, 1, W, sc.Pipeline("softmax q", S, greedy, None, S))
    assert sc.law_total_variation(wrong, reference) > Fraction(1, 10)


def test_processing_steps():
    rows = np.array(
        [[Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]], dtype=object
    )
    seen = np.array([[True, False, False, False]])
    out = sc.process(rows, seen, sc.Settings(penalty=2))  # (1/4, 1/4, 1/8, 1/8) renormalised
    assert list(out[0]) == [Fraction(1, 3), Fraction(1, 3), Fraction(1, 6), Fraction(1, 6)]
    top2 = sc.process(rows, ~seen & False, sc.Settings(top_k=2))
    assert list(top2[0]) == [Fraction(2, 3), Fraction(1, 3), 0, 0]
    top_p = sc.process(rows, ~seen & False, sc.Settings(top_p=Fraction(3, 4)))
    assert list(top_p[0]) == [Fraction(2, 3), Fraction(1, 3), 0, 0]
    cold = sc.process(rows, ~seen & False, sc.Settings(temperature=Fraction(1, 2)))
    assert cold[0, 0] == Fraction(16, 22)


@pytest.mark.parametrize("key", [k for k in sc.bug_pipelines() if k not in sc.EXACT_IN_FRACTIONS])
def test_floats_agree_with_fractions_on_two_tokens(key):
    pipeline = sc.bug_pipelines()[key]
    exact = np.asarray(sc.pipeline_law(2, 2, W, pipeline)[0], float)
    floats = sc.pipeline_law(2, 2, float(W), pipeline, exact=False)[0]
    assert np.abs(exact - floats).max() < 1e-12


# ---- each bug's exact TV ----------------------------------------------------------------------

EXPECTED_TV = {  # three tokens, gamma = 2, floats; pinned so a change to a bug's model shows
    "argmax draft, softmax q": 0.698,
    "raw q in the ratio": 0.443,
    "unprocessed target": 0.944,
    "argmax target at T > 0": 0.998,
    "bf16 draft, fp32 ratio": 5.45e-4,
    "stale penalty prefix": 0.158,
    "softmax residual": 0.571,
    "residual at token": 0.230,
    "whole-row test": 0.588,
    "correction from p": 0.255,
}


def test_each_bug_has_its_exact_tv():
    rows = {r["bug"]: r for r in sc.bug_rows()}
    assert set(rows) == set(EXPECTED_TV)
    for key, tv in EXPECTED_TV.items():
        assert rows[key]["TV"] == pytest.approx(tv, rel=2e-3), key
        assert rows[key]["draws to catch"] >= 1


def test_tiny_clamp_is_off_by_less_than_its_bound_and_only_on_forbidden_outcomes():
    tv, law, reference = sc.tiny_clamp_row()
    assert 0 < tv < Fraction(2 * sc.V) * sc.FLOAT32_TINY / Fraction(1, 100)
    forbidden = sum(a for a, b in zip(law, reference) if b == 0)
    assert 0 < forbidden <= tv  # some of the error lands on tokens top-k removed


# ---- the power formula against a simulation ------------------------------------------------


def test_samples_to_detect_matches_a_simulation():
    reference = np.array([0.4, 0.3, 0.2, 0.1])
    law = np.array([0.36, 0.3, 0.22, 0.12])
    n, reason = sc.samples_to_detect(law, reference)
    assert reason == "chi-square"
    rng = np.random.default_rng(7)
    counts = rng.multinomial(int(n), law, size=4000)
    critical = sc.stats.chi2.isf(1e-3, 3)
    stat = ((counts - n * reference) ** 2 / (n * reference)).sum(axis=1)
    power = (stat > critical).mean()
    # 4000 trials: SE of a proportion near 0.8 is 0.0063; 4 SE band, plus 0.03 for the
    # chi-square approximation at finite n
    assert abs(power - 0.8) < 4 * 0.0063 + 0.03
    # negative control: at a quarter of n the same test has far less power
    weak = (
        (rng.multinomial(int(n) // 4, law, size=4000) - n / 4 * reference) ** 2
        / (n / 4 * reference)
    ).sum(axis=1)
    assert (weak > critical).mean() < 0.5


def test_cauchy_schwarz_sizing_bounds_every_alternative():
    law = sc.scenario_law(sc.audit_scenarios()[0])
    rng = np.random.default_rng(3)
    for _ in range(20):  # random alternatives at TV exactly AUDIT_TV
        other = rng.dirichlet(np.ones(law.size))
        alternative = law + sc.AUDIT_TV * (other - law) / sc.total_variation(other, law)
        drift = ((alternative - law) ** 2 / law).sum()
        assert drift >= 4 * sc.AUDIT_TV**2 * (1 - 1e-9)


def power_at_worst_case(law, n, level, pooled):
    """Noncentral chi-square power of n draws at λ = 4·n·(AUDIT_TV − pooled)², the worst case."""
    df = int((law > 0).sum()) - 1
    critical = stats.chi2.isf(level, df)
    return float(stats.ncx2.sf(critical, df, 4 * n * (sc.AUDIT_TV - pooled) ** 2))


def test_audit_draws_reach_the_promised_power_and_a_quarter_of_them_do_not():
    for scenario in sc.audit_scenarios():
        law = sc.scenario_law(scenario)
        n, pooled = sc.audit_draws(law, 1e-3 / 9)
        if (law > 0).sum() < 2:  # one outcome: n draws see mass AUDIT_TV elsewhere w.p. 0.99
            assert (1 - sc.AUDIT_TV) ** n <= 0.01 < (1 - sc.AUDIT_TV) ** (n // 4)
            continue
        assert power_at_worst_case(law, n, 1e-3 / 9, pooled) >= 0.99, scenario.name
        # the control: the same worst case with a quarter of the draws is caught far less often
        assert power_at_worst_case(law, n // 4, 1e-3 / 9, pooled) < 0.9, scenario.name


# ---- the exact statistic and the run-wise false-alarm rate ------------------------------------


def test_verifier_law_of_the_exact_rule_is_the_target_law_and_a_bug_moves_it():
    for index, scenario in enumerate(sc.audit_scenarios()):
        law = sc.scenario_law(scenario)
        assert np.abs(sc.verifier_law(scenario) - law).max() < 1e-12, scenario.name
        bug = sc.verifier_law(scenario, rule=sc.ROW_BUGS["correction from p"])  # the control
        assert abs(bug.sum() - 1) < 1e-12
        if index in (0, 1, 4):  # scenarios where rejections happen and q matters
            assert sc.total_variation(bug, law) > 0.05, scenario.name


def test_exact_chi_square_has_its_level_at_any_count_and_pearson_does_not():
    """30 cells expecting 0.5 draws each: the exact statistic rejects at its level, 1e-3, within
    4 SE (40,000 trials, SE 1.6e-4); Pearson's, on the same counts, far above it."""
    rng = np.random.default_rng(8)
    law, n, trials, level = rng.dirichlet(np.ones(30)), 15, 40_000, 1e-3
    counts = rng.multinomial(n, law, size=trials)
    critical = stats.chi2.isf(level, 29)
    exact = sc.exact_chi_square(counts, law, rng.random((trials, 29)))
    band = 4 * np.sqrt(level * (1 - level) / trials)
    assert abs((exact > critical).mean() - level) < band
    pearson = ((counts - n * law) ** 2 / (n * law)).sum(axis=1)  # the negative control
    assert (pearson > critical).mean() > level + 10 * band


def worst_case(law, tv):
    """An alternative at TV ≈ tv with |a − b|/b the same in every cell, Cauchy–Schwarz's equality:
    signs balance the mass, largest cells first."""
    sign, balance = np.empty(law.size), 0.0
    for i in np.argsort(-law):
        sign[i] = 1.0 if balance <= 0 else -1.0
        balance += sign[i] * law[i]
    alternative = law * (1 + 2 * tv * sign)
    return alternative / alternative.sum()


def test_a_small_scenario_catches_the_worst_case_at_its_tv_and_not_at_a_quarter_of_the_draws():
    """The sizing's worst case, simulated through the exact statistic: 2,000 trials at the audit's
    draws reject w.p. ≥ 0.99 − 4 SE (SE 0.0022); at a quarter of the draws, far less often."""
    law = sc.scenario_law(sc.audit_scenarios()[0])  # 256 outcomes
    level = sc.AUDIT_LEVEL / sc.small_statistics()
    n, pooled = sc.audit_draws(law, level)
    rng = np.random.default_rng(4)
    for draws, lowest, highest in ((n, 0.99 - 4 * 0.0022, 1), (n // 4, 0, 0.5)):
        _, cell_law = _pooled_cells(law, draws)
        other = worst_case(cell_law, sc.AUDIT_TV - pooled)
        assert sc.total_variation(other, cell_law) <= sc.AUDIT_TV - pooled + 1e-3
        counts = rng.multinomial(draws, other, size=2000)
        stat = sc.exact_chi_square(counts, cell_law, rng.random((2000, cell_law.size - 1)))
        caught = (stat > stats.chi2.isf(level, cell_law.size - 1)).mean()
        assert lowest <= caught <= highest, (draws, caught)


@pytest.mark.parametrize("suite, runs", [("small", 2000), ("engine", 150)])
def test_the_run_wise_false_alarm_rate_at_a_level_simulation_can_resolve(suite, runs):
    """Simulated exact runs at level 0.3 (the audit's code, a reduced size): the share that fails
    is at most the rate of independent statistics and Bonferroni's 0.3, within 4 SE (statistics
    that share draws fail together more often, so less often in all), and at least half of it
    (the statistics do fire under the null)."""
    result = sc.null_false_alarms(suite, runs=runs, seed=5, level=0.3)
    se = np.sqrt(result["design"] * (1 - result["design"]) / runs)
    assert result["design"] / 2 < result["rate"] <= min(result["design"], 0.3) + 4 * se


def test_each_small_statistic_rejects_an_exact_verifier_at_its_level():
    """Scenario 0's joint test and its six direction tests on 4,000 simulated exact runs at level
    0.05 each: each rejects within 4 SE (0.0138) of 0.05. The negative control: counts from the
    law moved halfway toward a bug's, where that bug's direction test rejects far more often."""
    rng = np.random.default_rng(6)
    level, runs = 0.05, 4000
    law = sc.scenario_law(sc.audit_scenarios()[0])
    tests = audit._small_tests(0, audit._null_counts(0, level, rng, runs), level, rng)
    assert len(tests) == 1 + len(audit._directions(0))
    band = 4 * np.sqrt(level * (1 - level) / runs)
    for name, (stat, critical, *_) in tests.items():
        assert abs((stat > critical).mean() - level) < band, name
    gap = audit._directions(0)[audit.DIRECTION_NAMES["correction from p"]]
    moved = np.zeros(law.size)
    moved[law > 0] = law[law > 0] + gap / 2
    n = int(audit._null_counts(0, level, rng).sum())
    counts = rng.multinomial(n, moved, size=runs)
    stat, critical, *_ = audit._small_tests(0, counts, level, rng)[
        audit.DIRECTION_NAMES["correction from p"]
    ]
    assert (stat > critical).mean() > level + 10 * band / 4


def test_a_bug_on_some_requests_is_caught_along_its_direction():
    """The correction from p on 30 % of requests: where its direction test is sized for the
    smallest share (below 0.3), that test fails w.p. ≥ 0.99 (noncentral chi-square), while the
    joint test there has power below 0.5. The negative control: on 3 % of requests, a seventh of
    that share, the audit passes (the direction tests' power there is below 1e-3)."""
    level = sc.AUDIT_LEVEL / sc.small_statistics()
    shares = {}
    for i, scenario in enumerate(sc.audit_scenarios()):
        law = sc.scenario_law(scenario)
        n, _ = sc.audit_draws(law, level)
        cell, cell_law = _pooled_cells(law, n)
        gap = audit._directions(i).get(audit.DIRECTION_NAMES["correction from p"])
        if gap is None:
            continue
        gap = np.bincount(cell[law > 0], weights=gap, minlength=cell_law.size)
        drift = (gap**2 / cell_law).sum()
        shift = stats.norm.isf(level / 2) + stats.norm.ppf(sc.AUDIT_POWER)
        joint = stats.ncx2.sf(
            stats.chi2.isf(level, cell_law.size - 1), cell_law.size - 1, n * 0.3**2 * drift
        )
        shares[i] = (shift / np.sqrt(n * drift), joint)
    best = min(shares, key=lambda i: shares[i][0])
    assert shares[best][0] < 0.3 and shares[best][1] < 0.5

    def sometimes(share):
        bug = sc.rule_verifier(sc.ROW_BUGS["correction from p"])

        def verify_fn(target_probs, draft_probs, draft_tokens, rng):
            hit = rng.random(len(draft_tokens)) < share
            accepted, tokens = sc.verify(target_probs, draft_probs, draft_tokens, rng)
            bugged = bug(target_probs[hit], draft_probs[hit], draft_tokens[hit], rng)
            accepted[hit], tokens[hit] = bugged
            return accepted, tokens

        return verify_fn

    table = sc.audit_verifier(sometimes(0.3), seed=1).table
    mine = table[(table["scenario"] == sc.audit_scenarios()[best].name)]
    assert not mine[mine["component"] == audit.DIRECTION_NAMES["correction from p"]]["passed"].all()
    assert sc.audit_verifier(sometimes(0.03), seed=1).passed


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"level": 0}, "level"),
        ({"level": 1.5}, "level"),
        ({"batch": 0}, "batch"),
        ({"runs": -1}, "runs"),
        ({"suite": "huge"}, "suite"),
    ],
)
def test_null_false_alarms_refuses_bad_arguments_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        sc.null_false_alarms(**kwargs)


def test_the_false_alarm_record_is_read_and_refused_when_stale(tmp_path):
    fields = {"suite": "small", "runs": 10, "alarms": 0, "level": sc.AUDIT_LEVEL}
    lines = [
        " ".join(f"{k}={v}" for k, v in (fields | {"suite": s, "draws": sc.suite_draws(s)}).items())
        for s in sc.SUITES
    ]
    path = tmp_path / "record.txt"
    path.write_text("# header\n" + "\n".join(lines) + "\n")
    assert sc.false_alarm_record(path)["engine"]["draws"] == sc.suite_draws("engine")
    path.write_text("\n".join(lines).replace(f"draws={sc.suite_draws('small')}", "draws=1"))
    with pytest.raises(ValueError, match="stale for the small suite"):
        sc.false_alarm_record(path)


def test_detectable_says_what_each_suite_was_sized_for():
    small = sc.detectable(sc.audit_verifier(sc.verify, seed=2))
    assert f"TV ≥ {sc.AUDIT_TV:g}" in small and "9 scenarios" in small
    p, q = sc.model_matrices(0.3, exact=False)
    logged = sc.Scenario("rows after t, o, ␣", p[[1, 2, 3]][None], q[[1, 2]][None], steps=2000)
    report = sc.audit_verifier(sc.verify, scenarios=[logged])
    engine = sc.detectable(report)
    assert f"{report.table['sized for TV'].notna().sum()} statistics" in engine
    assert f"median {report.table['sized for TV'].median():.2g}" in engine


# ---- the audit ----------------------------------------------------------------------------


def verify_by_exponential_race(target_probs, draft_probs, draft_tokens, rng):
    """A correct verifier written differently: position-major uniforms, exponential race."""
    batch, gamma = draft_tokens.shape
    rows = np.arange(batch)
    accepted = np.full(batch, gamma)
    alive = np.ones(batch, dtype=bool)
    for i in range(gamma):
        x = draft_tokens[:, i]
        p, q = target_probs[rows, i, x], draft_probs[rows, i, x]
        fail = alive & (rng.random(batch) * q > p)  # reject w.p. 1 − min(1, p/q)
        accepted[fail] = i
        alive &= ~fail
    p_n = target_probs[rows, accepted]
    q_n = draft_probs[rows, np.minimum(accepted, gamma - 1)]
    residual = np.where((accepted == gamma)[:, None], p_n, np.maximum(p_n - q_n, 0))
    final = np.argmax(residual / rng.exponential(size=residual.shape), axis=1)
    tokens = np.full((batch, gamma + 1), -1)
    for i in range(gamma):
        tokens[accepted > i, i] = draft_tokens[accepted > i, i]
    tokens[rows, accepted] = final
    return accepted, tokens


@pytest.mark.parametrize(
    "verify_fn", [sc.verify, verify_by_exponential_race, sc.rule_verifier(sc.ROW_EXACT)]
)
def test_correct_verifiers_pass(verify_fn):
    report = sc.audit_verifier(verify_fn, seed=1)
    assert report.passed, report.table


@pytest.mark.parametrize(
    "verify_fn",
    [sc.rule_verifier(sc.ROW_BUGS[k]) for k in sc.ROW_BUGS if k != "tiny clamp"]
    + [sc.greedy_target_verifier],
)
def test_broken_verifiers_fail(verify_fn):
    report = sc.audit_verifier(verify_fn, seed=1)
    assert not report.passed
    assert (~report.table["passed"]).sum() >= 1


def test_verifier_that_raises_or_misshapes_fails_with_a_message():
    raising = sc.audit_verifier(lambda *args: 1 / 0)
    assert not raising.passed and raising.table["finding"].str.contains("ZeroDivision").all()
    wrong_shape = sc.audit_verifier(lambda t, d, x, r: (np.zeros(3, int), x))
    assert wrong_shape.table["finding"].str.contains("shapes").all()

    def impossible(t, d, x, r):
        accepted, tokens = sc.verify(t, d, x, r)
        tokens[np.arange(len(tokens)), accepted] = t.shape[2]
        return accepted, tokens

    assert sc.audit_verifier(impossible).table["finding"].str.contains("impossible").all()
    assert not sc.audit_verifier(lambda *a: "nonsense").passed
    with pytest.raises(TypeError, match="verify_fn"):
        sc.audit_verifier(42)


# ---- verify's dtypes (issue 14) --------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.int8, np.int16])
def test_verify_returns_signed_tokens_for_any_integer_drafts(dtype):
    rng = np.random.default_rng(0)
    target = rng.dirichlet(np.ones(5), size=(200, 4))
    draft = rng.dirichlet(np.ones(5), size=(200, 3))
    tokens = rng.integers(0, 5, size=(200, 3)).astype(dtype)
    accepted, emitted = sc.verify(target, draft, tokens, rng)
    assert emitted.dtype.kind == "i"
    assert (emitted[np.arange(3 + 1) > accepted[:, None]] == -1).all()
    assert (accepted < 3).any()  # some rows are padded, so -1 (not 255) is checked


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda a: a.astype(object), TypeError),
        (lambda a: a > 0.5, TypeError),
        (lambda a: a.astype(complex), TypeError),
    ],
)
@pytest.mark.parametrize("which", ["target_probs", "draft_probs"])
def test_verify_refuses_non_real_probabilities_by_name(make, error, which):
    rng = np.random.default_rng(0)
    arrays = {
        "target_probs": rng.dirichlet(np.ones(4), size=(2, 3)),
        "draft_probs": rng.dirichlet(np.ones(4), size=(2, 2)),
    }
    arrays[which] = make(arrays[which])
    with pytest.raises(error, match=which):
        sc.verify(arrays["target_probs"], arrays["draft_probs"], np.zeros((2, 2), int), rng)


def test_verify_refuses_bool_drafts_by_name():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="draft_tokens"):
        sc.verify(
            rng.dirichlet(np.ones(4), size=(2, 3)),
            rng.dirichlet(np.ones(4), size=(2, 2)),
            np.zeros((2, 2), bool),
            rng,
        )


def test_exercise_two_sizing():
    n = sc.noncentrality_needed(63, 1e-4, 0.99) / (4 * 0.05**2)
    assert 5_000 < n < 50_000  # λ ≈ 100 over 4·0.0025
    assert sc.noncentrality_needed(63, 1e-4, 0.99) / (4 * 0.02**2) > n  # smaller TV, more draws


def test_exact_scores_stay_finite_for_counts_the_law_cannot_give():
    """A count far in the tail (probability below 1e-300) scores ±37 at most, never ±inf, so a
    direction's weighted sum with a zero weight is a number, not NaN; the control, counts the
    law can give, scores within ±6."""
    from specdec.projections import exact_scores

    law = np.array([0.5, 0.5 - 1e-12, 1e-12])
    wild = exact_scores(np.array([0, 0, 5000]), law, np.full(2, 0.5))
    assert np.isfinite(wild).all() and np.abs(wild).max() <= 37.1
    assert np.isfinite(wild @ np.array([0.0, 1.0]))
    tame = exact_scores(np.array([2500, 2500, 0]), law, np.full(2, 0.5))
    assert np.abs(tame).max() < 6
