"""Chapter 6, issue 35: drafter mode with drafts whose number depends on the drafted tokens.

What must hold whatever the stopping rule: each draft is a draw from the q row the drafter
returned (its randomized PIT is uniform, position by position), and the emitted tokens at each
position follow p there. A correct drafter with transformers 4.45's confidence stop passes;
4.44.2's forced-greedy assistant (issue 32867) fails. `make bench`-sized runs of the same
simulation are in the report of issue 35; here a few seeds each.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specdec_core as sc
from specdec import audit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def confident():
    return sc.confidence_scenario()


def test_a_confidence_stop_passes_and_the_greedy_assistant_fails(confident):
    """Six seeded audits each, in-process. Under the null each fails w.p. ≤ AUDIT_LEVEL (1e-3,
    Bonferroni over the 14 statistics), so 0 of 6 is expected (P(≥ 1) ≤ 0.6 %); the greedy
    assistant's drafts sit in one cell of each row's PIT, a chi-square far beyond the critical
    value at 2,000 steps, so 6 of 6. The negative control of the statistics: the greedy bug."""
    correct = sc.drafter_mode_rates(sc.confidence_drafter(0.08), confident, runs=6, seed=1)
    greedy = sc.drafter_mode_rates(sc.greedy_assistant_drafter, confident, runs=6, seed=1)
    assert correct == (0, 6) and greedy == (6, 6)


def test_the_confidence_stop_draws_every_length_and_the_report_says_so(confident):
    report = sc.audit_verifier(
        sc.verify, scenarios=[confident], drafter=sc.confidence_drafter(0.08)
    )
    assert report.passed, report
    line = next(n for n in report.notes if "steps by number of drafts" in n)
    counts = [
        int(part.split(" → ")[1].replace(",", "")) for part in line.split(": ")[-1].split("; ")
    ]
    assert len(counts) == 3 and min(counts) > 500 and sum(counts) == 2 * confident.steps
    assert len(report.table) == len(sc.drafter_components(confident)) == 2 * 7
    # the statistic that catches the greedy assistant says what it measured
    greedy = sc.audit_verifier(
        sc.verify, scenarios=[confident], drafter=sc.greedy_assistant_drafter
    )
    assert "drafts are not draws from the q the drafter returned" in str(greedy)


def test_a_length_never_drafted_is_reported_not_silent(confident):
    """A threshold of 1 stops after every first draft: lengths 2 and 3 never occur, the later
    positions are 'not exercised', and the report says so; the control: 0.08 reaches them."""
    report = sc.audit_verifier(sc.verify, scenarios=[confident], drafter=sc.confidence_drafter(1.0))
    assert report.passed
    assert "never 2, 3 drafts" in str(report)
    findings = report.table.set_index("component")["finding"]
    assert findings["draft at 1 against the drafter's q"].eq(audit.NOT_REACHED).all()
    assert findings["emitted token at 1 against p"].ne(audit.NOT_REACHED).all()  # the bonus
    assert findings["emitted token at 2 against p"].eq(audit.NOT_REACHED).all()


def test_the_emitted_tokens_catch_a_verifier_bug_the_drafts_cannot(confident):
    """A verifier whose bonus after fewer than 3 drafts comes from the first target row: the
    drafts pass their test, the emitted tokens fail; the control: the same verifier when every
    step drafts 3 tokens (the bug never runs) passes."""

    def wrong_bonus_when_short(target_probs, draft_probs, draft_tokens, rng):
        if draft_tokens.shape[1] < 3:
            target_probs = np.array(target_probs)
            target_probs[:, -1] = target_probs[:, 0]
        return sc.verify(target_probs, draft_probs, draft_tokens, rng)

    drafter = sc.confidence_drafter(0.08)
    report = sc.audit_verifier(wrong_bonus_when_short, scenarios=[confident], drafter=drafter)
    failed = report.table[~report.table["passed"]]["component"]
    assert len(failed) and failed.str.startswith("emitted token").all()
    assert sc.audit_verifier(
        wrong_bonus_when_short, scenarios=[confident], drafter=sc.sample_drafter
    ).passed


def _with_q(change):
    """sample_drafter returning its rows changed by change(q) as q."""

    def drafter(draft_probs, rng):
        q = np.array(draft_probs, dtype=float)
        change(q)
        return sc.sample_drafter(draft_probs, rng), q

    return drafter


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda q: q.__setitem__((3, 1, 0), np.nan), "holds NaN or infinity"),
        (lambda q: q.__setitem__((3, 1, slice(0, 2)), [-0.1, q[3, 1, 1] + 0.1]), "negative"),
        (lambda q: q.__imul__(0.9), "sums to 1 only within 0.1"),
    ],
)
def test_a_bad_q_is_named_by_its_row(change, says, confident):
    """The finding names the step, request and position of the first bad row; the control:
    the unchanged rows as q pass."""
    report = sc.audit_verifier(sc.verify, scenarios=[confident], drafter=_with_q(change))
    (finding,) = report.table["finding"]
    assert finding.startswith("drafter's q row at step ") and says in finding, finding
    where = "step 1 of request 1, position 1" if "sums" not in says else "step 0 of request 0"
    assert where in finding
    assert sc.audit_verifier(
        sc.verify, scenarios=[confident], drafter=_with_q(lambda q: None)
    ).passed


def test_the_command_line_takes_a_drafter(tmp_path):
    """--drafter MODULE:FN runs drafter mode on the engine suite's first scenarios (here a file
    that narrows the suite, so the test stays short); the control: the greedy assistant fails."""
    (tmp_path / "mine.py").write_text(
        "import specdec_core as sc\n"
        "from specdec import audit\n"
        "audit.engine_scenarios = lambda: [sc.confidence_scenario()]\n"
        "confident = sc.confidence_drafter(0.08)\n"
        "greedy = sc.greedy_assistant_drafter\n"
    )
    code = (
        "import sys; sys.path.insert(0, {path!r}); import mine, specdec_core as sc; "
        "sys.exit(sc.main(['audit', 'specdec.verify:verify', '--drafter', 'mine:{name}']))"
    )
    outs = {}
    for name in ("confident", "greedy"):
        done = subprocess.run(
            [sys.executable, "-c", code.format(path=str(tmp_path), name=name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        outs[name] = (done.returncode, done.stdout, done.stderr)
    code, out, err = outs["confident"]
    assert code == 0, (out, err)
    assert out.startswith("Audit of drafter mine:confident with verifier specdec.verify:verify")
    assert "suite engine" in out and "steps by number of drafts: 1 → " in out
    assert outs["greedy"][0] == 1 and "not draws from the q" in outs["greedy"][1]
