"""The computing solutions of the exercises in chapters 1–3 run and their assertions hold."""

import re
from pathlib import Path

import numpy as np
import pytest

import specdec_core as sc

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTERS = ["ch1_models.md", "ch2_one_token.md", "ch3_drafted_runs.md"]


def solution_code(text):
    """The python blocks inside the dropdown solutions of a chapter, dedented."""
    exercises = text.split("## Exercises", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", exercises, flags=re.S)
    return [re.sub(r"^ {3}", "", block, flags=re.M) for block in blocks]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_computing_solution_runs(chapter):
    blocks = solution_code((BOOK / chapter).read_text())
    assert blocks, f"{chapter} has no computing solution"
    for block in blocks:
        exec(compile(block, chapter, "exec"), {"sc": sc, "np": np})


def test_a_wrong_solution_fails():
    with pytest.raises(AssertionError):
        exec(solution_code("## Exercises\n   ```python\n   assert 1 == 2\n   ```\n")[0], {})
