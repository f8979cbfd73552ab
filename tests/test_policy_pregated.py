"""Pre-gated MoE: executes the pre-gate's selection, counts routing deviations exactly, stages the next
layer's pre-gated set ahead (lookahead) without evicting it early; MoE layer 0 falls back to its router."""

import os

import numpy as np
import pytest
from conftest import ROOT, THOR, tiny_shape
from helpers import random_routing, run_policies_recording_plans

from chipsim.errors import InputError
from chipsim.policies.base import make_policy
from chipsim.trace import format as tf

TINY = tiny_shape()
N, K, L = TINY.num_experts, TINY.top_k, TINY.num_moe_layers
M = min(N, 2 * K)


def run(cfg, specs, overrides=()):
    return run_policies_recording_plans(cfg, specs, overrides)


def hand_case(T=4):
    routed = np.array([[[0, 1]] * L] * T, dtype=np.uint8)
    pregate = np.array([[[255] * M, [0, 2, 1, 3], [3, 4, 0, 1]]] * T, dtype=np.uint8)  # layer 0: no pre-gate
    return routed, pregate


def test_pregated_executes_the_pregate_set_and_counts_deviations_exactly(tiny):
    T = 4
    routed, pregate = hand_case(T)
    cfg = tiny.config(routed, arrays={"pregate_rank": pregate})
    result, plans = run(cfg, ["pregated"])["pregated"]
    want = {0: ([0, 1], 0), 1: ([0, 2], 1), 2: ([3, 4], 2)}  # layer 0 runs its router's choice
    assert len(plans) == T * L
    for t, layer, execute, substituted, dropped in plans:
        assert (execute, substituted, dropped) == (*want[layer], 0)
    assert (result.per_layer.substituted == np.array([0, 1, 2])).all()
    assert result.extra["deviation_rate"] == pytest.approx(3 / (L * K))
    assert result.extra["deviation_rate_per_layer"] == pytest.approx([0.0, 0.5, 1.0])
    assert result.extra["layers_without_pregate_per_token"] == 1
    # the arrays computed exactly the pre-gated experts
    executed = {}
    for lane, name, *_ in result.timeline.events:
        if lane == "arrays" and " experts " in name:
            layer = int(name.split()[0][1:])
            executed.setdefault(layer, []).extend(int(e) for e in name.split("[")[1].rstrip("]").split(","))
    for layer, (experts, _) in want.items():
        assert sorted(executed[layer]) == sorted(experts * T)
    # layer 0 has no prediction: fetched on demand after routing; layers 1, 2 were staged ahead
    assert (result.per_layer.demand_fetches[:, 0] == K).all()
    assert (result.per_layer.demand_fetches[:, 1:] == 0).all()


def test_lookahead_stages_the_next_layer_during_this_one_and_keeps_it_past_this_layers_end(tiny):
    T = 6
    routed = random_routing(TINY, T, seed=11)
    rng = np.random.default_rng(12)
    pregate = np.array([[rng.permutation(N)[:M] for _ in range(L)] for _ in range(T)], dtype=np.uint8)
    pregate[:, 0] = 255
    cfg = tiny.config(routed, arrays={"pregate_rank": pregate})
    res = run(cfg, ["pregated", "pregated:lookahead=0"])
    (ahead, _), (late, _) = res["pregated"], res["pregated:lookahead=0"]
    for r in (ahead, late):
        # each executed expert crossed the link exactly once: nothing was evicted before its layer ran
        assert r.counts.fetches_total == T * L * K
        assert r.counts.prefetches_unused == 0
        assert r.counts.prefetches_issued == T * (L - 1) * K
    assert (ahead.per_layer.substituted == late.per_layer.substituted).all()
    # staged at layer l−1's routing, the fetch also hides behind layer l−1's experts
    assert (ahead.per_token.latency_ps <= late.per_token.latency_ps).all()
    assert ahead.per_token.latency_ps.mean() < late.per_token.latency_ps.mean()
    # the deviations are the pre-gated experts outside the routed set
    want = np.array([[0] + [len(set(pregate[t, layer, :K]) - set(routed[t, layer])) for layer in range(1, L)]
                     for t in range(T)])
    assert (ahead.per_layer.substituted == want).all()


@pytest.mark.parametrize("spec", ["pregated:lookahead=2", "pregated:lookahead=-1"])
def test_lookahead_beyond_one_layer_is_rejected(spec):
    """A pre-gate at layer l predicts only layer l+1."""
    with pytest.raises(InputError):
        make_policy(spec, {})


def test_on_the_default_trace_deviations_match_the_trace():
    path = os.path.join(ROOT, "traces", "synthetic-granite-3b.npz")
    T = 24
    res = run(THOR, ["pregated", "no-prefetch"], ["workload.max_tokens=24", f"workload.trace={path}"])
    (pre, _), (none, _) = res["pregated"], res["no-prefetch"]
    trace = tf.load(path)
    k = trace.top_k
    routed, gate = trace["routed_ids"][:T], trace["pregate_rank"][:T, :, :k]
    want = np.zeros(routed.shape[:2], dtype=int)
    for t in range(T):
        for layer in range(1, trace.num_moe_layers):
            want[t, layer] = len(set(gate[t, layer].tolist()) - set(routed[t, layer].tolist()))
    assert (gate[:, 0] == tf.NO_EXPERT).all()
    assert (pre.per_layer.substituted == want).all()
    assert pre.extra["deviation_rate"] == pytest.approx(want.sum() / (T * trace.num_moe_layers * k))
    assert pre.per_token.latency_ps.mean() < none.per_token.latency_ps.mean()
    assert (pre.per_layer.demand_fetches[:, 1:] == 0).all()
