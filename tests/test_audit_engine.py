"""Chapter 6, issue 22: the engine suite, its exact projections, adapters, drafter mode, the CLI."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import specdec_core as sc
from specdec import projections as pj

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wide():
    """A quick engine-shaped scenario: V = 2,048 with mass past id 1,024, γ = 7, two requests."""
    rng = np.random.default_rng(11)
    target = pj._zipf(rng, (2, 8, 2048), 0.9)
    return sc.Scenario(
        "test: V = 2,048, γ = 7", target, pj._drafter_of(rng, target[:, :7], 0.5), steps=3000
    )


# ---- the exact projections ---------------------------------------------------------------------


def test_projections_recombine_into_the_target_law(wide):
    law = sc.projections(wide)
    p = pj._law(wide.target)
    beta = law["beta"][..., None]
    # a position's token is a kept draft w.p. β, else the residual's: together exactly p
    assert np.abs(beta * law["kept"] + (1 - beta) * law["residual"] - p[:, :-1]).max() < 1e-12
    assert np.abs(law["length"].sum(axis=1) - 1).max() < 1e-12
    # negative control: the residual alone is not p
    assert np.abs(law["residual"] - p[:, :-1]).max() > 1e-3


@pytest.mark.parametrize("n", [30, 3_000, 300_000])
def test_cells_partition_the_support_and_each_expects_enough(n):
    law = pj._zipf(np.random.default_rng(1), (5000,))
    law[:7] = 0  # tokens of probability 0 get no cell
    law /= law.sum()
    cells = pj.Cells(law, n)
    assert (cells.cell[:7] == -1).all() and (cells.cell[7:] >= 0).all()
    assert abs(cells.law.sum() - 1) < 1e-12
    assert cells.size <= pj.MAX_SINGLE + pj.MAX_RANGES
    if cells.size > 1:
        assert (n * cells.law).min() >= pj.MIN_EXPECTED


def test_a_statistic_has_its_level_and_its_stated_power():
    """Exact multinomial draws through the audit's exact statistic: rejections at level 0.05
    within a 4 SE band (2,000 trials, SE 0.0049); an alternative at the stated TV is caught
    w.p. ≥ 0.99 (band 4 SE of 0.0022); the negative control, a quarter of that TV, is caught far
    less often."""
    rng = np.random.default_rng(5)
    law = pj._zipf(rng, (3000,))
    n, level = 4000, 0.05
    cells = pj.Cells(law, n)
    tv = pj.sized_tv(cells, n, level)
    draws = rng.multinomial(n, cells.law, size=2000)
    critical = stats.chi2.isf(level, cells.size - 1)

    def rejected(counts, reference):
        u = rng.random((len(counts), cells.size - 1))
        return (pj.exact_chi_square(counts, reference, u) > critical).mean()

    assert abs(rejected(draws, cells.law) - level) < 4 * 0.0049
    direction = rng.dirichlet(np.ones(cells.size)) - cells.law
    for t, lowest, highest in ((tv, 0.99 - 4 * 0.0022, 1), (tv / 4, 0, 0.5)):
        other = cells.law + direction * t / (np.abs(direction).sum() / 2)
        assert lowest <= rejected(rng.multinomial(n, other, size=2000), cells.law) <= highest


# ---- verifiers: correct ones pass, engine bugs fail where the small suite is blind -----------


def vllm_style(target_probs, draft_probs, draft_tokens, rng):
    """A correct verifier through the vLLM-shaped adapter."""
    return sc.vllm_adapter(sc.vllm_rejection_sample)(target_probs, draft_probs, draft_tokens, rng)


def as_lists(target_probs, draft_probs, draft_tokens, rng):
    """verify, its output handed back as Python lists of floats (any array-like is read)."""
    accepted, tokens = sc.verify(target_probs, draft_probs, draft_tokens, rng)
    return accepted.tolist(), tokens.astype(float).tolist()


@pytest.mark.parametrize(
    "verify_fn",
    [sc.verify, sc.loop_verify, vllm_style, sc.hf_adapter(sc.hf_speculative_sampling), as_lists],
)
def test_correct_verifiers_pass_the_wide_scenario(verify_fn, wide):
    for seed in (0, 1):
        report = sc.audit_verifier(verify_fn, scenarios=[wide], seed=seed)
        assert report.passed, str(report)


@pytest.mark.parametrize("key", list(sc.ENGINE_BUGS))
def test_engine_bugs_fail_the_wide_scenario_and_say_where(key, wide):
    report = sc.audit_verifier(sc.ENGINE_BUGS[key], scenarios=[wide], seed=0)
    assert not report.passed
    assert "FAILED" in str(report) and "differs most" in str(report)


@pytest.mark.parametrize(
    "key", ["residual ignores ids ≥ 1,024", "rows past position 5 from a buffer of 6"]
)
def test_the_small_suite_misses_what_the_engine_scale_sees(key):
    assert sc.audit_verifier(sc.ENGINE_BUGS[key]).passed


def test_a_residual_bug_is_named_with_its_id_range(wide):
    table = sc.audit_verifier(
        sc.ENGINE_BUGS["residual ignores ids ≥ 1,024"], scenarios=[wide]
    ).table
    failed = table[~table["passed"]]
    assert failed["component"].str.startswith("residual").all()
    assert (failed["exact"] < failed["observed"]).any()  # ids below 1,024 made too often


def hf_unclamped(
    candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate, rng
):
    """The HF-shaped function with PR 28508's bug: softmax of the clamped residual."""
    from specdec.adapters import _softmax
    from specdec.planted import _draw

    drafts = candidate_input_ids[0, -candidate_length:]
    q, p = _softmax(candidate_logits[0]), _softmax(new_logits[0])
    at = np.arange(candidate_length)
    n = int(np.cumprod(rng.random(candidate_length) <= p[at, drafts] / q[at, drafts]).sum())
    weights = p[n] if n == candidate_length else np.exp(np.maximum(p[n] - q[n], 0))
    return np.concatenate([drafts[:n], _draw(weights[None], rng.random(1))])[None], n


def test_an_adapter_passes_a_bug_through(wide):
    assert not sc.audit_verifier(sc.hf_adapter(hf_unclamped), scenarios=[wide]).passed


# ---- end to end: the user's drafter ---------------------------------------------------------


drafter = sc.sample_drafter


def test_drafter_mode_sees_noise_shared_with_the_verifier(wide):
    small = sc.Scenario(wide.name, wide.target[:, :4], wide.draft[:, :3], steps=2000)
    assert sc.audit_verifier(sc.verify, scenarios=[small], drafter=drafter).passed
    assert not sc.audit_verifier(sc.verify, scenarios=[small], drafter=sc.reusing_drafter).passed
    assert sc.audit_verifier(sc.verify, scenarios=[small]).passed  # the audit's own drafts


# ---- the full engine suite, once ------------------------------------------------------------


def test_verify_passes_the_engine_suite_at_a_tenth_of_its_steps():
    """Every scenario and statistic of the engine suite, at a tenth of the steps (make bench
    runs the full suite); the negative control: a residual bug fails the same reduced suite."""
    tenth = [replace(s, steps=s.steps // 10) for s in sc.engine_scenarios()]
    report = sc.audit_verifier(sc.verify, scenarios=tenth, seed=7)
    assert report.passed, str(report)
    statistics = sum(len(pj.components(s)) for s in sc.engine_scenarios())
    assert len(report.table) == statistics
    assert report.table["sized for TV"].dropna().between(0, 1).all()
    bug = sc.ENGINE_BUGS["residual ignores ids ≥ 1,024"]
    assert not sc.audit_verifier(bug, scenarios=tenth[:2], seed=7).passed


# ---- bad input, fast and named ----------------------------------------------------------------


def test_bad_arguments_are_refused_by_name(wide):
    with pytest.raises(ValueError, match="suite"):
        sc.audit_verifier(sc.verify, suite="huge")
    with pytest.raises(TypeError, match="scenarios"):
        sc.audit_verifier(sc.verify, scenarios=[1])
    with pytest.raises(ValueError, match="drafter"):
        sc.audit_verifier(sc.verify, drafter=drafter)
    with pytest.raises(TypeError, match="drafter"):
        sc.audit_verifier(sc.verify, scenarios=[wide], drafter=3)
    with pytest.raises(ValueError, match="target"):
        sc.Scenario("bad", np.ones((1, 2, 3)), np.ones((1, 1, 3)) / 3)
    with pytest.raises(ValueError, match="differ"):
        sc.Scenario("bad", np.ones((1, 2, 3)) / 3, np.ones((1, 2, 3)) / 3)
    with pytest.raises(ValueError, match="steps"):
        sc.Scenario("bad", np.ones((1, 2, 3)) / 3, np.ones((1, 1, 3)) / 3, steps=0)


def test_a_verifier_writing_into_its_inputs_gets_copies(wide):
    def normalises_in_place(target_probs, draft_probs, draft_tokens, rng):
        target_probs /= target_probs.sum(axis=2, keepdims=True)
        return sc.verify(target_probs, draft_probs, draft_tokens, rng)

    def corrupts(target_probs, draft_probs, draft_tokens, rng):
        target_probs[:, :, : target_probs.shape[2] // 2] = 0  # the negative control
        target_probs /= target_probs.sum(axis=2, keepdims=True)
        return sc.verify(target_probs, draft_probs, draft_tokens, rng)

    assert sc.audit_verifier(normalises_in_place, scenarios=[wide]).passed
    assert not sc.audit_verifier(corrupts, scenarios=[wide]).passed


# ---- the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def verifiers_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "mine.py"
    path.write_text(
        "import specdec_core as sc\n"
        "good = sc.verify\n"
        "bad = sc.rule_verifier(sc.ROW_BUGS['correction from p'])\n"
        "not_a_function = 3\n"
    )
    return path


@pytest.mark.parametrize(
    "argv, code",
    [
        (["audit", "{f}:good"], 0),
        (["audit", "{f}:bad", "--seed", "2"], 1),
        (["audit", "{f}:missing"], 2),
        (["audit", "{f}:not_a_function"], 2),
        (["audit", "nowhere.py:good"], 2),
        (["audit", "{f}"], 2),
        (["audit", "{f}:good", "--suite", "huge"], 2),
        (["audit", "{f}:good", "--seed", "-1"], 2),
        ([], 2),
    ],
)
def test_the_command_line_exits_0_1_or_2(argv, code, verifiers_file, capsys):
    assert sc.main([a.format(f=verifiers_file) for a in argv]) == code
    out = capsys.readouterr()
    if code < 2:
        assert ("PASSED" if code == 0 else "FAILED") in out.out
    else:
        assert "error" in out.err


def test_python_dash_m_runs_the_audit(verifiers_file):
    done = subprocess.run(
        [sys.executable, "-m", "specdec_core", "audit", f"{verifiers_file}:bad"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "FAILED" in done.stdout


# ---- verify's long-row blocks read rows in place: seeded outputs unchanged -------------------


@pytest.mark.parametrize(
    "shape, digest",
    [
        ((40, 8, 30_000), "23b1175267758190"),
        ((7, 5, 131_072), "86715bf568d2a39e"),
        ((300, 2, 5_000), "946908e06b63f08b"),
    ],
)
def test_verify_outputs_are_those_of_the_version_before_the_in_place_rows(shape, digest):
    """Digests of verify's outputs at commit dbf932d (before blocks of one request read their
    final rows in place); the negative control: another seed gives another digest."""
    import hashlib

    batch, gamma, vocab = shape
    rng = np.random.default_rng(batch * gamma)
    target = rng.dirichlet(np.full(vocab, 0.05), size=(batch, gamma + 1))
    draft = rng.dirichlet(np.full(vocab, 0.05), size=(batch, gamma))
    drafts = rng.integers(0, vocab, size=(batch, gamma))

    def hexdigest(seed):
        accepted, tokens = sc.verify(target, draft, drafts, np.random.default_rng(seed))
        return hashlib.sha256(accepted.tobytes() + tokens.tobytes()).hexdigest()[:16]

    assert hexdigest(5) == digest
    assert hexdigest(6) != digest
