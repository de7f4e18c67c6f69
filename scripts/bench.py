"""Time the book's Monte Carlo: the literal loops against the vectorised engine (`make bench`).

For each workload: the literal Python loops the chapters show, the vectorised engine the chapters
run, and the floor, drawing the same number of uniforms the engine consumes and nothing else.
Last, verify and block_verify on one batch; their floor adds one read of the input arrays.
"""

import os
import time

import numpy as np

import specdec_core as sc
from specdec.verify import _sample_rows


class CountingGenerator(np.random.Generator):
    """A Generator that counts the uniforms it hands out."""

    drawn = 0

    def random(self, size=None, dtype=np.float64, out=None):
        """Uniforms on [0, 1), counted."""
        CountingGenerator.drawn += 1 if size is None else int(np.prod(size))
        return super().random(size, dtype, out)


def seconds(work, repeats=5):
    """Wall-clock seconds of one call of work(), the best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def uniforms_used(work):
    """How many uniforms work(rng) draws from a counting generator."""
    CountingGenerator.drawn = 0
    work(CountingGenerator(np.random.PCG64(0)))
    return CountingGenerator.drawn


def literal_sweep():
    """The article's sweep: one 200,000-token chain per weight, literal loops."""
    for w in sc.SWEEP_WEIGHTS:
        sc.speculative_generate(sc.N_DRAWS, 4, w, sc.BOS, np.random.default_rng(0))


N = sc.N_DRAWS
WORKLOADS = [  # name, draws, literal work, vectorised work, the vectorised work on a given rng
    (
        "ch1 sampling check",
        N,
        lambda: [sc.autoregressive_sample(1, "t", RNG) for _ in range(N)],
        sc.sampling_check,
        lambda rng: sc.sample_tokens(N, "t", rng),
    ),
    (
        "ch2 gamma = 1 check",
        N,
        lambda: [sc.speculative_step("t", 1, 0.3, RNG) for _ in range(N)],
        sc.one_token_check,
        lambda rng: sc.simulate_prefixes(N, 1, 1, 0.3, "t", rng),
    ),
    (
        "ch3 two-token joint",
        N,
        lambda: [sc.speculative_generate(2, 2, 0.3, sc.BOS, RNG) for _ in range(N)],
        sc.joint_check,
        lambda rng: sc.simulate_prefixes(N, 2, 2, 0.3, sc.BOS, rng),
    ),
    (
        "ch4 sweep, 11 x 200,000 tokens",
        len(sc.SWEEP_WEIGHTS) * N,
        literal_sweep,
        sc.acceptance_sweep,
        lambda rng: sc.simulate_generation(
            sc.SWEEP_CHAINS, sc.N_DRAWS // sc.SWEEP_CHAINS, 4, sc.SWEEP_WEIGHTS, rng
        ),
    ),
]
CONTROLS = (
    "ch3 four broken verifiers",
    lambda: [sc.joint_check(r) for r in sc.BROKEN_RULES.values()],
    lambda rng: [
        sc.simulate_prefixes(N, 2, 2, 0.3, sc.BOS, rng, r) for r in sc.BROKEN_RULES.values()
    ],
)
RNG = np.random.default_rng(0)
VERIFY_SHAPES = [(200_000, 4, 18), (64, 5, 32_000), (64, 5, 128_256)]  # (B, gamma, V)


def verify_batch(batch, gamma, vocab):
    """Random target and draft rows (Dirichlet) and drafts from the draft rows, seeded."""
    rng = np.random.default_rng(0)
    target = rng.dirichlet(np.ones(vocab), size=(batch, gamma + 1))
    draft = rng.dirichlet(np.ones(vocab), size=(batch, gamma))
    tokens = _sample_rows(draft.reshape(-1, vocab), rng).reshape(batch, gamma)
    return target, draft, tokens


def verify_rows():
    """verify() with all its checks against one read of its inputs, at each shape."""
    print(f"\n{'verify at (B, gamma, V)':34} {'verify s':>10} {'read s':>8} {'ratio':>7}")
    for shape in VERIFY_SHAPES:
        target, draft, tokens = verify_batch(*shape)
        fast = seconds(lambda t=target, d=draft, x=tokens: sc.verify(t, d, x, RNG), repeats=10)
        floor = seconds(lambda t=target, d=draft: (t.sum(), d.sum()), repeats=10)  # one read
        name = "B = {:,}, gamma = {}, V = {:,}".format(*shape)
        print(f"{name:34} {fast:>10.4f} {floor:>8.4f} {fast / floor:>7.1f}")


def line(name, draws, literal, fast, floor):
    """One row of the table; None leaves a cell blank."""
    cells = [
        f"{draws:>10,}" if draws else " " * 10,
        f"{literal:>10.2f}" if literal else " " * 10,
        f"{fast:>8.3f}",
        f"{literal / fast:>7.0f}" if literal else " " * 7,
        f"{floor:>8.3f}",
        f"{fast / floor:>10.1f}",
    ]
    return f"{name:34} " + " ".join(cells)


def verifier_rows():
    """verify and block_verify on the same batch, each against its floor."""
    arrays = verify_batch(100_000, 4, 32)
    batch, gamma = arrays[2].shape
    read = seconds(lambda: [a.sum() for a in arrays])  # one read of the inputs
    print(f"\nverifiers, B = {batch:,}, gamma = {gamma}, V = {arrays[0].shape[2]}")
    for name, fn in (("verify", sc.verify), ("block_verify", sc.block_verify)):
        n_uniforms = uniforms_used(lambda rng, fn=fn: fn(*arrays, rng))
        fast = seconds(lambda fn=fn: fn(*arrays, np.random.default_rng(1)))
        floor = read + seconds(lambda n=n_uniforms: np.random.default_rng(1).random(n))
        print(line(name, batch, None, fast, floor))


ONE_CALL = 1e-3  # the stand-in engine verifier's cost per call, seconds: one sequence a call


def row_by_row(target_probs, draft_probs, draft_tokens, rng, floor=0.0):
    """verify called on one request at a time, as an adapter calls an engine's batch-1 function;
    each call padded with sleep to at least `floor` seconds."""
    batch, gamma = draft_tokens.shape
    accepted, tokens = np.empty(batch, dtype=np.int64), np.full((batch, gamma + 1), -1)
    for b in range(batch):
        start = time.perf_counter()
        one = sc.verify(
            target_probs[b : b + 1], draft_probs[b : b + 1], draft_tokens[b : b + 1], rng
        )
        accepted[b], tokens[b] = one[0][0], one[1][0]
        time.sleep(max(0.0, floor - (time.perf_counter() - start)))
    return accepted, tokens


def one_ms_engine(target_probs, draft_probs, draft_tokens, rng):
    """The stand-in for an engine's verifier: verify on one request, at least 1 ms a call."""
    return row_by_row(target_probs, draft_probs, draft_tokens, rng, floor=ONE_CALL)


def audit_rows():
    """Each suite's requests, and its time for verify row by row and for the 1 ms stand-in:
    wall clock, the audit's own CPU (parent) and the verifier's (its child process)."""
    print(
        f"\n{'audit suite, verifier':40} {'requests':>9} {'wall s':>8} {'audit CPU s':>12} "
        f"{'child CPU s':>12} {'load':>5}"
    )
    for suite in sc.SUITES:
        for name, fn in (("verify row by row", row_by_row), ("1 ms stand-in", one_ms_engine)):
            children = os.times()
            wall, cpu = time.perf_counter(), time.process_time()
            report = sc.audit_verifier(fn, suite=suite, seed=1)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            child = sum(os.times()[2:4]) - sum(children[2:4])
            requests = (
                int(report.table["draws"].sum())
                if suite == "small"
                else sum(len(s.target) * s.steps for s in sc.engine_scenarios())
            )
            verdict = "passed" if report.passed else "FAILED"
            print(
                f"{suite + ', ' + name + ' (' + verdict + ')':40} {requests:>9,} {wall:>8.1f} "
                f"{cpu:>12.1f} {child:>12.1f} {os.getloadavg()[0]:>5.1f}"
            )


def _suite_work(suite, fn, rng):
    """One suite's verifier calls and tests, as audit_verifier runs them, on fn as given."""
    from specdec.audit import _markov_rows
    from specdec.projections import run_scenario

    if suite == "small":
        return _markov_rows(fn, sc.AUDIT_LEVEL / len(sc.audit_scenarios()), rng)
    return [run_scenario(fn, scenario, rng) for scenario in sc.engine_scenarios()]


def harness_rows():
    """The child process's cost (issue 26): each suite's work in this process, then with the
    verifier in a harness.Sandbox; wall, this thread's CPU, the calls and their round trips."""
    from specdec.harness import Sandbox

    print(
        f"\n{'harness, suite, verifier':34} {'calls':>6} {'wall s':>7} {'in-proc s':>9} "
        f"{'thread CPU':>10} {'in-proc':>8} {'trip ms':>8} {'load':>5}"
    )
    for suite in sc.SUITES:
        for name, fn in (("verify", sc.verify), ("verify row by row", row_by_row)):
            wall, cpu = time.perf_counter(), time.thread_time()
            _suite_work(suite, fn, np.random.default_rng(1))
            here_wall, here_cpu = time.perf_counter() - wall, time.thread_time() - cpu
            with Sandbox(lambda fn=fn: {"verifier": fn}) as sandbox:
                wall, cpu = time.perf_counter(), time.thread_time()
                _suite_work(suite, sandbox.function("verifier"), np.random.default_rng(1))
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            trip = (sandbox.wall - sandbox.inside) / sandbox.calls * 1e3  # pack, send, receive
            print(
                f"{suite + ', ' + name:34} {sandbox.calls:>6} {wall:>7.1f} {here_wall:>9.1f} "
                f"{cpu:>10.2f} {here_cpu:>8.2f} {trip:>8.2f} {os.getloadavg()[0]:>5.1f}"
            )


FALSE_ALARM_RUNS = {"small": 100_000, "engine": 40_000}  # simulated exact runs per suite


def audit_false_alarms():
    """Each suite's run-wise false-alarm rate on an exact verifier, simulated; written to
    specdec/data/audit_false_alarms.txt, which chapter 6 glues (seconds only printed)."""
    lines = [
        "# sc.null_false_alarms(suite, runs, seed=2026), written by make bench (scripts/bench.py)"
    ]
    print(
        f"\n{'false alarms, exact verifier':30} {'runs':>8} {'alarms':>7} {'rate':>9} "
        f"{'95 % interval':>20} {'seconds':>8}"
    )
    for suite, runs in FALSE_ALARM_RUNS.items():
        start = time.perf_counter()
        result = sc.null_false_alarms(suite, runs=runs, seed=2026)
        seconds = time.perf_counter() - start
        interval = f"{result['low']:.2e} to {result['high']:.2e}"
        print(
            f"{suite:30} {runs:>8,} {result['alarms']:>7} {result['rate']:>9.2e} "
            f"{interval:>20} {seconds:>8.0f}"
        )
        fields = result | {"draws": sc.suite_draws(suite), "level": sc.AUDIT_LEVEL, "seed": 2026}
        lines.append(" ".join(f"{key}={value}" for key, value in fields.items()))
    sc.FALSE_ALARMS.write_text("\n".join(lines) + "\n")


def main():
    """Print one row per workload, then the totals."""
    header = ["draws", "literal s", "fast s", "ratio", "floor s", "fast/floor"]
    widths = [10, 10, 8, 7, 8, 10]
    print(f"{'workload':34} " + " ".join(f"{h:>{w}}" for h, w in zip(header, widths)))
    totals = np.zeros(3)
    for name, draws, literal, fast, on_rng in WORKLOADS:
        n_uniforms = uniforms_used(on_rng)
        row = np.array(
            [
                seconds(literal, repeats=1),
                seconds(fast),
                seconds(lambda n=n_uniforms: np.random.default_rng(1).random(n)),
            ]
        )
        totals += row
        print(line(name, draws, *row))
    name, fast, on_rng = CONTROLS
    n_uniforms = uniforms_used(on_rng)
    controls = [seconds(fast), seconds(lambda: np.random.default_rng(1).random(n_uniforms))]
    print(line(name, 4 * N, None, *controls))
    print(line("the article workloads, total", None, *totals))
    print(
        line(
            "the whole book, with controls",
            None,
            None,
            totals[1] + controls[0],
            totals[2] + controls[1],
        )
    )
    verify_rows()
    verifier_rows()
    audit_rows()
    harness_rows()
    audit_false_alarms()


if __name__ == "__main__":
    main()
