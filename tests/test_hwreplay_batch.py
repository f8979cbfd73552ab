"""A batch's decode steps replayed (issue #43 item 5), on CPU: the plan of a batch run holds its steps with each expert
over the step's tokens routed to it (summing to B x top-k per layer) and the simulator's own counts and bytes; a batch
step's primitives are the simulator's op groups, primitive by primitive; the CPU dry run copies exactly the plan's
bytes; hwcompare's batch regime sets the measured steps beside the simulated ones and is absent (the report byte for
byte unchanged) while its folder is empty. Bad input is one line and exit 2."""

import json
import os
from collections import Counter

import numpy as np
import pytest

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel
from chipsim.hwreplay.ops import batch_step_ops, prefill_expert_ops
from chipsim.hwreplay.plan import build_plan
from chipsim.hwreplay.run import main as hwreplay_main
from chipsim.runner import prepare, simulate
from chipsim.workload.models import MODELS
from conftest import ROOT, tiny_shape

H200 = os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")
BATCH = ["workload.batch=4", "workload.warmup_tokens=0"]


@pytest.fixture
def tiny_h200(tmp_path, monkeypatch):
    """The tiny model (3 layers, 8 experts top-2, d 256: 196,608 bytes an expert) on the H200 at context 8, with a
    trace of 40 tokens of random routing and a buffer of 16 slots; its config's path."""
    from helpers import hand_trace_arrays, random_routing
    from chipsim.trace import format as tf

    shape = tiny_shape(3)
    monkeypatch.setitem(MODELS, shape.name, shape)
    arrays, meta = hand_trace_arrays(shape, random_routing(shape, 40, seed=5))
    tf.save(tmp_path / "t.npz", arrays, meta)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"base: {H200}\nmodel:\n  name: {shape.name}\nworkload:\n  trace: {tmp_path / 't.npz'}\n"
                   "  context_length: 8\nexpert_buffer:\n  capacity_mib: 3\n")
    return str(cfg)


@pytest.fixture
def one_thread():
    """torch on one CPU thread: tiny kernels on a shared machine run in microseconds, not milliseconds."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


def _batch(config, steps, spec="no-prefetch", *more):
    prep = prepare(config, [*BATCH, f"workload.max_tokens={steps}", *more], [spec])
    return prep, build_plan(prep, prep.policies[0])


def test_a_batch_plan_is_the_simulators_steps_each_expert_a_gemm_over_its_step_tokens(tiny_h200):
    """4 sequences of 8 steps: step i's tokens are sequence b's i-th (trace token 8b + i); every MoE layer of a step
    computes the union of its 4 tokens' routed experts, each over the tokens routed to it (summing to 4 x top-2);
    the plan's fetches, computes, step latencies and bytes are those of the simulator run without the recorder."""
    from chipsim.trace import format as tf

    prep, plan = _batch(tiny_h200, 8)
    raw = tf.load(prep.config.trace_path)["routed_ids"]  # the trace as written: sequence b reads tokens 8b .. 8b + 7
    assert plan.tokens == 8 and plan.batch == 4 and plan.to_json()["batch"] == 4
    assert plan.actions[0] == ["token", 3] and plan.actions[-1] == ["head", 31]
    computes = [a for a in plan.actions if a[0] == "compute"]
    for step in range(8):
        for layer in range(3):
            ids = [e for b in range(4) for e in raw[8 * b + step, layer].tolist()]
            ran = {e: n for a in computes if a[1] == 4 * step + 3 and a[2] == layer for e, n in zip(a[3], a[4])}
            assert ran == Counter(ids) and sum(ran.values()) == 4 * 2, (step, layer)
    alone = simulate(prep, prep.policies[0])  # the same run, nobody watching
    assert plan.fetches == alone.counts.fetches_total
    assert sum(len(a[3]) for a in computes) == alone.counts.expert_computes
    assert plan.sim_latency_ms == [round(float(x) / 1e9, 6) for x in alone.per_token.latency_ps]
    assert plan.fetch_bytes == plan.sim_fetch_bytes == plan.fetches * prep.workload.expert_bytes
    assert _batch(tiny_h200, 8)[1].digest() == plan.digest()  # the same decisions again


def test_the_batch_step_primitives_are_the_simulators_op_groups():
    """Granite-3B, 4 sequences staggered over 256 .. 1,024 tokens: the step's mixer and router primitives are, name
    by name, the OpCosts the simulator's batch layer adds up, and cost its time; each sequence reads its own cache
    (scores of 64 x 24c over 1,024c bytes); an expert over 3 tokens is the simulator's GEMMs of 3 rows."""
    prep = prepare(H200, [*BATCH, "workload.max_tokens=2", "workload.batch_contexts=staggered"], ["no-prefetch"])
    hw = prep.config.hw
    groups = batch_step_ops(hw)
    am = ArrayModel(hw)

    def charged(op):
        return [n for n in op.name.split("+") if not n.endswith("_launch")]

    def cost(prims):  # each primitive costed again from all it records (a projection's KV append included)
        return sum((am.matmul(p.name, p.tokens, p.reduction, p.outputs, p.weight_bytes, p.write_bytes)
                    if p.kind == "matmul" else am.matvec(p.name, p.reduction, p.outputs, p.weight_bytes, p.write_bytes,
                                                         p.groups) if p.kind == "matvec"
                    else am.sfu(p.name, p.elements) if p.kind == "sfu"
                    else am.vector(p.name, p.elements, p.weight_bytes)).duration_ps for p in prims)

    layer = prep.batch.layers[0]
    launches = layer.pre.duration_ps - cost(groups["attention"] + groups["router"])
    assert charged(layer.pre) == [p.name for p in groups["attention"] + groups["router"]]
    assert launches == 2 * am.group_launch_ps  # the mixer's and the router's launches, nothing else
    assert charged(prep.batch.head) == [p.name for p in groups["head"]]
    scores = [p.key for p in groups["attention"] if p.name == "scores"]
    assert scores == [f"matvec r64 o{24 * c} b{1024 * c}" for c in (256, 512, 768, 1024)]
    assert {p.name: p.key for p in groups["attention"]}["qkv_proj"] == f"matmul m4 r1536 o2560 b{1536 * 2560 * 2}"
    three = prefill_expert_ops(hw, 3)
    assert charged(prep.batch.expert(3)) == [p.name for p in three]
    assert [p.key for p in three if p.kind == "matmul"] == [f"matmul m3 r1536 o1024 b{1536 * 1024 * 2}",
                                                            f"matmul m3 r512 o1536 b{512 * 1536 * 2}"]


def test_the_probe_times_only_the_batch_shapes_the_config_lacks():
    """microbench --batch 4: the GEMMs of 4 rows and the experts' over 2 to 4 tokens are new; the attention matvecs
    at context 1,024 and one token's expert matvecs are the decode step's, timed already."""
    from chipsim.hwreplay.microbench import batch_shapes

    keys = {p.key for p, _ in batch_shapes([H200], 4, 16, None, missing_from=[H200])}
    assert {"matmul m4 r1536 o2560 b7864320", "matmul m2 r1536 o1024 b3145728", "matmul m4 r512 o1536 b1572864",
            "matmul m4 r1536 o49155 b151004160"} <= keys
    assert not any(k.startswith("matvec") for k in keys)


def test_a_cpu_dry_run_copies_exactly_the_plans_bytes_and_launches_each_primitive(tiny_h200, one_thread):
    """The tiny batch of 3 steps replayed on CPU tensors: each issue copied once into its slot, the bytes the plan's;
    a step launches each layer's attention, router and combine kernels, the head's, and 4 kernels per expert."""
    torch = one_thread
    from chipsim.hwreplay.batch_harness import GpuBatch, expert_tokens_of
    from chipsim.hwreplay.harness import replay

    prep, plan = _batch(tiny_h200, 3)
    m, nbytes = prep.workload.model, prep.workload.expert_bytes
    host = torch.zeros((m.num_moe_layers, m.num_experts, nbytes), dtype=torch.uint8)
    for layer in range(m.num_moe_layers):
        for e in range(m.num_experts):
            host[layer, e, :8] = 10 * layer + e + 1  # each expert carries its own mark
    step = GpuBatch(prep.config.hw, expert_tokens_of([plan]), torch.device("cpu"))
    slots = torch.zeros((plan.slots, nbytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers)
    assert res["copies"] == plan.fetches and res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes
    assert len(res["latency_ms"]) == 3
    k = step.kernels_per_group
    assert k["attention"] == 2 + 1 + 1 + 4 * 4 + 1 + 1  # norm (2), qkv, rope, 4 x (scores, softmax x 2, mix), o, residual
    computes = sum(len(a[3]) for a in plan.actions if a[0] == "compute")
    per_layer = k["attention"] + k["router"] + k["combine"]
    assert res["launches_per_token"] * 3 == 3 * (3 * per_layer + k["head"]) + 4 * computes
    for slot, (layer, e) in {a[6]: (a[3], a[4]) for a in plan.actions if a[0] == "issue"}.items():
        assert int(slots[slot, 0]) == 10 * layer + e + 1


def test_hwreplay_batch_writes_a_measurement_that_hwcompare_sets_beside_the_simulator(tiny_h200, tmp_path, one_thread):
    """The CLI's CPU dry run of the tiny batch, then hwcompare's batch regime: decisions and bytes come out of the plan
    again, each step's measured latency is its mean over the measured replays, the error is simulated less measured
    over measured; an empty folder (replays not run yet) gives no section, a path that is not there is refused."""
    from chipsim.hwreplay.compare_batch import batch_lines, batch_regimes

    out = tmp_path / "out"
    assert hwreplay_main([tiny_h200, "--batch", "4", "--steps", "3", "--policy", "no-prefetch", "--device", "cpu",
                          "--repeats", "2", "--jobs", "1", "--out", str(out)]) == 0
    meas = json.loads((out / "t.json").read_text())
    assert (meas["batch"], meas["steps"], meas["contexts"]) == (4, 3, [8])
    (tmp_path / "not-yet").mkdir()
    [(name, [row])] = batch_regimes([["batch", str(out), str(tmp_path / "not-yet")]], jobs=1)
    [case] = meas["cases"]
    steps = [(a + b) / 2 for a, b in zip(case["latency_ms"], case["repeat_latency_ms"][0])]
    assert row["measured_ms"] == pytest.approx(np.mean(steps)) and row["replays"] == 2 and row["steps"] == 3
    assert row["error_pct"] == pytest.approx(100 * (row["simulated_ms"] - row["measured_ms"]) / row["measured_ms"])
    assert row["decisions_match"] and row["plan_bytes"] == row["copied_bytes"] == row["measured_plan_bytes"]
    assert "energy_error_pct" not in row  # a dry run reads no energy
    assert "| 4 | 8 | no-prefetch | 3 |" in "\n".join(batch_lines(name, [row]))
    assert batch_regimes([["batch", str(tmp_path / "not-yet")]], jobs=1) == []
    with pytest.raises(InputError, match="^--batch-regime .*not-ye: no such file or folder$"):
        batch_regimes([["batch", str(out), str(tmp_path / "not-ye")]], jobs=1)


def test_an_empty_batch_folder_leaves_the_report_byte_for_byte(tmp_path):
    """hwcompare with --batch-regime over a folder with no file writes the same report as without it."""
    from chipsim.hwreplay import compare

    meas = json.loads(open(os.path.join(ROOT, "validation", "h200-pcie5-phi-mini-moe.json")).read())
    meas["cases"] = [c for c in meas["cases"] if c["context_length"] == 2048 and c["policy"] == "no-prefetch"]
    meas["config"] = os.path.join(ROOT, meas["config"])
    (tmp_path / "m.json").write_text(json.dumps(meas))
    (tmp_path / "empty").mkdir()
    texts = []
    for more in ([], ["--batch-regime", "batch: B=4", str(tmp_path / "empty")]):
        report = tmp_path / f"V{len(texts)}.md"
        assert compare.main([str(tmp_path / "m.json"), "--jobs", "1", "--report", str(report), *more]) == 0
        texts.append(report.read_bytes())
    assert texts[0] == texts[1] and b"batch" not in texts[0].lower().replace(b"batch_", b"")


def _one_line_exit_2(capsys, argv, *words):
    with pytest.raises(SystemExit) as exc:
        from chipsim.errors import run_module_main

        run_module_main(lambda: hwreplay_main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chipsim: error: ") and all(w in err[0] for w in words), err


def test_bad_batch_replay_input_is_one_line_and_exit_2(tiny_h200, capsys, tmp_path):
    out = str(tmp_path / "o")
    cpu = ["--device", "cpu", "--jobs", "1", "--out", out]
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--prompts", "16", *cpu], "--prompts: not with --batch")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "1", *cpu], "--batch 1", ">= 2")
    _one_line_exit_2(capsys, [tiny_h200, "--steps", "4", *cpu], "--steps", "--batch")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--steps", "0", *cpu], "--steps 0")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--set", "workload.max_tokens=4", *cpu],
                     "--set workload.max_tokens", "--steps")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--stalls", *cpu], "--stalls: not with --batch")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--set", "workload.speculative.draft_tokens=2", *cpu],
                     "workload.speculative")
    _one_line_exit_2(capsys, [tiny_h200, "--batch", "4", "--steps", "20", *cpu], "workload.batch", "trace tokens")
    _one_line_exit_2(capsys, [os.path.join(ROOT, "hwconfigs", "h200-pcie5-deepseek-v2-lite.yaml"), "--batch", "4", *cpu],
                     "batch replay", "grouped-query attention")
    _one_line_exit_2(capsys, [tiny_h200, "--set", "workload.batch=2", "--set", "workload.max_tokens=4", "--set",
                              "workload.warmup_tokens=0", "--contexts",
                              "8", "--device", "cpu", "--jobs", "1", "--out", str(tmp_path / "decode")],
                     "workload.batch 2", "--batch 2")
    assert not os.path.exists(out)  # refused before anything was written
