"""Chapter 9's race, predicted from what is measured apart from its runs:

1. `replayed_costs`: the model calls of untimed runs on α's prompts (`recorded_calls`), made
   again back to back without the loop (`replay_calls`), give T(1), the target's time for one
   position; v(γ), its time for γ + 1 positions over T(1); c, a draft call over T(1); a step's
   γ draft calls as steps make them; and the prompt's prefill. The calls meet the contexts,
   the cache widths and the order of a run's.
2. `run_overhead`: a real run's thread time less its clocked model calls and prefills gives the
   time a step spends outside model calls, o, and a plain token's, o_plain. `loop_overhead`
   replays a run with a lookup for each call (`Replay`), for comparison; `method_floor` times
   the part of o no leaner loop removes: `verify`, the target's laws and the draft's draws.
3. `sampled_alpha`: α as the mean of β = Σ min(p, q) along the target's own samples (the
   contexts decoding meets); `untimed_tokens_per_call`, tokens per target call in untimed runs
   on α's prompts. Each with its standard error.

1 and 2 are timed between the race's prompts, so that they meet the machine in its minutes.

Every time is the timing thread's CPU time (`roofs.thread_seconds`), with one BLAS thread and
ONNX Runtime on one intra-op thread: the work a call does runs on that thread.

`predict` combines them into the time of a run of N tokens, in N / (tokens per call) steps
(Equation 1's i.i.d. chain, `expected_steps`, is the comparison), and `prediction_band` gives
its spread: the costs', the loop overhead's (over prompts) and the tokens'. `race` then times
plain and speculative decoding (plain, setting, plain, ...), every model call clocked, so that
`miss_parts` can say where each prediction misses; `summarise` gives each setting's
speedup with a t-interval over prompts (`prompt_interval`), cut at the most the costs allow
(`speedup_cap`); `confirm` races the best setting again on fresh prompts. `coverage` measures
how often such an interval covers a known speedup, in synthetic races with the noise a real
race showed (`variance_components`).
"""

import copy
import time
from typing import NamedTuple

import numpy as np
import pandas as pd

from .checks import MAX_LOOP, _check_memory, _check_positive_count, _check_rng
from .intervals import (
    Components,
    Verdict,
    confirm,
    coverage,
    expected_steps,
    finite_tokens_per_call,
    prediction_band,
    prompt_interval,
    summarise,
    variance_components,
)
from .roofs import matrix_weights, on_one_thread
from .roofs import thread_seconds as _seconds
from .rule import EXACT_RULE
from .runtime import RuntimeTransformer
from .theory import expected_tokens, walltime_speedup
from .transformer import TinyTransformer, one_blas_thread, quick_law, softmax_law
from .verify import _sample_rows, _verify

# ---- 1. Isolated call costs ---------------------------------------------------------------


class Costs(NamedTuple):
    """Mean seconds of the model calls of untimed runs, made again without their loop."""

    target: dict  # {positions n: seconds of one target call scoring n positions}
    draft: dict  # {draft name: seconds of one draft call}
    prefill: dict  # {"target" or draft name: seconds to cache the prompt}
    in_step: dict | None = None  # {(draft, γ): seconds of a step's γ draft calls}

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

    def drafting(self, name, gamma):
        """Seconds of a step's γ draft calls: as a step makes them where measured, else γ·c."""
        return (self.in_step or {}).get((name, gamma), gamma * self.draft[name])


class _Recorded:
    """A model whose calls on its cache are kept, in order, in a log it shares with the other
    models of a run, as (model key, method, arguments): a run's calls, to make again."""

    def __init__(self, model, key, log):
        self.model, self.key, self.log = model, key, log

    def __getattr__(self, name):
        attr = getattr(self.model, name)
        if name not in ("reset", "prefill", "forward", "rollback", "select"):
            return attr

        def logged(*args):
            self.log.append((self.key, name, copy.deepcopy(args)))
            return attr(*args)

        return logged


def recorded_calls(pair, draft, gamma, prompt, n_tokens, seed):
    """Every call an untimed run (plain when draft is None) makes to its models, in order:
    [(model key, method, arguments)], the key "target" or the draft's name."""
    log = []
    twin = _wrapped(pair, draft, lambda model, key: _Recorded(model, key, log))
    twin.run(prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
    return log


@on_one_thread
def replay_calls(pair, log):
    """The calls of a log (`recorded_calls`) made again on pair's models, back to back, with no
    loop between them: {key: (seconds of each forward call, seconds of the prefills)}."""
    out = {}
    for key, name, args in log:
        model = pair.target if key == "target" else pair.drafts[key]
        if name not in ("forward", "prefill"):
            getattr(model, name)(*args)
            continue
        calls, prefill = out.get(key, ([], 0.0))
        seconds = _seconds(getattr(model, name), *args)
        out[key] = (calls + [seconds], prefill) if name == "forward" else (calls, prefill + seconds)
    return out


def replayed_costs(pair, logs):
    """Costs from untimed runs' calls replayed (`replay_calls`), logs {(draft, γ): [log, ...]}
    with (None, 1) for plain runs: T(n), the mean target call scoring n positions; c, the mean
    draft call; a step's γ draft calls, the draft's seconds per target call; and the prefills."""
    target, draft, prefill, in_step = {}, {}, {}, {}
    for (name, gamma), runs in logs.items():
        for log in runs:
            got = replay_calls(pair, log)
            calls, seconds = got["target"]
            target.setdefault(1 if name is None else gamma + 1, []).extend(calls)
            prefill.setdefault("target", []).append(seconds)
            if name is not None:
                drafted, seconds = got[name]
                draft.setdefault(name, []).extend(drafted)
                in_step.setdefault((name, gamma), []).append(sum(drafted) / len(calls))
                prefill.setdefault(name, []).append(seconds)
    target, draft, prefill, in_step = (
        {k: float(np.mean(v)) for k, v in x.items()} for x in (target, draft, prefill, in_step)
    )
    return Costs(target, draft, prefill, in_step)


def slots_ratio(model, ids, start, slots, n=1, calls=60):
    """Median over calls of a call's time in a cache of slots[1] slots over its time in one of
    slots[0]: n new ids after a cached ids[:start], in two copies of model timed in turn, so
    that drift touches both alike: what a wider cache costs a call (so the costs are timed in
    caches as wide as the race's, `replayed_costs`)."""
    _check_positive_count(calls, "calls", MAX_LOOP, "calls timed in a Python loop")
    twins = [copy.copy(model) for _ in range(2)]  # one model and weights, two caches
    times, back = np.zeros((calls, 2)), np.array([start])
    for twin, width in zip(twins, slots, strict=True):
        twin.reset(1, width)
        twin.prefill(ids[None, :start])
        twin.forward(ids[None, start : start + n])  # untimed: the cache's pages touched
        twin.rollback(back)
    with one_blas_thread():
        for k in range(calls):
            for j, twin in enumerate(twins):
                times[k, j] = _seconds(twin.forward, ids[None, start : start + n])
                twin.rollback(back)
    return float(np.median(times[:, 1] / times[:, 0]))


# ---- 2. The loop's own time: model calls replaced by lookups -------------------------------


class Replay:
    """A model's cache interface that records the logits of each forward call of a run, then
    returns them in order without computing anything: the same run, minus the model's time.

    With evict=True a replayed call of a transformer also reads a buffer as large as the
    model's weights, as the real call reads them (a table model such as the bigram reads none),
    so the loop meets the caches a real call leaves; `seconds` keeps each replayed call's
    thread time (lookup and read), for the caller to take out."""

    def __init__(self, model, evict=False):
        self.model, self.config = model, getattr(model, "config", None)
        self.outputs, self.replaying, self._next, self.seconds = [], False, 0, []
        size = matrix_weights(self.config) if evict and self.config is not None else 0
        self.buffer = self.evicting = np.ones(size, np.float32)

    def replay(self, evict=True):
        """From now on, return the recorded logits in order (reading the buffer unless not
        evict)."""
        self.replaying, self._next, self.seconds = True, 0, []
        self.evicting = self.buffer if evict else self.buffer[:0]

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
            start = time.thread_time()
            out, self._next = self.outputs[self._next], self._next + 1
            self.evicting.dot(self.evicting)  # one read of every float, like the weights'
            self.seconds.append(time.thread_time() - start)
        else:
            out = self.model.forward(ids)
            self.outputs.append(out)
        self.lengths = self.lengths + ids.shape[1]
        return out

    def rollback(self, lengths):
        """Forget every cached position at or past lengths (B,)."""
        if not self.replaying:
            self.model.rollback(lengths)
        self.lengths = np.full(self.lengths.shape, lengths, np.int64)

    def select(self, rows):
        """Keep only the sequences where rows (B,) is True."""
        if not self.replaying:
            self.model.select(rows)
        self.lengths = self.lengths[rows]


def _with_models(pair, target, drafts):
    """A shallow copy of pair (its vocabulary, text and manifest shared) that runs these models."""
    twin = copy.copy(pair)
    twin.target, twin.drafts = target, drafts
    return twin


def on_runtime(pair):
    """A copy of pair whose transformers run in ONNX Runtime (count drafts stay as they are)."""
    drafts = {
        name: RuntimeTransformer.twin(m) if isinstance(m, TinyTransformer) else m
        for name, m in pair.drafts.items()
    }
    return _with_models(pair, RuntimeTransformer.twin(pair.target), drafts)


def _wrapped(pair, draft, wrap):
    """A copy of pair whose target, and draft unless it is None, are wrap(model, key) of the
    real ones, key "target" or the draft's name: the one draft a run uses."""
    drafts = {} if draft is None else {draft: wrap(pair.drafts[draft], draft)}
    return _with_models(pair, wrap(pair.target, "target"), drafts)


def _replayed(pair, draft, evict=False):
    """A copy of pair whose target (and draft) are Replay wrappers of the real ones."""
    return _wrapped(pair, draft, lambda model, key: Replay(model, evict))


@on_one_thread
def run_overhead(pair, draft, gamma, prompt, n_tokens, seed):
    """(seconds per step outside model calls, steps) of one real run: its thread time less its
    clocked model calls and prefills (`_Clocked`), as the race's rows split theirs."""
    twin = _wrapped(pair, draft, lambda model, key: _Clocked(model))
    run, parts = _timed(twin, prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
    calls = parts["target s"] + parts["draft s"] + parts["prefill s"]
    return (parts["seconds"] - calls) / run.calls, run.calls


@on_one_thread
def loop_overhead(pair, draft, gamma, prompt, n_tokens, seed, repeats=3, evict=True):
    """(seconds per step outside model calls, steps): the run replayed with lookups for calls;
    with evict (the default) each also reads as many floats as its model's weights, untimed, as
    a real call streams its weights (`run_overhead` times a real run instead). Prefills are
    left out; plain decoding (draft None) has one step per token."""
    twin = _replayed(pair, draft, evict)
    run = twin.run(prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
    models = [twin.target] + ([twin.drafts[draft]] if draft else [])
    for model in models:
        model.replay(evict=False)  # the check that the replay retraces the run reads nothing
    again = twin.run(prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
    assert np.array_equal(again.tokens, run.tokens), "a replay must retrace its run"
    times = []
    for _ in range(repeats):
        for model in models:
            model.replay()
        total = _seconds(twin.run, prompt, n_tokens, gamma, np.random.default_rng(seed), draft)
        times.append(total - sum(sum(model.seconds) for model in models))
    return float(np.median(times)) / run.calls, run.calls


def method_work(vocab, gamma, rng):
    """(step, token): the per-step work of the method itself at one row, as callables.

    step() does what every step of the loop must, however lean the rest: γ draft tokens' laws
    and draws, the target's γ + 1 laws, and the book's `verify`, drawing from rng the 2γ + 1
    uniforms a step of the loop draws; token() is plain decoding's law and draw. Both run on
    fixed random logits over vocab tokens."""
    _check_positive_count(gamma, "gamma")
    _check_positive_count(vocab, "vocab")
    _check_memory(4 * (2 * gamma + 1) * vocab * 8, "method_work")  # logits, laws and sums
    _check_rng(rng)
    draft_logits = rng.normal(size=(gamma, 1, vocab))  # γ draft calls' logits, (1, V) each
    target_logits = rng.normal(size=(1, gamma + 1, vocab))
    draft_probs, tokens = np.zeros((1, gamma, vocab)), np.zeros((1, gamma), dtype=np.int64)

    def step():  # as `_draft` and `_speculative` do it, into arrays made once
        for i, logits in enumerate(draft_logits):
            draft_probs[:, i] = quick_law(logits, 1.0)
            tokens[:, i] = _sample_rows(draft_probs[:, i], rng)
        return _verify(quick_law(target_logits, 1.0), draft_probs, tokens, rng, EXACT_RULE)

    def token():
        return _sample_rows(quick_law(target_logits[:, 0], 1.0), rng)

    return step, token


def method_floor(vocab, gamma, number=500, repeats=7):
    """(seconds a step, seconds a plain token) of `method_work` at one row: the best of repeats
    timings of number calls each (a floor, so the fastest; o is a median). What the loop's own
    time o cannot go below while `verify`, the laws and the draws are the book's numpy calls."""
    _check_positive_count(number, "number", MAX_LOOP, "calls timed in a Python loop")
    _check_positive_count(repeats, "repeats", MAX_LOOP, "timings in a Python loop")
    with one_blas_thread():
        return tuple(
            min(_seconds(_times, work, number) for _ in range(repeats)) / number
            for work in method_work(vocab, gamma, np.random.default_rng(0))
        )


def _times(work, number):
    """Call work() number times."""
    for _ in range(number):
        work()


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


def untimed_tokens_per_call(pair, settings, prompts, n_tokens, seed):
    """{(draft, γ): (tokens, s.e.)}: tokens kept per target call (n_tokens per row over the
    row-calls, as the race counts them) in untimed runs from prompts (B ≥ 2, T) that are not
    the race's, with its standard error over rows (delta method). Dependence between positions
    is in it: Equation 1's i.i.d. chain at the sampled α leaves that out."""
    out = {}
    for k, (draft, gamma) in enumerate(settings):
        run = pair.run(prompts, n_tokens, gamma, np.random.default_rng([seed, k]), draft)
        calls = (run.accepted >= 0).sum(axis=0)  # (B,): a row's target calls
        mean, se = calls.mean(), calls.std(ddof=1) / np.sqrt(len(calls))
        out[draft, gamma] = (float(n_tokens / mean), float(n_tokens * se / mean**2))
    return out


def predict(costs, o_plain, o_step, alpha, draft, gamma, n_tokens, tokens=None):
    """Predicted speedup of n_tokens with draft at γ: the isolated call costs, the loop's own
    time and the expected number of steps S(N) under Equation 1's model (`expected_steps`:
    finite N, the last step's overshoot counted), prefills included:

    plain = P_target + N·(T(1) + o_plain),
    speculative = P_target + P_draft + S(N)·(D(γ) + v(γ)·T(1) + o),

    where D(γ) is a step's γ draft calls as a step makes them (γ·c·T(1) where not measured).
    tokens, if given, replaces N / S(N): tokens per call measured apart from the race, or
    Equation 1's E (the infinite-N form)."""
    steps = expected_steps(alpha, gamma, n_tokens) if tokens is None else n_tokens / tokens
    plain = costs.prefill["target"] + n_tokens * (costs.t1 + o_plain)
    step = costs.drafting(draft, gamma) + costs.target[gamma + 1] + o_step
    return plain / (costs.prefill["target"] + costs.prefill[draft] + steps * step)


def speedup_cap(costs, o_plain, o_step, draft, gamma, n_tokens):
    """The most the page's own costs allow a setting: `predict` with every draft kept, so the
    fewest steps, ceil(N / (γ + 1)). No interval of a speedup reaches past it."""
    fewest = -(-n_tokens // (gamma + 1))
    return predict(costs, o_plain, o_step, 1.0, draft, gamma, n_tokens, n_tokens / fewest)


SPEC_PARTS = ("steps", "draft calls", "target calls", "loop", "prefills")  # `miss_parts`'s
MISS_PARTS = SPEC_PARTS + ("plain calls", "plain loop", "plain prefill")  # then plain's


def miss_parts(runs, costs, o_plain, o_step, alpha, draft, gamma, n_tokens, tokens=None):
    """Where `predict` (with the same arguments) misses one setting, measured in the race's own
    runs of it (rows of `race`, means over runs): each part's excess over what the prediction
    charged for it, over the predicted run, speculative or plain. So the speculative parts sum
    to its run's measured/predicted − 1, the plain parts likewise, and (1 + plain) / (1 +
    speculative) is the measured speedup (a ratio of mean times) over the predicted."""
    m = runs.drop(columns=["draft", "gamma"]).astype(float).mean()
    steps = expected_steps(alpha, gamma, n_tokens) if tokens is None else n_tokens / tokens
    per_step = costs.target[gamma + 1]
    drafting, prefill = costs.drafting(draft, gamma), costs.prefill["target"] + costs.prefill[draft]
    step = drafting + per_step + o_step
    spec = prefill + steps * step
    plain = costs.prefill["target"] + n_tokens * (costs.t1 + o_plain)
    loop = m.seconds - m["target s"] - m["draft s"] - m["prefill s"]
    plain_loop = m.plain - m["plain target s"] - m["plain prefill s"]
    return {
        "steps": (m.calls - steps) * step / spec,
        "draft calls": (m["draft s"] - m.calls * drafting) / spec,
        "target calls": (m["target s"] - m.calls * per_step) / spec,
        "loop": (loop - m.calls * o_step) / spec,
        "prefills": (m["prefill s"] - prefill) / spec,
        "plain calls": (m["plain target s"] - n_tokens * costs.t1) / plain,
        "plain loop": (plain_loop - n_tokens * o_plain) / plain,
        "plain prefill": (m["plain prefill s"] - costs.prefill["target"]) / plain,
    }


# ---- 5. The race: interleaved; intervals over prompts; the best chosen on other prompts ------


class _Clocked:
    """A model whose forward calls and prefills are timed, each call's seconds kept in order."""

    def __init__(self, model):
        self.model, self.seconds, self.prefills = model, [], []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, ids):
        """The model's forward, timed."""
        start = time.thread_time()
        out = self.model.forward(ids)
        self.seconds.append(time.thread_time() - start)
        return out

    def prefill(self, ids):
        """The model's prefill, timed."""
        start = time.thread_time()
        self.model.prefill(ids)
        self.prefills.append(time.thread_time() - start)


def _timed(twin, prompt, n_tokens, gamma, rng, draft=None):
    """(run, parts): a run of twin (its models `_Clocked`) and its thread seconds, with the
    parts spent in the target's calls, the draft's calls and the prefills."""
    models = [twin.target] + ([twin.drafts[draft]] if draft else [])
    for model in models:
        model.seconds, model.prefills = [], []
    start = time.thread_time()
    run = twin.run(prompt, n_tokens, gamma, rng, draft)
    seconds = time.thread_time() - start
    drafting = sum(models[1].seconds) if draft else 0.0
    prefill = sum(sum(model.prefills) for model in models)
    parts = {"target s": sum(twin.target.seconds), "draft s": drafting, "prefill s": prefill}
    return run, {"seconds": seconds, **parts}


@on_one_thread
def race(pair, settings, prompts, n_tokens, repeats, seed=9, between=None):
    """Rows of seconds: for each prompt and repeat, plain, then each (draft, γ) of settings
    each followed by plain again, so every speculative run sits between two plain ones. Every
    model call is clocked (`_Clocked`: two reads of the clock, under 2 µs a call), so a row also
    splits its runs into the target's calls, the draft's calls and the prefills; the rest is
    the loop's own time. between(p), if given, runs before prompt p's runs, outside them."""
    names = dict.fromkeys(d for d, _ in settings)
    twin = _with_models(pair, _Clocked(pair.target), {d: _Clocked(pair.drafts[d]) for d in names})
    rows = []
    for p, prompt in enumerate(prompts):
        if between is not None:
            between(p)
        for r in range(repeats):
            seeds = np.random.SeedSequence([seed, p, r]).generate_state(len(settings) + 1)
            _, plain = _timed(twin, prompt, n_tokens, 1, np.random.default_rng(seeds[0]))
            for k, (draft, gamma) in enumerate(settings):
                rng = np.random.default_rng(seeds[k + 1])
                run, spec = _timed(twin, prompt, n_tokens, gamma, rng, draft)
                _, after = _timed(twin, prompt, n_tokens, 1, np.random.default_rng(seeds[0]))
                both = {key: (plain[key] + after[key]) / 2 for key in plain}
                rows.append({"prompt": p, "repeat": r, "draft": draft, "gamma": gamma, **spec,
                             "plain": both["seconds"], "plain target s": both["target s"],
                             "plain prefill s": both["prefill s"], "calls": run.calls})  # fmt: skip
                plain = after
    return pd.DataFrame(rows)


# ---- 6. Everything in order: measure apart, predict, then race ------------------------------


class Result(NamedTuple):
    """A predicted and measured race: its table, the verdict, and what the prediction used."""

    table: pd.DataFrame  # per (draft, γ): α, E, c, v, o, predicted, measured with its interval
    verdict: Verdict
    costs: Costs
    o_plain: float  # seconds per plain token outside model calls
    alpha: dict  # {draft: (α, s.e.)} along the target's own samples
    rows: pd.DataFrame  # the race's runs
    seconds: float  # wall-clock seconds the whole measurement took
    fresh: pd.DataFrame | None = None  # the chosen setting's runs on fresh prompts
    components: Components | None = None  # the race's noise, between prompts and repeats
    coverage: float | None = None  # the intervals' coverage, simulated for this design
    t1_each: tuple = ()  # T(1) from each of the cost measurements, seconds: its spread


def alpha_prompts(pair, n_prompts, length=16):
    """α's prompts (and the untimed runs' and o's): held-out, past the race's and the fresh,
    1,500 characters apart, or closer where the held-out text has no room for so many (at
    least 100 apart; the large pair's text holds 35 prompts at 1,500 and 516 at 100)."""
    _check_positive_count(n_prompts, "n_prompts")
    room = len(pair.heldout_text) - 60_000 - length
    spacing = max(100, min(1_500, room // max(n_prompts - 1, 1)))
    return prompts_from(pair, n_prompts, length, offset=60_000, spacing=spacing)


def prompts_from(pair, n_prompts, length, offset=0, spacing=2_000):
    """n_prompts held-out prompts (length ids each), spacing characters apart from offset."""
    text = pair.heldout_text
    if offset + (n_prompts - 1) * spacing + length > len(text):
        raise ValueError("the held-out text is too short for these prompts")
    return [
        pair.encode(text[offset + k * spacing : offset + k * spacing + length])
        for k in range(n_prompts)
    ]


def _mean_costs(measured):
    """Costs averaged over several independent measurements of them."""

    def mean(dicts):
        return {k: float(np.mean([d[k] for d in dicts])) for k in dicts[0]}

    fields = zip(*measured)
    return Costs(*(mean(f) if f[0] is not None else None for f in fields))


def predict_and_race(
    pair,
    drafts,
    gammas,
    n_tokens=64,
    prompt_length=16,
    n_prompts=4,
    repeats=4,
    alpha_rows=24,
    seed=9,
    cost_measurements=3,
    overhead_prompts=3,
    n_races=4000,
):
    """Measure α and tokens per call apart from the race; race every (draft, γ) on n_prompts
    held-out prompts (disjoint from α's), and between its prompts time the calls' costs
    (cost_measurements times, each replaying the calls of untimed runs on one of
    overhead_prompts of α's prompts, in turn) and the loop's overhead (on those prompts), so
    that they meet the machine in the race's minutes; predict every setting from those (no
    time of a raced run); choose the best there and race it again on n_prompts others. Each
    interval's coverage is simulated for this design from the race's own noise."""
    start = time.perf_counter()
    for gamma in gammas:
        _check_positive_count(gamma, "gamma", pair.context, "positions the models know")
    _check_positive_count(cost_measurements, "cost_measurements", 100, "timings of every call")
    _check_positive_count(overhead_prompts, "overhead_prompts", alpha_rows, "α's prompts")
    if not isinstance(alpha_rows, int) or alpha_rows < 2:
        raise ValueError(f"alpha_rows must be an int ≥ 2 (for a s.e.), got {alpha_rows!r}")
    settings = [(d, g) for d in drafts for g in gammas]
    prompts = prompts_from(pair, n_prompts, prompt_length, offset=1_000)
    fresh = prompts_from(pair, n_prompts, prompt_length, offset=36_000)  # past ch. 9's checks
    starts = alpha_prompts(pair, alpha_rows, prompt_length)
    each, each_o = [], {s: [] for s in [(None, 1)] + settings}  # o on α's first prompts
    costs_at = [i * n_prompts // cost_measurements for i in range(cost_measurements)]
    o_at = [i * n_prompts // overhead_prompts for i in range(overhead_prompts)]  # α's prompt i

    def beside(p):  # before the race's prompt p: the measurements spread evenly over prompts
        for _ in range(costs_at.count(p)):  # one o prompt's runs a time, in turn
            k = len(each) % len(o_at)
            each.append(replayed_costs(pair, {s: [runs[k]] for s, runs in logs.items()}))
        for k in (k for k, at in enumerate(o_at) if at == p):
            for s, o in each_o.items():
                o.append(run_overhead(pair, *s, starts[k], n_tokens, seed)[0])

    alpha = sampled_alpha(pair, drafts, np.stack(starts), n_tokens, seed + 1)
    logs = {  # the calls of untimed runs on o's prompts, each replayed for the costs
        s: [recorded_calls(pair, *s, starts[k], n_tokens, [seed + 4, k]) for k in range(len(o_at))]
        for s in each_o
    }
    untimed = untimed_tokens_per_call(pair, settings, np.stack(starts), n_tokens, seed + 2)
    rows = race(pair, settings, prompts, n_tokens, repeats, seed, between=beside)
    costs, o_plain = _mean_costs(each), float(np.mean(each_o[None, 1]))
    overhead = {s: float(np.mean(each_o[s])) for s in settings}
    caps = {s: speedup_cap(costs, o_plain, overhead[s], *s, n_tokens) for s in settings}
    table = summarise(rows, caps)
    best = table.loc[table.speedup.idxmax()]
    chosen = (best.draft, int(best.gamma))
    fresh_rows = race(pair, [chosen], fresh, n_tokens, repeats, seed + 3)
    verdict = confirm(table, fresh_rows, caps[chosen])
    raced_tokens = n_tokens / rows.groupby(["draft", "gamma"], sort=False).calls.mean()
    extra, raced = [], dict(list(rows.groupby(["draft", "gamma"], sort=False)))
    for draft, gamma in zip(table.draft, table.gamma):
        a, (tokens, se), o = alpha[draft][0], untimed[draft, gamma], overhead[draft, gamma]

        def forecast(measured, tokens=tokens, draft=draft, gamma=gamma, o=o, a=a):
            return predict(measured, o_plain, o, a, draft, gamma, n_tokens, tokens)

        h = 1e-4 * tokens
        slope = (forecast(costs, tokens + h) - forecast(costs, tokens - h)) / (2 * h)
        by_prompt = [  # o's part: the costs at their mean, o and o_plain from prompt k
            predict(costs, plain_k, o_k, a, draft, gamma, n_tokens, tokens)
            for plain_k, o_k in zip(each_o[None, 1], each_o[draft, gamma])
        ]
        low, high = prediction_band([forecast(m) for m in each], slope, se, overheads=by_prompt)
        extra.append(
            {
                "α": a,
                "E[tokens]": float(expected_tokens(a, gamma)),
                "tokens, finite N": finite_tokens_per_call(a, gamma, n_tokens),
                "c": costs.c(draft),
                "c in a step": costs.drafting(draft, gamma) / (gamma * costs.t1),
                "v(γ)": costs.v(gamma),
                "o": o / costs.t1,
                "o, s.d.": float(np.std(each_o[draft, gamma], ddof=1)) / costs.t1
                if overhead_prompts > 1
                else float("nan"),
                "predicted": forecast(costs),
                "predicted from": low,
                "predicted to": high,
                "predicted, i.i.d.": forecast(costs, tokens=None),
                "predicted, N/E": forecast(costs, tokens=float(expected_tokens(a, gamma))),
                "tokens, untimed": tokens,
                "tokens, untimed s.e.": se,
                # after the fact, not used by the prediction: what the race's own runs emitted
                "tokens, raced": float(raced_tokens[draft, gamma]),
                "Theorem 3.8": walltime_speedup(a, gamma, costs.c(draft)),
            }
            | miss_parts(raced[draft, gamma], costs, o_plain, o, a, draft, gamma, n_tokens, tokens)
        )
    table = pd.concat([table, pd.DataFrame(extra)], axis=1)
    table["inside"] = table.predicted.between(table.low, table.high)
    components = variance_components(rows) if repeats > 1 else None
    covered = (
        None
        if components is None
        else coverage(prompt_interval, components, n_prompts, repeats, n_races, seed=seed)
    )
    seconds = time.perf_counter() - start
    t1_each = tuple(m.t1 for m in each)
    return Result(table, verdict, costs, o_plain, alpha, rows, seconds, fresh_rows, components,
                  covered, t1_each)  # fmt: skip


def method_ceilings(result, vocab, n_tokens, number=500, repeats=7):
    """Each setting of result predicted again, with its own tokens per call τ, with the loop's
    own time o cut to `method_floor`: the most a leaner loop could give, computed, not raced. A
    DataFrame of draft, gamma, the floor a step and a plain token in units of T(1) and in
    seconds ("floor s", "plain floor s"), and that prediction."""
    if not isinstance(result, Result):
        raise TypeError(f"result must be a race.Result, got {type(result).__name__}")
    _check_positive_count(n_tokens, "n_tokens")
    floors = {g: method_floor(vocab, g, number, repeats) for g in dict.fromkeys(result.table.gamma)}
    t1, rows = result.costs.t1, []
    for draft, gamma, tokens in result.table[["draft", "gamma", "tokens, untimed"]].values:
        step, token = floors[gamma]
        a = result.alpha[draft][0]
        rows.append(
            {
                "draft": draft,
                "gamma": gamma,
                "floor": step / t1,
                "plain floor": token / t1,
                "floor s": step,
                "plain floor s": token,
                "ceiling": predict(result.costs, token, step, a, draft, gamma, n_tokens, tokens),
            }
        )
    return pd.DataFrame(rows)


LADDER = (  # `ladder`'s rows: costs taken away, then Equation 1's c and τ put in
    "predicted (measured costs, τ from untimed runs)",
    "loop cut to the method's own work",
    "no loop at all, o = 0",
    "no prefills",
    "target call flat, v(γ) = 1",
    "draft calls at the isolated c",
    "τ = Equation 1's E (Theorem 3.8)",
)


def ladder(result, draft, gamma, ceilings, n_tokens):
    """One setting's prediction changed one step at a time, in `LADDER`'s order, down to
    Theorem 3.8 (which the last row equals): the loop's own time cut to the method's work and
    then to nothing, the prefills and v(γ)'s excess taken away, a step's draft calls charged at
    γ times the isolated call, and τ replaced by Equation 1's E. The first four steps can only
    raise a prediction whose o is above the floor and v(γ) above 1; the last two can move it
    either way. The method's floors are read, in seconds, from ceilings (`method_ceilings`,
    of any result with this vocabulary: the floor is the same work). A Series of the predicted
    speedups, indexed by LADDER."""
    if not isinstance(result, Result):
        raise TypeError(f"result must be a race.Result, got {type(result).__name__}")
    _check_positive_count(n_tokens, "n_tokens")
    table = result.table
    row = table[(table.draft == draft) & (table.gamma == gamma)]
    if len(row) != 1:
        raise ValueError(f"draft, gamma = {draft!r}, {gamma!r} is not a setting of result")
    if not isinstance(ceilings, pd.DataFrame):
        raise TypeError(
            f"ceilings must be method_ceilings' DataFrame, got {type(ceilings).__name__}"
        )
    at = ceilings[(ceilings.draft == draft) & (ceilings.gamma == gamma)]
    if len(at) != 1:
        raise ValueError(f"ceilings has no row for draft, gamma = {draft!r}, {gamma!r}")
    step_floor, token_floor = (float(at[k].iloc[0]) for k in ("floor s", "plain floor s"))
    row, costs, a = row.iloc[0], result.costs, result.alpha[draft][0]
    o, tokens = row.o * costs.t1, row["tokens, untimed"]
    no_prefill = costs._replace(prefill=dict.fromkeys(costs.prefill, 0.0))
    flat = no_prefill._replace(target=no_prefill.target | {gamma + 1: costs.t1})
    isolated = flat._replace(in_step=None)
    args = (a, draft, gamma, n_tokens)
    speedups = [
        predict(costs, result.o_plain, o, *args, tokens),
        predict(costs, token_floor, step_floor, *args, tokens),
        predict(costs, 0.0, 0.0, *args, tokens),
        predict(no_prefill, 0.0, 0.0, *args, tokens),
        predict(flat, 0.0, 0.0, *args, tokens),
        predict(isolated, 0.0, 0.0, *args, tokens),
        predict(isolated, 0.0, 0.0, *args, float(expected_tokens(a, gamma))),
    ]
    return pd.Series(speedups, index=list(LADDER), name=f"{draft}, γ = {gamma}")


def verdict_lines(result):
    """`make race`'s last two lines for a Result: how often the prediction fell inside the
    measured interval, with the intervals' simulated coverage; then the best setting's speedup
    on fresh prompts, its prediction and Theorem 3.8."""
    v, table = result.verdict, result.table
    row = table[(table.draft == v.draft) & (table.gamma == v.gamma)].iloc[0]
    covered = "not simulated" if result.coverage is None else f"{result.coverage:.3f}"
    return (
        f"prediction inside the interval at {int(table.inside.sum())} of {len(table)} settings; "
        f"interval coverage {covered} by simulation of this design",
        f"measured speedup {v.speedup:.2f} (95 % CI {v.low:.2f}–{v.high:.2f}) for {v.draft} "
        f"at γ = {v.gamma}, predicted {row.predicted:.2f} from isolated costs, "
        f"theorem 3.8 {row['Theorem 3.8']:.2f}",
    )


def verdict_line(result):
    """The last of `verdict_lines`: the best setting, measured on fresh prompts, and predicted."""
    return verdict_lines(result)[1]
