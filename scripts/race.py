"""make race: chapter 9's race at full size, predicted from isolated costs timed beside it.

For the small pair and then the bandwidth-bound target (4 × 512, past the L3), both through ONNX
Runtime: every draft and γ, on held-out prompts with interleaved repeats, the costs (untimed runs'
calls, replayed without the loop) timed before each of its prompts (so in the race's minutes,
never inside its runs), and tokens per call counted in untimed runs; the table of predicted
speedups (with their 95 % band) and measured ones (with 95 % t-intervals over prompts, cut at the
most the costs allow); the race's noise between prompts and between repeats, and the intervals'
coverage simulated for this design from it; where each prediction misses, measured inside the
race's own runs (`race.miss_parts`). Last, two lines for the large target: how often the
prediction fell inside the interval, with the coverage; and its best setting, chosen on the
race's prompts and measured again on as many fresh ones. Times differ from run to run and
machine to machine.
"""

import argparse
import time

import pandas as pd

import specdec_core as sc
from specdec import intervals, race
from specdec.transformer import machine

DRAFTS = ["unigram", "bigram", "draft1-500", "draft1-1000", "draft1-2000", "draft2-1000"]


def band_ratio(table):
    """Median over settings of the prediction's band width over the measured interval's."""
    band = table["predicted to"] - table["predicted from"]
    return float((band / (table.high - table.low)).median())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--prompts", type=int, default=12, help="held-out prompts (and fresh)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per prompt")
    parser.add_argument("--gammas", default="1,2,3,4,6", help="draft lengths, comma-separated")
    parser.add_argument("--alpha-rows", type=int, default=96, help="α's and τ's prompts")
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]
    start = time.perf_counter()
    print(", ".join(f"{k}: {v}" for k, v in machine().items()))
    pd.set_option("display.width", 160)
    lines = []
    for label, target in (("small pair", "target"), ("large target", "target-large")):
        pair = race.on_runtime(sc.load_pair(target=target))
        result = race.predict_and_race(
            pair,
            DRAFTS,
            gammas,
            args.tokens,
            n_prompts=args.prompts,
            repeats=args.repeats,
            cost_measurements=args.prompts,  # before each prompt
            alpha_rows=args.alpha_rows,
        )
        t1s = " ".join(f"{t * 1e3:.2f}" for t in result.t1_each)
        print(f"\n{label}: T(1) {result.costs.t1 * 1e3:.2f} ms (each measurement: {t1s}), "
              f"{result.seconds:.0f} s")  # fmt: skip
        columns = ["draft", "gamma", "α", "c", "v(γ)", "o", "E[tokens]", "tokens, finite N",
                   "tokens, untimed", "predicted", "predicted from", "predicted to",
                   "predicted, i.i.d.", "speedup",
                   "low", "high", "cap", "above cap", "inside"]  # fmt: skip
        print(result.table[columns].round(3).to_string(index=False))
        noise = result.components
        print(
            f"a run's log speedup varies by {noise.between_prompts:.3f} between prompts and "
            f"{noise.between_repeats:.3f} between repeats (s.d., pooled over settings)"
        )
        table = result.table
        iid = table["predicted, i.i.d."]
        print(
            f"measured over predicted, median over settings: "
            f"{(table.speedup / table.predicted).median():.3f}; predicted instead with Equation "
            f"1's i.i.d. tokens per call at the sampled α (no dependence between positions): "
            f"{(table.speedup / iid).median():.3f}, inside the interval at "
            f"{int(iid.between(table.low, table.high).sum())} of {len(table)} settings"
        )
        expected = intervals.expected_inside(table, args.prompts)
        print(
            f"an unbiased prediction with this band would fall inside the interval at "
            f"{expected:.1f} of {len(table)} settings on average (intervals.expected_inside); "
            f"the band is {band_ratio(table):.2f} times the interval's width (median)"
        )
        print(
            "where the prediction misses, measured inside the race's runs: each part's time "
            "beyond what the prediction charged, in per cent of the predicted run (speculative "
            "parts, then plain):"
        )
        shares = table[["draft", "gamma", *race.MISS_PARTS]].set_index(["draft", "gamma"])
        print((100 * shares).round(1).to_string())
        ceilings = race.method_ceilings(result, len(pair.vocab), args.tokens)
        best = ceilings.loc[ceilings.ceiling.idxmax()]
        print(
            f"with only the method's own work outside the calls (verify, laws, draws: "
            f"{ceilings.floor.min():.2f}–{ceilings.floor.max():.2f} T(1) a step), the best "
            f"predicted: {best.ceiling:.2f} for {best.draft} at γ = {best.gamma} (computed)"
        )
        chosen = (result.verdict.draft, result.verdict.gamma)
        steps = race.ladder(result, *chosen, ceilings, args.tokens)  # the same floors
        print(
            f"{chosen[0]} at γ = {chosen[1]}, predicted again one change at a time, down to "
            f"Theorem 3.8 (computed, not raced):\n{steps.round(3).to_string()}"
        )
        # the middle context's old cache (48 + the largest γ + 1 slots) against the race's
        ids, slots = (
            pair.encode(pair.heldout_text[:60]),
            (49 + max(gammas), 16 + args.tokens + max(gammas)),
        )
        if slots[1] <= slots[0]:  # --tokens this short leaves the race's cache no wider
            print(f"the race's cache ({slots[1]} slots) is no wider than {slots[0]}: not timed")
        else:
            ratios = [race.slots_ratio(pair.target, ids, 48, slots, n, calls=300) for n in (1, 5)]
            print(
                f"a target call in a cache of {slots[1]} slots (the race's) over one in "
                f"{slots[0]}: {ratios[0]:.3f} for T(1), {ratios[1]:.3f} for T(5) (medians of "
                "300 paired calls)"
            )
        lines.append([f"{label}: {line}" for line in race.verdict_lines(result)])
    print(f"\nmake race took {time.perf_counter() - start:.0f} s")
    print(*lines[0], sep="\n")
    print(*(line.removeprefix("large target: ") for line in lines[1]), sep="\n")


if __name__ == "__main__":
    main()
