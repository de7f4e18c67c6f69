"""Chapter 5: the knob a reader turns on the static site, Theorem 3.8 under sliders for w, γ, c.

`knob_html` returns one HTML fragment that needs no kernel and no network: three sliders, two
charts drawn by uPlot 1.6.32 (vendored in specdec/vendor, MIT licence, 51 KB), the core's exact
α(w) for w = 0, 0.01, ..., 1 as Python floats, and specdec/knob.js, which applies Equation 1 and
Theorem 3.8 to those α. The library, the numbers and the code are inline, so the figure works
in a page opened from disk, in the single-page build and in a trusted notebook, and only the
page that shows it carries it (Jupyter Book adds every .js file in _static/ to every page).
Two calls with the same arguments give the same bytes: fixed ids, floats written by `repr`.
"""

import html
import json
import re
from pathlib import Path

from .checks import _check_count, _check_nonnegative, _check_unit_interval
from .style import OKABE_ITO
from .theory import alpha_exact

KNOB_POINTS = 101  # w = 0, 0.01, ..., 1: the w slider's steps
KNOB_MAX_GAMMA = 10  # the γ slider runs from 0 (plain decoding) to 10
KNOB_MAX_COST = 1.0  # the c slider runs from 0 to 1 in steps of 0.01
_HERE = Path(__file__).parent
UPLOT = _HERE / "vendor" / "uplot-1.6.32.iife.min.js"
_UPLOT_CSS = _HERE / "vendor" / "uplot-1.6.32.min.css"
_GLUE = _HERE / "knob.js"

_STYLE = """
.knob { margin: 0.5em 0 1em; }
.knob-controls { display: grid; gap: 0.3em 1.2em;
  grid-template-columns: repeat(auto-fit, minmax(11em, 1fr)); }
.knob-controls label { display: flex; align-items: center; gap: 0.5em; }
.knob-controls input { flex: 1; min-width: 0; accent-color: #0072B2; }
.knob-controls output { min-width: 2.4em; font-variant-numeric: tabular-nums; }
.knob-readout { margin: 0.6em 0 0.2em; }
.knob-title { font-weight: 600; margin: 0.8em 0 0; }
.knob .u-legend { font-size: 13px; }
@media print { .knob-controls { display: none; } }
"""


def knob_data(points=KNOB_POINTS, max_gamma=KNOB_MAX_GAMMA):
    """The figure's numbers: w on an even grid of `points` from 0 to 1, the core's exact α(w) at
    each as a Python float, the largest γ shown, and the book's colours."""
    _check_count(points, "points", 1001, "the page carries every α")
    _check_count(max_gamma, "max_gamma", 64, "Equation 1's sum form, as the core sums it")
    if points < 2:
        raise ValueError(f"points must be at least 2 (a grid from 0 to 1), got {points}")
    ws = [i / (points - 1) for i in range(points)]
    return {
        "w": ws,
        "alpha": [float(alpha_exact(w)) for w in ws],
        "max_gamma": max_gamma,
        "colors": [OKABE_ITO[0], OKABE_ITO[1], "#555555"],
    }


def _slider(name, symbol, value, low, high, step, shown):
    """One labelled range input with the value it shows beside it."""
    return (
        f'<label>{symbol} <input type="range" name="{name}" min="{low}" max="{high}" '
        f'step="{step}" value="{value}" aria-label="{symbol}">'
        f'<output data-say="{name}">{shown}</output></label>'
    )


def knob_html(w=0.9, gamma=4, c=0.1, name="knob"):
    """The interactive figure as one self-contained HTML fragment: sliders for w (steps of
    0.01), γ (0 to 10) and c (0 to 1, steps of 0.01) at the given starting values, over the
    projected speedup against γ and against w. `name` is the fragment's id."""
    _check_unit_interval(w, "w")
    _check_count(gamma, "gamma", KNOB_MAX_GAMMA, "the γ slider's range")
    _check_nonnegative(c, "c")
    if c > KNOB_MAX_COST:
        raise ValueError(f"c must be at most {KNOB_MAX_COST} (the c slider's range), got {c!r}")
    for value, label in ((w, "w"), (c, "c")):
        if abs(value * 100 - round(value * 100)) > 1e-9:
            raise ValueError(f"{label} must be a multiple of 0.01 (a slider step), got {value!r}")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,40}", name):
        raise ValueError(f"name must be a short lowercase id such as 'knob', got {name!r}")
    data = json.dumps(knob_data(), separators=(",", ":")).replace("</", "<\\/")
    sliders = [
        _slider("w", "w", f"{w:.2f}", 0, 1, 0.01, f"{w:.2f}"),
        _slider("gamma", "γ", gamma, 0, KNOB_MAX_GAMMA, 1, gamma),
        _slider("c", "c", f"{c:.2f}", 0, KNOB_MAX_COST, 0.01, f"{c:.2f}"),
    ]
    say = '<span data-say="{}"></span>'.format
    readout = (
        f"α(w) = {say('alpha')}; at this γ, {say('tokens')} tokens per target call, "
        f"projected {say('speedup')}× faster; best γ up to {KNOB_MAX_GAMMA}: {say('best')}."
    )
    fallback = (
        "The sliders of this figure run in the book's web page, or here once the cell has run "
        "in a trusted notebook; in a live kernel, sc.widget_panel() gives them too."
    )
    charts = [
        ("title-gamma", "Projected speedup against γ", "Speedup against γ at"),
        ("title-w", "Projected speedup against the draft weight w", "Speedup against w at"),
    ]
    drawn = "".join(
        f'<p class="knob-title">{title} {say(key)}</p>'
        f'<div class="knob-chart" role="img" aria-label="{html.escape(label)}"></div>'
        for key, label, title in charts
    )
    parts = [
        f'<div class="knob" id="{name}" data-knob>',
        f"<style>{_UPLOT_CSS.read_text()}{_STYLE}</style>",
        f'<div class="knob-controls">{"".join(sliders)}</div>',
        f'<p class="knob-readout" aria-live="polite">{readout}</p>',
        drawn,
        f'<p class="knob-fallback">{fallback}</p>',
        f'<script type="application/json" class="knob-data">{data}</script>',
        f"<script>{UPLOT.read_text()}</script>",
        f"<script>{_GLUE.read_text()}</script>",
        "</div>",
    ]
    return "\n".join(parts)


class Knob:
    """The interactive figure for a notebook or a page: displays as `knob_html`'s fragment."""

    def __init__(self, w=0.9, gamma=4, c=0.1, name="knob"):
        self.html = knob_html(w, gamma, c, name)
        self._shown = f"Knob(w={w!r}, gamma={gamma!r}, c={c!r}): sliders in an HTML page"

    def __repr__(self):  # the plain-text output, the same on every run (no memory address)
        return self._shown

    def _repr_html_(self):
        return self.html
