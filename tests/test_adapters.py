"""Chapter 6, issue 26: adapters take engines' functions as they are (tensors, names, dtypes).

The engine-shaped functions here are written against `torch`, which is the stand-in
tests/torchlike.py in CI (torch is not installed there); where torch is importable, the same
functions run a second time on it. They follow the public signatures of transformers'
`_speculative_sampling` (4.37: six parameters, `last_assistant_token_is_eos` and `max_matches`;
4.38 on: `is_done_candidate`; 5.18: `assistant_ensemble_weight`, None meaning the lossless
rule, and `1 − w + w·p/q` the ratio otherwise, as transformers' own tests and docs state) and
vLLM V0's `RejectionSampler.forward`. Written for the book, not copied.
"""

import importlib.util

import numpy as np
import pytest
import torchlike

import specdec_core as sc
from specdec import adapters

torch = torchlike  # the engine-shaped functions below find `torch` in this module's globals

ENGINES = [torchlike] + (
    [pytest.importorskip("torch")] if importlib.util.find_spec("torch") else []
)  # a second run on real torch where it is installed; CI runs the stand-in only


def _logged():
    """One request of the toy's rows along 'to b', γ = 3: the chapter's logged scenario."""
    p_rows, q_rows = sc.model_matrices(0.3, exact=False)
    path = [sc.CONTEXT_INDEX[c] for c in "to b"]
    return sc.Scenario("logged", p_rows[path][None], q_rows[path[:3]][None], steps=4000)


@pytest.fixture(scope="module")
def logged():
    return _logged()


# ---- Hugging Face's released signatures, in torch ------------------------------------------


def _hf_rule(ids, q_logits, gamma, p_logits, done, max_matches=None, weight=None, accept=None):
    """The rule behind every variant: (valid (1, n + 1), n_matches)."""
    drafts = ids[:, -gamma:]  # (1, γ)
    q, p = q_logits.softmax(dim=-1), p_logits.softmax(dim=-1)  # (1, γ, V), (1, γ + 1, V)
    at = torch.arange(gamma)
    ratio = p[0, at, drafts[0]] / q[0, at, drafts[0]]  # (γ,)
    if weight is not None:  # 5.18's ensemble: 1 − w + w·p/q
        ratio = 1 - weight + ratio * weight
    if accept is not None:
        ratio = accept(ratio)
    kept = torch.rand_like(ratio) <= ratio
    n = int(((~kept).cumsum(dim=-1) < 1).sum())
    if max_matches is not None:
        n = min(n, max_matches)
    if done and n == gamma:
        return drafts[:, :n], n - 1
    if n < gamma:
        residual = (p[:, n] - q[:, n]).clamp(min=0)
        residual = residual / residual.sum()
    else:
        residual = p[:, n]
    final = torch.multinomial(residual, num_samples=1)  # (1, 1)
    return torch.cat((drafts[:, :n], final), dim=-1), torch.tensor(n)


def hf_4_37(
    candidate_input_ids,
    candidate_logits,
    candidate_length,
    new_logits,
    last_assistant_token_is_eos,
    max_matches,
):
    """4.37's six parameters."""
    return _hf_rule(
        candidate_input_ids,
        candidate_logits,
        candidate_length,
        new_logits,
        last_assistant_token_is_eos,
        max_matches,
    )


def hf_4_38(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate):
    """From 4.38: is_done_candidate, no max_matches."""
    return _hf_rule(
        candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate
    )


def hf_5_18(
    candidate_input_ids,
    candidate_logits,
    candidate_length,
    new_logits,
    assistant_ensemble_weight=None,
    is_done_candidate=False,
):
    """5.18: assistant_ensemble_weight in the fifth place, where a positional False means w = 0,
    the rule 'accept every draft'."""
    return _hf_rule(
        candidate_input_ids,
        candidate_logits,
        candidate_length,
        new_logits,
        is_done_candidate,
        weight=assistant_ensemble_weight,
    )


def hf_5_18_accepts_all(
    candidate_input_ids,
    candidate_logits,
    candidate_length,
    new_logits,
    assistant_ensemble_weight=None,
    is_done_candidate=False,
):
    """The negative control: 5.18's shape, every draft accepted."""
    return _hf_rule(
        candidate_input_ids,
        candidate_logits,
        candidate_length,
        new_logits,
        is_done_candidate,
        accept=lambda ratio: ratio * 0 + 1,
    )


def hf_5_18_positional(
    candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate
):
    """The old adapter's call: 5.18's function with False in the fifth place, by position."""
    return hf_5_18(
        candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate
    )


@pytest.mark.parametrize("fn", [hf_4_37, hf_4_38, hf_5_18])
def test_every_released_hf_signature_passes_through_the_adapter(fn, logged):
    report = sc.audit_verifier(sc.hf_adapter(fn), scenarios=[logged])
    assert report.passed, report


@pytest.mark.parametrize("fn", [hf_5_18_accepts_all, hf_5_18_positional])
def test_an_hf_function_that_accepts_every_draft_fails(fn, logged):
    """Both the broken rule and 5.18's function called by position (w = False = 0) fail."""
    report = sc.audit_verifier(sc.hf_adapter(fn), scenarios=[logged])
    assert not report.passed
    assert not report.table["finding"].str.startswith("raised").any()  # failed by its law


def test_hf_arguments_go_by_name(logged):
    """Each parameter gets its own value whatever its place, with the values that keep the rule."""
    seen = {}

    def spy(
        new_logits,
        candidate_length,
        max_matches,
        assistant_ensemble_weight,
        candidate_input_ids,
        is_done_candidate,
        candidate_logits,
    ):
        seen.update(locals())
        return hf_4_38(candidate_input_ids, candidate_logits, candidate_length, new_logits, False)

    p, q, x = logged.target[:1], logged.draft[:1], np.array([[1, 2, 3]])
    sc.hf_adapter(spy, backend=torchlike)(p, q, x, np.random.default_rng(0))
    assert seen["assistant_ensemble_weight"] is None and seen["max_matches"] == 3
    assert seen["is_done_candidate"] is False and seen["candidate_length"] == 3
    assert seen["candidate_input_ids"].array.tolist() == [[0, 1, 2, 3]]
    assert seen["candidate_logits"].shape == (1, 3, p.shape[2])
    assert seen["new_logits"].shape == (1, 4, p.shape[2])


def test_an_unknown_required_hf_parameter_is_named():
    def future(candidate_input_ids, candidate_logits, candidate_length, new_logits, temperature):
        return None

    with pytest.raises(TypeError, match="'temperature'"):
        sc.hf_adapter(future)
    with pytest.raises(TypeError, match="lacks 'new_logits'"):
        sc.hf_adapter(lambda candidate_input_ids, candidate_logits: None)
    sc.hf_adapter(lambda candidate_input_ids, candidate_logits, new_logits, top_k=5: None)


# ---- tensors in and out, in the production dtype -------------------------------------------


@pytest.mark.parametrize("engine", ENGINES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_adapters_hand_tensors_of_the_dtype(engine, dtype, logged):
    kinds = []

    def hf_like(candidate_input_ids, candidate_logits, candidate_length, new_logits):
        kinds.append((type(new_logits), new_logits.dtype, candidate_input_ids.dtype))
        return engine.from_numpy(np.array([[1, 2, 3, 0]])), engine.tensor(3)

    p, q, x = logged.target[[0, 0]], logged.draft[[0, 0]], np.array([[1, 2, 3], [1, 2, 3]])
    verify_fn = sc.hf_adapter(hf_like, backend=engine, dtype=dtype)
    accepted, tokens = verify_fn(p, q, x, np.random.default_rng(0))
    assert kinds[0][0] is engine.Tensor and len(kinds) == 2
    names = [str(d).replace("'>", "").split(".")[-1] for d in kinds[0][1:]]  # torch.float32 too
    assert names == [dtype, "int64"]
    assert type(accepted) is np.ndarray and type(tokens) is np.ndarray
    assert accepted.tolist() == [3, 3] and tokens.tolist() == [[1, 2, 3, 0]] * 2


def test_a_torch_function_fails_on_numpy_arrays_and_passes_on_tensors(logged):
    """Without the torch backend, the function gets numpy arrays and raises (as the issue
    found); auto-detection gives it tensors."""
    numpy_fed = sc.audit_verifier(sc.hf_adapter(hf_4_38, backend="numpy"), scenarios=[logged])
    assert not numpy_fed.passed
    assert numpy_fed.table["finding"].str.contains("AttributeError").all()
    assert adapters.backend_of(hf_4_38).torch is torchlike


def test_torch_seeding_is_cheap_and_comes_from_the_rng(logged):
    """default_generator.manual_seed from rng: the same rng gives the same tokens whatever the
    generator did before; the negative control, a backend that does not seed, does not."""
    p, q, x = logged.target[[0] * 64], logged.draft[[0] * 64], np.tile([[1, 2, 3]], (64, 1))
    verify_fn = sc.hf_adapter(hf_4_38)

    def run(fn):
        torchlike.default_generator.rng.random(7)  # torch used elsewhere in between
        return fn(p, q, x, np.random.default_rng(3))[1]

    assert np.array_equal(run(verify_fn), run(verify_fn))

    class Unseeded(adapters.Backend):
        def seed(self, rng):
            pass

    unseeded = sc.hf_adapter(hf_4_38, backend=Unseeded(torchlike))
    assert not np.array_equal(run(unseeded), run(unseeded))
    assert not hasattr(torchlike, "manual_seed")  # the slow global seeding is not even there


def numpy_4_38(
    candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate
):
    """4.38's rule ported to numpy as an engine's code would be: it draws from np.random."""
    drafts = candidate_input_ids[0, -candidate_length:]
    q, p = adapters._softmax(candidate_logits[0]), adapters._softmax(new_logits[0])
    at = np.arange(candidate_length)
    n = int(
        np.cumprod(np.random.random_sample(candidate_length) <= p[at, drafts] / q[at, drafts]).sum()
    )
    weights = p[n] if n == candidate_length else np.maximum(p[n] - q[n], 0)
    final = np.random.choice(len(weights), p=weights / weights.sum())
    return np.append(drafts[:n], final)[None], n


def test_a_numpy_function_without_rng_gets_numpy_s_generator_seeded(logged, monkeypatch):
    """The same rng gives the same tokens whatever np.random did before, so the audit's seed
    fixes the run; the negative control, the adapter without that seeding, does not."""
    p, q, x = logged.target[[0] * 64], logged.draft[[0] * 64], np.tile([[1, 2, 3]], (64, 1))

    def run():
        np.random.random(7)  # numpy's global generator used elsewhere in between
        verify_fn = sc.hf_adapter(numpy_4_38, backend="numpy")  # torch is in these globals
        return verify_fn(p, q, x, np.random.default_rng(3))[1]

    assert np.array_equal(run(), run())
    assert sc.audit_verifier(sc.hf_adapter(numpy_4_38, backend="numpy"), scenarios=[logged]).passed
    monkeypatch.setattr(adapters, "_seed", lambda tensors, named, rng: tensors.seed(rng))
    assert not np.array_equal(run(), run())


# ---- vLLM V0: RejectionSampler.forward -------------------------------------------------------


class RejectionSamplerLike:
    """V0's RejectionSampler as an engine would call it: forward(target_with_bonus_probs,
    bonus_token_ids, draft_probs, draft_token_ids, seeded_seqs), strict about dtypes."""

    def __init__(self, broken=False):
        self.broken = broken
        self.num_accepted_tokens = None  # V0's counters: set up by init_gpu_tensors(device)

    def init_gpu_tensors(self, device):
        assert self.num_accepted_tokens is None and device == "cpu"
        self.num_accepted_tokens = torch.tensor(0)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(
        self,
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs,
        draft_token_ids,
        seeded_seqs=None,
    ):
        for name, t, kind in [
            ("target_with_bonus_probs", target_with_bonus_probs, torch.float32),
            ("draft_probs", draft_probs, torch.float32),
            ("draft_token_ids", draft_token_ids, torch.int64),
            ("bonus_token_ids", bonus_token_ids, torch.int64),
        ]:
            if t.dtype != kind:  # V0's strict mode checks the same
                raise ValueError(f"{name} must be {kind}, got {t.dtype}")
        batch, k, _ = draft_probs.shape
        p = target_with_bonus_probs[:, :k]
        rows, at = torch.arange(batch).unsqueeze(1), torch.arange(k)
        ratio = p[rows, at, draft_token_ids] / draft_probs[rows, at, draft_token_ids]
        accepted = torch.rand(batch, k) < ratio
        residual = (p - draft_probs).clamp(min=0)
        if self.broken:  # recovered from p itself: the residual ignored
            residual = p
        race = torch.empty_like(residual).exponential_(1.0)
        recovered = (residual / race).argmax(dim=-1)  # (B, k)
        kept = accepted.cumprod(dim=1)
        self.num_accepted_tokens = self.num_accepted_tokens + kept.sum()  # None: TypeError
        stop = kept.sum(dim=1)  # (B,)
        out = torch.full((batch, k + 1), -1)
        out[:, :k] = torch.where(kept, draft_token_ids, -1)
        for b in range(batch):
            s = int(stop[b])
            out[b, s] = recovered[b, s] if s < k else bonus_token_ids[b, 0]
        return out


@pytest.mark.parametrize("fn", [RejectionSamplerLike(), RejectionSamplerLike().forward])
def test_the_v0_adapter_takes_the_module_or_its_forward(fn, logged):
    report = sc.audit_verifier(sc.vllm_v0_adapter(fn, backend=torchlike), scenarios=[logged])
    assert report.passed, report


def test_a_broken_v0_sampler_fails(logged):
    fn = sc.vllm_v0_adapter(RejectionSamplerLike(broken=True), backend=torchlike)
    assert not sc.audit_verifier(fn, scenarios=[logged]).passed


def test_the_v0_module_is_detected_as_torch_and_gets_float32():
    assert adapters.backend_of(RejectionSamplerLike()).torch is torchlike
    with pytest.raises(ValueError, match="float32"):  # strict mode, as V0's, on float64
        sc.vllm_v0_adapter(RejectionSamplerLike(), backend=torchlike, dtype="float64")(
            *_small_batch(), np.random.default_rng(0)
        )


def _small_batch():
    scenario = _logged()
    return scenario.target[[0, 0]], scenario.draft[[0, 0]], np.array([[1, 2, 3], [0, 0, 0]])


def test_the_numpy_v0_version_passes_and_its_adapter_checks_names(logged):
    assert sc.audit_verifier(
        sc.vllm_v0_adapter(sc.vllm_v0_rejection_sampler), scenarios=[logged]
    ).passed
    with pytest.raises(TypeError, match="lacks 'draft_token_ids'"):
        sc.vllm_v0_adapter(lambda target_with_bonus_probs, bonus_token_ids, draft_probs: None)


def test_the_v1_adapter_passes_by_name_with_tensors(logged):
    def v1_like(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_probs,
        bonus_token_ids,
    ):
        assert target_probs.dtype == torch.float32
        rng = np.random.default_rng(int(torch.default_generator.rng.integers(2**63)))
        arrays = [
            t.numpy() if hasattr(t, "numpy") else t
            for t in (
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                target_probs,
                bonus_token_ids,
            )
        ]
        return torch.from_numpy(sc.vllm_rejection_sample(*arrays, rng))

    assert sc.audit_verifier(sc.vllm_adapter(v1_like), scenarios=[logged]).passed
    with pytest.raises(TypeError, match="'sampling_metadata'"):
        sc.vllm_adapter(lambda draft_token_ids, sampling_metadata: None)


def test_backend_and_dtype_are_checked():
    with pytest.raises(ValueError, match="backend"):
        sc.hf_adapter(hf_4_38, backend="jax")
    with pytest.raises(ValueError, match="dtype"):
        sc.hf_adapter(hf_4_38, dtype="float16")


def test_float32_tensors_at_a_wide_vocabulary_pass_and_a_broken_rule_fails():
    """The production dtype where rounding could matter: V = 4,096, float32 logits."""
    rng = np.random.default_rng(4096)
    target = rng.dirichlet(np.full(4096, 0.1), size=(1, 4))
    draft = 0.5 * target[:, :3] + 0.5 * rng.dirichlet(np.full(4096, 0.1), size=(1, 3))
    wide = sc.Scenario("V = 4,096, γ = 3", target, draft, steps=2000)
    assert sc.audit_verifier(sc.hf_adapter(hf_4_38, dtype="float32"), scenarios=[wide]).passed
    assert not sc.audit_verifier(sc.hf_adapter(hf_5_18_accepts_all), scenarios=[wide]).passed
