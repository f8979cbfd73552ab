"""FloE's baselines (ASSUMPTIONs written in chipsim/policies/floe_baselines.py): DeepSpeed-MII streams every expert of
every layer each token, all their bytes; Mixtral-Offloading stores and moves experts at 3 bits with a 32-bit scale and
zero per 64 weights, bytes checkable by hand. FloE's sparse kernel speed-up grows with sparsity below its bound."""

import pytest

from chipsim.runner import prepare, simulate, summarize_result

EXPERT_BF16 = 3 * 256 * 128 * 2  # the tiny expert: gate, up, down of 256 x 128 at BF16


def _run(cfg, spec, *sets):
    prep = prepare(cfg, list(sets), [spec])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


def test_deepspeed_mii_moves_every_expert_of_every_layer_each_token(tiny):
    cfg = tiny.config(tiny.routing(8, seed=5), extra_yaml="expert_buffer:\n  capacity_mib: 16\n")
    prep, result, row = _run(cfg, "deepspeed-mii")
    layers, experts = tiny.shape.num_moe_layers, tiny.shape.num_experts
    # 16 MiB hold 85 tiny experts: a layer's 8 and the next one's always fit, so every expert is streamed ahead, all
    # its bytes (a transfer still landing when a token ends is charged to the next one), and none comes on demand
    assert result.per_token.bytes["pcie"].sum() == 8 * layers * experts * EXPERT_BF16
    assert result.counts.fetches_total == 8 * layers * experts and result.per_layer.demand_fetches.sum() == 0


def test_mixtral_offloading_moves_3_bit_experts_with_their_scales(tiny):
    cfg = tiny.config(tiny.routing(8, seed=5))
    prep, result, row = _run(cfg, "mixtral-offloading:slots=6")
    # gate+up: 65,536 weights x 3 bits = 24,576 B + 1,024 groups x 4 B; down: 32,768 x 3 / 8 = 12,288 B + 512 x 4 B
    expected = 24576 + 4096 + 12288 + 2048
    assert row["mixtral_offloading_expert_bytes"] == expected
    assert result.per_token.bytes["pcie"].sum() == result.counts.fetches_total * expected


def test_floe_sparse_expert_speedup_grows_with_sparsity_below_its_bound():
    import os

    from conftest import ROOT
    from chipsim.policies.floe import sparse_expert_speedup

    hw = prepare(os.path.join(ROOT, "hwconfigs", "rtx3090-mixtral-8x7b.yaml"), [], ["floe"]).config.hw
    from chipsim.workload.models import model_of

    m = model_of(hw.model)
    ups = [sparse_expert_speedup(m, hw, s) for s in (0.5, 0.7, 0.9)]
    bounds = [3 / (1 + 2 * (1 - s)) for s in (0.5, 0.7, 0.9)]  # time ∝ bytes, the up projection dense
    assert 1 < ups[0] < ups[1] < ups[2]
    assert all(u <= b * 1.0001 for u, b in zip(ups, bounds))
    assert ups[0] == pytest.approx(bounds[0], rel=0.05)  # at 50 % the fixed costs are a small share
