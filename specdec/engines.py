"""Chapter 6: the engines' own code, audited by `make engines` (scripts/engines.py).

TARGETS lists what is audited: released, unmodified functions of Hugging Face transformers and
vLLM, each with its package, version, mode (verifier or drafter), suite and seed. The glue they
need lives here once:

- `vllm_v0_sampler`: vLLM 0.6.3's V0 `RejectionSampler`, imported from the two files taken out of
  the released wheel, with two stub modules for its imports (VLLM_STUBS);
- `assistant_model`: a tiny causal LM built from a config with random weights (no download),
  whose logits at its n-th forward call are the n-th of the rows it is given;
- `hf_drafter`: a drafter(draft_probs, rng) that runs a release's `AssistedCandidateGenerator`
  with that model, one request at a time.

`run(name)` audits one target in the engine's venv (torch imported there, never in the book's
.venv: this module imports only the standard library at the top) and returns its record entry.
`make engines` writes the entries to RECORD; chapter 6 reads them (`engine_table`).
"""

import json
import logging
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORD = Path(__file__).parent / "data" / "engines.json"  # written by make engines
ENGINE_SEED = 0  # the audit's seed for every target


@dataclass(frozen=True)
class Target:
    """One released function and how it is audited."""

    name: str  # as the record and the chapter show it
    venv: str  # .venv-engines/<venv>: base (torch) or transformers-<version>
    package: str
    version: str
    function: str  # the qualified name of the released function
    mode: str  # "verifier": the function verifies; "drafter": it drafts, its release verifies
    suite: str  # the audit's suite: "small", "engine", or "drafter" (DRAFTER_SCENARIOS)
    expected: str  # "pass" or "fail", and why
    options: dict = field(default_factory=dict)  # the target's settings (recorded as they are)


HF_VERIFY = "transformers.generation.utils._speculative_sampling"
HF_DRAFT = "transformers.generation.candidate_generator.AssistedCandidateGenerator"
V0_SAMPLER = "vllm.model_executor.layers.rejection_sampler.RejectionSampler.forward"

TARGETS = (
    Target(
        "transformers 5.25.0, the verifier", "transformers-5.25.0", "transformers", "5.25.0",
        HF_VERIFY, "verifier", "small", "pass",
    ),
    Target(
        "transformers 5.25.0, DIVERSE ensemble w = 0.5", "transformers-5.25.0", "transformers",
        "5.25.0", HF_VERIFY, "verifier", "small", "fail: lossy by design",
        {"assistant_ensemble_weight": 0.5},
    ),
    Target(
        "transformers 4.44.2, assistant drafter", "transformers-4.44.2", "transformers", "4.44.2",
        HF_DRAFT, "drafter", "drafter", "fail: forced-greedy assistant (issue 32867)",
    ),
    Target(
        "transformers 4.45.0, assistant drafter", "transformers-4.45.0", "transformers", "4.45.0",
        HF_DRAFT, "drafter", "drafter", "pass", {"assistant_confidence_threshold": 0.4},
    ),
    Target(
        "transformers 4.45.0, assistant drafter, threshold 0.08", "transformers-4.45.0",
        "transformers", "4.45.0", HF_DRAFT, "drafter", "drafter", "pass",
        {"assistant_confidence_threshold": 0.08},
    ),
    Target(
        "vLLM 0.6.3, V0 rejection sampler", "base", "vllm", "0.6.3", V0_SAMPLER, "verifier",
        "small", "pass",
    ),
)  # fmt: skip


def target(name):
    """The Target called name; ValueError listing the names otherwise."""
    for t in TARGETS:
        if t.name == name:
            return t
    raise ValueError(f"no target {name!r}; targets: {', '.join(t.name for t in TARGETS)}")


# ---- vLLM 0.6.3: the sampler from the released wheel's files, two stub modules ------------------

VLLM_FILES = (  # taken out of the wheel unmodified (make engines checks them against its RECORD)
    "vllm/model_executor/layers/rejection_sampler.py",
    "vllm/model_executor/layers/spec_decode_base_sampler.py",
)
VLLM_STUBS = {  # the modules the two files import from the rest of vLLM, and what they use
    "vllm.envs": {"VLLM_USE_FLASHINFER_SAMPLER": False},  # vLLM's default: torch's sampler
    "vllm.logger": {"init_logger": logging.getLogger},
}


def install_stubs(stubs=VLLM_STUBS):
    """Put each stub module in sys.modules (a name already imported is refused: never shadow a
    real module). Returns the names installed."""
    for name, attributes in stubs.items():
        if name in sys.modules and not getattr(sys.modules[name], "__stub__", False):
            raise ValueError(f"{name} is already imported: a stub would shadow it")
        module = types.ModuleType(name, "A stub for make engines (specdec.engines).")
        module.__dict__.update(attributes, __stub__=True)
        sys.modules[name] = module
    return list(stubs)


def vllm_v0_sampler(source):
    """vLLM's V0 RejectionSampler() from the folder holding VLLM_FILES (namespace packages)."""
    folder = str(Path(source).resolve())
    for relative in VLLM_FILES:
        if not (Path(folder) / relative).is_file():
            raise ValueError(f"source {folder} lacks {relative}: run make engines")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    install_stubs()
    from vllm.model_executor.layers.rejection_sampler import RejectionSampler

    return RejectionSampler()


# ---- Hugging Face: a tiny assistant whose logits are the scenario's, and its drafter ---------


def assistant_model(transformers, torch, vocab):
    """A tiny LlamaForCausalLM from a config with random weights (no download). Its logits at
    the n-th forward call since `model.rows` was set are rows[n] (the last row after that), at
    every position of the call, so a draft of n tokens sees the scenario's rows in order."""
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    torch.default_generator.manual_seed(0)  # the random weights, the same every run
    model = transformers.LlamaForCausalLM(config).eval()
    model.rows, model.calls = None, 0

    def scenario_logits(module, args, kwargs, output):
        """Replace the model's logits (B, S, V) by the next scenario row."""
        row = module.rows[min(module.calls, len(module.rows) - 1)]
        module.calls += 1
        output.logits = row.expand(*output.logits.shape[:-1], vocab).clone()
        return output

    model.register_forward_hook(scenario_logits, with_kwargs=True)
    return model


def hf_drafter(transformers, torch, threshold=None):
    """drafter(draft_probs (B, γ, V), rng) -> (drafts (B, γ), q (B, γ, V)): the release's
    AssistedCandidateGenerator, one request at a time, with assistant_model holding that
    request's rows as log q; drafts −1 after each request's last, and q the softmax of the
    logits the generator returns (the q its release verifies with; the rows given after the
    last draft). Temperature 1, no top-k or top-p; torch's generator seeded from rng."""
    import numpy as np

    generator_class = transformers.generation.candidate_generator.AssistedCandidateGenerator
    models = {}
    config = transformers.GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_length=64, pad_token_id=0
    )
    prompt = torch.zeros((1, 1), dtype=torch.long)

    def drafter(draft_probs, rng):
        """Drafts and their q from the release's generator."""
        batch, gamma, vocab = np.shape(draft_probs)
        if vocab not in models:
            models[vocab] = assistant_model(transformers, torch, vocab)
        model = models[vocab]
        model.generation_config.num_assistant_tokens = gamma
        model.generation_config.num_assistant_tokens_schedule = "constant"
        if threshold is not None:
            model.generation_config.assistant_confidence_threshold = threshold
        q = np.array(draft_probs, dtype=np.float64)  # (B, γ, V), overwritten where drafted
        with np.errstate(divide="ignore"):
            logq = torch.from_numpy(np.log(q.astype(np.float32)))  # −inf at zeros
        drafts = np.full((batch, gamma), -1, dtype=np.int64)
        for b in range(batch):
            torch.default_generator.manual_seed(int(rng.integers(2**63)))
            model.rows, model.calls = logq[b], 0
            generator = generator_class(
                input_ids=prompt,
                assistant_model=model,
                generation_config=config,
                model_kwargs={"attention_mask": torch.ones_like(prompt)},
                logits_processor=transformers.LogitsProcessorList(),
            )
            ids, logits = generator.get_candidates(prompt)
            new = ids[0, prompt.shape[1] :].numpy()
            drafts[b, : len(new)] = new
            z = logits[0].double().softmax(dim=-1).numpy()  # (k, V)
            q[b, : len(new)] = z
        return drafts, q

    return drafter


STEPS = 300  # per request: a generator call takes 10–100 ms (a loaded CPU), 1,200 calls a run


def drafter_scenarios():
    """The drafter suite: small engine-shaped scenarios (a HF generator drafts one request per
    call, a few milliseconds each), confident and unconfident draft rows, from a fixed seed."""
    import numpy as np

    from .projections import Scenario, _drafter_of, _zipf

    rng = np.random.default_rng(2028)
    peaked = _zipf(rng, (2, 4, 16), 2.0)
    flat = _zipf(rng, (2, 5, 64), 1.0)
    return [
        Scenario(
            "V = 16, peaked rows, γ = 3", peaked, _drafter_of(rng, peaked[:, :3], 0.5), steps=STEPS
        ),
        Scenario("V = 64, flat rows, γ = 4", flat, _drafter_of(rng, flat[:, :4], 0.5), steps=STEPS),
    ]


# ---- one target, run in its venv ----------------------------------------------------------------


def _verifier(t, source):
    """The verify_fn of target t: its own function, or its release's verifier (drafter mode)."""
    import importlib

    from .adapters import hf_adapter, vllm_v0_adapter

    if t.package == "vllm":
        return vllm_v0_adapter(vllm_v0_sampler(source))
    fn = importlib.import_module("transformers.generation.utils")._speculative_sampling
    weight = t.options.get("assistant_ensemble_weight")
    if weight is None:
        return hf_adapter(fn)
    import inspect

    if "assistant_ensemble_weight" not in inspect.signature(fn).parameters:
        raise ValueError(f"transformers {t.version} has no assistant_ensemble_weight")

    def ensemble(candidate_input_ids, candidate_logits, candidate_length, new_logits):
        """The release's function with the ensemble weight set."""
        return fn(
            candidate_input_ids, candidate_logits, candidate_length, new_logits,
            assistant_ensemble_weight=weight,
        )  # fmt: skip

    return hf_adapter(ensemble, backend="torch")


def _counting(verify_fn, total):
    """verify_fn that writes 'progress done/total' (requests verified) to stderr as it goes,
    for make engines' progress line."""

    def counted(target_probs, draft_probs, draft_tokens, rng):
        counted.done += len(draft_tokens)
        print(f"progress {counted.done}/{total}", file=sys.stderr, flush=True)
        return verify_fn(target_probs, draft_probs, draft_tokens, rng)

    counted.done = 0
    return counted


def run(name, source=None):
    """Audit target `name` here (its venv): its record entry, a dict of RECORD_FIELDS."""
    import importlib.metadata

    import torch

    from .audit import audit_verifier

    t = target(name)
    torch.set_num_threads(1)  # one sequence at a time: more threads only fight on a loaded CPU
    if t.package != "vllm" and importlib.metadata.version(t.package) != t.version:
        found = importlib.metadata.version(t.package)
        raise ValueError(f"{name} needs {t.package} {t.version}, this venv has {found}")
    verify_fn = _verifier(t, source)
    drafter, scenarios = None, None
    if t.mode == "drafter":
        import transformers
        import transformers.generation.candidate_generator  # noqa: F401

        drafter = hf_drafter(transformers, torch, t.options.get("assistant_confidence_threshold"))
        scenarios = drafter_scenarios()
    suite = "engine" if t.suite == "drafter" else t.suite
    if t.suite == "small":
        from .audit import suite_draws

        total = suite_draws("small")
    else:
        from .projections import engine_scenarios

        total = sum(len(s.target) * s.steps for s in scenarios or engine_scenarios())
    verify_fn = _counting(verify_fn, total)
    began = time.perf_counter()
    report = audit_verifier(
        verify_fn, suite=suite, scenarios=scenarios, seed=ENGINE_SEED, drafter=drafter
    )
    seconds = time.perf_counter() - began
    failed = sum(not row["passed"] for row in report.rows)
    extra = {"torch": torch.__version__, "notes": [str(n) for n in report.notes]}
    return entry(t, report.passed, failed, len(report.rows), seconds) | extra


RECORD_FIELDS = {  # the record's fields for each target, and their types
    "name": str,
    "package": str,
    "version": str,
    "function": str,
    "mode": str,
    "suite": str,
    "seed": int,
    "options": dict,
    "expected": str,
    "verdict": str,  # PASSED or FAILED
    "failed": int,  # statistics failed ...
    "statistics": int,  # ... out of this many
    "seconds": float,  # the audit's wall time (the venv's install not included)
}
OPTIONAL_FIELDS = {  # why a target did not run; torch's version; what the run exercised
    "note": str,
    "torch": str,
    "notes": list,
}


def entry(t, passed, failed, statistics, seconds):
    """A target's record entry."""
    fields = asdict(t)
    del fields["venv"]
    return fields | {
        "seed": ENGINE_SEED,
        "verdict": "PASSED" if passed else "FAILED",
        "failed": failed,
        "statistics": statistics,
        "seconds": round(float(seconds), 1),
    }


def check_record(record):
    """ValueError naming the first field that is missing or of the wrong type; the record."""
    for key, kind in (("date", str), ("command", str), ("seconds", float), ("targets", list)):
        if not isinstance(record.get(key), kind):
            raise ValueError(f"record: {key!r} must be a {kind.__name__}")
    for i, item in enumerate(record["targets"]):
        for key, kind in RECORD_FIELDS.items():
            value = item.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"record: targets[{i}][{key!r}] must be a {kind.__name__}")
        for key, kind in OPTIONAL_FIELDS.items():
            if key in item and not isinstance(item[key], kind):
                raise ValueError(f"record: targets[{i}][{key!r}] must be a {kind.__name__}")
        unknown = set(item) - set(RECORD_FIELDS) - set(OPTIONAL_FIELDS)
        if unknown:
            raise ValueError(f"record: targets[{i}] has unknown fields {sorted(unknown)}")
        if item["verdict"] not in ("PASSED", "FAILED", "NOT RUN"):
            raise ValueError(f"record: targets[{i}] verdict {item['verdict']!r}")
        if not 0 <= item["failed"] <= item["statistics"]:
            raise ValueError(
                f"record: targets[{i}] failed {item['failed']} of {item['statistics']}"
            )
    return record


def read_record(path=RECORD):
    """The record make engines wrote, checked."""
    return check_record(json.loads(Path(path).read_text()))


def engine_table(record):
    """The record as chapter 6's table, one row per target: the target with its release, then
    what the prose cites (verdict, statistics failed), then mode, suite, time (s), expected:
    at a phone's width the first column stays pinned and the verdict sits beside it."""
    import pandas as pd

    rows = [
        {
            "target": item["name"],  # its release first: "transformers 4.45.0, assistant ..."
            "verdict": item["verdict"].lower(),
            "statistics failed": f"{item['failed']} of {item['statistics']}",
            "mode": item["mode"],
            "suite": item["suite"],
            "time (s)": float(item["seconds"]),
            "expected": item["expected"],
        }
        for item in check_record(record)["targets"]
    ]
    return pd.DataFrame(rows)


ENGINE_CAPTION = (
    "Released engines' own code, unmodified, through the audit (make engines): the verdict, "
    "the statistics failed out of those run, and the audit's wall time on the machine and day "
    "of the record."
)


def engine_styler(record):
    """engine_table(record) as the book's table (style.table), as chapter 6 shows it."""
    from .style import table

    return table(engine_table(record), ENGINE_CAPTION, formats={"time (s)": "{:.0f}"})


def main(argv=None):
    """python -m specdec.engines NAME [SOURCE]: audit one target, print its entry as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m specdec.engines NAME [VLLM_SOURCE]", file=sys.stderr)
        return 2
    print(json.dumps(run(argv[0], *argv[1:2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
