"""Chapter 6: engines' verification interfaces, in numpy for the book, and adapters to verify's.

Three public shapes: Hugging Face's `_speculative_sampling` (one request, logits in, kept drafts
and a final token out), vLLM V1's `rejection_sample` (a flattened batch) and vLLM V0's
`RejectionSampler.forward` (a padded batch). Each has a numpy version written for the book from
its public signature, and an adapter that makes a verify_fn of any function of that shape.

An adapter takes the engine's own function as it is. Its backend is numpy, or torch: tensors on
the CPU in the production dtype (float32 by default, float64 on request), the results turned
back into numpy, and torch's default generator seeded from the audit's rng before each call
(`default_generator.manual_seed`, about 1.5 µs, where `torch.manual_seed` costs 150–400 µs).
A numpy fn that takes no `rng` gets numpy's global generator seeded the same way.
`backend=None` picks torch when the function's module has a `torch` in its globals (that module
is used, so a torch-like stand-in works too), numpy otherwise. Arguments go by name, checked
against the function's signature when the adapter is made.
"""

import importlib
import inspect
import types

import numpy as np

from .harness import _torch_of
from .planted import _draw

# ---- backends: numpy arrays, or tensors of a torch module -------------------------------------


class Backend:
    """How an adapter hands arrays to fn and reads its results: numpy, or a torch module."""

    def __init__(self, torch=None, dtype=None):
        self.torch, self.dtype = torch, None if dtype is None else np.dtype(dtype)
        if torch is not None:
            self.dtype = np.dtype(np.float32) if dtype is None else self.dtype
            if self.dtype not in (np.float32, np.float64):
                raise ValueError(f"dtype must be float32 or float64 for torch, got {dtype!r}")

    @property
    def name(self):
        """'numpy', or the torch module's name."""
        return "numpy" if self.torch is None else self.torch.__name__

    def floats(self, array):
        """Probabilities or logits for fn: a CPU tensor of the dtype, or a numpy array. A tensor
        gets memory of its own: torch.from_numpy shares the array's, and a write in place into
        a read-only row (shared memory) would kill the process with SIGSEGV."""
        array = np.asarray(array) if self.dtype is None else np.asarray(array, self.dtype)
        if self.torch is None:
            return array
        if not (array.flags.writeable and array.flags.c_contiguous):
            array = np.array(array, order="C")  # a private, writable copy
        return self.torch.from_numpy(array)

    def ids(self, array):
        """Token ids for fn: int64."""
        array = np.ascontiguousarray(array, dtype=np.int64)
        return array if self.torch is None else self.torch.from_numpy(array)

    def seed(self, rng):
        """Seed torch's default generator (cheaply) from the audit's rng; nothing for numpy."""
        if self.torch is not None:
            self.torch.default_generator.manual_seed(int(rng.integers(2**63)))


def backend_of(fn, backend=None, dtype=None):
    """fn's Backend: backend 'numpy', 'torch', a torch-like module, a Backend, or None to
    detect it from fn's globals."""
    if isinstance(backend, Backend):
        return backend
    if backend is None:
        return Backend(_torch_of(fn), dtype)
    if backend == "numpy":
        return Backend(None, dtype)
    if backend == "torch":
        return Backend(importlib.import_module("torch"), dtype)
    if isinstance(backend, types.ModuleType):
        return Backend(backend, dtype)
    raise ValueError(f"backend must be 'numpy', 'torch', a module or None, got {backend!r}")


def _seed(tensors, named, rng):
    """Seed fn's generator from the audit's rng before a call, so the audit's seed fixes the
    run: torch's default generator; for a numpy fn that takes no rng (and so draws from numpy's
    global generator, as a port of an engine's code does), np.random.seed (about 4 µs)."""
    tensors.seed(rng)
    if tensors.torch is None and "rng" not in named:
        np.random.seed(int(rng.integers(2**32)))


def _numpy(value):
    """A result as numpy: tensors detached and moved to the CPU first."""
    for method in ("detach", "cpu"):
        value = getattr(value, method)() if hasattr(value, method) else value
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _name(fn):
    """fn's qualified name, or its type's."""
    return getattr(fn, "__qualname__", type(fn).__name__)


def _named(fn, known, adapter):
    """fn's parameters that the adapter fills (a subset of known); TypeError on any other
    required one, or on a parameter that cannot be passed by name."""
    name = _name(fn)
    if not inspect.isroutine(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # an nn.Module: called with the arguments of its forward
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as error:
        raise TypeError(f"{adapter}: cannot read the signature of {name}: {error}") from None
    named = []
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in known:
            if p.kind == p.POSITIONAL_ONLY:
                raise TypeError(f"{adapter}: {name}'s parameter {p.name!r} is positional-only")
            named.append(p.name)
        elif p.default is p.empty:
            raise TypeError(
                f"{adapter}: {name} has a required parameter {p.name!r} that the adapter does "
                f"not know; it passes {', '.join(known)}"
            )
    return named


def _required(named, needed, fn, adapter):
    """TypeError unless fn takes every parameter in needed."""
    missing = [p for p in needed if p not in named]
    if missing:
        raise TypeError(f"{adapter}: {_name(fn)} lacks {', '.join(map(repr, missing))}")


# ---- Hugging Face: `_speculative_sampling`, one request at a time ------------------------------


def _softmax(logits):
    """softmax over the last axis, (..., V); −inf logits get probability 0."""
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _log(probs):
    """log(probs) with −inf at zeros: logits whose softmax is the row."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, float))


def hf_speculative_sampling(
    candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate, rng
):
    """Hugging Face's `_speculative_sampling` interface in numpy (batch 1):
    (valid_tokens (1, n + 1), n_matches). Written for the book from its public signature."""
    drafts = candidate_input_ids[0, -candidate_length:]  # (γ,)
    q, p = _softmax(candidate_logits[0]), _softmax(new_logits[0])  # (γ, V), (γ+1, V)
    at = np.arange(candidate_length)
    accepted = rng.random(candidate_length) <= p[at, drafts] / q[at, drafts]
    n = int(np.cumprod(accepted).sum())  # leading acceptances
    if is_done_candidate and n == candidate_length:  # ended on EOS: no token after it
        return drafts[None, :n], n - 1
    weights = p[n] if n == candidate_length else np.maximum(p[n] - q[n], 0)
    final = _draw(weights[None], rng.random(1))
    return np.concatenate([drafts[:n], final])[None], n


HF_ARGUMENTS = (  # every parameter of the released `_speculative_sampling`s, and what is passed
    "candidate_input_ids",  # (1, 1 + γ): a one-token prompt, then the drafts
    "candidate_logits",  # (1, γ, V): log q
    "candidate_length",  # γ
    "new_logits",  # (1, γ + 1, V): log p
    "last_assistant_token_is_eos",  # 4.37: False
    "is_done_candidate",  # from 4.38: False
    "max_matches",  # 4.37: γ, no cap below the drafts
    "assistant_ensemble_weight",  # from 5.18: None, the lossless rule
    "rng",  # the book's numpy versions: the audit's generator
)


def hf_adapter(fn, backend=None, dtype=None):
    """A verify_fn from an `_speculative_sampling`-shaped fn, one request at a time.

    Every argument goes by name (HF_ARGUMENTS), checked against fn's signature now: 4.37's six
    parameters, `is_done_candidate` from 4.38, `assistant_ensemble_weight` from 5.18 (None,
    which keeps the rule). fn must draw the final token itself. backend and dtype: see
    backend_of; with torch, the generator is seeded from rng before each request.
    """
    named = _named(fn, HF_ARGUMENTS, "hf_adapter")
    _required(named, ("candidate_input_ids", "candidate_logits", "new_logits"), fn, "hf_adapter")
    tensors = backend_of(fn, backend, dtype)

    def verify_fn(target_probs, draft_probs, draft_tokens, rng):
        """Each request through fn; (accepted (B,), tokens (B, γ+1)) padded with −1."""
        batch, gamma = draft_tokens.shape
        tokens, accepted = np.full((batch, gamma + 1), -1), np.empty(batch, dtype=np.int64)
        ids = tensors.ids(np.concatenate([np.zeros((batch, 1)), draft_tokens], axis=1))
        logq, logp = tensors.floats(_log(draft_probs)), tensors.floats(_log(target_probs))
        fixed = {
            "candidate_length": gamma,
            "last_assistant_token_is_eos": False,
            "is_done_candidate": False,
            "max_matches": gamma,
            "assistant_ensemble_weight": None,  # the lossless rule, whatever its place
            "rng": rng,
        }
        fixed = {k: v for k, v in fixed.items() if k in named}
        for b in range(batch):
            _seed(tensors, named, rng)
            given = {"candidate_input_ids": ids[b : b + 1], "candidate_logits": logq[b : b + 1]}
            given["new_logits"] = logp[b : b + 1]
            valid, n = fn(**{k: v for k, v in given.items() if k in named}, **fixed)
            valid = _numpy(valid).reshape(-1)
            accepted[b], tokens[b, : len(valid)] = int(_numpy(n)), valid
        return accepted, tokens

    verify_fn.__name__ = verify_fn.__qualname__ = f"hf_adapter({_name(fn)}, {tensors.name})"
    verify_fn.engine_function = fn  # where the child looks for the torch module it pins
    return verify_fn


# ---- vLLM V1: `rejection_sample`, the batch flattened ------------------------------------------


def vllm_rejection_sample(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_probs,
    bonus_token_ids,
    rng,
):
    """vLLM's `rejection_sample` interface in numpy: output_token_ids (B, max_spec_len + 1),
    −1 after each request's last token. Written for the book from its public signature."""
    batch, vocab = len(num_draft_tokens), target_probs.shape[1]
    out = np.full((batch, max_spec_len + 1), -1, dtype=np.int32)
    race = rng.exponential(size=(batch, vocab))  # one exponential race per request
    for b in range(batch):
        start = int(cu_num_draft_tokens[b]) - num_draft_tokens[b]
        for i in range(num_draft_tokens[b]):
            x, p, q = draft_token_ids[start + i], target_probs[start + i], draft_probs[start + i]
            if q[x] > 0 and p[x] / q[x] >= rng.random():
                out[b, i] = x
                continue
            out[b, i] = np.argmax(np.maximum(p - q, 0) / race[b])  # residual, unnormalised
            break
        else:
            out[b, num_draft_tokens[b]] = bonus_token_ids[b, 0]
    return out


V1_ARGUMENTS = (
    "draft_token_ids",  # (B·γ,)
    "num_draft_tokens",  # [γ] * B
    "max_spec_len",  # γ
    "cu_num_draft_tokens",  # (B,) running sums
    "draft_probs",  # (B·γ, V)
    "target_probs",  # (B·γ, V): the draft positions only
    "bonus_token_ids",  # (B, 1), drawn by the adapter from p at γ
    "rng",
)


def _bonus(target_probs, rng):
    """Bonus tokens (B, 1) drawn from each request's last target row."""
    gamma = target_probs.shape[1] - 1
    return _draw(np.asarray(target_probs[:, gamma], float), rng.random(len(target_probs)))[:, None]


def _from_padded(out):
    """(accepted (B,), tokens (B, γ+1)) from an output padded with −1 after the last token."""
    out = _numpy(out).astype(np.int64)
    return (out != -1).sum(axis=1) - 1, out


def vllm_adapter(fn, backend=None, dtype=None):
    """A verify_fn from a `rejection_sample`-shaped fn: flattened drafts, per-request counts,
    and bonus tokens the adapter draws from p at γ (so the bonus draw itself is not audited)."""
    named = _named(fn, V1_ARGUMENTS, "vllm_adapter")
    _required(named, V1_ARGUMENTS[:7], fn, "vllm_adapter")
    tensors = backend_of(fn, backend, dtype)

    def verify_fn(target_probs, draft_probs, draft_tokens, rng):
        """One call of fn on the flattened batch; (accepted (B,), tokens (B, γ+1))."""
        target_probs, draft_probs = np.asarray(target_probs), np.asarray(draft_probs)
        batch, gamma = draft_tokens.shape
        vocab = target_probs.shape[2]
        counts = [gamma] * batch
        arguments = {
            "draft_token_ids": tensors.ids(draft_tokens.reshape(-1)),
            "num_draft_tokens": counts,
            "max_spec_len": gamma,
            "cu_num_draft_tokens": tensors.ids(np.cumsum(counts)),
            "draft_probs": tensors.floats(draft_probs.reshape(-1, vocab)),
            "target_probs": tensors.floats(target_probs[:, :gamma].reshape(-1, vocab)),
            "bonus_token_ids": tensors.ids(_bonus(target_probs, rng)),
            "rng": rng,
        }
        _seed(tensors, named, rng)
        return _from_padded(fn(**{k: v for k, v in arguments.items() if k in named}))

    verify_fn.__name__ = verify_fn.__qualname__ = f"vllm_adapter({_name(fn)}, {tensors.name})"
    verify_fn.engine_function = fn  # where the child looks for the torch module it pins
    return verify_fn


# ---- vLLM V0: `RejectionSampler.forward`, a padded batch ---------------------------------------


def vllm_v0_rejection_sampler(
    target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs=None, *, rng
):
    """vLLM V0's `RejectionSampler.forward` interface in numpy: output_token_ids (B, k + 1),
    −1 after each request's last token. Written for the book from its public signature."""
    batch, k, _ = np.shape(draft_probs)
    p, q = np.asarray(target_with_bonus_probs, float)[:, :k], np.asarray(draft_probs, float)
    at, positions = np.arange(batch)[:, None], np.arange(k)
    ratio = p[at, positions, draft_token_ids] / q[at, positions, draft_token_ids]  # (B, k)
    kept = np.cumprod(rng.random((batch, k)) < ratio, axis=1).astype(bool)  # leading accepts
    residual = np.maximum(p - q, 0)  # (B, k, V): the recovered law at each position
    residual = np.where(residual.sum(axis=2, keepdims=True) > 0, residual, p)
    recovered = np.argmax(residual / rng.exponential(size=residual.shape), axis=2)  # a race
    out = np.full((batch, k + 1), -1, dtype=np.int64)
    out[:, :k] = np.where(kept, draft_token_ids, -1)
    stop = kept.sum(axis=1)  # the first rejected position, or k
    rejected = stop < k
    out[rejected, stop[rejected]] = recovered[rejected, stop[rejected]]
    out[~rejected, k] = np.asarray(bonus_token_ids)[~rejected, 0]
    return out


V0_ARGUMENTS = (
    "target_with_bonus_probs",  # (B, γ + 1, V)
    "bonus_token_ids",  # (B, 1), drawn by the adapter from p at γ
    "draft_probs",  # (B, γ, V)
    "draft_token_ids",  # (B, γ)
    "seeded_seqs",  # None: torch's default generator, seeded from the audit's rng
    "rng",
)


def vllm_v0_adapter(fn, backend=None, dtype=None):
    """A verify_fn from a V0 `RejectionSampler.forward`-shaped fn (the module, its bound forward,
    or the numpy version): one call on the batch, bonus tokens drawn by the adapter from p at γ,
    seeded_seqs None. With torch, probabilities are float32 and ids int64, as V0's strict mode
    checks; a sampler whose counters are not set up yet gets init_gpu_tensors("cpu")."""
    named = _named(fn, V0_ARGUMENTS, "vllm_v0_adapter")
    _required(named, V0_ARGUMENTS[:4], fn, "vllm_v0_adapter")
    tensors = backend_of(fn, backend, dtype)
    sampler = getattr(fn, "__self__", fn)
    if getattr(sampler, "num_accepted_tokens", 0) is None and hasattr(sampler, "init_gpu_tensors"):
        sampler.init_gpu_tensors("cpu")  # V0's counters, which forward adds to, on the CPU

    def verify_fn(target_probs, draft_probs, draft_tokens, rng):
        """One call of fn on the batch; (accepted (B,), tokens (B, γ+1))."""
        arguments = {
            "target_with_bonus_probs": tensors.floats(target_probs),
            "bonus_token_ids": tensors.ids(_bonus(target_probs, rng)),
            "draft_probs": tensors.floats(draft_probs),
            "draft_token_ids": tensors.ids(draft_tokens),
            "seeded_seqs": None,
            "rng": rng,
        }
        _seed(tensors, named, rng)
        return _from_padded(fn(**{k: v for k, v in arguments.items() if k in named}))

    verify_fn.__name__ = verify_fn.__qualname__ = f"vllm_v0_adapter({_name(fn)}, {tensors.name})"
    verify_fn.engine_function = fn  # where the child looks for the torch module it pins
    return verify_fn


ADAPTERS = {"hf": hf_adapter, "vllm-v0": vllm_v0_adapter, "vllm-v1": vllm_adapter}
