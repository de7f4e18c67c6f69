"""Chapter 8: a decoder-only transformer in numpy, small enough to read: the cost model.

Each call runs the real forward pass of a model of the configured size (embeddings, causal
attention with a KV cache, MLP, layer norm, seeded random weights). The weights are random, so
the logits mean nothing; to keep exactness and α known exactly, a LawModel reports the toy's
laws (p or q_w from `models`) at each position's context instead. What the transformer
contributes is the time a call takes.

Token ids are context rows of `models`: 0 is BOS, token t is t + 1, so `law[ids]` is the law of
the next token after each input.
"""

import functools
import math
import os
import platform
import time
from dataclasses import dataclass
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_info, threadpool_limits

from .checks import _check_count, _check_memory, _check_positive_count
from .exact import target_joint
from .models import BOS, CONTEXTS, P_MATRIX, V, draft_matrix
from .rule import EXACT_RULE
from .stats import compare
from .theory import alpha_exact, chain_stats, measured_cost_speedup, walltime_speedup
from .verify import _sample_rows, _verify

BLAS_THREADS = 1  # every timing runs with one BLAS thread, pinned here, not by the shell


@functools.cache
def _blas_libraries():
    """The BLAS libraries loaded in this process, looked up once (a lookup takes milliseconds)."""
    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS runs on BLAS_THREADS threads, microseconds to enter: what a
    timed loop uses (threadpool_limits itself looks the libraries up again each time)."""
    return _blas_libraries().limit(limits=BLAS_THREADS, user_api="blas")


# --------------------------------------------------------------------------------------------
# The model: a config, seeded weights, a forward pass with a KV cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Sizes of a decoder-only transformer; d_model must split evenly into n_heads."""

    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    ff_mult: int = 4  # the MLP's hidden width is ff_mult · d_model
    max_len: int = 256  # positions the model knows (its position embeddings)
    n_inputs: int = len(CONTEXTS)  # ids the embedding holds: the toy's 19 contexts
    n_outputs: int = V  # tokens the logits score: the toy's 18
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self):
        for name in (
            "d_model",
            "n_layers",
            "n_heads",
            "ff_mult",
            "max_len",
            "n_inputs",
            "n_outputs",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    @property
    def n_params(self):
        """Weights: embeddings (inputs + max_len)·d, (4 + 2·ff_mult)·d² + 4·d a layer, unembed."""
        d = self.d_model
        per_layer = (4 + 2 * self.ff_mult) * d * d + 4 * d
        return (
            (self.n_inputs + self.max_len) * d
            + self.n_layers * per_layer
            + d * (self.n_outputs + 2)
        )

    @property
    def weight_bytes(self):
        """Bytes of the matrices one call reads in full: the layers and the unembedding."""
        d = self.d_model
        matrices = self.n_layers * (4 + 2 * self.ff_mult) * d * d + d * self.n_outputs
        return matrices * np.dtype(self.dtype).itemsize


# The chapter's models: three sizes for the cost curves; the race uses "medium" and DRAFT.
SIZES = {
    "small": Config(d_model=256, n_layers=2, n_heads=4),
    "medium": Config(d_model=640, n_layers=2, n_heads=8),
    "large": Config(d_model=1024, n_layers=2, n_heads=8),
}
TARGET = SIZES["medium"]
DRAFT = Config(d_model=128, n_layers=1, n_heads=4)
RACE_SETTINGS = [(0.9, 4), (0.5, 3), (0.0, 2)]  # (w, gamma); the first is the main one


class Layer(NamedTuple):
    """One transformer block's weights."""

    ln1: tuple  # (gain (d,), bias (d,))
    w_qkv: np.ndarray  # (d, 3d)
    w_o: np.ndarray  # (d, d)
    ln2: tuple
    w_up: np.ndarray  # (d, ff)
    w_down: np.ndarray  # (ff, d)


def _layer_norm(x, norm, eps=1e-5):
    """(x − mean) / √(var + ε) · gain + bias over the last axis."""
    gain, bias = norm
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + bias


def _gelu(x):
    """GELU, tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))  # x·x·x: no pow


def _dense(x, w):
    """x @ w as one matrix product over all B·n rows of x (B, n, d): the weights are read once."""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[1])


def _softmax(x, top=None):
    """exp(x − max) normalised over the last axis; top, if given, is that max (keepdims)."""
    e = np.exp(x - (x.max(axis=-1, keepdims=True) if top is None else top))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_law(logits, temperature=1.0):
    """softmax(logits / T) over the last axis, in float64: the sampling law at temperature T.

    Logits may be −inf (a token of probability 0), never NaN or +inf, and a row needs one finite
    logit. Where logits / T overflows (T below about 1e-306 for logits of order 1), the law is
    its exact limit as T → 0: the argmax, ties split uniformly."""
    if isinstance(temperature, bool) or not isinstance(temperature, Real) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite, got {temperature!r}")
    logits = np.asarray(logits, dtype=np.float64)
    top = logits.max(axis=-1, keepdims=True) if logits.size else logits
    if np.isnan(top).any() or np.isposinf(top).any():
        raise ValueError("logits hold NaN or +inf: the model's weights or inputs are not finite")
    if np.isneginf(top).any():
        raise ValueError("a row of logits is all −inf: no token has positive probability")
    with np.errstate(over="ignore"):
        scaled = logits / float(temperature)
    # overflow to +inf, or a row whose every scaled logit is −inf (all negative at a tiny T):
    # softmax is shift-invariant, so shift first
    if np.isposinf(scaled).any() or np.isneginf(scaled.max(axis=-1)).any():
        with np.errstate(over="ignore"):
            scaled = (logits - top) / float(temperature)  # 0 at the argmax, else −large or −inf
    return _softmax(scaled)


def quick_law(logits, temperature):
    """softmax_law(logits, temperature), bit for bit, from about half the numpy calls: for a
    loop that checked its temperature once. Where a row's largest scaled logit is not finite
    (NaN, +inf, an all −inf row, or logits / T overflowing), softmax_law itself answers, with
    its error or its limit as T → 0."""
    x = np.asarray(logits, dtype=np.float64)
    if not x.size:
        return softmax_law(logits, temperature)
    if temperature != 1:
        with np.errstate(over="ignore"):
            x = x / float(temperature)
    top = x.max(axis=-1, keepdims=True)
    if not np.isfinite(top).all():
        return softmax_law(logits, temperature)
    return _softmax(x, top)  # softmax_law's own last step, on the same x


def _init_weights(config):
    """Seeded random weights: normal(0, 1/√fan_in) matrices, unit gains, zero biases."""
    rng = np.random.default_rng(config.seed)
    d, ff, dt = config.d_model, config.ff_mult * config.d_model, config.dtype

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(dt)

    def norm():
        return np.ones(d, dt), np.zeros(d, dt)

    layers = [
        Layer(norm(), matrix(d, 3 * d), matrix(d, d), norm(), matrix(d, ff), matrix(ff, d))
        for _ in range(config.n_layers)
    ]
    embed = matrix(config.n_inputs, d) * math.sqrt(d)  # (n_inputs, d)
    position = matrix(config.max_len, d) * (0.1 * math.sqrt(d))  # (max_len, d)
    return embed, position, layers, norm(), matrix(d, config.n_outputs)


class TinyTransformer:
    """A decoder-only transformer with a KV cache for `batch` sequences at once.

    Its weights are seeded random ones (chapter 8), or trained ones passed in (chapter 9) as
    (embed, position, layers, final_norm, unembed), shaped as `_init_weights` makes them.
    """

    def __init__(self, config, batch=1, weights=None):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config, got {type(config).__name__}")
        self.config = config
        self.embed, self.position, self.layers, self.final_norm, self.unembed = (
            weights or _init_weights(config)
        )
        self.reset(batch)

    def reset(self, batch=1, length=None):
        """Empty the cache and make room for `batch` sequences of `length` ≤ max_len positions."""
        if not isinstance(batch, Integral) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        cfg = self.config
        length = cfg.max_len if length is None else length
        if (
            not isinstance(length, Integral)
            or isinstance(length, bool)
            or not 1 <= length <= cfg.max_len
        ):
            raise ValueError(f"length must be an int in [1, max_len={cfg.max_len}], got {length!r}")
        batch, length = int(batch), int(length)  # numpy integers too
        shape = (cfg.n_layers, batch, length, cfg.d_model)  # (L, B, length, d)
        _check_memory(2 * math.prod(shape) * np.dtype(cfg.dtype).itemsize, "the KV cache")
        self.keys = np.zeros(shape, cfg.dtype)
        self.values = np.zeros(shape, cfg.dtype)
        self.lengths = np.zeros(batch, dtype=np.int64)  # cached positions per sequence

    @property
    def batch(self):
        """Number of sequences the cache holds."""
        return len(self.lengths)

    def rollback(self, lengths):
        """Forget every cached position at or past lengths (B,): the cache keeps the prefix."""
        lengths = np.asarray(lengths)
        if not np.issubdtype(lengths.dtype, np.integer):
            raise TypeError(f"lengths must be integers, got dtype {lengths.dtype}")
        lengths = np.full(self.lengths.shape, lengths, np.int64)  # a scalar for every sequence
        if (lengths < 0).any() or (lengths > self.lengths).any():
            raise ValueError(f"lengths must lie in [0, cached length], got {lengths}")
        self.lengths = lengths  # stale entries are masked, then overwritten

    def select(self, rows):
        """Keep only the sequences where rows (B,) is True, with their caches."""
        self.keys, self.values = self.keys[:, rows], self.values[:, rows]
        self.lengths = self.lengths[rows]

    def prefill(self, ids):
        """Cache ids (B, n) from an empty cache, running each distinct row once (prefix sharing)."""
        unique, inverse = np.unique(self._check_ids(ids), axis=0, return_inverse=True)
        full = self.keys, self.values  # (L, B, length, d) each, filled in place below
        self.keys, self.values = (a[:, : len(unique)] for a in full)
        self.lengths = np.zeros(len(unique), dtype=np.int64)
        self.forward(unique)
        n, inverse = ids.shape[1], inverse.ravel()
        if len(unique) == 1:  # one prompt: its cache, broadcast to every row
            rows = [a[:, :1, :n].copy() for a in (self.keys, self.values)]
        else:  # (L, B, n, d): each row gets its distinct prompt's cache, one gather
            rows = [a[:, inverse, :n] for a in (self.keys, self.values)]
        for big, small in zip(full, rows):
            big[:, :, :n] = small
        self.keys, self.values = full
        self.lengths = np.full(len(ids), ids.shape[1], dtype=np.int64)

    def next_probs(self, ids, temperature=1.0):
        """The law of the token after each row of ids (B, T): softmax(logits / T), float64."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or not 1 <= ids.shape[1] <= self.config.max_len:
            raise ValueError(
                f"ids must have shape (B, T) with 1 <= T <= max_len={self.config.max_len}, the "
                f"positions the model knows (no window slides), got {ids.shape}"
            )
        self.reset(len(ids), ids.shape[1])
        return softmax_law(self.forward(ids)[:, -1], temperature)

    def forward(self, ids):
        """Logits (B, n, n_outputs) for n new ids per sequence (B, n), appended after the cache."""
        ids = self._check_ids(ids)
        pos = self.lengths[:, None] + np.arange(ids.shape[1])  # (B, n) absolute positions
        x = self.embed[ids] + self.position[pos]  # (B, n, d)
        for index, layer in enumerate(self.layers):
            x = x + self._attend(index, layer, _layer_norm(x, layer.ln1), pos)
            x = x + _dense(_gelu(_dense(_layer_norm(x, layer.ln2), layer.w_up)), layer.w_down)
        self.lengths = self.lengths + ids.shape[1]
        return _dense(_layer_norm(x, self.final_norm), self.unembed)  # (B, n, V), config's dtype

    def _attend(self, index, layer, h, pos):
        """Causal multi-head attention of the new positions over the cache and themselves."""
        batch, n, d = h.shape
        heads = self.config.n_heads
        q, k, v = np.split(_dense(h, layer.w_qkv), 3, axis=-1)  # (B, n, d) each
        rows = np.arange(batch)[:, None]
        self.keys[index][rows, pos] = k
        self.values[index][rows, pos] = v
        span = int(pos.max()) + 1

        def split(a):  # (B, T, d) -> (B, H, T, d/H)
            return a.reshape(batch, a.shape[1], heads, d // heads).transpose(0, 2, 1, 3)

        scores = split(q) @ split(self.keys[index][:, :span]).transpose(0, 1, 3, 2)  # (B,H,n,T)
        visible = np.arange(span) <= pos[:, None, :, None]  # (B, 1, n, T): causal mask
        scores = np.where(
            visible, scores / math.sqrt(d // heads), -np.inf
        )  # weak float: keeps dtype
        out = _softmax(scores) @ split(self.values[index][:, :span])  # (B, H, n, d/H)
        return _dense(out.transpose(0, 2, 1, 3).reshape(batch, n, d), layer.w_o)

    def _check_ids(self, ids):
        """ids as an int array (B, n) of context rows that fits in the cache, else an error."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != self.batch or ids.shape[1] < 1:
            raise ValueError(f"ids must have shape ({self.batch}, n >= 1), got {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"ids must be integers, got dtype {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.config.n_inputs:
            raise ValueError(f"ids must lie in [0, {self.config.n_inputs})")
        if self.lengths.max() + ids.shape[1] > self.keys.shape[2]:
            reach = self.lengths.max() + ids.shape[1]
            raise ValueError(
                f"the cache holds {self.keys.shape[2]} positions (at most max_len="
                f"{self.config.max_len}); a sequence would reach {reach}"
            )
        return ids


class LawModel:
    """A transformer call that reports a fixed table's law: the toy's p or q_w, not its logits."""

    def __init__(self, net, law):
        law = np.asarray(law, dtype=float)
        if law.shape != (len(CONTEXTS), V):
            raise ValueError(f"law must have shape ({len(CONTEXTS)}, {V}), got {law.shape}")
        self.net, self.law = net, law
        self.seconds = 0.0  # CPU seconds spent in forward passes, for the race's overhead

    def __call__(self, ids):
        """Run the forward pass on ids (B, n); return law[ids], the next-token laws (B, n, 18)."""
        self.seconds += _seconds(lambda: self.net.forward(ids))  # the random logits: discarded
        return self.law[ids]


# --------------------------------------------------------------------------------------------
# Generation through the models: plain decoding and speculative decoding with cache rollback
# --------------------------------------------------------------------------------------------


class Generation(NamedTuple):
    """Emitted tokens (B, n_tokens), total tokens emitted per sequence, and target calls."""

    tokens: np.ndarray
    emitted: np.ndarray  # (B,) may exceed n_tokens: a step emits up to gamma + 1
    steps: int


def _check_run(n_tokens, model, gamma=1):
    """Raise unless n_tokens and gamma are valid and the cache can hold the run."""
    _check_count(n_tokens, "n_tokens")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be a positive int, got {gamma!r}")
    if n_tokens + gamma + 1 > model.net.config.max_len:
        raise ValueError(f"n_tokens + gamma + 1 must be at most max_len of {model.net.config}")


def autoregressive(target, n_tokens, rng, batch=1):
    """n_tokens per sequence from BOS, one target call of one position per token."""
    _check_run(n_tokens, target)
    target.net.reset(batch)
    out = np.zeros((batch, n_tokens), dtype=np.int64)
    last = np.zeros((batch, 1), dtype=np.int64)  # BOS
    for i in range(n_tokens):
        out[:, i] = _sample_rows(target(last)[:, 0], rng)
        last = out[:, i : i + 1] + 1
    return Generation(out, np.full(batch, n_tokens), n_tokens)


def speculative(target, draft, n_tokens, gamma, rng, batch=1, rule=EXACT_RULE):
    """Speculative decoding through both models until every sequence has n_tokens."""
    _check_run(n_tokens, target, gamma)
    _check_run(n_tokens, draft, gamma)
    target.net.reset(batch)
    draft.net.reset(batch)
    rows = np.arange(batch)[:, None]
    seq = np.zeros((batch, n_tokens + gamma + 2), dtype=np.int64)  # context rows, BOS first
    filled = np.ones(batch, dtype=np.int64)  # the target's cache holds seq[:, :filled - 1]
    steps = 0
    while filled.min() <= n_tokens:
        drafts, q_laws = _draft(draft, seq, filled, gamma, rng)
        ids = np.concatenate([seq[rows[:, 0], filled - 1][:, None], drafts + 1], axis=1)
        p_laws = target(ids)  # (B, gamma + 1, V): one call scores every position
        accepted, emitted = _verify(p_laws, q_laws, drafts, rng, rule)
        accepted = np.where(filled <= n_tokens, accepted, -1)  # finished rows emit nothing
        target.net.rollback(filled + accepted)  # keep the last token and the accepted drafts
        draft.net.rollback(filled + np.minimum(accepted, gamma - 1))
        width = np.arange(gamma + 1) <= accepted[:, None]  # (B, gamma + 1) emitted slots
        slots = np.minimum(filled[:, None] + np.arange(gamma + 1), seq.shape[1] - 1)
        seq[rows, slots] = np.where(width, emitted + 1, seq[rows, slots])
        filled += accepted + 1
        steps += 1
    return Generation(seq[:, 1 : n_tokens + 1] - 1, filled - 1, steps)


def _draft(draft, seq, filled, gamma, rng):
    """gamma draft tokens (B, gamma) and their laws (B, gamma, V), one draft call each."""
    batch = len(filled)
    rows = np.arange(batch)[:, None]
    pending = int((filled - draft.net.lengths).max())  # 1, or 2 after a fully accepted step
    draft.net.rollback(filled - pending)
    q = draft(seq[rows, (filled - pending)[:, None] + np.arange(pending)])[:, -1]  # (B, V)
    tokens = np.zeros((batch, gamma), dtype=np.int64)
    laws = np.zeros((batch, gamma, V))
    for i in range(gamma):
        if i:
            q = draft(tokens[:, i - 1 : i] + 1)[:, 0]
        laws[:, i] = q
        tokens[:, i] = _sample_rows(q, rng)
    return tokens, laws


def law_models(target_config, draft_config, w, batch=1):
    """(target reporting p, draft reporting q_w), each a LawModel over its own transformer."""
    target = LawModel(TinyTransformer(target_config, batch), P_MATRIX)
    return target, LawModel(TinyTransformer(draft_config, batch), draft_matrix(w))


def exactness_check(n_runs, gamma=2, w=0.3, seed=13, rule=EXACT_RULE, config=None):
    """Chapter 3's joint test, through the transformers: first two tokens of n_runs sequences."""
    config = config or Config(d_model=8, n_layers=1, n_heads=2, max_len=16)
    target, draft = law_models(config, config, w, batch=n_runs)
    run = speculative(target, draft, 2, gamma, np.random.default_rng(seed), n_runs, rule)
    return compare(run.tokens, target_joint(2, BOS, exact=False))


# --------------------------------------------------------------------------------------------
# The stopwatch: call times, memory bandwidth, the race
# --------------------------------------------------------------------------------------------


def _seconds(fn):
    """CPU seconds of this thread for one call of fn() (the wall clock minus time descheduled)."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def call_times(config, positions, repeats=5, context=64, batch=1):
    """Seconds of one forward call after `context` cached positions, (repeats, len(positions))."""
    net = TinyTransformer(config, batch)
    ids = np.ones((batch, max(max(positions), context, 1)), dtype=np.int64)
    net.forward(ids[:, : max(context, 1)])  # a context to attend to
    base = net.lengths.copy()
    out = np.zeros((repeats, len(positions)))
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        net.forward(ids[:, : max(positions)])  # warm-up: first touch of the cache rows used
        for r in range(repeats):  # repeats interleaved over the positions
            for j, n in enumerate(positions):
                net.rollback(base)
                out[r, j] = _seconds(lambda n=n: net.forward(ids[:, :n]))
    return out


def timed_run(fn):
    """(CPU seconds of this thread, result) of fn() with one BLAS thread."""
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        start = time.thread_time()
        result = fn()
        return time.thread_time() - start, result


def machine():
    """{cpu, blas, architecture, threads, cores, python, numpy}: what measured this chapter's
    times (blas is numpy's own library, architecture the kernels OpenBLAS chose for this CPU;
    scipy may load a second library, limited to one thread as well)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    mine = [i for i in blas if "numpy" in os.path.basename(os.path.dirname(i["filepath"]))]
    lib = (mine or blas or [None])[0]  # the library numpy's matrix products call
    name = f"{lib['internal_api']} {lib['version']}" if lib else "unknown BLAS"
    return {
        "cpu": cpu,
        "blas": name,
        "architecture": (lib or {}).get("architecture") or "unknown",  # OpenBLAS's kernel set
        "threads": BLAS_THREADS,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


# OpenBLAS's single-precision gemm kernel for Haswell-class CPUs (kernel/x86_64/
# sgemm_kernel_8x4_haswell_2.c, which KERNEL.HASWELL names) covers a product's rows in blocks
# of 12, 8, 4, 2 and 1, largest first; each block is one pass of the kernel over the packed
# weights. numpy's matmul sends a one-row product to gemv instead (numpy's matmul.c.src).
SGEMM_ROW_BLOCKS = {"Haswell": (12, 8, 4, 2, 1)}


def kernel_blocks(rows, blocks=SGEMM_ROW_BLOCKS["Haswell"]):
    """The row blocks, largest first, that the gemm kernel splits `rows` ≥ 2 into: (4, 2, 1)
    for 7; () for one row, which numpy's matmul hands to gemv."""
    _check_positive_count(rows, "rows")
    if rows == 1:
        return ()
    out, left = [], int(rows)
    for block in blocks:
        while left >= block:
            out.append(block)
            left -= block
    return tuple(out)


def product_times(config, rows, repeats=15):
    """Best thread CPU seconds of x @ w, x of shape (n, d_in), for each of the first layer's
    weight matrices and each n in rows: {matrix name: (len(rows),)}, one BLAS thread."""
    layer = TinyTransformer(config).layers[0]
    out = {}
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for name in ("w_qkv", "w_o", "w_up", "w_down"):
            w = getattr(layer, name)
            best = np.full(len(rows), np.inf)
            for _ in range(repeats):  # repeats interleaved over the row counts
                for j, n in enumerate(rows):
                    x = np.ones((n, w.shape[0]), w.dtype)
                    best[j] = min(best[j], _seconds(lambda x=x, w=w: x @ w))
            out[name] = best
    return out


COST_CALLS = 3  # timed calls of each kind after each repeat of the race


class RacePoint(NamedTuple):
    """One (w, gamma) over all repeats: seconds per token, realised tokens per sequence-step,
    steps, and the seconds per step spent outside model calls."""

    w: float
    gamma: int
    seconds_per_token: float
    tokens_per_step: float
    steps: int
    overhead: float


class Race(NamedTuple):
    """Plain decoding's median seconds per token, the speculative points, and call costs."""

    plain: float
    points: list
    target_call: dict  # {positions: median seconds of one target call}
    draft_call: float  # median seconds of one draft call of one position
    plain_overhead: float  # median seconds per plain call spent outside model calls
    t1_spread: tuple  # (lowest, highest) of the timed one-position target calls

    def cost_ratio(self):
        """c = T_draft(1) / T_target(1)."""
        return self.draft_call / self.target_call[1]

    def verify_cost(self, gamma):
        """v(γ) = T_target(γ + 1) / T_target(1)."""
        return self.target_call[gamma + 1] / self.target_call[1]


def _call_costs(target, draft, positions, context, batch=1, draft_calls=4):
    """Seconds of one target call per entry of positions, then of one draft call (the mean of
    draft_calls in a row, as in a step's drafting loop), each after `context` cached positions;
    target and draft are TinyTransformers, each call scores `batch` sequences."""
    ids = np.ones((batch, max(max(positions), context)), dtype=np.int64)
    for net in (target, draft):
        if net.batch != batch or np.any(net.lengths != context):  # prefill once, then reuse
            net.reset(batch)
            net.forward(ids[:, :context])
    out = []
    for n in positions:
        out.append(_seconds(lambda n=n: target.forward(ids[:, :n])))
        target.rollback(context)
    draft_seconds = 0.0
    for _ in range(draft_calls):
        draft_seconds += _seconds(lambda: draft.forward(ids[:, :1]))
        draft.rollback(context)
    return [*out, draft_seconds / draft_calls]


def race(target_config, draft_config, settings, n_tokens=128, repeats=3, batch=1, seed=8):
    """Race plain against speculative decoding, repeats interleaved, with call costs between."""
    target = LawModel(TinyTransformer(target_config), P_MATRIX)
    draft_net = TinyTransformer(draft_config)
    drafts = {w: LawModel(draft_net, draft_matrix(w)) for w, _ in settings}
    positions = sorted({1} | {gamma + 1 for _, gamma in settings})
    rng = np.random.default_rng(seed)
    plain, spec, costs = [], {s: [] for s in settings}, []
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for _ in range(repeats):
            target.seconds = 0.0
            seconds, _ = timed_run(lambda: autoregressive(target, n_tokens, rng, batch))
            plain.append((seconds, seconds - target.seconds))
            for w, gamma in settings:
                target.seconds = drafts[w].seconds = 0.0
                seconds, run = timed_run(
                    lambda w=w, g=gamma: speculative(target, drafts[w], n_tokens, g, rng, batch)
                )
                outside = seconds - target.seconds - drafts[w].seconds
                spec[w, gamma].append((seconds, outside, int(run.emitted.sum()), run.steps))
            for _ in range(COST_CALLS):  # the costs, at the race's mean context length
                costs.append(_call_costs(target.net, draft_net, positions, n_tokens // 2, batch))
    points = []
    for (w, gamma), runs in spec.items():  # total time over total tokens: every step counts
        seconds, outside, tokens, steps = np.array(runs).T
        per_token = float(seconds.sum() / tokens.sum())
        per_step = float(outside.sum() / steps.sum())  # outside model calls, per target call
        tokens_per_step = tokens.sum() / (steps.sum() * batch)
        points.append(RacePoint(w, gamma, per_token, tokens_per_step, int(steps.sum()), per_step))
    median, costs = np.median(costs, axis=0), np.array(costs)
    target_call = {n: float(t) for n, t in zip(positions, median)}
    seconds, outside = np.median(plain, axis=0) / n_tokens  # per plain call: total, outside
    t1 = (float(costs[:, 0].min()), float(costs[:, 0].max()))
    return Race(seconds / batch, points, target_call, float(median[-1]), outside, t1)


def race_rows(result):
    """Per race point: measured speedup beside the measured-cost form and Theorem 3.8."""
    c = result.cost_ratio()
    rows = []
    for point in result.points:
        v = result.verify_cost(point.gamma)
        expected = chain_stats(point.w, point.gamma).tokens_per_step
        measured = result.plain / point.seconds_per_token
        overhead = point.overhead / result.target_call[1]
        plain_overhead = result.plain_overhead / result.target_call[1]
        predicted = measured_cost_speedup(expected, point.gamma, c, v, overhead, plain_overhead)
        rows.append(
            {
                "w": point.w,
                "gamma": point.gamma,
                "E[tokens]": expected,
                "tokens/step seen": float(point.tokens_per_step),
                "c": c,
                "v(gamma)": v,
                "o": overhead,
                "o plain": plain_overhead,
                "measured": measured,
                "measured-cost form": predicted,
                "form without o": measured_cost_speedup(expected, point.gamma, c, v),
                "theorem 3.8": walltime_speedup(alpha_exact(point.w), point.gamma, c),
                "error": predicted / measured - 1,
            }
        )
    return rows


def batch_costs(target_config, draft_config, batches, gamma, repeats=3, context=16):
    """Median seconds (len(batches), 3) of T_target(B), T_target(B·(γ+1)) and T_draft(B)."""
    target, draft = TinyTransformer(target_config), TinyTransformer(draft_config)
    out = np.zeros((repeats, len(batches), 3))
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for j, batch in enumerate(batches):
            for r in range(repeats):
                out[r, j] = _call_costs(target, draft, (1, gamma + 1), context, batch)
    return np.median(out, axis=0)


def batch_speedup(costs, tokens_per_step, gamma):
    """Measured-cost form per batch: E·T_target(B) / (γ·T_draft(B) + T_target(B·(γ+1)))."""
    one, verify, draft = np.asarray(costs).T
    return [
        measured_cost_speedup(tokens_per_step, gamma, d / t, v / t)
        for t, v, d in zip(one, verify, draft)
    ]
