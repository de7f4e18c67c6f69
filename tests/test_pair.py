"""Chapter 9's trained pair: shipped files, numpy against JAX, tokenizer, generation's law."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specdec.loading
import specdec.pair
import specdec_core as sc
from specdec.pair import WEIGHTS, load_pair, pooled_chi_square, rows_after
from specdec.verify import _verify

ROOT = Path(__file__).resolve().parents[1]
PAIR = load_pair()
V = len(PAIR.vocab)
PROMPT = PAIR.encode(PAIR.heldout_text[2016:2024])
LEVEL = 1e-3  # each law test: a correct sampler fails it with probability 1e-3 (fixed seeds)


def p_value(tokens, law):
    """Pearson's test of two-token draws (n, 2) against a law (V, V), sparse cells pooled."""
    counts = np.bincount(tokens[:, 0] * V + tokens[:, 1], minlength=V * V)
    return pooled_chi_square(counts, law.ravel())[0]


def target_joint(temperature=1.0):
    """The target's law of the two tokens after PROMPT, (V, V)."""
    p1, p2 = rows_after(PAIR.target, PROMPT, temperature)
    return p1[:, None] * p2


# ---- the shipped files -------------------------------------------------------------------------


def test_every_shipped_file_matches_its_manifest_hash_and_the_total_fits_six_megabytes():
    manifest = json.loads((WEIGHTS / "manifest.json").read_text())
    entries = [*manifest["models"].values(), manifest["reference_logits"]]
    for entry in entries:
        digest = hashlib.sha256((WEIGHTS / entry["file"]).read_bytes()).hexdigest()
        assert digest == entry["sha256"], entry["file"]
    corpus = WEIGHTS.parent / manifest["corpus"]["file"]
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() == manifest["corpus"]["sha256"]
    total = corpus.stat().st_size + sum((WEIGHTS / e["file"]).stat().st_size for e in entries)
    assert total <= 6e6, total


def copied(tmp_path):
    """A copy of the weights folder and the corpus beside it, to break."""
    shutil.copytree(WEIGHTS, tmp_path / "weights")
    shutil.copytree(WEIGHTS.parent / "data", tmp_path / "data")
    return tmp_path / "weights"


def test_loading_names_the_file_that_is_missing_corrupt_or_misshapen(tmp_path):
    folder = copied(tmp_path)
    assert load_pair(folder).vocab == PAIR.vocab  # the copy loads: the breakage is what fails
    (folder / "draft1-500.npz").unlink()
    with pytest.raises(ValueError, match="draft1-500.npz is missing"):
        load_pair(folder)
    shutil.copy(WEIGHTS / "draft1-500.npz", folder)
    data = bytearray((folder / "target.npz").read_bytes())
    data[len(data) // 2] ^= 1
    (folder / "target.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="target.npz is corrupt"):
        load_pair(folder)


def test_a_weight_of_the_wrong_shape_is_refused_by_name(tmp_path):
    folder = copied(tmp_path)
    with np.load(folder / "draft1-500.npz") as npz:
        arrays = dict(npz)
    arrays["layer0_w_o"] = arrays["layer0_w_o"][:, :-1]
    np.savez(folder / "draft1-500.npz", **arrays)
    manifest = json.loads((folder / "manifest.json").read_text())
    digest = hashlib.sha256((folder / "draft1-500.npz").read_bytes()).hexdigest()
    manifest["models"]["draft1-500"]["sha256"] = digest
    manifest["manifest_sha256"] = specdec.loading.manifest_digest(manifest)  # rewritten in full
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"draft1-500.npz: array layer0_w_o should have shape"):
        load_pair(folder)


@pytest.mark.parametrize("name", ["target", "draft1-500", "draft1-2000", "draft2-1000"])
def test_numpy_inference_matches_the_stored_jax_logits(name):
    with np.load(WEIGHTS / "reference_logits.npz") as ref:
        ids, expected = ref["ids"], ref[name]
    model = PAIR.target if name == "target" else PAIR.drafts[name]
    model.reset(len(ids), ids.shape[1])
    assert np.abs(model.forward(ids) - expected).max() <= 1e-4
    model.reset(len(ids), ids.shape[1])  # the control: a weight off by 0.1 % is seen
    saved = model.unembed
    model.unembed = saved * 1.001
    try:
        assert np.abs(model.forward(ids) - expected).max() > 1e-4
    finally:
        model.unembed = saved


# ---- the tokenizer ------------------------------------------------------------------------------


def test_encode_and_decode_round_trip_and_refuse_what_is_not_in_the_vocabulary():
    text = PAIR.heldout_text[:500]
    assert PAIR.decode(PAIR.encode(text)) == text
    assert PAIR.encode("").shape == (0,)
    with pytest.raises(ValueError, match=r"\['é', '€'\]"):
        PAIR.encode("café €")
    with pytest.raises(TypeError, match="text must be a str"):
        PAIR.encode(b"abc")
    with pytest.raises(ValueError, match="ids must lie in"):
        PAIR.decode(np.array([0, V]))


# ---- the cache ----------------------------------------------------------------------------------


def test_a_rollback_gives_the_logits_of_a_full_recompute():
    ids = PAIR.encode(PAIR.heldout_text[100:130])[None]
    net = PAIR.target
    net.reset(1, 40)
    net.forward(ids[:, :20])
    net.forward(ids[:, 20:25])
    net.rollback(22)
    cached = net.forward(ids[:, 22:26])
    net.reset(1, 40)
    full = net.forward(ids[:, :26])[:, 22:26]
    assert np.abs(cached - full).max() < 1e-5
    net.reset(1, 40)  # the control: without the rollback the cache holds stale positions
    net.forward(ids[:, :25])
    assert np.abs(net.forward(ids[:, 22:26]) - full).max() > 1e-3


def test_prefill_runs_each_distinct_prompt_once_and_equals_the_full_forward():
    prompts = np.stack([PROMPT, PROMPT[::-1], PROMPT, PROMPT])  # (4, 8): two distinct rows
    a, b = PAIR.drafts["draft2-1000"], sc.load_pair().drafts["draft2-1000"]
    a.reset(4, 12)
    a.prefill(prompts)
    b.reset(4, 12)
    b.forward(prompts)
    nxt = np.arange(4)[:, None]
    assert np.abs(a.forward(nxt) - b.forward(nxt)).max() < 1e-5


# ---- generation's law ----------------------------------------------------------------------------


def test_generate_with_gamma_zero_has_plain_samplings_law():
    rng = np.random.default_rng(5)
    tokens = PAIR.generate(np.tile(PROMPT, (10_000, 1)), 2, 0, rng, draft="draft1-2000")
    assert p_value(tokens, target_joint()) > LEVEL
    assert p_value(tokens, target_joint(0.9)) < LEVEL  # the control: the law at T = 0.9


def test_speculative_generation_through_the_real_models_keeps_the_targets_law():
    rng = np.random.default_rng(6)
    tokens = PAIR.generate(np.tile(PROMPT, (10_000, 1)), 2, 2, rng, draft="draft1-500")
    assert p_value(tokens, target_joint()) > LEVEL


def test_the_same_test_rejects_generation_through_a_broken_verifier(monkeypatch):
    rule = sc.BROKEN_RULES["resample from p"]

    def broken(self, target_probs, draft_probs, draft_tokens, rng):
        return _verify(target_probs, draft_probs, draft_tokens, rng, rule)

    monkeypatch.setattr(specdec.pair.Pair, "_verify", broken)  # the verifier a run calls
    rng = np.random.default_rng(6)
    tokens = PAIR.generate(np.tile(PROMPT, (10_000, 1)), 2, 2, rng, draft="draft1-500")
    assert p_value(tokens, target_joint()) < LEVEL


def test_recording_what_each_call_saw_changes_no_token():
    runs = [
        PAIR.run(np.tile(PROMPT, (50, 1)), 20, 3, np.random.default_rng(8), "bigram", record=r)
        for r in (False, True)
    ]
    assert np.array_equal(runs[0].tokens, runs[1].tokens) and runs[0].betas is None
    assert runs[1].betas.shape == (runs[1].calls, 50, 3)
    with pytest.raises(ValueError, match="record=True"):
        specdec.pair.tokens_per_call(runs[0])


def test_the_enumerated_two_token_law_is_the_targets_for_the_correct_rule_only():
    p1, p2 = rows_after(PAIR.target, PROMPT)
    q1, q2 = rows_after(PAIR.drafts["bigram"], PROMPT)
    joint = p1[:, None] * p2
    assert np.abs(specdec.pair.two_token_law(p1, q1, p2, q2) - joint).max() < 1e-12
    for rule in sc.BROKEN_RULES.values():
        law = specdec.pair.two_token_law(p1, q1, p2, q2, rule)
        assert abs(law.sum() - 1) < 1e-12 and np.abs(law - joint).sum() / 2 > 1e-3


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_tokens=200), "exceeds the 128 positions"),
        (dict(draft="trigram"), "draft must be None or one of"),
        (dict(gamma=-1), "gamma must be a non-negative integer"),
        (dict(temperature=0.0), "temperature must be a positive number"),
        (dict(prompt_ids=np.array([[0, V]])), "prompt_ids must lie in"),
        (dict(prompt_ids=np.zeros((1, 0), int)), "prompt_ids must have shape"),
        (dict(prompt_ids=np.array([[0.5]])), "prompt_ids must be integers"),
        (dict(rng=0), "rng must be a numpy.random.Generator"),
    ],
)
def test_generate_refuses_bad_input_by_name(kwargs, message):
    args = dict(prompt_ids=PROMPT, n_tokens=4, gamma=2, rng=np.random.default_rng(0))
    args |= dict(draft="bigram") | kwargs
    with pytest.raises(ValueError, match=message):
        PAIR.generate(**args)


# ---- training ---------------------------------------------------------------------------------

TRAIN_PYTHON = ROOT / ".venv-train" / "bin" / "python"


@pytest.mark.skipif(
    not TRAIN_PYTHON.exists(), reason="JAX is not installed here: `make train` installs it"
)
def test_a_few_training_steps_of_a_tiny_model_lower_the_loss():
    result = subprocess.run(
        [TRAIN_PYTHON, ROOT / "scripts" / "train_pair.py", "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "smoke OK" in result.stdout, result.stderr[-2000:]


def test_the_book_never_imports_jax():
    code = "import specdec_core as sc, sys; sc.load_pair(); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- tokens per call: the estimators of chapter 9 --------------------------------------------


def iid_run(rates, n_rows, n_tokens=64, seed=0, untested_beta=0.3):
    """A recorded Run whose i-th test in a step keeps its draft w.p. rates[i], independently
    (Equation 1's model when the rates are equal); β is the rate at tested positions,
    untested_beta elsewhere, and min(1, p/q) the rate, so "given the drafts" is the exact
    expectation of every step."""
    rates = np.asarray(rates, float)
    gamma, max_steps = len(rates), n_tokens
    kept = np.random.default_rng(seed).random((max_steps, n_rows, gamma)) < rates
    accepted = np.where(kept.all(-1), gamma, np.argmin(kept, -1))  # leading kept drafts
    before = np.cumsum(accepted + 1, axis=0) - (accepted + 1)  # tokens before each step
    accepted = np.where(before < n_tokens, accepted, -1)
    tested = (accepted[..., None] >= 0) & (np.arange(gamma) <= accepted[..., None])
    betas = np.where(tested, rates, untested_beta)
    ratios = np.broadcast_to(rates, betas.shape)
    return specdec.pair.Run(None, None, accepted, betas, ratios, max_steps)


def test_tokens_per_call_is_free_of_stopping_bias_where_each_rows_own_mean_is_not():
    # Equation 1's model at α = 0.72, γ = 4: 20,000 rows of 64 tokens. The pooled estimate's
    # s.e. is about 0.0025 (0.09 %); each row's own mean is biased by about +1.3 % (simulated
    # with 4,000 × 48 rows: +1.34 % ± 0.03 %), about 15 s.e.: 4 s.e. separates the two.
    run = iid_run([0.72] * 4, 20_000)
    out = specdec.pair.tokens_per_call(run)
    eq1 = sc.expected_tokens(0.72, 4)
    value, se = out["measured"]
    assert abs(value - eq1) <= 4 * se and se < 0.004
    active = run.accepted >= 0
    own_means = (np.where(active, run.accepted + 1, 0).sum(0) / active.sum(0)).mean()
    assert own_means - eq1 > 4 * se  # the control: the per-row mean's stopping bias is seen
    assert out["alpha"][0] == pytest.approx(0.72, abs=1e-12)  # tested positions only
    assert out["alpha, all positions"][0] < 0.7  # the untested positions' β pulled it down
    assert abs(out["given the drafts"][0] - value) <= 4 * out["given the drafts"][1]


def test_acceptance_by_position_passes_equal_rates_and_rejects_rising_ones():
    # seeded; under Eq. 1's model the p-value is uniform, so 1e-3 fails it w.p. 1e-3. With
    # 2,000 rows of 64 tokens each position has over 10,000 tests: a 0.1 gap is over 10 s.e.
    kept, tests, p = specdec.pair.acceptance_by_position(iid_run([0.75] * 4, 2_000, seed=1))
    assert p > LEVEL and (kept <= tests).all() and (np.diff(tests) <= 0).all()
    _, _, p = specdec.pair.acceptance_by_position(iid_run([0.6, 0.7, 0.8, 0.9], 2_000, seed=1))
    assert p < LEVEL


def test_combined_chi_square_adds_the_contexts_and_sees_a_law_off_at_every_one():
    # seeded, 8 contexts × 2,000 draws; a correct sampler fails at 1e-3 w.p. 1e-3. The control
    # moves 0.05 of mass at each context: λ = n·Σ Δ²/p ≈ 540 on 32 degrees of freedom, whose
    # critical value at 1e-3 is about 62, so it is rejected with probability ≈ 1.
    rng = np.random.default_rng(12)
    laws = rng.dirichlet(np.ones(5), size=8)
    counts = np.stack([rng.multinomial(2_000, law) for law in laws])
    p, df = specdec.pair.combined_chi_square(counts, laws)
    assert p > LEVEL and df == sum(pooled_chi_square(c, law)[1] for c, law in zip(counts, laws))
    moved = laws.copy()
    top = moved.argmax(axis=1)
    moved[np.arange(8), top] -= 0.05
    moved[np.arange(8), (top + 1) % 5] += 0.05
    assert specdec.pair.combined_chi_square(counts, moved)[0] < LEVEL
    with pytest.raises(ValueError, match="one shape"):
        specdec.pair.combined_chi_square(counts, laws[:, :4])


def test_stopping_bias_sees_the_rows_own_means_bias_and_the_ratios_small_one():
    # seeded, 400 runs of 48 rows × 64 tokens at α = 0.72, γ = 4: each bias has s.e. ≈ 0.08 %;
    # the rows' own means are biased by ≈ +1.2 % here (+1.34 % ± 0.03 % over 4,000 runs), over
    # 10 s.e.; the ratio of totals by −0.1 % here (+0.07 % ± 0.03 % over 4,000 runs).
    out = specdec.pair.stopping_bias(0.72, 4, 64, 48, 400, np.random.default_rng(3))
    own, own_se = out["rows' own means"]
    ratio, ratio_se = out["ratio of totals"]
    assert own > 10 * own_se and own_se < 0.002
    assert abs(ratio) < own / 4
    with pytest.raises(ValueError, match="alpha must be a number in"):
        specdec.pair.stopping_bias(1.5, 4, 64, 48, 10, np.random.default_rng(3))
    with pytest.raises(ValueError, match="reps must be at least 1"):
        specdec.pair.stopping_bias(0.7, 4, 64, 48, 0, np.random.default_rng(3))


# ---- chapter 9's figures ------------------------------------------------------------------------


def test_a_draft_keeps_its_colour_and_marker_in_every_chapter_9_figure():
    import matplotlib.colors as mcolors
    import pandas as pd

    from specdec import intervals, roofline, roofs

    rng = np.random.default_rng(0)
    hist = specdec.pair.plot_beta_histograms({n: rng.random(50) for n in ("bigram", "draft1-2000")})
    table = pd.DataFrame({"draft": ["bigram", "draft1-2000"], "gamma": [2, 2]})
    table["predicted"], table["speedup"], table["low"], table["high"] = 1.2, 1.3, 1.1, 1.5
    prediction = intervals.plot_prediction(table, "t")
    drawn = [  # (draft, its marker line): the histograms' markers on the mean, the race's points
        (ax.get_title().split(":")[0], line)
        for ax in hist.axes
        for line in ax.get_lines()
        if line.get_marker() not in ("None", "")
    ] + [(c.get_label(), c.lines[0]) for c in prediction.axes[0].containers]
    points = pd.DataFrame(  # the roofline's rows: one model and implementation per line
        [
            {"model": m, "implementation": i, "n": n, "seconds": 1e-3 * n, "flops": n, "bytes": 1}
            for m in ("bigram", "draft1-2000")
            for i in ("numpy", "runtime")
            for n in (1, 5)
        ]
    )
    figure = roofline.plot_roofline(points, roofs.Machine(1e10, 1e10, 1e9, 2**25))
    lines = [  # the measured panels, numpy's then the runtime's
        line
        for ax in figure.axes[:2]
        for line in ax.get_lines()
        if line.get_marker() not in ("None", "")
    ]
    drawn += zip(["bigram", "draft1-2000"] * 2, lines, strict=True)
    assert len(drawn) == 8
    shown = {}  # {draft: {(colour, marker), ...}} over both figures
    for name, line in drawn:
        shown.setdefault(name, set()).add((mcolors.to_hex(line.get_color()), line.get_marker()))
    for name in ("bigram", "draft1-2000"):
        style = specdec.pair.model_style(name)
        assert shown[name] == {(mcolors.to_hex(style["color"]), style["marker"])}, name
    assert shown["bigram"] != shown["draft1-2000"]  # the control: two drafts, two looks
    with pytest.raises(ValueError, match="name must be one of"):
        specdec.pair.model_style("draft9")
