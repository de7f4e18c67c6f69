"""The package's layout (issue 20): one module per idea, short files, imports one way."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONT = (ROOT / "specdec_core.py").read_text()
ORDER = re.findall(r"^    (\w+) +\S.*  +[\d–]+$|^    (\w+) +\S.*  +all$", FRONT, re.M)
MODULES = [a or b for a, b in ORDER]


def imported_modules(path):
    """The package modules a module imports (relative imports)."""
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}


def test_the_front_door_maps_every_module_of_the_package():
    on_disk = {p.stem for p in (ROOT / "specdec").glob("*.py")} - {"__init__"}
    assert set(MODULES) == on_disk
    assert len(FRONT.splitlines()) <= 80


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_only_modules_above_it_in_the_map(module):
    above = set(MODULES[: MODULES.index(module)])
    imports = imported_modules(ROOT / "specdec" / f"{module}.py")
    assert imports <= above, imports - above


@pytest.mark.parametrize("module", MODULES)
def test_a_module_is_short_and_its_docstring_names_its_chapter(module):
    path = ROOT / "specdec" / f"{module}.py"
    assert len(path.read_text().splitlines()) <= 800
    assert re.match(
        r"Chapters? [\d–, ]+|All chapters",
        ast.get_docstring(ast.parse(path.read_text())),
    )


def test_the_layout_test_sees_an_upward_import(tmp_path):
    """The negative control: a module importing one below it in the map is caught."""
    bad = tmp_path / "checks.py"
    bad.write_text("from .verify import verify\n")
    assert not imported_modules(bad) <= set(MODULES[: MODULES.index("checks")])
