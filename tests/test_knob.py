"""Chapter 5's knob (specdec/knob.py): the book's numbers under sliders, offline, on the site.

The browser tests reuse tests/test_site.py's Chromium (its own network namespace, every
non-file request blocked). The built page is KNOB_PAGE, by default the full site's chapter 5;
point it at a single-page build (RULES.md) to run the site test without the full build."""

import io
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_site import browser, new_page, settle  # noqa: F401  (browser: the fixture)

import specdec_core as sc

ROOT = Path(__file__).resolve().parents[1]
KNOB_PAGE = Path(os.environ.get("KNOB_PAGE", ROOT / "_build/html/book/ch5_walltime.html"))
WIDTHS = (390, 1400)
WIRING = 'addEventListener("input", update)'  # knob.js: the one line that wires the sliders
CHANGED = 100  # pixels: a redraw moves whole curves (thousands); an unchanged chart moves none
REQUEST = re.compile(r"""\b(src|href)\s*=|url\(|import\(|fetch\(|XMLHttpRequest|sendBeacon""")


# ---- the numbers and the fragment, no browser ----------------------------------------------


def test_the_data_are_the_cores_exact_alpha_as_python_floats():
    data = sc.knob_data()
    assert data["w"] == [i / 100 for i in range(101)]
    assert data["alpha"] == [sc.alpha_exact(w) for w in data["w"]]
    assert all(type(a) is float for a in data["alpha"]) and data["max_gamma"] == 10


def test_the_fragment_is_the_same_bytes_every_time_and_requests_nothing():
    fragment = sc.knob_html()
    assert fragment == sc.knob_html() and 'id="knob"' in fragment
    assert not REQUEST.search(fragment), REQUEST.search(fragment)
    assert sc.Knob()._repr_html_() == fragment and repr(sc.Knob()) == repr(sc.Knob())


def test_the_request_check_can_fail():
    for bad in ('<script src="x.js">', "<img href='a'>", "fetch('x')", "background: url(x)"):
        assert REQUEST.search(sc.knob_html() + bad)


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"w": 1.5}, "w"),
        ({"w": 0.905}, "w"),
        ({"w": float("nan")}, "w"),
        ({"gamma": 11}, "gamma"),
        ({"gamma": 2.5}, "gamma"),
        ({"c": -0.1}, "c"),
        ({"c": 2}, "c"),
        ({"c": 0.125}, "c"),
        ({"name": "Not an id"}, "name"),
    ],
)
def test_bad_starting_values_are_refused_by_name(arguments, name):
    with pytest.raises(ValueError, match=f"^{name} "):
        sc.knob_html(**arguments)


# ---- the page's JavaScript applies the core's formulas ---------------------------------------


def standalone(folder, fragment):
    """A bare page around a fragment, as a notebook or another site would hold it."""
    page = folder / "knob.html"
    page.write_text(f"<!doctype html><meta charset='utf-8'><body>{fragment}</body>")
    return page


COSTS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
JS_TABLE = """([alphas, costs, top]) => alphas.map(a => costs.map(c => [...Array(top + 1).keys()]
    .map(g => [specdecKnob.tokens(a, g), specdecKnob.speedup(a, g, c),
               specdecKnob.bestGamma(a, c, top)])))"""


def mismatches(table, alphas, shift=0):
    """Where the page's (tokens, speedup, best γ) differ from the core's, beyond a float's last
    digits (1e-13 relative: the browser's pow and C's may round the last bit differently)."""
    out = []
    for a, rows in zip(alphas, table):
        for c, row in zip(COSTS, rows):
            for g, (tokens, speedup, best) in enumerate(row):
                want = (
                    sc.expected_tokens(a, g + shift),
                    sc.walltime_speedup(a, g + shift, c),
                    sc.optimal_gamma(a, c, sc.KNOB_MAX_GAMMA),
                )
                close = all(abs(x - y) <= 1e-13 * abs(y) for x, y in zip((tokens, speedup), want))
                if not close or best != want[2]:
                    out.append((a, c, g, (tokens, speedup, best), want))
    return out


def test_the_pages_numbers_are_the_cores(browser, tmp_path):  # noqa: F811
    """Equation 1, Theorem 3.8 and the best γ as the page computes them, at every α of the grid,
    every γ and seven costs, equal the core's; the control, the core one γ further, does not."""
    context, page, outside, errors = new_page(browser, 1400)
    page.goto(standalone(tmp_path, sc.knob_html()).as_uri())
    alphas = sc.knob_data()["alpha"]
    table = page.evaluate(JS_TABLE, [alphas, list(COSTS), sc.KNOB_MAX_GAMMA])
    context.close()
    assert not outside and not errors, (outside, errors)
    assert not mismatches(table, alphas)
    assert len(mismatches(table, alphas, shift=1)) > len(alphas) * len(COSTS)


# ---- moving a slider changes what is drawn ----------------------------------------------------


def redraws(page, slider, fraction):
    """Pixels of the knob's charts that change when a reader clicks `slider` at `fraction` of
    its width (the knob must be the page's only one)."""
    charts = page.locator("[data-knob] .knob-chart")
    before = [charts.nth(k).screenshot() for k in range(charts.count())]
    handle = page.locator(f"[data-knob] input[name={slider}]")
    handle.scroll_into_view_if_needed()
    box = handle.bounding_box()
    page.mouse.click(box["x"] + fraction * box["width"], box["y"] + box["height"] / 2)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    after = [charts.nth(k).screenshot() for k in range(charts.count())]
    pixels = [
        [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in shots]
        for shots in (before, after)
    ]
    return int(  # a chart whose size changed counts as changed everywhere
        sum(
            np.any(old != new, axis=-1).sum() if old.shape == new.shape else new.size // 3
            for old, new in zip(*pixels)
        )
    )


def knob_changes(browser, page_path, width):  # noqa: F811
    """{slider: pixels changed} for each slider moved once on a page, with what went wrong."""
    context, page, outside, errors = new_page(browser, width)
    page.goto(page_path.as_uri(), wait_until="load")
    settle(page)
    assert page.locator("[data-knob]").count() == 1, "the page must hold one knob"
    drawn = page.locator("[data-knob] canvas").count()
    changes = {name: redraws(page, name, f) for name, f in (("w", 0.2), ("gamma", 0.9), ("c", 0.6))}
    context.close()
    return changes, drawn, outside, errors


@pytest.mark.site
@pytest.mark.parametrize("width", WIDTHS)
def test_moving_a_slider_redraws_the_figure(browser, width):  # noqa: F811
    assert KNOB_PAGE.exists(), f"{KNOB_PAGE}: build the site (make) or set KNOB_PAGE"
    changes, drawn, outside, errors = knob_changes(browser, KNOB_PAGE, width)
    assert not outside and not errors, (outside, errors)
    assert drawn == 2, f"{drawn} charts drawn"
    assert all(n > CHANGED for n in changes.values()), changes


@pytest.mark.site
def test_the_redraw_check_fails_on_a_page_whose_sliders_are_not_wired(browser, tmp_path):  # noqa: F811
    """The same page with the sliders' one listener cut: the sliders move, the charts do not."""
    assert KNOB_PAGE.exists(), f"{KNOB_PAGE}: build the site (make) or set KNOB_PAGE"
    html = KNOB_PAGE.read_text(encoding="utf-8")
    assert html.count(WIRING) == 1
    base = f'<base href="{KNOB_PAGE.parent.as_uri()}/">'
    unwired = html.replace(WIRING, 'addEventListener("unwired", update)').replace(
        "<head>", "<head>" + base, 1
    )
    (tmp_path / "unwired.html").write_text(unwired, encoding="utf-8")
    changes, drawn, outside, errors = knob_changes(browser, tmp_path / "unwired.html", 1400)
    assert not outside and not errors and drawn == 2, (outside, errors, drawn)
    assert not any(n > CHANGED for n in changes.values()), changes
