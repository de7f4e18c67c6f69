"""generation_test's dose–response: its power against a bug planted in a fraction of steps, and
against a small shift of one token's probability.

Runs `generation_test` at its default size (256 held-out prompts, 64 tokens each, draft1-2000,
γ = 4) for seeds 0 .. n − 1 on a `BrokenPair` that plants a bug in each row's step with
probability f, and on a `ShiftedPair` that hands the verifier (1 − ε)·p + ε·e_space, then writes
every run's verdict to specdec/data/generation_dose.json, which chapter 9 reads (the runs take
about 3 s of CPU each on a quiet machine: minutes in all). f = 1 and f = 0 (the correct pipeline)
are the runs of scripts/generation_power.py. tests/test_pair_robust.py re-runs one stored run of
each part and checks it against the file.

    .venv/bin/python scripts/generation_dose.py --part fraction
    .venv/bin/python scripts/generation_dose.py --part shift --seeds 10 --values 0.03
"""

import argparse
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

from specdec import exactness as ex
from specdec import pair as pm

OUT = ex.DOSE_RECORD
DRAFT, GAMMA = "draft1-2000", 4
FRACTIONS = (0.3, 0.1, 0.03)  # f = 1 is generation_power.json's
FRACTION_BUGS = ("residual from p", "one uniform")
EPSILONS = (0.02, 0.01, 0.04, 0.005, 0.03)  # the order they run in
SHIFT_TOKEN = " "  # the commonest character of the held-out text


def save(path, part, key, runs, meta):
    """Write one point's runs into the record at path, under a lock (two parts may run at once)."""
    with open(Path(tempfile.gettempdir()) / "generation_dose.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = json.loads(path.read_text()) if path.exists() else {}
        record.update({k: v for k, v in meta.items() if k not in record})
        record.setdefault(part, {})[key] = runs
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("fraction", "shift"), required=True)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. n − 1 per point")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--values", type=float, nargs="+", help="the f or ε to run instead")
    args = parser.parse_args()
    pair = pm.load_pair()
    meta = {
        "what": "generation_test verdicts per seed at its default size, against a bug planted "
        "in a fraction of steps (fraction: {bug: {f: runs}}) and a shift of one token's "
        "probability (shift: {epsilon: runs})",
        "draft": DRAFT,
        "gamma": GAMMA,
        **ex.default_size(),
        "shift_token": SHIFT_TOKEN,
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    seeds = range(args.seeds)
    if args.part == "fraction":
        points = [(bug, f) for f in args.values or FRACTIONS for bug in FRACTION_BUGS]
    else:
        points = [("shift", e) for e in args.values or EPSILONS]
    for name, value in points:
        begin = time.thread_time()
        if args.part == "fraction":
            subject = ex.BrokenPair(pair, name, fraction=value)
        else:
            subject = ex.ShiftedPair(pair, pair.index[SHIFT_TOKEN], value)
        runs = ex.rejections(subject, DRAFT, GAMMA, seeds)
        if args.part == "fraction":
            record = json.loads(args.out.read_text()) if args.out.exists() else {}
            runs_by_f = record.get("fraction", {}).get(name, {}) | {str(value): runs}
            save(args.out, "fraction", name, runs_by_f, meta)
        else:
            save(args.out, "shift", str(value), runs, meta)
        rejected = sum(not r["passed"] for r in runs)
        seconds = time.thread_time() - begin
        print(
            f"{name:18s} {value:<6g} rejected {rejected:2d} of {len(runs)} ({seconds:.0f} s CPU)",
            flush=True,
        )


if __name__ == "__main__":
    main()
