"""make train: train chapter 9's character-level pair on Tiny Shakespeare with JAX on CPU.

Trains the target and two draft sizes from specdec/data/tinyshakespeare.txt with fixed seeds,
writes each as a float32 .npz of the arrays specdec/transformer.py's forward pass reads, measures
them on the held-out text: the loss, α against the target, and reference logits for a numpy test.
Run it in .venv-train (requirements-train.txt), never in the book's .venv.

    python scripts/train_pair.py              # the full run into specdec/weights (--out DIR)
    python scripts/train_pair.py --check DIR  # retrain into DIR, compare with specdec/weights
    python scripts/train_pair.py --smoke      # a few steps of a tiny model: the loss falls
"""

import argparse
import hashlib
import json
import math
import sys
import time
import zipfile
from functools import partial
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "specdec" / "data" / "tinyshakespeare.txt"
WEIGHTS = ROOT / "specdec" / "weights"  # the shipped weights, manifest and log
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TRAIN_FRACTION = 0.9  # the first 90 % trains, the last 10 % is held out
BATCH, CONTEXT, WARMUP, FLOOR = 32, 128, 100, 0.1  # FLOOR: the cosine ends at 10 % of PEAK_LR
PEAK_LR, BETAS, ADAM_EPS, WEIGHT_DECAY, CLIP = 3e-3, (0.9, 0.99), 1e-8, 0.1, 1.0
FF_MULT, LN_EPS = 4, 1e-5
LATE = 64  # the late loss: input positions 64..127, context lengths 65..128
REFERENCE_STARTS, REFERENCE_LENGTH = (0, 55_000, 110_000), 32  # held-out offsets, characters
TOLERANCE = 0.01  # --check: largest difference of a loss or an α from the shipped manifest


class Spec(NamedTuple):
    """A model to train: its sizes, steps, seed, and the file saved at each checkpoint step."""

    n_layers: int
    d_model: int
    n_heads: int
    steps: int
    seed: int
    files: tuple  # ((step, file stem under the output directory), ...) to save
    peak_lr: float = PEAK_LR


MODELS = {
    "target": Spec(4, 128, 4, 2000, 0, ((2000, "target"),)),
    "draft1": Spec(
        1, 64, 4, 2000, 1, ((500, "draft1-500"), (1000, "draft1-1000"), (2000, "draft1-2000"))
    ),
    "draft2": Spec(2, 64, 4, 1000, 2, ((1000, "draft2-1000"),)),
}
# Chapter 9's bandwidth-bound target: 4 × 512, 12.7M parameters (50.6 MB in float32), past the
# machine's 32 MiB L3. Measured before choosing its steps: 3.8 s a step on this 2-core machine
# with another build running, so a 1,200-step schedule fits a 90-minute budget on a quiet
# machine (scripts/train_large.py runs all of it; see there). Its peak learning rate
# is lower than the small models' (wider matrices take smaller Adam steps).
LARGE = {
    "target-large": Spec(
        4, 512, 8, 1200, 3, ((600, "target-large-600"), (1200, "target-large")), 2e-3
    )
}
SMOKE = Spec(1, 16, 2, 30, 0, ())


class Corpus(NamedTuple):
    """The corpus as character ids: the sorted characters, the train and held-out ids."""

    chars: str
    train: np.ndarray  # (split,) int32
    held: np.ndarray  # (N − split,) int32


def load_corpus():
    """The shipped corpus, checked against its sha256, as ids split 90 % / 10 %."""
    raw = CORPUS.read_bytes()
    if hashlib.sha256(raw).hexdigest() != CORPUS_SHA256:
        sys.exit(f"{CORPUS} does not have sha256 {CORPUS_SHA256}")
    text = raw.decode("utf-8")
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], np.int32)  # (N,)
    split = int(TRAIN_FRACTION * len(text))
    return Corpus(chars, ids[:split], ids[split:])


# --------------------------------------------------------------------------------------------
# The model: specdec/transformer.py's forward pass, in JAX
# --------------------------------------------------------------------------------------------


def init_params(spec, vocab, key):
    """Seeded weights: normal(0, 1/√fan_in) matrices (residual outputs also / √(2L)), normal(0,
    0.02) embeddings, unit gains and zero biases."""
    d, ff = spec.d_model, FF_MULT * spec.d_model
    shapes = {"embed": (vocab, d), "position": (CONTEXT, d), "unembed": (d, vocab)}
    for i in range(spec.n_layers):
        shapes |= {f"layer{i}_w_qkv": (d, 3 * d), f"layer{i}_w_o": (d, d)}
        shapes |= {f"layer{i}_w_up": (d, ff), f"layer{i}_w_down": (ff, d)}
    params = {}
    for (name, shape), k in zip(shapes.items(), jax.random.split(key, len(shapes))):
        scale = 0.02 if name in ("embed", "position") else 1 / math.sqrt(shape[0])
        if name.endswith(("w_o", "w_down")):
            scale /= math.sqrt(2 * spec.n_layers)
        params[name] = scale * jax.random.normal(k, shape, jnp.float32)
    for prefix in [f"layer{i}_ln{j}" for i in range(spec.n_layers) for j in (1, 2)] + [
        "final_norm"
    ]:
        params[f"{prefix}_gain"] = jnp.ones(d, jnp.float32)
        params[f"{prefix}_bias"] = jnp.zeros(d, jnp.float32)
    return params


def layer_norm(x, gain, bias):
    """(x − mean) / √(var + ε) · gain + bias over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * gain + bias


def gelu(x):
    """GELU, tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    return 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def forward(spec, params, ids):
    """Logits (B, T, V) of the next character after each input id of ids (B, T)."""
    batch, n = ids.shape
    d, heads = spec.d_model, spec.n_heads
    x = params["embed"][ids] + params["position"][:n]  # (B, T, d)
    causal = jnp.tril(jnp.ones((n, n), bool))  # (T, T)

    def split(a):  # (B, T, d) -> (B, H, T, d/H)
        return a.reshape(batch, n, heads, d // heads).transpose(0, 2, 1, 3)

    for i in range(spec.n_layers):
        p = {
            k.removeprefix(f"layer{i}_"): v for k, v in params.items() if k.startswith(f"layer{i}_")
        }
        q, k, v = jnp.split(layer_norm(x, p["ln1_gain"], p["ln1_bias"]) @ p["w_qkv"], 3, axis=-1)
        scores = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(d // heads)  # (B, H, T, T)
        att = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1) @ split(v)
        x = x + att.transpose(0, 2, 1, 3).reshape(batch, n, d) @ p["w_o"]
        x = x + gelu(layer_norm(x, p["ln2_gain"], p["ln2_bias"]) @ p["w_up"]) @ p["w_down"]
    return layer_norm(x, params["final_norm_gain"], params["final_norm_bias"]) @ params["unembed"]


def loss_fn(spec, params, windows):
    """Mean next-character cross-entropy (nats) of windows (B, T + 1)."""
    logp = jax.nn.log_softmax(forward(spec, params, windows[:, :-1]), axis=-1)  # (B, T, V)
    return -jnp.take_along_axis(logp, windows[:, 1:, None], axis=-1).mean()


def learning_rate(step, steps, peak=PEAK_LR):
    """Linear warm-up over WARMUP steps, then cosine decay to FLOOR · peak at `steps`."""
    warm = peak * (step + 1) / WARMUP
    t = jnp.clip((step - WARMUP) / max(steps - WARMUP, 1), 0, 1)
    return jnp.where(
        step < WARMUP, warm, peak * (FLOOR + (1 - FLOOR) * 0.5 * (1 + jnp.cos(jnp.pi * t)))
    )


@partial(jax.jit, static_argnums=(0,))
def train_step(spec, params, opt, windows, step):
    """One AdamW step (gradients clipped to global norm CLIP): (params, opt, loss)."""
    loss, grads = jax.value_and_grad(partial(loss_fn, spec))(params, windows)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
    grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(1, CLIP / (norm + 1e-6)), grads)
    m, v = opt
    m = jax.tree_util.tree_map(lambda m, g: BETAS[0] * m + (1 - BETAS[0]) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: BETAS[1] * v + (1 - BETAS[1]) * g**2, v, grads)
    lr, t = learning_rate(step, spec.steps, spec.peak_lr), step + 1

    def update(name, p):  # weight decay on the matrices only, not on gains and biases
        m_hat, v_hat = m[name] / (1 - BETAS[0] ** t), v[name] / (1 - BETAS[1] ** t)
        decay = WEIGHT_DECAY * p if p.ndim == 2 else 0
        return p - lr * (m_hat / (jnp.sqrt(v_hat) + ADAM_EPS) + decay)

    return {name: update(name, p) for name, p in params.items()}, (m, v), loss


logits_fn = jax.jit(forward, static_argnums=(0,))


def train(spec, corpus, log, save=None, until=None):
    """Train spec from its seed, calling save(stem, step, params, seconds) at each checkpoint,
    for its schedule's steps or the first `until` of them; the training losses."""
    vocab = len(corpus.chars)
    params = init_params(spec, vocab, jax.random.PRNGKey(spec.seed))
    opt = tuple(jax.tree_util.tree_map(jnp.zeros_like, params) for _ in range(2))
    rng = np.random.default_rng(spec.seed)  # batch positions
    losses, start = [], time.perf_counter()
    for step in range(spec.steps if until is None else until):
        starts = rng.integers(0, len(corpus.train) - CONTEXT, BATCH)
        windows = corpus.train[starts[:, None] + np.arange(CONTEXT + 1)]  # (B, T + 1)
        params, opt, loss = train_step(spec, params, opt, windows, step)
        losses.append(float(loss))
        if (step + 1) % 100 == 0 or step + 1 == spec.steps:
            elapsed = time.perf_counter() - start
            log(f"  step {step + 1:5d}  train loss {np.mean(losses[-100:]):.4f}  {elapsed:7.1f} s")
        for stem in [stem for at, stem in spec.files if at == step + 1]:
            save(stem, step + 1, params, time.perf_counter() - start)
    return losses


# --------------------------------------------------------------------------------------------
# Measures on the held-out text: losses, α, reference logits
# --------------------------------------------------------------------------------------------


def held_windows(corpus):
    """Every non-overlapping window (K, CONTEXT + 1) of the held-out text, from its start."""
    k = len(corpus.held) // (CONTEXT + 1)
    return corpus.held[: k * (CONTEXT + 1)].reshape(k, CONTEXT + 1)


def log_probs(spec, params, inputs, chunk=64):
    """Log-softmax (K, T, V) in float64 of the model's logits on inputs (K, T)."""
    out = [logits_fn(spec, params, inputs[i : i + chunk]) for i in range(0, len(inputs), chunk)]
    logits = np.concatenate([np.asarray(o) for o in out]).astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def count_laws(corpus):
    """Log-laws (V,) of the unigram and (V, V) of the add-one bigram from training counts."""
    vocab = len(corpus.chars)
    unigram = np.bincount(corpus.train, minlength=vocab) / len(corpus.train)
    pairs = np.bincount(corpus.train[:-1] * vocab + corpus.train[1:], minlength=vocab**2)
    bigram = pairs.reshape(vocab, vocab) + 1.0
    return np.log(unigram), np.log(bigram / bigram.sum(axis=1, keepdims=True))


def measures(logp, targets, target_logp):
    """{held-out loss over all positions, over positions LATE.., α with the target}."""
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # (K, T)
    alpha = np.minimum(np.exp(logp), np.exp(target_logp)).sum(axis=-1).mean()
    return {
        "heldout_loss": round(float(nll.mean()), 5),
        "heldout_loss_late": round(float(nll[:, LATE:].mean()), 5),
        "alpha": round(float(alpha), 5),
    }


MANIFEST_HASH = "manifest_sha256"  # as in specdec/pair.py, which checks it at load


def manifest_digest(manifest):
    """SHA-256 (hex) of the manifest without MANIFEST_HASH, as canonical JSON: keys sorted, no
    spaces, UTF-8. The same function as specdec/pair.py's (tests/test_pair_robust.py checks)."""
    rest = {key: value for key, value in manifest.items() if key != MANIFEST_HASH}
    text = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def finite_or_exit(path, arrays):
    """Exit with a message naming the arrays unless every array of {name: array} is finite: a
    diverged run must not write weights that load_pair would then refuse."""
    bad = [name for name, array in arrays.items() if not np.isfinite(array).all()]
    if bad:
        sys.exit(f"{path}: not written: arrays {bad} hold NaN or inf (training diverged)")


def save_npz(path, arrays):
    """np.savez's format with fixed zip timestamps, so equal arrays give equal bytes; refuses
    non-finite arrays."""
    finite_or_exit(path, arrays)
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(array))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(out):
    """Train every model of MODELS into out/, measure them, write manifest.json and the log."""
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "train.log").open("w")

    def log(line):
        print(line, flush=True)
        log_file.write(line + "\n")

    corpus, begin = load_corpus(), time.perf_counter()
    log(f"jax {jax.__version__} on {jax.devices()[0].platform}, numpy {np.__version__}")
    log(f"corpus: {len(corpus.train) + len(corpus.held)} characters, {len(corpus.chars)} distinct")
    models, saved = {}, {}
    for name, spec in MODELS.items():
        sizes = f"layers {spec.n_layers}, d_model {spec.d_model}, heads {spec.n_heads}"
        log(f"{name}: {sizes}, {spec.steps} steps, seed {spec.seed}")

        def save(stem, step, params, seconds, spec=spec):
            arrays = {k: np.asarray(v, np.float32) for k, v in sorted(params.items())}
            saved[stem] = (spec, arrays)
            config = dict(n_layers=spec.n_layers, d_model=spec.d_model, n_heads=spec.n_heads)
            config |= dict(ff_mult=FF_MULT, max_len=CONTEXT, vocab_size=len(corpus.chars))
            models[stem] = {
                "file": f"{stem}.npz",
                "sha256": save_npz(out / f"{stem}.npz", arrays),
                "config": config,
                "steps": step,
                "schedule_steps": spec.steps,
                "seed": spec.seed,
                "jax": jax.__version__,
                "train_seconds": round(seconds, 1),
            }
            log(f"  saved {stem}.npz after {seconds:.1f} s")

        train(spec, corpus, log, save)
    log("measuring on the held-out text")
    windows = held_windows(corpus)
    inputs, targets = windows[:, :-1], windows[:, 1:]
    target_logp = log_probs(MODELS["target"], saved["target"][1], inputs)
    for stem, (spec, arrays) in saved.items():
        models[stem] |= measures(log_probs(spec, arrays, inputs), targets, target_logp)
    unigram, bigram = count_laws(corpus)
    baselines = {
        "unigram": measures(np.broadcast_to(unigram, target_logp.shape), targets, target_logp),
        "bigram": measures(bigram[inputs], targets, target_logp),
    }
    for stem, m in {**models, **baselines}.items():
        losses = f"loss {m['heldout_loss']:.4f}  late {m['heldout_loss_late']:.4f}"
        log(f"  {stem:12s} {losses}  α {m['alpha']:.4f}")
    ref_ids = np.stack([corpus.held[s : s + REFERENCE_LENGTH] for s in REFERENCE_STARTS])
    reference = {"ids": ref_ids.astype(np.int64)}
    for stem, (spec, arrays) in saved.items():
        reference[stem] = np.asarray(logits_fn(spec, arrays, ref_ids), np.float32)
    total = time.perf_counter() - begin
    manifest = {
        "corpus": {
            "file": "data/tinyshakespeare.txt",
            "sha256": CORPUS_SHA256,
            "characters": len(corpus.train) + len(corpus.held),
            "vocabulary": corpus.chars,
            "split_index": len(corpus.train),
            "ids": "a character's index in the sorted distinct characters; no BOS token",
        },
        "training": {
            "optimizer": "AdamW, gradients clipped to global norm 1, decay on matrices only",
            "peak_lr": PEAK_LR,
            "betas": BETAS,
            "weight_decay": WEIGHT_DECAY,
            "batch": BATCH,
            "context": CONTEXT,
            "warmup_steps": WARMUP,
            "schedule": "linear warm-up, then cosine to 10 % of peak at schedule_steps",
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "numpy": np.__version__,
            "device": jax.devices()[0].platform,
        },
        "evaluation": (
            f"held-out text = characters [split_index:]; all {len(windows)} non-overlapping "
            f"windows of {CONTEXT + 1} characters starting at held-out offsets {CONTEXT + 1}·k, "
            f"k = 0..{len(windows) - 1}; heldout_loss: mean next-character cross-entropy (nats) "
            f"over all {CONTEXT} positions (context lengths 1..{CONTEXT}); heldout_loss_late: "
            f"over positions {LATE}..{CONTEXT - 1} (context lengths {LATE + 1}..{CONTEXT}); alpha: "
            "mean over the same windows and positions of sum_x min(p(x), q(x)), p the target's "
            "softmax, q the model's, temperature 1; baselines: the unigram and the add-one bigram "
            "(on the last input character) from the training split's counts"
        ),
        "baselines": baselines,
        "models": models,
        "reference_logits": {
            "file": "reference_logits.npz",
            "sha256": save_npz(out / "reference_logits.npz", reference),
            "inputs": f"ids (3, {REFERENCE_LENGTH}): held-out offsets {list(REFERENCE_STARTS)}",
            "arrays": "ids, then one float32 (3, 32, V) array of JAX's logits per model",
        },
        "total_wall_seconds": round(total, 1),
    }
    manifest[MANIFEST_HASH] = manifest_digest(json.loads(json.dumps(manifest)))  # as read back
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    log(f"total wall time {total:.1f} s")
    log_file.close()
    return manifest


def check(out, shipped_dir):
    """Retrain into out/, compare every loss and α with shipped_dir's manifest: exit 1 if off."""
    shipped = json.loads((shipped_dir / "manifest.json").read_text())
    fresh = run(out)
    bad = 0
    for group in ("models", "baselines"):
        for stem, old in shipped[group].items():
            for key in ("heldout_loss", "heldout_loss_late", "alpha"):
                new = fresh[group][stem][key]
                bad += abs(new - old[key]) > TOLERANCE
                print(
                    f"{stem:12s} {key:18s} shipped {old[key]:.5f}  new {new:.5f}  "
                    f"diff {new - old[key]:+.5f}"
                )
    print("OK: within" if not bad else f"FAIL: {bad} values off by more than", TOLERANCE)
    sys.exit(1 if bad else 0)


def smoke():
    """A few steps of a tiny model: the training loss must fall."""
    losses = train(SMOKE, load_corpus(), print)
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < first - 0.2, f"the loss did not fall: {first:.3f} -> {last:.3f}"
    print(f"smoke OK: loss {first:.3f} -> {last:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS, help="the shipped weights")
    parser.add_argument("--check", type=Path, metavar="DIR", help="retrain into DIR and compare")
    parser.add_argument("--smoke", action="store_true", help="a few steps of a tiny model")
    args = parser.parse_args()
    if args.smoke:
        smoke()
    elif args.check:
        check(args.check, args.out)
    else:
        run(args.out)


if __name__ == "__main__":
    main()
