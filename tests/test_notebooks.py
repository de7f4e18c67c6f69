"""The chapters as stand-alone notebooks (scripts/notebooks.py writes them when `make` builds the
site): offered on every chapter page, free of the site's roles and directives, and runnable from
the archive in a fresh venv outside the repository."""

import ast
import os
import re
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
ARCHIVE = SITE / "exact-by-construction-notebooks.zip"
CHAPTERS = sorted(p for p in (ROOT / "book").glob("*.md") if "kernelspec:" in p.read_text())
# What a plain Jupyter would show raw: a MyST role, a directive fence, a target, or the import of
# myst_nb, which the reader does not have.
RAW = re.compile(r"\{[a-z][\w:-]*\}`|^\s*(```+|:::+)\s*\{|^\s*\([\w.:-]+\)=\s*$|myst_nb", re.M)
# An instruction to unpack an archive: wrong in a notebook the reader has just unpacked.
UNPACK = re.compile(r"\bunpack\b|\bunzip\b|\bextract\b", re.I)

pytestmark = pytest.mark.site


def notebook_of(chapter):
    return nbformat.read(SITE / "_sources" / "book" / f"{chapter.stem}.ipynb", as_version=4)


def raw_syntax(notebook):
    """Every piece of site-only syntax left in what the reader sees."""
    return [m.group(0) for cell in notebook.cells for m in RAW.finditer(cell.source)]


def test_the_raw_syntax_check_can_fail():
    bad = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("x = {glue:text}`x:.3f`\n```{literalinclude} a.py\n```"),
            nbformat.v4.new_code_cell("from myst_nb import glue"),
        ]
    )
    assert len(raw_syntax(bad)) == 3


def test_the_first_cell_says_what_to_do_from_inside_the_archive():
    sys.path.insert(0, str(ROOT / "scripts"))
    from notebooks import FOLDER, INSTALL, opening

    text = opening("Two models you can print", "book.zip")
    assert INSTALL in text and "jupyter lab" in text and f"`{FOLDER}/`" in text
    assert "Two models you can print" in text and not UNPACK.search(text)
    # the control: the old first cell, which told the reader to unpack what they had unpacked
    assert UNPACK.search("To run this notebook, unpack `book.zip` and, in its folder: ...")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_chapter_notebook_reads_without_the_site(chapter):
    notebook = notebook_of(chapter)
    nbformat.validate(notebook)
    assert not raw_syntax(notebook), raw_syntax(notebook)
    assert "pip install -r requirements.txt" in notebook.cells[0].source
    assert not UNPACK.search(notebook.cells[0].source), notebook.cells[0].source
    text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert "Download this chapter" not in text, "a download line without its link"
    if "{doc}`notation`" in chapter.read_text():
        assert "](notation.md)" in text, "the notation page is named but not linked"
    source = chapter.read_text()
    figures = source.count("{glue:figure}")
    markdown = [c for c in notebook.cells if c.cell_type == "markdown"]
    images = sum(len(c.get("attachments", {})) for c in markdown)
    captions = sum(len(re.findall(r"\*\*Fig\. [\d.]+\.\*\* \S", c.source)) for c in markdown)
    assert images == captions == figures, "every figure shown with its number and caption"
    shown = sum(len(c.source.splitlines()) for c in notebook.cells if c.cell_type == "code")
    assert shown >= source.count("```{code-cell}"), "the code is in the notebook"
    assert [c.id for c in notebook.cells] == [c.id for c in notebook_of(chapter).cells]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_the_download_menu_offers_the_notebook(chapter):
    html = (SITE / "book" / f"{chapter.stem}.html").read_text()
    assert f'href="../_sources/book/{chapter.stem}.ipynb"' in html
    downloads = list(SITE.glob(f"_downloads/*/{chapter.stem}.ipynb"))
    # a page that links its notebook in its text ("Download this chapter") has a copy there; the
    # front page, a notebook without that line, offers it through the menu only
    assert downloads or "{download}`" not in chapter.read_text()
    assert all(
        d.read_bytes() == (SITE / "_sources" / "book" / f"{chapter.stem}.ipynb").read_bytes()
        for d in downloads
    )


# A code cell with a line of code (not an option line, not a comment) that calls widget_panel.
WIDGET = re.compile(r"^```\{code-cell\}[^\n]*\n(?:(?!^```)[\s\S])*?^[^:#\n]*widget_panel\(", re.M)


def test_no_chapter_shows_a_widget_when_executed():
    """A widget displayed by an executed cell can stall a headless run (nbclient issue 312): the
    sliders of chapter 5 appear only on an explicit call, named in the text."""
    shown = [c.stem for c in CHAPTERS if WIDGET.search(c.read_text())]
    assert not shown, shown
    assert not WIDGET.search("Type `sc.widget_panel()` in a new cell.\n")
    assert WIDGET.search("```{code-cell} ipython3\n:tags: [x]\ndisplay(sc.widget_panel())\n```\n")
    assert not WIDGET.search("```{code-cell} ipython3\n:  caption: sc.widget_panel() gives\n```\n")


def test_the_archive_holds_notebooks_core_and_requirements():
    names = {Path(n).name for n in zipfile.ZipFile(ARCHIVE).namelist()}
    assert {f"{c.stem}.ipynb" for c in CHAPTERS} | {
        "specdec_core.py",
        "requirements.txt",
        "README.md",
        "notation.md",
    } <= names
    assert 'href="exact-by-construction-notebooks.zip"' in (SITE / "index.html").read_text() or (
        "exact-by-construction-notebooks.zip" in (SITE / "book" / "intro.html").read_text()
    )


RUN = """
import os
import sys
from pathlib import Path
import nbformat
from nbclient import NotebookClient
try:
    import myst_nb  # noqa: F401
    sys.exit("myst_nb is installed: the stand-in for glue is not tested")
except ImportError:
    pass
import specdec_core
assert Path(specdec_core.__file__).parent == Path.cwd(), specdec_core.__file__
from traitlets.config import Config
notebook = nbformat.read(sys.argv[1], as_version=4)
# Every notebook's kernel starts at once, each from its own process. Over TCP each manager
# picks free ports and frees them for its kernel to bind, so two of them can pick the same port
# and a kernel dies at start-up (jupyter_client issue 487). Unix sockets named for the notebook
# cannot clash (left to itself, every manager would name them kernel-ipc-1 to -5 in the same
# folder). On two cores a kernel may take over nbclient's default 60 s to answer.
config = Config()
config.KernelManager.transport = "ipc"
config.KernelManager.ip = str(Path(os.environ["JUPYTER_RUNTIME_DIR"]) / Path(sys.argv[1]).stem)
client = NotebookClient(
    notebook, timeout=300, startup_timeout=300, kernel_name="python3", config=config
)
client.execute()
errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
assert not errors, errors
print("ran", sys.argv[1])
"""


def cause(stderr):
    """What a failed run printed that says why: nbclient's and the kernel's error lines (a kernel
    that died at start-up is logged once, then hidden by a second error in nbclient's clean-up),
    and the last 2,000 characters."""
    errors = [
        line for line in stderr.splitlines() if re.search(r"error|died|traceback", line, re.I)
    ]
    return "\n".join(errors[:20]) + "\n ... \n" + stderr[-2000:]


def test_the_cause_of_a_failed_run_is_kept():
    warning = "[IPKernelApp] WARNING | Kernel is running over TCP without encryption.\n"
    logged = "[NbClientApp] ERROR | Error occurred while starting new kernel client: died\n"
    stderr = warning + "x" * 3000 + "\n" + logged + "x" * 5000 + "\nAssertionError: \n"
    assert "starting new kernel client" in cause(stderr) and "AssertionError" in cause(stderr)
    assert "without encryption" not in cause(stderr)  # the control: noise is dropped


# Chapters whose code reads files (stored records, weights, the other notebooks): in the archive
# they read its copies, not the repository's, so they run there whole. Every other chapter runs
# whole in the build from the same code; in the archive, its imports are checked.
READS_FILES = re.compile(r"load_pair\(|_record\(|_RECORD|json\.loads|np\.load\(|open\(")
RUN_WHOLE = {"intro", "ch6_audit", "ch9_trained_pair"}


def test_every_chapter_that_reads_a_file_runs_whole_from_the_archive():
    readers = {c.stem for c in CHAPTERS if READS_FILES.search(c.read_text())}
    assert readers == RUN_WHOLE, readers
    assert READS_FILES.search("power = json.loads(path.read_text())")  # the control


def imports_of(notebook):
    """The top-level modules a notebook's code cells import."""
    names = set()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_the_archive_runs_in_a_fresh_venv_outside_the_repository(tmp_path):
    """Unpack the archive in a temporary folder, create an empty venv there, install the
    archive's requirements (and nbclient to drive the kernel) from the package index through
    pip's cache; execute the notebooks in RUN_WHOLE, all at once, and import what every other
    notebook imports: no myst_nb, no repository on the path. (pip here is the repository venv's,
    pointed at the new venv with --python: same packages, minutes less than bootstrapping pip
    inside the venv.)"""
    zipfile.ZipFile(ARCHIVE).extractall(tmp_path)
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert ROOT not in folder.parents
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    nbclient = next(
        line
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.startswith("nbclient==")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-compile", "--disable-pip-version-check", "-r", "requirements.txt", nbclient],
        cwd=folder, check=True, timeout=420,
    )  # fmt: skip
    everything = sorted(folder.glob("*.ipynb"))
    assert [n.name for n in everything] == sorted(f"{c.stem}.ipynb" for c in CHAPTERS)
    notebooks = [n for n in everything if n.stem in RUN_WHOLE]
    others = set().union(*(imports_of(nbformat.read(n, 4)) for n in everything))
    checked = subprocess.run(
        [str(python), "-c", "import " + ", ".join(sorted(others))],
        cwd=folder, env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]
    # A Unix socket's path holds at most 107 bytes, and tmp_path's runtime folder is longer.
    with tempfile.TemporaryDirectory(prefix="kernels-", dir="/tmp") as runtime:
        env = {
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "MPLBACKEND": "Agg",
            "JUPYTER_RUNTIME_DIR": runtime,
            "OPENBLAS_NUM_THREADS": "1",
        }  # the kernels share 2 cores: one BLAS thread each, none spinning idle
        runs = [
            subprocess.Popen(
                [str(python), "-c", RUN, n.name],
                cwd=folder,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            for n in notebooks
        ]
        failed = {}
        try:
            for notebook, run in zip(notebooks, runs):
                out, err = run.communicate(timeout=420)
                if run.returncode != 0:
                    failed[notebook.name] = cause(err)
        finally:  # after a timeout, end the runs left (their kernels exit with them)
            for run in runs:
                if run.poll() is None:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
    assert not failed, failed
