"""The power of generation_test: how often it rejects the real pipeline and each planted bug.

Runs `generation_test` at its default size (256 held-out prompts, 64 tokens each, draft1-2000,
γ = 4) for seeds 0 .. n − 1 on the real pair and on each `BrokenPair`, the same seeds for every
pipeline, and writes every run's verdict to specdec/weights/generation_power.json, which chapter 9
reads (a chapter that ran them all would take minutes). tests/test_pair_robust.py re-runs seed 0
of two pipelines and checks them against the file.

    .venv/bin/python scripts/generation_power.py             # 20 seeds, about 6 minutes
    .venv/bin/python scripts/generation_power.py --seeds 5
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from specdec import exactness as ex
from specdec import pair as pm

OUT = pm.WEIGHTS / "generation_power.json"
DRAFT, GAMMA = "draft1-2000", 4


def runs(pair, seeds):
    """{pipeline: {"description", "runs": [verdict per seed]}} for the pair and each bug."""
    pipelines = {"correct": (pair, "the book's pipeline, unchanged")}
    pipelines |= {bug: (ex.BrokenPair(pair, bug), text) for bug, text in ex.BUGS.items()}
    out = {}
    for name, (subject, description) in pipelines.items():
        verdicts = []
        for seed in seeds:
            start = time.thread_time()
            (verdict,) = ex.rejections(subject, DRAFT, GAMMA, [seed])
            verdicts.append(verdict | {"cpu_seconds": round(time.thread_time() - start, 3)})
        rejected = sum(not v["passed"] for v in verdicts)
        print(f"{name:28s} rejected {rejected:2d} of {len(verdicts)}", flush=True)
        out[name] = {"description": description, "runs": verdicts}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0 .. n − 1 per pipeline")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    pair = pm.load_pair()
    begin, load = time.perf_counter(), os.getloadavg()[0]
    result = runs(pair, range(args.seeds))
    record = {
        "what": "generation_test verdicts per seed, at its default size",
        "draft": DRAFT,
        "gamma": GAMMA,
        **ex.default_size(),
        "numpy": np.__version__,
        "wall_seconds": round(time.perf_counter() - begin, 1),
        "load_average_at_start": round(load, 2),
        "pipelines": result,
    }
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out} in {record['wall_seconds']} s")


if __name__ == "__main__":
    main()
