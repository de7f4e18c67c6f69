"""Every chapter executes top to bottom, and a failing cell fails both this test and the build."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "book").glob("*.md") if "kernelspec:" in p.read_text())


def execute(notebook, folder):
    """Run every cell of notebook in folder; raises CellExecutionError on the first error."""
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()


def test_every_page_in_the_toc_exists_and_its_code_is_run_here():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    sources = [ROOT / f"{page}.md" for page in pages]
    assert all(source.exists() for source in sources)
    assert {s for s in sources if "kernelspec:" in s.read_text()} == set(CHAPTERS) != set()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes(chapter):
    execute(jupytext.read(chapter), chapter.parent)


def test_a_failing_cell_fails_execution(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    with pytest.raises(CellExecutionError):
        execute(notebook, tmp_path)


def test_a_failing_cell_fails_the_build(tmp_path):
    """A copy of the book's configuration with one broken page must not build."""
    needed = ("_config.yml", "pyproject.toml", "book/references.bib", "scripts/book_site.py")
    for name in (*needed, "scripts/notebooks.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/broken\n")
    header = (ROOT / "book" / "ch1_models.md").read_text().split("---\n")[1]
    (tmp_path / "book" / "broken.md").write_text(
        f"---\n{header}---\n\n# Broken\n\n```{{code-cell}} ipython3\n"
        "raise RuntimeError('the-broken-cell')\n```\n"
    )
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    scratch = tmp_path / "tmp"  # Sphinx's sphinx-err-*.log, if it writes one, lands here
    scratch.mkdir()
    system_tmp = Path(tempfile.gettempdir())
    logs_before = set(system_tmp.glob("sphinx-err-*.log"))
    result = subprocess.run(
        [str(jupyter_book), "build", str(tmp_path), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "the-broken-cell" in output, "the build must fail on the cell, not on its set-up"
    assert "Extension error" not in output
    assert set(system_tmp.glob("sphinx-err-*.log")) <= logs_before, "a log escaped to /tmp"
