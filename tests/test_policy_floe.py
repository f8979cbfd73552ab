"""FloE: experts moved and stored at 1/9.3 of their BF16 bytes, computed from the compressed bytes, the
inter-expert predictor prefetching one layer ahead, per-layer staging; beats no-prefetch on latency."""

import os

import numpy as np
from conftest import ROOT, THOR, tiny_shape
from helpers import random_routing

from chipsim.runner import prepare, simulate
from chipsim.trace import format as tf
from chipsim.units import transfer_ps, gbps_to_bytes_per_s

TINY_LAYERS = 4
TINY = tiny_shape(TINY_LAYERS)
N, K, L = TINY.num_experts, TINY.top_k, TINY.num_moe_layers
M = min(N, 2 * K)
EXPERT_BYTES = 3 * 256 * 128 * 2  # 196,608 BF16 bytes
COMPRESSED = -(-EXPERT_BYTES * 10 // 93)  # ⌈196,608 / 9.3⌉ = 21,141


def predictor(routed, correct=True, seed=0):
    """floe_rank: the routed experts first (correct) or last (wrong); layer 0 has no prediction."""
    rng = np.random.default_rng(seed)
    T = routed.shape[0]
    rank = np.full((T, L, M), tf.NO_EXPERT, dtype=np.uint8)
    for t in range(T):
        for layer in range(1, L):
            chosen = list(routed[t, layer])
            others = [e for e in rng.permutation(N).tolist() if e not in chosen]
            order = chosen + others if correct else others + chosen
            rank[t, layer] = order[:M]
    return rank


def test_an_expert_moves_and_is_stored_at_one_ninth_point_three_of_its_bf16_bytes(tiny):
    routed = random_routing(TINY, 5, seed=1)
    cfg = tiny.config(routed, arrays={"floe_rank": predictor(routed)})
    prep = prepare(cfg, [], ["floe", "no-prefetch"])
    floe, none = prep.policies
    fmt = floe.expert_format(prep.workload, prep.config.hw)
    assert COMPRESSED == 21141
    assert fmt.part_bytes == (COMPRESSED,) and fmt.slot_bytes == COMPRESSED and fmt.fetch_bytes == COMPRESSED
    # the arrays read exactly the compressed bytes, so at least their streaming time; that streaming is under a
    # ninth of the dense expert's (its 9.3x the bytes, at HBM's rate below UCIe's); its dequantisation steps add
    # fixed costs, which in this tiny model outweigh the bytes saved
    assert fmt.hbm_bytes == COMPRESSED
    stream = gbps_to_bytes_per_s(prep.config.hw.links["ucie"].bandwidth_gbps)
    assert fmt.compute_ps >= transfer_ps(COMPRESSED, stream)
    assert 9 * transfer_ps(COMPRESSED, stream) < prep.workload.moe_layer(0).expert.memory_ps
    res, base = simulate(prep, floe), simulate(prep, none)
    # a perfect predictor: layer 0 is fetched on demand, layers 1.. prefetched; k experts per layer either way
    assert (res.per_token.bytes["pcie"] == L * K * COMPRESSED).all()
    assert (res.per_token.bytes["lpddr5x"] == L * K * COMPRESSED).all()
    assert (base.per_token.bytes["pcie"] == L * K * EXPERT_BYTES).all()
    assert (res.per_layer.demand_fetches[:, 0] == K).all() and (res.per_layer.demand_fetches[:, 1:] == 0).all()
    assert res.per_layer.overlap[:, 1:].all()
    assert res.extra["floe_expert_bytes"] == COMPRESSED
    # the buffer holds ~9.3x as many experts
    from chipsim.sim.engine import Simulation

    assert Simulation(prep.config.hw, prep.workload, prep.trace, floe).slots == (4 << 20) // COMPRESSED == 198


def test_floe_beats_no_prefetch_even_with_a_wrong_predictor(tiny):
    routed = random_routing(TINY, 6, seed=2)
    for correct in (True, False):
        cfg = tiny.config(routed, arrays={"floe_rank": predictor(routed, correct=correct)}, name=f"p{correct}")
        prep = prepare(cfg, [], ["floe", "no-prefetch", "floe:compression=1"])
        floe, none, uncompressed = (simulate(prep, p) for p in prep.policies)
        assert floe.per_token.latency_ps.mean() < none.per_token.latency_ps.mean()
        if correct:  # the predictor alone (no compression) already hides layers 1..
            assert uncompressed.per_token.latency_ps.mean() < none.per_token.latency_ps.mean()
        else:  # wrong predictions: every routed expert fetched on demand, the wrong prefetches abandoned
            assert (floe.per_layer.demand_fetches == K).all()
            assert floe.counts.prefetches_unused == floe.counts.prefetches_issued


def test_staging_is_per_layer_and_keeps_the_next_layers_prefetches(tiny):
    routed = random_routing(TINY, 4, seed=3)
    cfg = tiny.config(routed, arrays={"floe_rank": predictor(routed)})
    prep = prepare(cfg, [], ["floe"])
    from chipsim.sim.engine import Simulation

    policy = prep.policies[0]
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy)
    after_end = []
    original = policy.on_layer_end

    def on_layer_end(ctx, t, layer):
        original(ctx, t, layer)
        after_end.append((layer, sorted({l for l in range(ctx.num_moe_layers) if ctx.keys_of_layer(l)})))

    policy.on_layer_end = on_layer_end
    sim.run()
    for layer, layers_held in after_end:
        assert layer not in layers_held  # layer l evicted at its end
        assert layers_held == ([layer + 1] if layer + 1 < L else [])  # layer l+1's prefetches kept


def test_quality_is_reported_from_the_trace_or_said_to_be_unmeasured(tiny):
    routed = random_routing(TINY, 2, seed=4)
    prep = prepare(tiny.config(routed, name="a"), [], ["floe"])
    extra = simulate(prep, prep.policies[0]).extra
    assert extra["quality_cost"] is None and extra["quality_source"].startswith("not measured")
    assert extra["floe_quality_delta_ppl_pct"] is None and extra["floe_sparse_only_delta_ppl_pct"] is None
    at_09 = {"ppl": 6.4, "delta_ppl_pct": 6.667}
    quality = {"floe": {"0.5": {"ppl": 6.1, "delta_ppl_pct": 1.667}, "0.9": at_09,
                        "sparse_bf16_up": {"0.9": {"ppl": 6.2, "delta_ppl_pct": 3.333}}}}
    prep = prepare(tiny.config(routed, meta={"quality": quality}, name="b"), [], ["floe"])
    extra = simulate(prep, prep.policies[0]).extra
    assert extra["quality_cost"] == at_09 and extra["quality_source"] == "meta['quality']['floe']['0.9']"
    assert extra["floe_quality_delta_ppl_pct"] == 6.667 and extra["floe_sparse_only_delta_ppl_pct"] == 3.333
    prep = prepare(tiny.config(routed, meta={"quality": quality}, name="c"), [], ["floe:sparsity=0.7"])
    extra = simulate(prep, prep.policies[0]).extra  # no record at 0.7: said so, naming what there is
    assert extra["quality_cost"] is None and "['floe']['0.7'] record (it holds 0.5, 0.9, sparse_bf16_up)" in extra["quality_source"]


def test_floe_completes_and_beats_no_prefetch_on_the_bundled_traces(tmp_path):
    thor = os.path.join(ROOT, "hwconfigs", "thor.yaml")
    ds = tmp_path / "ds.yaml"
    ds.write_text(f"base: {THOR}\nmemory:\n  hbm:\n    capacity_gib: 6\nexpert_buffer:\n  capacity_mib: 1056\n"
                  f"model:\n  name: deepseek-v2-lite\nworkload:\n  trace: {ROOT}/traces/synthetic-deepseek-v2-lite.npz\n")
    for cfg, tokens in ((thor, 48), (str(ds), 24)):
        prep = prepare(cfg, [f"workload.max_tokens={tokens}"], ["floe", "no-prefetch"])
        floe, none = (simulate(prep, p) for p in prep.policies)
        assert floe.tokens == tokens and (floe.per_token.latency_ps > 0).all()
        assert floe.per_token.latency_ps.mean() < none.per_token.latency_ps.mean()
        compressed = -(-prep.workload.model.expert_params * 2 * 10 // 93)
        assert floe.extra["floe_expert_bytes"] == compressed
        assert floe.per_token.bytes["pcie"].sum() <= floe.counts.fetches_total * compressed
