"""Every number a reader meets in a chapter's prose is glued from the code that computes it
(issue 28, item 8). This fails on a percentage or a decimal typed by hand into the prose of
book/*.md, where a glue value could supply it.

What counts as prose: Markdown text, dropdown and admonition bodies, figure captions and
Markdown tables. What does not: the front matter, code cells, literalincludes, fenced code,
directive options (``:alt:`` and the like cannot hold a glue role), display and inline math,
inline code and every role's content (``{glue:text}``, ``{cite:p}``, ``{numref}``, ...), link
targets, and HTML comments.

What is a typed result and what is a fixed input: a decimal or a percentage in prose is a
result unless it is

- a label, not a value: "Theorem 3.5", "Fig. 2.1", "Section 4.2", a version "transformers 4.37";
- or one of the few fixed inputs in ALLOWED below, each with the reason it is not a result (a
  coverage level the book chooses, a split of the data, a value quoted from the literature).

Anything else is reported with its chapter, line and context. The check reads the sources
only (no built site, no kernel), in well under a second.

    python tests/test_prose.py          # prints the findings per chapter
"""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.md"))

# Fixed inputs a chapter may type, as (pattern over the sentence around the number, reason).
# A pattern must match text that contains the number itself; keep each one narrow.
ALLOWED = [
    (
        r"\b95 ?% (?:bootstrap |confidence |central )?(?:band|interval|coverage)"
        r"|\b(?:in|central) 95 ?% of|95 ?% of (?:the time|runs|points|cells|dots)"
        r"|probability 0\.95\b|probability about 5 ?%",
        "95 % is the coverage the book chooses for its bands (and 5 % its complement): a "
        "setting, and ±2σ's coverage of a normal distribution, not a measurement",
    ),
    (
        r"(?<![\w])(?:w|c|t|s|τ|stay)\s?=\s?(?:\d*\.\d+|\d+)(?:\s?,\s?(?:\d*\.\d+|\d+|…))*"
        r"|\b(?:α|c|w) from \d*\.?\d+ to \d*\.?\d+|each w computed \([\d., ]+\)"
        r"|\btemperature \d*\.\d+|\bat (?:the )?level \d*\.\d+|\b(?:TV|power) 0\.\d+",
        "a setting the text chooses (draft weight w, cost ratio c, a threshold t, a scale s or "
        "τ, a regime's stay; a sweep's range; a temperature; a test's level, power or "
        "effect size): the code cell runs the same value, and a reader needs it typed",
    ),
    (
        r"\(ε, δ\) = \(0\.09, 0\.3\)",
        "Medusa's published default thresholds, which chapter 7 scales: a setting",
    ),
    (
        r"A draft with α = 0\.8 costs c = 0\.05|At α = 0\.8 and c = 0\.05",
        "the inputs an exercise's question sets (chapters 5 and 8)",
    ),
    (
        r"for p = 0\.1\b|for an 80 ?% chance|on 30 ?% of requests|first 90 ?% trains",
        "a worked example's or a run's input: a probability p, the power an example is sized "
        "for, the share of requests a test's bug is mixed into, the 90/10 split of chapter 9's "
        "corpus into training and held-out text",
    ),
    (
        r"within (?:1\.5 times|50 ?% of) (?:its|the) two-position time|within 2\.5 × 10",
        "a threshold the text defines (chapter 8's flat region, chapter 9's tolerance)",
    ),
    (
        r"speedups of 5–8 ?%|\"up to ~60 ?%\"|slowed it down by 1\.4× and 1\.8×"
        r"|by up to 1\.5× \(a draft model, ShareGPT\) and 2\.8×|about 1\.3× with a 1B draft",
        "another system's own claim, quoted with its citation (specdec/article.py holds these "
        "only as text, if at all): not a result of this book",
    ),
]

# First columns of Markdown tables that list settings, whose cells are inputs, not results.
SETTING_COLUMNS = {"w", "γ", "c", "T"}

LABEL = re.compile(
    r"\b(?:Theorem|Lemma|Corollary|Definition|Proposition|Equation|Eq|Fig|Figure|Table|"
    r"Section|Algorithm|Chapter|Exercise|Example|Remark|Appendix|Listing|Step|Part)s?\.?"
    r"\s+\d+(?:\.\d+)*(?:\s*(?:,|and|or|to|–|-)\s*\d+(?:\.\d+)+)*"
    r"|§\s?\d+(?:\.\d+)*"
    r"|\b(?:transformers|vLLM|Python|numpy|NumPy|torch|PyTorch|JAX|Jupyter ?Book|myst-nb|"
    r"Sphinx|version|release|v)\s?\d+(?:\.\d+)+"
    r"|\b\d+\.\d+\.\d+(?:\.\d+)*"
)
NUMBER = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s?(?:%|percent\b|per cent\b)"
    r"|(?<![\w.])\d*\.\d+(?!\.?[0-9A-Za-z_])"
)
ROLE = re.compile(r"\{[\w:.-]+\}`[^`]*`")
INLINE_CODE = re.compile(r"``[^`]+``|`[^`]+`")
INLINE_MATH = re.compile(r"\$[^$\n]+\$")
LINK_TARGET = re.compile(r"\]\([^)]*\)|<[a-z]+://[^>]*>")
CODE_DIRECTIVES = {"code-cell", "literalinclude", "code", "code-block", "math", "raw", "eval-rst"}
FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})\s*(\{([\w:-]+)\})?(.*)$")


def prose_lines(text):
    """(line number, text) for every line of prose in a MyST chapter, the rest left out."""
    lines = text.splitlines()
    start = 0
    if lines and lines[0].strip() == "---":
        start = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0) + 1
    stack = []  # open fences: (marker, is_code, at_options)
    in_display_math = in_comment = False
    for number, line in enumerate(lines[start:], start + 1):
        stripped = line.strip()
        if in_comment:
            in_comment = "-->" not in line
            continue
        if stripped.startswith("<!--"):
            in_comment = "-->" not in line
            continue
        fence = FENCE.match(line)
        if fence:
            marker, name = fence.group(2), fence.group(4)
            closing = (
                stack
                and marker[0] == stack[-1][0][0]
                and len(marker) >= len(stack[-1][0])
                and not fence.group(3)
                and not fence.group(5).strip()
            )
            if closing:
                stack.pop()
                continue
            if not (stack and stack[-1][1]):
                # a fence without a directive (```sh, ```python) is code; a directive is code
                # only if it is one of CODE_DIRECTIVES; its title (e.g. a dropdown's) is prose
                is_code = marker[0] == "`" and (name is None or name in CODE_DIRECTIVES)
                stack.append([marker, is_code or name in CODE_DIRECTIVES, True])
                if not stack[-1][1] and fence.group(5).strip():
                    yield number, fence.group(5)
                continue
        if stack and stack[-1][1]:
            continue
        if stack and stack[-1][2]:
            if re.match(r"^\s*:[\w-]+:", line):  # a directive option, not prose
                continue
            stack[-1][2] = False
        if stripped.startswith("$$"):
            if not (stripped.endswith("$$") and len(stripped) > 2 and stripped != "$$"):
                in_display_math = not in_display_math
            continue
        if in_display_math:
            continue
        if re.match(r"^\(\S+\)=\s*$", stripped) or stripped == "+++":  # a label, a cell break
            continue
        yield number, line


def strip_markup(line):
    """The words a reader sees of a prose line: roles, inline code, math and link targets out."""
    for pattern in (ROLE, INLINE_CODE, INLINE_MATH, LINK_TARGET):
        line = pattern.sub(" ", line)
    return line


def paragraphs(text):
    """(first line number, [line offsets], text) for each paragraph of prose: consecutive prose
    lines joined by spaces, so a sentence broken across lines is read whole."""
    block, starts, first, last, header = [], [], None, None, ""
    for number, line in prose_lines(text):
        if not line.strip() or (last is not None and number != last + 1):
            if block:
                yield first, starts, " ".join(block)
            block, starts, first = [], [], None
        if line.strip():
            if first is None:
                first = number
            if line.lstrip().startswith("|"):
                cells = line.split("|")
                if not block or not block[-1].lstrip().startswith("|"):
                    header = cells[1].strip() if len(cells) > 2 else ""
                elif header in SETTING_COLUMNS and len(cells) > 2:
                    line = "|".join([cells[0], " " * len(cells[1]), *cells[2:]])
            starts.append((sum(len(b) + 1 for b in block), number))
            block.append(strip_markup(line))
        last = number
    if block:
        yield first, starts, " ".join(block)


def typed_numbers(text):
    """(line number, number, context) for every typed percentage or decimal in a chapter's prose
    that is neither a label nor an allowed fixed input."""
    found = []
    for _, starts, seen in paragraphs(text):
        masked = LABEL.sub(lambda m: "#" * len(m.group()), seen)
        spans = [m.span() for pattern, _ in ALLOWED for m in re.finditer(pattern, seen)]
        for match in NUMBER.finditer(masked):
            if any(a <= match.start() < b for a, b in spans):
                continue
            line = max(n for offset, n in starts if offset <= match.start())
            context = seen[max(0, match.start() - 60) : match.end() + 60]
            found.append((line, match.group().strip(), " ".join(context.split())))
    return found


def findings():
    """{chapter: [(line, number, context), ...]} over book/*.md, chapters with none left out."""
    out = {}
    for path in CHAPTERS:
        hits = typed_numbers(path.read_text(encoding="utf-8"))
        if hits:
            out[path.name] = hits
    return out


def report(found):
    lines = []
    for name, hits in found.items():
        lines.append(f"{name}: {len(hits)} typed number(s) that a glue value could supply")
        lines += [f"  line {n}: {value!r} in “…{context}…”" for n, value, context in hits]
    return "\n".join(lines)


# ---- tests -------------------------------------------------------------------------------


def test_no_chapter_types_a_result_into_its_prose():
    found = findings()
    if found:
        advice = "glue these (or add a fixed input to ALLOWED, with its reason):\n"
        pytest.fail(advice + report(found))


SYNTHETIC = """---
jupytext:
  text_representation:
    format_name: myst
---

# A chapter

The rule is exact by Theorem 2.1 (Fig. 3.2), checked with transformers 4.37.

```{code-cell} ipython3
x = 0.25  # code is not prose
glue("off", 14.2)
```

The drift is $w = 0.75$ in math and `0.5` in code, {glue:text}`off:.1f` % when glued,
and the band is a 95 % band around {cite:p}`leviathan2023`.

:::{figure} fig.png
:alt: a picture with 0.3 in its alt text
:name: fig-x
A caption that types nothing.
:::
"""


def test_the_prose_check_passes_glued_labelled_and_allowed_numbers():
    assert typed_numbers(SYNTHETIC) == []


def test_the_prose_check_rejects_a_typed_percentage_and_a_typed_decimal():
    """The negative control: the same check on the same page with two typed results."""
    typed = SYNTHETIC.replace(
        "A caption that types nothing.", "A caption where Equation 1 is 10 % off."
    ).replace("and the band is", "at w = 0.9 the acceptance is 0.79, and the band is")
    found = typed_numbers(typed)
    assert [value for _, value, _ in found] == ["0.79", "10 %"], found


def test_the_prose_check_rejects_typed_numbers_in_a_dropdown_and_a_table():
    typed = SYNTHETIC + (
        "\n````{dropdown} How we know\nThe gap was 3.5 percent.\n````\n"
        "\n| draft | α |\n| --- | ---: |\n| bigram | 0.62 |\n"
    )
    found = typed_numbers(typed)
    assert [value for _, value, _ in found] == ["3.5 percent", "0.62"], found


def test_every_allowed_input_is_still_used():
    """An entry of ALLOWED that no chapter needs any more is dropped, so the list stays short."""
    text = "\n".join(
        strip_markup(line)
        for path in CHAPTERS
        for _, line in prose_lines(path.read_text(encoding="utf-8"))
    )
    text = " ".join(text.split())
    unused = [reason for pattern, reason in ALLOWED if not re.search(pattern, text)]
    assert not unused, f"no chapter needs these any more; drop them from ALLOWED: {unused}"


if __name__ == "__main__":
    sys.exit(print(report(findings()) or "no typed numbers in prose"))
