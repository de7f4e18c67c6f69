"""Chapter 9's clock: the ONNX Runtime twin equals the numpy reference, and the race's parts."""

import copy
import time

import numpy as np
import pandas as pd
import pytest

import specdec_core as sc
from specdec import intervals, race, roofs
from specdec.runtime import RuntimeTransformer
from specdec.transformer import Config, TinyTransformer

# Both paths compute in float32 and sum in other orders. Measured against a float64 forward
# pass of the same weights, each is off by up to 1.2e-5 on the shipped models (logits up to 14,
# where float32's spacing is 9.5e-7): so the two may differ by twice that, and no tighter
# absolute bound than about 2.5e-5 holds for two float32 implementations.
LOGIT_TOLERANCE = 2.5e-5


def _logits(model, ids, split):
    """Logits of ids (B, T) in two calls: a prefill of the first `split`, then the rest."""
    model.reset(len(ids), ids.shape[1])
    model.prefill(ids[:, :split])
    return model.forward(ids[:, split:])


@pytest.mark.parametrize("name", ["target", "draft1-500", "draft1-2000", "draft2-1000"])
def test_runtime_logits_equal_numpy_for_every_model_at_several_prompts(pair, twin, name):
    ref = pair.target if name == "target" else pair.drafts[name]
    run = twin.target if name == "target" else twin.drafts[name]
    text = pair.heldout_text
    for start, length, split in [(0, 9, 1), (5_000, 40, 33), (60_000, 128, 120)]:
        ids = np.stack([pair.encode(text[s : s + length]) for s in (start, start + 777)])
        a, b = _logits(ref, ids, split), _logits(run, ids, split)
        assert a.shape == b.shape and b.dtype == np.float32
        assert np.abs(a - b).max() < LOGIT_TOLERANCE


def test_the_tolerance_catches_a_runtime_built_from_other_weights(pair):
    """Negative control: a twin of a model with one weight nudged by 1e-3 differs past it."""
    ref = pair.drafts["draft1-2000"]
    embed = ref.embed.copy()
    embed[:, 0] += 1e-3
    other = RuntimeTransformer(
        ref.config, 1, (embed, ref.position, ref.layers, ref.final_norm, ref.unembed)
    )
    ids = pair.encode(pair.heldout_text[:20])[None]
    assert np.abs(_logits(ref, ids, 10) - _logits(other, ids, 10)).max() > LOGIT_TOLERANCE


@pytest.mark.parametrize("draft, gamma", [(None, 1), ("bigram", 3), ("draft1-2000", 4)])
def test_a_seeded_run_is_token_identical_through_both_paths(pair, twin, draft, gamma):
    prompts = np.stack([pair.encode(pair.heldout_text[s : s + 12]) for s in (100, 9_000, 50_000)])
    a = pair.run(prompts, 70, gamma, np.random.default_rng(4), draft)
    b = twin.run(prompts, 70, gamma, np.random.default_rng(4), draft)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.accepted, b.accepted)
    control = twin.run(prompts, 70, gamma, np.random.default_rng(5), draft)  # another seed
    assert not np.array_equal(a.tokens, control.tokens)


def test_the_runtime_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="float32"):
        RuntimeTransformer(Config(d_model=8, n_layers=1, n_heads=2, dtype="float64"))
    with pytest.raises(TypeError, match="TinyTransformer"):
        RuntimeTransformer.twin("not a model")
    small = RuntimeTransformer(Config(d_model=8, n_layers=1, n_heads=2, max_len=4))
    with pytest.raises(ValueError, match="cache holds"):
        small.forward(np.zeros((1, 5), dtype=np.int64))


def test_random_weights_also_agree_at_engine_width():
    """A wider random model (d = 256, 2 layers), cache in use: no size is built in."""
    ref = TinyTransformer(Config(d_model=256, n_layers=2, n_heads=4, max_len=64))
    ids = np.random.default_rng(0).integers(0, ref.config.n_inputs, (3, 30))
    a, b = _logits(ref, ids, 17), _logits(RuntimeTransformer.twin(ref), ids, 17)
    assert np.abs(a - b).max() < LOGIT_TOLERANCE * max(1.0, float(np.abs(a).max()))


def test_replay_retraces_the_run_and_a_changed_run_is_caught(twin):
    prompt = twin.encode(twin.heldout_text[300:316])
    seconds, steps = race.loop_overhead(twin, "draft1-2000", 3, prompt, 40, seed=2, repeats=1)
    assert seconds > 0 and 40 / 4 <= steps <= 40
    replayed = race._replayed(twin, "draft1-2000")
    first = replayed.run(prompt, 40, 3, np.random.default_rng(2), "draft1-2000")
    for model in (replayed.target, replayed.drafts["draft1-2000"]):
        model.replay()
    again = replayed.run(prompt, 40, 3, np.random.default_rng(2), "draft1-2000")
    assert np.array_equal(first.tokens, again.tokens)
    for model in (replayed.target, replayed.drafts["draft1-2000"]):
        model.replay()
    other = replayed.run(prompt, 40, 3, np.random.default_rng(3), "draft1-2000")  # control
    assert not np.array_equal(first.tokens, other.tokens)


def test_a_replayed_call_reads_its_models_weights_and_the_loop_time_leaves_it_out(twin):
    """Each replayed call reads as many floats as the model's weights, and that read is kept
    out of o; a real call's eviction of the caches is what it stands for."""
    replayed = race._replayed(twin, "draft1-2000", evict=True)
    assert replayed.target.buffer.size == roofs.matrix_weights(twin.target.config)
    prompt = twin.encode(twin.heldout_text[300:316])
    replayed.run(prompt, 8, 3, np.random.default_rng(2), "draft1-2000")
    replayed.target.replay()
    replayed.drafts["draft1-2000"].replay()
    run = replayed.run(prompt, 8, 3, np.random.default_rng(2), "draft1-2000")
    assert len(replayed.target.seconds) == run.calls  # one timed read per replayed call
    assert race._replayed(twin, None).target.buffer.size == 0  # the control: no read


def test_the_loop_runs_slower_after_a_call_that_evicts_the_caches(twin, monkeypatch):
    """The cause of the in-run loop time above a warm replay's: on the large target, plain
    decoding's time outside the calls was 3 to 4 times a warm replay's when each replayed call
    read 50 MB (0.16–0.19 against 0.04–0.05 ms a token, quiet). Here each replayed call reads
    64 MiB, past this machine's 32 MiB L3; the control reads 1 KiB, which evicts nothing.
    Each o is the least of three medians: warm medians alone ranged 0.033–0.082 ms, reads of
    64 MiB 0.19–0.27 ms, with a second process on the other core too. The threshold, twice
    the warm time, sits between the two. The control must lie nearer the warm time than the
    64 MiB one: under a full test run it once read 0.070 ms against a warm 0.033."""
    prompt = twin.encode(twin.heldout_text[300:316])

    def o(floats):
        monkeypatch.setattr(race, "matrix_weights", lambda config: floats)
        return min(
            race.loop_overhead(twin, None, 1, prompt, 40, seed=2, repeats=5)[0] for _ in range(3)
        )

    warm = race.loop_overhead(twin, None, 1, prompt, 40, seed=2, repeats=5, evict=False)[0]
    warm = min(warm, o(0))  # no read at all
    evicted = o(16 * 2**20)  # 64 MiB a call
    assert evicted > 2 * warm
    assert o(256) < (warm + evicted) / 2  # the control: 1 KiB a call


def _burn(seconds):
    """Spend this thread's CPU for `seconds`."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _SlowCalls:
    """A model whose every forward call also burns 2 ms of CPU, inside the call."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, ids):
        _burn(2e-3)
        return self.model.forward(ids)


# Fixed costs to price a race against: T(1) 1 ms, T(4) 1.5 ms, a draft call 0.2 ms alone and a
# step's three 0.7 ms (so a part priced at γ·c instead of as a step makes them is caught), prefills
COSTS = race.Costs({1: 1e-3, 4: 1.5e-3}, {"draft1-2000": 2e-4}, {"target": 0.01,
                   "draft1-2000": 0.005}, {("draft1-2000", 3): 7e-4})  # fmt: skip


def _parts(twin):
    """`miss_parts` of a small race of draft1-2000 at γ = 3 on twin, against fixed costs."""
    prompts = race.prompts_from(twin, 2, 16, offset=30_000)
    rows = race.race(twin, [("draft1-2000", 3)], prompts, 24, 2)
    return rows, race.miss_parts(rows, COSTS, 1e-4, 3e-4, 0.8, "draft1-2000", 3, 24)


def test_miss_parts_sum_to_the_measured_over_the_predicted(twin):
    """The speculative parts sum to the run's measured/predicted − 1, the plain parts likewise,
    so their ratio is the measured speedup (of mean times) over `predict`'s, to rounding."""
    rows, parts = _parts(twin)
    predicted = race.predict(COSTS, 1e-4, 3e-4, 0.8, "draft1-2000", 3, 24)
    spec = sum(parts[k] for k in race.SPEC_PARTS)
    plain = sum(parts[k] for k in race.MISS_PARTS) - spec
    measured = rows.plain.mean() / rows.seconds.mean()
    assert (1 + plain) / (1 + spec) == pytest.approx(measured / predicted, rel=1e-12)
    plain_predicted = 0.01 + 24 * (1e-3 + 1e-4)  # prefill, then N·(T(1) + o_plain)
    calls = (rows["plain target s"].mean() - 24 * 1e-3) / plain_predicted
    assert parts["plain calls"] == pytest.approx(calls, rel=1e-12)
    assert (rows[["target s", "draft s", "prefill s"]].sum(axis=1) < rows.seconds).all()
    # with tokens per call given (as the race's prediction has them), N / tokens steps
    args = (COSTS, 1e-4, 3e-4, 0.8, "draft1-2000", 3, 24)
    given = race.miss_parts(rows, *args, tokens=2.5)
    spec = sum(given[k] for k in race.SPEC_PARTS)
    plain = sum(given[k] for k in race.MISS_PARTS) - spec
    ratio = measured / race.predict(*args, tokens=2.5)
    assert (1 + plain) / (1 + spec) == pytest.approx(ratio, rel=1e-12)
    assert ratio != pytest.approx(measured / predicted, rel=1e-3)  # the control: they differ


def test_each_price_moves_only_its_own_part():
    """On fixed synthetic rows, each part compared in seconds (its share times its predicted
    run): a different α moves only the steps' excess, and a different prefill only the
    prefills'. Swapping the steps with the target calls, or the plain loop with the plain
    prefill, fails this."""
    rows = pd.DataFrame({"draft": "draft1-2000", "gamma": 3, "seconds": [0.04, 0.05],
                         "target s": [0.02, 0.025], "draft s": [0.006, 0.007],
                         "prefill s": [0.012, 0.013], "plain": [0.05, 0.052],
                         "plain target s": [0.027, 0.028], "plain prefill s": [0.01, 0.011],
                         "calls": [8, 9]})  # fmt: skip

    def seconds(alpha=0.8, prefill=0.01):
        """{part: its excess in seconds} at these prices."""
        costs = COSTS._replace(prefill={"target": prefill, "draft1-2000": 0.005})
        steps = intervals.expected_steps(alpha, 3, 24)
        spec = prefill + 0.005 + steps * (7e-4 + 1.5e-3 + 3e-4)  # the predicted runs
        plain = prefill + 24 * (1e-3 + 1e-4)
        got = race.miss_parts(rows, costs, 1e-4, 3e-4, alpha, "draft1-2000", 3, 24)
        return {k: got[k] * (spec if k in race.SPEC_PARTS else plain) for k in got}

    base, other, moved = seconds(), seconds(alpha=0.5), seconds(prefill=0.02)
    assert abs(other["steps"] - base["steps"]) > 1e-3  # S(N) grows as α falls
    for k in race.MISS_PARTS[1:]:
        assert other[k] == pytest.approx(base[k], rel=1e-12, abs=1e-15)
    changed = {k for k in race.MISS_PARTS if moved[k] != pytest.approx(base[k], rel=1e-12)}
    assert changed == {"prefills", "plain prefill"}
    assert moved["plain prefill"] == pytest.approx(base["plain prefill"] - 0.01, rel=1e-12)


def test_miss_parts_put_a_slow_draft_call_in_the_draft_calls_and_a_slow_loop_in_the_loop(twin):
    """2 ms burnt inside every draft call must raise the draft calls' part by what it burnt,
    and leave the loop's part alone; the control burns 2 ms in the loop's verifier instead,
    and the same parts must show it the other way round. The seeds fix the tokens, so the
    calls are the same; a run's parts vary by well under a millisecond a step here, against
    2 ms × 3 draft calls (slow draft) or 2 ms (slow loop) a step (six races of `_parts` varied
    by 0.15-0.18 ms a step): thresholds at 0.7 of the burnt share, and at 0.3 of the loop's
    2 ms for what must stay, leave that noise room on either side."""
    rows, base = _parts(twin)
    slow_draft = race._with_models(twin, twin.target, {"draft1-2000": _SlowCalls(
        twin.drafts["draft1-2000"])})  # fmt: skip
    rows_d, drafted = _parts(slow_draft)
    slow_loop = copy.copy(twin)
    slow_loop._verify = lambda *args: (_burn(2e-3), twin._verify(*args))[1]
    rows_l, looped = _parts(slow_loop)
    assert (rows_d.calls.values == rows.calls.values).all()
    assert (rows_l.calls.values == rows.calls.values).all()
    spec = rows.seconds.mean() / (1 + sum(base[k] for k in race.SPEC_PARTS))  # predicted
    burnt_d = 3 * rows.calls.mean() * 2e-3 / spec  # three draft calls a step
    burnt_l = rows.calls.mean() * 2e-3 / spec  # one verify a step
    assert drafted["draft calls"] - base["draft calls"] > 0.7 * burnt_d
    assert abs(drafted["loop"] - base["loop"]) < 0.3 * burnt_l  # under 0.6 ms a step
    assert looped["loop"] - base["loop"] > 0.7 * burnt_l  # the control, the other way round
    assert abs(looped["draft calls"] - base["draft calls"]) < 0.3 * burnt_l


def test_run_overhead_counts_the_loops_time_and_not_the_calls(twin):
    """o from a real run: 2 ms burnt in every verify call of the loop must raise it by about
    2 ms a step; the control burns 2 ms inside every draft call, which o must leave out. A
    run's o varies by well under 0.5 ms a step here (the noise of `_parts` above), so the
    thresholds sit at 0.7 and 0.3 of the 2 ms."""
    prompt, draft = twin.encode(twin.heldout_text[300:316]), "draft1-2000"
    base, steps = race.run_overhead(twin, draft, 3, prompt, 24, seed=2)
    slow_loop = copy.copy(twin)
    slow_loop._verify = lambda *args: (_burn(2e-3), twin._verify(*args))[1]
    looped, same = race.run_overhead(slow_loop, draft, 3, prompt, 24, seed=2)
    slow_draft = race._with_models(twin, twin.target, {draft: _SlowCalls(twin.drafts[draft])})
    drafted = race.run_overhead(slow_draft, draft, 3, prompt, 24, seed=2)[0]
    assert same == steps and 24 / 4 <= steps <= 24  # the seed fixes the run
    assert looped - base > 0.7 * 2e-3
    assert abs(drafted - base) < 0.3 * 2e-3  # the control: time inside a call is not o


def test_predict_is_theorem_3_8_when_calls_are_all_that_costs():
    """With v = 1, no overhead, no prefill and Equation 1's tokens per call, the prediction is
    Theorem 3.8 exactly."""
    costs = race.Costs({1: 1.0, 5: 1.0}, {"d": 0.1}, {"target": 0.0, "d": 0.0})
    e = sc.expected_tokens(0.7, 4)
    got = race.predict(costs, 0.0, 0.0, 0.7, "d", 4, 100, tokens=e)
    assert got == pytest.approx(sc.walltime_speedup(0.7, 4, 0.1), rel=1e-12)
    slower = race.Costs({1: 1.0, 5: 1.5}, {"d": 0.1}, {"target": 0.0, "d": 0.0})  # control
    assert race.predict(slower, 0.0, 0.0, 0.7, "d", 4, 100, tokens=e) < got


def test_the_prompt_interval_covers_a_known_ratio_and_not_a_wrong_one():
    """Synthetic runs whose true speedup is 2: plain times ~ 2 s, speculative ~ 1 s, noise 5 %.
    A 95 % t-interval from 4 prompts × 6 repeats must cover 2 and exclude 1.8 (a prompt's log
    speedup has s.d. about 0.029, so the interval reaches about ±0.05 around 2)."""
    rng = np.random.default_rng(0)
    rows = pd.DataFrame(
        [
            {
                "prompt": p,
                "repeat": r,
                "draft": "d",
                "gamma": 2,
                "plain": 2 * (1 + 0.05 * rng.standard_normal()),
                "seconds": 1 + 0.05 * rng.standard_normal(),
                "calls": 10,
            }
            for p in range(4)
            for r in range(6)
        ]
    )
    speedup, low, high = intervals.prompt_interval(*intervals._grid(rows))
    assert low < 2 < high and not low < 1.8 < high
    assert low < speedup < high


@pytest.fixture(scope="module")
def large():
    return sc.load_pair(target="target-large")


def test_the_large_target_loads_past_the_l3_and_its_runtime_twin_agrees(large):
    cfg = large.target.config
    assert (cfg.n_layers, cfg.d_model) == (4, 512)
    assert roofs.matrix_weights(cfg) * 4 > 32 * 2**20  # float32 weights larger than a 32 MiB L3
    assert large.drafts.keys() == sc.load_pair().drafts.keys()  # the same drafts
    ids = np.stack([large.encode(large.heldout_text[s : s + 50]) for s in (0, 30_000)])
    fast = RuntimeTransformer.twin(large.target)
    assert np.abs(_logits(large.target, ids, 41) - _logits(fast, ids, 41)).max() < LOGIT_TOLERANCE


def test_load_pair_names_the_targets_it_knows():
    with pytest.raises(ValueError, match="target must be one of"):
        sc.load_pair(target="huge")


def test_predict_and_race_fills_its_table_without_using_the_race(twin, monkeypatch):
    """A tiny run end to end: each setting has a prediction with its band, a measurement inside
    its own interval, and the verdict comes from fresh prompts with a simulated coverage. The
    costs (c) and the loop's overhead (o) are timed between the race's prompts, never inside
    a prompt's runs (r)."""
    order = []

    def logged(fn, mark):
        def wrapper(*args, **kwargs):
            order.append(mark)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(race, "replayed_costs", logged(race.replayed_costs, "c"))
    monkeypatch.setattr(race, "run_overhead", logged(race.run_overhead, "o"))
    monkeypatch.setattr(race, "_timed", logged(race._timed, "r"))
    result = race.predict_and_race(
        twin, ["bigram"], [2], n_tokens=8, n_prompts=2, repeats=2, alpha_rows=4
    )
    # three measurements of each over two prompts: two before the first, one before the second
    # (o for plain decoding and the setting, each a clocked run: "or"); each prompt's runs are
    # plain, setting, plain for each of 2 repeats; then the fresh race
    o = "or"
    assert "".join(order) == "cc" + o * 4 + "r" * 6 + "c" + o * 2 + "r" * 6 + "r" * 12
    assert len(result.t1_each) == 3
    (row,) = result.table.itertuples()
    above = result.table["above cap"].iloc[0]  # measured above its costs' cap: left whole
    assert 0 < row.predicted <= 3 and 0 < row.low <= row.speedup <= row.high
    assert row.high <= row.cap or (above and row.speedup > row.cap)
    assert 0 < row._asdict()["α"] < 1 and result.verdict.draft == "bigram"
    assert result.table["predicted from"].iloc[0] <= row.predicted
    assert set(result.fresh.prompt) == {0, 1} and 0 <= result.coverage <= 1
    assert "measured speedup" in race.verdict_line(result)
    assert result.table["o, s.d."].iloc[0] >= 0  # o timed on 3 of α's prompts, its spread
    # the prediction takes tokens per call from untimed runs on α's prompts, the comparison
    # Equation 1's i.i.d. chain at the sampled α; they differ (the control)
    o, t = result.table.o.iloc[0] * result.costs.t1, result.table["tokens, untimed"].iloc[0]
    at = (result.costs, result.o_plain, o, row._asdict()["α"], "bigram", 2, 8)
    assert row.predicted == pytest.approx(race.predict(*at, tokens=t), rel=1e-9)
    assert result.table["predicted, i.i.d."].iloc[0] == pytest.approx(race.predict(*at))
    assert race.predict(*at) != pytest.approx(race.predict(*at, tokens=t), rel=1e-9)
    with pytest.raises(ValueError, match="too short"):
        race.prompts_from(twin, 10**6, 16)
    with pytest.raises(ValueError, match="overhead_prompts"):
        race.predict_and_race(twin, ["bigram"], [2], 8, alpha_rows=4, overhead_prompts=5)
    with pytest.raises(ValueError, match="alpha_rows"):
        race.predict_and_race(twin, ["bigram"], [2], 8, alpha_rows=1, overhead_prompts=1)


def test_a_steps_draft_calls_replace_gamma_c_in_the_prediction_where_measured():
    """Costs.drafting is the in-step time where measured, γ·c elsewhere; predict charges it, and
    tokens measured apart from the race replace Equation 1's E."""
    base = race.Costs({1: 1.0, 5: 1.0}, {"d": 0.1}, {"target": 0.0, "d": 0.0})
    cold = base._replace(in_step={("d", 4): 0.8})  # the draft's calls after a target call
    assert base.drafting("d", 4) == pytest.approx(0.4) and cold.drafting("d", 4) == 0.8
    assert cold.drafting("d", 3) == pytest.approx(0.3)  # not measured at γ = 3: γ·c
    warm = race.predict(base, 0.0, 0.0, 0.7, "d", 4, 100)
    assert race.predict(cold, 0.0, 0.0, 0.7, "d", 4, 100) < warm  # the control: it is charged
    e = intervals.finite_tokens_per_call(0.7, 4, 100)  # what the prediction uses without tokens
    assert race.predict(base, 0.0, 0.0, 0.7, "d", 4, 100, tokens=e) == pytest.approx(warm)
    assert race.predict(base, 0.0, 0.0, 0.7, "d", 4, 100, tokens=e - 0.5) < warm


def test_a_replay_makes_a_runs_calls_again_and_times_each(twin):
    """The replay of an untimed run's calls makes the same calls in the same order: as many
    target calls as the run's steps, each scoring γ + 1 positions, and γ draft calls a step,
    each timed."""
    prompt = twin.encode(twin.heldout_text[300:316])
    log = race.recorded_calls(twin, "draft1-2000", 3, prompt, 24, seed=2)
    run = twin.run(prompt, 24, 3, np.random.default_rng(2), "draft1-2000")
    target = [args[0].shape[1] for key, name, args in log if (key, name) == ("target", "forward")]
    assert target == [4] * run.calls  # the control: another seed's run has other steps
    other = race.recorded_calls(twin, "draft1-2000", 3, prompt, 24, seed=3)
    assert sum(1 for k, name, _ in other if (k, name) == ("target", "forward")) != run.calls
    got = race.replay_calls(twin, log)
    assert len(got["target"][0]) == run.calls and len(got["draft1-2000"][0]) == 3 * run.calls
    assert got["target"][1] > 0 and all(t > 0 for t in got["target"][0])


def test_replayed_costs_charge_a_slow_target_call_to_the_target(twin, monkeypatch):
    """5 ms burnt inside every target call raises T(1) and T(4) by 5 ms and leaves a draft
    call's cost where it was; burnt inside every draft call instead (the control), it raises c
    and leaves T(n). One threshold judges both: a rise of more than 2.5 ms, half the burn. A
    call here takes under 1 ms alone; under a full test run one has read 1.0 ms against 0.48 ms
    between two replays, so the threshold leaves a call room to triple."""
    prompt = twin.encode(twin.heldout_text[300:316])
    logs = {s: [race.recorded_calls(twin, *s, prompt, 24, seed=2)]
            for s in [(None, 1), ("draft1-2000", 3)]}  # fmt: skip
    base = race.replayed_costs(twin, logs)
    assert set(base.target) == {1, 4} and set(base.in_step) == {("draft1-2000", 3)}

    def burning(forward):
        return lambda ids: (_burn(5e-3), forward(ids))[1]

    for burnt in (twin.target, twin.drafts["draft1-2000"]):
        with monkeypatch.context() as m:
            m.setattr(burnt, "forward", burning(burnt.forward))
            slow = race.replayed_costs(twin, logs)
        in_target = burnt is twin.target
        for n in (1, 4):
            assert (slow.target[n] - base.target[n] > 2.5e-3) == in_target
        rise = slow.draft["draft1-2000"] - base.draft["draft1-2000"]
        assert (rise > 2.5e-3) != in_target


class _SlotsBurner:
    """A stub model whose forward call burns 10 µs of thread time per cache slot, or 1 ms
    whatever the slots (the control)."""

    def __init__(self, per_slot=True):
        self.per_slot, self.width = per_slot, 0

    def reset(self, batch, width):
        self.width = width

    def prefill(self, ids):
        pass

    def rollback(self, lengths):
        pass

    def forward(self, ids):
        _burn(1e-5 * self.width if self.per_slot else 1e-3)


def test_slots_ratio_sees_a_call_that_grows_with_its_cache():
    """100 slots against 50: a call burning 10 µs a slot takes 2× as long (the median of 20
    paired ratios, each off by a clock read, about 1 µs in 500); one burning 1 ms takes 1×.
    The bounds 1.8-2.2 and 0.9-1.1 leave room for a scheduler's tick in a few of the pairs."""
    ids = np.arange(10)
    assert 1.8 < race.slots_ratio(_SlotsBurner(), ids, 4, (50, 100), calls=20) < 2.2
    assert 0.9 < race.slots_ratio(_SlotsBurner(False), ids, 4, (50, 100), calls=20) < 1.1


def test_untimed_tokens_per_call_follow_the_drafts_alpha(pair):
    """Tokens per call of untimed runs lie in [1, γ + 1] and rise with the draft's α (unigram
    0.24, bigram 0.44, draft1-2000 0.72 against the small target). 16 rows of 32 tokens: over
    seeds 0 to 2 each value moved by at most 0.16 (bigram, 1.60 to 1.76), and the gaps between
    the three were 0.3 and more."""
    prompts = np.stack(race.prompts_from(pair, 16, 16, offset=60_000, spacing=1_500))
    settings = [("unigram", 4), ("bigram", 4), ("draft1-2000", 4)]
    got = race.untimed_tokens_per_call(pair, settings, prompts, 32, seed=0)
    values = [got[s][0] for s in settings]
    assert all(1 <= v <= 5 for v in values)
    assert values == sorted(values) and values[2] - values[0] > 1  # the control: α orders them


def test_untimed_tokens_per_calls_standard_error_is_their_spread_over_seeds(pair):
    """One prompt in every row makes the rows i.i.d.: over 30 seeds, the spread of the untimed
    tokens per call (12 rows of 32 tokens, bigram at γ = 3) matches the mean reported s.e. An
    s.d. from 30 values has a relative s.e. of 1/sqrt(58) = 0.13, so the ratio must lie in
    [0.6, 1.5] (beyond 3 of those). The control, the s.e. of one row (forgetting the 1/sqrt(B)),
    is 3.5 times too wide and fails the same check."""
    prompts = np.stack([pair.encode(pair.heldout_text[300:316])] * 12)
    got = [race.untimed_tokens_per_call(pair, [("bigram", 3)], prompts, 32, s)["bigram", 3]
           for s in range(30)]  # fmt: skip
    tokens, se = np.array(got).T
    assert 1 < tokens.mean() < 4

    def matches(reported):
        return 0.6 <= tokens.std(ddof=1) / reported.mean() <= 1.5

    assert matches(se) and not matches(se * np.sqrt(12))


def uniforms_drawn(work, rng):
    """How many doubles work() drew from rng (PCG64: one 64-bit output per double)."""
    before = copy.deepcopy(rng)
    work()
    for n in range(1000):
        if before.bit_generator.state == rng.bit_generator.state:
            return n
        before.random()
    raise AssertionError("work drew more than 1,000 uniforms")


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_the_method_floor_draws_what_a_step_of_the_loop_draws(pair, gamma):
    """method_work's step draws 2γ + 1 uniforms, as a step of a one-row run does (γ draft draws,
    γ ratio tests, one final token), and its plain token one; verify alone is the control."""
    rng = np.random.default_rng(5)
    step, token = race.method_work(len(pair.vocab), gamma, rng)
    assert uniforms_drawn(step, rng) == 2 * gamma + 1 and uniforms_drawn(token, rng) == 1
    prompt, runs = pair.encode(pair.heldout_text[300:316]), []
    run = lambda: runs.append(pair.run(prompt, 24, gamma, rng, "draft1-2000"))  # noqa: E731
    drawn = uniforms_drawn(run, rng)
    assert drawn == runs[0].calls * (2 * gamma + 1)
    assert drawn != runs[0].calls * (gamma + 1)  # the control
    p, q = (np.full((1, n, len(pair.vocab)), 1 / len(pair.vocab)) for n in (gamma + 1, gamma))
    tokens = np.zeros((1, gamma), dtype=np.int64)
    verify_only = lambda: sc.verify(p, q, tokens, rng)  # noqa: E731  the control
    assert uniforms_drawn(verify_only, rng) == gamma + 1


def test_method_work_refuses_bad_sizes_naming_them():
    rng = np.random.default_rng(0)
    for args, name in [((0, 2, rng), "vocab"), ((65, 0, rng), "gamma"), ((65, 2.5, rng), "gamma"),
                       ((65, 2, 7), "rng"), ((10**9, 4, rng), "method_work")]:  # fmt: skip
        with pytest.raises((ValueError, TypeError), match=name):
            race.method_work(*args)
    for kwargs, name in [({"repeats": 0}, "repeats"), ({"number": 10**7}, "number")]:
        with pytest.raises(ValueError, match=name):
            race.method_floor(65, 2, **kwargs)


def test_method_ceilings_predict_each_setting_with_its_own_tokens_and_the_floor(monkeypatch):
    """Each row is `predict` with o cut to its own γ's floor and o_plain to the plain floor, at
    its own setting's τ from untimed runs: a stub floor (no timing) makes each input visible,
    and the i.i.d. chain's τ, another setting's τ, the two floors swapped, or one γ's floor for
    another's (the controls) each change the value."""
    monkeypatch.setattr(race, "method_floor", lambda vocab, g, number, repeats: (g * 1e-4, 1e-5))
    costs = race.Costs({1: 1e-3, 3: 1.1e-3, 5: 1.3e-3}, {"a": 1e-4, "b": 2e-4},
                       {"target": 0.0, "a": 0.0, "b": 0.0})  # fmt: skip
    table = pd.DataFrame({"draft": ["a", "b"], "gamma": [2, 4], "tokens, untimed": [1.8, 2.9]})
    result = race.Result(table, None, costs, 0.0, {"a": (0.5, 0.0), "b": (0.8, 0.0)}, None, 0.0)
    got = race.method_ceilings(result, 65, 40)
    assert list(got.draft) == ["a", "b"] and list(got.gamma) == [2, 4]
    assert list(got.floor) == pytest.approx([0.2, 0.4]) and list(got["plain floor"]) == [0.01] * 2
    assert list(got["floor s"]) == [2e-4, 4e-4] and list(got["plain floor s"]) == [1e-5] * 2
    for row in got.to_dict("records"):
        d, g = row["draft"], row["gamma"]
        tokens, other_tokens, other_g = {"a": 1.8, "b": 2.9}[d], {"a": 2.9, "b": 1.8}[d], 6 - g
        right = race.predict(costs, 1e-5, g * 1e-4, 0.5, d, g, 40, tokens)
        assert row["ceiling"] == pytest.approx(right, rel=1e-12)
        for wrong in [
            race.predict(costs, 1e-5, g * 1e-4, result.alpha[d][0], d, g, 40),  # i.i.d. τ
            race.predict(costs, 1e-5, g * 1e-4, 0.5, d, g, 40, other_tokens),
            race.predict(costs, g * 1e-4, 1e-5, 0.5, d, g, 40, tokens),
            race.predict(costs, 1e-5, other_g * 1e-4, 0.5, d, g, 40, tokens),
        ]:
            assert row["ceiling"] != pytest.approx(wrong, rel=1e-3)
    with pytest.raises(TypeError, match="result"):
        race.method_ceilings(table, 65, 40)
    with pytest.raises(ValueError, match="n_tokens"):
        race.method_ceilings(result, 65, 0)


def test_the_ladder_changes_the_prediction_step_by_step_down_to_theorem_3_8():
    """`ladder`'s rows, at made-up costs where every part weighs: the first is the setting's
    prediction, each next one `predict` with one more change, and the last Theorem 3.8 at the
    mean draft call's c, to 12 digits. The controls: the two floors swapped, and a ladder that
    stops short of τ = E, each miss their rows."""
    costs = race.Costs({1: 1e-3, 4: 1.4e-3}, {"d": 1e-4}, {"target": 5e-3, "d": 1e-3},
                       {("d", 3): 4e-4})  # fmt: skip
    table = pd.DataFrame({"draft": ["d"], "gamma": [3], "o": [0.3], "tokens, untimed": [2.6]})
    result = race.Result(table, None, costs, 2e-5, {"d": (0.8, 0.01)}, None, 0.0)
    floors = pd.DataFrame(
        {"draft": ["d"], "gamma": [3], "floor s": [1e-4], "plain floor s": [1e-5]}
    )
    got = race.ladder(result, "d", 3, floors, 40)
    assert list(got.index) == list(race.LADDER)
    zero = costs._replace(prefill={"target": 0.0, "d": 0.0})
    flat = zero._replace(target={1: 1e-3, 4: 1e-3})
    want = [
        race.predict(costs, 2e-5, 3e-4, 0.8, "d", 3, 40, 2.6),
        race.predict(costs, 1e-5, 1e-4, 0.8, "d", 3, 40, 2.6),
        race.predict(costs, 0, 0, 0.8, "d", 3, 40, 2.6),
        race.predict(zero, 0, 0, 0.8, "d", 3, 40, 2.6),
        race.predict(flat, 0, 0, 0.8, "d", 3, 40, 2.6),
        race.predict(flat._replace(in_step=None), 0, 0, 0.8, "d", 3, 40, 2.6),
        sc.walltime_speedup(0.8, 3, 0.1),
    ]
    assert list(got) == pytest.approx(want, rel=1e-12)
    assert len(set(np.round(want, 6))) == len(want)  # every cost moves the speedup here
    swapped = floors.rename(columns={"floor s": "plain floor s", "plain floor s": "floor s"})
    swapped = race.ladder(result, "d", 3, swapped, 40)
    assert swapped.iloc[1] != pytest.approx(want[1], rel=1e-3)
    assert got.iloc[5] != pytest.approx(want[6], rel=1e-3)  # isolated c alone is not Thm 3.8
    with pytest.raises(TypeError, match="result"):
        race.ladder(table, "d", 3, floors, 40)
    with pytest.raises(ValueError, match="draft, gamma"):
        race.ladder(result, "d", 4, floors, 40)
    with pytest.raises(ValueError, match="n_tokens"):
        race.ladder(result, "d", 3, floors, 0)
    with pytest.raises(TypeError, match="ceilings"):
        race.ladder(result, "d", 3, (1e-4, 1e-5), 40)
    with pytest.raises(ValueError, match="ceilings has no row"):
        race.ladder(result, "d", 3, floors.assign(gamma=4), 40)
