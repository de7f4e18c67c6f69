"""The computing solutions of chapter 9's exercises run and their assertions hold (about a
second: none loads the trained pair)."""

import re
from pathlib import Path

import numpy as np
import pytest

import specdec_core as sc

CHAPTER = Path(__file__).resolve().parents[1] / "book" / "ch9_trained_pair.md"


def solution_code(text):
    """The python blocks inside the dropdown solutions after "## Exercises", dedented."""
    exercises = text.split("## Exercises", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", exercises, flags=re.S)
    return [re.sub(r"^ {3}", "", block, flags=re.M) for block in blocks]


def test_chapter_9_has_four_exercises_each_with_a_computing_solution():
    text = CHAPTER.read_text()
    exercises = text.split("## Exercises", 1)[1]
    assert len(re.findall(r"^\d\. ", exercises, flags=re.M)) == 4
    assert len(solution_code(text)) == 4


@pytest.mark.parametrize("index", range(4))
def test_each_computing_solution_runs_and_its_assertions_hold(index):
    block = solution_code(CHAPTER.read_text())[index]
    exec(compile(block, f"ch9 exercise {index + 1}", "exec"), {"sc": sc, "np": np})


def test_a_wrong_solution_fails():
    """The control: a solution whose claim is false (a row r ≠ q gives p) is rejected."""
    wrong = solution_code(CHAPTER.read_text())[0].replace(
        "assert np.allclose(emitted(p, q, q), p)", "assert np.allclose(emitted(p, q, r), p)"
    )
    assert wrong != solution_code(CHAPTER.read_text())[0]
    with pytest.raises(AssertionError):
        exec(compile(wrong, "ch9 control", "exec"), {"sc": sc, "np": np})
