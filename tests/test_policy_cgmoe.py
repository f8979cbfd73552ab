"""CG-MoE (SPICE's CPU-GPU joint scheduling baseline, an ASSUMPTION): an LRU cache whose misses each go to the
cheaper of a demand fetch and the host CPU. With a host CPU far slower than a fetch it is LRU, decision for decision;
with one far faster, every routed expert runs on the host and only activations cross the link."""

import numpy as np
import pytest

from chipsim.runner import prepare, simulate, summarize_result

SLOW_HOST = ["host_cpu.memory_bandwidth_gbps=0.01", "host_cpu.dispatch_overhead_ns=1000000000"]
FAST_HOST = ["host_cpu.memory_bandwidth_gbps=100000", "host_cpu.dispatch_overhead_ns=0",
             "host_cpu.flops_per_cycle_per_core=100000"]


def _run(cfg, sets, spec):
    prep = prepare(cfg, sets, [spec])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


def test_with_a_host_slower_than_any_fetch_cg_moe_is_lru(tiny):
    cfg = tiny.config(tiny.routing(16, seed=11))
    _, lru, lru_row = _run(cfg, SLOW_HOST, "lru:slots=6")
    _, cg, cg_row = _run(cfg, SLOW_HOST, "cg-moe:slots=6")
    assert (cg.per_token.latency_ps == lru.per_token.latency_ps).all()
    assert cg.counts.fetches_total == lru.counts.fetches_total and cg.per_layer.host.sum() == 0
    assert cg_row["cgmoe_host_share"] == 0.0 and cg_row["offchip_bytes_per_token"] == lru_row["offchip_bytes_per_token"]


def test_with_a_host_faster_than_any_fetch_every_expert_runs_on_the_host(tiny):
    routed = tiny.routing(16, seed=11)
    cfg = tiny.config(routed)
    prep, cg, row = _run(cfg, FAST_HOST, "cg-moe:slots=6")
    k, layers = tiny.shape.top_k, tiny.shape.num_moe_layers
    assert cg.counts.fetches_total == 0 and cg.per_layer.demand_fetches.sum() == 0
    assert (cg.per_layer.host == k).all()  # nothing was ever fetched, so nothing is cached: every routed expert
    act = prep.workload.model.hidden_size * 2 * 2  # a BF16 hidden vector out and back per host expert
    assert (cg.per_token.bytes["pcie"] == k * layers * act).all()
    assert row["cgmoe_host_share"] == 1.0 and row["host_experts_per_token"] == pytest.approx(k * layers)


def test_cg_moe_refuses_a_batch(tiny):
    from chipsim.errors import InputError

    cfg = tiny.config(tiny.routing(16, seed=11))
    with pytest.raises(InputError, match="cg-moe"):
        prepare(cfg, ["workload.batch=2", "workload.max_tokens=8"], ["cg-moe"])
