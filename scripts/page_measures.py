"""What a reader first meets on each built page, measured in headless Chromium with folded
content left folded: visible words (prose, tables, outputs and unfolded code; the code's share
is shown apart), words before the first figure, sentences over 40 words (paragraph by paragraph,
a formula as one word), code blocks that scroll sideways or wrap at 1400 px (shown, and with
every dropdown opened: "unfolded"), pandas tables with an index-name row or a bare 0...N index,
and tables without a caption. The browser tests (tests/test_site.py) hold the pages to issue
28's goals with the same MEASURE; this prints them.

    python scripts/page_measures.py [SITE_DIR] [PAGE_STEM ...]
"""

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDE = 1400

# In the page: the main text as rendered (closed <details> and hidden cells are not rendered, so
# innerText leaves them out), the prose paragraphs (for sentences: no code, tables or outputs),
# the text before the first figure (an image, inline SVG or canvas that is drawn), the code
# blocks that scroll sideways and those that wrap, the tables pandas marks with an index, the
# tables without a caption, and how far down the page the first figure's middle is drawn.
# "Shown" is checkVisibility(): a closed <details> keeps its content laid out, so
# getClientRects() counted folded code and figures as shown.
MEASURE = """() => {
    const main = document.querySelector('main article') || document.querySelector('main');
    const shown = e => e.checkVisibility
        ? e.checkVisibility({visibilityProperty: true}) : e.getClientRects().length > 0;
    const pres = [...main.querySelectorAll('pre')].filter(shown);
    const head = p => p.textContent.trim().slice(0, 50);
    const wideCode = pres.filter(p => p.scrollWidth > p.clientWidth + 1).map(head);
    const wrappedCode = pres.filter(p => {
        const c = getComputedStyle(p);
        if (c.whiteSpace === 'pre') return false;
        const line = parseFloat(c.lineHeight) || 1.2 * parseFloat(c.fontSize);
        const height = p.clientHeight - parseFloat(c.paddingTop) - parseFloat(c.paddingBottom);
        return height > (p.textContent.replace(/\\n$/, '').split('\\n').length + 0.5) * line;
    }).map(head);
    const code = pres.map(p => p.innerText).join(' ');
    const text = main.innerText;
    const prose = [...main.querySelectorAll('p')]
        .filter(p => shown(p) && !p.closest('pre, table, .cell_output, nav, footer'))
        .map(p => {  // a formula reads as one word, not one per symbol of its MathML
            const copy = p.cloneNode(true);
            copy.querySelectorAll('mjx-container').forEach(m => m.replaceWith('x'));
            return copy.textContent;
        });
    const figure = [...main.querySelectorAll('img, svg, canvas')].find(e => {
        const r = e.getBoundingClientRect();
        return shown(e) && r.width > 100 && r.height > 60 && !e.closest('pre');
    });
    let before = text;
    if (figure) {
        const range = document.createRange();
        range.setStart(main, 0);
        range.setEndBefore(figure);
        const box = document.createElement('div');
        box.style.cssText = 'position:absolute;left:-99999px;width:770px';
        box.appendChild(range.cloneContents());
        document.body.appendChild(box);
        before = box.innerText;
        box.remove();
    }
    const tables = [...main.querySelectorAll('table')].filter(shown);
    const indexed = tables.filter(t => t.matches('.dataframe')).filter(t => {
        const heads = t.querySelectorAll('thead tr');
        const nameRow = heads.length > 1 && [...heads].some(r =>
            [...r.children].slice(1).every(c => c.textContent.trim() === ''));
        const keys = [...t.querySelectorAll('tbody tr > th:first-child')]
            .map(th => th.textContent.trim());
        const bare = keys.length > 0 && keys.every((k, i) => k === String(i));
        const styled = t.querySelector('th.index_name, th.row_heading, th.blank') !== null;
        return nameRow || bare || styled;
    }).length;
    const uncaptioned = tables.filter(t => !t.querySelector('caption') && !t.closest('figure'))
        .map(t => head(t));
    const box = figure && figure.getBoundingClientRect();
    const figureMiddle = box ? box.top + window.scrollY + box.height / 2 : null;
    return {text, prose, before, wideCode, wrappedCode, indexed, uncaptioned, code, figureMiddle};
}"""

# Open every dropdown and folded cell: wide code is measured on everything a reader can unfold.
UNFOLD = "() => document.querySelectorAll('main details').forEach(d => { d.open = true; })"

# A full stop that ends a sentence, unless it ends one of these abbreviations.
ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "cf.", "vs.", "Fig.", "Figs.", "Eq.", "Eqs.", "Sec.")
SENTENCE_END = re.compile(r"(?<=[.?!])[)\"”’]?\s+(?=[(\"“‘]?[A-Z0-9])")


def words(text):
    return len(text.split())


def sentences(paragraph):
    """The sentences of one paragraph: split after . ? or ! before a capital or a digit, except
    after an abbreviation ("et al.", "e.g.", "Fig.")."""
    pieces, start = [], 0
    for match in SENTENCE_END.finditer(paragraph):
        if paragraph[: match.start()].endswith(ABBREVIATIONS):
            continue
        pieces.append(paragraph[start : match.start()])
        start = match.end()
    pieces.append(paragraph[start:])
    return [p.strip() for p in pieces if p.strip()]


def sentence_words(sentence):
    """Words of a sentence: tokens with a letter or a digit (a dash or an = is not a word)."""
    return sum(1 for token in sentence.split() if any(ch.isalnum() for ch in token))


def long_sentences(paragraphs, limit=40):
    """Sentences of prose over limit words, each paragraph split on its own (so a list item, a
    caption or a line of code never runs into the next one). A str is read as one paragraph per
    line, for text that is not split into paragraphs already."""
    if isinstance(paragraphs, str):
        paragraphs = paragraphs.splitlines()
    split = (sentences(" ".join(p.split())) for p in paragraphs)
    return [s for pieces in split for s in pieces if sentence_words(s) > limit]


def summary(m):
    """The measures of one page, from MEASURE's result."""
    return {
        "words": words(m["text"]),
        "code words": words(m["code"]),
        "before figure": words(m["before"]),
        "sentences > 40": len(long_sentences(m["prose"])),
        "wide code": len(m["wideCode"]),
        "wrapped code": len(m["wrappedCode"]),
        "indexed tables": m["indexed"],
        "no caption": len(m["uncaptioned"]),
    }


def measure(site, stems=()):
    from playwright.sync_api import sync_playwright

    pages = sorted((site / "book" if (site / "book").is_dir() else site).glob("*.html"))
    if stems:
        pages = [p for p in pages if p.stem in stems]
    rows = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        context = browser.new_context(offline=True, viewport={"width": WIDE, "height": 900})
        for path in pages:
            page = context.new_page()
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_timeout(200)
            rows[path.stem] = summary(page.evaluate(MEASURE))
            page.evaluate(UNFOLD)
            page.wait_for_timeout(100)
            unfolded = page.evaluate(MEASURE)
            rows[path.stem]["wide unfolded"] = len(unfolded["wideCode"])
            rows[path.stem]["wrapped unfolded"] = len(unfolded["wrappedCode"])
            page.close()
        browser.close()
    return rows


def main(argv):
    site = Path(argv[0]).resolve() if argv and Path(argv[0]).is_dir() else ROOT / "_build" / "html"
    stems = [a for a in argv if not Path(a).is_dir()]
    rows = measure(site, stems)
    keys = list(next(iter(rows.values()), {}))
    print(f"{'page':<22}" + "".join(f"{k:>{max(8, len(k) + 2)}}" for k in keys))
    for stem, row in rows.items():
        print(f"{stem:<22}" + "".join(f"{row[k]:>{max(8, len(k) + 2)}}" for k in keys))
    chapters = [r for s, r in rows.items() if s.startswith("ch")]
    print(f"{'all chapters':<22}{sum(r['words'] for r in chapters):>8}")


if __name__ == "__main__":
    main(sys.argv[1:])
