"""A whole request (issue #42): prefill chunks, then decode steps over a KV cache that grows. Hand checks: a prefill
whose experts are all where the arrays read them ends at the sum of its operations; a link-bound prefill moves the
union of its experts once and takes at least their bytes over the link; TTFT grows with the prompt and TPOT with the
context; the energy of a request is its prefill's plus its decode's; bad input is one line, exit 2."""

from __future__ import annotations

import os

import numpy as np
import pytest

from chipsim.cli import main
from chipsim.errors import InputError
from chipsim.policies.base import PolicyError
from chipsim.policies.prefill import OnDemand
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.workload.prefill import attended_pairs
from chipsim.workload.request import chunk_spans
from conftest import ROOT, THOR

JETSON = os.path.join(ROOT, "hwconfigs", "jetson-thor.yaml")  # every expert read in place: nothing is fetched


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


def request(config, prompt, output, chunk=0, policy="on-demand+no-prefetch", *more):
    keys = [f"workload.prompt_tokens={prompt}", f"workload.output_tokens={output}",
            f"workload.prefill_chunk_tokens={chunk}", *more]
    prep = prepare(config, keys, [policy])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


def test_a_prefill_whose_experts_are_all_in_place_ends_at_the_sum_of_its_operations():
    prep, result, row = request(JETSON, 64, 2, 32)
    req, m, routed = prep.request, prep.workload.model, prep.trace["routed_ids"]
    total = 0
    for chunk in req.chunks:
        for li, layer in enumerate(chunk.layers):
            total += sum(op.duration_ps for op in (layer.mixer, layer.router, layer.dense, layer.combine) if op)
            if li >= m.first_dense_layers:  # each expert of the union once, over the chunk's tokens routed to it
                ids = routed[chunk.offset:chunk.offset + chunk.tokens, li - m.first_dense_layers].ravel()
                experts, counts = np.unique(ids, return_counts=True)
                total += sum(req.expert(int(n)).duration_ps for n in counts)
        total += chunk.head.duration_ps
    assert result.prefill_steps == 2 and result.prefill_chunk_tokens == (32, 32)
    assert int(result.per_token.latency_ps[:2].sum()) == total
    assert row["request"]["ttft_ms"] == pytest.approx(total / 1e9, rel=1e-12)
    assert row["request"]["prefill"]["stall_ms"] == 0 and row["request"]["prefill"]["expert_link_bytes"] == 0


def test_a_link_bound_prefill_moves_the_union_of_its_experts_once_and_waits_for_their_bytes():
    prep, result, row = request(THOR, 128, 2)
    ids = prep.trace["routed_ids"][:128]
    union = sum(len(np.unique(ids[:, layer])) for layer in range(ids.shape[1]))
    fetched = union * prep.workload.expert_bytes
    prefill = row["request"]["prefill"]
    assert prefill["expert_link_bytes"] == fetched  # Granite-3B: 40 x 32 experts, nearly all of them
    assert prefill["demand_fetches"] == union
    link_bytes_per_s = 112.7e9  # thor's PCIe data rate per direction (the run header's path line)
    assert row["request"]["ttft_ms"] >= fetched / link_bytes_per_s * 1e3
    assert row["request"]["ttft_ms"] < 1.2 * fetched / link_bytes_per_s * 1e3  # and it is link-bound


def test_layer_ahead_overlaps_the_next_layer_s_fetches_with_this_layer_s_work():
    on_demand = request(THOR, 256, 2, 0, "on-demand+no-prefetch", "expert_buffer.capacity_mib=768")[2]
    ahead = request(THOR, 256, 2, 0, "layer-ahead+no-prefetch", "expert_buffer.capacity_mib=768")[2]
    assert ahead["request"]["ttft_ms"] < on_demand["request"]["ttft_ms"]
    assert ahead["request"]["prefill"]["stall_ms"] < on_demand["request"]["prefill"]["stall_ms"]


def test_ttft_grows_with_the_prompt_and_tpot_with_the_context():
    ttft = [request(JETSON, prompt, 2)[2]["request"]["ttft_ms"] for prompt in (32, 64, 128)]
    assert ttft[0] < ttft[1] < ttft[2]
    _, result, _ = request(JETSON, 64, 24)
    steps = result.per_token.latency_ps[result.prefill_steps:]
    assert len(steps) == 23 and np.all(np.diff(steps) >= 0) and steps[-1] > steps[0]


def test_a_request_s_time_and_energy_are_its_prefill_s_plus_its_decode_s():
    _, result, row = request(THOR, 64, 9, 16, "layer-ahead+apex")
    req = row["request"]
    assert result.prefill_steps == 4 and req["output_tokens"] == 9 and req["prefill"]["steps"] == 4
    assert req["decode"]["steps"] == 8
    assert req["e2e_ms"] == pytest.approx(req["ttft_ms"] + req["decode"]["latency_ms"], rel=1e-12)
    assert req["tpot_ms_mean"] == pytest.approx(req["decode"]["latency_ms"] / 8, rel=1e-12)
    assert req["tokens_per_s"] == pytest.approx(9 / (req["e2e_ms"] / 1e3), rel=1e-12)
    assert req["energy_request_mj"] == pytest.approx(req["energy_prefill_mj"] + req["energy_decode_mj"], rel=1e-12)
    for part in ("prefill", "decode"):
        assert sum(req[part]["energy_by_component_mj"].values()) == pytest.approx(req[part]["energy_mj"], rel=1e-9)
    assert row["policy"] == "layer-ahead+apex" and row["ttft_ms"] == req["ttft_ms"]
    assert row["latency_ms_per_token"] == pytest.approx(req["tpot_ms_mean"], rel=1e-12)  # the table: decode steps


def test_chunks_cover_the_prompt_and_attend_to_every_causal_pair_once():
    assert chunk_spans(100, 32) == [(0, 32), (32, 32), (64, 32), (96, 4)]
    assert chunk_spans(100, 0) == [(0, 100)]
    for prompt, chunk in ((100, 32), (512, 512), (511, 64)):
        pairs = sum(cache + own for offset, tokens in chunk_spans(prompt, chunk)
                    for _, cache, own in [attended_pairs(offset, tokens)])
        assert pairs == prompt * (prompt + 1) // 2


def test_the_prefill_policy_sees_each_layer_s_routing_only_once_the_chunk_routes_it():
    prep = prepare(THOR, ["workload.prompt_tokens=16", "workload.output_tokens=2"], ["on-demand+no-prefetch"])

    class Peeking(OnDemand):
        def on_route(self, ctx, t, layer, routed):
            first = ctx.step_tokens[0]
            assert set(routed) == {e for tok in ctx.step_tokens for e in ctx.trace_routed(tok, layer)}
            if layer + 1 < ctx.num_moe_layers:
                ctx.trace_routed(first, layer + 1)  # the chunk's first token, one layer on: not routed yet
            return super().on_route(ctx, t, layer, routed)

    prep.prefill_for[prep.policies[0].label] = Peeking("on-demand")
    with pytest.raises(PolicyError, match=r"trace_routed\(0, 1\): token 0, MoE layer 1 has not routed yet"):
        simulate(prep, prep.policies[0])


def test_the_timeline_shows_the_prefill_chunks_and_then_the_decode_steps():
    prep = prepare(THOR, ["workload.prompt_tokens=32", "workload.output_tokens=3", "workload.prefill_chunk_tokens=16"],
                   ["on-demand+no-prefetch"])
    result = simulate(prep, prep.policies[0], record_events=True)
    spans = [(name, start) for lane, name, start, _ in result.timeline.events if lane == "tokens"]
    assert [name for name, _ in spans] == ["prefill chunk 0 (prompt tokens 0-15)", "prefill chunk 1 (prompt tokens "
                                           "16-31)", "token 32", "token 33"]
    assert [start for _, start in spans] == sorted(start for _, start in spans)
    # --timeline-tokens N: the first N steps, a prefill chunk counting as one
    first3 = simulate(prep, prep.policies[0], record_events=True, record_tokens=3).timeline
    assert [name for lane, name, _, _ in first3.events if lane == "tokens"] == [name for name, _ in spans][:3]


@pytest.mark.parametrize("keys, policy, words", [
    (["workload.prompt_tokens=2560", "workload.output_tokens=8"], "apex",
     ["workload.prompt_tokens", "2567 trace tokens", "has 2560"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=8", "workload.prefill_chunk_tokens=65"], "apex",
     ["workload.prefill_chunk_tokens", "65 is larger than the prompt"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=1"], "apex", ["workload.output_tokens", "at least 2"]),
    (["workload.output_tokens=8"], "apex", ["workload.prompt_tokens", "needs a prompt"]),
    (["workload.prompt_tokens=-1", "workload.output_tokens=8"], "apex", ["workload.prompt_tokens"]),
    ([], "layer-ahead+apex", ["--policy layer-ahead+apex", "needs a request"]),
    ([], "on-demand", ["--policy on-demand", "prefill policy"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=8"], "apex+lru", ["'apex' is a decode policy"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=8"], "on-demand+layer-ahead",
     ["'layer-ahead' is a prefill policy"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=8", "run.prefill_policy=lru"], "apex",
     ["run.prefill_policy", "'lru' is a decode policy"]),
    (["workload.prompt_tokens=64", "workload.output_tokens=8", "expert_buffer.capacity_mib=96"], "apex",
     ["expert_buffer.capacity_mib", "routes to in MoE layer", "smaller chunks"]),
    # 0.8 GiB holds the decode of context 1,024, not a request's final 2,007-token cache (its last step's)
    (["workload.prompt_tokens=2000", "workload.output_tokens=8", "memory.hbm.capacity_gib=0.8"], "apex",
     ["memory.hbm.capacity_gib", "KV cache of 2007 tokens"]),
])
def test_a_bad_request_is_one_line_and_exit_2(capsys, tmp_path, keys, policy, words):
    argv = ["run", THOR, "--policy", policy, "--out", str(tmp_path / "out")]
    for key in keys:
        argv += ["--set", key]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chipsim: error: ") and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()


def test_a_decode_only_run_reads_no_request_key():
    prep = prepare(THOR, ["workload.max_tokens=4"], ["apex"])
    assert prep.request is None and prep.prefill_for == {}
    result = simulate(prep, prep.policies[0])
    assert result.prefill_steps == 0 and result.tokens == 4
    assert "request" not in summarize_result(prep, result, prep.policies[0])
    with pytest.raises(InputError, match="fewer than"):
        prepare(THOR, ["workload.prompt_tokens=64", "workload.output_tokens=2", "expert_buffer.capacity_mib=96"],
                ["apex"])


def test_a_plus_inside_a_parameter_value_is_not_a_prefill_policy(tmp_path):
    prep = prepare(THOR, ["workload.max_tokens=2"], ["static:extra=+4", "apex:tau=0.5e+0"])
    assert [p.label for p in prep.policies] == ["static:extra=+4", "apex:tau=0.5e+0"] and prep.request is None
    prep = prepare(THOR, ["workload.prompt_tokens=16", "workload.output_tokens=2"],
                   ["on-demand:keep=1e+0+static:extra=+4", "static-4"])
    assert [p.label for p in prep.policies] == ["on-demand:keep=1e+0+static:extra=+4", "on-demand+static-4"]
    assert prep.prefill_for["on-demand:keep=1e+0+static:extra=+4"].params.keep == 1.0


def test_prefill_moves_experts_as_stored_whatever_the_decode_policy():
    """TTFT is the prefill policy's: the same before per-layer staging, FloE's compressed experts or ProMoE's
    per-matrix transfers; a decode policy with another format starts from an empty buffer."""
    keys = ["workload.prompt_tokens=64", "workload.output_tokens=3", "expert_buffer.capacity_mib=1200"]
    ttft = {}
    for decode in ("no-prefetch", "floe", "promoe", "lru"):
        prep = prepare(THOR, keys, [f"layer-ahead:keep=0.8+{decode}"])
        result = simulate(prep, prep.policies[0])
        ttft[decode] = int(result.per_token.latency_ps[:result.prefill_steps].sum())
    assert len(set(ttft.values())) == 1, ttft


def test_the_prefill_policy_counts_from_the_first_token_and_decode_from_the_prompt_s_end():
    prep = prepare(THOR, ["workload.prompt_tokens=16", "workload.output_tokens=3"], ["on-demand+no-prefetch"])
    seen = {}

    class Asks(OnDemand):
        def on_run_start(self, ctx):
            seen["prefill"] = ctx.first_token
            super().on_run_start(ctx)

    prep.prefill_for[prep.policies[0].label] = Asks("on-demand")
    sim = simulate(prep, prep.policies[0])
    assert seen == {"prefill": 0} and sim.prefill_steps == 1
