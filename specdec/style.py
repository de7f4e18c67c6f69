"""All chapters: the book's one figure style, and the figure every plot starts from.

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
