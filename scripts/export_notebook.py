"""Export a chapter (MyST Markdown) as .ipynb with cell ids from the cell's place, not random.

Usage: python scripts/export_notebook.py book/ch1_models.md book/_notebooks/ch1_models.ipynb
jupytext gives each cell a random id, so two builds would offer different downloads.
"""

import sys

import jupytext


def export(source, target):
    """Write source as a notebook at target, cell i with id 'cell-i'."""
    notebook = jupytext.read(source)
    for i, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{i}"
    jupytext.write(notebook, target, fmt="ipynb")


if __name__ == "__main__":
    export(*sys.argv[1:])
