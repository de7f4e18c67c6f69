"""What a reader first meets on each built page, measured in headless Chromium with folded
content left folded: visible words (prose, tables, outputs and unfolded code; the code's share
is shown apart), words before the first figure, sentences over 40 words,
code blocks that scroll sideways at 1400 px, and pandas tables with an index-name row or a bare
0...N index. The browser tests (tests/test_site.py) hold the pages to the goals; this prints them.

    python scripts/page_measures.py [SITE_DIR] [PAGE_STEM ...]
"""

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDE = 1400

# In the page: the main text as rendered (closed <details> and hidden cells are not rendered, so
# innerText leaves them out), the text before the first figure (an image or inline SVG that is
# drawn), the code blocks that scroll sideways, and the tables pandas marks with an index.
MEASURE = """() => {
    const main = document.querySelector('main article') || document.querySelector('main');
    const shown = e => e.getClientRects().length > 0;
    const pres = [...main.querySelectorAll('pre')];
    const wideCode = pres.filter(p => shown(p) && p.scrollWidth > p.clientWidth + 1)
        .map(p => p.textContent.slice(0, 50));
    const code = pres.filter(shown).map(p => p.innerText).join(' ');
    const text = main.innerText;
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
    const indexed = [...main.querySelectorAll('table.dataframe')].filter(shown).filter(t => {
        const heads = t.querySelectorAll('thead tr');
        const nameRow = heads.length > 1 && [...heads].some(r =>
            [...r.children].slice(1).every(c => c.textContent.trim() === ''));
        const keys = [...t.querySelectorAll('tbody tr > th:first-child')]
            .map(th => th.textContent.trim());
        const bare = keys.length > 0 && keys.every((k, i) => k === String(i));
        return nameRow || bare;
    }).length;
    return {text, before, wideCode, indexed, code};
}"""


def words(text):
    return len(text.split())


def long_sentences(text, limit=40):
    """Sentences of prose (lines of at least 12 words, so not table rows or code) over limit."""
    prose = " ".join(line for line in text.splitlines() if len(line.split()) >= 12)
    sentences = [s for s in prose.replace("? ", ". ").replace("! ", ". ").split(". ")]
    return [s for s in sentences if len(s.split()) > limit]


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
            m = page.evaluate(MEASURE)
            rows[path.stem] = {
                "words": words(m["text"]),
                "code words": words(m["code"]),
                "before figure": words(m["before"]),
                "sentences > 40": len(long_sentences(m["text"])),
                "wide code": len(m["wideCode"]),
                "indexed tables": m["indexed"],
            }
            page.close()
        browser.close()
    return rows


def main(argv):
    site = Path(argv[0]) if argv and Path(argv[0]).is_dir() else ROOT / "_build" / "html"
    stems = [a for a in argv if not Path(a).is_dir()]
    rows = measure(site, stems)
    keys = ["words", "code words", "before figure", "sentences > 40", "wide code", "indexed tables"]
    print(f"{'page':<24}" + "".join(f"{k:>16}" for k in keys))
    for stem, row in rows.items():
        print(f"{stem:<24}" + "".join(f"{row[k]:>16}" for k in keys))
    chapters = [r for s, r in rows.items() if s.startswith("ch")]
    print(f"{'all chapters':<24}{sum(r['words'] for r in chapters):>16}")


if __name__ == "__main__":
    main(sys.argv[1:])
