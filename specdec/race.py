"""Chapter 9's race, predicted before it is run.

The prediction uses nothing from the race itself:

1. `call_costs`: isolated calls at the race's context lengths give T(1), the target's time for
   one position; v(γ), its time for γ + 1 positions over T(1); c, a draft call over T(1); and
   the prompt's prefill.
2. `loop_overhead`: the generation loop run with every model call replaced by a lookup of the
   logits it returned before (`Replay`) gives the time a step spends outside model calls, o,
   and a plain token's, o_plain.
3. `sampled_alpha`: α as the mean of β = Σ min(p, q) along the target's own samples (the
   contexts decoding meets), and Equation 1's tokens per call from it.

`predict` combines them; `race` then times plain and speculative decoding interleaved (plain,
setting, plain, ...), and `summarise` gives each setting's speedup with a bootstrap interval
over prompts and repeats, and the best setting chosen on half of the repeats and measured on
the other half.
"""

import copy
import time
from typing import NamedTuple

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from .checks import _check_count
from .runtime import RuntimeTransformer
from .theory import expected_tokens
from .transformer import BLAS_THREADS, TinyTransformer, softmax_law


def _seconds(fn, *args):
    """Wall-clock seconds of one call fn(*args)."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


# ---- 1. Isolated call costs ---------------------------------------------------------------


class Costs(NamedTuple):
    """Median seconds of isolated calls, averaged over the race's context lengths."""

    target: dict  # {positions n: seconds of one target call scoring n positions}
    draft: dict  # {draft name: seconds of one call scoring one position}
    prefill: dict  # {"target" or draft name: seconds to cache the prompt}

    @property
    def t1(self):
        """T(1): one target call scoring one position."""
        return self.target[1]

    def v(self, gamma):
        """v(γ): a target call scoring γ + 1 positions, in units of T(1)."""
        return self.target[gamma + 1] / self.t1

    def c(self, name):
        """c: one draft call, in units of T(1)."""
        return self.draft[name] / self.t1


def _position_costs(model, ids, start, positions, repeats):
    """{n: median seconds of forward on ids[start : start + n] after a cached ids[:start]}."""
    model.reset(1, start + max(positions))
    model.prefill(ids[None, :start])
    times = {n: [] for n in positions}
    for _ in range(repeats):
        for n in positions:  # interleaved, so that drift touches every n alike
            times[n].append(_seconds(model.forward, ids[None, start : start + n]))
            model.rollback(np.array([start]))
    return {n: float(np.median(t)) for n, t in times.items()}


def call_costs(pair, drafts, max_positions, contexts, prompt_length, repeats=9):
    """Costs of the pair's calls at each context length in contexts (the race's), one BLAS
    thread; prefill of a prompt_length-token prompt."""
    _check_count(max_positions, "max_positions", pair.context)
    _check_count(repeats, "repeats")
    ids = pair.encode(pair.heldout_text[: pair.context])
    positions = list(range(1, max_positions + 1))
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        target = [_position_costs(pair.target, ids, L, positions, repeats) for L in contexts]
        draft = {
            name: float(
                np.mean(
                    [_position_costs(pair.drafts[name], ids, L, [1], repeats)[1] for L in contexts]
                )
            )
            for name in drafts
        }
        prefill = {}
        for name, model in [("target", pair.target)] + [(n, pair.drafts[n]) for n in drafts]:
            model.reset(1, pair.context)
            times = []
            for _ in range(repeats):
                model.reset(1, pair.context)
                times.append(_seconds(model.prefill, ids[None, : prompt_length - 1]))
            prefill[name] = float(np.median(times))
    target = {n: float(np.mean([t[n] for t in target])) for n in positions}
    return Costs(target, draft, prefill)


# ---- 2. The loop's own time: model calls replaced by lookups -------------------------------


class Replay:
    """A model's cache interface that records the logits of each forward call of a run, then
    returns them in order without computing anything: the same run, minus the model's time."""

    def __init__(self, model):
        self.model, self.config = model, getattr(model, "config", None)
        self.outputs, self.replaying, self._next = [], False, 0

    def replay(self):
        """From now on, return the recorded logits in order, from the first."""
        self.replaying, self._next = True, 0

    @property
    def batch(self):
        """Number of sequences the cache holds."""
        return len(self.lengths)

    def reset(self, batch=1, length=None):
        """Empty the cache (the real one only while recording)."""
        if not self.replaying:
            self.model.reset(batch, length)
        self.lengths = np.zeros(batch, dtype=np.int64)

    def prefill(self, ids):
        """Cache ids (B, n) from an empty cache."""
        if not self.replaying:
            self.model.prefill(ids)
        self.lengths = np.full(len(ids), ids.shape[1], dtype=np.int64)

    def forward(self, ids):
        """The recorded logits of this call (replaying), or the model's (recording)."""
        if self.replaying:
            out, self._next = self.outputs[self._next], self._next + 1
        else:
            out = self.model.forward(ids)
            self.outputs.append(out)
        self.lengths = self.lengths + ids.shape[1]
        return out

    def rollback(self, lengths):
        """Forget every cached position at or past lengths (B,)."""
        if not self.replaying:
            self.model.rollback(lengths)
        self.lengths = np.broadcast_to(np.asarray(lengths), self.lengths.shape).astype(np.int64)

    def select(self, rows):
        """Keep only the sequences where rows (B,) is True."""
        if not self.replaying:
            self.model.select(rows)
        self.lengths = self.lengths[rows]


def on_runtime(pair):
    """A copy of pair whose transformers run in ONNX Runtime (count drafts stay as they are)."""
    twin = copy.copy(pair)
    twin.target = RuntimeTransformer.twin(pair.target)
    twin.drafts = {
        name: RuntimeTransformer.twin(m) if isinstance(m, TinyTransformer) else m
        for name, m in pair.drafts.items()
    }
    return twin


def _replayed(pair, draft):
    """A copy of pair whose target (and draft) are Replay wrappers of the real ones."""
    twin = copy.copy(pair)
    twin.target = Replay(pair.target)
    twin.drafts = {} if draft is None else {draft: Replay(pair.drafts[draft])}
    return twin


def loop_overhead(pair, draft, gamma, prompt, n_tokens, seed, repeats=5):
    """(seconds per step outside model calls, steps): the run replayed with lookups for calls.

    The prefill is left out (it is a model call); plain decoding (draft None) has one step per
    token."""
    twin = _replayed(pair, draft)
    run = twin.run(prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
    models = [twin.target] + ([twin.drafts[draft]] if draft else [])
    times = []
    for _ in range(repeats):
        for model in models:
            model.replay()
        again = twin.run(prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
        assert np.array_equal(again.tokens, run.tokens), "a replay must retrace its run"
        for model in models:
            model.replay()
        times.append(
            _seconds(twin.run, prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
        )
    return float(np.median(times)) / run.calls, run.calls


# ---- 3. α along the target's own samples ----------------------------------------------------


def sampled_alpha(pair, drafts, prompts, n_tokens, seed):
    """{draft: (α, s.e.)}: β = Σ min(p, q) at every position the target's own samples reach
    after each prompt row (B, T), averaged; the s.e. over rows."""
    rows = pair.generate(prompts, n_tokens, 1, np.random.default_rng(seed))  # plain sampling
    seq = np.concatenate([prompts, rows], axis=1)[:, :-1]  # every context that picks a token
    start = prompts.shape[1] - 1

    def laws(model):  # (B, n_tokens, V): the law of each sampled token, one cache-less pass
        model.reset(len(seq), seq.shape[1])
        return softmax_law(model.forward(seq)[:, start:])

    p = laws(pair.target)
    out = {}
    for name in drafts:
        beta = np.minimum(p, laws(pair.drafts[name])).sum(axis=-1).mean(axis=1)  # (B,)
        out[name] = (float(beta.mean()), float(beta.std(ddof=1) / np.sqrt(len(beta))))
    return out


# ---- 4. The prediction ----------------------------------------------------------------------


def predict(costs, o_plain, o_step, alpha, draft, gamma, n_tokens):
    """Predicted speedup of n_tokens with draft at γ: Equation 1's tokens per step from α, the
    isolated call costs and the loop's own time, prefills included:

    plain = P_target + N·(T(1) + o_plain),  speculative = P_target + P_draft + (N / E)·(γ·c·T(1)
    + v(γ)·T(1) + o),  E = (1 − α^(γ+1)) / (1 − α).
    """
    steps = n_tokens / expected_tokens(alpha, gamma)
    plain = costs.prefill["target"] + n_tokens * (costs.t1 + o_plain)
    step = gamma * costs.draft[draft] + costs.target[gamma + 1] + o_step
    return plain / (costs.prefill["target"] + costs.prefill[draft] + steps * step)


# ---- 5. The race: interleaved, bootstrapped, the best setting chosen on half ----------------


def race(pair, settings, prompts, n_tokens, repeats, seed=9):
    """Rows of seconds: for each prompt and repeat, plain, then each (draft, γ) of settings
    each followed by plain again, so every speculative run sits between two plain ones."""
    rows = []
    for p, prompt in enumerate(prompts):
        for r in range(repeats):
            seeds = np.random.SeedSequence([seed, p, r]).generate_state(len(settings) + 1)
            plain = _seconds(pair.run, prompt, n_tokens, 1, np.random.default_rng(seeds[0]))
            for k, (draft, gamma) in enumerate(settings):
                rng = np.random.default_rng(seeds[k + 1])
                start = time.perf_counter()
                run = pair.run(prompt, n_tokens, gamma, rng, draft)
                seconds = time.perf_counter() - start
                after = _seconds(pair.run, prompt, n_tokens, 1, np.random.default_rng(seeds[0]))
                rows.append(
                    {
                        "prompt": p,
                        "repeat": r,
                        "draft": draft,
                        "gamma": gamma,
                        "seconds": seconds,
                        "plain": (plain + after) / 2,
                        "calls": run.calls,
                    }
                )
                plain = after
    return pd.DataFrame(rows)


def _ratio(frame):
    """A setting's speedup: its plain seconds over its own, summed over the frame's runs."""
    return float(frame["plain"].sum() / frame["seconds"].sum())


def bootstrap(frame, n_boot=2000, seed=0, level=0.95):
    """(speedup, low, high) of one setting's runs: the ratio of summed times, and the interval
    from resampling prompts, then repeats within each prompt, with replacement."""
    rng = np.random.default_rng(seed)
    groups = [g[["plain", "seconds"]].to_numpy() for _, g in frame.groupby("prompt")]
    ratios = np.empty(n_boot)
    for b in range(n_boot):
        picked = [groups[i] for i in rng.integers(len(groups), size=len(groups))]
        sums = sum(g[rng.integers(len(g), size=len(g))].sum(axis=0) for g in picked)
        ratios[b] = sums[0] / sums[1]
    tail = (1 - level) / 2 * 100
    return (
        _ratio(frame),
        float(np.percentile(ratios, tail)),
        float(np.percentile(ratios, 100 - tail)),
    )


class Verdict(NamedTuple):
    """The best setting, chosen on the even repeats and measured on the odd ones."""

    draft: str
    gamma: int
    speedup: float
    low: float
    high: float


def summarise(rows, n_boot=2000, seed=0):
    """(table of every setting's speedup with its interval, Verdict)."""
    table = []
    for (draft, gamma), runs in rows.groupby(["draft", "gamma"], sort=False):
        speedup, low, high = bootstrap(runs, n_boot, seed)
        chosen_on = _ratio(runs[runs.repeat % 2 == 0])
        table.append(
            {
                "draft": draft,
                "gamma": int(gamma),
                "speedup": speedup,
                "low": low,
                "high": high,
                "even repeats": chosen_on,
            }
        )
    table = pd.DataFrame(table)
    best = table.loc[table["even repeats"].idxmax()]
    held = rows[(rows.draft == best.draft) & (rows.gamma == best.gamma) & (rows.repeat % 2 == 1)]
    return table, Verdict(best.draft, int(best.gamma), *bootstrap(held, n_boot, seed))
