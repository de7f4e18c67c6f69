"""Chapter 9: a character-level pair trained on Tiny Shakespeare, run through the book's checks.

The target (4 layers, d = 128) and the transformer drafts were trained once with JAX by
scripts/train_pair.py (`make train`); their float32 weights ship in specdec/weights with a
manifest of hashes, configs and held-out losses. Here they run in numpy through chapter 8's
transformer, so the book never imports JAX. Two more drafts come from the training split's
character counts: a unigram and an add-one bigram.

Token ids are a character's index in the sorted vocabulary; there is no start token, so a prompt
holds at least one character. The models know 128 positions and no window slides: a run whose
prompt, tokens and draft positions need more is refused, so every law here is the trained one.
"""

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .checks import _check_count, _check_rng
from .transformer import Config, Layer, TinyTransformer, softmax_law
from .verify import _sample_rows, verify

PACKAGE = Path(__file__).resolve().parent
WEIGHTS = PACKAGE / "weights"  # manifest.json and one .npz per trained model
ACCEPTED, RESIDUAL, BONUS, PLAIN = 0, 1, 2, 3  # where an emitted token came from (Run.kinds)
MAX_DRAFTS = 32  # draft positions per step; the 128-position context binds first anyway


# ---- Loading: every file checked against the manifest ----------------------------------------


def _sha256(path):
    """The file's SHA-256, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked_file(folder, entry):
    """folder / entry["file"] once it exists and its hash is the manifest's, else a ValueError."""
    path = folder / entry["file"]
    if not path.is_file():
        raise ValueError(f"{path} is missing: the manifest lists it")
    if _sha256(path) != entry["sha256"]:
        raise ValueError(f"{path} is corrupt: its sha256 is not the manifest's")
    return path


def _expected_shapes(cfg):
    """{array name: shape} of a trained model's .npz (V tokens, d, L layers, max_len)."""
    d, vocab, ff = cfg.d_model, cfg.n_outputs, cfg.ff_mult * cfg.d_model
    shapes = {"embed": (vocab, d), "position": (cfg.max_len, d), "unembed": (d, vocab)}
    shapes |= {"final_norm_gain": (d,), "final_norm_bias": (d,)}
    for i in range(cfg.n_layers):
        shapes |= {f"layer{i}_{n}_{g}": (d,) for n in ("ln1", "ln2") for g in ("gain", "bias")}
        shapes |= {f"layer{i}_w_qkv": (d, 3 * d), f"layer{i}_w_o": (d, d)}
        shapes |= {f"layer{i}_w_up": (d, ff), f"layer{i}_w_down": (ff, d)}
    return shapes


def _weights(path, cfg):
    """(embed, position, layers, final_norm, unembed) from the .npz at path, shapes checked."""
    with np.load(path) as npz:
        arrays = {name: npz[name] for name in npz.files}
    for name, shape in _expected_shapes(cfg).items():
        got = arrays[name].shape if name in arrays else "missing"
        if got != shape:
            raise ValueError(f"{path}: array {name} should have shape {shape}, got {got}")

    def norm(prefix):
        return arrays[f"{prefix}_gain"], arrays[f"{prefix}_bias"]

    def layer(i):
        w = {n: arrays[f"layer{i}_{n}"] for n in ("w_qkv", "w_o", "w_up", "w_down")}
        ln1, ln2 = norm(f"layer{i}_ln1"), norm(f"layer{i}_ln2")
        return Layer(ln1, w["w_qkv"], w["w_o"], ln2, w["w_up"], w["w_down"])

    layers = [layer(i) for i in range(cfg.n_layers)]
    return arrays["embed"], arrays["position"], layers, norm("final_norm"), arrays["unembed"]


def _config(entry):
    """The manifest's config of a trained model as chapter 8's Config (float32, no seed)."""
    c = entry["config"]
    sizes = dict(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"])
    sizes |= dict(ff_mult=c["ff_mult"], max_len=c["max_len"])
    return Config(**sizes, n_inputs=c["vocab_size"], n_outputs=c["vocab_size"])


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
        self.lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), self.lengths.shape)

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


def load_pair(folder=WEIGHTS):
    """The shipped pair, numpy only: every file checked against folder/manifest.json."""
    folder = Path(folder)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{manifest_path} is missing")
    manifest = json.loads(manifest_path.read_text())
    corpus = manifest["corpus"]
    text = _checked_file(PACKAGE, corpus).read_text(encoding="utf-8")
    vocab, split = corpus["vocabulary"], corpus["split_index"]
    unigram, bigram = count_laws(np.array([vocab.index(ch) for ch in text[:split]]), len(vocab))
    models = {}
    for name, entry in manifest["models"].items():
        config = _config(entry)
        models[name] = TinyTransformer(config, 1, _weights(_checked_file(folder, entry), config))
    drafts = {"unigram": CountModel(unigram), "bigram": CountModel(bigram)}
    drafts |= {name: model for name, model in models.items() if name != "target"}
    return Pair(vocab, models["target"], drafts, text[split:], manifest)


# ---- The pair: tokenizer, models, generation ---------------------------------------------------


class Run(NamedTuple):
    """A generation: tokens (B, n), where each came from (B, n) and the target calls made."""

    tokens: np.ndarray  # (B, n_tokens) int64
    kinds: np.ndarray  # (B, n_tokens) int8: ACCEPTED, RESIDUAL, BONUS or PLAIN
    accepted: np.ndarray  # (steps, B) drafts kept at each target call; −1 once a row is done
    calls: int  # target calls (one per step)


class Pair:
    """The shipped target and drafts, the vocabulary and the held-out text."""

    def __init__(self, vocab, target, drafts, heldout_text, manifest):
        self.vocab, self.target, self.drafts = list(vocab), target, drafts
        self.heldout_text, self.manifest = heldout_text, manifest
        self.index = {ch: i for i, ch in enumerate(self.vocab)}
        self.context = target.config.max_len  # positions the models know

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

    def run(self, prompt_ids, n_tokens, gamma, rng, draft=None, temperature=1.0):
        """`generate`, keeping where each token came from and the drafts kept at each call."""
        prompt = self._check_prompt(prompt_ids)
        _check_count(n_tokens, "n_tokens")
        _check_count(gamma, "gamma", MAX_DRAFTS, "draft positions per target call")
        _check_rng(rng)
        softmax_law(np.zeros(1), temperature)  # checks the temperature
        if draft is not None and draft not in self.drafts:
            raise ValueError(f"draft must be None or one of {sorted(self.drafts)}, got {draft!r}")
        gamma = 0 if draft is None else gamma
        width = prompt.shape[1] + n_tokens + 2 * gamma + 1  # positions a row's cache may reach
        if width > self.context:
            raise ValueError(
                f"prompt length + n_tokens + 2·gamma + 1 = {width} exceeds the {self.context} "
                "positions the models know (no window slides, so the law stays the trained one)"
            )
        models = (self.target,) if draft is None else (self.target, self.drafts[draft])
        for model in models:
            model.reset(len(prompt), width)
            if prompt.shape[1] > 1:
                model.prefill(prompt[:, :-1])
        if draft is None:
            return _plain(self.target, prompt, n_tokens, rng, temperature)
        return _speculative(*models, prompt, n_tokens, gamma, rng, temperature)

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


def _plain(target, prompt, n_tokens, rng, temperature):
    """Plain sampling: one target call per token, each drawn from p^(1/T) renormalised."""
    batch = len(prompt)
    tokens, last = np.zeros((batch, n_tokens), dtype=np.int64), prompt[:, -1:]
    for i in range(n_tokens):
        tokens[:, i] = _sample_rows(softmax_law(target.forward(last)[:, 0], temperature), rng)
        last = tokens[:, i : i + 1]
    accepted = np.zeros((n_tokens, batch), dtype=np.int64)
    return Run(tokens, np.full((batch, n_tokens), PLAIN, np.int8), accepted, n_tokens)


def _speculative(target, draft, prompt, n_tokens, gamma, rng, temperature):
    """Speculative decoding with `verify`: γ draft calls, then one target call, per step."""
    (batch, start), end = prompt.shape, prompt.shape[1] + n_tokens
    rows, vocab = np.arange(batch)[:, None], target.config.n_outputs
    seq = np.zeros((batch, end + gamma + 1), dtype=np.int64)  # prompt, then emitted tokens
    seq[:, :start] = prompt
    kinds = np.full(seq.shape, PLAIN, dtype=np.int8)
    filled = np.full(batch, start)  # tokens in seq; the target's cache holds seq[:, :filled - 1]
    log = []
    while filled.min() < end:
        drafts, q = _draft(draft, seq, filled, gamma, rng, temperature, vocab)
        ids = np.concatenate([seq[rows, filled[:, None] - 1], drafts], axis=1)  # (B, γ + 1)
        p = softmax_law(target.forward(ids), temperature)  # (B, γ + 1, V): one call
        accepted, emitted = verify(p, q, drafts, rng)
        accepted = np.where(filled < end, accepted, -1)  # finished rows emit nothing
        target.rollback(filled + accepted)  # keep the last token and the kept drafts
        draft.rollback(filled + np.minimum(accepted, gamma - 1))  # the drafts it was fed
        slots = filled[:, None] + np.arange(gamma + 1)  # (B, γ + 1)
        slot, a = np.arange(gamma + 1), accepted[:, None]
        kept = slot <= a  # (B, γ + 1): the kept drafts, then one token from p or the residual
        kind = np.where(slot < a, ACCEPTED, np.where(a == gamma, BONUS, RESIDUAL))
        seq[rows, slots] = np.where(kept, emitted, seq[rows, slots])
        kinds[rows, slots] = np.where(kept, kind, kinds[rows, slots])
        filled += accepted + 1
        log.append(accepted)
    return Run(seq[:, start:end], kinds[:, start:end], np.array(log), len(log))


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
        laws[:, i] = softmax_law(logits, temperature)
        tokens[:, i] = _sample_rows(laws[:, i], rng)
    return tokens, laws
