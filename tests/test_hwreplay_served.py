"""A served run replayed (issue #43 item 5), on CPU: the plan of a served run holds its steps with their parts, each
expert over the step's tokens routed to it (summing to tokens x top-k per layer), and the gaps the chip waited (summing
to the run's idle time); a step's primitives are the simulator's, part by part; the CPU dry run copies exactly the
plan's bytes and sleeps the gaps; hwcompare's served regime sets each step's measured latency beside the simulated one.
Bad input is one line and exit 2."""

import json
import os

import numpy as np
import pytest

from chipsim.hwreplay.ops import served_step_ops
from chipsim.hwreplay.plan import build_plan
from chipsim.hwreplay.run import main as hwreplay_main
from chipsim.runner import prepare, simulate
from chipsim.workload.served import Part
from conftest import ROOT
from test_hwreplay_batch import _one_line_exit_2, one_thread, tiny_h200  # noqa: F401 (fixtures)

H200 = os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")


def served(rps: float, scheduler: str = "chunked") -> list[str]:
    """4 requests of 8 prompt and 3 output tokens (windows of 10 of the tiny trace's 40), at `rps`."""
    return ["workload.requests=4", "workload.prompt_tokens=8", "workload.output_tokens=3",
            f"workload.arrivals.poisson_rps={rps}", "workload.arrivals.seed=3", f"workload.scheduler.kind={scheduler}",
            "workload.scheduler.max_step_tokens=6", "workload.scheduler.max_sequences=4", "workload.prefill_chunk_tokens=4"]


def _plan(config, sets, spec="no-prefetch"):
    prep = prepare(config, sets, [spec])
    return prep, build_plan(prep, prep.policies[0])


def test_a_served_plan_is_the_simulators_steps_with_their_parts_and_gaps(tiny_h200):
    """Each step's parts are the scheduler's (every request's 8 prompt tokens in chunks of at most 4, then its 2
    decode tokens; at most 6 tokens a step); each MoE layer computes the union of the step's tokens' routed experts,
    each over the tokens routed to it (summing to tokens x top-2); the gaps add up to the run's idle time; the plan's
    fetches, computes and step latencies are those of the run without the recorder."""
    from chipsim.trace import format as tf

    prep, plan = _plan(tiny_h200, served(2))
    raw = tf.load(prep.config.trace_path)["routed_ids"]
    steps = [a for a in plan.actions if a[0] == "step"]
    assert plan.requests == 4 and plan.to_json()["requests"] == 4 and plan.tokens == len(steps)
    assert [a[1] for a in steps] == list(range(len(steps)))
    assert [a for a in plan.actions if a[0] == "step_end"] == [["step_end", k] for k in range(len(steps))]
    prompt = {}
    decoded = {}
    for a in steps:
        assert sum(p[2] for p in a[3]) <= 6
        for first, position, tokens, decode, emits in a[3]:
            window = first // 10  # (the part's trace tokens are its window's, from its position on)
            assert first == 10 * window + position
            if decode:
                assert tokens == 1 and position == 8 + decoded.get(window, 0) and emits
                decoded[window] = decoded.get(window, 0) + 1
            else:
                assert tokens <= 4 and position == prompt.get(window, 0)
                prompt[window] = position + tokens
                assert emits == (position + tokens == 8)
    assert set(prompt.values()) == {8} and set(decoded.values()) == {2}
    alone = simulate(prep, prep.policies[0])  # the same run, nobody watching
    computes = []
    for k, a in enumerate(steps):
        tokens = [t for first, _, n, _, _ in a[3] for t in range(first, first + n)]
        start = plan.actions.index(a)
        mine = plan.actions[start:plan.actions.index(["step_end", k])]
        for layer in range(3):
            ran = {e: n for c in mine if c[0] == "compute" and c[2] == layer for e, n in zip(c[3], c[4])}
            ids = raw[tokens, layer].ravel().tolist()
            assert ran == {e: ids.count(e) for e in set(ids)} and sum(ran.values()) == 2 * len(tokens)
        computes += [c for c in mine if c[0] == "compute"]
    assert sum(a[2] for a in steps) == alone.served.idle_ps > 0  # a rate of 2/s leaves the chip waiting
    assert plan.fetches == alone.counts.fetches_total
    assert sum(len(c[3]) for c in computes) == alone.counts.expert_computes
    assert plan.sim_latency_ms == [round(float(x) / 1e9, 6) for x in alone.per_token.latency_ps]
    assert _plan(tiny_h200, served(2))[1].digest() == plan.digest()


def test_a_served_steps_primitives_are_each_parts_own():
    """Granite-3B: a lone prompt chunk is that prefill chunk (one attention kernel over its 32 tokens after 64
    cached); a lone decode token at position 80 attends over 81 tokens (scores of 64 x 24 x 81 over 8 x 81 x 64 x 2
    bytes); a mixed step of a decode token and a 16-token chunk: projections over 17 rows, the decode token's scores
    matvec over its cache, the chunk's one attention kernel (softmax and value mix inside it), the LM head over the
    1 part that yields a token."""
    hw = prepare(H200, ["workload.requests=1", "workload.prompt_tokens=96", "workload.output_tokens=2",
                        "workload.arrivals.poisson_rps=1"], ["no-prefetch"]).config.hw
    chunk = served_step_ops(hw, [Part(0, 64, 64, 32, False, False)])
    [att] = [p.attention for p in chunk["attention"] if p.attention is not None]
    assert (att.offset, att.tokens) == (64, 32)
    decode = served_step_ops(hw, [Part(0, 80, 80, 1, True, True)])
    keys = {p.name: p.key for p in decode["attention"]}
    assert keys["scores"] == f"matvec r64 o{24 * 81} b{8 * 81 * 64 * 2}" and keys["qkv_proj"].startswith("matvec r1536")
    mixed = served_step_ops(hw, [Part(0, 80, 80, 1, True, True), Part(1, 164, 64, 16, False, False)])
    names = [(p.name, p.key, p.fused, p.attention is not None) for p in mixed["attention"]]
    assert ("qkv_proj", f"matmul m17 r1536 o2560 b{1536 * 2560 * 2}", False, False) in names
    assert ("scores", f"matvec r64 o{24 * 81} b{8 * 81 * 64 * 2}", False, False) in names
    assert sum(1 for n in names if n[3]) == 1 and sum(1 for n in names if n[2]) == 3  # the chunk's kernel, fused 3
    assert {p.name: p.key for p in mixed["head"]}["lm_head"] == f"matvec r1536 o49155 b{1536 * 49155 * 2}"


def test_a_cpu_dry_run_copies_the_plans_bytes_and_sleeps_the_gaps(tiny_h200, one_thread):
    """The tiny served run replayed on CPU tensors: each issue copied once into its slot, the bytes the plan's; one
    latency per step; each gap slept at least as long as simulated."""
    torch = one_thread
    from chipsim.hwreplay.run_served import served_replay
    from chipsim.hwreplay.served_harness import GpuServed, step_gaps_ps, step_parts

    prep, plan = _plan(tiny_h200, served(2))
    m, nbytes = prep.workload.model, prep.workload.expert_bytes
    host = torch.zeros((m.num_moe_layers, m.num_experts, nbytes), dtype=torch.uint8)
    for layer in range(m.num_moe_layers):
        for e in range(m.num_experts):
            host[layer, e, :8] = 10 * layer + e + 1
    tokens = {n for a in plan.actions if a[0] == "compute" for n in a[4]}
    step = GpuServed(prep.config.hw, step_parts(plan), step_gaps_ps(plan), tokens, torch.device("cpu"))
    slots = torch.zeros((plan.slots, nbytes), dtype=torch.uint8)
    res = served_replay(plan, step, host, slots, m.first_dense_layers, 1, {})
    assert res["copies"] == plan.fetches and res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes
    assert len(res["latency_ms"]) == len(res["gap_ms"]) == plan.tokens
    for slept, gap in zip(res["gap_ms"], step_gaps_ps(plan)):
        assert (slept == 0) == (gap == 0) and slept >= gap / 1e9 * 0.999
    for slot, (layer, e) in {a[6]: (a[3], a[4]) for a in plan.actions if a[0] == "issue"}.items():
        assert int(slots[slot, 0]) == 10 * layer + e + 1


def test_hwreplay_served_writes_a_measurement_that_hwcompare_sets_beside_the_simulator(tiny_h200, tmp_path,
                                                                                         one_thread):
    """The CLI's CPU dry run of the tiny served run, then hwcompare's served regime: decisions and bytes come out of
    the plan again, each step's measured latency is its mean over the measured replays, the simulated gaps are the
    plan's."""
    from chipsim.hwreplay.compare_served import served_lines, served_regimes

    out = tmp_path / "out"
    assert hwreplay_main([tiny_h200, "--served", *[x for s in served(20) for x in ("--set", s)], "--policy",
                          "no-prefetch", "--device", "cpu", "--repeats", "2", "--jobs", "1", "--out", str(out)]) == 0
    meas = json.loads((out / "t.json").read_text())
    assert meas["served"] and meas["requests"] == 4
    (tmp_path / "not-yet").mkdir()
    [(name, [row])] = served_regimes([["served", str(out), str(tmp_path / "not-yet")]], jobs=1)
    [case] = meas["cases"]
    steps = [(a + b) / 2 for a, b in zip(case["latency_ms"], case["repeat_latency_ms"][0])]
    assert row["measured_ms"] == pytest.approx(np.mean(steps)) and row["replays"] == 2 and row["steps"] == len(steps)
    assert row["error_pct"] == pytest.approx(100 * (row["simulated_ms"] - row["measured_ms"]) / row["measured_ms"])
    assert row["decisions_match"] and row["plan_bytes"] == row["copied_bytes"] == row["measured_plan_bytes"]
    assert row["tokens"] == 4 * (8 + 2) and "energy_error_pct" not in row
    assert f"| 4 | no-prefetch | {len(steps)} (40) |" in "\n".join(served_lines(name, [row]))


def test_bad_served_replay_input_is_one_line_and_exit_2(tiny_h200, capsys, tmp_path):
    out = str(tmp_path / "o")
    cpu = ["--device", "cpu", "--jobs", "1", "--out", out]
    run = [x for s in served(2) for x in ("--set", s)]
    _one_line_exit_2(capsys, [tiny_h200, "--served", *cpu], "--served", "workload.requests")
    _one_line_exit_2(capsys, [tiny_h200, "--served", "--batch", "4", *run, *cpu], "--batch: not with --served")
    _one_line_exit_2(capsys, [tiny_h200, "--served", "--prompts", "8", *run, *cpu], "--prompts: not with --served")
    _one_line_exit_2(capsys, [tiny_h200, "--served", "--contexts", "8", *run, *cpu], "--contexts: not with --served")
    _one_line_exit_2(capsys, [os.path.join(ROOT, "hwconfigs", "h200-pcie5-deepseek-v2-lite.yaml"), "--served", *run,
                              *cpu], "served replay", "grouped-query attention")
    assert not os.path.exists(out)  # refused before anything was written
