"""A request's prefill replayed (issue #42 item 6), on CPU: the plan of a request holds its prefill chunks with the
simulator's GEMM shapes (one GEMM per routed expert per layer over the tokens the trace routes to it, summing to the
chunk's tokens x top-k), the CPU dry run of a small request copies exactly each layer's routed experts that are not
in the buffer yet, the single-op probe's rows become the config's measured table and its keys are accepted, and
hwcompare sets a measured TTFT beside the simulated one. Bad input is one line and exit 2."""

import json
import os
import re

import numpy as np
import pytest

from chipsim.errors import InputError
from chipsim.hwreplay.ops import prefill_chunk_ops, prefill_expert_ops
from chipsim.hwreplay.plan import build_plan
from chipsim.hwreplay.run import main as hwreplay_main
from chipsim.runner import prepare
from chipsim.workload.models import MODELS
from conftest import ROOT, tiny_shape

PHI = os.path.join(ROOT, "hwconfigs", "h200-pcie5-phi-mini-moe.yaml")
H200 = os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")


def _request(config, prompt, spec="on-demand+no-prefetch", *more):
    prep = prepare(config, [f"workload.prompt_tokens={prompt}", "workload.output_tokens=2", *more], [spec])
    return prep, build_plan(prep, prep.policies[0])


def _one_line_exit_2(capsys, argv, *words):
    with pytest.raises(SystemExit) as exc:
        from chipsim.errors import run_module_main

        run_module_main(lambda: hwreplay_main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chipsim: error: ") and all(w in err[0] for w in words), err


@pytest.fixture
def tiny_h200(tmp_path, monkeypatch):
    """A config of the tiny model (3 layers, 8 experts top-2, d 256, expert FFN 128: 196,608 bytes an expert) on the
    H200, with a trace of 40 tokens of random routing; its path."""
    from helpers import hand_trace_arrays, random_routing
    from chipsim.trace import format as tf

    shape = tiny_shape(3)
    monkeypatch.setitem(MODELS, shape.name, shape)
    arrays, meta = hand_trace_arrays(shape, random_routing(shape, 40, seed=5))
    tf.save(tmp_path / "t.npz", arrays, meta)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"base: {H200}\nmodel:\n  name: {shape.name}\nworkload:\n  trace: {tmp_path / 't.npz'}\n"
                   "expert_buffer:\n  capacity_mib: 3\n")  # 16 slots: two layers' experts
    return str(cfg)


def test_a_request_plan_is_its_prefill_chunks_each_expert_a_gemm_over_its_routed_tokens():
    """Phi-mini-MoE (16 experts top-2), a prompt of 256 in one chunk, on demand: per MoE layer the attention and
    router, every expert the chunk's tokens route to demanded once (in order of first appearance) and computed over
    the tokens routed to it, which sum to 256 x 2; then the LM head, and nothing of the decode step after it."""
    prep, plan = _request(PHI, 256)
    routed = prep.trace["routed_ids"][:256]
    assert plan.prompt_tokens == 256 and plan.chunk_tokens == [[0, 256]] and plan.tokens == 1
    assert plan.actions[0] == ["prefill", 0, 0, 255] and plan.actions[-2:] == [["head", 255], ["prefill_end", 0]]
    assert not any(a[0] == "token" for a in plan.actions)
    for layer in range(routed.shape[1]):
        ids = routed[:, layer].ravel().tolist()
        union = list(dict.fromkeys(ids))  # first appearance
        issued = [a[4] for a in plan.actions if a[0] == "issue" and a[3] == layer]
        computed = {e: n for a in plan.actions if a[0] == "compute" and a[2] == layer for e, n in zip(a[3], a[4])}
        assert issued == union  # the buffer starts empty: every routed expert is demanded once
        assert computed == {e: ids.count(e) for e in union}
        assert sum(computed.values()) == 256 * 2
    assert plan.fetch_bytes == plan.sim_fetch_bytes == plan.fetches * prep.workload.expert_bytes
    assert plan.sim_ttft_ms == pytest.approx(sum(plan.sim_latency_ms)) and len(plan.sim_latency_ms) == 1


def test_the_chunk_and_expert_primitives_are_the_simulators_gemms():
    """A chunk's projections and router are GEMMs over its 256 tokens; an expert over n tokens is two GEMMs of M = n
    (gate and up: 4096 -> 2 x 960; down: 960 -> 4096), and one token's is the decode step's matvecs; the attention is
    one kernel standing for the scores, softmax and value mix."""
    hw = prepare(PHI, ["workload.prompt_tokens=256", "workload.output_tokens=2"], ["on-demand+no-prefetch"]).config.hw
    groups = prefill_chunk_ops(hw, 0, 256, True)
    mixer = {p.name: p for p in groups["attention"]}
    assert mixer["qkv_proj"].key == f"matmul m256 r4096 o{(32 + 2 * 8) * 128} b{4096 * 6144 * 2}"
    assert mixer["o_proj"].key == f"matmul m256 r4096 o4096 b{4096 * 4096 * 2}"
    att = mixer["scores"].attention
    assert (att.heads, att.kv_heads, att.head_dim, att.offset, att.tokens, att.window) == (32, 8, 128, 0, 256, 0)
    assert mixer["scores"].key == mixer["value_mix"].key == f"matvec r128 o{32 * 256 * 257 // 2} b0"  # causal pairs
    assert [p.name for p in groups["attention"] if p.fused] == ["softmax_exp", "softmax_norm", "value_mix"]
    assert {p.name: p.key for p in groups["router"]}["router"] == "matmul m256 r4096 o16 b131072"
    assert "lm_head" in [p.name for p in groups["head"]]
    assert "lm_head" not in [p.name for p in prefill_chunk_ops(hw, 0, 256, False)["head"]]
    gemms = [p.key for p in prefill_expert_ops(hw, 7) if p.kind == "matmul"]
    assert gemms == [f"matmul m7 r4096 o1920 b{4096 * 1920 * 2}", f"matmul m7 r960 o4096 b{960 * 4096 * 2}"]
    assert [p.kind for p in prefill_expert_ops(hw, 1)] == ["matvec", "sfu", "vector", "matvec"]


def test_a_cpu_dry_run_copies_exactly_each_layers_routed_experts_not_yet_in_the_buffer(tiny_h200):
    """The tiny model, a prompt of 32 in two chunks of 16, keeping half the buffer for decode (the prompt's most used
    experts stay between chunks): each (chunk, layer) issues exactly the experts its tokens route to that the buffer
    does not hold then, the replay copies each once into the slot the plan gave it, and its bytes are the plan's."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.prefill_harness import GpuPrefill
    from chipsim.hwreplay.harness import replay

    prep, plan = _request(tiny_h200, 32, "on-demand:keep=0.5+no-prefetch", "workload.prefill_chunk_tokens=16")
    routed, m = prep.trace["routed_ids"], prep.workload.model
    assert plan.chunk_tokens == [[0, 16], [16, 16]]
    resident, kept_any = set(), False
    chunk = -1
    for i, a in enumerate(plan.actions):
        if a[0] == "prefill":
            chunk = a[1]
        elif a[0] == "route":
            ids = routed[16 * chunk:16 * chunk + 16, a[2]].ravel().tolist()
            want = [e for e in dict.fromkeys(ids) if (a[2], e) not in resident]
            kept_any |= len(want) < len(set(ids))
            end = next(j for j in range(i, len(plan.actions)) if plan.actions[j][0] == "layer_end")
            got = [b[4] for b in plan.actions[i:end] if b[0] == "issue"]
            assert got == want, (chunk, a[2])  # the layer's issues: its routed experts not in the buffer, once each
        elif a[0] == "issue":
            resident.add((a[3], a[4]))
        elif a[0] == "evict":
            resident.discard((a[3], a[4]))
    assert kept_any  # the second chunk found some of its experts kept
    nbytes = prep.workload.expert_bytes
    host = torch.zeros((m.num_moe_layers, m.num_experts, nbytes), dtype=torch.uint8)
    for layer in range(m.num_moe_layers):
        for e in range(m.num_experts):
            host[layer, e, :8] = 10 * layer + e + 1  # each expert carries its own mark
    tokens = {n for a in plan.actions if a[0] == "compute" for n in a[4]}
    step = GpuPrefill(prep.config.hw, plan.chunk_tokens, 32, tokens, torch.device("cpu"))
    slots = torch.zeros((plan.slots, nbytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers)
    assert res["copies"] == plan.fetches and res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes
    assert len(res["latency_ms"]) == 2 and all(ms > 0 for ms in res["latency_ms"])
    last = {a[6]: (a[3], a[4]) for a in plan.actions if a[0] == "issue"}  # slot -> the expert copied into it last
    for slot, (layer, e) in last.items():
        assert int(slots[slot, 0]) == 10 * layer + e + 1


def test_the_prefill_step_offers_all_the_replay_asks_of_a_step(tiny_h200):
    """Every attribute the replay and its runner read from a step (step.X in harness.py and run.py) the prefill step
    has too: the CUDA-only paths (--graphs captures each op group with step.as_graph) are not run on a CPU."""
    torch = pytest.importorskip("torch")
    import re

    from chipsim.hwreplay import harness, run
    from chipsim.hwreplay.prefill_harness import GpuPrefill

    used = set()
    for module in (harness, run):
        with open(module.__file__, encoding="utf-8") as f:
            used |= set(re.findall(r"\bstep\.([a-z_]+)", f.read()))
    prep, plan = _request(tiny_h200, 16)
    step = GpuPrefill(prep.config.hw, plan.chunk_tokens, 16, {1, 2}, torch.device("cpu"))
    assert {"as_graph", "calls_for", "groups", "gemv", "expert_bytes", "kernels_per_group"} <= used
    assert [name for name in sorted(used) if not hasattr(step, name)] == []


def test_hwreplay_prompts_writes_a_measurement_that_hwcompare_sets_beside_the_simulator(tiny_h200, tmp_path, capsys):
    """The CLI's CPU dry run of the tiny request, then hwcompare's prefill regime: the decisions and bytes come out of
    the plan again, the measured TTFT is the mean of the measured replays' chunk sums, the error is simulated less
    measured over measured; an empty folder (replays not run yet) gives no section, a path that is not there is
    refused in one line."""
    pytest.importorskip("torch")
    from chipsim.hwreplay.compare_prefill import prefill_lines, prefill_regimes

    out = tmp_path / "out"
    assert hwreplay_main([tiny_h200, "--prompts", "16,32", "--device", "cpu", "--repeats", "2", "--jobs", "1",
                          "--out", str(out)]) == 0
    meas = json.loads((out / "t.json").read_text())
    assert meas["prefill"] and [(c["prompt_tokens"], c["policy"]) for c in meas["cases"]] == [(16, "on-demand"),
                                                                                               (32, "on-demand")]
    (tmp_path / "not-yet").mkdir()
    [(name, rows)] = prefill_regimes([["prefill", str(out), str(tmp_path / "not-yet")]], jobs=1)
    for row, case in zip(rows, meas["cases"]):
        measured = (sum(case["latency_ms"]) + sum(case["repeat_latency_ms"][0])) / 2
        assert row["measured_ttft_ms"] == pytest.approx(measured) and row["replays"] == 2
        assert row["error_pct"] == pytest.approx(100 * (row["simulated_ttft_ms"] - measured) / measured)
        assert row["decisions_match"] and row["plan_bytes"] == row["copied_bytes"] == row["measured_plan_bytes"]
        assert "energy_error_pct" not in row  # a dry run reads no energy
    assert "| 16 | on-demand | 1 |" in "\n".join(prefill_lines(name, rows))
    assert prefill_regimes([["prefill", str(tmp_path / "not-yet")]], jobs=1) == []
    (out / "notes.txt").write_text("a file that is no measurement")
    for typo, words in ((tmp_path / "not-ye", "no such file or folder"), (out / "notes.txt", "not a .json")):
        with pytest.raises(InputError, match=f"^--prefill-regime {re.escape(str(typo))}: {words}"):
            prefill_regimes([["prefill", str(out), str(typo)]], jobs=1)


def test_the_boards_energy_over_a_replay_is_set_beside_the_simulated_prefill(tmp_path):
    """A measurement file's energy windows (nvml.Meter's) against the simulator's board part of the prefill: its
    chunks' ledger entries but the host's."""
    from chipsim.hwreplay.compare_prefill import compare_prefill_file
    from chipsim.hwreplay.energy_table import board_mj

    prep, plan = _request(PHI, 256)
    case = {"prompt_tokens": 256, "policy": "on-demand", "plan": plan.to_json(), "latency_ms": [200.0],
            "repeat_latency_ms": [[220.0]], "copied_bytes": plan.fetch_bytes,
            "energy": {"energy_j": 100.0, "power_w": 400.0, "seconds": 0.25, "idle_w": 80.0},
            "repeat_energy": [{"energy_j": 120.0, "power_w": 450.0, "seconds": 0.26, "idle_w": 80.0}]}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"config": PHI, "overrides": [], "model": "phi-mini-moe", "prefill": True,
                                "host_experts": "normal-bf16", "cases": [case]}))
    [row] = compare_prefill_file(str(path))
    simulated = sum(board_mj(step) for step in plan.sim_energy_mj)
    assert row["measured_ttft_ms"] == 210.0 and row["measured_mj"] == pytest.approx(110_000.0)
    assert row["simulated_mj"] == pytest.approx(simulated)
    assert row["energy_error_pct"] == pytest.approx(100 * (simulated - 110_000.0) / 110_000.0)
    assert row["measured_above_idle_mj"] == pytest.approx(1e3 * ((100 - 80 * 0.25) + (120 - 80 * 0.26)) / 2)
    bad = tmp_path / "decode.json"
    bad.write_text(json.dumps({"config": PHI, "cases": []}))
    with pytest.raises(InputError, match="not a prefill measurement"):
        compare_prefill_file(str(bad))


def test_the_probes_rows_become_the_configs_measured_table_and_its_keys_are_accepted(tmp_path):
    """microbench --prompts on the CPU (a dry run of the same code) for the tiny request's shapes: the attention
    key's time is half its kernel's (scores and value mix share it), the fused softmax's 0; gpuconfig carries the
    rows into compute.op_times_ns, and the config that results loads (every key names a prefill operation)."""
    torch = pytest.importorskip("torch")
    import yaml

    from chipsim.hw.config import load_config
    from chipsim.hwreplay.gpuconfig import render
    from chipsim.hwreplay.microbench import prefill_op_times, prefill_shapes
    from chipsim.workload.op_keys import check_op_keys, known_shape

    shapes = prefill_shapes([PHI], [16], missing_from=[H200])
    keys = {p.key: (p, users) for p, users in shapes}
    gemm = "matmul m16 r4096 o6144 b50331648"  # the chunk's q, k, v projection
    scores = f"matvec r128 o{32 * 16 * 17 // 2} b0"
    assert keys[scores][1] == ["scores (phi-mini-moe, prompt 16)", "value_mix (phi-mini-moe, prompt 16)"]
    assert keys[scores][0].attention is not None and keys[f"sfu n{32 * 16 * 17 // 2}"][0].fused
    picked = [keys[k] for k in (gemm, scores, f"sfu n{32 * 16 * 17 // 2}")]
    rows = prefill_op_times(torch.device("cpu"), picked, pool_mib=128, chain_us=100, reps=1)
    by_key = {r["key"]: r for r in rows}
    assert by_key[scores]["graph_us"] == pytest.approx(by_key[scores]["kernel_us"] / 2, abs=1e-3)
    assert by_key[f"sfu n{32 * 16 * 17 // 2}"]["graph_us"] == 0.0 and by_key[gemm]["graph_us"] > 0
    with open(os.path.join(ROOT, "validation", "h200-microbench.json")) as f:
        mb = json.load(f)
    probe = {"op_times": rows, "op_times_from": {"configs": [PHI], "prompts": [16]}, "complete": True}
    text = render(mb, "graph", (("probe.json", probe),))
    table = yaml.safe_load(text)["compute"]["op_times_ns"]
    assert table[gemm] == round(by_key[gemm]["graph_us"] * 1e3, 1) and table[f"sfu n{32 * 16 * 17 // 2}"] == 0.0
    cfg = tmp_path / "h200.yaml"
    cfg.write_text(text)
    check_op_keys(load_config(str(cfg)).hw)
    with pytest.raises(InputError, match="inside CUDA graphs only"):
        render(mb, "eager", (("probe.json", {**probe, "op_times": [{k: v for k, v in rows[0].items()}]}),))
    hw = load_config(H200).hw
    assert known_shape(hw, "matmul m1661 r4096 o1920 b15728640") is None  # an expert of phi over 1,661 tokens
    assert known_shape(hw, "matvec r64 o1576960 b0") is None  # gpt-oss-20b's sliding window over a chunk of 256
    for near in ("matmul m7 r4096 o1920 b15728641", "matmul m1 r4096 o1920 b15728640", "matvec r128 o1052704 b0"):
        assert known_shape(hw, near) is not None, near


def test_bad_prefill_replay_input_is_one_line_and_exit_2(tiny_h200, capsys, tmp_path):
    out = str(tmp_path / "o")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "16", "--contexts", "512", "--device", "cpu", "--out", out],
                     "--contexts: not with --prompts")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "16", "--segments", "--graphs", "--device", "cpu", "--out", out],
                     "--segments: not with --prompts")
    _one_line_exit_2(capsys, [tiny_h200, "--set", "workload.prompt_tokens=16", "--set", "workload.output_tokens=2",
                              "--device", "cpu", "--out", str(tmp_path / "decode")], "workload.prompt_tokens",
                     "--prompts")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "16,0", "--device", "cpu", "--out", out], "--prompts '16,0'")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "16", "--policy", "lru", "--device", "cpu", "--out", out],
                     "is a decode policy")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "64", "--device", "cpu", "--out", out], "reads 65 trace tokens")
    _one_line_exit_2(capsys, [os.path.join(ROOT, "hwconfigs", "h200-pcie5-deepseek-v2-lite.yaml"), "--prompts", "16",
                              "--device", "cpu", "--out", out], "grouped-query attention")
    _one_line_exit_2(capsys, [tiny_h200, "--prompts", "16", "--policy", "fiddler-prefill", "--jobs", "1", "--device",
                              "cpu", "--out", out], "host CPU")
    assert not os.path.exists(out)  # refused before anything was written


def test_a_batch_or_speculative_config_is_not_replayed_as_one_sequence(tiny_h200, capsys, tmp_path):
    """A step of several sequences (or verified drafts) runs each expert over several tokens: the decode replay, one
    token per step, would measure something else, so it is refused in one line."""
    _one_line_exit_2(capsys, [tiny_h200, "--contexts", "8", "--set", "workload.batch=2", "--set",
                              "workload.max_tokens=4", "--set", "workload.warmup_tokens=0", "--policy", "lru", "--jobs",
                              "1", "--device", "cpu", "--out",
                              str(tmp_path / "o")], "workload.batch", "one sequence")
