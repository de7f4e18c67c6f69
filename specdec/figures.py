"""All chapters: every figure of the book in one look: the style, the plots, `FIGURES`.

Sized to be read on a phone; colours from the Okabe–Ito palette, safe for colour blindness;
measured points as markers over the exact curve as a line.
"""

import numpy as np

from .article import REAL_PAIR_ALPHAS
from .block import (
    BLOCK_GAMMA,
    RANDOM_PAIRS,
    block_sweep,
    random_pair_gains,
    rule_tokens_per_call,
    toy_tokens_per_call,
)
from .experiments import (
    N_DRAWS,
    SEEDS,
    acceptance_sweep,
    control_rows,
    joint_check,
    one_token_check,
    sampling_check,
)
from .lossy import LOSSY_KNOBS, lossy_frontier
from .models import (
    BOS,
    CONTEXT_INDEX,
    CONTEXTS,
    P_MATRIX,
    VOCAB,
    V,
    _check_context,
    draft_matrix,
    show_token,
)
from .multidraft import MD_CTX, MD_KS, MD_W, MULTI_DRAFT_RULES, multi_draft_rows, pair_optima
from .pair import BETA_SHOWN, heldout_betas, load_pair, plot_beta_histograms
from .pipelines import DETECT_LEVEL, DETECT_POWER, bug_rows
from .rule import _residual_weights, trace_run
from .stats import noise_reference
from .style import OKABE_ITO, _legend_on_top, _series, new_figure, number
from .theory import (
    alpha_exact,
    alpha_of,
    chain_stats,
    expected_tokens,
    markov_chain_stats,
    operations_increase,
    optimal_gamma,
    oracle_speedup,
    regime_models,
    unsmoothed_models,
    walltime_speedup,
)


def _token_axis(ax, labels=VOCAB, axis="x"):
    """Label an axis with the tokens, space shown as '␣'."""
    ticks, names = range(len(labels)), [show_token(t) for t in labels]
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, names)


def plot_target_heatmap(label_above=0.15):
    """Heatmap of the 19 × 18 target probabilities p(x | ctx); cells ≥ label_above carry values
    in percent (two digits fit a cell at a legible size)."""
    fig, ax = new_figure(figsize=(6.4, 6.4))
    image = ax.imshow(P_MATRIX, cmap="viridis")
    for (i, j), prob in np.ndenumerate(P_MATRIX):
        if prob >= label_above:
            ax.text(j, i, f"{100 * prob:.0f}", ha="center", va="center", fontsize=12.5)  # in %
    _token_axis(ax)
    _token_axis(ax, CONTEXTS, axis="y")
    ax.grid(False)
    ax.set(xlabel="next token x", ylabel="context (previous token)", title="Target p(x | context)")
    fig.colorbar(image, ax=ax, shrink=0.7, label="probability")
    return fig


def plot_draft_mixture(ctx="t", weights=(0.0, 0.3, 0.7, 1.0)):
    """Markers of q_w(· | ctx) for several w, from the unigram (w = 0) to the target (w = 1)."""
    _check_context(ctx)
    fig, ax = new_figure()
    x, shift = np.arange(V), 0.6 / len(weights)
    for i, (w, marker) in enumerate(zip(weights, "os^D")):
        label = f"w = {w:g}" + {0.0: " (unigram q0)", 1.0: " (target p)"}.get(w, "")
        ax.plot(
            x + (i - (len(weights) - 1) / 2) * shift,
            draft_matrix(w)[CONTEXT_INDEX[ctx]],
            marker,
            markersize=6,
            label=label,
        )
    _token_axis(ax)
    ax.set(
        xlabel="token x",
        ylabel=f"q_w(x | {show_token(ctx)})",
        title=f"The draft after '{show_token(ctx)}' as w moves from 0 to 1",
    )
    _legend_on_top(ax)
    return fig


def plot_residuals(comparison, title):
    """Frequency − exact probability per outcome (×1000), with the ±2σ band, σ = √(p(1 − p)/n)."""
    fig, ax = new_figure()
    x = np.arange(len(comparison.labels))
    gap, band = 1000 * (comparison.empirical - comparison.exact), 2000 * comparison.sigma
    ax.fill_between(x, -band, band, step="mid", color="grey", alpha=0.25, label="±2σ band")
    ax.axhline(0, color="black", linewidth=0.8)
    inside = np.abs(gap) <= band
    ax.plot(x[inside], gap[inside], "o", color=OKABE_ITO[0], label="inside the band")
    ax.plot(x[~inside], gap[~inside], "X", color=OKABE_ITO[3], markersize=9, label="outside")
    ax.set_xticks(x, [show_token(s) for s in comparison.labels])
    ax.set(xlabel="token x", ylabel="(frequency − p) × 1000", title=title)
    # below the token axis, clear of the data and of the y ticks (on a phone, a legend inside
    # the axes sat on the top tick's label)
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2), handlelength=1.2,
              columnspacing=1.0)  # fmt: skip
    return fig


STEP_STYLE = {  # the colours of Leviathan et al.'s illustration, and a hatch for each kind
    "accepted": {"facecolor": OKABE_ITO[2], "hatch": ""},
    "rejected": {"facecolor": OKABE_ITO[3], "hatch": "xx"},
    "resampled": {"facecolor": OKABE_ITO[0], "hatch": ".."},
    "bonus": {"facecolor": OKABE_ITO[5], "hatch": "//"},
    "not tested": {"facecolor": "white", "hatch": "", "linestyle": "--"},
}


def _token_box(ax, col, row, token, kind, height):
    """One token as a box styled by its kind (STEP_STYLE), the token written on white inside."""
    from matplotlib.patches import Rectangle

    style = STEP_STYLE[kind]
    ax.add_patch(Rectangle((col + 0.05, row - height / 2), 0.9, height, edgecolor="black", **style))
    ax.text(
        col + 0.5, row, show_token(token), ha="center", va="center", fontsize=15,
        color="grey" if kind == "not tested" else "black",
        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "linewidth": 0},
    )  # fmt: skip


def plot_step_trace(steps):
    """Each step of a run as a row of boxes: accepted, rejected, resampled, bonus, not tested."""
    from matplotlib.patches import Patch

    fig, ax = new_figure(figsize=(6.4, 0.65 * len(steps) + 1.9))
    for row, step in enumerate(steps):
        for col, (token, kind) in enumerate(step.boxes):
            _token_box(ax, col, row, token, kind, height=0.8)
    width = max(len(step.boxes) for step in steps)
    ax.set(xlim=(0, width), ylim=(len(steps) - 0.5, -0.5))
    ax.set_xticks([])
    ax.set_yticks(range(len(steps)), [f"{i + 1}" for i in range(len(steps))])
    ax.grid(False)
    ax.spines[["left", "bottom"]].set_visible(False)
    ax.set(xlabel="the step's tokens, left to right", ylabel="step")
    ax.set_title(f"{len(steps)} speculative steps, γ = {len(steps[0].draft)}")
    handles = [Patch(edgecolor="black", label=kind, **style) for kind, style in STEP_STYLE.items()]
    ax.legend(handles=handles, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    return fig


def plot_loop(step=None):
    """One speculative step as the loop it runs: q drafts γ tokens, p checks them in one call,
    the kept drafts and one token from p come out, and the next step starts after them. The
    default step is the second of chapter 2's traced run (two drafts kept, the third rejected)."""

    if step is None:
        step = trace_run(2, 4, 0.3, BOS, np.random.default_rng(SEEDS["trace"]))[1]
    kinds = [kind for _, kind in step.boxes]
    last = "bonus" if step.accepted == len(step.draft) else "resampled"
    emitted = ["accepted"] * step.accepted + [last]
    rows = (0, 1.35, 3.2)  # the draft, the tests, what comes out
    fig, ax = new_figure(figsize=(4.8, 4.1))  # narrow: it reads at a phone's width

    def box(col, row, token, kind, note=""):
        _token_box(ax, col, row, token, kind, height=0.76)
        if note:
            ax.text(col + 0.5, row + 0.4, note, ha="center", va="top", fontsize=12)

    for col, token in enumerate(step.draft):
        box(col, rows[0], token, "not tested")
    for col, (token, kind) in enumerate(zip(step.draft, kinds)):
        ran = col < len(step.uniforms)
        # each test draws a uniform r and keeps the draft when r < min(1, p/q)
        kept = kind == "accepted"
        note = (
            f"r {step.uniforms[col]:.2f}\n{'<' if kept else '≥'} {step.ratios[col]:.2f}"
            f"\n{'✓' if kept else '✗'}"
            if ran
            else ""
        )
        box(col, rows[1], token, kind if ran else "not tested", note)
    for col, (token, kind) in enumerate(zip(step.tokens, emitted)):
        box(col, rows[2], token, kind)
    right = len(step.draft) + 0.2
    ax.annotate(
        "", xy=(right, rows[0]), xytext=(right, rows[2]), arrowprops={
            "arrowstyle": "->", "connectionstyle": "arc3,rad=0.45", "linewidth": 1.8},
    )  # fmt: skip
    ax.text(right + 1.0, rows[1], "repeat\nfrom\nthe last\ntoken", va="center", fontsize=12)
    ax.set(xlim=(0, len(step.draft) + 2.1), ylim=(rows[2] + 0.5, rows[0] - 0.5))
    ax.set_xticks([])
    ax.set_yticks(rows, ["q drafts", "p checks", "emitted"])
    ax.grid(False)
    ax.spines[["left", "bottom"]].set_visible(False)
    ax.set(xlabel="kept (✓) when a uniform r < min(1, p/q)", ylabel="stage")
    ax.set_title(f"One step, γ = {len(step.draft)}: draft, verify, keep or resample")
    return fig


def plot_two_paths(ctx="t", w=0.3):
    """Per token: min(p, q) kept directly plus max(0, p − q) from the residual, against p and q."""
    _check_context(ctx)
    p, q = P_MATRIX[CONTEXT_INDEX[ctx]], draft_matrix(w)[CONTEXT_INDEX[ctx]]
    kept, moved = np.minimum(p, q), _residual_weights(p, q)
    fig, ax = new_figure()
    x = np.arange(V)
    ax.bar(x, kept, color=OKABE_ITO[0], label="min(p, q): drafted, kept")
    ax.bar(x, moved, bottom=kept, color=OKABE_ITO[1], hatch="//", label="max(0, p − q): residual")
    ax.plot(x, p, "_", color="black", markersize=14, markeredgewidth=2.5, label="p (target)")
    ax.plot(x, q, "o", color=OKABE_ITO[4], markersize=5, label="q (draft)")
    _token_axis(ax)
    ax.set(
        xlabel="token x",
        ylabel="probability",
        title=f"Two paths to each token after '{show_token(ctx)}' (w = {w:g})",
    )
    _legend_on_top(ax)
    return fig


def plot_joint_difference(comparison, limit=4):
    """Heatmap of (count − n·p)/√(n·p) over the 18 × 18 two-token outcomes after BOS."""
    z = comparison.pearson_residuals.reshape(V, V)
    fig, ax = new_figure(figsize=(6.4, 5.6))
    image = ax.imshow(z, cmap="RdBu_r", vmin=-limit, vmax=limit)
    _token_axis(ax)
    _token_axis(ax, axis="y")
    ax.grid(False)
    ax.set(
        xlabel="second token x₂",
        ylabel="first token x₁",
        title=f"Standardised residuals, first two tokens after {BOS}",
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label="(count − n·p) / √(n·p)")
    return fig


def plot_controls(rows, noise_q95):
    """Total variation of each verifier's 200,000-draw sample on a log axis, against noise."""
    fig, ax = new_figure(figsize=(5.6, 4.0))
    names = [r["verifier"] for r in rows]
    tvs = [r["sampled TV"] for r in rows]
    for name, tv, row in zip(names, tvs, rows):
        passes = row["passes"]
        ax.barh(
            name,
            tv,
            color=OKABE_ITO[2] if passes else OKABE_ITO[3],
            hatch="" if passes else "xx",
            label="passes the test" if passes else "fails the test",
        )
    ax.axvline(noise_q95, color="black", linestyle="--", label="95 % of noise-only TVs")
    ax.set_xscale("log")
    ticks = [0.01, 0.02, 0.05, 0.1, 0.2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks], minor=False)
    ax.set_xticks([], minor=True)
    ax.set_xlim(0.01, 0.4)
    ax.invert_yaxis()
    ax.set(
        xlabel="total variation to the target joint (log scale)",
        ylabel="verifier",
        title="The same test on the correct rule\nand four broken ones",
    )
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.4, -0.2))
    return fig


def sweep_standard_errors(run, w, gamma):
    """(s.e. of accepted/test, s.e. of tokens/step) at w; tests and steps as i.i.d.

    Tests: √(α(1 − α)/tests). Steps: s.d. of Eq. (1)'s capped geometric / √steps.
    """
    alpha = alpha_exact(w)
    counts = np.arange(1, gamma + 2)  # 1 .. γ + 1 tokens per step
    probs = np.append(alpha ** np.arange(gamma) * (1 - alpha), alpha**gamma)  # (γ + 1,)
    sd = np.sqrt(max(probs @ counts**2 - (probs @ counts) ** 2, 0.0))
    se_rate = np.sqrt(alpha * (1 - alpha) / run.tests)
    return float(se_rate), float(sd / np.sqrt(run.steps))


def plot_sweep_residuals(sweep, gamma=4):
    """Measured − exact chain value over the sweep, in standard errors, with the ±2 band."""
    fig, ax = new_figure()
    weights = [w for w in sweep if w < 1]  # at w = 1 every test passes: no noise to scale by
    z_rate, z_tokens = [], []
    for w in weights:
        run, chain = sweep[w], chain_stats(w, gamma)
        se_rate, se_tokens = sweep_standard_errors(run, w, gamma)
        z_rate.append((run.acceptance_rate - chain.acceptance_rate) / se_rate)
        z_tokens.append((run.tokens_per_step - chain.tokens_per_step) / se_tokens)
    ax.axhspan(-2, 2, color="grey", alpha=0.15, label="±2 standard errors (95 %)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.plot(weights, z_rate, "o", color=OKABE_ITO[0], label="accepted / test")
    ax.plot(weights, z_tokens, "s", color=OKABE_ITO[3], mfc="none", label="tokens / step")
    ax.set(
        ylim=(-4, 5.5),
        xlabel="draft weight w",
        ylabel="(measured − exact) / s.e.",
        title="Sweep against the exact chain, in standard errors",
    )
    ax.legend(ncol=2, loc="upper center")
    return fig


def plot_tokens_vs_w(sweep, gamma=4, gammas=(1, 2, 3, 4, 6, 8)):
    """Eq. (1) with exact α(w) for several γ as lines; the measured γ sweep as crosses."""
    fig, ax = new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 101)
    alphas = [alpha_exact(w) for w in grid]
    for i, g in enumerate(gammas):
        tokens = [expected_tokens(a, g) for a in alphas]
        ax.plot(grid, tokens, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.plot(
        list(sweep),
        [t.tokens_per_step for t in sweep.values()],
        "x",
        color="black",
        markersize=9,
        markeredgewidth=2,
        label=f"measured, γ = {gamma}",
    )
    ax.set(xlabel="draft weight w", ylabel="tokens per target call", title="Tokens per call")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_regime_tokens(max_gamma=8, stay=0.9):
    """The regime target: Eq. (1) with the exact α against the exact chain, for γ = 1..max."""
    p, q = regime_models(stay=stay)
    alpha = alpha_of(p, q)
    gammas = np.arange(1, max_gamma + 1)
    chain = [markov_chain_stats(p, q, int(g)) for g in gammas]
    fig, ax = new_figure()
    ax.plot(
        gammas,
        [expected_tokens(alpha, int(g)) for g in gammas],
        label="Eq. (1) with α",
        **_series(1),
    )
    ax.plot(gammas, [c.tokens_per_step for c in chain], label="exact chain", **_series(0))
    ax.set(
        xlabel="draft tokens per step γ",
        ylabel="tokens per target call",
        title=f"Sticky regimes (stay = {stay:g}): α = {alpha:.2f}",
    )
    ax.legend()
    return fig


def plot_tokens_vs_gamma(weights=(0.0, 0.5, 0.9, 1.0), max_gamma=10):
    """Eq. (1) against γ for several draft weights."""
    fig, ax = new_figure()
    gammas = np.arange(max_gamma + 1)
    for i, w in enumerate(weights):
        a = alpha_exact(w)
        tokens = [expected_tokens(a, int(g)) for g in gammas]
        ax.plot(gammas, tokens, markersize=5, label=f"w = {w:g} (α = {a:.3f})", **_series(i))
    ax.set(xlabel="draft tokens per step γ", ylabel="tokens per target call", title="Against γ")
    ax.legend()
    return fig


def plot_expected_tokens_vs_alpha(gammas=(1, 2, 3, 5, 7, 10)):
    """Leviathan et al.'s Figure 2: Eq. (1) against α for several γ; this toy's α range shaded."""
    fig, ax = new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 201)
    for i, g in enumerate(gammas):
        tokens = [expected_tokens(a, g) for a in grid]
        ax.plot(grid, tokens, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.axvspan(alpha_exact(0), 1, color="grey", alpha=0.15, label="this toy")
    ax.set(xlabel="α", ylabel="expected tokens per step", title="After Leviathan et al., Fig. 2")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_speedup_vs_w(sweep, gamma=4, costs=(0.0, 0.05, 0.1, 0.25, 0.5)):
    """Theorem 3.8 against w for several c: exact α(w) as dashed lines, measured as markers."""
    fig, ax = new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 1, 101)
    alphas = [alpha_exact(w) for w in grid]
    for i, c in enumerate(costs):
        style = _series(i)
        ax.plot(
            grid,
            [walltime_speedup(a, gamma, c) for a in alphas],
            color=style["color"],
            linestyle=style["linestyle"],
            label=f"c = {c:g}",
        )
        ax.plot(
            list(sweep),
            [t.tokens_per_step / (gamma * c + 1) for t in sweep.values()],
            linestyle="none",
            color=style["color"],
            marker=style["marker"],
            markersize=5,
        )
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set(xlabel="draft weight w", ylabel="projected speedup", title=f"Speedup, γ = {gamma}")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_speedup_heatmap(max_gamma=30, max_cost=0.3):
    """Best speedup over γ on an (α, c) grid; the no-gain region α ≤ c (Corollary 3.9) in grey."""
    from matplotlib import patheffects
    from matplotlib.colors import LogNorm

    alphas, costs = np.linspace(0, 0.99, 199), np.linspace(0, max_cost, 121)
    gammas = np.arange(max_gamma + 1)
    tokens = np.cumsum(alphas[None, :] ** gammas[:, None], axis=0)  # (G, A): Eq. (1), sum form
    best = (tokens[None] / (gammas[None, :, None] * costs[:, None, None] + 1)).max(axis=1)  # (C, A)
    fig, ax = new_figure(figsize=(6.4, 4.8))
    ax.set_facecolor("0.82")  # where the speedup is 1 the mesh is masked: grey shows through
    gain = np.ma.masked_where(best <= 1 + 1e-9, best)
    image = ax.pcolormesh(alphas, costs, gain, cmap="YlGnBu", shading="auto", norm=LogNorm(1, 30))
    halo = [patheffects.withStroke(linewidth=3, foreground="white")]
    levels = ax.contour(
        alphas, costs, best, levels=[1.25, 1.5, 2, 3, 5, 10], colors="black", linewidths=1
    )
    for text in ax.clabel(levels, fmt="%g×", fontsize=12.5):
        text.set_path_effects(halo)
    ax.plot([0, max_cost], [0, max_cost], "--", color="black", linewidth=1.5)
    ax.text(0.03, 0.8 * max_cost, "α ≤ c:\nno γ helps", fontsize=12)
    ax.set(xlabel="α", ylabel="cost ratio c", title="Best projected speedup over γ ≤ 30")
    ax.grid(False)
    bar = fig.colorbar(image, ax=ax, ticks=[1, 1.5, 2, 3, 5, 10, 20, 30])
    bar.ax.set_yticklabels(["1×", "1.5×", "2×", "3×", "5×", "10×", "20×", "30×"])
    bar.set_label("best speedup (log scale)")
    return fig


def plot_optimal_gamma(costs=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5)):
    """Leviathan et al.'s Figure 3: the optimal γ against α for several c."""
    fig, ax = new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 0.99, 199)
    for i, c in enumerate(costs):
        style = _series(i, len(grid))
        ax.step(
            grid,
            [optimal_gamma(a, c) for a in grid],
            where="post",
            label=f"c = {c:g}",
            markersize=5,
            **style,
        )
    ax.set(xlabel="α", ylabel="optimal γ", title="Optimal γ (after Leviathan et al., Fig. 3)")
    _legend_on_top(ax, ncol=3)
    return fig


def plot_operations_increase(gammas=(1, 2, 3, 5, 7, 10), c_hat=0.0):
    """Leviathan et al.'s Figure 4, right half: the increase in operations against α."""
    fig, ax = new_figure(figsize=(6.4, 4.6))
    grid = np.linspace(0, 0.99, 100)
    for i, g in enumerate(gammas):
        ops = [operations_increase(a, g, c_hat) for a in grid]
        ax.plot(grid, ops, label=f"γ = {g}", markersize=5, **_series(i, len(grid)))
    ax.set(
        xlabel="α",
        ylabel="increase in operations",
        title=f"Arithmetic per token, ĉ = {c_hat:g} (after Fig. 4)",
    )
    _legend_on_top(ax, ncol=3)
    return fig


def plot_real_pairs():
    """Measured α of real draft/target pairs (Leviathan et al., Table 3) beside the toy's."""
    fig, ax = new_figure(figsize=(3.8, 6.8))
    short = {"GPT-like 97M": "GPT 97M", "T5-XXL EnDe": "EnDe", "T5-XXL CNNDM": "CNNDM"}
    labels = [f"{short.get(target, target)} ← {draft}" for target, draft, _, _ in REAL_PAIR_ALPHAS]
    y = np.arange(len(labels))
    ax.axvspan(alpha_exact(0), 1, color="grey", alpha=0.15, label="this toy: α(w)")
    ax.axvline(
        alpha_of(*unsmoothed_models()),
        color="black",
        linestyle=":",
        linewidth=1.5,
        label="toy without smoothing, w = 0",
    )
    ax.plot([r[2] for r in REAL_PAIR_ALPHAS], y, "o", color=OKABE_ITO[0], label="temperature 0")
    ax.plot(
        [r[3] for r in REAL_PAIR_ALPHAS],
        y,
        "s",
        color=OKABE_ITO[3],
        markerfacecolor="none",
        markeredgewidth=2,
        label="temperature 1",
    )
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set(xlim=(0, 1), xlabel="α", ylabel="target ← draft", title="Real pairs and this toy")
    ax.legend(loc="upper center", bbox_to_anchor=(0.35, -0.1), ncol=1)
    return fig


def plot_panel(w=0.9, gamma=4, c=0.1):
    """Projected speedup against γ at one (w, c): the chosen γ, the best γ and §3.5's oracle."""
    alpha = alpha_exact(w)
    fig, ax = new_figure()
    best = optimal_gamma(alpha, c)
    gammas = np.arange(max(11, gamma + 1, best + 1))
    speedups = [walltime_speedup(alpha, int(g), c) for g in gammas]
    ax.plot(gammas, speedups, "o-", color=OKABE_ITO[0], markersize=5, label="Theorem 3.8")
    chosen = {"color": OKABE_ITO[3], "markersize": 12, "label": f"γ = {gamma}"}
    ax.plot([gamma], [speedups[gamma]], "o", **chosen)
    ax.plot([best], [speedups[best]], "*", color="black", markersize=14, label=f"best γ = {best}")
    if alpha < 1:
        ax.axhline(oracle_speedup(alpha, c), color=OKABE_ITO[2], linestyle="--", label="oracle γ")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set(
        xlabel="γ",
        ylabel="projected speedup",
        title=f"w = {w:g}, c = {c:g}: γ = {gamma} gives {speedups[gamma]:.2f}×",
    )
    _legend_on_top(ax, ncol=2)
    return fig


def widget_panel():
    """Sliders for w, γ and c that redraw plot_panel on release (live kernel; needs ipywidgets)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    on_release = {"continuous_update": False}  # one redraw per move, not one per tick
    sliders = {
        "w": widgets.FloatSlider(value=0.9, min=0, max=1, step=0.05, description="w", **on_release),
        "gamma": widgets.IntSlider(value=4, min=0, max=10, description="γ", **on_release),
        "c": widgets.FloatSlider(value=0.1, min=0, max=1, step=0.01, description="c", **on_release),
    }

    def redraw(**values):
        figure = plot_panel(**values)
        display(figure)
        plt.close(figure)

    return widgets.VBox(
        [widgets.HBox(list(sliders.values())), widgets.interactive_output(redraw, sliders)]
    )


def plot_bug_power(rows):
    """Each bug's exact TV (top, a linear axis: TV lies in [0, 1], and each point carries its
    value) and the draws a chi-square test needs (bottom, a log axis)."""
    fig, (top, bottom) = new_figure(nrows=2, figsize=(5.0, 8.2))
    rows = sorted(rows, key=lambda r: r["TV"])
    y = np.arange(len(rows))
    chi = np.array([r["caught by"] == "chi-square" for r in rows])
    for ax, key, label, title in (
        (top, "TV", "exact TV from p̃ (three tokens)", "How far each bug moves the output"),
        (
            bottom,
            "draws to catch",
            f"draws for {DETECT_POWER:.0%} power at level {DETECT_LEVEL:g}",
            "What a test needs",
        ),
    ):
        values = np.array([r[key] for r in rows])
        start = 0.0 if ax is top else values.min() / 3
        ax.hlines(y, start, values, color="0.8", linewidth=1)
        ax.scatter(values[chi], y[chi], marker="o", s=60, label="caught by chi-square")
        ax.scatter(
            values[~chi],
            y[~chi],
            marker="s",
            s=60,
            color=OKABE_ITO[3],
            label="caught by a forbidden outcome",
        )
        ax.set(xlabel=label, ylabel="bug", title=title)
        ax.set_yticks(y, [r["bug"] for r in rows])
    for value, row in zip((r["TV"] for r in rows), y):  # each TV written beside its point
        right = value > 0.75
        top.annotate(
            number(value), (value, row), xytext=(-8 if right else 8, 0), textcoords="offset points",
            ha="right" if right else "left", va="center", fontsize=12,
        )  # fmt: skip
    top.set_xlim(0, 1.05)
    bottom.set_xscale("log")
    bottom.legend(loc="upper center", bbox_to_anchor=(0.35, -0.22), ncol=1)
    fig.tight_layout()
    return fig


# ---- Chapter 7 -----------------------------------------------------------------------------------

SHORT_NAMES = {  # legend labels that fit a phone
    "without replacement": "without repl.",
    "broken: q not renormalised": "broken (q not renorm.)",
    "Medusa typical (ε, δ)·s": "Medusa (ε, δ)·s",
    "thresholds t < 1": "thresholds t",
}


def plot_multi_draft_acceptance(rows, optima):
    """Acceptance against k per multi-draft rule, LP optima as stars; below, minus SpecInfer's."""
    fig, (ax, gap) = new_figure(
        nrows=2, figsize=(6.4, 7.8), gridspec_kw={"height_ratios": [3, 2], "hspace": 0.5}
    )
    base = {r["k"]: r["acceptance"] for r in rows if r["rule"] == "SpecInfer"}
    for key, marker in zip(MULTI_DRAFT_RULES, ["o", "s", "v", "D", "^"]):
        mine = [r for r in rows if r["rule"] == key]
        dash = ":" if key.startswith("broken") else "-"
        x, y = [r["k"] for r in mine], [r["acceptance"] for r in mine]
        (line,) = ax.plot(x, y, dash, marker=marker, label=SHORT_NAMES.get(key, key))
        if key != "EAGLE-2 top-k":  # far below the others: it would flatten the panel
            excess = [a - base[k] for k, a in zip(x, y)]
            gap.plot(x, excess, dash, marker=marker, color=line.get_color())
    ax.plot(
        [2, 2],
        [optima["iid"], optima["top-k"]],
        "*",
        color="black",
        markersize=15,
        label="LP optimum, k = 2",
    )
    title = f"k drafts at '{MD_CTX}', w = {float(MD_W):g}"
    ax.set(xlabel="candidates k", ylabel="P(a candidate is kept)", title=title)
    gap.set(xlabel="candidates k", ylabel="difference", title="Acceptance minus SpecInfer's")
    for axes in (ax, gap):
        axes.set_xticks(list(MD_KS))
    fig.legend(loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.1))
    return fig


def plot_block_gains(gains):
    """Histogram of E[accepted] block − per token over random pairs."""
    fig, ax = new_figure()
    ax.hist(gains, bins=40, color=OKABE_ITO[0])
    ax.axvline(0, color="black", linewidth=1)
    ax.set(
        xlabel="gain in kept drafts per step",
        ylabel="random pairs",
        title=f"Block − per-token, {len(gains):,} pairs",
    )
    return fig


def plot_block_tokens_vs_w(sweep, gamma=BLOCK_GAMMA):
    """Exact tokens per call against w: per-token as a line, block as markers and dashes."""
    fig, ax = new_figure()
    grid = np.linspace(0, 1, 51)
    ax.plot(
        grid, [rule_tokens_per_call(w, gamma) for w in grid], color=OKABE_ITO[0], label="per-token"
    )
    ax.plot(list(sweep), [b for _, b in sweep.values()], "s--", color=OKABE_ITO[1], label="block")
    ax.set(
        xlabel="draft weight w",
        ylabel="tokens per target call",
        title=f"Exact tokens per call, γ = {gamma}",
    )
    ax.legend()
    return fig


def plot_lossy_frontier(rows, exact_points):
    """Tokens per call against TV from p: lossy knobs as marked lines, exact rules at TV = 0."""
    fig, ax = new_figure(figsize=(6.4, 5.2))
    for family, marker, dash in zip(LOSSY_KNOBS, ["o", "s", "^"], ["-", "--", ":"]):
        mine = [r for r in rows if r[0] == family]
        x, y = [r[3] for r in mine], [r[2] for r in mine]
        ax.plot(x, y, dash, marker=marker, label=SHORT_NAMES.get(family, family))
    for (name, value), colour in zip(exact_points.items(), [OKABE_ITO[7], OKABE_ITO[3]]):
        ax.plot([0], [value], "*", markersize=16, color=colour, label=name)
    ax.set(
        xlabel="TV of the first two tokens from p",
        ylabel="tokens per target call",
        title="Lossy verifiers: speed against error",
    )
    fig.legend(loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.22))
    return fig


# Every figure of the book, by name: `make figures` writes each one to figures/.
FIGURES = {
    "intro-loop": plot_loop,
    "ch1-target-heatmap": plot_target_heatmap,
    "ch1-draft-mixture": plot_draft_mixture,
    "ch1-sampling-check": lambda: plot_residuals(
        sampling_check(), "200,000 draws after context 't'"
    ),
    "ch2-step-trace": lambda: plot_step_trace(
        trace_run(5, 4, 0.3, BOS, np.random.default_rng(SEEDS["trace"]))
    ),
    "ch2-two-paths": plot_two_paths,
    "ch2-one-token-check": lambda: plot_residuals(
        one_token_check(), "First token of 200,000 γ = 1 steps after 't'"
    ),
    "ch3-joint-difference": lambda: plot_joint_difference(joint_check()),
    "ch3-controls": lambda: plot_controls(
        control_rows(),
        noise_reference(joint_check().exact, N_DRAWS, np.random.default_rng(SEEDS["noise"]))[
            "q95_tv"
        ],
    ),
    "ch4-sweep-residuals": lambda: plot_sweep_residuals(acceptance_sweep()),
    "ch4-tokens-vs-w": lambda: plot_tokens_vs_w(acceptance_sweep()),
    "ch4-tokens-vs-gamma": plot_tokens_vs_gamma,
    "ch4-regime-tokens": plot_regime_tokens,
    "ch4-fig2-tokens-vs-alpha": plot_expected_tokens_vs_alpha,
    "ch5-speedup-vs-w": lambda: plot_speedup_vs_w(acceptance_sweep()),
    "ch5-speedup-heatmap": plot_speedup_heatmap,
    "ch5-fig3-optimal-gamma": plot_optimal_gamma,
    "ch5-fig4-operations": plot_operations_increase,
    "ch5-real-pairs": plot_real_pairs,
    "ch5-panel": plot_panel,
    "ch6-bug-power": lambda: plot_bug_power(bug_rows()),
    "ch7-multi-draft": lambda: plot_multi_draft_acceptance(multi_draft_rows(), pair_optima()),
    "ch7-block-gains": lambda: plot_block_gains(random_pair_gains(RANDOM_PAIRS)),
    "ch7-block-tokens": lambda: plot_block_tokens_vs_w(block_sweep()),
    "ch7-lossy-frontier": lambda: plot_lossy_frontier(
        lossy_frontier(),
        {
            "per-token (exact)": rule_tokens_per_call(0.3, BLOCK_GAMMA),
            "block (exact)": toy_tokens_per_call(0.3, BLOCK_GAMMA),
        },
    ),
    "ch9-beta-hist": lambda: plot_beta_histograms(
        {name: b.ravel() for name, b in heldout_betas(load_pair(), BETA_SHOWN).items()}
    ),
}
