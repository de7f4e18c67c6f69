"""Chapter 9's roofline: every model's call against this machine's roofs, and an H100's.

`roofline_points` times one call of each model at n = 1 and 5 positions (`roofs._position_costs`)
with its FLOP and bytes of weights; `plot_roofline` draws them under the roofs that
`roofs.machine_rates` measured, one panel per implementation, and below them an H100's roofline
computed from its datasheet (no point on it is a measurement).
"""

import numpy as np
import pandas as pd

from .pair import model_style
from .roofs import _position_costs, matrix_weights
from .style import OKABE_ITO, new_figure
from .transformer import one_blas_thread

# A data-centre GPU's published rates, for the computed (never measured) panel: NVIDIA's H100
# SXM datasheet gives 3.35 TB/s of HBM3 bandwidth and 1,979 TFLOP/s of BF16 tensor throughput
# with sparsity, so about 989 TFLOP/s dense (https://www.nvidia.com/en-us/data-center/h100/).
H100_BYTES_PER_S, H100_FLOPS, H100_BYTES_PER_WEIGHT = 3.35e12, 989e12, 2  # BF16 weights


def roofline_points(models, positions=(1, 5), repeats=7, context=48):
    """Rows {model, implementation, n, seconds, flops, bytes} of one call scoring n positions
    after `context` cached ones, for each (model label, implementation label): model."""
    ids = np.arange(context + max(positions)) % 7  # ids every model knows
    rows = []
    with one_blas_thread():
        for (label, implementation), model in models.items():
            times = _position_costs(model, ids, context, list(positions), repeats)
            weights = matrix_weights(model.config)
            for n in positions:
                rows.append(
                    {
                        "model": label,
                        "implementation": implementation,
                        "n": n,
                        "seconds": times[n],
                        "flops": 2.0 * weights * n,
                        "bytes": 4.0 * weights,
                    }
                )
    return pd.DataFrame(rows)


IMPLEMENTATIONS = {"numpy": "numpy", "runtime": "ONNX Runtime"}  # panel titles of the roofline


def _roofs(ax, rates):
    """This machine's three roofs on ax, each to its ridge: reads from L3 (dashed) and from
    DRAM (solid), and the GEMM rate (dash-dot), in GFLOP/s against FLOP per byte."""
    ridge = rates.gemm / np.array([rates.l3_read, rates.dram_read])  # FLOP per byte
    for read, end, style in zip((rates.l3_read, rates.dram_read), ridge, ("--", "-")):
        x = np.geomspace(0.01, end, 50)
        ax.plot(x, read * x / 1e9, color="black", linestyle=style, linewidth=1.6)
    ax.plot([ridge.min(), 1e3], [rates.gemm / 1e9] * 2, color="black", linestyle="-.")


def plot_roofline(points, rates):
    """Rooflines, one above the other: this machine's, measured, a panel for each
    implementation (roofs from `rates`; each model its colour and marker from `pair.model_style`,
    a line from n = 1 to n = 5 positions, models set a little apart sideways so that no two
    markers overlap), then an H100's, computed from its datasheet for BF16 weights (no point on
    it is a measurement). The legend sits above the panels, outside the data."""
    from matplotlib.lines import Line2D

    kinds = list(dict.fromkeys(points.implementation))
    fig, axes = new_figure(nrows=len(kinds) + 1, figsize=(6.4, 3.9 * len(kinds) + 5.2))
    fig.set_layout_engine("constrained")
    models = list(dict.fromkeys(points.model))
    apart = 1.12 ** (np.arange(len(models)) - (len(models) - 1) / 2)  # sideways, ×1.12 apart
    for ax, kind in zip(axes, kinds):
        _roofs(ax, rates)
        for model, shift in zip(models, apart):
            rows = points[(points.model == model) & (points.implementation == kind)]
            ax.plot(
                rows.flops / rows.bytes * shift,
                rows.flops / rows.seconds / 1e9,
                linestyle=":",  # a model's two calls, joined: dotted, unlike every roof
                linewidth=1.5,
                markersize=10,
                **model_style(model),
            )
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(0.3, 10),
            ylim=(0.1, 3 * rates.gemm / 1e9),
            ylabel="GFLOP/s, one thread",
            title=f"{IMPLEMENTATIONS.get(kind, kind)}: this machine, measured",
        )
        ax.set_xticks([0.5, 1, 2.5, 5], ["0.5\nn = 1", "1", "2.5\nn = 5", "5"])
        ax.set_xlabel("FLOP per byte of weights (n/2)")
    handles = [
        Line2D([], [], color="black", linestyle=style, label=label)
        for style, label in [
            ("--", f"L3 roof, {rates.l3_read / 1e9:.0f} GB/s"),
            ("-", f"DRAM roof, {rates.dram_read / 1e9:.0f} GB/s"),
            ("-.", f"GEMM roof, {rates.gemm / 1e9:.0f} GFLOP/s"),
        ]
    ] + [Line2D([], [], linestyle=":", markersize=10, label=m, **model_style(m)) for m in models]
    fig.legend(handles=handles, loc="outside upper center", ncol=2)
    bottom, ridge = axes[-1], H100_FLOPS / H100_BYTES_PER_S
    x = np.logspace(-1, 3.5, 200)
    bottom.plot(x, np.minimum(H100_FLOPS, H100_BYTES_PER_S * x) / 1e12, "k-")
    for n in (1, 5, 64):
        intensity = n * 2 / H100_BYTES_PER_WEIGHT
        reached = min(H100_FLOPS, H100_BYTES_PER_S * intensity) / 1e12
        bottom.plot(intensity, reached, "o", color=OKABE_ITO[0], markersize=9)
        bottom.annotate(
            f"n = {n}",
            (intensity, reached),
            textcoords="offset points",
            xytext=(8, -16),
            fontsize=13,
        )
    bottom.axvline(ridge, color="k", linestyle=":", linewidth=1)
    bottom.set(
        xscale="log",
        yscale="log",
        xlim=(0.5, 3000),
        xlabel="FLOP per byte of weights (n, BF16)",
        ylabel="TFLOP/s",
    )
    bottom.set_title(f"An H100, computed: ridge at n ≈ {ridge:.0f}")
    return fig
