"""Chapters 8–9: this machine's roofs, each measured by a kernel that reaches it, and the clock.

A model's call must read its weights and multiply by them. A roof is the fastest rate this
machine reaches at one of the two, on one thread:

- reading, by a one-row matrix-vector product (sgemv, one multiply-add per float32 weight read,
  in both of numpy's orientations) and a dot product (sdot), on a matrix that fits in the L3
  cache and on one eight times the L3, so from DRAM;
- multiplying, by a 1,024² float32 matrix product (sgemm).

Each is the best of several repeats. A call's floor is the longer of reading its weights once
and doing its FLOP at those rates; `above_roofs` checks, by example, that no measured call beat
its floor. Chapters 8 and 9 print the same roofs: `machine_rates` measures them once a build
and keeps them in the file that SPECDEC_RATES names (the Makefile sets it for the site).

Every time is the timing thread's CPU time (`time.thread_time`): with one BLAS thread, and
ONNX Runtime on one intra-op thread in sequential mode, a call's work runs on the calling
thread, so this clock counts the call and leaves out the time the operating system gave to
other processes, which the wall clock charges to whatever was running.
"""

import functools
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .checks import MAX_BYTES, _check_positive_count
from .transformer import one_blas_thread


def thread_seconds(fn, *args):
    """CPU seconds of this thread for one call fn(*args): the book's clock."""
    start = time.thread_time()
    fn(*args)
    return time.thread_time() - start


def on_one_thread(fn):
    """fn, run with one BLAS thread, so that the work it times runs on the timing thread."""

    @functools.wraps(fn)
    def with_one_thread(*args, **kwargs):
        with one_blas_thread():
            return fn(*args, **kwargs)

    return with_one_thread


class Machine(NamedTuple):
    """This machine's roofs, one thread: GEMM, reads from L3 and from DRAM, the L3's size."""

    gemm: float  # FLOP/s of a 1,024² float32 matrix product
    l3_read: float  # bytes/s of `read_rate` over a matrix a quarter of the L3
    dram_read: float  # bytes/s of `read_rate` over a matrix eight times the L3
    l3_bytes: int


def l3_bytes(default=32 * 2**20):
    """The last-level cache's size from sysfs (Linux), else default."""
    try:
        text = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
        return int(text.rstrip("K")) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return default


def _best(work, number, repeats):
    """The least thread CPU seconds of one work() over repeats timings of number calls each."""

    def timed():
        for _ in range(number):
            work()

    return min(thread_seconds(timed) for _ in range(repeats)) / number


def read_rate(n_bytes, repeats=7, rows=1024):
    """Bytes/s at which one BLAS thread reads a (rows, n_bytes / 4 / rows) float32 matrix with
    one multiply-add per float read: the best over repeats of a one-row sgemv in both of
    numpy's orientations (row @ matrix, matrix @ column) and the dot product of its halves."""
    _check_positive_count(n_bytes, "n_bytes", MAX_BYTES, "the matrix is allocated")
    _check_positive_count(repeats, "repeats", 1_000, "timings")
    _check_positive_count(rows, "rows")
    cols = n_bytes // 4 // rows
    if cols < 1:
        raise ValueError(f"n_bytes must be at least 4 · rows = {4 * rows}, got {n_bytes}")
    matrix = np.ones((rows, cols), np.float32)  # (rows, cols)
    row, column = np.ones((1, rows), np.float32), np.ones((cols, 1), np.float32)
    flat = matrix.reshape(-1)
    first, second = flat[: flat.size // 2], flat[flat.size // 2 :]  # (n/2,) each
    number = max(1, 2**25 // matrix.nbytes)  # a timing of at least 32 MiB read
    with one_blas_thread():
        row @ matrix  # first touch
        seconds = min(
            _best(lambda: row @ matrix, number, repeats),  # (1, cols): y = x·A
            _best(lambda: matrix @ column, number, repeats),  # (rows, 1): y = A·x
            _best(lambda: first @ second, number, repeats),  # a scalar: sdot
        )
    return 2 * first.nbytes / seconds


def measure_machine(repeats=5, l3=None):
    """Machine, measured now: GEMM and the reads at a quarter of the L3 and at eight times it
    (at most MAX_BYTES; l3: the cache size to assume, else the machine's)."""
    _check_positive_count(repeats, "repeats", 1_000, "timings")
    l3 = l3_bytes() if l3 is None else int(l3)
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    with one_blas_thread():
        a @ a
        gemm = 2 * 1024**3 / _best(lambda: a @ a, 1, repeats)
    dram = min(8 * l3, MAX_BYTES)  # past the L3, within the book's memory limit
    return Machine(gemm, read_rate(l3 // 4, 4 * repeats), read_rate(dram, repeats), l3)


def machine_rates(path=None):
    """The build's one measurement of the machine: read from path (else the file SPECDEC_RATES
    names) if it exists, else measured and written there; measured alone if neither is given."""
    path = path or os.environ.get("SPECDEC_RATES")
    if path and Path(path).exists():
        return Machine(**json.loads(Path(path).read_text()))
    rates = measure_machine()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        spare = Path(f"{path}.{os.getpid()}")  # written whole, then renamed: never half read
        spare.write_text(json.dumps(rates._asdict()))
        spare.replace(path)
    return rates


def matrix_weights(config):
    """Weights a call reads in full and multiplies by each position: layers and unembedding."""
    d = config.d_model
    return config.n_layers * (4 + 2 * config.ff_mult) * d * d + d * config.n_outputs


def _floor(n_bytes, flops, rates):
    """Seconds to read n_bytes once from L3 or DRAM (whichever holds them), or to do flops at
    the GEMM rate, whichever is longer."""
    read = np.where(n_bytes <= rates.l3_bytes, rates.l3_read, rates.dram_read)
    return np.maximum(n_bytes / read, flops / rates.gemm)


def floor_seconds(config, n, rates):
    """The least time a call scoring n positions can take here (float32 weights)."""
    weights = matrix_weights(config)
    return float(_floor(4 * weights, 2 * weights * n, rates))


def above_roofs(points, rates):
    """The rows of points (seconds, flops, bytes per call) that beat their floor: a call faster
    than its roofs allow, which a roof measured by a kernel that reaches it never shows."""
    floor = _floor(points.bytes.to_numpy(), points.flops.to_numpy(), rates)
    return points[points.seconds.to_numpy() < floor]


def one_call(model, ids, context):
    """work(): one forward call of model (a transformer of chapter 8 or 9) scoring ids[context]
    after a cached ids[:context], rolled back after, so that every call is the same."""
    model.reset(1, context + 1)
    model.prefill(ids[None, :context])
    back = np.array([context])

    def work():
        model.forward(ids[None, context : context + 1])
        model.rollback(back)

    return work


def two_clocks(work, calls):
    """(calls, 3): for each of calls calls of work(), this thread's CPU seconds, the wall
    clock's seconds, and how often the thread was preempted meanwhile (0: a quiet call).

    A wait for another thread is a voluntary switch and leaves a call quiet, so work done off
    the timing thread shows as thread time below wall time in quiet calls."""
    _check_positive_count(calls, "calls", 100_000, "timings")
    import resource  # Linux: the thread's own count of involuntary context switches

    out = np.empty((calls, 3))
    for i in range(calls):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        wall, cpu = time.perf_counter(), time.thread_time()
        work()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        out[i] = cpu, wall, resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - before
    return out


def quiet_agreement(clocks):
    """(median thread seconds over wall seconds of the quiet calls of `two_clocks`, how many
    calls were quiet); NaN and 0 when none was."""
    quiet = clocks[clocks[:, 2] == 0]
    if not len(quiet):
        return float("nan"), 0
    return float(np.median(quiet[:, 0] / quiet[:, 1])), len(quiet)


def _position_costs(model, ids, start, positions, repeats, width=None):
    """{n: median seconds of forward on ids[start : start + n] after a cached ids[:start]}, in
    a cache of width slots (None: start + the largest n), one cache for every n."""
    model.reset(1, start + max(positions) if width is None else width)
    model.prefill(ids[None, :start])
    times = {n: [] for n in positions}
    for _ in range(repeats):
        for n in positions:  # interleaved, so that drift touches every n alike
            times[n].append(thread_seconds(model.forward, ids[None, start : start + n]))
            model.rollback(np.array([start]))
    return {n: float(np.median(t)) for n, t in times.items()}
