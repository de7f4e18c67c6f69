"""The built site (`make` builds it first): self-contained, links intact, no local paths, and
every page correct in a real browser (headless Chromium) with the network blocked."""

import functools
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
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


# ---- a real browser, offline -------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, Debian's; skipped (or failed, with REQUIRE_BROWSER=1) where missing."""
    if CHROMIUM is None:
        if os.environ.get("REQUIRE_BROWSER", "0") not in ("", "0"):
            pytest.fail("REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip(
            "SKIPPED the browser test: chromium is not installed (apt-get install chromium)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield launched
        launched.close()


def visit(browser, page_path):
    """Open a page from disk with every non-file request blocked; return what happened."""
    context = browser.new_context(offline=True)
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
    page.goto(page_path.as_uri(), wait_until="load")
    page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)")
    page.evaluate("() => window.MathJax ? MathJax.startup.promise : null")
    page.evaluate(
        "() => Promise.all([...document.images].map(i => { i.loading = 'eager'; "
        "return i.complete ? null : i.decode().catch(() => null); }))"
    )
    result = page.evaluate("""() => ({
        images: [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth, i.alt]),
        math: document.querySelectorAll('.math').length,
        typeset: document.querySelectorAll('.math mjx-container').length,
        rawTex: [...document.querySelectorAll('.math')].filter(e => /\\\\[(\\[]/.test(e.textContent)
                 && !e.querySelector('mjx-container')).length,
        text: document.querySelector('main') ? document.querySelector('main').innerText : ''
    })""")
    context.close()
    return result, outside, errors


@pytest.mark.parametrize("page_path", CONTENT_PAGES, ids=lambda p: p.stem)
def test_page_in_a_real_browser(browser, page_path):
    result, outside, errors = visit(browser, page_path)
    assert not outside, f"requests left the local site: {outside}"
    assert not errors, f"console errors: {errors}"
    assert all(width > 0 for _, width, _ in result["images"]), result["images"]
    assert all(len(alt) > 20 for _, _, alt in result["images"]), "an image without alt text"
    assert result["typeset"] == result["math"] and result["rawTex"] == 0
    assert not re.search(r"\\\(|\\\[|\$\$", result["text"]), "raw TeX left in the page"


def test_the_browser_check_can_fail(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        '<main><img src="missing.png"><img src="https://example.org/x.png">'
        '<span class="math">\\(x^2\\)</span><script>undefinedFunction()</script></main>'
    )
    result, outside, errors = visit(browser, page)
    assert outside == ["https://example.org/x.png"]
    assert errors and any(width == 0 for _, width, _ in result["images"])
    assert result["rawTex"] == 1
