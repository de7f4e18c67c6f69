"""make race: chapter 9's race at full size, predicted from isolated costs before it is run.

For the bandwidth-bound target (4 × 512, past the L3) and then the small pair, both through ONNX
Runtime: every draft and γ, on several held-out prompts with interleaved repeats; the table of
predicted and measured speedups with 95 % bootstrap intervals; last, one line for the large
target's best setting (chosen on half of the repeats, measured on the other half). Times are
wall-clock and differ from run to run and machine to machine.
"""

import argparse
import time

import pandas as pd

import specdec_core as sc
from specdec import race
from specdec.transformer import machine

DRAFTS = ["unigram", "bigram", "draft1-500", "draft1-1000", "draft1-2000", "draft2-1000"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved repeats per prompt")
    parser.add_argument("--gammas", default="1,2,3,4,6", help="draft lengths, comma-separated")
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]
    start = time.perf_counter()
    print(", ".join(f"{k}: {v}" for k, v in machine().items()))
    pd.set_option("display.width", 160)
    lines = []
    for label, target in (("small pair", "target"), ("large target", "target-large")):
        pair = race.on_runtime(sc.load_pair(target=target))
        result = race.predict_and_race(
            pair, DRAFTS, gammas, args.tokens, n_prompts=args.prompts, repeats=args.repeats
        )
        print(f"\n{label}: T(1) {result.costs.t1 * 1e3:.2f} ms, {result.seconds:.0f} s")
        columns = ["draft", "gamma", "α", "c", "v(γ)", "o", "predicted", "speedup", "low", "high"]
        print(result.table[columns].round(3).to_string(index=False))
        ceilings = race.method_ceilings(result, len(pair.vocab), args.tokens)
        best = ceilings.loc[ceilings.ceiling.idxmax()]
        print(
            f"with only the method's own work outside the calls (verify, laws, draws: "
            f"{ceilings.floor.min():.2f}–{ceilings.floor.max():.2f} T(1) a step), the best "
            f"predicted: {best.ceiling:.2f} for {best.draft} at γ = {best.gamma} (computed)"
        )
        lines.append(f"{label}: {race.verdict_line(result)}")
    print(f"\nmake race took {time.perf_counter() - start:.0f} s")
    print(lines[0])
    print(lines[1].removeprefix("large target: "))


if __name__ == "__main__":
    main()
