"""Chapter 9: a character-level pair trained on Tiny Shakespeare, run through the book's checks.

The target (4 layers, d = 128) and the transformer drafts were trained once with JAX by
scripts/train_pair.py (`make train`); their float32 weights ship in specdec/weights with a
manifest of hashes, configs and held-out losses, each file checked by `loading` before it is
used. Here they run in numpy through chapter 8's
transformer, so the book never imports JAX. Two more drafts come from the training split's
character counts: a unigram and an add-one bigram.

Token ids are a character's index in the sorted vocabulary; there is no start token, so a prompt
holds at least one character. The models know 128 positions and no window slides: a run whose
prompt, tokens and draft positions need more is refused, so every law here is the trained one.
"""

import html
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import stats
from threadpoolctl import threadpool_limits

from .checks import (
    _check_count,
    _check_memory,
    _check_positive_count,
    _check_rng,
    _check_unit_interval,
)
from .loading import (
    _check_reference,
    _checked_file,
    _config,
    _corpus,
    _field,
    _models,
    _read_manifest,
    _storage,
    _weights,
)
from .rule import EXACT_RULE
from .style import OKABE_ITO, new_figure
from .transformer import (
    BLAS_THREADS,
    TinyTransformer,
    one_blas_thread,
    quick_law,
    softmax_law,
)
from .verify import _sample_rows, _verify, verify

PACKAGE = Path(__file__).resolve().parent
WEIGHTS = PACKAGE / "weights"  # manifest.json and one .npz per trained model
ACCEPTED, RESIDUAL, BONUS, PLAIN = 0, 1, 2, 3  # where an emitted token came from (Run.kinds)
MAX_DRAFTS = 32  # draft positions per step; the 128-position context binds first anyway


class CountModel:
    """A draft from character counts with the transformer's cache interface: no cache needed.

    law is (V,) for a unigram (the same law after any context) or (V, V) for a bigram (the law
    after the context's last character). Its logits are log law, so softmax(logits / T) is
    law^(1/T) renormalised, as for the transformers.
    """

    def __init__(self, law):
        self.law = np.asarray(law, dtype=np.float64)
        with np.errstate(divide="ignore"):  # a character never seen: logit −inf, probability 0
            self.logits = np.log(self.law)
        self.reset()

    def reset(self, batch=1, length=None):
        """Forget every sequence; room for `batch` (the length is unlimited)."""
        self.lengths = np.zeros(batch, dtype=np.int64)

    @property
    def batch(self):
        """Number of sequences."""
        return len(self.lengths)

    def rollback(self, lengths):
        """Forget every position at or past lengths (B,)."""
        self.lengths = np.full(self.lengths.shape, lengths, np.int64)

    def select(self, rows):
        """Keep only the sequences where rows (B,) is True."""
        self.lengths = self.lengths[rows]

    def prefill(self, ids):
        """Take in ids (B, n): nothing to compute."""
        self.lengths = self.lengths + np.asarray(ids).shape[1]

    def forward(self, ids):
        """Log-laws (B, n, V) of the token after each of the n new ids (B, n)."""
        ids = np.asarray(ids)
        self.lengths = self.lengths + ids.shape[1]
        if self.law.ndim == 2:
            return self.logits[ids]  # (B, n, V)
        return np.broadcast_to(self.logits, (*ids.shape, len(self.law)))

    def next_probs(self, ids, temperature=1.0):
        """The law of the token after each row of ids (B, T), at temperature T, float64."""
        ids = np.asarray(ids)
        return softmax_law(self.forward(ids[:, -1:])[:, 0], temperature)


def count_laws(ids, vocab):
    """(unigram (V,), add-one bigram (V, V)) laws from a run of ids, as train_pair.py makes them."""
    unigram = np.bincount(ids, minlength=vocab) / len(ids)
    bigram = np.ones((vocab, vocab))
    np.add.at(bigram, (ids[:-1], ids[1:]), 1.0)
    return unigram / unigram.sum(), bigram / bigram.sum(axis=1, keepdims=True)


TARGETS = ("target", "target-large")  # load_pair's targets: the small one, the large one
LARGE = "large_target"  # the manifest's entry for the bandwidth-bound target


def load_pair(folder=WEIGHTS, target="target"):
    """The shipped pair, numpy only: every file checked against folder/manifest.json (its own
    hash, each file's sha256, each array's header, dtype, shape and finiteness, the configs,
    and each model's logits against the stored reference), else a ValueError naming the file.
    target="target-large" puts chapter 9's bandwidth-bound target in the small one's place,
    with the same drafts."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    folder = Path(folder)
    manifest, path = _read_manifest(folder)
    vocab, ids, split, text = _corpus(folder, manifest, path)  # the corpus sits beside weights/
    models = _models(folder, manifest, path, vocab)
    _check_reference(folder, manifest, path, models)
    unigram, bigram = count_laws(ids[:split], len(vocab))
    drafts = {"unigram": CountModel(unigram), "bigram": CountModel(bigram)}
    drafts |= {name: model for name, model in models.items() if name != "target"}
    chosen = models["target"] if target == "target" else _large(folder, manifest, path, vocab)
    return Pair(vocab, chosen, drafts, text[split:], manifest)


def _large(folder, manifest, path, vocab):
    """The manifest's large target (float16-stored, upcast), its logits checked against its own
    reference file."""
    entry = _field(manifest, LARGE, dict, path, "the manifest")
    config = _config(entry, vocab, path, "target-large")
    file = _checked_file(folder, entry, path, LARGE)
    model = TinyTransformer(config, 1, _weights(file, config, _storage(entry, path, LARGE)))
    _check_reference(folder, entry, path, {"target-large": model}, LARGE)
    return model


# ---- The pair: tokenizer, models, generation ---------------------------------------------------


class Run(NamedTuple):
    """A generation: tokens (B, n), where each came from, and what each target call saw."""

    tokens: np.ndarray  # (B, n_tokens) int64
    kinds: np.ndarray  # (B, n_tokens) int8: ACCEPTED, RESIDUAL, BONUS or PLAIN
    accepted: np.ndarray  # (steps, B) drafts kept at each target call; −1 once a row is done
    betas: np.ndarray | None  # (steps, B, γ): β = Σ min(p, q) at each drafted position
    ratios: np.ndarray | None  # (steps, B, γ): min(1, p(x)/q(x)) of each drafted token x
    calls: int  # target calls (one per step)


IN_USE = "this Pair is in use by another thread; make one Pair per thread with load_pair()"


class Pair:
    """The shipped target and drafts, the vocabulary and the held-out text.

    The models keep their KV caches on themselves, so one Pair generates for one thread at a
    time: `generate`, `run` and `generation_test` called from a second thread while a first is
    inside them raise a RuntimeError (IN_USE) rather than mix the two threads' caches."""

    def __init__(self, vocab, target, drafts, heldout_text, manifest):
        self.vocab, self.target, self.drafts = list(vocab), target, drafts
        self.heldout_text, self.manifest = heldout_text, manifest
        self.index = {ch: i for i, ch in enumerate(self.vocab)}
        self.context = target.config.max_len  # positions the models know
        self._lock = threading.RLock()  # shared with every BrokenPair made from this one

    @contextmanager
    def _exclusive(self):
        """Hold this Pair's models for the calling thread, or raise IN_USE at once."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(IN_USE)
        try:
            yield
        finally:
            self._lock.release()

    def encode(self, text):
        """Token ids (n,) of a string; characters outside the vocabulary raise a ValueError."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(f"text holds characters outside the vocabulary: {unknown!r}")
        return np.array([self.index[ch] for ch in text], dtype=np.int64)

    def decode(self, ids):
        """The string of token ids (n,)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.vocab)):
            raise ValueError(f"ids must lie in [0, {len(self.vocab)})")
        return "".join(self.vocab[i] for i in ids)

    def generate(self, prompt_ids, n_tokens, gamma, rng, draft=None, temperature=1.0):
        """n_tokens (B, n_tokens) after each prompt row (B, T): plain sampling from the target
        when draft is None (gamma is then unused), else speculative decoding with `verify`."""
        return self.run(prompt_ids, n_tokens, gamma, rng, draft, temperature).tokens

    def run(self, prompt_ids, n_tokens, gamma, rng, draft=None, temperature=1.0, record=False):
        """`generate`, keeping where each token came from, and with record=True what each target
        call saw (β and min(1, p/q) of every draft: bookkeeping that plain generation skips)."""
        with self._exclusive(), one_blas_thread():
            return self._run(prompt_ids, n_tokens, gamma, rng, draft, temperature, record)

    def _run(self, prompt_ids, n_tokens, gamma, rng, draft, temperature, record):
        """`run` without the thread limit."""
        prompt = self._check_prompt(prompt_ids)
        _check_count(n_tokens, "n_tokens")
        _check_count(gamma, "gamma", MAX_DRAFTS, "draft positions per target call")
        _check_rng(rng)
        softmax_law(np.zeros(1), temperature)  # checks the temperature
        if draft is not None and (not isinstance(draft, str) or draft not in self.drafts):
            raise ValueError(f"draft must be None or one of {sorted(self.drafts)}, got {draft!r}")
        n_tokens, gamma = int(n_tokens), 0 if draft is None else int(gamma)  # numpy ints too
        width = prompt.shape[1] + n_tokens + gamma  # positions a row's cache may reach, and 1
        if width > self.context:
            raise ValueError(
                f"prompt length + n_tokens + gamma = {width} exceeds the {self.context} "
                "positions the models know (no window slides, so the law stays the trained one)"
            )
        models = self._models(draft)
        for model in models:
            _prime(model, prompt, width)
        if draft is None:
            return _plain(models[0], prompt, n_tokens, rng, temperature)
        args = prompt, n_tokens, gamma, rng, temperature, record, self._verify
        return _speculative(*models, *args)

    def _models(self, draft):
        """The models a run calls: the target, then the draft's model unless draft is None."""
        return (self.target,) if draft is None else (self.target, self.drafts[draft])

    def _verify(self, target_probs, draft_probs, draft_tokens, rng):
        """The verifier a run calls: the book's `verify`, without the per-call input checks (the
        loop makes its inputs: softmax rows of finite logits, drafts drawn from them, and a
        generator `run` checked once); the same draws and tokens as `verify`."""
        return _verify(target_probs, draft_probs, draft_tokens, rng, EXACT_RULE)

    def _check_prompt(self, prompt_ids):
        """prompt_ids as (B, T ≥ 1) int64 ids; a 1-D prompt is one row."""
        prompt = np.asarray(prompt_ids)
        prompt = prompt[None] if prompt.ndim == 1 else prompt
        if prompt.ndim != 2 or prompt.shape[0] < 1 or prompt.shape[1] < 1:
            raise ValueError(
                f"prompt_ids must have shape (B, T) with B, T >= 1, got {prompt.shape}"
            )
        if prompt.dtype.kind not in "iu":
            raise ValueError(f"prompt_ids must be integers, got dtype {prompt.dtype}")
        if prompt.min() < 0 or prompt.max() >= len(self.vocab):
            raise ValueError(f"prompt_ids must lie in [0, {len(self.vocab)})")
        return prompt.astype(np.int64)


def _prime(model, prompt, width):
    """Empty the model's cache for the prompt rows (B, T) and cache all but their last token."""
    model.reset(len(prompt), width)
    if prompt.shape[1] > 1:
        model.prefill(prompt[:, :-1])


def _plain(target, prompt, n_tokens, rng, temperature):
    """Plain sampling: one target call per token, each drawn from p^(1/T) renormalised."""
    batch = len(prompt)
    tokens, last = np.zeros((batch, n_tokens), dtype=np.int64), prompt[:, -1:]
    for i in range(n_tokens):
        tokens[:, i] = _sample_rows(quick_law(target.forward(last)[:, 0], temperature), rng)
        last = tokens[:, i : i + 1]
    accepted = np.zeros((n_tokens, batch), dtype=np.int64)
    return Run(tokens, np.full((batch, n_tokens), PLAIN, np.int8), accepted, None, None, n_tokens)


def _speculative(
    target, draft, prompt, n_tokens, gamma, rng, temperature, record=False, check=verify
):
    """Speculative decoding with `check` (the book's `verify`): γ draft calls, then one target
    call, per step; a row leaves the batch (and the models' caches) once it has n_tokens."""
    (batch, start), end = prompt.shape, prompt.shape[1] + n_tokens
    seq = np.zeros((batch, end + gamma + 1), dtype=np.int64)  # prompt, then emitted tokens
    seq[:, :start] = prompt
    kinds = np.full(seq.shape, PLAIN, dtype=np.int8)
    filled = np.full(batch, start)  # tokens in seq; the target's cache holds seq[:, :filled - 1]
    live = np.arange(batch)[filled < end]  # rows still generating, in the caches' order
    log, betas, ratios = [], [], []
    while len(live):
        f, rows = filled[live], live[:, None]
        drafts, q = _draft(draft, seq[live], f, gamma, rng, temperature, target.config.n_outputs)
        ids = np.concatenate([seq[live, f - 1][:, None], drafts], axis=1)  # (b, γ + 1)
        p = quick_law(target.forward(ids), temperature)  # (b, γ + 1, V): one call
        accepted, emitted = check(p, q, drafts, rng)
        target.rollback(f + accepted)  # keep the last token and the kept drafts
        if gamma:  # the draft was fed the last token and γ − 1 drafts: keep those kept
            draft.rollback(f + np.minimum(accepted, gamma - 1))
        slot, a = np.arange(gamma + 1), accepted[:, None]
        kept = slot <= a  # (b, γ + 1): the kept drafts, then one token from p or the residual
        kind = np.where(slot < a, ACCEPTED, np.where(a == gamma, BONUS, RESIDUAL))
        slots = f[:, None] + slot
        seq[rows, slots] = np.where(kept, emitted, seq[rows, slots])
        kinds[rows, slots] = np.where(kept, kind, kinds[rows, slots])
        filled[live] = f + accepted + 1
        log.append(_spread(accepted, live, batch, -1))
        if record:
            p_x, q_x = (
                np.take_along_axis(x[:, :gamma], drafts[..., None], -1)[..., 0] for x in (p, q)
            )
            betas.append(_spread(np.minimum(p[:, :gamma], q).sum(axis=-1), live, batch, 0.0))
            ratios.append(_spread(np.minimum(1, p_x / q_x), live, batch, 0.0))  # q_x > 0: x ~ q
        going = filled[live] < end
        if not going.all():
            live = live[going]
            for model in (target, draft):
                model.select(going)
    tokens, kinds = seq[:, start:end], kinds[:, start:end]
    betas, ratios = (np.array(x) if record else None for x in (betas, ratios))
    return Run(tokens, kinds, np.array(log), betas, ratios, len(log))


def _spread(values, live, batch, fill):
    """values (b, …) of the live rows in a (batch, …) array, fill elsewhere."""
    out = np.full((batch, *values.shape[1:]), fill, dtype=values.dtype)
    out[live] = values
    return out


def _draft(draft, seq, filled, gamma, rng, temperature, vocab):
    """γ draft tokens (B, γ) and their laws (B, γ, V), one draft call each."""
    batch = len(filled)
    tokens, laws = np.zeros((batch, gamma), dtype=np.int64), np.zeros((batch, gamma, vocab))
    if gamma == 0:
        return tokens, laws
    pending = int((filled - draft.lengths).max())  # 1, or 2 after a fully kept step
    draft.rollback(filled - pending)
    fed = seq[np.arange(batch)[:, None], (filled - pending)[:, None] + np.arange(pending)]
    logits = draft.forward(fed)[:, -1]  # (B, V)
    for i in range(gamma):
        if i:
            logits = draft.forward(tokens[:, i - 1 : i])[:, 0]
        laws[:, i] = quick_law(logits, temperature)
        tokens[:, i] = _sample_rows(laws[:, i], rng)
    return tokens, laws


def plain(model, prompt_ids, n_tokens, rng, temperature=1.0):
    """n_tokens (B, n_tokens) sampled from one model alone after each prompt row (B, T)."""
    prompt = np.asarray(prompt_ids)
    prompt = prompt[None] if prompt.ndim == 1 else prompt
    _check_count(n_tokens, "n_tokens")
    _check_rng(rng)
    n_tokens = int(n_tokens)  # a numpy integer too
    known = model.config.max_len if isinstance(model, TinyTransformer) else float("inf")
    if prompt.shape[1] + n_tokens > known:
        raise ValueError(
            f"prompt length + n_tokens = {prompt.shape[1] + n_tokens} exceeds the {known} "
            "positions the model knows (no window slides)"
        )
    _prime(model, prompt, prompt.shape[1] + n_tokens)
    return _plain(model, prompt, n_tokens, rng, temperature).tokens


# ---- Exact laws from the real rows ------------------------------------------------------------


def one_token_law(p, q, rule=EXACT_RULE):
    """Theorem 2.1 on rows (…, V): q·accept + (1 − Σ q·accept)·correction; p for the exact rule."""
    accept, correction = rule.tables(p, q)
    kept = q * accept
    return kept + (1 - kept.sum(axis=-1, keepdims=True)) * correction


def two_token_law(p1, q1, p2, q2, rule=EXACT_RULE):
    """Law (V, V) of the first two tokens of a step with γ ≥ 2, every path enumerated: p1, q1
    (V,) after the prompt; p2, q2 (V, V) after the prompt and each first token."""
    a1, correction1 = rule.tables(p1, q1)
    a2, correction2 = rule.tables(p2, q2)
    both = np.minimum(a1[:, None], a2) if rule.shared_uniform else a1[:, None] * a2  # (V, V)
    law = q1[:, None] * q2 * both  # x1 and x2 both kept
    first_only = (q1[:, None] * q2 * (a1[:, None] - both)).sum(axis=1)  # x1 kept, x2 not
    law += first_only[:, None] * correction2
    rejected = 1 - (q1 * a1).sum()  # x1 rejected: y1 from the correction, then a fresh step
    return law + rejected * correction1[:, None] * one_token_law(p2, q2, rule)


def rows_after(model, prompt, temperature=1.0):
    """(law after the prompt (V,), laws after the prompt and each token x (V, V))."""
    first = model.next_probs(prompt[None], temperature)[0]  # (V,)
    vocab = len(first)
    extended = np.concatenate([np.tile(prompt, (vocab, 1)), np.arange(vocab)[:, None]], axis=1)
    return first, model.next_probs(extended, temperature)


def sample_two_tokens(p1, q1, p2, q2, n, rng, rule=EXACT_RULE, chunk=50_000):
    """n draws (n, 2) of the first two tokens of speculative decoding with γ = 2 from these rows
    (as two_token_law), through the batched verifier with `rule`; after a step that keeps no
    draft, a fresh γ = 1 step at the new context gives the second token."""
    return np.concatenate(
        [_two_tokens(p1, q1, p2, q2, min(chunk, n - i), rng, rule) for i in range(0, n, chunk)]
    )


def _two_tokens(p1, q1, p2, q2, n, rng, rule):
    """sample_two_tokens for one chunk of n draws."""
    first_q = np.broadcast_to(q1, (n, len(q1)))
    x1 = _sample_rows(first_q, rng)
    x2 = _sample_rows(q2[x1], rng)
    p = np.stack([np.broadcast_to(p1, first_q.shape), p2[x1], p2[x1]], axis=1)  # (n, 3, V)
    # the bonus row (third) stands in for p after x1 x2: only the first two tokens are kept
    accepted, emitted = _verify(p, np.stack([first_q, q2[x1]], axis=1), np.c_[x1, x2], rng, rule)
    out = emitted[:, :2].copy()
    fresh = accepted == 0  # one token emitted: the second comes from a new step after it
    y1 = out[fresh, 0]
    draft = _sample_rows(q2[y1], rng)
    second = _verify(np.stack([p2[y1]] * 2, axis=1), q2[y1][:, None], draft[:, None], rng, rule)
    out[fresh, 1] = second[1][:, 0]
    return out


MIN_EXPECTED = 5  # pooled_chi_square: cells expecting fewer draws are pooled into one


def pooled_chi_square(counts, law):
    """(p-value, degrees of freedom) of Pearson's test of counts (K,) against law (K,), with the
    cells expecting fewer than MIN_EXPECTED draws pooled into one (chapter 9's law tests)."""
    stat, df = _pooled_statistic(counts, law)
    return float(stats.chi2.sf(stat, df)), df


def combined_chi_square(counts, laws):
    """(p-value, degrees of freedom) of Pearson's test of independent samples at S contexts:
    counts (S, K) against laws (S, K), each row pooled as in pooled_chi_square; the statistics
    and their degrees of freedom add."""
    counts, laws = np.asarray(counts), np.asarray(laws)
    if counts.ndim != 2 or counts.shape != laws.shape:
        raise ValueError(
            f"counts and laws must have one shape (S, K), got {counts.shape} and {laws.shape}"
        )
    parts = [_pooled_statistic(c, law) for c, law in zip(counts, laws)]
    stat, df = sum(s for s, _ in parts), sum(d for _, d in parts)
    return float(stats.chi2.sf(stat, df)), df


def _pooled_statistic(counts, law):
    """Pearson's statistic and its degrees of freedom, sparse cells pooled (pooled_chi_square)."""
    counts, law = np.asarray(counts, dtype=float), np.asarray(law, dtype=float)
    expected = counts.sum() * law
    big = expected >= MIN_EXPECTED
    observed = np.append(counts[big], counts[(law > 0) & ~big].sum())
    expected = np.append(expected[big], expected[(law > 0) & ~big].sum())
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


def detection_probability(law, null, n, level=1e-3):
    """The probability that pooled_chi_square rejects `null` (K,) at `level` for n draws from
    `law` (K,), by the noncentral chi-square: λ = n·Σ (law − null)² / null over the cells that
    pooled_chi_square forms for n draws from null (mass where null = 0 is not counted)."""
    law, null = np.asarray(law, dtype=float), np.asarray(null, dtype=float)
    big = n * null >= MIN_EXPECTED
    cells = [np.append(x[big], x[(null > 0) & ~big].sum()) for x in (law, null)]
    keep = cells[1] > 0
    lam = n * float(((cells[0][keep] - cells[1][keep]) ** 2 / cells[1][keep]).sum())
    df = int(keep.sum()) - 1
    return float(stats.ncx2.sf(stats.chi2.isf(level, df), df, lam))


def tokens_per_call(run):
    """Tokens per target call of a speculative Run, measured and predicted from the same steps.

    Every value is a ratio of totals over all the rows' steps, each row's last step included: a
    step is taken while its row lacks tokens, decided before the step, so by Wald's identity the
    totals carry no stopping bias (each row's own mean has some: a row that drew long steps
    stops after fewer of them). α is the mean β over the tested positions, those whose earlier
    drafts in their step were all kept: Equation 1's α is the acceptance probability of a tested
    position. "alpha, all positions" averages every drafted position instead. The predictions
    are Eq. 1 at either α, 1 + Σ_i Π_{j≤i} β_j of each step, and 1 + Σ_i Π_{j≤i} min(1, p/q) of
    each step's drafts (its expected count given them). Each entry is (value, s.e.); for a
    prediction the s.e. is that of prediction − measured, by the jackknife over rows of the
    difference itself, so paired by row. The run must be made with record=True."""
    if run.betas is None:
        raise ValueError("run must come from pair.run(..., record=True) with a draft")
    active = run.accepted >= 0  # (steps, B)
    gamma = run.betas.shape[-1]
    tested = _tested(run)  # (steps, B, γ)

    def chain(x):  # (steps, B, γ) -> 1 + Σ_i Π_{j≤i} x_j
        return 1 + np.cumprod(x, axis=-1).sum(axis=-1)

    per_row = np.stack(  # (B, 7): each row's totals
        [
            np.where(active, run.accepted + 1, 0).sum(axis=0),
            np.where(active, chain(run.betas), 0).sum(axis=0),
            np.where(active, chain(run.ratios), 0).sum(axis=0),
            np.where(tested, run.betas, 0).sum(axis=(0, 2)),
            tested.sum(axis=(0, 2)),
            np.where(active[..., None], run.betas, 0).sum(axis=(0, 2)),
            active.sum(axis=0),
        ],
        axis=-1,
    ).astype(float)

    def statistics(sums):  # (..., 7) totals -> {name: (...,)}; predictions as differences
        tokens, products, given, beta_tested, tests, beta_all, steps = np.moveaxis(sums, -1, 0)
        measured = tokens / steps
        alpha, alpha_all = beta_tested / tests, beta_all / (steps * gamma)
        return {
            "measured": measured,
            "Eq. 1": _eq1(alpha, gamma) - measured,
            "Eq. 1, all positions": _eq1(alpha_all, gamma) - measured,
            "beta products": products / steps - measured,
            "given the drafts": given / steps - measured,
            "alpha": alpha,
            "alpha, all positions": alpha_all,
        }

    whole = statistics(per_row.sum(axis=0))
    left_out = statistics(per_row.sum(axis=0) - per_row)  # each row left out in turn, (B,)
    out = {key: (float(whole[key]), _jackknife_se(left_out[key])) for key in whole}
    for key in ("Eq. 1", "Eq. 1, all positions", "beta products", "given the drafts"):
        out[key] = (out["measured"][0] + out[key][0], out[key][1])
    return out


def acceptance_by_position(run):
    """Acceptance at each draft position of a recorded Run among its tested positions: (kept
    (γ,), tests (γ,), p-value of Pearson's test that every position keeps at one rate). Under
    Equation 1's model every test is an independent draw with the same α, so the p-value is
    uniform then."""
    if run.betas is None:
        raise ValueError("run must come from pair.run(..., record=True) with a draft")
    gamma = run.betas.shape[-1]
    tested = _tested(run)
    kept = tested & (np.arange(gamma) < run.accepted[..., None])
    kept, tests = kept.sum(axis=(0, 1)), tested.sum(axis=(0, 1))
    if gamma < 2:
        return kept, tests, 1.0
    table = np.stack([kept, tests - kept])
    return kept, tests, float(stats.chi2_contingency(table, correction=False).pvalue)


def _tested(run):
    """(steps, B, γ): the drafted positions whose test ran, every earlier draft of the step kept."""
    gamma = run.betas.shape[-1]
    return (run.accepted[..., None] >= 0) & (np.arange(gamma) <= run.accepted[..., None])


def stopping_bias(alpha, gamma, n_tokens, n_rows, reps, rng):
    """Relative bias, with its s.e., of two estimates of tokens per call from runs of n_rows rows
    of n_tokens each under Equation 1's model (every test keeps its draft with probability α,
    independently), from `reps` simulated runs: {"ratio of totals": (bias, s.e.), "rows' own
    means": (bias, s.e.)}, each relative to Eq. 1's value."""
    _check_unit_interval(alpha, "alpha")
    for value, name in [
        (gamma, "gamma"),
        (n_tokens, "n_tokens"),
        (n_rows, "n_rows"),
        (reps, "reps"),
    ]:
        _check_positive_count(value, name)
    _check_rng(rng)
    _check_memory(reps * n_rows * n_tokens * (gamma + 32), f"stopping_bias with reps={reps:,}")
    kept = rng.random((reps, n_rows, n_tokens, gamma)) < alpha  # n_tokens steps always suffice
    tokens = np.where(kept.all(-1), gamma, np.argmin(kept, -1)) + 1  # (reps, rows, steps)
    taken = np.cumsum(tokens, axis=-1) - tokens < n_tokens  # a step runs while tokens are lacking
    totals, steps = np.where(taken, tokens, 0).sum(-1), taken.sum(-1)  # (reps, rows)
    exact = _eq1(float(alpha), int(gamma))
    out = {}
    for name, values in [
        ("ratio of totals", totals.sum(-1) / steps.sum(-1)),
        ("rows' own means", (totals / steps).mean(-1)),
    ]:
        relative = values / exact - 1  # (reps,)
        out[name] = (float(relative.mean()), float(relative.std(ddof=1) / np.sqrt(reps)))
    return out


def _eq1(alpha, gamma):
    """Equation 1, Σ_{i=0..γ} α^i, for an array of α."""
    return sum(alpha**i for i in range(gamma + 1))


def _jackknife_se(left_out):
    """The jackknife standard error from a statistic's leave-one-out values (n,)."""
    n = len(left_out)
    return float(np.sqrt((n - 1) / n * ((left_out - left_out.mean()) ** 2).sum()))


# ---- Held-out text: α, β and the loss along real contexts --------------------------------------


def heldout_windows(pair, n_windows, length=None):
    """n_windows evenly spaced held-out windows of length + 1 ids (n, length + 1)."""
    length = length or pair.context
    ids = pair.encode(pair.heldout_text)
    starts = np.linspace(0, len(ids) - length - 1, n_windows).astype(np.int64)
    return ids[starts[:, None] + np.arange(length + 1)]


def window_laws(model, windows, temperature=1.0, chunk=16):
    """Laws (n, T, V) of the token after each position of each window's first T ids."""
    out = []
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for start in range(0, len(windows), chunk):
            inputs = windows[start : start + chunk, :-1]
            model.reset(len(inputs), inputs.shape[1])
            out.append(softmax_law(model.forward(inputs), temperature))
    return np.concatenate(out)


N_WINDOWS = 40  # held-out windows of 128 characters that chapter 9 measures α and β on
BETA_SHOWN = ("bigram", "draft1-500", "draft1-2000", "draft2-1000")  # chapter 9's histograms


def heldout_betas(pair, names, n_windows=N_WINDOWS):
    """{draft: β (n_windows, 128)}: Σ min(p, q) after each position of the held-out windows."""
    windows = heldout_windows(pair, n_windows)
    p = window_laws(pair.target, windows)
    return {name: np.minimum(p, window_laws(pair.drafts[name], windows)).sum(-1) for name in names}


def autocorrelation(series, max_lag):
    """Correlation of x_t and x_{t+k} within rows of series (n, T), pooled, k = 1..max_lag."""
    x = series - series.mean()
    return np.array(
        [(x[:, :-k] * x[:, k:]).mean() / x.var() for k in range(1, max_lag + 1)], dtype=float
    )


# ---- Plots ---------------------------------------------------------------------------------------

# One look per model in every figure of chapter 9: a draft keeps its colour and its marker.
MODEL_STYLES = {
    "unigram": ("#F0E442", "P"),
    "bigram": (OKABE_ITO[0], "o"),
    "draft1-500": (OKABE_ITO[5], "^"),
    "draft1-1000": (OKABE_ITO[4], "v"),
    "draft1-2000": (OKABE_ITO[2], "s"),
    "draft2-1000": (OKABE_ITO[1], "D"),
    "small target": ("#000000", "X"),
    "large target": (OKABE_ITO[3], "*"),
    "ch. 8 target": ("#777777", "h"),
}


def model_style(name):
    """{color, marker} of a model of chapter 9 ("target" is the small target)."""
    name = "small target" if name == "target" else name
    if name not in MODEL_STYLES:
        raise ValueError(f"name must be one of {sorted(MODEL_STYLES)}, got {name!r}")
    colour, marker = MODEL_STYLES[name]
    return {"color": colour, "marker": marker}


def plot_beta_histograms(betas):
    """Histograms of β = Σ min(p, q) over held-out contexts, one panel per draft {name: (n,)},
    each in its draft's colour, its marker on the mean."""
    fig, axes = new_figure(nrows=len(betas), figsize=(5.0, 2.0 * len(betas) + 0.6), sharex=True)
    fig.set_layout_engine("constrained")  # room for each panel's title
    bins = np.linspace(0, 1, 41)
    for ax, (name, beta) in zip(np.atleast_1d(axes), betas.items()):
        style = model_style(name)
        weights = np.full(len(beta), 100 / len(beta))
        heights, _, _ = ax.hist(beta, bins=bins, color=style["color"], weights=weights)
        ax.axvline(beta.mean(), color="black", linestyle="--", linewidth=1.2)
        ax.plot(beta.mean(), heights.max() * 1.08, markersize=10, markeredgecolor="black", **style)
        ax.set(title=f"{name}: α = {beta.mean():.2f}", xlabel="β", ylabel="% of contexts")
        ax.set_ylim(top=heights.max() * 1.2)  # room for the marker
    ax.set_xlabel("β at a held-out context (dashed: its mean, α)")
    return fig


PASSAGE_STYLE = {  # colour, and a cue that is not colour: an underline or a bold tint
    ACCEPTED: ("kept draft", "#0072B2", "text-decoration:underline solid"),
    RESIDUAL: ("drawn from the residual", "#D55E00", "text-decoration:underline wavy"),
    BONUS: ("bonus, drawn from p", "#009E73", "font-weight:bold;background:#e3f2ec"),
    PLAIN: ("drawn from p", "#000000", ""),
}


def passage_html(text, kinds):
    """HTML of a generated passage, each character styled by where it came from, and a key."""

    def span(ch, kind):
        label, colour, cue = PASSAGE_STYLE[int(kind)]
        ch = html.escape(ch).replace("\n", "⏎\n")
        style = f"color:{colour};{cue}"
        return f'<span style="{style}" title="{label}">{ch}</span>'

    body = "".join(span(ch, kind) for ch, kind in zip(text, kinds))
    chip = "font-family:monospace;border:1px solid #bbb;border-radius:3px;padding:0 0.3em"
    key = " · ".join(  # a sample of each style in a box, then its name in plain text: no link
        f'<span style="{chip}">{span("abc", kind)}</span> {label}'
        for kind, (label, _, _) in PASSAGE_STYLE.items()
        if kind in set(kinds.tolist())
    )
    box = "font-family:monospace;white-space:pre-wrap;line-height:1.9;overflow-wrap:anywhere"
    return f'<div style="{box}">{body}</div><p>{key}</p>'
