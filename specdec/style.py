"""All chapters: the book's one figure style, the figure every plot starts from, and tables
for people (`table`, `number`).

Sized to be read on a phone; colours from the Okabe–Ito palette, safe for colour blindness;
lines that differ without colour (dashes and markers as well).
"""

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
BOOK_STYLE = {  # sized to be read on a phone: a 6.4-inch figure shows at 342 px wide there
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,  # displayed at 100 px per inch, stored at 200 (retina PNG, below)
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 14,
    "axes.titlesize": 14.5,
    "axes.labelsize": 14,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 12.5,  # with the ticks, at least 9 CSS px on a phone (tests/test_site.py)
    "lines.linewidth": 2,
    "lines.markersize": 7,
    "svg.hashsalt": "exact-by-construction",
    "axes.prop_cycle": __import__("cycler").cycler(color=OKABE_ITO),
}


SMALLEST_TEXT_KEY = "Smallest text (pt)"  # the PNG text chunk that records smallest_text


def smallest_text(fig):
    """The smallest font size, in points, of the text a figure draws."""
    from matplotlib.text import Text

    fig.draw_without_rendering()  # places the tick labels
    texts = fig.findobj(Text)
    return float(min(t.get_fontsize() for t in texts if t.get_visible() and t.get_text().strip()))


def _retina_png(fig):
    """The retina PNG IPython shows, with the figure's smallest text size in a text chunk."""
    from IPython.core.pylabtools import retina_figure

    return retina_figure(fig, metadata={SMALLEST_TEXT_KEY: f"{smallest_text(fig):.2f}"})


def _use_retina_png():
    """In a notebook, show figures as PNG at twice their display resolution (sharp on phones),
    each recording its smallest text size for the site's tests."""
    from IPython import get_ipython
    from matplotlib.figure import Figure
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    shell = get_ipython()
    if shell is not None:
        set_matplotlib_formats("retina")
        shell.display_formatter.formatters["image/png"].for_type(Figure, _retina_png)


def new_figure(ncols=1, nrows=1, figsize=None, **kwargs):
    """A figure in the book's style, kept out of pyplot: it shows only where it is displayed."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    mpl.rcParams.update(BOOK_STYLE)
    _use_retina_png()
    fig = Figure(figsize=figsize)  # not registered with pyplot, so a folded cell shows no copy
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _legend_on_top(ax, ncol=2):
    """A legend in head room added above the data."""
    ax.set_ylim(top=ax.get_ylim()[1] * 1.3)
    ax.legend(ncol=ncol, loc="upper right")


DASHES = ["-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)), (0, (3, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def _series(i, n_points=None):
    """Style of the i-th line: colour, dash and marker, so lines differ without colour."""
    style = {"color": OKABE_ITO[i % 7], "linestyle": DASHES[i % 6], "marker": MARKERS[i % 7]}
    if n_points:  # a marker every sixth of the line, staggered so markers do not pile up
        step = max(1, n_points // 6)
        style["markevery"] = ((i * step) // 7 % step, step)
    return style


def number(x, digits=3):
    """A number as a reader reads it: integers with thousands separators, other values to
    `digits` significant figures in plain decimals (never e-notation), a true minus sign, and
    a dash for a missing value. Infinity is spelled out; a table that can hold it should say
    in its caption what it means."""
    import math
    import numbers

    if x is None or (isinstance(x, numbers.Real) and math.isnan(x)):
        return "—"
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return str(x)
    if math.isinf(x):
        return "infinite" if x > 0 else "−infinite"
    if float(x).is_integer() and (isinstance(x, numbers.Integral) or abs(x) >= 10**digits):
        text = f"{int(x):,}"
    else:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(x)))) if x else 0
        text = f"{x:,.{decimals}f}"
    return text.replace("-", "−")


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(exponent):
    """10 to an integer power, as prose writes it: power_of_ten(-15) is "10⁻¹⁵"."""
    return "10" + str(int(exponent)).translate(_SUPERSCRIPT)


def times_ten(x, digits=2, sep=" "):
    """A value far from 1 as prose writes it, never in e-notation: times_ten(6.9e-18) is
    "6.9 × 10⁻¹⁸" (`digits` significant figures, `sep` around the ×, a true minus), and an
    exact zero is "0"."""
    if not x:
        return "0"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}{sep}×{sep}{power_of_ten(exponent)}".replace("-", "−")


def table(frame, caption, formats=None, digits=3, lead=()):
    """A data frame as a table for people: a caption, named columns, no pandas index (a named
    index becomes ordinary columns; a bare 0…N index is dropped), and numbers through `number`
    (or `formats`, a dict of column → format string or function). `lead` names the columns the
    prose cites, moved beside the first (label) column, which a phone keeps pinned while the rest
    scrolls. Returns a pandas Styler with a fixed id, so two builds write the same HTML."""
    import hashlib

    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("caption must be a non-empty string: say what the table shows")
    named = any(name is not None for name in frame.index.names)
    frame = frame.reset_index() if named else frame.reset_index(drop=True)
    if isinstance(frame.columns, pd.MultiIndex):
        frame.columns = [" ".join(str(c) for c in col if str(c)) for col in frame.columns]
    frame.columns = [str(c) for c in frame.columns]
    unknown = set(formats or {}) - set(frame.columns)
    if unknown:
        raise ValueError(f"formats names columns the table does not have: {sorted(unknown)}")
    if isinstance(lead, str) or set(lead) - set(frame.columns):
        raise ValueError(f"lead must list columns of the table, got {lead!r}")
    label = frame.columns[0]
    moved = [c for c in lead if c != label]
    frame = frame[[label, *moved, *(c for c in frame.columns[1:] if c not in moved)]]
    shown = {c: (lambda x, d=digits: number(x, d)) for c in frame.columns}
    shown.update(formats or {})
    uuid = hashlib.sha256((caption + "|".join(frame.columns)).encode()).hexdigest()[:8]
    return (
        frame.style.format(shown)
        .hide(axis="index")
        .set_caption(caption)
        .set_uuid(uuid)
        .set_table_attributes('class="dataframe book-table"')
    )
