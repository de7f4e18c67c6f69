"""Every figure: made by code, labelled, reproducible, placed with a caption, name and alt."""

import io
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import specdec_core as sc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.md"))


@pytest.mark.parametrize("name", list(sc.FIGURES))
def test_each_figure_builds_with_labelled_axes(name):
    figure = sc.FIGURES[name]()
    for axes in figure.axes:
        if axes.get_label() == "<colorbar>":
            continue
        assert axes.get_xlabel() and axes.get_ylabel() and axes.get_title(), name
    plt.close(figure)


def svg(figure):
    """The figure as SVG text, without its creation date."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    return buffer.getvalue()


def test_figures_are_reproducible():
    for name in ("ch1-sampling-check", "ch4-tokens-vs-w"):
        assert svg(sc.FIGURES[name]()) == svg(sc.FIGURES[name]())


def glue_figure_blocks(text):
    """The option lines and the caption of each glue:figure directive in a chapter."""
    return re.findall(r"```\{glue:figure\} (\S+)\n((?::\w+:[^\n]*\n)*)\n(.+?)```", text, flags=re.S)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_placed_figure_has_a_name_alt_text_and_caption(chapter):
    text = chapter.read_text()
    blocks = glue_figure_blocks(text)
    assert len(blocks) == text.count("{glue:figure}")
    for key, options, caption in blocks:
        assert ":name: fig-" in options and re.search(r":alt: \S.{20,}", options), key
        assert len(caption.strip()) > 20, key
        assert f'glue("{key}"' in text, f"{key} is placed but never glued"


def test_the_figure_check_can_fail():
    assert (
        glue_figure_blocks("```{glue:figure} f\n:name: fig-f\n\nA caption long enough here.\n```")[
            0
        ][1]
        == ":name: fig-f\n"
    )


def test_the_live_panel_has_three_sliders_and_redraws():
    import ipywidgets

    panel = sc.widget_panel()
    sliders, output = panel.children
    assert [s.description for s in sliders.children] == ["w", "γ", "c"]
    assert not any(s.continuous_update for s in sliders.children)  # redraw on release only
    assert isinstance(output, ipywidgets.Output)
    sliders.children[0].value = 0.5  # moving a slider must not raise
    plt.close("all")


def test_the_panel_figure_reports_the_setting():
    figure = sc.plot_panel(w=1.0, gamma=4, c=0.0)
    assert figure.axes[0].get_title() == "w = 1, c = 0: γ = 4 gives 5.00×"
    plt.close(figure)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_is_referred_to_in_the_text(chapter):
    text = chapter.read_text()
    for name in re.findall(r":name: (fig-[\w-]+)", text):
        assert f"{{numref}}`{name}`" in text, f"{name} is never referred to"
