"""SPICE: the per-miss cost model (CPU when the link is saturated, fetch when it is idle), LoRE surrogates
only on shared-expert models, prefetch depth never below D_min and growing with confidence, the slot budget,
the ablation variants' parameters, and complete runs on the bundled Granite and DeepSeek traces."""

import os

import numpy as np
import pytest
from conftest import ROOT, THOR, tiny_shape
from helpers import hand_trace_arrays, random_routing, write_trace_and_config

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel
from chipsim.policies.base import make_policy
from chipsim.runner import prepare, simulate
from chipsim.hw.paths import fetch_path_timing
from chipsim.sim.engine import Simulation
from chipsim.sim.observe import Observer
from chipsim.trace import format as tf
from chipsim.units import PS_PER_S, gbps_to_bytes_per_s, ns_to_ps, transfer_ps
from chipsim.workload.models import MODELS

PLAIN = tiny_shape(10, num_experts=16)
SHARED = tiny_shape(10, num_experts=16, num_shared_experts=1)
N, K, L = PLAIN.num_experts, PLAIN.top_k, PLAIN.num_moe_layers
D = tf.DRAFT_DEPTH
EXPERT_BYTES = 3 * 256 * 128 * 2  # BF16 gate, up, down


@pytest.fixture
def make(tmp_path, monkeypatch):
    """make(model, routed, draft=..., conf=..., buffer_mib=..., body=...) -> config path."""
    monkeypatch.setitem(MODELS, PLAIN.name, PLAIN)
    monkeypatch.setitem(MODELS, SHARED.name, SHARED)
    counter = iter(range(1000))

    def build(model, routed, draft=None, conf=None, buffer_mib=64, body=""):
        arrays, meta = hand_trace_arrays(model, routed)
        if draft is not None:
            arrays["draft_ids"] = draft.astype(np.uint8)
        if conf is not None:
            arrays["draft_conf"] = conf.astype(np.float16)
        return write_trace_and_config(tmp_path, model, arrays, meta, name=f"t{next(counter)}",
                                      extra_yaml=f"expert_buffer:\n  capacity_mib: {buffer_mib}\n{body}")

    return build


def valid_draft_mask():
    """[l, d-1] is True where the draft for layer l made d layers earlier exists (source layer l-d ≥ 0)."""
    return np.array([[l - d >= 0 for d in range(1, D + 1)] for l in range(L)])


def perfect_draft(routed):
    T = routed.shape[0]
    ids = np.full((T, L, D, K), tf.NO_EXPERT, dtype=np.uint8)
    mask = valid_draft_mask()
    for l in range(L):
        for d in range(D):
            if mask[l, d]:
                ids[:, l, d] = routed[:, l]
    return ids


def wrong_draft(routed, seed=0):
    """Drafts that never name a routed expert: a different wrong pair at every depth."""
    rng = np.random.default_rng(seed)
    T = routed.shape[0]
    ids = np.full((T, L, D, K), tf.NO_EXPERT, dtype=np.uint8)
    mask = valid_draft_mask()
    for t in range(T):
        for l in range(L):
            others = [e for e in range(N) if e not in set(routed[t, l].tolist())]
            for d in range(D):
                if mask[l, d]:
                    ids[t, l, d] = rng.choice(others, K, replace=False)
    return ids


def conf_array(T, value_by_depth):
    conf = np.zeros((T, L, D), dtype=np.float16)
    mask = valid_draft_mask()
    for d in range(D):
        conf[:, :, d] = np.where(mask[:, d], value_by_depth(d + 1), 0.0)
    return conf


def sim_of(cfg, spec, overrides=()):
    prep = prepare(cfg, list(overrides), [spec])
    policy = prep.policies[0]
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy)
    return prep, policy, sim


# ------------------------------------------------------------------------------------------- cost model
def test_an_idle_link_gets_fetches_with_the_hand_computed_estimate(make):
    routed = random_routing(PLAIN, 4, seed=1)
    cfg = make(PLAIN, routed)  # no drafts at all: nothing is prefetched, the link is idle at every miss
    prep, policy, sim = sim_of(cfg, "spice")
    result = sim.run()
    hw, wl = prep.config.hw, prep.workload
    misses = K - result.per_layer.hits
    assert misses.sum() > 0
    assert result.per_layer.host.sum() == 0 and result.per_layer.surrogate.sum() == 0
    assert (result.per_layer.demand_fetches == misses).all()  # every miss fetched on demand
    assert all(choice == "fetch" and f < h for *_, f, h, choice in policy.miss_log)
    # first miss of the run: nothing on the link, so fetch = setup + path latency + W/B + arrays time
    path = fetch_path_timing(hw)
    bandwidth = gbps_to_bytes_per_s(path.bandwidth_gbps)
    t, layer, expert, fetch_ps, host_ps, _ = policy.miss_log[0]
    assert (t, layer) == (0, 0)
    assert fetch_ps == (ns_to_ps(hw.dma.setup_ns) + ns_to_ps(path.latency_ns) + transfer_ps(EXPERT_BYTES, bandwidth)
                        + wl.moe_layer(0).expert.duration_ps)
    assert host_ps == sim.host_timing.total_ps
    # the second miss of that layer queues behind the first on the link
    assert policy.miss_log[1][3] == fetch_ps + transfer_ps(EXPERT_BYTES, bandwidth)


def test_a_saturated_link_sends_high_confidence_misses_to_the_host_cpu(make):
    routed = random_routing(PLAIN, 1, seed=1)
    # confident but wrong drafts 8 layers deep: 16 useless prefetches queue on the link at every layer start
    cfg = make(PLAIN, routed, draft=wrong_draft(routed), conf=conf_array(1, lambda d: 0.95))
    prep, policy, sim = sim_of(cfg, "spice")
    queued_at_route = []
    original = policy.on_route

    def on_route(ctx, t, layer, rt):
        queued_at_route.append(sim.dma.queued_bytes())  # bytes on the link ahead of a fetch issued now
        return original(ctx, t, layer, rt)

    policy.on_route = on_route
    result = sim.run()
    assert result.per_layer.hits.sum() == 0  # every routed expert misses
    assert queued_at_route[0] >= 8 * EXPERT_BYTES  # several experts' worth of bytes ahead of any fetch
    layer0 = [entry for entry in policy.miss_log if entry[1] == 0]
    assert [c for *_, c in layer0] == ["cpu", "cpu"]
    assert all(f > h for _, _, _, f, h, _ in layer0)
    assert result.per_layer.host[0, 0] == K and result.per_layer.demand_fetches[0, 0] == 0
    # the cost model is applied consistently: CPU exactly where it was estimated cheaper
    for *_, f, h, choice in policy.miss_log:
        assert choice == ("cpu" if h < f else "fetch")
    assert result.per_layer.host.sum() + result.per_layer.demand_fetches.sum() == routed.size
    # fewer layers lie ahead as the token proceeds, so the deep prefetches thin out and the link drains:
    # misses go to the CPU while the queue is long and are fetched once it is short
    for layer, queued in enumerate(queued_at_route):
        if queued >= 8 * EXPERT_BYTES:
            assert result.per_layer.host[0, layer] >= 1, layer
        if queued <= 2 * EXPERT_BYTES:
            assert result.per_layer.demand_fetches[0, layer] == K, layer
    assert queued_at_route[-1] <= 2 * EXPERT_BYTES and result.per_layer.demand_fetches[0, -1] == K
    # and with the CPU fallback off the same misses are all fetched
    _, policy_b, sim_b = sim_of(cfg, "spice:cpu_fallback=false")
    res_b = sim_b.run()
    assert res_b.per_layer.host.sum() == 0 and res_b.per_layer.demand_fetches.sum() == routed.size
    # (no latency claim here: these prefetches are all useless, and a demand fetch pre-empts them, so
    # fetching would have been faster; the cost model counts the whole queue, as SPICE's does)


# ------------------------------------------------------------------------------------------- surrogates
def low_confidence_case(make, model):
    routed = random_routing(model, 4, seed=5)
    return routed, make(model, routed, draft=wrong_draft(routed, 2), conf=conf_array(4, lambda d: 0.3))


def test_low_confidence_misses_become_surrogates_on_a_shared_expert_model(make):
    routed, cfg = low_confidence_case(make, SHARED)
    prep, policy, sim = sim_of(cfg, "spice")
    result = sim.run()
    misses = K - result.per_layer.hits
    assert misses[:, 1:].sum() > 0
    assert (result.per_layer.surrogate[:, 1:] == misses[:, 1:]).all()
    assert result.per_layer.host[:, 1:].sum() == 0 and result.per_layer.demand_fetches[:, 1:].sum() == 0
    # MoE layer 0 has no draft, hence no confidence: its misses are computed exactly
    assert result.per_layer.surrogate[:, 0].sum() == 0
    assert (result.per_layer.host[:, 0] + result.per_layer.demand_fetches[:, 0] == misses[:, 0]).all()
    # LoRE (paper form y_shared + B·A·h): 2·d·r BF16 weights per expert, all resident in HBM
    r, d = 16, SHARED.hidden_size
    assert result.extra["spice_lore_hbm_bytes"] == L * N * 2 * d * r * 2
    am = ArrayModel(prep.config.hw)
    hand = am.matvec("a", d, r, d * r * 2) + am.matvec("b", r, d, r * d * 2) + am.vector("add", d)
    assert policy.surrogate_op.duration_ps == hand.duration_ps
    assert policy.surrogate_op.hbm_read_bytes == 2 * d * r * 2
    assert "LoRE rank 16" in result.extra["spice_surrogate"]
    # the factored form (rank-r gate/up/down) costs 3·r·(d+I) weights per expert
    _, policy_f, sim_f = sim_of(cfg, "spice:lore_form=factored")
    res_f = sim_f.run()
    assert res_f.extra["spice_lore_hbm_bytes"] == L * N * 3 * r * (d + SHARED.expert_ffn) * 2
    assert policy_f.surrogate_op.hbm_read_bytes == 3 * r * (d + SHARED.expert_ffn) * 2


def test_high_confidence_misses_are_never_surrogates(make):
    routed = random_routing(SHARED, 4, seed=5)
    cfg = make(SHARED, routed, draft=wrong_draft(routed, 2), conf=conf_array(4, lambda d: 0.95))
    _, _, sim = sim_of(cfg, "spice")
    result = sim.run()
    misses = K - result.per_layer.hits
    assert misses.sum() > 0 and result.per_layer.surrogate.sum() == 0
    assert (result.per_layer.host + result.per_layer.demand_fetches == misses).all()


def test_a_model_without_shared_experts_never_uses_surrogates_and_says_so(make):
    routed, cfg = low_confidence_case(make, PLAIN)
    _, policy, sim = sim_of(cfg, "spice")
    result = sim.run()
    misses = K - result.per_layer.hits
    assert misses.sum() > 0
    assert result.per_layer.surrogate.sum() == 0 and policy.surrogate_op is None
    assert (result.per_layer.host + result.per_layer.demand_fetches == misses).all()  # fetch / CPU instead
    assert result.extra["spice_low_confidence_misses_per_token"] > 0
    assert "no shared experts" in result.extra["spice_surrogate"]
    assert result.extra["spice_lore_hbm_bytes"] == 0


def test_lore_weights_that_do_not_fit_the_spare_hbm_are_rejected(make):
    routed = random_routing(SHARED, 2, seed=5)
    cfg = make(SHARED, routed)
    prep = prepare(cfg, [], ["spice"])
    wl = prep.workload
    used = (2 << 30) - wl.hbm_spare_bytes  # thor's 2 GiB minus what is left
    lore_r64 = L * N * 2 * SHARED.hidden_size * 64 * 2
    gib = (used + lore_r64 // 2) / (1 << 30)  # room for half of the rank-64 LoRE weights
    over = [f"memory.hbm.capacity_gib={gib}"]
    with pytest.raises(InputError, match="policies.spice.lore_rank"):
        _, _, sim = sim_of(cfg, "spice:lore_rank=64", over)
        sim.run()
    _, _, sim = sim_of(cfg, "spice:lore_rank=16", over)  # a quarter of it fits
    assert sim.run().extra["spice_lore_hbm_bytes"] == lore_r64 // 4
    _, _, sim = sim_of(cfg, "spice:lore_rank=64,surrogate=false", over)  # no surrogate, no LoRE weights
    sim.run()


# ------------------------------------------------------------------------------------------- depth
def d_min_bandwidth(make, routed):
    """A PCIe bandwidth at which one expert takes 2.5 layer times: D_min = ⌈2.5⌉ = 3."""
    cfg = make(PLAIN, routed)
    prep = prepare(cfg, [], ["spice"])
    c = prep.workload.moe_layer(0)
    t_layer = c.attention.duration_ps + c.router.duration_ps + K * c.expert.duration_ps + c.combine.duration_ps
    return EXPERT_BYTES * PS_PER_S / (2.5 * t_layer) / 1e9, t_layer


def record_depths(policy, sim):
    """Per on_layer_start, the deepest layer ahead all of whose predicted experts are in the buffer, stamped for
    this token's use of that layer (by this hook or an earlier one of the token, which looked less far ahead),
    read from the buffer and the stamps after the hook; it must be the depth the policy reports."""
    seen = {}
    original_start = policy.on_layer_start

    def on_layer_start(ctx, t, layer):
        original_start(ctx, t, layer)
        L, n = ctx.num_moe_layers, ctx.num_experts
        drafts = ctx.trace_array("draft_ids")[t]  # (L, D, k)
        depth = 0
        for d in range(1, min(L - layer, drafts.shape[1] + 1)):  # (the draft's depth)
            target = layer + d
            experts = [int(e) for e in drafts[target, d - 1] if e != tf.NO_EXPERT]
            if not all(ctx.present(target, e) and policy._stamp.get(target * n + e, -1) >= t * L + target
                       for e in experts):
                break
            depth = d
        assert policy.depth[t, layer] == depth, (t, layer)
        seen[(t, layer)] = depth

    policy.on_layer_start = on_layer_start
    return seen


def test_prefetch_depth_is_never_below_d_min_even_without_confidence(make):
    routed = random_routing(PLAIN, 3, seed=2)
    gbps, t_layer = d_min_bandwidth(make, routed)
    cfg = make(PLAIN, routed, draft=perfect_draft(routed), conf=conf_array(3, lambda d: 0.0))
    over = [f"links.pcie.bandwidth_gbps={gbps}"]
    prep, policy, sim = sim_of(cfg, "spice", over)
    seen = record_depths(policy, sim)
    result = sim.run()
    path = fetch_path_timing(prep.config.hw)
    by_hand = -(-EXPERT_BYTES * PS_PER_S // (gbps_to_bytes_per_s(path.bandwidth_gbps) * t_layer))
    assert by_hand == 3 and policy.d_min == 3 and result.extra["spice_d_min"] == 3
    for (t, layer), depth in seen.items():
        assert depth == min(3, L - 1 - layer), (t, layer)
        assert policy.depth[t, layer] == depth
    assert policy.depth_cut_by_buffer == 0


def test_depth_grows_while_confidence_holds_and_stops_at_max_depth(make):
    routed = random_routing(PLAIN, 3, seed=2)
    draft = perfect_draft(routed)
    cases = [
        ("spice", lambda d: 0.95 if d <= 5 else 0.5, 5),  # confident up to depth 5
        ("spice", lambda d: 0.95, 8),  # confident all the way: the trace's full draft depth
        ("spice:max_depth=4", lambda d: 0.95, 4),
        ("spice:deep=false", lambda d: 0.95, 1),  # shallow: next layer only
        ("spice", lambda d: 0.95 if d != 2 else 0.5, 1),  # stops at the first unconfident depth
    ]
    for spec, conf, want in cases:
        cfg = make(PLAIN, routed, draft=draft, conf=conf_array(3, conf))
        _, policy, sim = sim_of(cfg, spec)
        seen = record_depths(policy, sim)
        result = sim.run()
        for (t, layer), depth in seen.items():
            assert depth == min(want, L - 1 - layer), (spec, t, layer)
        remaining = np.minimum(want, L - 1 - np.arange(L - 1))
        assert result.extra["mean_prefetch_depth"] == pytest.approx(remaining.mean())


def test_a_perfect_deep_draft_hides_every_fetch_after_the_first_layer(make):
    routed = random_routing(PLAIN, 4, seed=4)
    cfg = make(PLAIN, routed, draft=perfect_draft(routed), conf=conf_array(4, lambda d: 0.95))
    prep = prepare(cfg, [], ["spice", "no-prefetch"])
    spice, none = (simulate(prep, p) for p in prep.policies)
    assert spice.per_layer.overlap[:, 1:].all()
    assert spice.per_layer.host[:, 1:].sum() == 0 and spice.per_layer.demand_fetches[:, 1:].sum() == 0
    assert spice.per_token.latency_ps.mean() < none.per_token.latency_ps.mean()


# ------------------------------------------------------------------------------------------- cache
def test_the_slot_budget_is_honoured_and_the_cache_is_kept_across_tokens(make):
    routed = random_routing(PLAIN, 6, seed=8)
    routed[1:] = routed[0]  # the same routing every token: a large enough cache hits everything
    cfg = make(PLAIN, routed, draft=wrong_draft(routed, 3), conf=conf_array(6, lambda d: 0.95))
    for slots, expect_all_hits in ((6, False), (0, True)):
        # every miss fetched (an expert computed on the host CPU does not enter the cache)
        prep = prepare(cfg, [], [f"spice:slots={slots},cpu_fallback=false"])
        policy = prep.policies[0]
        occupancy = []
        original_end = policy.on_layer_end

        def on_layer_end(ctx, t, layer, _orig=original_end):
            _orig(ctx, t, layer)
            occupancy.append(ctx.slots - ctx.free_slots())
            held = {l * ctx.num_experts + e for l in range(ctx.num_moe_layers) for _, e in ctx.keys_of_layer(l)}
            assert set(policy._stamp) == held

        policy.on_layer_end = on_layer_end

        class Occupancy(Observer):
            def attach(self, sim):
                self.sim = sim

            def issued(self, layer, expert, demand, transfer):  # slots taken, those still stopping included
                occupancy.append(self.sim.slots - self.sim.buffer.free_slots())

        sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy, observers=[Occupancy()])
        result = sim.run()
        capacity = slots or sim.slots
        assert policy.capacity == capacity and result.extra["spice_cache_slots"] == capacity
        assert max(occupancy) <= capacity
        if expect_all_hits:  # token 0's experts are never evicted from a buffer that holds them all
            assert result.per_layer.overlap[1:].all()
        else:
            assert not result.per_layer.overlap[1:].all()
    with pytest.raises(InputError, match="policies.spice.slots"):
        sim_of(cfg, "spice:slots=1")[2].run()


def test_bad_parameters_are_rejected():
    with pytest.raises(InputError, match="policies.spice.deep"):
        make_policy("spice:deep=3", {})
    with pytest.raises(InputError, match="policies.spice.lore_form"):
        make_policy("spice:lore_form=svd", {})
    with pytest.raises(InputError, match="policies.spice.confidence"):
        make_policy("spice:confidence=1.5", {})
    with pytest.raises(InputError, match="policies.spice.max_depth"):
        make_policy("spice:max_depth=9", {})


# ------------------------------------------------------------------------------------------- bundled traces
ABLATION = {
    "spice": dict(deep=True, cpu_fallback=True, surrogate=True, schedule=True),
    "spice:cpu_fallback=false,surrogate=false,schedule=false": dict(deep=True, cpu_fallback=False),  # (a)
    "spice:surrogate=false,schedule=false": dict(deep=True, cpu_fallback=True),  # (b)
    "spice:deep=false,surrogate=false,schedule=false": dict(deep=False, cpu_fallback=True),  # (c)
    "spice:deep=false,cpu_fallback=false,surrogate=false": dict(deep=False, cpu_fallback=False),  # (d)
}


def test_spice_and_its_ablation_variants_complete_on_the_default_trace():
    thor = os.path.join(ROOT, "hwconfigs", "thor.yaml")
    rows = {}
    for tokens, specs in ((48, ["spice"]), (16, [s for s in ABLATION if s != "spice"])):
        prep = prepare(thor, [f"workload.max_tokens={tokens}"], specs)
        for policy in prep.policies:
            result = simulate(prep, policy)
            assert result.tokens == tokens and (result.per_token.latency_ps > 0).all()
            rows[policy.label] = (policy, result)
    for label, want in ABLATION.items():
        policy, result = rows[label]
        for key, value in want.items():
            assert getattr(policy.params, key) == value
        extra = result.extra
        assert result.per_layer.surrogate.sum() == 0  # Granite has no shared experts
        if not policy.params.cpu_fallback:
            assert result.per_layer.host.sum() == 0
        if not policy.params.deep:
            assert policy.depth.max() == 1
        else:
            assert extra["mean_prefetch_depth"] >= policy.d_min
        w = policy.warmup_tokens()
        routed = K_GRANITE * result.moe_layers  # SPICE's own misses are the engine's fallback_rate
        assert policy.misses[w:].sum(axis=1).mean() / routed == pytest.approx(
            1 - result.per_layer.hits[w:].sum(axis=1).mean() / routed)
    full = rows["spice"][1]
    assert full.per_layer.host.sum() > 0  # on the link-bound default platform the CPU takes misses


K_GRANITE = 8


def test_spice_completes_on_the_deepseek_trace_with_surrogates(tmp_path):
    cfg = tmp_path / "ds.yaml"
    cfg.write_text(f"base: {THOR}\nmemory:\n  hbm:\n    capacity_gib: 6\nexpert_buffer:\n  capacity_mib: 1056\n"
                   f"model:\n  name: deepseek-v2-lite\nworkload:\n  trace: {ROOT}/traces/synthetic-deepseek-v2-lite.npz\n")
    prep = prepare(str(cfg), ["workload.max_tokens=24"], ["spice", "spice:surrogate=false", "no-prefetch"])
    spice, exact, none = (simulate(prep, p) for p in prep.policies)
    assert spice.per_layer.surrogate.sum() > 0 and exact.per_layer.surrogate.sum() == 0
    assert "LoRE" in spice.extra["spice_surrogate"]
    assert spice.per_token.latency_ps[4:].mean() < none.per_token.latency_ps[4:].mean()
