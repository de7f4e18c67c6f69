"""make engines' glue and record (specdec/engines.py), without torch or the engines: the record's
schema, chapter 6's table as the record, the vLLM stubs and loader on a folder shaped like the
wheel's, and the Hugging Face drafter's plumbing with a stand-in generator."""

import copy
import importlib
import json
import sys
import types

import numpy as np
import pytest

import specdec_core as sc
from specdec import engines
from specdec.projections import Scenario, _drafter_of, _zipf

# ---- the record --------------------------------------------------------------------------------


def test_the_record_holds_every_target_with_its_schema():
    record = engines.read_record()
    assert [e["name"] for e in record["targets"]] == [t.name for t in engines.TARGETS]
    for item, t in zip(record["targets"], engines.TARGETS):
        assert (item["package"], item["version"], item["function"]) == (
            t.package,
            t.version,
            t.function,
        )
        assert (item["mode"], item["suite"], item["seed"]) == (t.mode, t.suite, engines.ENGINE_SEED)
        assert item["verdict"] in ("PASSED", "FAILED") and item["statistics"] > 0
    # the controls: a wrong type, a missing field and an unknown one are each refused by name
    for change, word in (
        (lambda e: e.update(failed="3"), "'failed'"),
        (lambda e: e.pop("seed"), "'seed'"),
        (lambda e: e.update(comment="x"), "unknown fields"),
        (lambda e: e.update(failed=e["statistics"] + 1), "failed"),
    ):
        broken = copy.deepcopy(record)
        change(broken["targets"][0])
        with pytest.raises(ValueError, match=word):
            engines.check_record(broken)


def _cells(html):
    """The text of every cell of the first table in html, row by row."""
    from bs4 import BeautifulSoup

    table = BeautifulSoup(html, "html.parser").find("table")
    return [[c.get_text(" ", strip=True) for c in tr.find_all(["td", "th"])] for tr in table("tr")]


@pytest.mark.site
def test_chapter_6_shows_the_record():
    from bs4 import BeautifulSoup
    from test_site import SITE

    page = (SITE / "book" / "ch6_audit.html").read_text(encoding="utf-8")
    soup = BeautifulSoup(page, "html.parser")
    caption = next(c for c in soup("caption") if c.get_text().startswith("Released engines"))
    shown = _cells(str(caption.find_parent("table")))
    record = engines.read_record()
    assert shown == _cells(engines.engine_styler(record).to_html())
    assert record["date"] in soup.get_text()
    # the control: an edited record (one verdict flipped, one time changed) is not this page
    edited = copy.deepcopy(record)
    edited["targets"][0].update(verdict="FAILED", failed=1, seconds=1234.0)
    assert _cells(engines.engine_styler(edited).to_html()) != shown


def test_the_table_reads_each_field_of_the_record():
    record = engines.read_record()
    table = engines.engine_table(record)
    assert len(table) == len(record["targets"])
    first = record["targets"][0]
    assert table["statistics failed"][0] == f"{first['failed']} of {first['statistics']}"
    edited = json.loads(json.dumps(record))
    edited["targets"][0]["failed"] = first["statistics"]  # the control: the cell follows
    assert engines.engine_table(edited)["statistics failed"][0] != table["statistics failed"][0]


# ---- vLLM: stubs and the loader -----------------------------------------------------------------


@pytest.fixture
def clean_modules():
    """Forget the modules and path entries a test adds."""
    before, path = set(sys.modules), list(sys.path)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]
    sys.path[:] = path


def test_stubs_are_importable_and_never_shadow_a_real_module(clean_modules):
    assert engines.install_stubs({"engines_test_stub": {"x": 3}}) == ["engines_test_stub"]
    assert importlib.import_module("engines_test_stub").x == 3
    assert len(engines.VLLM_STUBS) == 2  # vllm.envs and vllm.logger: the count the book states
    with pytest.raises(ValueError, match="json is already imported"):
        engines.install_stubs({"json": {}})  # the control: a real module is never replaced


FAKE_SAMPLER = """import vllm.envs as envs
from vllm.logger import init_logger
from vllm.model_executor.layers.spec_decode_base_sampler import Base

logger = init_logger(__name__)


class RejectionSampler(Base):
    def __init__(self):
        self.flashinfer = envs.VLLM_USE_FLASHINFER_SAMPLER
"""


def test_the_v0_sampler_loads_from_the_wheel_s_two_files(tmp_path, clean_modules):
    layers = tmp_path / "vllm" / "model_executor" / "layers"
    layers.mkdir(parents=True)
    (layers / "rejection_sampler.py").write_text(FAKE_SAMPLER)
    (layers / "spec_decode_base_sampler.py").write_text("class Base:\n    pass\n")
    sampler = engines.vllm_v0_sampler(tmp_path)
    assert type(sampler).__name__ == "RejectionSampler" and sampler.flashinfer is False
    (layers / "spec_decode_base_sampler.py").unlink()  # the control: a file missing
    with pytest.raises(ValueError, match="lacks vllm/model_executor/layers/spec_decode"):
        engines.vllm_v0_sampler(tmp_path)


# ---- Hugging Face: the drafter's plumbing, with stand-ins for torch and transformers -----------


class Tensor:
    """The few tensor methods hf_drafter and assistant_model use, over numpy."""

    def __init__(self, array):
        self.array = np.asarray(array)

    shape = property(lambda self: self.array.shape)

    def __len__(self):
        return len(self.array)

    def __getitem__(self, index):
        return Tensor(self.array[index])

    def expand(self, *shape):
        return Tensor(np.broadcast_to(self.array, shape))

    def clone(self):
        return Tensor(self.array.copy())

    def double(self):
        return Tensor(self.array.astype(np.float64))

    def softmax(self, dim):
        z = np.exp(self.array - self.array.max(axis=dim, keepdims=True))
        return Tensor(z / z.sum(axis=dim, keepdims=True))

    def numpy(self):
        return self.array


class Generator:
    def manual_seed(self, seed):
        self.rng = np.random.default_rng(seed)


fake_torch = types.SimpleNamespace(
    long=np.int64,
    zeros=lambda shape, dtype: Tensor(np.zeros(shape, dtype)),
    ones_like=lambda t: Tensor(np.ones_like(t.array)),
    from_numpy=Tensor,
    default_generator=Generator(),
)


class FakeLM:
    """A causal LM's calling convention: forward hooks see (module, args, kwargs, output)."""

    def __init__(self, config):
        self.config, self.hooks = config, []
        self.generation_config = types.SimpleNamespace(assistant_confidence_threshold=0.4)

    def eval(self):
        return self

    def register_forward_hook(self, hook, with_kwargs):
        self.hooks.append(hook)

    def __call__(self, ids):
        output = types.SimpleNamespace(logits=Tensor(np.zeros((1, ids.shape[1], 7))))
        for hook in self.hooks:
            output = hook(self, (ids,), {}, output)
        return output


def fake_generator(greedy):
    """AssistedCandidateGenerator's calling convention: sample (or argmax, 4.44.2's bug) from
    the assistant's last logits, stop below its confidence threshold, return ids and scores."""

    class Generated:
        def __init__(self, input_ids, assistant_model, generation_config, model_kwargs, **_):
            self.model = assistant_model

        def get_candidates(self, ids):
            ids, scores, config = ids.array, [], self.model.generation_config
            for _ in range(config.num_assistant_tokens):
                logits = self.model(Tensor(ids)).logits.array[0, -1]
                p = np.exp(logits - logits.max())
                p /= p.sum()
                x = p.argmax() if greedy else fake_torch.default_generator.rng.choice(7, p=p)
                ids, scores = np.append(ids, [[x]], axis=1), scores + [logits]
                if p[x] < config.assistant_confidence_threshold:
                    break
            return Tensor(ids), Tensor(np.array(scores)[None])

    return Generated


def fake_transformers(greedy):
    generation = types.SimpleNamespace(
        candidate_generator=types.SimpleNamespace(AssistedCandidateGenerator=fake_generator(greedy))
    )
    return types.SimpleNamespace(
        LlamaConfig=lambda **config: config,
        LlamaForCausalLM=FakeLM,
        GenerationConfig=lambda **config: config,
        LogitsProcessorList=list,
        generation=generation,
    )


def test_the_hf_drafter_hands_the_generator_each_row_in_order():
    rng = np.random.default_rng(5)
    target = _zipf(rng, (1, 4, 7), 1.5)
    scenario = Scenario("V = 7, γ = 3", target, _drafter_of(rng, target[:, :3], 0.6), steps=2000)
    drafter = engines.hf_drafter(fake_transformers(greedy=False), fake_torch, threshold=0.3)
    drafts, q = drafter(np.repeat(scenario.draft, 5, axis=0), np.random.default_rng(0))
    assert drafts.shape == (5, 3) and np.all((drafts >= 0).sum(axis=1) >= 1)
    kept = drafts[:, 0] >= 0
    np.testing.assert_allclose(q[kept, 0], scenario.draft[0, 0][None].repeat(kept.sum(), 0))
    # the whole drafter with the book's exact verify passes; its noise is fresh from rng.
    # A level-1e-3 audit of an exact pair fails with probability ≤ 1e-3 (fixed seed here).
    passed = sc.audit_verifier(sc.verify, scenarios=[scenario], drafter=drafter)
    assert passed.passed, passed
    # the control: the same plumbing with 4.44.2's greedy assistant fails
    greedy = engines.hf_drafter(fake_transformers(greedy=True), fake_torch, threshold=0.3)
    assert not sc.audit_verifier(sc.verify, scenarios=[scenario], drafter=greedy).passed
