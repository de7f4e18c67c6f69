"""The book's tables and numbers for people (style.table, number, times_ten): captioned, no pandas
index, numbers as a reader reads them, and the same HTML on every build."""

import numpy as np
import pandas as pd
import pytest

import specdec_core as sc


@pytest.mark.parametrize(
    "x, text",
    [
        (1234567, "1,234,567"),
        (np.int64(5000), "5,000"),
        (246.175133, "246"),
        (0.123456, "0.123"),
        (-0.00012345, "−0.000123"),
        (1e-7, "0.000000100"),
        (float("nan"), "—"),
        (float("inf"), "infinite"),
        ("draft", "draft"),
    ],
)
def test_numbers_read_as_a_reader_reads_them(x, text):
    assert sc.number(x) == text
    assert "e" not in sc.number(x).replace("infinite", "") or x == "draft"


def test_a_table_has_its_caption_and_no_index_rows():
    frame = pd.DataFrame({"w": [0.1, 0.5], "α": [0.41234, 0.8]}).set_index("w")
    html = sc.table(frame, "Acceptance against w.", formats={"w": "{:.1f}"}).to_html()
    assert "<caption>Acceptance against w.</caption>" in html
    assert "index_name" not in html and "row_heading" not in html  # no index cells at all
    assert ">0.412<" in html and ">0.1<" in html
    assert html == sc.table(frame, "Acceptance against w.", formats={"w": "{:.1f}"}).to_html()
    # the control: pandas' own HTML of the same frame has the index-name row this test rejects
    assert "<th>w</th>" in frame.to_html() and "index_name" in frame.style.to_html()


def test_a_table_refuses_what_it_cannot_show():
    frame = pd.DataFrame({"a": [1]})
    with pytest.raises(ValueError, match="caption"):
        sc.table(frame, " ")
    with pytest.raises(ValueError, match="formats"):
        sc.table(frame, "A.", formats={"b": "{:.1f}"})
    with pytest.raises(TypeError, match="frame"):
        sc.table([1, 2], "A.")


def test_small_values_read_without_e_notation():
    assert sc.times_ten(6.9e-18, sep="") == "6.9×10⁻¹⁸"
    assert sc.times_ten(-1.234e-5) == "−1.2 × 10⁻⁵"
    assert sc.times_ten(3.4e-9, 1) == "3 × 10⁻⁹"
    assert sc.times_ten(0.0) == "0"
    assert sc.power_of_ten(-15) == "10⁻¹⁵"
    # the control: Python's own formatting of the same value is the e-notation this replaces
    assert "e" in f"{6.9e-18:.1e}" and "e" not in sc.times_ten(6.9e-18)


def test_a_table_puts_the_cited_columns_beside_its_labels():
    frame = pd.DataFrame({"draft": ["a", "b"], "α": [0.5, 0.6], "tokens": [2.0, 3.0], "z": [1, 2]})
    html = sc.table(frame, "Drafts.", lead=["z"]).to_html()
    heads = [h.split(">")[-1] for h in html.split("</th>") if 'class="col_heading' in h]
    assert heads == ["draft", "z", "α", "tokens"], heads
    # the control: without lead the columns keep the frame's order
    plain = sc.table(frame, "Drafts.").to_html()
    assert [h.split(">")[-1] for h in plain.split("</th>") if "col_heading" in h] == list(frame)
    for bad in (["nope"], "z"):
        with pytest.raises(ValueError, match="lead"):
            sc.table(frame, "Drafts.", lead=bad)
