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
import html
import json
import math
import threading
import time
import zipfile
from contextlib import contextmanager
from numbers import Real
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import stats
from threadpoolctl import threadpool_limits

from .checks import _check_count, _check_positive_count, _check_rng
from .rule import BROKEN_RULES, EXACT_RULE
from .style import MARKERS, OKABE_ITO, _series, new_figure
from .theory import expected_tokens
from .transformer import (
    BLAS_THREADS,
    Config,
    Layer,
    TinyTransformer,
    _call_costs,
    one_blas_thread,
    softmax_law,
)
from .verify import _sample_rows, _verify, verify

PACKAGE = Path(__file__).resolve().parent
WEIGHTS = PACKAGE / "weights"  # manifest.json and one .npz per trained model
ACCEPTED, RESIDUAL, BONUS, PLAIN = 0, 1, 2, 3  # where an emitted token came from (Run.kinds)
MAX_DRAFTS = 32  # draft positions per step; the 128-position context binds first anyway


# ---- Loading: every file checked against the manifest ----------------------------------------
# A manifest or a weight file that is not what train_pair.py writes is refused with a ValueError
# that names the file and what is wrong; no check trusts a field that an earlier one did not pass.

MAX_MODELS = 16  # models a manifest may list (the shipped one lists 5): load time stays bounded
MAX_FILE_BYTES = 2**30  # bytes of one file the manifest lists: read and hashed in full at load
MAX_ARRAY_BYTES = 2**28  # bytes one stored array may declare in its header: 256 MiB
STORAGE = {"float32": np.float32, "float16": np.float16}  # a model's "storage" (default float32)
REFERENCE_TOLERANCE = 1e-4  # largest |numpy − JAX| logit at load; the shipped ones are ≤ 1.1e-5
MANIFEST_HASH = "manifest_sha256"  # the field that holds the hash of the rest of the manifest
CONFIG_KEYS = ("n_layers", "d_model", "n_heads", "ff_mult", "max_len", "vocab_size")
CONFIG_LIMITS = dict(n_layers=256, d_model=2**16, n_heads=2**10, ff_mult=64, max_len=2**16)
CONFIG_LIMITS["vocab_size"] = 2**20  # a config past these is refused before any array is read
HEX = set("0123456789abcdef")
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0}  # .npy versions a member may have
NPY_HEADERS[2, 0] = np.lib.format.read_array_header_2_0


def manifest_digest(manifest):
    """SHA-256 (hex) of the manifest without MANIFEST_HASH, as canonical JSON: keys sorted, no
    spaces, UTF-8. scripts/train_pair.py writes it; load_pair checks it."""
    rest = {key: value for key, value in manifest.items() if key != MANIFEST_HASH}
    text = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _field(mapping, key, kind, path, where):
    """mapping[key] if it is a `kind` (never a bool), else a ValueError naming path and where."""
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: {where} must be a JSON object, got {type(mapping).__name__}")
    if key not in mapping:
        raise ValueError(f"{path}: {where} has no {key!r}")
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{path}: {where}[{key!r}] must be a {names}, got {value!r:.80}")
    return value


def _read_manifest(folder):
    """folder/manifest.json as a dict whose hash is the one it records, else a ValueError."""
    path = folder / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    if path.stat().st_size > 2**20:
        raise ValueError(f"{path} is larger than 1 MiB: not a manifest train_pair.py writes")
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(manifest).__name__}")
    recorded = _field(manifest, MANIFEST_HASH, str, path, "the manifest")
    if recorded != manifest_digest(manifest):
        raise ValueError(
            f"{path} was edited: its {MANIFEST_HASH} is not the hash of the rest of it "
            "(a config or file hash changed without the manifest being rewritten)"
        )
    return manifest, path


def _relative_file(entry, path, where):
    """entry["file"]: a relative path inside the folder (no '..', not absolute), else an error."""
    name = _field(entry, "file", str, path, where)
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise ValueError(f"{path}: {where}['file'] must be a relative path, got {name!r}")
    return name


def _checked_file(folder, entry, path, where):
    """folder / entry["file"] once it exists, fits MAX_FILE_BYTES and has the manifest's hash."""
    file = folder / _relative_file(entry, path, where)
    digest = _field(entry, "sha256", str, path, where)
    if len(digest) != 64 or not set(digest) <= HEX:
        raise ValueError(f"{path}: {where}['sha256'] must be 64 lowercase hex digits")
    if not file.is_file():
        raise ValueError(f"{file} is missing: the manifest lists it")
    if file.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{file} is larger than {MAX_FILE_BYTES:,} bytes (MAX_FILE_BYTES)")
    with file.open("rb") as f:
        if hashlib.file_digest(f, "sha256").hexdigest() != digest:
            raise ValueError(f"{file} is corrupt: its sha256 is not the manifest's")
    return file


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


def _member_header(zf, info, path, name):
    """(shape, fortran order, dtype, bytes before the data) from member info's .npy header,
    read without inflating the data; a ValueError names the file and the member."""
    where = f"{path}: array {name}"
    try:
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in NPY_HEADERS:
                raise ValueError(f".npy format version {version} (1.0 and 2.0 are read)")
            shape, fortran, dtype = NPY_HEADERS[version](f, max_header_size=10_000)
            offset = f.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, SyntaxError) as error:
        raise ValueError(f"{where} does not start with a valid .npy header: {error}") from None
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        raise ValueError(f"{where} has dtype {dtype}, which needs pickle: refused")
    n_bytes = math.prod(shape) * dtype.itemsize
    if n_bytes > MAX_ARRAY_BYTES:
        raise ValueError(f"{where} declares {n_bytes:,} bytes, past MAX_ARRAY_BYTES")
    if info.file_size != offset + n_bytes:
        raise ValueError(
            f"{where}: its header declares {n_bytes:,} bytes of data, the zip entry holds "
            f"{info.file_size - offset:,}"
        )
    return shape, fortran, dtype, n_bytes


def _read_npz(path, expected):
    """{name: array} of the npz at path, whose members must be exactly name.npy for each name of
    expected = {name: (shape, dtype)} (a None in a shape matches any length). Every member's
    header is checked (dtype, shape, declared size) before any data is inflated; an unexpected
    member is refused by name, unread."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a valid npz (zip) file: {error}") from None
    with zf:
        infos = zf.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise ValueError(f"{path} holds a member twice: {sorted(names)[:8]}")
        wanted = {f"{name}.npy" for name in expected}
        extra, missing = sorted(set(names) - wanted), sorted(wanted - set(names))
        if extra:
            raise ValueError(f"{path} holds unexpected members (not read): {extra[:8]}")
        if missing:
            raise ValueError(f"{path} lacks the arrays {[m[:-4] for m in missing][:8]}")
        by_name = {info.filename[:-4]: info for info in infos}
        headers = {}
        for name, (shape, dtype) in expected.items():
            headers[name] = header = _member_header(zf, by_name[name], path, name)
            got, _, got_dtype, _ = header
            fits = len(got) == len(shape) and all(s in (None, g) for s, g in zip(shape, got))
            if not fits:
                raise ValueError(f"{path}: array {name} should have shape {shape}, got {got}")
            if got_dtype.newbyteorder("=") != np.dtype(dtype):
                raise ValueError(
                    f"{path}: array {name} has dtype {got_dtype}, not {np.dtype(dtype)}"
                )
        return {name: _member_data(zf, by_name[name], path, headers[name]) for name in expected}


def _member_data(zf, info, path, header):
    """The array of member info, from the data after the header _member_header checked."""
    shape, fortran, dtype, n_bytes = header
    try:
        with zf.open(info) as f:
            f.seek(info.file_size - n_bytes)
            data = f.read(n_bytes)
    except (OSError, EOFError, zipfile.BadZipFile, ValueError) as error:
        raise ValueError(f"{path}: member {info.filename} cannot be read: {error}") from None
    if len(data) != n_bytes:
        raise ValueError(f"{path}: member {info.filename} is truncated")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(array, dtype=dtype.newbyteorder("="))


def _weights(path, cfg, storage="float32"):
    """(embed, position, layers, final_norm, unembed) as float32 from the .npz at path: only the
    expected arrays, each stored as `storage` (float32, or float16 upcast here) and finite."""
    shapes = _expected_shapes(cfg)
    arrays = _read_npz(path, {name: (shape, STORAGE[storage]) for name, shape in shapes.items()})
    for name, array in arrays.items():
        arrays[name] = array = array.astype(np.float32, copy=False)
        if not np.isfinite(array).all():
            raise ValueError(f"{path}: array {name} holds NaN or inf")

    def norm(prefix):
        return arrays[f"{prefix}_gain"], arrays[f"{prefix}_bias"]

    def layer(i):
        w = {n: arrays[f"layer{i}_{n}"] for n in ("w_qkv", "w_o", "w_up", "w_down")}
        ln1, ln2 = norm(f"layer{i}_ln1"), norm(f"layer{i}_ln2")
        return Layer(ln1, w["w_qkv"], w["w_o"], ln2, w["w_up"], w["w_down"])

    layers = [layer(i) for i in range(cfg.n_layers)]
    return arrays["embed"], arrays["position"], layers, norm("final_norm"), arrays["unembed"]


def _config(entry, vocab, path, name):
    """The manifest's config of model `name` as chapter 8's Config (float32, no seed), checked:
    positive ints, d_model divisible by n_heads, vocab_size the vocabulary's length."""
    where = f"models[{name!r}]"
    c = _field(entry, "config", dict, path, where)
    unknown = sorted(set(c) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{path}: {where}['config'] has unknown keys {unknown}")
    sizes = {key: _field(c, key, int, path, f"{where}['config']") for key in CONFIG_KEYS}
    for key, limit in CONFIG_LIMITS.items():
        if not 1 <= sizes[key] <= limit:
            raise ValueError(f"{path}: {where}['config']['{key}'] must lie in [1, {limit:,}]")
    if sizes["vocab_size"] != len(vocab):
        raise ValueError(
            f"{path}: {where}['config']['vocab_size'] is {sizes['vocab_size']}, but the "
            f"vocabulary holds {len(vocab)} characters"
        )
    vocab_size = sizes.pop("vocab_size")
    try:
        return Config(**sizes, n_inputs=vocab_size, n_outputs=vocab_size)
    except ValueError as error:
        raise ValueError(f"{path}: {where}['config']: {error}") from None


def _storage(entry, path, name):
    """A model's storage dtype: the manifest's "storage" field, float32 when it has none."""
    storage = entry.get("storage", "float32")
    if storage not in STORAGE:
        raise ValueError(f"{path}: models[{name!r}]['storage'] must be one of {list(STORAGE)}")
    return storage


def _corpus(folder, manifest, path):
    """(vocabulary, ids of the corpus, split index, text) from the manifest's corpus entry:
    the file beside folder, its hash, a sorted vocabulary of distinct characters that holds
    every character of the text, and a split that leaves text on both sides."""
    corpus = _field(manifest, "corpus", dict, path, "the manifest")
    vocab = _field(corpus, "vocabulary", str, path, "corpus")
    split = _field(corpus, "split_index", int, path, "corpus")
    if not vocab or list(vocab) != sorted(set(vocab)):
        raise ValueError(
            f"{path}: corpus['vocabulary'] must be distinct characters in sorted order "
            "(a character's id is its index)"
        )
    file = _checked_file(folder.parent, corpus, path, "corpus")
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{file} is not UTF-8 text: {error}") from None
    table = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)  # code points, sorted
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ids = np.minimum(np.searchsorted(table, codes), len(table) - 1)
    if not np.array_equal(table[ids], codes):
        raise ValueError(f"{file} holds characters outside corpus['vocabulary']")
    if not 2 <= split < len(text):
        raise ValueError(f"{path}: corpus['split_index'] must lie in [2, {len(text)})")
    return vocab, ids.astype(np.int64), split, text


def _models(folder, manifest, path, vocab):
    """{name: TinyTransformer} of the manifest's models, each file and config checked."""
    entries = _field(manifest, "models", dict, path, "the manifest")
    if not 1 <= len(entries) <= MAX_MODELS:
        raise ValueError(f"{path}: the manifest must list 1 to {MAX_MODELS} models (MAX_MODELS)")
    if "target" not in entries:
        raise ValueError(f"{path}: the manifest lists no model named 'target'")
    models = {}
    for name, entry in entries.items():
        if name in ("unigram", "bigram"):
            raise ValueError(f"{path}: models[{name!r}]: the name is the count draft's")
        config = _config(entry, vocab, path, name)
        file = _checked_file(folder, entry, path, f"models[{name!r}]")
        weights = _weights(file, config, _storage(entry, path, name))
        models[name] = TinyTransformer(config, 1, weights)
    context = models["target"].config.max_len
    for name, model in models.items():
        if model.config.max_len != context:
            raise ValueError(
                f"{path}: models[{name!r}] knows {model.config.max_len} positions, the target "
                f"{context}: every model of a pair must know the same"
            )
    return models


def _check_reference(folder, manifest, path, models):
    """Raise unless each model's numpy logits on the stored inputs lie within
    REFERENCE_TOLERANCE of the stored JAX logits: weights and config are those trained."""
    entry = _field(manifest, "reference_logits", dict, path, "the manifest")
    file = _checked_file(folder, entry, path, "reference_logits")
    target = models["target"].config
    expected = {"ids": ((None, None), np.int64)}
    expected |= {name: ((None, None, target.n_outputs), np.float32) for name in models}
    arrays = _read_npz(file, expected)
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):  # tiny products: 1 thread
        _compare_logits(file, arrays, models)


def _compare_logits(file, arrays, models):
    """_check_reference's comparison, given the stored arrays (models' target sets the sizes)."""
    target = models.get("target", next(iter(models.values()))).config
    ids = arrays["ids"]
    if not (1 <= ids.shape[0] <= 64 and 1 <= ids.shape[1] <= target.max_len):
        raise ValueError(f"{file}: array ids must be (1..64, 1..{target.max_len}), got {ids.shape}")
    if ids.min() < 0 or ids.max() >= target.n_inputs:
        raise ValueError(f"{file}: array ids must lie in [0, {target.n_inputs})")
    for name, model in models.items():
        logits = arrays[name]
        if logits.shape[:2] != ids.shape or not np.isfinite(logits).all():
            raise ValueError(f"{file}: array {name} must be finite, of shape {ids.shape} + (V,)")
        model.reset(*ids.shape)
        gap = float(np.abs(model.forward(ids) - logits).max())
        if not gap <= REFERENCE_TOLERANCE:
            raise ValueError(
                f"{file}: model {name}'s numpy logits differ from the stored JAX logits by "
                f"{gap:.3g}, past {REFERENCE_TOLERANCE:g}: its weights or its config are not "
                "the ones trained"
            )


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
    reference = _field(entry, "reference_logits", dict, path, LARGE)
    file = _checked_file(folder, reference, path, f"{LARGE}['reference_logits']")
    expected = {"ids": ((None, None), np.int64)}
    expected["target-large"] = ((None, None, config.n_outputs), np.float32)
    with one_blas_thread():
        _compare_logits(file, _read_npz(file, expected), {"target-large": model})
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
        """The verifier a run calls: the book's `verify`."""
        return verify(target_probs, draft_probs, draft_tokens, rng)

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
        tokens[:, i] = _sample(softmax_law(target.forward(last)[:, 0], temperature), rng)
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
        p = softmax_law(target.forward(ids), temperature)  # (b, γ + 1, V): one call
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
        laws[:, i] = softmax_law(logits, temperature)
        tokens[:, i] = _sample(laws[:, i], rng)
    return tokens, laws


def _sample(laws, rng):
    """One draw from each row of laws (B, V), refusing a row that is not finite with mass: an
    all-NaN row would otherwise give token 0."""
    if not np.isfinite(laws).all() or not (laws.sum(axis=1) > 0).all():
        raise ValueError("a model's law holds NaN or inf, or has no mass: nothing to sample")
    return _sample_rows(laws, rng)


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
    counts, law = np.asarray(counts, dtype=float), np.asarray(law, dtype=float)
    expected = counts.sum() * law
    big = expected >= MIN_EXPECTED
    observed = np.append(counts[big], counts[(law > 0) & ~big].sum())
    expected = np.append(expected[big], expected[(law > 0) & ~big].sum())
    keep = expected > 0
    stat = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return float(stats.chi2.sf(stat, df)), df


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
    """Tokens per target call of a speculative Run, measured and predicted, each as (mean, s.e.)
    over rows: Eq. 1 at the run's α; Σ_i Π_{j≤i} β_j of each step; Σ_i Π_{j≤i} min(1, p/q) of
    each step's drafts, its expected tokens given them. The run must be made with record=True."""
    if run.betas is None:
        raise ValueError("run must come from pair.run(..., record=True) with a draft")
    active = run.accepted >= 0  # (steps, B)
    steps = active.sum(axis=0)  # (B,)

    def per_row(values):  # (steps, B) -> (mean, s.e.) over rows of each row's mean per call
        rows = np.where(active, values, 0).sum(axis=0) / steps
        return float(rows.mean()), float(rows.std(ddof=1) / np.sqrt(len(rows)))

    def chain(x):  # (steps, B, γ) -> 1 + Σ_i Π_{j≤i} x_j
        return 1 + np.cumprod(x, axis=-1).sum(axis=-1)

    alpha = float(run.betas[active].mean())
    return {
        "measured": per_row(run.accepted + 1),
        "beta products": per_row(chain(run.betas)),
        "given the drafts": per_row(chain(run.ratios)),
        "alpha": alpha,
        "Eq. 1": expected_tokens(alpha, run.betas.shape[-1]),
    }


# ---- Exactness through the real models: generation_test and its negative controls -------------
# Under exactness every emitted token is a draw from the target's law given its prefix, so the
# randomized probability integral transform of every token is i.i.d. uniform (Rosenblatt, 1952),
# whatever the prompt, the position or the path (kept draft, residual or bonus) it came from.

GENERATION_LEVEL = 1e-3  # generation_test's level: a correct pipeline fails it this often, by seed
MAX_TEST_PROMPTS = 2048  # prompts of one generation_test: its KV caches stay under 1 GiB
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
    why = "the batch's KV caches stay under 1 GiB"
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
        with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
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

    def __init__(self, pair, bug):
        if not isinstance(pair, Pair):
            raise TypeError(f"pair must be a Pair, got {type(pair).__name__}")
        if bug not in BUGS:
            raise ValueError(f"bug must be one of {sorted(BUGS)}, got {bug!r}")
        self.__dict__.update(pair.__dict__)
        self.bug = bug

    def _models(self, draft):
        """The pair's models, the target or the draft wrapped by the bug."""
        models = super()._models(draft)
        if self.bug == "stale target position":
            return (_StaleRollback(models[0]), *models[1:])
        if self.bug == "draft cache not rolled back" and draft is not None:
            return (models[0], _NoRollback(models[1]))
        return models

    def _verify(self, target_probs, draft_probs, draft_tokens, rng):
        """The book's `verify`, or the bug's verifier."""
        rule = {"residual from p": "resample from p", "one uniform": "one uniform"}.get(self.bug)
        if rule:  # chapter 3's broken rules
            return _verify(target_probs, draft_probs, draft_tokens, rng, BROKEN_RULES[rule])
        if self.bug == "q row off by one":
            draft_probs = np.concatenate([draft_probs[:, 1:], draft_probs[:, -1:]], axis=1)
        return verify(target_probs, draft_probs, draft_tokens, rng)


class _StaleRollback:
    """A transformer whose rollback keeps one stale position: after forgetting positions, the
    last position kept holds the keys and values of the first one forgotten."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def rollback(self, lengths):
        """The model's rollback, then the stale copy into the last position kept."""
        model = self.model
        before = model.lengths.copy()
        model.rollback(lengths)
        rows = np.flatnonzero((model.lengths < before) & (model.lengths >= 1))
        kept = model.lengths[rows]
        for cache in (model.keys, model.values):  # (L, B, length, d)
            cache[:, rows, kept - 1] = cache[:, rows, kept]


class _NoRollback:
    """A draft whose cache is never rolled back: the loop sees the lengths it asks for, while the
    model goes on from every token it was fed. When the model's cache is full, it starts again
    from the last half of what it was fed (a count draft has no cache: no change)."""

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


# ---- The race: plain against speculative decoding through the trained models -----------------


class _Stopwatch:
    """A model whose forward calls add their CPU seconds to .seconds; the rest passes through."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, ids):
        """The model's forward call, timed."""
        start = time.thread_time()
        out = self.model.forward(ids)
        self.seconds += time.thread_time() - start
        return out


class RaceRow(NamedTuple):
    """One timed run (seconds of this thread's CPU): total, inside model calls, and counts."""

    draft: str  # "plain" for plain decoding
    gamma: int
    repeat: int
    seconds: float
    model_seconds: float
    calls: int  # target calls
    tokens: int  # tokens emitted, overshoot of the last step included


def _timed_run(pair, prompt, n_tokens, gamma, draft, seed):
    """A RaceRow's fields after the names: one run with its model calls timed."""
    target = _Stopwatch(pair.target)
    models = (target,) if draft is None else (target, _Stopwatch(pair.drafts[draft]))
    rng = np.random.default_rng(seed)
    start = time.thread_time()
    for model in models:
        _prime(model, prompt[None], len(prompt) + n_tokens + gamma)
    if draft is None:
        run = _plain(target, prompt[None], n_tokens, rng, 1.0)
    else:
        run = _speculative(*models, prompt[None], n_tokens, gamma, rng, 1.0)
    seconds = time.thread_time() - start
    emitted = int((run.accepted[run.accepted >= 0] + 1).sum()) if draft else n_tokens
    return seconds, sum(m.seconds for m in models), run.calls, emitted


def race(pair, settings, prompt, n_tokens, repeats, seed=9):
    """RaceRows for plain decoding and each (draft, γ) of settings, repeats interleaved."""
    rows = []
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for r in range(repeats):
            for draft, gamma in [(None, 0), *settings]:
                timed = _timed_run(pair, prompt, n_tokens, gamma, draft, seed + r)
                rows.append(RaceRow(draft or "plain", gamma, r, *timed))
    return rows


def call_costs(pair, drafts, max_positions, context, repeats):
    """Median seconds (T(1), …, T(max_positions)) of a target call and of one call of each
    draft, after `context` cached positions, from `repeats` interleaved measurements."""
    times = {name: [] for name in drafts}
    target = []
    with threadpool_limits(limits=BLAS_THREADS, user_api="blas"):
        for _ in range(repeats):
            for name in drafts:
                *t, d = _call_costs(
                    pair.target, pair.drafts[name], range(1, max_positions + 1), context
                )
                target.append(t)
                times[name].append(d)
    medians = {name: float(np.median(t)) for name, t in times.items()}
    return np.median(np.array(target), axis=0), medians


# ---- Figures and the marked passage -----------------------------------------------------------


def plot_beta_histograms(betas):
    """Histograms of β = Σ min(p, q) over held-out contexts, one panel per draft {name: (n,)}."""
    fig, axes = new_figure(nrows=len(betas), figsize=(5.0, 2.0 * len(betas) + 0.6), sharex=True)
    fig.set_layout_engine("constrained")  # room for each panel's title
    bins = np.linspace(0, 1, 41)
    for i, (ax, (name, beta)) in enumerate(zip(np.atleast_1d(axes), betas.items())):
        ax.hist(
            beta, bins=bins, color=OKABE_ITO[i % 7], weights=np.full(len(beta), 100 / len(beta))
        )
        ax.axvline(beta.mean(), color="black", linestyle="--", linewidth=1.2)
        ax.set(title=f"{name}: α = {beta.mean():.2f}", xlabel="β", ylabel="% of contexts")
    ax.set_xlabel("β at a held-out context (dashed: its mean, α)")
    return fig


def plot_draft_choice(points, best):
    """Each draft at (α, c), with Corollary 3.9's boundary α = c; the best γ measured in its label.

    points: {name: (α, c)}; best: {name: (γ, speedup)}."""
    fig, ax = new_figure(figsize=(5.4, 6.0))
    top = max(max(c for _, c in points.values()) * 1.3, 0.1)
    grid = np.linspace(0, 1, 50)
    ax.fill_between(grid, grid, top, color="grey", alpha=0.15, label="α < c: no γ pays (Thm 3.8)")
    ax.plot(grid, grid, color="black", linewidth=1)
    for i, (name, (alpha, c)) in enumerate(points.items()):
        gamma, speedup = best[name]
        label = f"{name}: γ = {gamma}, {speedup:.2f}×"  # the γ that raced fastest
        ax.plot(alpha, c, MARKERS[i % 7], color=OKABE_ITO[i % 7], markersize=10, label=label)
    ax.set(xlim=(0, 1), ylim=(0, top), xlabel="α (held-out contexts)")
    ax.set(ylabel="c = draft call / T(1)", title="Which draft: α against c, best γ measured")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    return fig


def plot_pair_race(measured, predicted, theorem):
    """Speedup against γ per draft: measured (markers, with the spread of repeats as bars), the
    measured-cost form with overhead (line), Theorem 3.8 (dotted). Each: {name: {γ: value}}."""
    fig, ax = new_figure(figsize=(5.4, 5.4))
    for i, name in enumerate(measured):
        gammas = sorted(measured[name])
        style = _series(i)
        low, mid, high = (np.array([measured[name][g][k] for g in gammas]) for k in range(3))
        shift = 0.09 * (i - (len(measured) - 1) / 2)  # side by side, so the bars do not hide
        ax.errorbar(
            np.array(gammas) + shift,
            mid,
            yerr=[mid - low, high - mid],
            fmt=style["marker"],
            capsize=3,
            color=style["color"],
            label=f"{name}",
        )
        ax.plot(gammas, [predicted[name][g] for g in gammas], color=style["color"])
        ax.plot(gammas, [theorem[name][g] for g in gammas], color=style["color"], linestyle=":")
    ax.plot([], [], color="black", label="form with o")  # the line styles, in the legend
    ax.plot([], [], color="black", linestyle=":", label="Theorem 3.8")
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set(xlabel="γ (drafts per target call)", ylabel="speedup over plain decoding")
    ax.set_title("The race: measured, the form, Theorem 3.8")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
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
    key = " · ".join(
        span(label, kind)
        for kind, (label, _, _) in PASSAGE_STYLE.items()
        if kind in set(kinds.tolist())
    )
    box = "font-family:monospace;white-space:pre-wrap;line-height:1.9;overflow-wrap:anywhere"
    return f'<div style="{box}">{body}</div><p>{key}</p>'
