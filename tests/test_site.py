"""The built site (`make` builds it first): self-contained, links intact, no local paths, and
every page correct in a real browser (headless Chromium) with the network blocked."""

import fcntl
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from bs4 import BeautifulSoup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import page_measures  # noqa: E402  scripts/page_measures.py: what a reader first meets
import pdf  # noqa: E402  scripts/pdf.py: the offline launcher prefix for Chromium

import specdec_core as sc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "_build" / "html"))  # another built copy to test
PAGES = sorted(p for p in SITE.rglob("*.html") if "_static" not in p.relative_to(SITE).parts)
CONTENT_PAGES = [p for p in PAGES if p.parent.name == "book"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.site


def test_the_site_is_built():
    assert (SITE / "index.html").exists(), "run `make` (or `make test`) to build the site first"
    assert {p.stem for p in CONTENT_PAGES} >= {
        "intro",
        "ch1_models",
        "ch5_walltime",
        "bibliography",
    }


# ---- links and anchors -------------------------------------------------------------------


def local_targets(page):
    """(attribute value, resolved file, fragment) for every local link and resource of a page."""
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    for tag, attribute in (("a", "href"), ("link", "href"), ("img", "src"), ("script", "src")):
        for element in soup.find_all(tag):
            value = element.get(attribute)
            if not value or urlsplit(value).scheme in ("http", "https", "mailto", "data"):
                continue
            parts = urlsplit(value)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            yield value, target, parts.fragment


@functools.cache
def ids_of(page):
    """Every id and name an anchor can point to in a page (cached)."""
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    return {e.get("id") for e in soup.find_all(id=True)} | {
        e.get("name") for e in soup.find_all(attrs={"name": True})
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(SITE)))
def test_internal_links_and_anchors_resolve(page):
    broken = []
    for value, target, fragment in local_targets(page):
        if not target.exists():
            broken.append(f"{value}: no such file")
        elif fragment and target.suffix == ".html" and fragment not in ids_of(target):
            broken.append(f"{value}: no anchor #{fragment}")
    assert not broken, broken


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.html"
    page.write_text('<a href="missing.html">x</a><a href="#nowhere">y</a><p id="here"></p>')
    problems = [(t.exists(), f) for _, t, f in local_targets(page)]
    assert problems == [(False, ""), (True, "nowhere")] and "nowhere" not in ids_of(page)


def test_each_chapter_offers_its_notebook():
    for page in CONTENT_PAGES:
        if page.stem.startswith("ch"):
            links = [v for v, t, _ in local_targets(page) if v.endswith(f"{page.stem}.ipynb")]
            assert links, f"{page.name} has no notebook download"


# ---- no absolute local paths -------------------------------------------------------------

LOCAL_PATH = re.compile(
    "|".join(map(re.escape, {str(ROOT), "/tmp/", "/home/", "/root/", "file:///"}))
)


def test_no_built_page_contains_an_absolute_local_path():
    offenders = [
        str(p.relative_to(SITE))
        for p in SITE.rglob("*")
        if p.suffix in {".html", ".ipynb", ".txt", ".md"}
        and "_static" not in p.parts
        and LOCAL_PATH.search(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not offenders, offenders


def test_the_path_check_can_fail():
    assert LOCAL_PATH.search(f"<p>{ROOT}/_build/html/x.png</p>") and LOCAL_PATH.search("/tmp/a")


# ---- a real browser, offline, in a network namespace of its own --------------------------

# Switches that stop Chromium's own traffic: component updates, sync, pings, metrics, safe
# browsing, translation, DNS prefetch. The network namespace below makes them a second line.
QUIET_SWITCHES = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--safebrowsing-disable-auto-update",
    "--password-store=basic",
    "--use-mock-keychain",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,"
    "CertificateTransparencyComponentUpdater,DialMediaRouteProvider,InterestFeedContentSuggestions",
]
PHONE, DESKTOP = 390, 1400
PHONE_SCREEN = 844  # CSS px: a 390 x 844 phone


def isolation(pid):
    """(own network namespace?, its interfaces) of a process, read from /proc."""
    own = os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return own, sorted(line.split(":")[0].strip() for line in lines)


@pytest.fixture(scope="module")
def browser(records):
    """Headless Chromium, Debian's, in a fresh network namespace, with HOME, XDG dirs, TMPDIR and
    its profile in a temporary folder removed afterwards; skipped (or failed, with
    REQUIRE_BROWSER=1) where missing."""
    if CHROMIUM is None:
        if os.environ.get("REQUIRE_BROWSER", "0") not in ("", "0"):
            pytest.fail("REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip(
            "SKIPPED the browser test: chromium is not installed (apt-get install chromium)"
        )
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="specdec-browser-") as home:
        folders = {
            "HOME": home,
            "TMPDIR": home,
            "XDG_CONFIG_HOME": f"{home}/config",
            "XDG_CACHE_HOME": f"{home}/cache",
            "XDG_DATA_HOME": f"{home}/data",
            "XDG_RUNTIME_DIR": f"{home}/runtime",
        }
        for folder in folders.values():
            os.makedirs(folder, mode=0o700, exist_ok=True)
        prefix = pdf.offline_prefix()  # the same launcher prefix `make pdf` uses
        launcher = Path(home) / "chromium-offline"
        launcher.write_text("#!/bin/sh\nexec " + " ".join([*prefix, CHROMIUM]) + ' "$@"\n')
        launcher.chmod(0o700)
        saved = {k: os.environ.get(k) for k in folders}
        os.environ.update(folders)  # the playwright driver puts its profile folder in TMPDIR
        try:
            with sync_playwright() as playwright:
                launched = playwright.chromium.launch(
                    executable_path=str(launcher),
                    headless=True,
                    args=QUIET_SWITCHES,
                    env={**os.environ, **folders},
                )
                launched.home, launched.records = home, records
                yield launched
                launched.close()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def browser_processes(home):
    """Pids of the Chromium processes whose HOME is the fixture's folder."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if f"HOME={home}".encode() in environ and b"chrom" in command:
            pids.append(int(proc.name))
    return pids


def test_the_browser_is_cut_off_from_the_network(browser):
    """Every Chromium process runs in its own network namespace with only loopback, so no
    connection can leave the machine, whatever the browser tries."""
    visit(browser, SITE / "book" / "intro.html")
    pids = browser_processes(browser.home)
    assert pids, "no Chromium process found"
    report = {pid: isolation(pid) for pid in pids}
    assert all(own and interfaces == ["lo"] for own, interfaces in report.values()), report


def test_the_isolation_check_can_fail():
    own, interfaces = isolation(os.getpid())
    assert not own  # this test's own process shares the machine's network


def test_the_browser_keeps_to_its_own_folders(browser):
    """Profile, config, cache and dconf go to the fixture's temporary folder, not to the home."""
    visit(browser, SITE / "book" / "intro.html")
    for pid in browser_processes(browser.home):
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
            if "=" in item
        )
        for key in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "TMPDIR"):
            assert environ.get(key, "").startswith(browser.home), (pid, key, environ.get(key))
        command = Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
        profiles = [a for a in command if a.startswith("--user-data-dir=")]
        assert all(a.split("=", 1)[1].startswith(browser.home) for a in profiles), profiles


def new_page(browser, width, height=900):
    """A page in a window of a given size, offline, every non-file request blocked and recorded."""
    context = browser.new_context(offline=True, viewport={"width": width, "height": height})
    page = context.new_page()
    outside, errors = [], []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "requestfailed",
        lambda r: errors.append(f"failed: {r.url}") if r.url.startswith("file://") else None,
    )
    return context, page, outside, errors


def settle(page):
    """Wait for MathJax to typeset and every image to load."""
    page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)")
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.evaluate(
        "() => Promise.all([...document.images].map(i => { i.loading = 'eager'; "
        "return i.complete ? null : i.decode().catch(() => null); }))"
    )


# Measures, in the page: math cut off by a clipping box or the window; formulas that stick out of
# any box (so that they need a sideways scroll); code blocks that wrap without a hanging indent
# (each source line at the edge, its continuation set in), or scroll without a cue;
# wide tables without a cue; each content image's drawn and natural width.
MEASURE = """() => {
    const scroller = o => o === 'auto' || o === 'scroll';
    const cued = e => getComputedStyle(e).backgroundImage.includes('gradient');
    const shown = e => e.getClientRects().length > 0;
    const clipped = [], sticking = [];
    for (const m of document.querySelectorAll('mjx-container')) {
        const r = m.getBoundingClientRect();
        if (r.width === 0) continue;
        let box = null;
        for (let e = m.parentElement; e && e !== document.body; e = e.parentElement) {
            const c = getComputedStyle(e);  // overflow does not apply to inline elements
            if (c.overflowX !== 'visible' && c.display !== 'inline') { box = e; break; }
        }
        const o = box ? getComputedStyle(box).overflowX : 'visible';
        const right = box ? box.getBoundingClientRect().right : window.innerWidth;
        const left = box ? box.getBoundingClientRect().left : 0;
        if (!scroller(o) && (r.right > right + 1 || r.left < left - 1))
            clipped.push(m.textContent.slice(0, 60));
        const f = (m.querySelector('mjx-math') || m).getBoundingClientRect();
        let out = f.right > window.innerWidth + 1 || f.left < -1;
        for (let e = m; e && e !== document.body && !out; e = e.parentElement) {
            const c = getComputedStyle(e);
            if (c.overflowX === 'visible' || c.display === 'inline') continue;
            const b = e.getBoundingClientRect();
            out = f.right > b.right + 1 || f.left < b.left - 1;
        }
        if (out) sticking.push(m.textContent.slice(0, 60));
    }
    const hanging = c => c.whiteSpace === 'pre-wrap' && /hanging/.test(c.textIndent)
        && /each-line/.test(c.textIndent) && parseFloat(c.textIndent) > 0;
    const code = [...document.querySelectorAll('main pre')].filter(shown).filter(p => {
        const c = getComputedStyle(p);
        const scrolls = p.scrollWidth > p.clientWidth + 1;
        return (c.whiteSpace !== 'pre' && !hanging(c))
            || (scrolls && !(scroller(c.overflowX) && cued(p)));
    }).map(p => p.textContent.slice(0, 60));
    const scrolling = [...document.querySelectorAll('main pre')]
        .filter(p => shown(p) && p.scrollWidth > p.clientWidth + 1).length;
    const tables = [...document.querySelectorAll('main table')].filter(shown).filter(t => {
        let box = t;
        while (box.parentElement && box !== document.body
               && !scroller(getComputedStyle(box).overflowX)) box = box.parentElement;
        const wide = t.getBoundingClientRect().width > box.clientWidth + 1;
        return wide && (box === document.body || !cued(box));
    }).map(t => t.textContent.trim().slice(0, 60));
    const drawn = [...document.querySelectorAll('main img')]
        .map(i => [i.getAttribute('src'), Math.round(i.getBoundingClientRect().width),
                   i.naturalWidth]);
    return {clipped, sticking, code, scrolling, tables, drawn};
}"""


def visit(browser, page_path, width=DESKTOP):
    """Open a page from disk, in a window 844 px high on a phone and 900 px otherwise, with every
    non-file request blocked, and return what happened: the bytes of every file the page loaded
    (its weight on a first visit, nothing cached); MEASURE, and page_measures.MEASURE as a reader
    first sees it ("reader"); on a phone, cue_contrasts ("cue"); and, once every dropdown is
    open, page_measures.MEASURE again (reader "unfolded") and TABLES ("open tables"). One load
    serves every check of a page at a width, and `load` shares it between the tests."""
    context, page, outside, errors = new_page(
        browser, width, PHONE_SCREEN if width == PHONE else 900
    )
    loaded = set()
    page.on("request", lambda r: loaded.add(r.url) if r.url.startswith("file://") else None)
    page.goto(page_path.as_uri(), wait_until="load")
    settle(page)
    page.wait_for_timeout(300)  # fonts and icons requested once the page is laid out
    result = page.evaluate("""() => ({
        images: [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth, i.alt]),
        math: document.querySelectorAll('.math').length,
        typeset: document.querySelectorAll('.math mjx-container').length,
        rawTex: [...document.querySelectorAll('.math')].filter(e => /\\\\[(\\[]/.test(e.textContent)
                 && !e.querySelector('mjx-container')).length,
        text: document.querySelector('main') ? document.querySelector('main').innerText : ''
    })""")
    result.update(page.evaluate(MEASURE))
    files = {Path(unquote(urlsplit(url).path)) for url in loaded}
    result["weight"] = {str(f): f.stat().st_size for f in files if f.is_file()}
    result["text sizes"] = figure_text_sizes(page_path, result["drawn"])
    result["reader"] = page.evaluate(page_measures.MEASURE)
    if width == PHONE:
        result["cue"] = cue_contrasts(page)
    page.evaluate(page_measures.UNFOLD)
    page.wait_for_timeout(200)  # book.js measures a table when its dropdown opens
    result["reader"]["unfolded"] = page.evaluate(page_measures.MEASURE)
    result["open tables"] = page.evaluate(TABLES)  # last: it scrolls the page
    context.close()
    return result, outside, errors


def load(browser, page_path, width=DESKTOP):
    """visit() of a page of the built site, loaded once per test session and window whichever
    worker asks first (the others read its record); any other page is visited afresh."""
    if SITE not in page_path.parents:
        return visit(browser, page_path, width)
    name = "-".join(page_path.relative_to(SITE).with_suffix("").parts)
    record = browser.records / f"{name}-{width}.json"
    with open(record.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            record.write_text(json.dumps(visit(browser, page_path, width)))
    return tuple(json.loads(record.read_text()))


def smallest_text_px(image, drawn_width, natural_width):
    """The smallest figure text of a PNG drawn drawn_width CSS px wide, in CSS px, from the
    text chunk the book's figures carry (None for an image without it)."""
    from PIL import Image

    with Image.open(image) as png:
        points = png.info.get(sc.SMALLEST_TEXT_KEY)
        dpi = png.info.get("dpi", (72, 72))[0]
    if points is None or not natural_width:
        return None
    return float(points) * dpi / 72 * drawn_width / natural_width


def figure_text_sizes(page_path, drawn):
    """{image: its smallest text in CSS px as drawn} for every PNG in a page's main text."""
    sizes = {}
    for src, width, natural in drawn:
        image = (page_path.parent / unquote(urlsplit(src).path)).resolve()
        if image.suffix == ".png" and width and image.exists():  # a missing one fails elsewhere
            sizes[src] = smallest_text_px(image, width, natural)
    return sizes


PAGE_WEIGHT = 2_000_000  # bytes a first visit may load (issue 23)
SMALLEST_TEXT = 9.0  # CSS px: the least font size of figure text at 390 px (issue 23)


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_page_in_a_real_browser(browser, page_path):
    result, outside, errors = load(browser, page_path)
    assert not outside, f"requests left the local site: {outside}"
    assert not errors, f"console errors: {errors}"
    assert all(width > 0 for _, width, _ in result["images"]), result["images"]
    assert all(len(alt) > 20 for _, _, alt in result["images"]), "an image without alt text"
    assert result["typeset"] == result["math"] and result["rawTex"] == 0
    assert not re.search(r"\\\(|\\\[|\$\$", result["text"]), "raw TeX left in the page"
    assert not result["code"], f"code that wraps, or scrolls without a cue: {result['code']}"
    assert not result["sticking"], f"formulas wider than their box: {result['sticking']}"
    weight = sum(result["weight"].values())
    heaviest = sorted(result["weight"].items(), key=lambda kv: -kv[1])[:40]
    print(f"{page_path.stem}: {weight:,} bytes on a first visit; heaviest {heaviest}")
    assert weight <= PAGE_WEIGHT, f"{weight:,} bytes on a first visit: {heaviest}"


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_page_on_a_phone(browser, page_path):
    """At 390 px: every formula inside its box (no sideways scroll), no math cut off, code that
    never wraps mid-word and scrolls only with a visible cue, every wide table with a scroll cue,
    every content image drawn at least 300 px wide, and no figure text under 9 CSS px."""
    result, outside, errors = load(browser, page_path, PHONE)
    assert not outside and not errors, (outside, errors)
    assert not result["clipped"], f"math cut off at {PHONE} px: {result['clipped']}"
    assert not result["sticking"], f"formulas wider than their box: {result['sticking']}"
    assert not result["code"], f"code that wraps, or scrolls without a cue: {result['code']}"
    assert not result["tables"], f"wide tables without a scroll cue: {result['tables']}"
    narrow = [(src, w) for src, w, _ in result["drawn"] if w < 300]
    print(f"{page_path.stem}: image widths at {PHONE} px:", [w for _, w, _ in result["drawn"]])
    assert not narrow, f"images drawn narrower than 300 px at {PHONE} px: {narrow}"
    sizes = result["text sizes"]
    print(f"{page_path.stem}: smallest figure text (CSS px):", sorted(sizes.values(), key=str))
    small = {src: px for src, px in sizes.items() if px is None or px < SMALLEST_TEXT}
    assert not small, f"figure text under {SMALLEST_TEXT} CSS px (or unmeasured): {small}"


def visible(page, selector):
    """How many elements matching selector are drawn on screen."""
    return page.evaluate(
        """s => [...document.querySelectorAll(s)].filter(e => {
            const r = e.getBoundingClientRect(), c = getComputedStyle(e);
            return r.width > 0 && r.height > 0 && c.visibility !== 'hidden'
                && r.right > 0 && r.left < window.innerWidth && r.bottom > 0;
        }).length""",
        selector,
    )


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
def test_the_menu_and_contents_buttons_work(browser, width):
    """The visible menu button opens the chapter list; the contents button the page's contents.
    One header, one search box."""
    context, page, outside, errors = new_page(browser, width)
    page.goto((SITE / "book" / "ch2_one_token.html").as_uri(), wait_until="load")
    settle(page)
    assert visible(page, ".bd-header") == 0, "a second header bar is drawn"
    assert visible(page, ".search-button, .search-button-field, form.bd-search") <= 1
    chapters = ".bd-sidebar-primary a[href*='ch3_drafted_runs']"
    if width == PHONE:
        assert visible(page, chapters) == 0, "the chapter list is open before any click"
        assert visible(page, ".primary-toggle") == 1
        page.locator(".primary-toggle").filter(visible=True).first.click()
        page.wait_for_timeout(600)
        assert visible(page, chapters) >= 1, "the menu button did not open the chapter list"
        page.keyboard.press("Escape")
        page.wait_for_timeout(400)
    contents = ".bd-sidebar-secondary nav a, .bd-toc a"
    toggles = page.locator(".secondary-toggle").filter(visible=True)
    if width == PHONE or visible(page, contents) == 0:
        assert toggles.count() == 1, "no visible contents button"
        toggles.first.click()
        page.wait_for_timeout(600)
    assert visible(page, contents) >= 1, "the contents button did not open the page's contents"
    context.close()
    assert not outside and not errors, (outside, errors)


def tap_a_section(browser, page_path):
    """At 390 px, open the page's contents, tap the third section: (contents still drawn over
    the page?, the section marked active, the section tapped, the section at the top)."""
    context, page, outside, errors = new_page(browser, PHONE)
    page.goto(page_path.as_uri(), wait_until="load")
    settle(page)
    page.locator(".secondary-toggle").filter(visible=True).first.click()
    page.wait_for_timeout(600)
    link = page.locator("#pst-secondary-sidebar-modal nav a").filter(visible=True).nth(2)
    tapped = link.get_attribute("href")
    link.click()
    page.wait_for_timeout(800)
    state = page.evaluate(
        """() => ({
            open: [...document.querySelectorAll('dialog')].some(d => d.open),
            active: [...document.querySelectorAll('#pst-secondary-sidebar a.active')]
                .map(a => a.getAttribute('href')),
            top: location.hash})"""
    )
    context.close()
    assert not outside and not errors, (outside, errors)
    return state["open"], state["active"], tapped, state["top"]


def test_a_tap_in_the_contents_closes_them_and_marks_the_section(browser):
    """On a phone the contents dialog closes after a tap, and marks the section tapped."""
    still_open, active, tapped, top = tap_a_section(browser, SITE / "book" / "ch2_one_token.html")
    assert not still_open, "the contents stay open over the page after a tap"
    assert top == tapped and active[-1:] == [tapped], (active, tapped, top)


def test_the_contents_check_can_fail(browser, tmp_path):
    """Without the book's script the theme's dialog stays open after a tap: the check sees it."""
    page = tmp_path / "book" / "ch2_one_token.html"
    page.parent.mkdir()
    html = (SITE / "book" / "ch2_one_token.html").read_text(encoding="utf-8")
    page.write_text(
        re.sub(r'<script src="../_static/book.js[^"]*"></script>', "", html)
        .replace('"../_static/', f'"{SITE.as_uri()}/_static/')
        .replace('"../_images/', f'"{SITE.as_uri()}/_images/'),
        encoding="utf-8",
    )
    still_open, _, _, _ = tap_a_section(browser, page)
    assert still_open


def search(browser, query, summaries=False):
    """(number of hits, outside requests, console errors) of a search on the built site; with
    summaries=True the page also fetches each hit's text, as Sphinx does by default."""
    context, page, outside, errors = new_page(browser, DESKTOP)
    page.goto((SITE / "search.html").as_uri() + f"?q={query}", wait_until="load")
    page.wait_for_function(
        "() => document.querySelectorAll('#search-results li').length > 0", timeout=20000
    )
    if summaries:
        page.evaluate(
            f"() => {{ DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = true; "
            f"Search.performSearch('{query}'); }}"
        )
    page.wait_for_timeout(1500)  # summaries, if any, are fetched after the list appears
    hits = page.evaluate("() => document.querySelectorAll('#search-results li').length")
    context.close()
    return hits, outside, errors


def test_search_finds_pages_without_errors(browser):
    hits, outside, errors = search(browser, "rejection")
    assert hits > 0 and not outside and not errors, (hits, outside, errors)


def test_the_search_check_can_fail(browser):
    """Sphinx's default, a summary fetched for each hit, fails from file://: the check sees it."""
    hits, outside, errors = search(browser, "rejection", summaries=True)
    assert hits > 0 and any("fetch" in e.lower() for e in errors), errors


def test_the_browser_check_can_fail(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        '<main><img src="missing.png"><img src="https://example.org/x.png">'
        '<span class="math">\\(x^2\\)</span><script>undefinedFunction()</script>'
        '<pre style="white-space: pre">' + "x" * 400 + "</pre>"
        '<div style="overflow: hidden; width: 100px"><mjx-container style="display: inline-block;'
        ' width: 300px">y</mjx-container></div></main>'
    )
    result, outside, errors = visit(browser, page, PHONE)
    assert outside == ["https://example.org/x.png"]
    assert errors and any(width == 0 for _, width, _ in result["images"])
    assert result["rawTex"] == 1 and result["code"] and result["clipped"]
    assert all(w < 300 for _, w, _ in result["drawn"])


CUE = (
    "background: linear-gradient(to right, white, transparent) left / 2em 100% no-repeat local,"
    " white"
)


def test_the_phone_measures_can_fail(browser, tmp_path):
    """A formula that scrolls in its box, code that wraps without a hanging indent, a scrolling
    code block and a wide table without a cue are each caught; the same code and table with the
    cue pass, and so does code that wraps with a hanging indent."""
    wide = "<table><tr>" + "<td>cell number</td>" * 30 + "</tr></table>"
    page = tmp_path / "phone.html"
    page.write_text(
        '<main><div style="overflow-x: auto; width: 200px"><mjx-container style="display:'
        ' inline-block"><mjx-math style="display: inline-block; width: 300px">z</mjx-math>'
        '</mjx-container></div><pre style="white-space: pre-wrap">' + "w " * 300 + "</pre>"
        '<pre style="white-space: pre-wrap; text-indent: 4ch hanging each-line">'
        + "h "
        * 300
        + "</pre>"
        '<pre style="white-space: pre; overflow-x: auto">' + "v" * 400 + "</pre>"
        f'<div style="overflow-x: auto">{wide}</div>'
        f'<pre style="white-space: pre; overflow-x: auto; {CUE}">' + "u" * 400 + "</pre>"
        f'<div style="overflow-x: auto; {CUE}">{wide}</div></main>'
    )
    result, _, _ = visit(browser, page, PHONE)
    assert [t[:2] for t in result["sticking"]] == ["z"]
    assert [c[:1] for c in result["code"]] == ["w", "v"] and result["scrolling"] == 2
    assert len(result["tables"]) == 1


def test_the_page_weight_and_figure_text_checks_can_fail(browser, tmp_path):
    """A page that loads 3 MB is weighed at 3 MB; a figure with 9 pt text drawn 300 px wide has
    text under 9 CSS px, and a figure without the record is unmeasured."""
    import matplotlib

    matplotlib.use("Agg")
    figure, axes = sc.new_figure(figsize=(6.4, 4.0))
    axes.set_title("small", fontsize=9)
    figure.savefig(
        tmp_path / "small.png",
        dpi=200,
        metadata={sc.SMALLEST_TEXT_KEY: f"{sc.smallest_text(figure)}"},
    )
    figure.savefig(tmp_path / "plain.png", dpi=200)
    (tmp_path / "heavy.js").write_text("//" + "x" * 3_000_000)
    page = tmp_path / "heavy.html"
    page.write_text(
        '<main><script src="heavy.js"></script><img src="small.png" alt="a small figure here"'
        ' style="width: 300px"><img src="plain.png" alt="a figure with no record"></main>'
    )
    result, _, _ = visit(browser, page, PHONE)
    assert sum(result["weight"].values()) > PAGE_WEIGHT
    sizes = result["text sizes"]
    assert sizes["plain.png"] is None and 5 < sizes["small.png"] < SMALLEST_TEXT


# ---- what a reader expects of a book: numbers, a stamp, citations that lead to the paper ---


# An ordinary value (0.001 to 9999, or an exact zero) printed in e-notation: 6.98e-01, 0.0e+00.
E_NOTATION = re.compile(r"\b\d\.\d+e(?:-0[0-3]|\+0[0-3])\b")


def ordinary_values_in_e_notation(page):
    """Every ordinary value a page's main text prints in e-notation."""
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    main = soup.find("main") or soup
    return E_NOTATION.findall(main.get_text(" "))


def test_no_ordinary_value_is_printed_in_e_notation():
    found = {p.stem: ordinary_values_in_e_notation(p) for p in CONTENT_PAGES}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_the_e_notation_check_can_fail(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<main><td>6.98e-01</td><td>0.000000e+00</td><td>5.1e-211</td></main>")
    assert ordinary_values_in_e_notation(page) == ["6.98e-01", "0.000000e+00"]


def test_every_page_says_its_version_and_date():
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    stamp = re.compile(rf"version {re.escape(version)}\b.*built from the sources of \d{{4}}-\d\d")
    pages = [p for p in PAGES if p.name not in ("index.html",)]  # index.html only redirects
    missing = [p.name for p in pages if not stamp.search(p.read_text(encoding="utf-8"))]
    assert not missing, missing


def test_chapters_and_sections_are_numbered():
    for page in CONTENT_PAGES:
        if page.stem.startswith("ch"):
            soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
            numbers = [s.get_text(strip=True) for s in soup.select("main .section-number")]
            chapter = page.stem[2]
            assert numbers and numbers[0] == f"{chapter}." and f"{chapter}.1." in numbers, numbers


def citations(page):
    """(href, text of the entry it lands on, that entry's external links) for each citation."""
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    for a in soup.select('a.reference.internal[href*="bibliography.html#"]'):
        target = (page.parent / urlsplit(a["href"]).path).resolve()
        entry = BeautifulSoup(target.read_text(encoding="utf-8"), "html.parser").find(
            id=urlsplit(a["href"]).fragment
        )
        links = [x["href"] for x in entry.select("a.reference.external")] if entry else []
        yield a["href"], entry.get("role") if entry else None, links


def test_citations_land_on_an_entry_that_links_to_the_paper():
    seen = 0
    for page in CONTENT_PAGES:
        for href, role, links in citations(page):
            seen += 1
            assert role == "doc-biblioentry", (page.name, href)
            assert any(link.startswith("https://") for link in links), (page.name, href)
    assert seen > 0


def test_the_citation_check_can_fail(tmp_path):
    (tmp_path / "bibliography.html").write_text(
        '<div id="e1" role="doc-biblioentry"><p>An entry without a link.</p></div>'
    )
    page = tmp_path / "page.html"
    page.write_text('<a class="reference internal" href="bibliography.html#e1">[X]</a>')
    assert list(citations(page)) == [("bibliography.html#e1", "doc-biblioentry", [])]


# ---- issue 28: a book a reader finishes (scripts/page_measures.py measures, these hold) -----

CHAPTERS = [p for p in CONTENT_PAGES if re.match(r"ch\d_", p.stem)]
WORDS_PER_CHAPTER = 4_500  # visible words, dropdowns closed, unfolded code included
WORDS_ALL_CHAPTERS = 27_000  # over ch1 to ch9
WORDS_BEFORE_FIGURE = 700
LONG_SENTENCE, LONG_SENTENCES = 40, 5  # at most 5 sentences of over 40 words a chapter
LANDING_FIGURE_SCREENS = 1.5  # the landing page's first figure, its middle, within 1.5 screens
# The cue's shadow is 30 % black at the box's edge, fading over 0.9 em: with it, the box's last
# 4 px measured 29 to 47 grey levels darker (median over the strip on screen, 2026-12-03) than
# the same pixels once the box is scrolled to its end, where the shadow is covered; without it,
# or under opaque rows, 0.
# Text at the edge darkens a few pixels either way; the median of the strip ignores them. A cue
# must make the edge at least this much darker (of 255).
CUE_CONTRAST = 10


def reader_measures(browser, page_path, width=DESKTOP):
    """page_measures.MEASURE on a page as a reader first sees it (dropdowns closed), and under
    "unfolded" with every dropdown and folded cell open."""
    result, outside, _ = load(browser, page_path, width)
    assert not outside, outside
    return result["reader"]


# Each check takes a page's measures and returns what breaks issue 28's goal (falsy if nothing).
READING_CHECKS = {
    "visible words": lambda m: (n := page_measures.words(m["text"])) > WORDS_PER_CHAPTER and n,
    "words before the first figure": lambda m: (
        (n := page_measures.words(m["before"])) > WORDS_BEFORE_FIGURE and n
    ),
    "sentences over 40 words": lambda m: (
        len(long := page_measures.long_sentences(m["prose"], LONG_SENTENCE)) > LONG_SENTENCES
        and long
    ),
    "code that scrolls sideways at 1400 px, dropdowns open": lambda m: m["unfolded"]["wideCode"],
    "pandas tables with an index row, dropdowns open": lambda m: m["unfolded"]["indexed"],
    "tables without a caption, dropdowns open": lambda m: m["unfolded"]["uncaptioned"],
}


def check_reading(browser, page_path, name):
    fault = READING_CHECKS[name](reader_measures(browser, page_path))
    assert not fault, f"{page_path.stem}: {name}: {fault}"


@pytest.mark.parametrize("page_path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_has_at_most_4500_visible_words(browser, page_path):
    check_reading(browser, page_path, "visible words")


def test_the_chapters_have_at_most_27000_visible_words_together(browser):
    counts = {p.stem: page_measures.words(reader_measures(browser, p)["text"]) for p in CHAPTERS}
    assert len(counts) == 9 and sum(counts.values()) <= WORDS_ALL_CHAPTERS, counts


@pytest.mark.parametrize("page_path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_shows_a_figure_within_700_words(browser, page_path):
    check_reading(browser, page_path, "words before the first figure")


@pytest.mark.parametrize("page_path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_has_at_most_5_sentences_over_40_words(browser, page_path):
    check_reading(browser, page_path, "sentences over 40 words")


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_no_code_scrolls_sideways_at_1400_px(browser, page_path):
    check_reading(browser, page_path, "code that scrolls sideways at 1400 px, dropdowns open")


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_no_table_shows_a_pandas_index(browser, page_path):
    check_reading(browser, page_path, "pandas tables with an index row, dropdowns open")


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_every_table_has_a_caption(browser, page_path):
    check_reading(browser, page_path, "tables without a caption, dropdowns open")


def test_the_reading_checks_can_fail(browser, tmp_path):
    """A synthetic chapter breaks every goal and each check rejects it; the same prose folded
    into a dropdown, the figure first, sc.table's table and code that fits pass every check (so
    folding is what the words and sentence counts see)."""
    import pandas as pd
    from PIL import Image

    Image.new("RGB", (400, 300), "steelblue").save(tmp_path / "figure.png")
    figure = '<img src="figure.png" alt="a figure" style="width: 400px; height: 300px">'
    long = "<p>" + " ".join(["This sentence runs on" + " and on" * 21 + "."] * 6) + "</p>"
    bulk = "<p>" + "Words of a chapter. " * 1_300 + "</p>"
    frame = pd.DataFrame({"tokens": [1.5, 2.5]}, index=pd.Index(["a", "b"], name="draft"))
    indexed, clean = frame.to_html(), sc.table(frame, "Tokens per call by draft").to_html()
    wide = '<pre style="white-space: pre; overflow-x: auto">' + "x = 1  # " + "y" * 200
    fits = '<pre style="white-space: pre; overflow-x: auto">x = 1'
    bad, good = tmp_path / "bad.html", tmp_path / "good.html"
    bad.write_text(f"<main><article>{long}{bulk}{figure}{wide}</pre>{indexed}</article></main>")
    good.write_text(
        f"<main><article><p>A short opening.</p>{figure}<details><summary>How we know</summary>"
        f"{long}{bulk}</details>{fits}</pre>{clean}</article></main>"
    )
    bad_measures, good_measures = reader_measures(browser, bad), reader_measures(browser, good)
    assert all(check(bad_measures) for check in READING_CHECKS.values()), {
        name: bool(check(bad_measures)) for name, check in READING_CHECKS.items()
    }
    assert not any(check(good_measures) for check in READING_CHECKS.values()), {
        name: check(good_measures) for name, check in READING_CHECKS.items()
    }


def landing_figure_fault(browser, page_path):
    """How far below 1.5 phone screens the first figure's middle is drawn (None if within)."""
    middle = reader_measures(browser, page_path, PHONE)["figureMiddle"]
    limit = LANDING_FIGURE_SCREENS * PHONE_SCREEN
    return None if middle is not None and middle <= limit else (middle, limit)


def test_the_landing_page_shows_a_figure_within_one_and_a_half_phone_screens(browser):
    landing = SITE / "book" / "intro.html"
    assert f"url={landing.relative_to(SITE).as_posix()}" in (SITE / "index.html").read_text()
    fault = landing_figure_fault(browser, landing)
    assert fault is None, (
        f"the first figure's middle (None: no figure) at {fault[0]}, not within the first"
        f" {LANDING_FIGURE_SCREENS} phone screens ({fault[1]} px)"
    )


def test_the_landing_figure_check_can_fail(browser, tmp_path):
    from PIL import Image

    Image.new("RGB", (400, 300), "steelblue").save(tmp_path / "figure.png")
    figure = '<img src="figure.png" alt="a figure" style="width: 360px; height: 270px">'
    late, early = tmp_path / "late.html", tmp_path / "early.html"
    late.write_text("<main><p>" + "An opening that runs on. " * 300 + f"</p>{figure}</main>")
    early.write_text(f"<main><p>Two sentences.</p>{figure}<p>" + "More. " * 300 + "</p></main>")
    assert landing_figure_fault(browser, late) is not None
    assert landing_figure_fault(browser, early) is None


HEADER_BOTTOM = """() => {
    const header = document.querySelector('.bd-header-article');
    return header ? Math.max(0, header.getBoundingClientRect().bottom) : 0;
}"""


def cue_contrasts(page):
    """For each table that hides some of its content in its box at 390 px (dropdowns closed;
    a box that hides only the padding of the last column hides nothing): how much darker the
    box's right edge is at the start of its scroll than at its end, in grey levels, the median
    over the edge's last 4 px and its first 400 px on screen below the theme's header. Each
    box is left scrolled back to its start."""
    import io
    import statistics

    from PIL import Image

    count = page.evaluate(
        """() => {
        const scroller = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
        let n = 0;
        for (const t of document.querySelectorAll('main table')) {
            if (!t.checkVisibility()) continue;
            let box = t;
            while (box && box !== document.body && !scroller(box)) box = box.parentElement;
            if (!box || box === document.body || box.dataset.cueBox) continue;
            // content is hidden only past the last cells' right padding
            const pad = Math.min(...[...t.querySelectorAll('tr > :last-child')]
                .map(c => parseFloat(getComputedStyle(c).paddingRight)));
            if (box.scrollWidth - box.clientWidth > pad + 1) box.dataset.cueBox = String(n++);
        }
        return n;
    }"""
    )
    contrasts = {}
    for i in range(count):
        box = page.locator(f'[data-cue-box="{i}"]')
        box.evaluate("b => b.scrollIntoView({block: 'center', behavior: 'instant'})")
        edges = []
        for where in ("0", "b.scrollWidth"):
            box.evaluate(f"b => {{ b.scrollLeft = {where}; }}")
            page.wait_for_timeout(50)
            # the strip on screen, below the theme's sticky header; only it is drawn
            r, top = box.bounding_box(), page.evaluate(HEADER_BOTTOM)
            y = max(r["y"], top)
            bottom = min(r["y"] + r["height"], y + 400, page.viewport_size["height"])
            strip = {"x": r["x"] + r["width"] - 4, "y": y, "width": 4, "height": bottom - y}
            edge = Image.open(io.BytesIO(page.screenshot(clip=strip))).convert("L")
            edges.append(statistics.median(edge.tobytes()))
        label = box.evaluate(
            "b => [...b.querySelectorAll('caption, th, td')].map(e => e.textContent.trim())"
            ".find(t => t).slice(0, 40)"
        )
        contrasts[f"{i}: {label}"] = edges[1] - edges[0]
        box.evaluate("b => { b.scrollLeft = 0; }")
    page.evaluate("() => window.scrollTo({top: 0, behavior: 'instant'})")
    return contrasts


def test_wide_tables_show_the_scroll_cue_in_pixels_on_a_phone(browser):
    """Every table wider than its box on a phone shows the cue at its edge, drawn on screen."""
    with_tables = [p for p in CONTENT_PAGES if "<table" in p.read_text(encoding="utf-8")]
    contrasts = {p.stem: load(browser, p, PHONE)[0]["cue"] for p in with_tables}
    print("cue contrast (grey levels) of each wide table at 390 px:", contrasts)
    assert any(contrasts.values()), "no table scrolls sideways on a phone: the check saw nothing"
    faint = {
        page: {table: c for table, c in found.items() if c < CUE_CONTRAST}
        for page, found in contrasts.items()
    }
    assert not any(faint.values()), {page: found for page, found in faint.items() if found}


THEME_COLOURS = ":root { --pst-color-background: #fff; --pst-color-surface: #f3f4f5; }"


def test_the_cue_pixel_check_can_fail(browser, tmp_path):
    """The book's cue over a wide table shows; the same cue under opaque rows (as the theme
    painted them) does not, and neither does a box with no cue at all."""
    css = (SITE / "_static" / "book.css").as_uri()
    rows = "".join(
        f"<tr>{''.join(f'<td>cell_{r}_{c}</td>' for c in range(12))}</tr>" for r in range(8)
    )
    table = f'<table class="dataframe">{rows}</table>'
    cued = f'<div class="cell_output"><div class="output text_html">{table}</div></div>'
    for name, style, body, shows in [
        ("cue", "", cued, True),
        ("opaque", "tr { background: #ffffff !important; }", cued, False),
        ("none", "div.x { overflow-x: auto; }", f'<div class="x">{table}</div>', False),
    ]:
        page = tmp_path / f"{name}.html"
        page.write_text(
            f'<link rel="stylesheet" href="{css}"><style>{THEME_COLOURS} {style}</style>'
            f'<main><div class="bd-content">{body}</div></main>'
        )
        (contrast,) = visit(browser, page, PHONE)[0]["cue"].values()
        assert (contrast >= CUE_CONTRAST) == shows, (name, contrast)


def test_book_js_right_aligns_the_numeric_columns_of_a_table(browser, tmp_path):
    """sc.table's numbers (thousands separators, a true minus, a dash for no value, ×) are
    marked numeric and right-aligned; a column of words, or of words and numbers, is not."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "bug": ["argmax draft", "raw q"],
            "draws": [69_616_927, 21],
            "gap": [-0.25, float("nan")],
            "speedup": ["2.3–3.6×", "1.5×"],
            "test": ["chi-square", "3"],
        }
    )
    page = tmp_path / "table.html"
    page.write_text(
        f'<link rel="stylesheet" href="{(SITE / "_static" / "book.css").as_uri()}">'
        f'<main><div class="bd-content">{sc.table(frame, "A table").to_html()}</div></main>'
        f'<script src="{(SITE / "_static" / "book.js").as_uri()}"></script>'
    )
    context, browser_page, outside, errors = new_page(browser, DESKTOP)
    browser_page.goto(page.as_uri(), wait_until="load")
    aligned = browser_page.evaluate(
        "() => [...document.querySelectorAll('thead th')].map((th, i) => [th.textContent,"
        " [...document.querySelectorAll(`tbody td:nth-child(${i + 1})`)]"
        ".every(td => td.classList.contains('book-num')"
        " && getComputedStyle(td).textAlign === 'right')])"
    )
    context.close()
    assert not outside and not errors, (outside, errors)
    assert dict(aligned) == {
        "bug": False,
        "draws": True,
        "gap": True,
        "speedup": True,
        "test": False,
    }, aligned


# ---- issue 36: every column the prose cites in sight, search with context, downloads -------

# Every table of the main text, dropdowns open: its drawn width; the width of the box it sits
# in (the nearest box that scrolls sideways, else the page's column); and, for a table wider
# than that box, whether its first column stays put: with the box scrolled to its end, the first
# cell of the header and of every body row still starts at the box's left edge, is the element
# drawn at its middle, and paints an opaque background (so no scrolled cell shows through),
# checked on the rows drawn in the middle of the screen (see the comment in the code).
TABLES = """() => {
    const scroller = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
    const column = document.querySelector('main article') || document.querySelector('main');
    const opaque = c => /^rgb\\(|, 1\\)$/.test(getComputedStyle(c).backgroundColor);
    document.querySelectorAll('main details').forEach(d => { d.open = true; });
    const found = [];
    for (const t of document.querySelectorAll('main table')) {
        if (!t.checkVisibility()) continue;
        let box = t.parentElement;
        while (box && box !== column && box !== document.body && !scroller(box))
            box = box.parentElement;
        const width = t.getBoundingClientRect().width;
        let pinned = null;
        if (width > box.clientWidth + 1) {
            // elementFromPoint sees only the screen, and the theme's sticky header covers its
            // top: each first cell is probed at the middle of its part below the header, with
            // the table centred (the theme scrolls smoothly unless told otherwise)
            t.scrollIntoView({block: 'center', behavior: 'instant'});
            box.scrollLeft = box.scrollWidth;
            const left = box.getBoundingClientRect().left;
            const header = document.querySelector('.bd-header-article');
            const low = header ? Math.max(0, header.getBoundingClientRect().bottom) + 1 : 0;
            const high = innerHeight - 1;
            const firsts = [...t.rows].map(r => r.cells[0]).filter(c => {
                const r = c && c.getBoundingClientRect();
                return c && r.bottom > low && r.top < high;
            });
            pinned = firsts.length > 0 && firsts.every(c => {
                const r = c.getBoundingClientRect();
                const y = (Math.max(r.top, low) + Math.min(r.bottom, high)) / 2;
                const hit = document.elementFromPoint(r.left + r.width / 2, y);
                return r.left >= left - 1 && hit !== null && c.contains(hit) && opaque(c);
            });
            box.scrollLeft = 0;
        }
        const caption = t.querySelector('caption');
        found.push({table: (caption || t).textContent.trim().slice(0, 60), width: width,
                    box: box.clientWidth, pinned: pinned});
    }
    return found;
}"""


def table_measures(browser, page_path, width):
    """TABLES on a page opened from disk at a given width, every dropdown open."""
    result, outside, _ = load(browser, page_path, width)
    assert not outside, outside
    return result["open tables"]


def too_wide(found):
    """The tables wider than their box, as (caption, table width, box width)."""
    return [(t["table"], round(t["width"]), t["box"]) for t in found if t["width"] > t["box"] + 1]


def unpinned(found):
    """The tables wider than their box whose first column does not stay put."""
    return [(t["table"], round(t["width"]), t["box"]) for t in found if t["pinned"] is False]


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_no_table_is_wider_than_the_column_at_1400_px(browser, page_path):
    """At 1400 px every table, folded ones included, fits its column: no column the prose cites
    hides past the edge."""
    found = table_measures(browser, page_path, DESKTOP)
    assert not too_wide(found), too_wide(found)


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_wide_tables_keep_their_row_labels_on_a_phone(browser, page_path):
    """At 390 px a table wider than its box scrolls with its first column pinned: the row labels
    stay beside the numbers the prose cites."""
    found = table_measures(browser, page_path, PHONE)
    print(f"{page_path.stem}: {len(too_wide(found))} tables scroll at {PHONE} px")
    assert not unpinned(found), unpinned(found)


def test_the_table_checks_can_fail(browser, tmp_path):
    """A table too wide for the column at 1400 px is caught; on a phone, a wide table in a plain
    scrolling box, and one whose pinned cells are transparent, are caught, while the same table
    as the book draws it (sc.table in a cell's output, book.css) keeps its labels."""
    import pandas as pd

    css = (SITE / "_static" / "book.css").as_uri()
    frame = pd.DataFrame({f"column {i}": [1.5 + i, 2.5 + i] for i in range(14)})
    frame.insert(0, "row label", ["first row", "second row"])
    html = sc.table(frame, "Fourteen columns").to_html()
    book = f'<div class="cell_output"><div class="output text_html">{html}</div></div>'
    plain = f'<div style="overflow-x: auto">{html}</div>'
    clear = (
        "<style>.bd-content table.book-table td, .bd-content table.book-table th"
        " { background: transparent !important; }</style>"
    )
    script = f'<script src="{(SITE / "_static" / "book.js").as_uri()}"></script>'
    found = {}
    for name, body in [
        ("book", book),
        ("plain", plain),
        ("clear", clear + book),
        ("folded", book + script),
    ]:
        page = tmp_path / f"{name}.html"
        page.write_text(
            f'<link rel="stylesheet" href="{css}"><style>{THEME_COLOURS}</style><main>'
            f'<article class="bd-content" style="width: 784px; max-width: 100%">{body}</article>'
            "</main>"
        )
        found[name] = (table_measures(browser, page, DESKTOP), table_measures(browser, page, PHONE))
    assert too_wide(found["book"][0]), "a 15-column table fits 784 px: the control is too small"
    assert not unpinned(found["book"][1]) and too_wide(found["book"][1]), found["book"][1]
    assert unpinned(found["plain"][1]) and unpinned(found["clear"][1]), found
    # book.js folds the columns that do not fit at 1400 px, and keeps them all on a phone
    assert not too_wide(found["folded"][0]) and too_wide(found["folded"][1]), found["folded"]


HTTP_ROOT = "http://book.test/"  # the built site as a server would give it, see http_page


def http_page(browser, width=DESKTOP):
    """A browser page that reads the built site from HTTP_ROOT. The browser's network namespace
    has only its own loopback, so no server outside it is reachable: Playwright's router answers
    each request from _build/html with the Content-Type `python -m http.server` would send."""
    import http.server
    import types

    served = http.server.SimpleHTTPRequestHandler
    handler = types.SimpleNamespace(extensions_map=served.extensions_map)
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = context.new_page()
    outside, errors = [], []

    def route(r):
        url = r.request.url
        if url.startswith(HTTP_ROOT):
            path = SITE / unquote(urlsplit(url).path).lstrip("/")
            if path.is_dir():
                path = path / "index.html"
            if path.is_file():
                kind = served.guess_type(handler, str(path))
                r.fulfill(path=str(path), headers={"Content-Type": kind})
            else:
                r.fulfill(status=404, body="not found")
        elif url.startswith("file://"):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return context, page, outside, errors


SEARCH_WORD = "residual"  # a word of chapter 2's body text, not of its title


def search_contexts(browser, over_http):
    """The text shown under each search hit for SEARCH_WORD, over http or from disk."""
    if over_http:
        context, page, outside, errors = http_page(browser)
        url = f"{HTTP_ROOT}search.html?q={SEARCH_WORD}"
    else:
        context, page, outside, errors = new_page(browser, DESKTOP)
        url = (SITE / "search.html").as_uri() + f"?q={SEARCH_WORD}"
    page.goto(url, wait_until="load")
    page.wait_for_function(
        "() => document.querySelectorAll('#search-results li').length > 0", timeout=20000
    )
    page.wait_for_timeout(2000)  # each hit's text is fetched after the list appears
    hits = page.evaluate("() => document.querySelectorAll('#search-results li').length")
    shown = page.evaluate(
        "() => [...document.querySelectorAll('#search-results li p.context')]"
        ".map(p => p.textContent)"
    )
    context.close()
    assert not outside and not errors, (outside, errors)
    return hits, shown


def test_search_shows_the_text_around_each_match_over_http(browser):
    """Served over http, every hit shows a line of its page's text around the word (Sphinx's
    search summary); from disk, where a browser refuses to fetch the pages, the hits show no
    text and log no error: the same check rejects that list."""
    hits, shown = search_contexts(browser, over_http=True)
    assert hits >= 3 and len(shown) == hits, (hits, shown)
    assert all(SEARCH_WORD in text.lower() for text in shown), shown
    hits_on_disk, shown_on_disk = search_contexts(browser, over_http=False)
    assert hits_on_disk == hits and not shown_on_disk, shown_on_disk


def notebook_download(browser, over_http):
    """The file a click on chapter 1's "Download this chapter as a notebook" gives, or None
    when the click shows the notebook in the browser instead of saving it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if over_http:
        context, page, outside, errors = http_page(browser)
        page.goto(f"{HTTP_ROOT}book/ch1_models.html", wait_until="load")
    else:
        context, page, outside, errors = new_page(browser, DESKTOP)
        page.goto((SITE / "book" / "ch1_models.html").as_uri(), wait_until="load")
    link = page.locator("main a.download").first
    try:
        with page.expect_download(timeout=5000) as download:
            link.click()
        name = download.value.suggested_filename
    except PlaywrightTimeout:
        name = None
    context.close()
    assert not outside, outside
    return name


def test_the_chapter_notebook_downloads_over_http(browser):
    """Over http the chapter's notebook link saves the .ipynb; opened from disk, Chromium shows
    the JSON instead (the README says to serve the site for that reason): the control."""
    assert notebook_download(browser, over_http=True) == "ch1_models.ipynb"
    assert notebook_download(browser, over_http=False) is None


# Where the theme's "Back to top" pill and chapter 5's knob overlap on a phone: the page is
# scrolled to each position from where the knob comes into view to where it leaves, then 60 px
# back up (the theme shows the pill when the reader scrolls up), and the pill's box is compared
# with the knob's.
PILL_OVER_KNOB = """async () => {
    const knob = document.querySelector('[data-knob]');
    const pill = document.getElementById('pst-back-to-top');
    const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    const top = knob.getBoundingClientRect().top + window.scrollY;
    const bottom = top + knob.offsetHeight;
    const overlaps = [];
    let shown = 0;
    for (let y = Math.max(0, top - window.innerHeight); y < bottom; y += 40) {
        window.scrollTo({top: y + 60, behavior: 'instant'});  // the theme scrolls smoothly
        await frame();
        window.scrollTo({top: y, behavior: 'instant'});
        await frame();
        const p = pill.getBoundingClientRect(), k = knob.getBoundingClientRect();
        const drawn = getComputedStyle(pill).display !== 'none'
            && getComputedStyle(pill).visibility !== 'hidden' && p.width > 0;
        shown += drawn;
        const apart = p.right <= k.left || p.left >= k.right || p.bottom <= k.top
            || p.top >= k.bottom;
        if (drawn && !apart) overlaps.push(y);
    }
    return {overlaps, shown};
}"""


def pill_over_knob(browser, page_path):
    """PILL_OVER_KNOB on a page at 390 x 844."""
    context, page, outside, errors = new_page(browser, PHONE)
    page.set_viewport_size({"width": PHONE, "height": PHONE_SCREEN})
    page.goto(page_path.as_uri(), wait_until="load")
    settle(page)
    found = page.evaluate(PILL_OVER_KNOB)
    context.close()
    assert not outside and not errors, (outside, errors)
    return found


def test_the_back_to_top_pill_keeps_clear_of_the_knob_on_a_phone(browser):
    found = pill_over_knob(browser, SITE / "book" / "ch5_walltime.html")
    print(f"the pill showed at {found['shown']} scroll positions over the knob's stretch")
    assert found["shown"] > 0, "the pill never showed: the check saw nothing"
    assert not found["overlaps"], f"the pill covers the knob at scroll {found['overlaps']}"


def test_the_pill_check_can_fail(browser, tmp_path):
    """Without the book's script the theme's pill sits on the knob: the check sees it."""
    page = tmp_path / "book" / "ch5_walltime.html"
    page.parent.mkdir()
    html = (SITE / "book" / "ch5_walltime.html").read_text(encoding="utf-8")
    page.write_text(
        re.sub(r'<script src="../_static/book.js[^"]*"></script>', "", html)
        .replace('"../_static/', f'"{SITE.as_uri()}/_static/')
        .replace('"../_images/', f'"{SITE.as_uri()}/_images/'),
        encoding="utf-8",
    )
    overlaps = pill_over_knob(browser, page)["overlaps"]
    print(f"without book.js the pill covered the knob at {len(overlaps)} scroll positions")
    assert overlaps
