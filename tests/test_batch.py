"""Several sequences decoded together (workload.batch, issue #43). Hand checks: B identical sequences move what one
does and run each expert once over B tokens; B sequences with disjoint routings move B times the bytes; a step whose
experts are all where the arrays read them ends at the sum of its operations; the trace is laid out one token of
each sequence per step; a policy that cannot run a batch, a batch larger than the trace or the memory: one line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from chipsim.cli import main
from chipsim.errors import InputError
from chipsim.runner import prepare, simulate, summarize_result
from conftest import ROOT, THOR
from helpers import routing_peek_policy

JETSON = os.path.join(ROOT, "hwconfigs", "jetson-thor.yaml")  # every expert read in place: nothing is fetched
BIG_BUFFER = "expert_buffer:\n  capacity_mib: 16\n"  # 85 tiny experts: every union of a step fits


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


def run(config, batch, tokens, policy="no-prefetch", *more):
    prep = prepare(config, [f"workload.batch={batch}", f"workload.max_tokens={tokens}", *more], [policy])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


def test_identical_sequences_move_what_one_does_and_run_each_expert_over_all_of_them(tiny):
    one = tiny.routing(tokens=6)
    cfg = tiny.config(np.concatenate([one] * 4), extra_yaml=BIG_BUFFER)
    _, single, _ = run(cfg, 1, 6)
    prep, batch, row = run(cfg, 4, 6)
    assert batch.per_token.bytes["pcie"].tolist() == single.per_token.bytes["pcie"].tolist()
    assert batch.per_layer.demand_fetches.tolist() == single.per_layer.demand_fetches.tolist()
    # every routed expert runs once a step, as a GEMM over the 4 tokens (the 4 copies of the same token)
    assert batch.counts.expert_computes == single.counts.expert_computes
    assert prep.batch.expert(4).macs == 4 * prep.batch.expert(1).macs
    assert row["batch"] == 4 and row["tokens_per_s"] == pytest.approx(4e3 / row["latency_ms_per_token"])
    assert row["union_experts_per_layer"] == tiny.shape.top_k  # four copies of one token: its own k experts


def test_disjoint_routings_move_b_times_the_bytes(tiny):
    L, k = tiny.shape.num_moe_layers, tiny.shape.top_k
    # sequence b routes token i of layer l to experts 2b and 2b + 1: the four sequences share no expert
    routed = np.zeros((4 * 5, L, k), dtype=np.uint8)
    for b in range(4):
        routed[5 * b:5 * b + 5] = [2 * b, 2 * b + 1]
    cfg = tiny.config(routed, extra_yaml=BIG_BUFFER)
    _, single, _ = run(cfg, 1, 5)
    _, batch, row = run(cfg, 4, 5)
    expert = tiny.shape.hidden_size * tiny.shape.expert_ffn * 3 * 2
    assert batch.per_token.bytes["pcie"].tolist() == [4 * L * k * expert] * 5
    assert single.per_token.bytes["pcie"].tolist() == [L * k * expert] * 5
    assert row["offchip_bytes_per_output_token"] == L * k * expert
    assert row["union_experts_per_layer"] == 4 * k  # every layer of every step needs all four sequences' experts


def test_a_step_whose_experts_are_all_in_place_ends_at_the_sum_of_its_operations():
    prep, result, _ = run(JETSON, 3, 4)
    b, m = prep.batch, prep.workload.model
    routed = prep.trace["routed_ids"]
    for step in range(4):
        total = b.head.duration_ps
        for li, layer in enumerate(b.layers):
            total += sum(op.duration_ps for op in (layer.pre, layer.dense, layer.combine) if op)
            if li >= m.first_dense_layers:
                ids = routed[3 * step:3 * step + 3, li - m.first_dense_layers].ravel()
                _, counts = np.unique(ids, return_counts=True)
                total += sum(b.expert(int(n)).duration_ps for n in counts)
        assert int(result.per_token.latency_ps[step]) == total


def test_the_weights_stream_once_a_step_and_each_sequence_reads_its_own_cache():
    prep = prepare(JETSON, ["workload.batch=4", "workload.max_tokens=2"], ["no-prefetch"])
    one = prep.workload.layers[0].attention  # one sequence's mixer at the same context
    four = prep.batch.layers[0].pre  # (and the router, the first layer being a MoE layer)
    m = prep.workload.model
    kv = m.num_kv_heads * prep.workload.context_length * m.head_dim * 2
    weights = one.hbm_read_bytes - 2 * kv  # the projections' (and norms'): everything but the cache reads
    router = prep.workload.layers[0].router
    assert four.hbm_read_bytes == weights + 4 * 2 * kv + router.hbm_read_bytes
    assert four.macs == 4 * (one.macs + router.macs)


def test_staggered_sequences_each_read_their_own_cache_length():
    prep = prepare(JETSON, ["workload.batch=4", "workload.max_tokens=2", "workload.batch_contexts=staggered"],
                   ["no-prefetch"])
    same = prepare(JETSON, ["workload.batch=4", "workload.max_tokens=2"], ["no-prefetch"])
    m, c = prep.workload.model, prep.workload.context_length
    per_token = m.num_kv_heads * m.head_dim * 2  # one cached token's keys (or values) in one layer
    contexts = [c // 4, c // 2, 3 * c // 4, c]  # sequence b of 4 at context x (b + 1) / 4
    staggered, full = prep.batch.layers[0].pre.hbm_read_bytes, same.batch.layers[0].pre.hbm_read_bytes
    assert full - staggered == 2 * per_token * (4 * c - sum(contexts))  # scores and value mix read each cache
    assert prep.workload.hbm_kv_bytes == sum(m.cache_bytes(x) for x in contexts)


def test_each_step_is_one_token_of_every_sequence_from_its_own_window():
    plain = prepare(THOR, ["workload.max_tokens=8"], ["no-prefetch"]).trace["routed_ids"]
    prep = prepare(THOR, ["workload.batch=3", "workload.max_tokens=8"], ["no-prefetch"])
    laid = prep.trace["routed_ids"]
    assert prep.batch.window_starts == (0, 8, 16)
    assert laid.shape[0] == 24
    for i in range(8):
        for b in range(3):
            assert laid[3 * i + b].tolist() == plain[8 * b + i].tolist()


def test_a_batch_holds_a_kv_cache_per_sequence():
    one = prepare(THOR, [], ["no-prefetch"]).workload
    four = prepare(THOR, ["workload.batch=4", "workload.max_tokens=16"], ["no-prefetch"]).workload
    assert four.hbm_kv_bytes == 4 * one.hbm_kv_bytes


@pytest.mark.parametrize("policy", ["no-prefetch", "oracle", "static-4", "apex", "apex-sf", "lru", "lfu", "promoe",
                                    "pregated", "fiddler", "adapmoe", "spice"])
def test_every_policy_that_says_how_runs_a_batch(policy):
    _, result, row = run(THOR, 2, 8, policy)
    assert result.tokens == 8 and result.batch == 2
    assert 0 <= row["recall"] <= 1 and 0 <= row["fallback_rate"] <= 1 and 0 <= row["overlap"] <= 1
    assert row["tokens_per_s"] == pytest.approx(2e3 / row["latency_ms_per_token"])


def test_the_oracle_has_every_expert_of_the_union_at_routing_warm_up_included():
    _, _, row = run(THOR, 4, 16, "oracle", "workload.warmup_tokens=4")
    assert row["overlap"] == 1.0 and row["recall"] == 1.0 and row["fallback_rate"] == 0.0
    assert row["warmup"]["recall"] == 1.0 and row["warmup"]["overlap"] == 1.0


def test_a_policy_that_changes_what_runs_says_how_many_tokens_each_expert_runs_for():
    prep = prepare(THOR, ["workload.batch=4", "workload.max_tokens=4"], ["pregated"])
    policy, plans = prep.policies[0], []
    route = policy.on_route

    def recording(ctx, t, layer, routed):
        plan = route(ctx, t, layer, routed)
        plans.append(plan)
        return plan

    policy.on_route = recording
    simulate(prep, policy)
    k = prep.workload.model.top_k
    for plan in plans:  # each token runs k experts (its pre-gate's, or its routed ones at MoE layer 0)
        assert set(plan.tokens) == set(plan.execute) and sum(plan.tokens.values()) == 4 * k


def test_bad_batches_are_one_line(capsys):
    for keys, text in [(["workload.batch=0"], "workload.batch"),
                       (["workload.batch=4"], "4 sequences of 1024 tokens each read 4096 trace tokens"),
                       (["workload.batch=4000", "workload.max_tokens=1"], "memory.hbm.capacity_gib"),
                       (["workload.batch=2", "workload.prompt_tokens=16", "workload.output_tokens=4"],
                        "a batch of whole requests"),
                       (["workload.speculative.draft_tokens=2", "workload.speculative.acceptance=0.5"],
                        "not read by the prompt-lookup draft")]:
        with pytest.raises(InputError, match=text):
            prepare(THOR, keys, ["no-prefetch"])
    assert main(["run", THOR, "--set", "workload.batch=2", "--set", "workload.max_tokens=8", "--policy",
                 "floe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "floe" in err[0] and "workload.batch 2" in err[0] and "channels" in err[0]


def test_a_union_wider_than_the_buffer_is_refused(tiny):
    L, k = tiny.shape.num_moe_layers, tiny.shape.top_k
    routed = np.zeros((8, L, k), dtype=np.uint8)
    for b in range(4):
        routed[2 * b:2 * b + 2] = [2 * b, 2 * b + 1]
    cfg = tiny.config(routed, extra_yaml="expert_buffer:\n  capacity_mib: 1\n")  # 5 experts of 196,608 bytes
    with pytest.raises(InputError, match="fewer than the 8 that the 4 tokens of step 0 route to"):
        prepare(cfg, ["workload.batch=4", "workload.max_tokens=2"], ["no-prefetch"])


# ---------------------------------------------------------------------------------------------- speculative steps
def test_prompt_lookup_drafts_what_followed_the_last_match_and_accepts_what_the_text_repeats():
    from chipsim.workload.speculative import prompt_lookup

    ids = np.array([1, 2, 3, 4, 1, 2, 3, 4, 1, 9])
    assert prompt_lookup(ids, 0, 4, 3) == []  # nothing before the first token
    assert prompt_lookup(ids, 4, 4, 3) == [2, 3, 4, 1]  # only "1" recurs (position 0): what followed it, up to p
    assert prompt_lookup(ids, 8, 2, 3) == [2, 3]  # "2 3 4 1"'s suffix "3 4 1" last ended at position 4
    assert prompt_lookup(ids, 3, 4, 3) == []  # "4" never came before


def spec_run(config, tokens, *keys, policy="no-prefetch"):
    prep = prepare(config, [f"workload.max_tokens={tokens}", *keys], [policy])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


@pytest.mark.parametrize("rate, steps", [(0.0, 24), (1.0, 5)])
def test_a_certain_draft_yields_k_plus_one_tokens_a_step_and_a_useless_one_one(rate, steps):
    prep, result, row = spec_run(THOR, 24, "workload.speculative.draft_tokens=4", "workload.speculative.draft=rate",
                                 f"workload.speculative.acceptance={rate}")
    plan = prep.speculative.steps
    assert len(plan) == steps == result.tokens
    assert sum(s.accepted + 1 for s in plan) == 24  # every token of the run, once
    assert row["tokens_per_step"] == pytest.approx(24 / steps)
    assert row["acceptance_rate"] == rate


def test_a_verify_step_whose_experts_are_in_place_ends_at_the_sum_of_its_operations():
    prep, result, _ = spec_run(JETSON, 16, "workload.speculative.draft_tokens=3", "workload.speculative.draft=rate",
                               "workload.speculative.acceptance=0.5", "workload.speculative.draft_ms_per_step=0.25")
    spec, m, routed = prep.speculative, prep.workload.model, prep.trace["routed_ids"]
    row, step = next((i, s) for i, s in enumerate(spec.steps) if s.tokens > 1)
    layers, head = spec.verify(step.tokens)
    total = spec.draft_ps + head.duration_ps
    for li, layer in enumerate(layers):
        total += sum(op.duration_ps for op in (layer.pre, layer.dense, layer.combine) if op)
        if li >= m.first_dense_layers:
            ids = routed[step.first:step.first + step.tokens, li - m.first_dense_layers].ravel()
            _, counts = np.unique(ids, return_counts=True)
            total += sum(spec.expert(int(n)).duration_ps for n in counts)
    assert spec.draft_ps == 250_000_000
    assert int(result.per_token.latency_ps[row]) == total


def test_prompt_lookup_acceptance_is_the_trace_text_s_own():
    from chipsim.workload.speculative import prompt_lookup

    prep, _, row = spec_run(THOR, 256, "workload.speculative.draft_tokens=4")
    ids, steps = prep.trace["token_ids"][:256].tolist(), prep.speculative.steps
    for s, after in zip(steps, steps[1:]):
        drafts = prompt_lookup(np.array(ids), s.first, 4 if s.first + 4 < 256 else 255 - s.first, 3)
        assert s.tokens == 1 + len(drafts)
        assert drafts[:s.accepted] == ids[s.first + 1:s.first + 1 + s.accepted]  # accepted: the text's own next
        assert s.accepted == len(drafts) or drafts[s.accepted] != ids[s.first + 1 + s.accepted]  # the first miss
        assert after.first == s.first + s.accepted + 1
    accepted = sum(s.accepted for s in steps)
    assert accepted > 0 and row["acceptance_rate"] == pytest.approx(accepted / sum(s.tokens - 1 for s in steps))


def test_speculation_refuses_what_it_does_not_model():
    with pytest.raises(InputError, match="speculation runs one decode-only sequence"):
        prepare(THOR, ["workload.speculative.draft_tokens=2", "workload.batch=2", "workload.max_tokens=8"],
                ["no-prefetch"])
    with pytest.raises(InputError, match="floe: runs one token a step, not workload.speculative"):
        prepare(THOR, ["workload.speculative.draft_tokens=2", "workload.max_tokens=8"], ["floe"])


def test_a_step_sees_no_routing_of_its_own_tokens_before_it_routes_them():
    """After a verify step whose drafts were rejected, the next step re-routes them: at its start none of its tokens'
    routing is known, at each layer's routing exactly theirs up to that layer."""
    spec = prepare(THOR, ["workload.max_tokens=64", "workload.speculative.draft_tokens=4"], ["no-prefetch"])
    assert any(s.accepted < s.tokens - 1 for s in spec.speculative.steps[:-1])  # a step re-routes rejected drafts
    assert simulate(spec, routing_peek_policy()).tokens == len(spec.speculative.steps)
    batch = prepare(THOR, ["workload.max_tokens=8", "workload.batch=3"], ["no-prefetch"])
    assert simulate(batch, routing_peek_policy()).tokens == 8


def test_a_batch_step_s_head_launches_once_where_each_op_group_launches():
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.workload.batch import every_token_head
    from chipsim.workload.decode import dense_weights

    prep = prepare(os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml"),
                   ["workload.batch=2", "workload.max_tokens=16", "workload.warmup_tokens=0"], ["no-prefetch"])
    am = ArrayModel(prep.config.hw)
    assert am.launch_per_group
    bare = every_token_head(am, prep.workload.model, dense_weights(prep.config.hw), 2)
    assert prep.batch.head.duration_ps == bare.duration_ps + am.group_launch("head").duration_ps
