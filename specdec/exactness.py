"""Chapter 9: exactness through the real models, a test that can fail, and its controls.

Under exactness every emitted token is a draw from the target's law given its prefix, so the
randomized probability integral transform of every token is i.i.d. uniform (Rosenblatt, 1952),
whatever the prompt, the position or the path (kept draft, residual or bonus) it came from.
`generation_test` runs `Pair.run`, the real path, and tests them all at once; a `BrokenPair`
plants one bug in the same loop, for the negative controls.
"""

import inspect
from numbers import Integral, Real
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import stats

from .checks import _check_count, _check_positive_count
from .pair import Pair
from .rule import BROKEN_RULES
from .transformer import one_blas_thread, softmax_law
from .verify import _verify, verify

# generation_test against diluted bugs and small shifts, written by scripts/generation_dose.py
DOSE_RECORD = Path(__file__).parent / "data" / "generation_dose.json"
GENERATION_LEVEL = 1e-3  # generation_test's level: a correct pipeline fails it this often, by seed
MAX_TEST_PROMPTS = 1024  # prompts of one generation_test, one batch: the small pair's KV
# caches then stay under 0.6 GiB at any length; a larger model's are bounded by MAX_BYTES
PIT_BINS = 20  # GenerationTest.counts: PIT values in each twentieth of [0, 1]


class GenerationTest(NamedTuple):
    """generation_test's verdict, and what ran."""

    p_value: float  # Kolmogorov–Smirnov test of the PIT values against uniform on [0, 1]
    passed: bool  # p_value > level
    level: float
    statistic: float  # the KS distance D = sup |empirical CDF − u|
    n_values: int  # PIT values tested: one per emitted token, n_prompts · n_tokens
    counts: np.ndarray  # (PIT_BINS,) PIT values in each equal bin of [0, 1]
    draft: str | None
    gamma: int
    seed: int
    n_prompts: int
    n_tokens: int
    prompt_length: int
    temperature: float
    calls: int  # target calls of the run
    min_rollbacks: int  # rollbacks of the row with fewest: steps that discarded a draft
    tokens_per_call: float  # tokens a target call emitted, averaged over the run's steps
    test: str  # what was tested, in words


def pit_values(laws, tokens, uniforms, key):
    """The randomized PIT u = F(x−) + U·p(x) of each token x (…) under its law p (…, V), with
    U (…) uniform: F(x−) is the mass of the tokens before x when they are sorted by key (…, V)
    ascending, ties by index. If each x is drawn from its p given everything before it, the u
    are i.i.d. uniform on [0, 1] (Rosenblatt), for any key that the past fixes."""
    p_x = np.take_along_axis(laws, tokens[..., None], axis=-1)  # (…, 1)
    k_x = np.take_along_axis(key, tokens[..., None], axis=-1)
    before = (key < k_x) | ((key == k_x) & (np.arange(laws.shape[-1]) < tokens[..., None]))
    return (laws * before).sum(axis=-1) + uniforms * p_x[..., 0]


def _fresh_laws(target, sequences, prompt_length, temperature, chunk=64):
    """The target's law (B, n, V) of each token after the prompt, given its prefix, from one
    forward call over each sequence (B, prompt_length + n) from an empty cache: no rollback."""
    out = []
    for start in range(0, len(sequences), chunk):
        inputs = sequences[start : start + chunk, :-1]
        target.reset(len(inputs), inputs.shape[1])
        out.append(softmax_law(target.forward(inputs)[:, prompt_length - 1 :], temperature))
    return np.concatenate(out)


def generation_test(
    pair,
    draft,
    gamma,
    seed=0,
    n_prompts=256,
    n_tokens=64,
    prompt_length=16,
    temperature=1.0,
    level=GENERATION_LEVEL,
):
    """Test that `pair.run` with this draft and γ emits the target's law, through the real path:
    n_prompts held-out prompts of prompt_length characters (seeded offsets) in one batch, each
    run for n_tokens with the KV caches, their rollbacks and rows leaving the batch. A fresh
    forward call of the target over each output gives every token's law given its prefix; the
    PIT values of all tokens (pit_values, their uniforms from a stream of their own) are tested
    against uniform by one Kolmogorov–Smirnov test. The tokens are sorted by q/p, the ratio of a
    fresh call of the draft's law to the target's at each prefix (q uniform when draft is None):
    any order the prefix fixes keeps the test exact, and this one puts the tokens a draft-side
    bug over-emits, where q > p, together near u = 1. A GenerationTest; seed fixes all three
    streams (prompts, generation, PIT)."""
    if not isinstance(pair, Pair):
        raise TypeError(f"pair must be a Pair (from load_pair()), got {type(pair).__name__}")
    _check_count(seed, "seed")
    why = "one batch, whose KV caches must fit in memory"
    _check_positive_count(n_prompts, "n_prompts", MAX_TEST_PROMPTS, why)
    _check_positive_count(n_tokens, "n_tokens")
    _check_positive_count(prompt_length, "prompt_length", pair.context - 1, "a token must follow")
    if isinstance(level, bool) or not isinstance(level, Real) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    seed, n_prompts, prompt_length = int(seed), int(n_prompts), int(prompt_length)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]
    heldout = pair.encode(pair.heldout_text)
    starts = streams[0].integers(0, len(heldout) - prompt_length + 1, n_prompts)
    prompts = heldout[starts[:, None] + np.arange(prompt_length)]
    with pair._exclusive():  # the run and the fresh call hold the target's cache in turn
        run = pair.run(prompts, n_tokens, gamma, streams[1], draft, temperature)
        with one_blas_thread():
            sequences = np.concatenate([prompts, run.tokens], axis=1)
            laws = _fresh_laws(pair.target, sequences, prompt_length, temperature)
            fresh = (pair.drafts[draft], sequences, prompt_length, temperature)
            q = _fresh_laws(*fresh) if draft else 1.0  # no draft: q uniform, so p descending
    with np.errstate(divide="ignore", invalid="ignore"):  # p = 0: never drawn under exactness
        key = q / laws
    u = pit_values(laws, run.tokens, streams[2].random(run.tokens.shape), key).ravel()
    ks = stats.kstest(u, "uniform")
    active = run.accepted >= 0  # (steps, B)
    rollbacks = (active & (run.accepted < gamma)).sum(axis=0) if draft else np.zeros(1, int)
    return GenerationTest(
        p_value=float(ks.pvalue),
        passed=bool(ks.pvalue > level),
        level=float(level),
        statistic=float(ks.statistic),
        n_values=int(u.size),
        counts=np.histogram(u, bins=PIT_BINS, range=(0, 1))[0],
        draft=draft,
        gamma=int(gamma) if draft else 0,
        seed=seed,
        n_prompts=n_prompts,
        n_tokens=int(n_tokens),
        prompt_length=prompt_length,
        temperature=float(temperature),
        calls=run.calls,
        min_rollbacks=int(rollbacks.min()),
        tokens_per_call=float((run.accepted[active] + 1).mean()) if draft else 1.0,
        test=(
            f"Kolmogorov–Smirnov test of {u.size:,} randomized PIT values (tokens in order of "
            f"q/p at each prefix) against uniform on [0, 1], at the level {level:g}"
        ),
    )


# How far a rerun's statistic and p-value may sit from a stored run's. The PIT values come from
# float32 forward passes, whose last bits depend on the CPU's BLAS kernels: the stored runs (made
# on an AVX2 machine) and an AVX-512 one gave KS statistics 1.2e-7 apart and p-values 6.4e-6 apart
# (relative), with the same tokens. The bounds are 8 and 16 times those gaps.
STATISTIC_SLACK, P_VALUE_SLACK = 1e-6, 1e-4


def default_size():
    """generation_test's default size and level, as its stored records name them."""
    params = inspect.signature(generation_test).parameters
    size = {k: params[k].default for k in ("n_prompts", "n_tokens", "prompt_length")}
    return size | {"level": GENERATION_LEVEL}


def reproduces(result, stored):
    """True iff the GenerationTest result is the stored run (a dict of scripts/
    generation_power.py): the counts that follow from its tokens exactly, its verdict, and its
    statistic and p-value within the slack that other CPUs' float32 kernels need."""
    exact = ("tokens_per_call", "min_rollbacks", "calls", "passed")
    return (
        all(getattr(result, key) == stored[key] for key in exact)
        and abs(result.statistic - stored["statistic"]) <= STATISTIC_SLACK
        and abs(result.p_value - stored["p_value"]) <= P_VALUE_SLACK * stored["p_value"]
    )


BUGS = {  # BrokenPair's planted bugs: each changes one piece of the generation loop
    "stale target position": "the target's rollback keeps one stale position: the last one kept "
    "holds the keys and values of the first one discarded",
    "draft cache not rolled back": "the draft's cache is never rolled back: it drafts on after "
    "every token it was fed, the rejected drafts included",
    "residual from p": "after a rejection the token is drawn from p, not norm(max(0, p − q))",
    "one uniform": "one uniform for all γ ratio tests of a step",
    "q row off by one": "the ratio and the residual at draft i use the law that drew draft i + 1 "
    "(the last draft its own)",
}


class BrokenPair(Pair):
    """A Pair with one of BUGS planted, for generation_test's negative controls: it shares the
    pair's models (and its lock) and runs the same generation loop, with one piece changed."""

    def __init__(self, pair, bug, fraction=1.0):
        if not isinstance(pair, Pair):
            raise TypeError(f"pair must be a Pair, got {type(pair).__name__}")
        if bug not in BUGS:
            raise ValueError(f"bug must be one of {sorted(BUGS)}, got {bug!r}")
        if isinstance(fraction, bool) or not isinstance(fraction, Real) or not 0 < fraction <= 1:
            raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
        if fraction < 1 and bug == "draft cache not rolled back":
            raise ValueError("fraction < 1 needs a bug of one step; the draft's cache is not")
        self.__dict__.update(pair.__dict__)
        self.bug, self.fraction = bug, float(fraction)

    def _models(self, draft):
        """The pair's models, the target or the draft wrapped by the bug."""
        models = super()._models(draft)
        if self.bug == "stale target position":
            return (_StaleRollback(models[0], self.fraction), *models[1:])
        if self.bug == "draft cache not rolled back" and draft is not None:
            return (models[0], _NoRollback(models[1]))
        return models

    def _verify(self, target_probs, draft_probs, draft_tokens, rng):
        """The bug's verifier on each row with probability `fraction` (a draw from rng when
        fraction < 1), the book's `verify` on the others."""
        if self.bug == "stale target position":  # a cache bug: the verifier is the book's
            return verify(target_probs, draft_probs, draft_tokens, rng)
        if self.fraction == 1:
            return self._broken(target_probs, draft_probs, draft_tokens, rng)
        hit = rng.random(len(draft_tokens)) < self.fraction  # (B,) the rows the bug takes
        accepted = np.empty(len(draft_tokens), dtype=np.int64)
        emitted = np.empty((len(draft_tokens), draft_tokens.shape[1] + 1), dtype=np.int64)
        for rows, check in ((~hit, verify), (hit, self._broken)):
            if rows.any():
                accepted[rows], emitted[rows] = check(
                    target_probs[rows], draft_probs[rows], draft_tokens[rows], rng
                )
        return accepted, emitted

    def _broken(self, target_probs, draft_probs, draft_tokens, rng):
        """The bug's verifier: chapter 3's broken rules, or `verify` handed the wrong q rows."""
        rule = {"residual from p": "resample from p", "one uniform": "one uniform"}.get(self.bug)
        if rule:  # chapter 3's broken rules
            return _verify(target_probs, draft_probs, draft_tokens, rng, BROKEN_RULES[rule])
        if self.bug == "q row off by one":
            draft_probs = np.concatenate([draft_probs[:, 1:], draft_probs[:, -1:]], axis=1)
        return verify(target_probs, draft_probs, draft_tokens, rng)


class ShiftedPair(Pair):
    """A Pair whose verifier is handed (1 − ε)·p + ε·e_token for the target's p at every
    position: the rule is exact for the rows it is given, so the run emits that law, a shift of
    probability ε·(1 − p(token)) onto one token (its total variation from p at each position)."""

    def __init__(self, pair, token, epsilon):
        if not isinstance(pair, Pair):
            raise TypeError(f"pair must be a Pair, got {type(pair).__name__}")
        if isinstance(token, bool) or not isinstance(token, Integral):
            raise TypeError(f"token must be an int id, got {type(token).__name__}")
        if not 0 <= token < len(pair.vocab):
            raise ValueError(f"token must lie in [0, {len(pair.vocab)}), got {token}")
        if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not 0 < epsilon <= 1:
            raise ValueError(f"epsilon must be a number in (0, 1], got {epsilon!r}")
        self.__dict__.update(pair.__dict__)
        self.token, self.epsilon = int(token), float(epsilon)

    def _verify(self, target_probs, draft_probs, draft_tokens, rng):
        """`verify` on the shifted target rows (B, γ + 1, V)."""
        shifted = (1 - self.epsilon) * target_probs
        shifted[..., self.token] += self.epsilon
        return verify(shifted, draft_probs, draft_tokens, rng)


class _StaleRollback:
    """A transformer whose rollback keeps one stale position: after forgetting positions, the
    last position kept holds the keys and values of the first one forgotten. With fraction < 1
    each rollback of a row does so with that probability (a generator seeded 0 per run)."""

    def __init__(self, model, fraction=1.0):
        self.model, self.fraction = model, fraction
        self.rng = np.random.default_rng(0)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def rollback(self, lengths):
        """The model's rollback, then the stale copy into the last position kept."""
        model = self.model
        before = model.lengths.copy()
        model.rollback(lengths)
        stale = (model.lengths < before) & (model.lengths >= 1)
        if self.fraction < 1:
            stale &= self.rng.random(len(stale)) < self.fraction
        rows = np.flatnonzero(stale)
        kept = model.lengths[rows]
        for cache in (model.keys, model.values):  # (L, B, length, d)
            cache[:, rows, kept - 1] = cache[:, rows, kept]


class _NoRollback:
    """A draft whose cache is never rolled back: the loop sees the lengths it asks for, while the
    model goes on from every token it was fed. When the model's cache is full, it starts over
    with the last half of what it was fed (a count draft has no cache: no change)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    @property
    def batch(self):
        """Number of sequences."""
        return len(self.lengths)

    def reset(self, batch=1, length=None):
        """Empty the cache with room for the longest the model knows."""
        self.model.reset(batch)
        self.lengths = np.zeros(batch, dtype=np.int64)
        self.fed = np.zeros((batch, 0), dtype=np.int64)

    def rollback(self, lengths):
        """Only the lengths the loop sees."""
        self.lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), self.lengths.shape)

    def select(self, rows):
        """Keep only the sequences where rows (B,) is True."""
        self.model.select(rows)
        self.lengths, self.fed = self.lengths[rows], self.fed[rows]

    def prefill(self, ids):
        """Cache ids (B, n)."""
        self.model.prefill(ids)
        self.lengths, self.fed = self.lengths + ids.shape[1], np.asarray(ids)

    def forward(self, ids):
        """Logits (B, n, V) after everything fed so far, then ids (B, n)."""
        ids = np.asarray(ids)
        room = getattr(self.model, "keys", np.zeros((0, 0, 1 << 30))).shape[2]
        if self.model.lengths.max() + ids.shape[1] > room:
            self.model.reset(self.batch)
            self.model.forward(self.fed[:, -(room // 2) :])
        self.lengths = self.lengths + ids.shape[1]
        self.fed = np.concatenate([self.fed, ids], axis=1)
        return self.model.forward(ids)


def rejections(subject, draft, gamma, seeds, **size):
    """generation_test of subject (a Pair, BrokenPair or ShiftedPair) at each seed: a list of
    {seed, p_value, passed, statistic, tokens_per_call, min_rollbacks, calls}, what `reproduces`
    compares; size passes n_prompts, n_tokens, prompt_length or level on."""
    out = []
    for seed in seeds:
        result = generation_test(subject, draft, gamma, seed=seed, **size)
        out.append(
            {
                "seed": int(seed),
                "p_value": result.p_value,
                "passed": result.passed,
                "statistic": result.statistic,
                "tokens_per_call": result.tokens_per_call,
                "min_rollbacks": result.min_rollbacks,
                "calls": result.calls,
            }
        )
    return out


def smallest_detected(effects, rejected, runs, power=0.9):
    """The smallest effect whose share of rejected runs reaches power, among effects measured
    (rejected[i] of runs[i] at effects[i]), or None; the shares need not be monotone."""
    reached = [e for e, k, n in zip(effects, rejected, runs) if n and k / n >= power]
    return min(reached) if reached else None
