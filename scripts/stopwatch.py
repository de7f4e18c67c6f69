"""make stopwatch: race plain against speculative decoding through chapter 8's transformers.

Prints the machine, the race table, and last the main setting's line. Times are CPU seconds of
the timing thread with one BLAS thread; they differ from run to run and machine to machine.
"""

import argparse

from specdec import transformer as tt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved repeats")
    args = parser.parse_args()
    print(", ".join(f"{k}: {v}" for k, v in tt.machine().items()))
    result = tt.race(tt.TARGET, tt.DRAFT, tt.RACE_SETTINGS, args.tokens, args.repeats)
    print(f"plain decoding: {result.plain * 1e3:.2f} ms per token")
    header = "   w  gamma  E[tokens]  seen   c      v(gamma)  measured  cost form  thm 3.8  error"
    print(header)
    rows = tt.race_rows(result)
    for r in rows:
        print(
            f"{r['w']:4.1f}  {r['gamma']:5d}  {r['E[tokens]']:9.3f}  {r['tokens/step seen']:.3f}  "
            f"{r['c']:.3f}  "
            f"{r['v(gamma)']:8.3f}  {r['measured']:8.3f}  {r['measured-cost form']:9.3f}  "
            f"{r['theorem 3.8']:7.3f}  {r['error']:+6.1%}"
        )
    main_row = rows[0]  # RACE_SETTINGS starts with the main (w, gamma)
    print(
        f"measured speedup {main_row['measured']:.3f}, predicted "
        f"{main_row['measured-cost form']:.3f} (measured-cost form), "
        f"theorem 3.8 {main_row['theorem 3.8']:.3f}"
    )


if __name__ == "__main__":
    main()
