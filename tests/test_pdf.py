"""`make pdf` reads like the site: scripts/pdf.py prints a chapter with its math typeset, its
styles loaded and no toggle text; the check sees raw TeX when the page's styles and MathJax are
out of reach (negative control)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import pdf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "_build" / "html" / "book" / "ch2_one_token.html"
RAW_TEX = re.compile(r"\\\(|\\\[|\\begin\{|\\frac|\$\$")
NOISE = re.compile(r"Show code cell|Hide code cell|Click to show|▶")

pytestmark = [
    pytest.mark.site,
    pytest.mark.skipif(shutil.which("pdftotext") is None, reason="pdftotext is not installed"),
    pytest.mark.skipif(
        shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
        reason="chromium is not installed",
    ),
]


def printed_text(page, output):
    """The text of a page printed by scripts/pdf.py, as pdftotext reads it."""
    pdf.print_pdf(page, output)
    result = subprocess.run(["pdftotext", str(output), "-"], capture_output=True, check=True)
    return result.stdout.decode()


def test_a_printed_chapter_has_typeset_math_and_no_toggle_noise(tmp_path):
    copy = pdf.print_copy(CHAPTER, tmp_path / "print.html")
    text = printed_text(copy, tmp_path / "chapter.pdf")
    assert "Theorem 2.1" in text and "Fig. 2.1" in text
    assert not RAW_TEX.findall(text), RAW_TEX.findall(text)[:5]
    assert not NOISE.findall(text), NOISE.findall(text)[:5]


def test_the_print_check_sees_raw_tex_and_toggles(tmp_path):
    """The same page copied away from its styles and MathJax, without print_copy's <base>."""
    (tmp_path / "alone.html").write_text(CHAPTER.read_text(encoding="utf-8"), encoding="utf-8")
    text = printed_text(tmp_path / "alone.html", tmp_path / "alone.pdf")
    assert RAW_TEX.search(text) and NOISE.search(text)
