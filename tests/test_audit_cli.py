"""Chapter 6, issue 35: the audit run from an engine's own environment.

The README's three commands run as written, with a torch-like stand-in for torch and
transformers (tests/engine_standin) and the plotting stack blocked as in an engine's venv; the
import path of the audit needs numpy and scipy only; the child pins its threads; bad targets
exit 2 before any suite; warnings and in-place writes are handled. Each with a negative control.
"""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import specdec_core as sc
from specdec import adapters

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "engine_standin"
BIN = Path(sys.executable).parent  # the venv's bin, where `pip install -e .` put specdec-audit


def _block(text, heading):
    """The lines of the first ```sh block after a heading."""
    after = text[text.index(heading) :]
    return re.search(r"```sh\n(.*?)```", after, re.S).group(1).strip().splitlines()


def readme_commands():
    return _block((ROOT / "README.md").read_text(), "## Audit an engine from its own environment")


def run(command, **env):
    """A shell command line as a user types it, the stand-in engine on the path."""
    environment = os.environ | {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": f"{STANDIN}{os.pathsep}{ROOT / 'tests'}",
    }
    done = subprocess.run(
        command,
        shell=True,
        cwd=ROOT / "tests",  # not the repository: the audit is found as installed
        env=environment | env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


# ---- the README's three commands ------------------------------------------------------------


def test_the_readme_commands_give_a_verdict_as_written():
    """The README's lines, verbatim. The first two install (torch and transformers; this
    project): CI has the stand-in for the first, and checks the second by its effect (the
    project asks for numpy and scipy only and declares the console command, which `make`
    installed here with the same `pip install` of this repository, --no-deps and -e); a fresh
    venv's install took 7 min 42 s on this machine (index look-ups), beyond the test budget.
    The third runs as written: PASSED on the stand-in's exact rule; the negative control, the
    same line on a stand-in that accepts every draft, FAILED with exit 1."""
    first, second, third = readme_commands()
    assert first == "python -m pip install torch transformers"
    assert second == "python -m pip install /path/to/this/repository"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [re.split("[<>=]", d)[0] for d in project["dependencies"]] == ["numpy", "scipy"]
    assert project["scripts"] == {"specdec-audit": "specdec.cli:console"}
    assert (BIN / "specdec-audit").exists()
    code, out, err = run(third)
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0].startswith("Audit of verifier transformers.generation.utils:_speculative")
    assert "runs on 1 thread" in lines[1] and "torch on 1 intra-op, 1 inter-op" in lines[1]
    assert lines[-1].startswith(f"PASSED: 0 of {sc.small_statistics()} statistics failed, 9 ")
    code, out, _ = run(third, STANDIN_BROKEN="1")
    assert code == 1 and out.splitlines()[-1].startswith("FAILED")


def test_chapter_6_shows_the_readme_commands():
    chapter = (ROOT / "book" / "ch6_audit.md").read_text()
    assert _block(chapter, "(ch6-engine-commands)=") == readme_commands()


def test_the_stand_in_blocks_the_plotting_stack():
    """The environment of the test above has no matplotlib, as an engine's venv; the control
    of the block itself: importing the figure style there fails."""
    code, _, err = run(f"{sys.executable} -c 'import specdec.style'")
    assert code != 0 and "blocked" in err
    code, _, err = run(f"{sys.executable} -c 'import specdec.cli, specdec.audit'")
    assert code == 0, err


# ---- imports: numpy and scipy only ----------------------------------------------------------

BLOCKER = """
import sys
ABSENT = ("matplotlib", "cycler", "pandas", "IPython", "ipywidgets", "threadpoolctl")
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"blocked {name}")
sys.meta_path.insert(0, Absent())
sys.argv = ["specdec_core"] + sys.argv[1:]
"""


@pytest.mark.parametrize(
    "work, ok",
    [
        ("import specdec.audit, specdec.cli, specdec.adapters, specdec.harness", True),
        ("import runpy; runpy.run_module('specdec_core', run_name='__main__')", True),
        ("import specdec.style", False),  # the negative control: the figure style is caught
        ("import specdec_core", False),  # the front door gathers the chapters' names, plots too
    ],
)
def test_the_audit_imports_numpy_and_scipy_only(work, ok, tmp_path):
    (tmp_path / "mine.py").write_text("from specdec.verify import verify\n")
    argv = ["audit", f"{tmp_path}/mine.py:verify", "--timeout", "600"]
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + work, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "blocked" in done.stderr


# ---- threads ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "engine.py"
    path.write_text(
        "import os, signal, warnings\n"
        "import torchlike as torch\n"
        "from specdec.verify import verify\n"
        "def pinned(target_probs, draft_probs, draft_tokens, rng):\n"
        "    seen = (torch.get_num_threads(), torch.get_num_interop_threads(),\n"
        "            os.environ.get('OMP_NUM_THREADS'), os.environ.get('OPENBLAS_NUM_THREADS'))\n"
        "    if seen != (1, 1, '1', '1'):\n"
        "        raise RuntimeError(f'threads {seen}')\n"
        "    return verify(target_probs, draft_probs, draft_tokens, rng)\n"
        "def warns(target_probs, draft_probs, draft_tokens, rng):\n"
        "    warnings.warn('jit is deprecated', DeprecationWarning)\n"
        "    return verify(target_probs, draft_probs, draft_tokens, rng)\n"
        "def segfaults(*args):\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "def four(a, b, c):\n"
        "    pass\n"
    )
    return path


def cli(capsys, *argv):
    """sc.main(['audit', ...]): (exit code, stdout, stderr)."""
    code = sc.main(["audit", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_child_runs_on_one_thread_unless_asked(engine_file, capsys):
    """The stand-in's torch threads and the OpenMP/BLAS variables are 1 in the child; the
    negative control: with --threads 0 they stay as the libraries set them, and the same
    verifier fails saying so."""
    code, out, err = cli(capsys, f"{engine_file}:pinned")
    assert code == 0, (out, err)
    assert "torchlike on 1 intra-op, 1 inter-op" in out.splitlines()[1]
    code, out, _ = cli(capsys, f"{engine_file}:pinned", "--threads", "0")
    assert code == 1 and "raised RuntimeError: threads (4, 4" in out
    assert "left as its libraries set them" in out.splitlines()[1]


# ---- bad targets: one line, exit 2, before any suite -----------------------------------------


@pytest.mark.parametrize(
    "target, extra, says",
    [
        ("no_such_engine.generation:fn", [], "No module named 'no_such_engine'"),
        ("specdec.verify:no_such_function", [], "specdec.verify has no 'no_such_function'"),
        ("specdec.verify:verify", ["--adapter", "hf"], "hf_adapter: verify has a required"),
        ("{f}:four", [], "cannot be called as fn(target_probs, draft_probs, draft_tokens, rng)"),
        ("specdec.verify:verify", ["--drafter", "specdec.verify:verify"], "cannot be called as"),
    ],
)
def test_a_bad_target_exits_2_in_one_line_before_any_suite(
    target, extra, says, engine_file, capsys
):
    code, out, err = cli(capsys, target.format(f=engine_file), *extra)
    assert code == 2 and out == "", (out, err)  # not even the header: no suite ran
    assert err.count("\n") == 1 and says in err, err


def test_a_module_path_and_a_file_in_a_package_both_load(capsys):
    """By module path, and by the path of a file that uses relative imports (specdec/verify.py
    imports .checks); the negative control: a file that is not there."""
    assert cli(capsys, "specdec.verify:verify")[0] == 0
    assert cli(capsys, f"{ROOT}/specdec/verify.py:verify")[0] == 0
    code, _, err = cli(capsys, f"{ROOT}/specdec/nowhere.py:verify")
    assert code == 2 and "no such file" in err


# ---- warnings, in-place writes, a segmentation fault ------------------------------------------


def test_the_verifier_s_warnings_are_counted_apart(engine_file, capsys):
    code, out, _ = cli(capsys, f"{engine_file}:warns")
    assert code == 0 and out.splitlines()[-1].startswith("PASSED")
    assert "issued 9 warnings (1 distinct), not part of the verdict" in out
    assert "jit is deprecated" not in out  # shown with --verbose only
    code, out, _ = cli(capsys, f"{engine_file}:warns", "--verbose")
    assert "DeprecationWarning: jit is deprecated (engine.py:" in out
    code, out, _ = cli(capsys, f"{engine_file}:pinned")  # the control: no warning, no line
    assert "warning" not in out


def test_a_segmentation_fault_says_what_it_likely_is(engine_file, capsys):
    code, out, _ = cli(capsys, f"{engine_file}:segfaults", "--timeout", 120)
    assert code == 1 and "killed by SIGSEGV (a segmentation fault" in out
    assert "read-only input row" in out


torch = None  # the stand-in, set by the test: the v0-shaped function finds `torch` here


def writes_in_place(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids):
    """vLLM V0's shape, normalising its target rows in place (as a torch kernel may); raises
    where a real torch tensor over read-only memory would crash the process."""
    if not target_with_bonus_probs.array.flags.writeable:
        raise RuntimeError("wrote into read-only memory")
    target_with_bonus_probs.div_(target_with_bonus_probs.sum(dim=2, keepdim=True))
    return sc.vllm_v0_rejection_sampler(
        target_with_bonus_probs.numpy(),
        bonus_token_ids.numpy(),
        draft_probs.numpy(),
        draft_token_ids.numpy(),
        rng=np.random.default_rng(int(torch.default_generator.rng.integers(2**32))),
    )


def test_a_torch_verifier_gets_writable_rows_of_its_own(monkeypatch):
    """Float32 rows of 1 MiB and more arrive in shared, read-only memory; the adapter hands the
    stand-in torch private copies. The negative control: handing it the shared rows as they are
    (the old adapter) fails."""
    import torchlike

    monkeypatch.setitem(globals(), "torch", torchlike)
    rng = np.random.default_rng(35)
    target = rng.dirichlet(np.ones(32_768), size=(1, 3)).astype(np.float32)
    draft = rng.dirichlet(np.ones(32_768), size=(1, 2)).astype(np.float32)
    wide = sc.Scenario("float32 rows, V = 32,768, γ = 2", target, draft, steps=600)
    fn = adapters.vllm_v0_adapter(writes_in_place)
    assert sc.audit_verifier(fn, scenarios=[wide]).passed
    monkeypatch.setattr(adapters.Backend, "floats", lambda self, a: self.torch.from_numpy(a))
    report = sc.audit_verifier(adapters.vllm_v0_adapter(writes_in_place), scenarios=[wide])
    assert not report.passed and "read-only" in str(report)


# ---- reports an engine developer can read ------------------------------------------------------


def raises_at_gamma_5(target_probs, draft_probs, draft_tokens, rng):
    """verify, but an error on the small suite's γ = 5 scenario."""
    if draft_tokens.shape[1] == 5:
        raise RuntimeError("no kernel for γ = 5")
    return sc.verify(target_probs, draft_probs, draft_tokens, rng)


def test_a_report_says_why_it_has_fewer_rows_than_statistics_planned():
    report = str(sc.audit_verifier(raises_at_gamma_5))
    planned = sc.small_statistics()
    assert f"not the {planned} statistics planned: 1 scenario stopped" in report
    assert report.splitlines()[-1].startswith("FAILED: 1 of ")
    assert "not the" not in str(sc.audit_verifier(sc.verify))  # the control: every statistic


def test_a_failed_statistic_says_what_it_measured_not_a_bug_s_name():
    """A bug that was not planted (the correction drawn from p) fails the small suite's fixed
    directions; their findings say what was measured. The control: the table still keeps each
    direction's source for the book (DIRECTION_SOURCES), and the joint law's finding is plain."""
    report = sc.audit_verifier(sc.rule_verifier(sc.ROW_BUGS["correction from p"]), seed=2)
    text = str(report)
    assert not report.passed and "direction of" not in text
    assert not any(bug in text for bug in audit_sources())
    moved = report.table[report.table["component"].str.startswith(sc.DIRECTION)]
    assert (~moved["passed"]).any()
    assert moved[~moved["passed"]]["finding"].str.startswith("the completed law moved").all()


def audit_sources():
    from specdec.audit import DIRECTION_SOURCES

    return list(DIRECTION_SOURCES)
