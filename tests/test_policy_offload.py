"""Fiddler: static placement of the most-used experts from the training-split counts, never evicted; every
other routed expert runs on the host CPU; after the warm-up only activations cross PCIe."""

import os

import numpy as np
import pytest
from conftest import ROOT, tiny_shape

from chipsim.runner import prepare, simulate, summarize_result
from chipsim.sim.engine import Simulation
from chipsim.sim.observe import Observer

TINY_LAYERS = 4
TINY = tiny_shape(TINY_LAYERS)
N, K, L = TINY.num_experts, TINY.top_k, TINY.num_moe_layers
EXPERT_BYTES = 3 * 256 * 128 * 2


def placement_counts() -> np.ndarray:
    """Training-split counts: layer 0 expert 0 most used, then down the ids, except two tied favourites."""
    counts = np.arange(L * N, dtype=np.int64)[::-1].reshape(L, N).copy()
    counts[2, 5] = 10_000  # the most used of all ...
    counts[3, 7] = 10_000  # ... tied with this one: broken by layer, then expert id
    return counts


def test_the_most_used_experts_are_placed_and_never_evicted(tiny):
    routed = tiny.routing(12, seed=7)
    cfg = tiny.config(routed, arrays={"train_expert_counts": placement_counts()})
    prep = prepare(cfg, [], ["fiddler:slots=5"])
    policy = prep.policies[0]
    evicted = []

    class Evictions(Observer):
        def evicted(self, layer, expert):
            evicted.append((layer, expert))

    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy, observers=[Evictions()])
    result = sim.run()
    assert policy.placed == {(2, 5), (3, 7), (0, 0), (0, 1), (0, 2)}
    assert set(sim.context.resident_keys()) == policy.placed and not evicted
    assert result.counts.fetches_total == 5 and result.counts.prefetches_issued == 5
    # the whole buffer by default
    prep = prepare(cfg, [], ["fiddler"])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    sim.run()
    assert len(prep.policies[0].placed) == min(sim.slots, L * N)


def test_misses_all_run_on_the_host_and_after_warmup_only_activations_cross_pcie(tiny):
    routed = tiny.routing(12, seed=7)
    cfg = tiny.config(routed, arrays={"train_expert_counts": placement_counts()})
    prep = prepare(cfg, [], ["fiddler:slots=5,warmup=2"])
    policy = prep.policies[0]
    result = simulate(prep, policy)
    placed = policy.placed
    in_placed = np.array([[sum((l, e) in placed for e in routed[t, l]) for l in range(L)]
                          for t in range(routed.shape[0])])
    assert (result.per_layer.host == K - in_placed).all()  # every routed expert not placed ran on the host
    assert result.per_layer.demand_fetches.sum() == 0
    assert result.per_layer.surrogate.sum() == 0
    act = prep.workload.model.hidden_size * 2 * 2  # BF16 hidden vector out and back
    host = result.per_layer.host.sum(axis=1)
    w = 2
    # tokens after the warm-up: PCIe carries activations only, the CPU reads its own LPDDR5X copies
    assert (result.per_token.bytes["pcie"][w:] == host[w:] * act).all()
    assert (result.per_token.bytes["lpddr5x"][w:] == host[w:] * EXPERT_BYTES).all()
    # the placement itself crossed PCIe once, during the warm-up
    assert result.per_token.bytes["pcie"][:w].sum() == 5 * EXPERT_BYTES + host[:w].sum() * act
    row = summarize_result(prep, result, policy)
    assert row["warmup_tokens"] == 2
    assert row["offchip_bytes_per_token"] == pytest.approx(host[w:].mean() * act)
    assert row["recall"] == pytest.approx(in_placed[w:].sum(axis=1).mean() / (K * L))  # the placed set's hits
    assert row["host_experts_per_token"] == pytest.approx(host[w:].mean())


def test_fiddler_completes_on_the_default_trace():
    prep = prepare(os.path.join(ROOT, "hwconfigs", "thor.yaml"), ["workload.max_tokens=48"], ["fiddler"])
    policy = prep.policies[0]
    result = simulate(prep, policy)
    assert result.tokens == 48 and (result.per_token.latency_ps > 0).all()
    w = policy.warmup_tokens()
    act = prep.workload.model.hidden_size * 2 * 2
    assert (result.per_token.bytes["pcie"][w:] == result.per_layer.host[w:].sum(axis=1) * act).all()
    assert result.counts.fetches_total == len(policy.placed) == prep.workload.buffer_slots
    assert 0 < result.per_layer.hits.sum() < result.per_layer.hits.size * prep.workload.model.top_k  # some routed experts were placed
