"""The set-up and the build (issue 14): interpreter check, stale venv, stale cache and images,
declared dependencies, reproducible notebooks, a quiet kernel, and REQUIRE_BROWSER=0."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jupytext
import nbformat
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
VERSION = "{}.{}".format(*sys.version_info[:2])


def fake_python(folder, version):
    """An executable that answers every question with a version string, like `python -c ...`."""
    path = folder / f"python{version}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def project_copy(tmp_path):
    """The Makefile and the files its rules read, in tmp_path, with .venv and the build stamped."""
    for name in ("Makefile", "requirements.txt", "pyproject.toml", "specdec_core.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "specdec", tmp_path / "specdec", ignore=shutil.ignore_patterns("__py*"))
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "ipython_kernel_config.py", tmp_path / "scripts")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    for stamp in (".venv/bin/.installed", "_build/.core-stamp", "_build/html/_images/old.png"):
        (tmp_path / stamp).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stamp).touch()
    return tmp_path


def make(folder, *args):
    """Run make in folder; return the completed process (stdout and stderr as text)."""
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---- the interpreter and .venv ---------------------------------------------------------------


def test_make_refuses_an_unsupported_python_before_creating_the_venv(tmp_path):
    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "ipython_kernel_config.py", tmp_path / "scripts")
    result = make(tmp_path, f"PYTHON={fake_python(tmp_path, '3.10')}", ".venv/bin/.installed")
    assert result.returncode != 0
    assert "Python 3.10" in result.stderr and "3.11" in result.stderr
    assert not (tmp_path / ".venv").exists()


def test_make_recreates_a_venv_of_another_python(tmp_path):
    project = project_copy(tmp_path)
    (project / ".venv" / "bin" / "python").unlink()
    fake_python(project / ".venv" / "bin", "3.10").rename(project / ".venv" / "bin" / "python")
    dry = make(project, "-n", f"PYTHON={sys.executable}", ".venv/bin/.installed").stdout
    assert "rm -rf .venv" in dry and "-m venv .venv" in dry
    # the control: a venv of the same Python is kept
    (project / ".venv" / "bin" / "python").unlink()
    (project / ".venv" / "bin" / "python").symlink_to(sys.executable)
    kept = make(project, "-n", f"PYTHON={sys.executable}", ".venv/bin/.installed").stdout
    assert "rm -rf .venv" not in kept and "up to date" in kept


def test_the_supported_versions_agree_in_makefile_pyproject_and_readme():
    supported = re.search(r"^SUPPORTED := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    versions = supported.group(1).split()
    assert VERSION in versions
    minimum = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert minimum == f">={versions[0]}"
    assert f"Python {versions[0]} to {versions[-1]}" in (ROOT / "README.md").read_text()


# ---- the README, for a newcomer ------------------------------------------------------------------

README_WORDS = 1_500  # issue 28: at most this many words (whitespace-separated, as `wc -w`)
README_FIRST_LINES = 30  # about one screen: the two commands must be within it


def readme_problems(text):
    """Why a README is not a newcomer's: too long, or `make` and `make test` past its first
    screen (each as a command line of a code block, not a mention in prose)."""
    problems = []
    if len(text.split()) > README_WORDS:
        problems.append(f"{len(text.split())} words, more than {README_WORDS}")
    top = text.splitlines()[:README_FIRST_LINES]
    for command in ("make", "make test"):
        if not any(re.fullmatch(rf"{command}(\s+#.*)?", line.strip()) for line in top):
            problems.append(f"`{command}` is not a command line in the first {README_FIRST_LINES}")
    return problems


def test_the_readme_is_short_and_shows_the_two_commands_first():
    readme = (ROOT / "README.md").read_text()
    assert not readme_problems(readme), readme_problems(readme)
    assert "(CONTRIBUTING.md)" in readme and (ROOT / "CONTRIBUTING.md").exists()


def test_the_readme_check_can_fail():
    commands = "```sh\nmake        # build\nmake test   # test\n```\n"
    assert readme_problems("# Book\n\n" + commands) == []
    too_long = "# Book\n\n" + commands + "word " * README_WORDS
    assert readme_problems(too_long) == [f"{README_WORDS + 11} words, more than {README_WORDS}"]
    late = "# Book\n" + "\n" * README_FIRST_LINES + commands
    assert len(readme_problems(late)) == 2
    assert len(readme_problems("# Book\n\nRun make, then make test.\n")) == 2  # prose is not enough


def test_the_readme_figure_is_the_figures_scripts_output():
    """README.md shows book/intro-loop.png: the bytes `make figures` writes as intro-loop.png."""
    import io

    import specdec_core as sc

    assert "](book/intro-loop.png)" in (ROOT / "README.md").read_text()
    made = io.BytesIO()
    sc.FIGURES["intro-loop"]().savefig(made, format="png", metadata=None)  # as scripts/figures.py
    assert made.getvalue() == (ROOT / "book" / "intro-loop.png").read_bytes(), (
        "run `make figures` and copy figures/intro-loop.png to book/intro-loop.png"
    )


# ---- stale outputs: the execution cache and the site's images -----------------------------------


@pytest.mark.parametrize(
    "changed",
    ["requirements.txt", "specdec_core.py", "specdec/verify.py", "specdec/transformer.py"],
)
def test_a_changed_core_or_package_set_drops_the_cache_and_the_old_images(tmp_path, changed):
    project = project_copy(tmp_path)
    (project / "_build" / ".jupyter_cache").mkdir()
    python = f"PYTHON={sys.executable}"
    assert "rm -rf" not in make(project, "-n", python, "_build/.core-stamp").stdout  # up to date
    dry = make(project, "-n", python, "-W", changed, "_build/.core-stamp").stdout
    assert re.search(r"rm -rf .*_build/\.jupyter_cache.*_build/html", dry), dry
    # run the stamp's own recipe (the venv is faked, so not the reinstall it would come after)
    recipe = [line for line in dry.splitlines() if "_build/.jupyter_cache" in line]
    subprocess.run(recipe[0], shell=True, cwd=project, check=True)
    assert not (project / "_build" / "html" / "_images" / "old.png").exists()
    assert not (project / "_build" / ".jupyter_cache").exists()


# ---- pip install -e . --------------------------------------------------------------------------


def test_pyproject_declares_the_runtime_dependencies_and_the_pins_satisfy_them():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    book = project["optional-dependencies"]["book"]  # the audit alone needs numpy and scipy
    declared = [Requirement(r) for r in project["dependencies"] + book]
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    names = {r.name.lower() for r in declared}
    assert {"numpy", "scipy", "matplotlib", "pandas", "myst-nb", "ipywidgets"} <= names
    for requirement in declared:
        assert requirement.specifier, f"{requirement.name} needs a range"
        assert pins[requirement.name.lower()] in requirement.specifier, requirement


def test_every_module_the_core_and_chapters_import_is_declared_or_standard():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    own = setup["py-modules"] + setup["packages"]
    files = [ROOT / f"{m}.py" for m in setup["py-modules"]]
    files += [f for package in setup["packages"] for f in (ROOT / package).glob("*.py")]
    code = [f.read_text() for f in files] + [
        cell.source
        for chapter in (ROOT / "book").glob("ch*.md")
        for cell in jupytext.read(chapter).cells
        if cell.cell_type == "code"
    ]
    imported = {
        m.group(1).split(".")[0]
        for source in code
        for m in re.finditer(r"^\s*(?:import|from) (\w[\w.]*)", source, re.M)
    }
    provided = {"numpy", "scipy", "matplotlib", "matplotlib_inline", "pandas", "myst_nb"}
    provided |= {"ipywidgets", "IPython", "threadpoolctl"}  # IPython comes with any kernel
    provided |= {"onnx", "onnxruntime"}  # chapter 9's runtime
    engines = {  # imported only inside make engines' own venvs (requirements-engines/)
        re.split(r"[<>=~ ;\[]", line.strip())[0]
        for path in (ROOT / "requirements-engines").glob("*.txt")
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    provided |= engines | {"vllm"}  # vLLM's sampler: files of its released wheel, unmodified
    third_party = imported - set(sys.stdlib_module_names) - set(own)
    assert third_party <= provided, third_party - provided


# ---- reproducible downloads ---------------------------------------------------------------------


def test_exported_notebooks_are_identical_between_exports(tmp_path):
    chapter = ROOT / "book" / "ch1_models.md"
    outputs = [tmp_path / "a.ipynb", tmp_path / "b.ipynb"]
    for output in outputs:
        subprocess.run(
            [sys.executable, ROOT / "scripts" / "export_notebook.py", chapter, output], check=True
        )
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
    notebook = nbformat.read(outputs[0], as_version=4)
    assert [c.id for c in notebook.cells] == [f"cell-{i}" for i in range(len(notebook.cells))]
    assert len(notebook.cells) == len(jupytext.read(chapter).cells)


def test_the_makefile_exports_notebooks_with_the_script():
    rule = re.search(
        r"^book/_notebooks/%\.ipynb:.*\n(?:\t.*\n)+", (ROOT / "Makefile").read_text(), re.M
    )
    assert "scripts/export_notebook.py" in rule.group(0) and "jupytext" not in rule.group(0)


# ---- a quiet kernel ----------------------------------------------------------------------------


def test_a_kernel_starts_without_the_unencrypted_tcp_warning(tmp_path):
    """The build's kernels print no 'without encryption' warning (the venv's kernel config)."""
    cell = "import logging; logging.getLogger('IPKernelApp').warning('other warnings still show')"
    script = (
        "import nbformat\nfrom nbclient import NotebookClient\n"
        f"nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell({cell!r})])\n"
        "nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'P'}\n"
        "NotebookClient(nb, kernel_name='python3').execute()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "without encryption" not in result.stderr
    assert "other warnings still show" in result.stderr  # the filter drops one message only


def test_the_kernel_config_is_installed_in_the_venv():
    installed = Path(sys.prefix) / "etc" / "ipython" / "ipython_kernel_config.py"
    assert installed.read_text() == (ROOT / "scripts" / "ipython_kernel_config.py").read_text()


# ---- REQUIRE_BROWSER ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, outcome", [("0", "1 skipped"), ("", "1 skipped"), ("1", "1 error")]
)
def test_require_browser_zero_means_not_required(tmp_path, value, outcome):
    """With no chromium on PATH, REQUIRE_BROWSER=0 (or empty) skips; only 1 makes it a failure."""
    env = {**os.environ, "PATH": str(tmp_path), "REQUIRE_BROWSER": value}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "test_site.py") + "::test_the_browser_check_can_fail",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert outcome in result.stdout, result.stdout[-2000:]


def test_the_site_serves_its_stylesheet_and_script_without_comments():
    """scripts/book_site.py drops comments, indentation and blank lines and nothing else: the
    rules and statements are the source's, token for token (the control: the source itself has
    the comments this check looks for)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import book_site

    for name in book_site.BOOK_STATIC:
        source = (ROOT / "_static" / name).read_text()
        served = book_site.without_comments(source)
        assert "/*" in source and "/*" not in served and len(served) < 0.75 * len(source)
        tokens = re.sub(r"/\*.*?\*/", " ", source, flags=re.S).split()
        assert served.split() == tokens
