"""Chapter 6, issue 26: the audit cannot report a pass it did not earn.

The fuzz cases that once gave a silent exit 0 or a hang (sys.exit, os._exit, SIGKILL, a hang,
MemoryError, garbage, each in a call and at import), each failing with a message that says what
happened; the negative control in each case is the same harness passing an exact verifier.
"""

import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import specdec_core as sc
from specdec import harness
from specdec.projections import run_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(26)
    target = rng.dirichlet(np.ones(8), size=(2, 3))
    return sc.Scenario("tiny: V = 8, γ = 2", target, rng.dirichlet(np.ones(8), size=(2, 2)), 2000)


def exits(*args):
    sys.exit(0)


def exits_hard(*args):
    os._exit(0)


def kills_itself(*args):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(*args):
    time.sleep(3600)


def allocates(*args):
    return np.ones(2 * harness._physical_memory() // 8), None  # beyond the child's cap


def generator(*args):
    return (token for token in range(3))


FUZZ = {  # a verifier, and what the finding must say
    "sys.exit(0)": (exits, "the verifier called sys.exit(0)"),
    "os._exit(0)": (exits_hard, "the verifier's process exited with code 0 before answering"),
    "SIGKILL": (kills_itself, "the verifier's process was killed by SIGKILL"),
    "MemoryError": (allocates, "raised MemoryError"),
    "a generator": (generator, "the verifier returned a generator, which cannot be sent back"),
    "None": (lambda *args: None, "did not return a pair"),
}


@pytest.mark.parametrize("case", FUZZ)
def test_a_verifier_that_dies_or_answers_garbage_fails_saying_so(case, tiny):
    fn, finding = FUZZ[case]
    report = sc.audit_verifier(fn, scenarios=[tiny])
    assert not report.passed
    assert report.table["finding"].str.startswith(finding).all(), report.table["finding"]
    assert sc.audit_verifier(sc.verify, scenarios=[tiny]).passed  # the negative control


def reserves_then_verifies(*args):
    """verify, after reserving twice the machine's memory read-only (as CUDA reserves address
    space, or weights are mapped from a file) without using it."""
    size = 2 * harness._physical_memory()
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    with mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ):
        return sc.verify(*args)


def test_reserved_address_space_is_not_counted_as_memory(tiny):
    """An exact verifier that only reserves address space passes (under an address-space cap,
    RLIMIT_AS, its mmap failed); the control is FUZZ's MemoryError case, memory it writes."""
    report = sc.audit_verifier(reserves_then_verifies, scenarios=[tiny])
    assert report.passed, report.table["finding"].tolist()


def test_a_hang_is_stopped_at_the_time_limit(tiny):
    start = time.perf_counter()
    report = sc.audit_verifier(hangs, scenarios=[tiny, tiny], timeout=0.5)
    assert time.perf_counter() - start < 30  # the hang was cut at 0.5 s, not waited out
    findings = report.table["finding"].tolist()
    assert findings[0] == "timed out: the verifier took the audit's whole time limit (0.5 s)"
    assert findings[1].startswith("not run: the time limit of 0.5 s was spent")
    assert sc.audit_verifier(sc.verify, scenarios=[tiny], timeout=30).passed


def test_after_a_death_the_next_scenario_gets_a_fresh_process(tiny, tmp_path):
    flag = tmp_path / "died"

    def dies_once(*args):
        if not flag.exists():
            flag.touch()
            os._exit(3)
        return sc.verify(*args)

    table = sc.audit_verifier(dies_once, scenarios=[tiny, tiny]).table
    assert table["finding"].iloc[0] == "the verifier's process exited with code 3 before answering"
    assert table["passed"].iloc[1:].all() and len(table) > 2


def test_timeout_must_be_a_positive_number(tiny):
    for bad in (0, -1, "10", True, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            sc.audit_verifier(sc.verify, scenarios=[tiny], timeout=bad)


def test_the_child_runs_exactly_what_the_parent_would(tiny):
    """Same rows, same generator: the child's outputs and the parent's stream equal a run in
    this process (the generator's state comes back); the negative control, another seed."""

    def run(fn, seed):
        rng = np.random.default_rng(seed)
        accepted, tokens = run_scenario(fn, tiny, rng)
        return accepted, tokens, rng.random()

    with harness.Sandbox(lambda: {"verifier": sc.verify}) as sandbox:
        remote = run(sandbox.function("verifier"), 5)
        assert sandbox.calls > 0 and sandbox.inside > 0
    here = run(sc.verify, 5)
    assert all(np.array_equal(a, b) for a, b in zip(remote, here))
    assert not np.array_equal(run(sc.verify, 6)[1], here[1])


def test_large_read_only_rows_are_shared_once_and_arrive_read_only():
    rows = np.random.default_rng(0).random((64, 4096))  # 2 MiB: through shared memory
    rows.setflags(write=False)
    writable = rows.copy()

    def probe(a):
        return a.flags.writeable, float(a.sum())

    with harness.Sandbox(lambda: {"probe": probe}) as sandbox:
        for start in (0, 8):
            assert sandbox.call("probe", rows[start:]) == (False, float(rows[start:].sum()))
        assert len(sandbox.shared) == 1  # one copy for both slices
        assert sandbox.call("probe", writable) == (True, float(rows.sum()))
        assert len(sandbox.shared) == 1  # a writable array is copied per call, not kept


def _state(pid):
    """ps's state letter of a process ('S', 'R', ... 'Z' for a zombie), or '' if it is gone."""
    done = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return done.stdout.strip()[:1]


def test_the_child_does_not_outlive_a_killed_parent(tmp_path):
    """A parent killed between calls (SIGKILL: no cleanup runs) leaves no child behind: the
    child sees the pipe close and exits. Its control is the test below, on a live child. The
    parent's output goes to DEVNULL: a surviving child, which holds it, would block a pipe."""
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from specdec import harness\n"
        "box = harness.Sandbox(lambda: {'f': lambda: 1})\n"
        "box.call('f')\n"
        "Path(sys.argv[1]).write_text(str(box.process.pid))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    where = tmp_path / "pid"
    done = subprocess.run(
        [sys.executable, "-c", script, str(where)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL
    pid = int(where.read_text())
    deadline = time.perf_counter() + 20
    while _state(pid) not in ("", "Z") and time.perf_counter() < deadline:
        time.sleep(0.1)
    left = _state(pid)
    if left not in ("", "Z"):
        os.kill(pid, signal.SIGKILL)  # do not leave it behind either way
    assert left in ("", "Z"), f"the child {pid} outlived its parent (state {left})"


def test_a_child_reports_alive_while_its_parent_runs():
    """The negative control of the test above: the same check sees a live, idle child."""
    with harness.Sandbox(lambda: {"f": lambda: 1}) as box:
        box.call("f")
        assert _state(box.process.pid) not in ("", "Z")


# ---- the command line ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Files that misbehave in a call or at import."""
    folder = tmp_path_factory.mktemp("hostile")
    calls = {
        "exits": "sys.exit(0)",
        "exits_hard": "os._exit(0)",
        "kills_itself": "os.kill(os.getpid(), signal.SIGKILL)",
        "hangs": "time.sleep(3600)",
    }
    lines = ["import os, signal, sys, time", "import specdec_core as sc", "good = sc.verify"]
    lines += [f"def {name}(*args):\n    {body}" for name, body in calls.items()]
    (folder / "calls.py").write_text("\n".join(lines) + "\n")
    at_import = {
        "raises": "raise RuntimeError('no GPU')",
        "exits": "import sys; sys.exit(0)",
        "exits_hard": "import os; os._exit(0)",
        "hangs": "import time; time.sleep(3600)",
    }
    for name, body in at_import.items():
        (folder / f"import_{name}.py").write_text(f"{body}\ndef good(*args):\n    pass\n")
    return folder


def cli(*argv):
    """python -m specdec_core audit ...: (exit code, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "specdec_core", "audit", *map(str, argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


def main(capsys, *argv):
    """sc.main(['audit', ...]) in this process, which the user's file never enters:
    (exit code, stdout, stderr)."""
    code = sc.main(["audit", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", ["exits", "exits_hard", "kills_itself"])
def test_a_verifier_that_exits_or_is_killed_fails_the_command_line(name, hostile, capsys):
    code, out, err = main(capsys, f"{hostile}/calls.py:{name}", "--timeout", 60)
    assert code == 1, (out, err)
    assert out.splitlines()[-1].startswith("FAILED: 9 of 9 statistics failed")


def test_a_hang_fails_the_command_line_at_its_timeout(hostile, capsys):
    start = time.perf_counter()
    code, out, _ = main(capsys, f"{hostile}/calls.py:hangs", "--timeout", 1)
    assert code == 1 and time.perf_counter() - start < 60
    assert "timed out" in out and out.splitlines()[-1].startswith("FAILED")


def test_python_dash_m_exits_1_on_sys_exit_and_0_with_a_verdict_line(hostile):
    """Through the interpreter's own exit code; the negative control, the exact verifier."""
    code, out, err = cli(f"{hostile}/calls.py:exits", "--timeout", 60)
    assert code == 1 and out.splitlines()[-1].startswith("FAILED"), (out, err)
    code, out, _ = cli(f"{hostile}/calls.py:good", "--timeout", 600)
    verdict = f"PASSED: 0 of {sc.small_statistics()} statistics failed"
    assert code == 0 and out.splitlines()[-1].startswith(verdict)


@pytest.mark.parametrize(
    "name, says",
    [
        ("raises", "raised RuntimeError: no GPU"),
        ("exits", "called sys.exit(0)"),
        ("exits_hard", "exited with code 0 while loading"),
        ("hangs", "timed out"),
    ],
)
def test_a_file_that_fails_at_import_exits_2_saying_so(name, says, hostile, capsys):
    code, out, err = main(capsys, f"{hostile}/import_{name}.py:good", "--timeout", 2)
    assert code == 2 and out == "", (out, err)
    assert says in err and err.startswith("error: cannot load")


def test_the_file_imports_its_neighbours(tmp_path, capsys):
    """As under `python file.py`, the file's folder comes first on sys.path (in the child only);
    the negative control: the same file without its neighbour cannot be loaded."""
    (tmp_path / "engine_helpers.py").write_text("import specdec_core as sc\nverify = sc.verify\n")
    (tmp_path / "engine.py").write_text("from engine_helpers import verify\n")
    target = f"{tmp_path}/engine.py:verify"
    assert sc.main(["audit", target]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("PASSED")
    assert str(tmp_path) not in sys.path  # the parent's path is left alone
    (tmp_path / "engine_helpers.py").unlink()
    assert sc.main(["audit", target]) == 2
    assert "No module named 'engine_helpers'" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["0", "-3", "soon", "inf"])
def test_the_command_line_checks_its_timeout(timeout, hostile, capsys):
    assert sc.main(["audit", f"{hostile}/calls.py:good", "--timeout", timeout]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_the_command_line_takes_an_adapter(tmp_path, capsys):
    path = tmp_path / "engine.py"
    path.write_text(
        "import specdec_core as sc\n"
        "hf = sc.hf_speculative_sampling\n"
        "v0 = sc.vllm_v0_rejection_sampler\n"
        "v1 = sc.vllm_rejection_sample\n"
    )
    for adapter, name in (("hf", "hf"), ("vllm-v0", "v0"), ("vllm-v1", "v1")):
        assert sc.main(["audit", f"{path}:{name}", "--adapter", adapter]) == 0, adapter
    assert capsys.readouterr().out.splitlines()[-1].startswith("PASSED")
    # the negative control: the HF-shaped function without its adapter is refused before any
    # suite runs, with one line that names the missing parameter and points to --adapter
    capsys.readouterr()
    assert sc.main(["audit", f"{path}:hf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'is_done_candidate'" in err and "--adapter" in err
    assert sc.main(["audit", f"{path}:hf", "--adapter", "vllm-v2"]) == 2


def test_the_audit_does_not_import_the_plotting_stack(hostile):
    """Neither `import specdec.audit` nor a run of the command line loads matplotlib; the
    negative control: the figure style does, and the same check sees it."""
    probe = (
        "import sys\n"
        "import specdec_core as sc\n"
        "{work}\n"
        "print(any(m.split('.')[0] == 'matplotlib' for m in sys.modules))\n"
    )
    work = {
        "audit": f"sc.main(['audit', '{hostile}/calls.py:good'])",
        "figure": "sc.new_figure()",
    }
    seen = {}
    for key, line in work.items():
        done = subprocess.run(
            [sys.executable, "-c", probe.format(work=line)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        seen[key] = done.stdout.splitlines()[-1]
    assert seen == {"audit": "False", "figure": "True"}


# ---- drafter mode with drafts of variable length -------------------------------------------


def short_drafter(draft_probs, rng):
    """sample_drafter's drafts, cut to a length drawn uniformly from 1..γ per row (−1 after)."""
    drafts = sc.sample_drafter(draft_probs, rng)
    lengths = rng.integers(1, drafts.shape[1] + 1, size=len(drafts))
    return np.where(np.arange(drafts.shape[1]) < lengths[:, None], drafts, -1)


def wrong_bonus_when_short(target_probs, draft_probs, draft_tokens, rng):
    """verify, but a step of fewer than 3 drafts takes its bonus from the first target row."""
    if draft_tokens.shape[1] < 3:
        target_probs = np.array(target_probs)
        target_probs[:, -1] = target_probs[:, 0]
    return sc.verify(target_probs, draft_probs, draft_tokens, rng)


@pytest.fixture(scope="module")
def three():
    rng = np.random.default_rng(3)
    target = rng.dirichlet(np.ones(6), size=(1, 4))
    return sc.Scenario("γ = 3, V = 6", target, rng.dirichlet(np.ones(6), size=(1, 3)), 6000)


def test_a_drafter_may_draft_fewer_tokens(three):
    """Lengths drawn at random: every length is exercised and the pair passes; the negative
    controls: a verifier wrong only on short steps fails, and a bad padding is named."""
    report = sc.audit_verifier(sc.verify, scenarios=[three], drafter=short_drafter)
    assert report.passed, report
    assert len(report.table) == 2 * 3 + 1 and set(report.table["scenario"]) == {three.name}
    assert "steps by number of drafts: 1 → " in str(report) and "never" not in str(report)
    assert not sc.audit_verifier(
        wrong_bonus_when_short, scenarios=[three], drafter=short_drafter
    ).passed
    assert sc.audit_verifier(
        wrong_bonus_when_short, scenarios=[three], drafter=sc.sample_drafter
    ).passed

    def holes(draft_probs, rng):
        drafts = sc.sample_drafter(draft_probs, rng)
        drafts[:, 0] = -1
        return drafts

    finding = sc.audit_verifier(sc.verify, scenarios=[three], drafter=holes).table["finding"]
    assert finding.tolist() == [
        "drafter returned −1 before a draft, or no draft, at step 0 of request 0"
    ]
