"""Every chapter executed top to bottom in the build, and a failing cell fails the build.

The build (`make`, which `make test` runs first) executes each chapter; these tests read what it
executed rather than running every chapter a second time (the archive test in test_notebooks.py
runs them once more, outside the repository)."""

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
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn
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


EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"
CACHE = ROOT / "_build" / ".jupyter_cache"


def build_run(source, built):
    """The run behind a built notebook: itself, or, when the build merged outputs from the
    execution cache (a text-only edit: no execution counts), the cached run of source's code."""
    if any(c.execution_count for c in built.cells if c.cell_type == "code"):
        return built
    cache = get_cache(CACHE)
    return cache.get_cache_bundle(cache.match_cache_notebook(source).pk).nb  # KeyError: no run


def execution_problems(source, executed):
    """Why the executed notebook is not a full, error-free run of the source's code cells."""
    code = [c.source for c in source.cells if c.cell_type == "code"]
    ran = [c for c in executed.cells if c.cell_type == "code"]
    problems = [] if [c.source for c in ran] == code else ["its code differs from the source"]
    problems += [f"cell {i} never ran" for i, c in enumerate(ran) if not c.execution_count]
    problems += [
        f"cell {i} raised {o.get('ename')}"
        for i, c in enumerate(ran)
        for o in c.outputs
        if o.output_type == "error"
    ]
    return problems


@pytest.mark.site
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executed_in_the_build_without_error(chapter):
    executed = EXECUTED / f"{chapter.stem}.ipynb"
    assert executed.exists(), "run `make` first: the build executes every chapter"
    source = jupytext.read(chapter)
    problems = execution_problems(source, build_run(source, nbformat.read(executed, as_version=4)))
    assert not problems, problems


def test_the_execution_check_can_fail():
    source = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    failed = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0", execution_count=1)])
    failed.cells[0].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError")]
    unrun = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    stale = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 1", execution_count=1)])
    assert execution_problems(source, failed) == ["cell 0 raised ZeroDivisionError"]
    assert execution_problems(source, unrun) == ["cell 0 never ran"]
    assert execution_problems(source, stale) == ["its code differs from the source"]


def test_a_build_from_the_cache_is_judged_by_the_cached_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CACHE", tmp_path)
    source = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    merged = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])  # no count
    with pytest.raises(KeyError):
        build_run(source, merged)  # nothing cached: no run to vouch for it
    run = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0", execution_count=1)])
    run.cells[0].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError")]
    get_cache(tmp_path).cache_notebook_bundle(CacheBundleIn(run, uri="run.ipynb"))
    assert execution_problems(source, build_run(source, merged)) == [
        "cell 0 raised ZeroDivisionError"
    ]


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
