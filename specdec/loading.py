"""Chapter 9: the trained pair's files, each read only after every check it can fail.

A manifest (manifest.json) lists the corpus, the models and their reference logits, each with
its sha256, and records the hash of the rest of itself. An .npz is read member by member: only
the expected arrays, each .npy header checked (dtype, shape, declared size) before any data is
inflated, every array finite. Each model's numpy logits must match the stored JAX ones. What is
malformed raises a ValueError that names the file and the fault; what passes, `pair.load_pair`
builds the pair with.
"""

import hashlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from .transformer import Config, Layer, TinyTransformer, one_blas_thread

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
# What reading a zip member may raise: a bad header or stream, an encrypted member (RuntimeError),
# a compression method this Python lacks (NotImplementedError).
ZIP_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError, NotImplementedError)
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
    except (*ZIP_ERRORS, SyntaxError) as error:
        raise ValueError(f"{where} does not start with a valid .npy header: {error}") from None
    if dtype.hasobject:
        raise ValueError(f"{where} has dtype {dtype}, which needs pickle: refused")
    if dtype.fields is not None or dtype.kind not in "biufc":
        raise ValueError(f"{where} has dtype {dtype}, not an array of numbers: refused")
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
    except ZIP_ERRORS as error:
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


def _check_reference(folder, holder, path, models, where="the manifest"):
    """Raise unless each model's numpy logits on the stored inputs lie within
    REFERENCE_TOLERANCE of the stored JAX logits: weights and config are those trained. holder
    is the entry whose "reference_logits" names the file (the manifest, or a model's entry)."""
    entry = _field(holder, "reference_logits", dict, path, where)
    label = "reference_logits" if where == "the manifest" else f"{where}['reference_logits']"
    file = _checked_file(folder, entry, path, label)
    target = next(iter(models.values())).config  # every model of a pair has the same sizes
    expected = {"ids": ((None, None), np.int64)}
    expected |= {name: ((None, None, target.n_outputs), np.float32) for name in models}
    arrays = _read_npz(file, expected)
    with one_blas_thread():  # tiny products: 1 thread
        _compare_logits(file, arrays, models)


def _compare_logits(file, arrays, models):
    """_check_reference's comparison, given the stored arrays."""
    target = next(iter(models.values())).config  # every model of a pair has the same sizes
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
