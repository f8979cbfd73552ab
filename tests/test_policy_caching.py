"""Expert caches across tokens (lru, lfu, adapmoe): their defining behaviours on hand-made traces, then a
completion check on the bundled default trace."""

import os

import numpy as np
import pytest
from conftest import ROOT, THOR, tiny_shape
from helpers import hand_trace_arrays, random_routing, write_hand_trace

from chipsim.errors import InputError
from chipsim.policies.caching import AdapMoE
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.sim.engine import Simulation
from chipsim.trace import format as tf
from chipsim.workload.models import MODELS

# one expert = 3 × 256 × 128 × 2 B = 196,608 B = 0.1875 MiB: 0.4 MiB holds 2 experts, 4 MiB holds 21
ONE_LAYER = tiny_shape(1, top_k=1)
THREE_LAYERS = tiny_shape(3)
TOP4 = tiny_shape(2, top_k=4)


@pytest.fixture(autouse=True)
def _models(monkeypatch):
    for model in (ONE_LAYER, THREE_LAYERS, TOP4):
        monkeypatch.setitem(MODELS, model.name, model)


def _config(tmp_path, model, trace, capacity_mib=4.0, name="c"):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"base: {THOR}\nmodel:\n  name: {model.name}\nworkload:\n  trace: {trace}\n"
                   f"expert_buffer:\n  capacity_mib: {capacity_mib}\n")
    return str(cfg)


def _run(cfg, spec, record_events=False):
    prep = prepare(cfg, policy_specs=[spec])
    policy = prep.policies[0]
    result = simulate(prep, policy, record_events=record_events)
    return prep, policy, result, summarize_result(prep, result, policy)


def _demand_fetched(result):
    """Experts fetched on demand, in landing order, as 'L<layer>E<expert>'."""
    return [name for lane, name, _, _ in result.timeline.events if lane == "dma-demand"]


# ----------------------------------------------------------------------------- LRU and LFU
# One layer, top-1, routing A A B C A B (A=0, B=1, C=2) through a cache of two experts.
# token 3 (C) must evict one of {A: used at tokens 0 and 1, B: used at token 2}:
#   LRU evicts A (least recently used) -> token 4 (A) misses, evicting B -> token 5 (B) misses
#   LFU evicts B (used once, A twice)  -> token 4 (A) hits; token 5 (B) misses, evicting C (once; A thrice)
SEQUENCE = [0, 0, 1, 2, 0, 1]
EXPECTED = {
    "lru": ([1, 0, 1, 1, 1, 1], ["L0E0", "L0E1", "L0E2", "L0E0", "L0E1"]),
    "lfu": ([1, 0, 1, 1, 0, 1], ["L0E0", "L0E1", "L0E2", "L0E1"]),
}


@pytest.mark.parametrize("name", ["lru", "lfu"])
@pytest.mark.parametrize("how", ["buffer of two", "slots=2 in a larger buffer"])
def test_lru_and_lfu_evict_exactly_the_expected_victims(tmp_path, name, how):
    routed = np.array(SEQUENCE, dtype=np.uint8).reshape(-1, 1, 1)
    trace = write_hand_trace(tmp_path / "seq.npz", ONE_LAYER, routed)
    if how == "buffer of two":  # the engine asks choose_victims when the buffer is full
        cfg, spec = _config(tmp_path, ONE_LAYER, trace, capacity_mib=0.4), f"{name}:warmup=0"
    else:  # the policy enforces its own S below the buffer's size
        cfg, spec = _config(tmp_path, ONE_LAYER, trace, capacity_mib=4), f"{name}:warmup=0,slots=2"
    prep, policy, result, row = _run(cfg, spec, record_events=True)
    demands, fetched = EXPECTED[name]
    assert result.per_layer.demand_fetches[:, 0].tolist() == demands
    assert _demand_fetched(result) == fetched
    assert row["cache_slots"] == 2
    assert row["resident_rate"] == pytest.approx(demands.count(0) / len(demands))
    assert row["prefetches_issued"] == 0  # no prefetch: every miss is a demand fetch


def test_lru_thrashes_on_a_cycle_longer_than_the_cache_and_lfu_keeps_the_frequent_expert(tmp_path):
    """The classic LRU failure: a cycle of three experts through two slots never hits. LFU, after expert 0
    has been used three times, keeps it through the same cycle and hits on it every time."""
    routed = np.array([0, 1, 2] * 4, dtype=np.uint8).reshape(-1, 1, 1)
    trace = write_hand_trace(tmp_path / "cyc.npz", ONE_LAYER, routed)
    cfg = _config(tmp_path, ONE_LAYER, trace, capacity_mib=0.4)
    *_, lru = _run(cfg, "lru:warmup=0")
    assert lru["resident_rate"] == 0.0 and lru["demand_fetches_per_token"] == 1
    routed = np.array([0, 0, 0] + [0, 1, 2] * 3, dtype=np.uint8).reshape(-1, 1, 1)
    trace = write_hand_trace(tmp_path / "cyc2.npz", ONE_LAYER, routed)
    cfg = _config(tmp_path, ONE_LAYER, trace, capacity_mib=0.4, name="c2")
    _, _, result, _ = _run(cfg, "lfu:warmup=0")
    assert result.per_layer.demand_fetches[:, 0].tolist() == [1, 0, 0] + [0, 1, 1] * 3


@pytest.mark.parametrize("spec,slots", [("lru:slots=3", 3), ("lfu:slots=5", 5), ("adapmoe:slots=6", 6),
                                        ("adapmoe:slots=9,gate_threshold=0.5", 9)])
def test_a_cache_of_s_slots_never_holds_more_than_s(tmp_path, spec, slots):
    model = TOP4 if spec.startswith("adapmoe") else THREE_LAYERS
    routed = random_routing(model, 16, seed=5)
    arrays, meta = hand_trace_arrays(model, routed)
    if model is TOP4:  # a next-layer prediction that is half right, so prefetches compete for room
        rng = np.random.default_rng(1)
        arrays["pregate_rank"][:, 1] = [rng.permutation(8) for _ in range(16)]
        arrays["routed_weights"][:] = np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float16)
    path = tmp_path / "r.npz"
    tf.save(path, arrays, meta)
    cfg = _config(tmp_path, model, str(path), capacity_mib=4)
    prep = prepare(cfg, policy_specs=[spec])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    assert sim.slots == 21 > slots
    result = sim.run()
    assert result.counts.peak_buffer_slots <= slots
    if not spec.startswith("adapmoe"):
        assert result.counts.peak_buffer_slots == slots  # filled, never over
    assert result.counts.expert_computes == result.per_layer.hits.size * model.top_k - result.per_layer.dropped.sum()


def test_slots_beyond_the_buffer_are_capped_and_below_top_k_are_rejected(tmp_path):
    routed = random_routing(THREE_LAYERS, 4, seed=2)
    trace = write_hand_trace(tmp_path / "r.npz", THREE_LAYERS, routed)
    cfg = _config(tmp_path, THREE_LAYERS, trace, capacity_mib=4)
    *_, row = _run(cfg, "lru:slots=1000")
    assert row["cache_slots"] == 21
    with pytest.raises(InputError, match="slots"):  # rejected while preparing, before anything runs
        prepare(cfg, policy_specs=["lfu:slots=1"])


@pytest.mark.parametrize("name", ["lru", "lfu", "adapmoe"])
def test_a_repeated_routing_pattern_hits_every_time_after_warm_up(tmp_path, name):
    routed = np.array([[[0, 1], [2, 3], [4, 5]]] * 6, dtype=np.uint8)  # the same 6 experts every token
    trace = write_hand_trace(tmp_path / "rep.npz", THREE_LAYERS, routed)
    cfg = _config(tmp_path, THREE_LAYERS, trace, capacity_mib=4)
    spec = f"{name}:warmup=1" + (",slots=10" if name == "adapmoe" else "")  # 2k staging + 6 cached
    _, _, result, row = _run(cfg, spec)
    assert row["resident_rate"] == 1.0 and row["resident_rate_per_layer"] == [1.0, 1.0, 1.0]
    assert row["warmup_tokens"] == 1 and row["warmup_resident_rate"] == 0.0
    assert row["warmup"]["tokens"] == 1 and row["tokens"] == 5
    assert row["demand_fetches_per_token"] == 0 and row["stall_ms_per_token"] == 0
    assert result.per_layer.demand_fetches[0].tolist() == [2, 2, 2]
    assert result.counts.fetches_total == 6  # each expert crossed the link once


# ----------------------------------------------------------------------------- AdapMoE
def _adapmoe_trace(tmp_path, weights, routed, pregate=None):
    arrays, meta = hand_trace_arrays(TOP4, routed)
    arrays["routed_weights"] = np.asarray(weights, dtype=np.float16)
    if pregate is not None:
        arrays["pregate_rank"] = pregate.astype(np.uint8)
    path = tmp_path / "a.npz"
    tf.save(path, arrays, meta)
    return str(path)


def test_adapmoe_drops_exactly_the_trailing_experts_past_the_threshold(tmp_path):
    routed = np.array([[[0, 1, 2, 3], [4, 5, 6, 7]],
                       [[7, 6, 5, 4], [3, 2, 1, 0]],
                       [[1, 3, 5, 7], [0, 2, 4, 6]]], dtype=np.uint8)
    weights = np.array([
        # cumulative .5 .8 .95 -> 3 run | .7 .95 -> 2 run
        [[0.5, 0.3, 0.15, 0.05], [0.7, 0.25, 0.03, 0.02]],
        # even weights reach .9 only with all 4 | sum .5, normalised .8 .12 .06 .02 -> .8 .92: 2 run
        [[0.25, 0.25, 0.25, 0.25], [0.4, 0.06, 0.03, 0.01]],
        # one dominant expert: never fewer than 1 | .5 .875 .9375 -> 3 run
        [[0.97, 0.01, 0.01, 0.01], [0.5, 0.375, 0.0625, 0.0625]],
    ])
    cfg = _config(tmp_path, TOP4, _adapmoe_trace(tmp_path, weights, routed), capacity_mib=4)
    prep = prepare(cfg, policy_specs=["adapmoe:warmup=0"])
    policy = prep.policies[0]
    plans = []
    original = policy.on_route

    def on_route(ctx, t, layer, routed_now):
        plan = original(ctx, t, layer, routed_now)
        plans.append(plan.execute)
        return plan

    policy.on_route = on_route
    result = simulate(prep, policy)
    row = summarize_result(prep, result, policy)
    kept = [[3, 2], [4, 2], [1, 3]]
    assert result.per_layer.dropped.tolist() == [[4 - a, 4 - b] for a, b in kept]
    # the leading experts (descending weight) run, the trailing ones are dropped
    assert plans == [routed[t, layer, :kept[t][layer]].tolist() for t in range(3) for layer in range(2)]
    assert result.counts.expert_computes == sum(map(sum, kept))
    assert row["deviation_rate"] == pytest.approx(result.per_layer.dropped.sum() / routed.size)
    assert row["dropped_experts_per_token"] == pytest.approx(result.per_layer.dropped.sum() / 3)
    *_, row1 = _run(cfg, "adapmoe:warmup=0,gate_threshold=1.0")
    assert row1["deviation_rate"] == 0.0
    # reaching the threshold exactly is enough: .5 + .375 = .875 (exact in float16)
    _, _, result, _ = _run(cfg, "adapmoe:warmup=0,gate_threshold=0.875")
    assert result.per_layer.dropped[2, 1] == 2


def test_adapmoe_never_drops_on_a_top_2_model(tmp_path):
    routed = random_routing(THREE_LAYERS, 4, seed=1)
    arrays, meta = hand_trace_arrays(THREE_LAYERS, routed)
    arrays["routed_weights"][:] = np.array([0.95, 0.05], dtype=np.float16)
    tf.save(tmp_path / "t2.npz", arrays, meta)
    cfg = _config(tmp_path, THREE_LAYERS, str(tmp_path / "t2.npz"))
    _, _, result, row = _run(cfg, "adapmoe:gate_threshold=0.1,warmup=0")
    assert result.per_layer.dropped.sum() == 0 and row["deviation_rate"] == 0.0
    assert result.counts.expert_computes == routed.size


def test_adapmoe_prefetches_the_next_layers_gate_prediction_at_routing(tmp_path):
    routed = random_routing(TOP4, 5, seed=4)
    pregate = np.full((5, 2, 8), tf.NO_EXPERT, dtype=np.uint8)
    pregate[:, 1, :4] = routed[:, 1]  # layer 1 predicted exactly from layer 0
    pregate[:, 1, 4:] = [[e for e in range(8) if e not in set(r)] for r in routed[:, 1]]
    weights = np.full((5, 2, 4), 0.25)
    cfg = _config(tmp_path, TOP4, _adapmoe_trace(tmp_path, weights, routed, pregate), capacity_mib=4)
    _, _, result, row = _run(cfg, "adapmoe:warmup=0,slots=8")  # 2k staging, no per-layer cache
    assert row["cache_quota_per_layer"] == [0, 0]
    assert result.per_layer.demand_fetches[:, 0].tolist() == [4] * 5  # layer 0 cannot be predicted
    assert result.per_layer.demand_fetches[:, 1].tolist() == [0] * 5
    assert row["prefetch_accuracy"] == 1.0 and row["prefetch_accuracy_per_layer"] == [None, 1.0]
    assert row["prefetches_issued"] == 5 * 4


def test_adapmoe_layer_quotas_go_where_a_slot_saves_most_fetches():
    concentrated = [50, 50, 0, 0, 0, 0, 0, 0]  # top-2 always these two: each slot hits every token
    uniform = [25] * 8  # each slot hits a quarter of the tokens
    counts = np.array([concentrated, uniform])
    assert AdapMoE.layer_quotas(counts, 2, 3) == [2, 1]
    assert AdapMoE.layer_quotas(counts, 2, 6) == [2, 4]
    assert AdapMoE.layer_quotas(np.ones((3, 8)), 2, 7) == [3, 2, 2]  # even split, ties to lower layers
    assert AdapMoE.layer_quotas(counts, 2, 0) == [0, 0]
    assert sum(AdapMoE.layer_quotas(np.arange(64).reshape(2, 32), 8, 40)) == 40


# ----------------------------------------------------------------------------- the bundled trace
def test_every_caching_policy_completes_on_the_default_trace_and_reports_its_warm_up_apart():
    prep = prepare(THOR, ["workload.max_tokens=48"], ["lru", "lfu", "adapmoe"])
    assert os.path.exists(prep.config.trace_path) and ROOT
    for policy in prep.policies:
        result = simulate(prep, policy)
        row = summarize_result(prep, result, policy)
        assert result.tokens == 48 and (result.per_token.latency_ps > 0).all()
        assert row["warmup_tokens"] == 16 and row["warmup"]["tokens"] == 16 and row["tokens"] == 32
        assert row["cache_slots"] == prep.workload.buffer_slots
        assert 0.0 <= row["resident_rate"] <= 1.0 and len(row["resident_rate_per_layer"]) == 32
        assert "warmup_resident_rate" in row
        if policy.name == "adapmoe":
            assert 0.0 < row["deviation_rate"] < 1.0 and 0.0 < row["prefetch_accuracy"] <= 1.0
            assert sum(row["cache_quota_per_layer"]) == prep.workload.buffer_slots - 2 * 8


@pytest.mark.parametrize("spec", ["adapmoe:gate_threshold=1.0", "adapmoe", "lru", "lfu"])
def test_a_buffer_of_exactly_top_k_slots_still_completes(tmp_path, spec):
    routed = random_routing(TOP4, 10, seed=6)
    arrays, meta = hand_trace_arrays(TOP4, routed)
    rng = np.random.default_rng(2)
    arrays["pregate_rank"][:, 1] = [rng.permutation(8) for _ in range(10)]
    tf.save(tmp_path / "k.npz", arrays, meta)
    cfg = _config(tmp_path, TOP4, str(tmp_path / "k.npz"), capacity_mib=0.8)  # four experts = top-k
    prep = prepare(cfg, policy_specs=[spec])
    assert prep.workload.buffer_slots == 4
    result = simulate(prep, prep.policies[0])
    assert result.counts.expert_computes == routed.size - result.per_layer.dropped.sum()
