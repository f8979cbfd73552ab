"""Hardware replay on CPU: the decisions and bytes recorded on the H200 (validation/*.json) come out of the
same code again, the FIFO/no-cancel DMA modes behave as a CUDA copy stream, and the harness runs a plan's
copies and kernels (on CPU tensors) moving exactly the plan's bytes."""

import functools
import importlib.util
import json
import os
import re

import pytest
import simpy
from helpers import module_error

from chipsim.errors import InputError
from chipsim.hwreplay.compare import replayed_overrides
from chipsim.hwreplay.ops import primitive_ops
from chipsim.hwreplay.plan import assign_slots, build_plan
from chipsim.runner import prepare
from chipsim.sim.dma import DEMAND, PREFETCH, DmaPath
from chipsim.workload.decode import build_workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASUREMENTS = ["h200-pcie5", "h200-pcie5-granite-1b", "h200-pcie5-phi-mini-moe", "h200-pcie5-deepseek-v2-lite"]
MB = 1_000_000


def _measurement(name):
    with open(os.path.join(ROOT, "validation", f"{name}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", MEASUREMENTS)
def test_decisions_and_bytes_recorded_on_the_gpu_come_out_of_the_plan_again(name):
    meas = _measurement(name)
    # ProMoE (whose prefetches depend on timing), LRU evictions and apex-sf's use of what arrived, at one context
    cases = [c for c in meas["cases"] if c["context_length"] == 512 and c["policy"] in ("promoe", "lru", "apex-sf")]
    assert len(cases) == 3
    for case in cases:
        prep = prepare(os.path.join(ROOT, meas["config"]), [*replayed_overrides(meas), "workload.context_length=512"],
                       [case["policy"]])
        plan = build_plan(prep, prep.policies[0])
        assert plan.digest() == case["plan"]["digest"], case["policy"]
        assert plan.fetch_bytes == case["plan"]["fetch_bytes"] == case["copied_bytes"], case["policy"]
        assert plan.fetch_bytes == plan.sim_fetch_bytes  # the simulator moved the same bytes
        assert len(case["latency_ms"]) == plan.tokens == meas["tokens"]


REGIME_FILES = ["cached/h200-pcie5.json", "cached-ds/h200-pcie5-deepseek-v2-lite.json", "pcie/h200-pcie5.json",
                "q4/h200-pcie5.json", "q4-ds/h200-pcie5-deepseek-v2-lite.json", "q4-cached/h200-pcie5.json",
                "q4-ds-cached/h200-pcie5-deepseek-v2-lite.json", "dma/h200-pcie5.json",
                "dma-ds/h200-pcie5-deepseek-v2-lite.json", "q4-host/h200-pcie5.json", "q4-host-b/h200-pcie5.json",
                "q4-cached-host/h200-pcie5.json"]
# the same sets again on one later lease, energy read by nvml.Meter, the host issuing raw CUDA calls (--enqueue cudart)
REGIME_FILES += [f"settled/{name}" for name in REGIME_FILES[:9]]
# lease C: the cached replays over zero-valued experts on the step probe's board, then with the experts filled
REGIME_FILES += [f"zero-experts/{name}" for name in REGIME_FILES[:2]]
REGIME_FILES += [f"real-weights/{name}" for name in REGIME_FILES[:3]]
# every set again with the measured launch gap and hand-off in the config, one launch per segment, experts filled
REGIME_FILES += [f"launch-gaps/{name}" for name in REGIME_FILES[:9]]


@pytest.mark.parametrize("name", REGIME_FILES)
def test_the_regimes_decisions_and_bytes_come_out_of_the_plan_again(name):
    """validation/regimes' sets (cached experts, long context, PCIe-bound, 4-bit experts, DMA semantics): every ProMoE
    case, whose prefetches depend on timing, rebuilt here with the overrides the replay ran with, has the digest and
    the bytes recorded on the GPU (with a copy schedule: its spans', and one copy stream per engine); every case
    copied exactly its plan's bytes and timed stalls only in layers and tokens that exist."""
    with open(os.path.join(ROOT, "validation", "regimes", name)) as f:
        meas = json.load(f)
    for case in meas["cases"]:
        assert case["copied_bytes"] == case["plan"]["fetch_bytes"] == case["plan"]["sim_fetch_bytes"]
        assert case["energy"] and len(case["repeat_energy"]) == 1  # the board's counter around both replays
        layers = {layer for _, layer, _ in case["stall_ms"]}
        assert all(0 <= t < meas["tokens"] for t, _, _ in case["stall_ms"]) and min(layers) >= 0
    promoe = [c for c in meas["cases"] if c["policy"] == "promoe"]
    assert promoe
    for case in promoe:
        plan, moe_layers = _promoe_plan(meas["config"], (*replayed_overrides(meas),
                                                         f"workload.context_length={case['context_length']}"))
        assert plan.digest() == case["plan"]["digest"], case["context_length"]
        assert plan.fetch_bytes == case["copied_bytes"] == plan.sim_fetch_bytes
        assert case.get("copy_streams", 1) == (1 if plan.copies is None else plan.engines)
        assert max({layer for _, layer, _ in case["stall_ms"]}) < moe_layers


@functools.lru_cache(maxsize=None)
def _promoe_plan(config: str, overrides: tuple[str, ...]):
    """ProMoE's plan for a regime's case and its model's MoE layers, built once per config and overrides: later
    leases replayed the same sets again (47 cases of 29 distinct inputs), and equal inputs build the same plan."""
    prep = prepare(os.path.join(ROOT, config), list(overrides), ["promoe"])
    return build_plan(prep, prep.policies[0]), prep.workload.model.num_moe_layers


def test_every_measured_case_moved_exactly_the_plan_bytes():
    for name in MEASUREMENTS:
        for case in _measurement(name)["cases"]:
            part_copies = case["plan"]["fetches"] * len(case["plan"]["part_bytes"])
            assert case["copies"] == part_copies
            assert case["copied_bytes"] == case["plan"]["fetch_bytes"] == case["plan"]["sim_fetch_bytes"]


def _fifo_path(engines=1, setup_ps=1_000_000, latency_ps=0):
    env = simpy.Environment()
    landed = {}
    path = DmaPath(env, 100_000_000_000, latency_ps, setup_ps, engines, 256 * 1024,
                   on_landed=lambda tr: landed.__setitem__(tr.tag, env.now), preempt=False, demand_first=False)
    return env, path, landed


def test_fifo_queue_keeps_a_demand_behind_earlier_prefetches():
    env, path, landed = _fifo_path()
    path.submit(4 * MB, PREFETCH, tag="p1")  # 1 us setup + 40 us
    path.submit(4 * MB, PREFETCH, tag="p2")
    path.submit(4 * MB, DEMAND, tag="d")
    env.run()
    assert landed["p1"] == 41_000_000
    assert landed["p2"] == 82_000_000
    assert landed["d"] == 123_000_000  # one copy stream: issue order, demand or not


def test_demand_first_queue_lets_the_demand_overtake_queued_prefetches():
    env = simpy.Environment()
    landed = {}
    path = DmaPath(env, 100_000_000_000, 0, 1_000_000, 1, 256 * 1024,
                   on_landed=lambda tr: landed.__setitem__(tr.tag, env.now), preempt=False, demand_first=True)
    path.submit(4 * MB, PREFETCH, tag="p1")
    path.submit(4 * MB, PREFETCH, tag="p2")
    path.submit(4 * MB, DEMAND, tag="d")
    env.run()
    assert landed["d"] == 82_000_000 and landed["p2"] == 123_000_000


def _config(tmp_path, **dma):
    lines = [f"base: {ROOT}/hwconfigs/h200-pcie5-granite-1b.yaml", "workload:", "  max_tokens: 6", "  warmup_tokens: 0"]
    if dma:
        lines += ["dma:"] + [f"  {k}: {str(v).lower()}" for k, v in dma.items()]
    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_span_recorder_notes_a_prefetch_paused_at_a_chunk_boundary_and_resumed():
    """One engine, 100 GB/s, 1 µs setup, 1 MB chunks. A 4 MB prefetch moves from 1 µs; a 1 MB demand at 11.5 µs
    (1.05 MB moved) lets it run on to its 2 MB boundary (21 µs) and take the engine (setup to 22 µs, data to
    32 µs); the prefetch then resumes without a second setup and lands at 52 µs. Spans: the prefetch's first
    2 MB, the demand, the prefetch's last 2 MB."""
    from chipsim.hwreplay.plan import _SpanRecorder

    env = simpy.Environment()
    landed = {}
    path = DmaPath(env, 100_000_000_000, 0, 1_000_000, 1, MB, on_landed=lambda tr: landed.__setitem__(tr.tag, env.now),
                   preempt=True, demand_first=True)
    rec = path.recorder = _SpanRecorder(1)

    def demand_later():
        yield env.timeout(11_500_000)
        path.submit(MB, DEMAND, tag="d")
    path.submit(4 * MB, PREFETCH, tag="p")
    env.process(demand_later())
    env.run()
    assert landed == {"d": 32_000_000, "p": 52_000_000}
    assert rec.data_spans == [(0, 0, 1_000_000, 0, 2 * MB), (0, 1, 22_000_000, 0, MB), (0, 0, 32_000_000, 2 * MB, 4 * MB)]


def test_a_plan_with_dma_semantics_holds_the_spans_the_simulator_ran(tmp_path):
    """Two engines, demand first, preemption, cancel at chunk boundaries: every issue's spans are contiguous from
    its first byte, a completed transfer's end at the expert's last, an abandoned one's where it stopped (or it
    has none), and the spans' bytes are the bytes the simulator moved. The schedule is part of the digest."""
    semantics = dict(engines=2, demand_first=True, demand_preempts_prefetch=True, cancel_in_flight=True)
    for label in ("promoe", "static-4"):
        prep = prepare(_config(tmp_path, **semantics), (), [label])
        plan = build_plan(prep, prep.policies[0])
        assert plan.engines == 2 and {c[0] for c in plan.copies} == {0, 1}
        spans: dict[int, list] = {}
        for _, n, first, end in plan.copies:
            spans.setdefault(n, []).append((first, end))
        for n, runs in spans.items():
            assert runs[0][0] == 0 and all(a[1] == b[0] for a, b in zip(runs, runs[1:])), (label, n, runs)
        whole = sum(1 for runs in spans.values() if runs[-1][1] == plan.expert_bytes)
        cut = [runs[-1][1] for runs in spans.values() if runs[-1][1] < plan.expert_bytes]
        never = plan.fetches - len(spans)
        assert cut and never > 0 and whole > 0, label  # prefetches abandoned at routing, some half-way
        assert plan.fetch_bytes == plan.sim_fetch_bytes == whole * plan.expert_bytes + sum(cut)
        fifo = build_plan(prepare(_config(tmp_path), (), [label]), prepare(_config(tmp_path), (), [label]).policies[0])
        assert fifo.copies is None and fifo.digest() != plan.digest()


def test_a_dma_schedule_replays_on_cpu_copying_exactly_the_spans(tmp_path):
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    semantics = dict(engines=2, demand_first=True, demand_preempts_prefetch=True, cancel_in_flight=True)
    prep = prepare(_config(tmp_path, **semantics), ["workload.max_tokens=3"], ["promoe"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.full((m.num_moe_layers, m.num_experts, step.expert_bytes), 7, dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers, segments=True, stalls=True)
    assert res["copy_streams"] == 2
    assert res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes
    bounds = [sum(plan.part_bytes[:i]) for i in range(1, len(plan.part_bytes))]  # a span is one copy per part it touches
    assert res["copies"] == sum(1 + sum(a < b_ < b for b_ in bounds) for _, _, a, b in plan.copies)
    assert len(res["latency_ms"]) == plan.tokens


def test_fifo_needs_preemption_off(tmp_path):
    with pytest.raises(InputError, match="demand_first"):
        prepare(_config(tmp_path, demand_preempts_prefetch=True), (), ["no-prefetch"])


def test_no_cancel_moves_every_issued_byte_and_plan_slots_never_collide(tmp_path):
    prep = prepare(_config(tmp_path), (), ["static-4", "apex-sf", "promoe"])
    for policy in prep.policies:
        plan = build_plan(prep, policy)
        assert plan.sim_fetch_bytes == plan.fetch_bytes  # nothing stopped half-way
        held = {}
        for a in plan.actions:  # a slot is never handed out while another expert holds it
            if a[0] == "issue":
                assert a[6] not in held.values()
                held[(a[3], a[4])] = a[6]
            elif a[0] == "evict":
                held.pop((a[3], a[4]))
            elif a[0] == "compute":
                assert all((a[2], e) in held for e in a[3])  # every computed expert is in the buffer


def test_assign_slots_reuses_the_lowest_free_slot():
    actions = [["issue", 0, 0, 0, 5, "demand"], ["issue", 0, 0, 0, 6, "demand"], ["evict", 0, 0, 0, 5],
               ["issue", 0, 0, 1, 7, "prefetch"], ["issue", 0, 0, 1, 8, "prefetch"]]
    out = assign_slots(actions, 3)
    assert [a[-1] for a in out if a[0] == "issue"] == [0, 1, 0, 2]
    with pytest.raises(RuntimeError):
        assign_slots(actions[:2] + [["issue", 0, 0, 2, 1, "demand"]], 2)


def test_primitive_ops_cost_exactly_the_workload_groups():
    prep = prepare(f"{ROOT}/hwconfigs/h200-pcie5-deepseek-v2-lite.yaml", ["workload.context_length=512"], ["no-prefetch"])
    hw = prep.config.hw
    groups = primitive_ops(hw)
    wl = build_workload(hw)
    from chipsim.hw.compute_formula import ArrayModel

    am = ArrayModel(hw)

    def cost(prims):
        total = 0
        for p in prims:
            if p.kind == "matvec":
                total += am.matvec(p.name, p.reduction, p.outputs, p.weight_bytes, p.write_bytes).duration_ps
            elif p.kind == "sfu":
                total += am.sfu(p.name, p.elements).duration_ps
            else:
                total += am.vector(p.name, p.elements, p.weight_bytes).duration_ps
        return total

    moe = wl.moe_layer(0)
    launch = am.group_launch_ps  # each group is one launch (one CUDA graph in the replay)
    assert launch > 0
    assert cost(groups["attention"]) + launch == moe.attention.duration_ps
    assert cost(groups["router"]) + launch == moe.router.duration_ps
    assert cost(groups["shared"]) + launch == moe.dense.duration_ps
    assert cost(groups["expert"]) + launch == moe.expert.duration_ps
    assert cost(groups["dense"]) + launch == wl.layers[0].dense.duration_ps
    assert cost(groups["head"]) + launch == wl.token_head.duration_ps
    # the expert's matvec operands are exactly one expert's bytes: the harness reads them from its slot
    matvec_bytes = sum(p.weight_bytes for p in groups["expert"] if p.kind == "matvec")
    assert matvec_bytes == wl.expert_bytes


def test_harness_replays_a_plan_on_cpu_tensors_moving_exactly_its_bytes(tmp_path):
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    prep = prepare(_config(tmp_path), ["workload.max_tokens=3"], ["promoe", "lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    nbytes = prep.workload.expert_bytes
    assert step.expert_bytes == nbytes
    host = torch.zeros((m.num_moe_layers, m.num_experts, nbytes), dtype=torch.uint8)
    host[3, 7].fill_(15)  # one expert carries a mark: it must land in the slot the plan gave it
    for policy, segments in [(p, s) for p in prep.policies for s in (False, True)]:
        plan = build_plan(prep, policy)
        slots = torch.zeros((plan.slots, nbytes), dtype=torch.uint8)
        res = replay(plan, step, host, slots, m.first_dense_layers, segments=segments, stalls=segments)
        assert res["copied_bytes"] == plan.fetch_bytes
        assert res["copies"] == plan.fetches * len(plan.part_bytes)
        assert len(res["latency_ms"]) == plan.tokens
        final = {}  # slot -> the expert copied into it last
        for a in plan.actions:
            if a[0] == "issue":
                final[a[6]] = (a[3], a[4])
        for slot, key in final.items():  # every copy landed in the slot the plan gave it
            assert bool((slots[slot] == (15 if key == (3, 7) else 0)).all()), (policy.label, slot, key)
        if segments and policy.label == "lru":  # no prefetch: a layer waits for copies exactly where it issued some
            issued = {(a[1], a[3]) for a in plan.actions if a[0] == "issue"}
            assert {(t, layer) for t, layer, _ in res["stall_ms"]} == issued
            assert all(ms >= 0 for *_, ms in res["stall_ms"])


def test_a_4bit_expert_is_two_packed_matvecs_with_the_dequantisation_fused_into_them(tmp_path):
    """At model.expert_bits 4 the expert's matvecs are noted with 4 bits and group 128 (their bytes: half a byte per
    weight plus a 2-byte scale per 128), the dequantisation is fused (no kernel of its own), and the attention's
    BF16 matvecs stay 16-bit."""
    prep = prepare(_config(tmp_path), ["model.expert_bits=4"], ["lru"])
    groups = primitive_ops(prep.config.hw)
    mv = [p for p in groups["expert"] if p.kind == "matvec"]
    assert [(p.bits, p.quant_group) for p in mv] == [(4, 128), (4, 128)]
    for p in mv:
        assert p.weight_bytes == p.reduction * p.outputs // 2 + p.reduction * p.outputs // 128 * 2
    assert [p.name for p in groups["expert"] if p.fused] == ["expert_dequant"]
    assert all(p.bits == 16 and not p.fused for p in groups["attention"])
    assert sum(p.weight_bytes for p in mv) == prep.workload.expert_bytes


def test_the_4bit_shapes_timed_are_those_the_bf16_profile_lacked():
    """microbench --set model.expert_bits=4: of all the decode steps' shapes, only the 4-bit experts' matvecs (two per
    model shape) and their fused dequantisation are not BF16 shapes; the committed 4-bit file timed exactly those,
    and with it in the config nothing is missing any more (--missing-from)."""
    from chipsim.hwreplay.microbench import decode_shapes

    g, d = (os.path.join(ROOT, "hwconfigs", f) for f in ("h200-pcie5.yaml", "h200-pcie5-deepseek-v2-lite.yaml"))
    bf16 = {p.key for p, _ in decode_shapes([g, d], [1024])}
    new = [p for p, _ in decode_shapes([g, d], [1024], ["model.expert_bits=4"]) if p.key not in bf16]
    assert sorted((p.name, p.bits, p.fused) for p in new) == (
        [("expert_dequant", 16, True)] * 2 + [("expert_down", 4, False)] * 2 + [("expert_gate_up", 4, False)] * 2)
    with open(os.path.join(ROOT, "validation", "compute", "h200-op-times-q4.json")) as f:
        assert {r["key"] for r in json.load(f)["op_times"]} == {p.key for p in new}
    assert decode_shapes([g, d], [1024], ["model.expert_bits=4"], [g]) == []


@pytest.mark.parametrize("device, message", [("bogus", "--device bogus: not a torch device"),
                                             ("cuda:0", "--device cuda:0: torch")])
def test_a_device_torch_does_not_know_or_cannot_reach_is_one_line_and_nothing_made(tmp_path, device, message):
    torch = pytest.importorskip("torch")
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    from chipsim.hwreplay.run import main

    with pytest.raises(InputError, match=f"^{re.escape(message)}"):
        main([_config(tmp_path), "--device", device, "--policy", "lru", "--contexts", "512", "--jobs", "1",
              "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_replay_of_fp32_experts_is_refused_in_one_line(tmp_path):
    pytest.importorskip("torch")
    from chipsim.hwreplay.run import main

    with pytest.raises(InputError, match="BF16 experts or 4- or 8-bit ones"):
        main([_config(tmp_path), "--device", "cpu", "--set", "model.expert_bits=32", "--policy", "lru",
              "--contexts", "512", "--jobs", "1", "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("setting, message", [("model.expert_bits=5", "BF16 experts or 4- or 8-bit ones"),
                                              ("model.dense_bits=8", "model.dense_bits 8: the replay runs BF16 "
                                                                     "non-expert weights")])
def test_a_replay_of_5_bit_experts_or_quantised_dense_weights_is_refused_in_one_line(tmp_path, setting, message):
    pytest.importorskip("torch")
    from chipsim.hwreplay.run import main

    with pytest.raises(InputError, match=message):
        main([_config(tmp_path), "--device", "cpu", "--set", setting, "--policy", "lru",
              "--contexts", "512", "--jobs", "1", "--out", str(tmp_path / "out")])


def test_the_replay_s_primitives_refuse_quantised_dense_weights(tmp_path):
    from chipsim.hw.config import load_config

    with pytest.raises(InputError, match="model.dense_bits 4"):
        primitive_ops(load_config(_config(tmp_path), ["model.dense_bits=4"]).hw)


def test_the_4bit_reference_kernel_is_offset_and_scale_per_weight_by_hand():
    """Byte 0x3A of group 0 holds column 0 (low nibble 0xA: 10 - 8 = 2) and column 64 (high 0x3: 3 - 8 = -5);
    with scales 0.5 and 2 for the two groups of a 256-column row, x = 1 at columns 0, 64 and 128:
    2 x 0.5 + (-5) x 0.5 + (column 128: byte 64's low nibble, 0x9: 1) x 2 = 0.5."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import dequantise_q4, kernel_call, q4_views
    from chipsim.hwreplay.ops import Primitive

    p = Primitive("matvec", "expert_down", reduction=256, outputs=1, weight_bytes=128 + 4, bits=4, quant_group=128)
    buf = torch.full((p.weight_bytes,), 0x88, dtype=torch.uint8)  # every weight 0
    buf[0], buf[64] = 0x3A, 0x89
    buf[128:].view(torch.bfloat16)[:] = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    packed, scales = q4_views(buf, p)
    w = dequantise_q4(packed, scales)
    assert (w[0, 0].item(), w[0, 64].item(), w[0, 128].item()) == (1.0, -2.5, 2.0)
    assert int((w != 0).sum()) == 3
    x = torch.zeros(256, dtype=torch.bfloat16)
    x[[0, 64, 128]] = 1.0
    out = torch.zeros(4, dtype=torch.bfloat16)
    fn, args, kwargs = kernel_call(p, (packed, scales), x, None, None, out)
    fn(*args, **kwargs)
    assert out[0].item() == 0.5


@pytest.mark.parametrize("argv, words", [
    (["--bogus"], "unrecognized arguments: --bogus"),  # was the usage twice, 6 lines
    ([], "needs a CUDA GPU"),  # was a RuntimeError traceback from the first CUDA call
    (["--gemv", "cublas"], "needs a CUDA GPU"),
    (["--contexts", "x"], "--contexts 'x': expected whole numbers"),
])
def test_microbench_refuses_a_bad_option_or_a_machine_without_cuda_in_one_line(tmp_path, capsys, monkeypatch, argv,
                                                                                words):
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay import microbench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, wherever this runs
    out = tmp_path / "mb.json"
    assert words in module_error(capsys, microbench.main, [*argv, "--out", str(out)])
    assert not out.exists()
    assert "is a directory" in module_error(capsys, microbench.main, ["--out", str(tmp_path)])


def test_a_microbenchmark_chain_gives_each_kernel_its_own_weights_bf16_or_4bit():
    """shape_chain over an 8,192-byte pool: a 4 x 8 BF16 matvec (64 bytes) gets 128 kernels over consecutive
    64-byte operands; a 2 x 256 4-bit one (256 packed bytes + 4 scales x 2 bytes = 264) 31 over consecutive
    264-byte ones, the scales right after the packed bytes. Every kernel runs (CPU: the reference kernels)."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.microbench import shape_chain
    from chipsim.hwreplay.ops import Primitive

    pool = torch.zeros(4096, dtype=torch.bfloat16)
    x, out = torch.ones(512, dtype=torch.bfloat16), torch.zeros(512, dtype=torch.bfloat16)
    base = pool.data_ptr()
    bf16 = Primitive("matvec", "m", reduction=8, outputs=4, weight_bytes=64)
    chain = shape_chain(bf16, pool, x, None, None, out)
    assert len(chain) == 128 and [c[1][0].data_ptr() - base for c in chain] == [64 * i for i in range(128)]
    q4 = Primitive("matvec", "expert_down", reduction=256, outputs=2, weight_bytes=264, bits=4, quant_group=128)
    chain = shape_chain(q4, pool, x, None, None, out)
    assert len(chain) == 31
    assert [c[1][0].data_ptr() - base for c in chain] == [264 * i for i in range(31)]  # packed bytes
    assert all(c[1][1].data_ptr() - c[1][0].data_ptr() == 256 for c in chain)  # then the scales
    for fn, args, kwargs in chain[:2]:
        fn(*args, **kwargs)


def test_a_4bit_plan_replays_on_cpu_moving_exactly_its_packed_bytes(tmp_path):
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    prep = prepare(_config(tmp_path), ["workload.max_tokens=3", "model.expert_bits=4"], ["lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    assert step.expert_bytes == prep.workload.expert_bytes
    host = torch.full((m.num_moe_layers, m.num_experts, step.expert_bytes), 0x99, dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers, segments=True)
    assert res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes
    assert plan.expert_bytes == prep.workload.expert_bytes  # a quarter of the BF16 expert's, plus the scales


def test_a_segment_replay_launches_each_run_of_compute_between_copy_synchronisations_once(tmp_path):
    """With segments, consecutive op groups become one program step: a token with no copy is one run of compute
    from its first layer to its head, and each copy the plan issues adds at most two boundaries (the issue point
    and the wait for it)."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    prep = prepare(_config(tmp_path), ["workload.max_tokens=3"], ["lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    by_group = replay(plan, step, host, slots, m.first_dense_layers)
    merged = replay(plan, step, host, slots, m.first_dense_layers, segments=True)
    assert merged["launches_per_token"] == by_group["launches_per_token"]  # the same kernels, on a CPU
    issues = sum(1 for a in plan.actions if a[0] == "issue")
    # the merged program: per issue a marker, a wait and a copy entry and its done event (4 steps), per wait
    # on the compute side one step, per token one "tok" step, and between them runs of compute
    assert merged["program_steps"] < by_group["program_steps"]
    assert merged["program_steps"] <= 4 * issues + 2 * issues + 2 * plan.tokens


@pytest.mark.parametrize("policy, semantics", [("lru", {}), ("promoe", {}), ("static-4", {}),
                                              ("promoe", dict(engines=2, demand_first=True,
                                                              demand_preempts_prefetch=True, cancel_in_flight=True))])
def test_the_simulator_launches_as_many_segments_as_the_segment_replay(tmp_path, policy, semantics):
    """compute.launch_per: segment charges one launch per run of compute between synchronisations with the DMA;
    the segment replay's program, built from the same plan, launches one graph per such run. The two counts are
    made independently (the engine as it simulates, the harness from the action list) and must agree."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    sets = ["workload.max_tokens=4", "compute.launch_per=segment", "compute.op_group_launch_ns=2000",
            "expert_buffer.capacity_mib=96"]
    prep = prepare(_config(tmp_path, **semantics), sets, [policy])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers, segments=True)
    assert plan.fetches > 0 and plan.sim_segment_launches > plan.tokens  # copies break tokens into segments
    assert plan.sim_segment_launches == res["compute_steps_per_token"] * plan.tokens
    assert plan.to_json()["sim_segment_launches"] == plan.sim_segment_launches


def test_a_segment_launch_is_charged_per_segment_not_per_op_group(tmp_path):
    """Everything cached and nothing fetched after the first token: from then on a token is one segment, so per
    token it pays one launch (L) where per-group launching pays one per op group."""
    L = 5_000  # ns
    base = ["workload.max_tokens=64", "expert_buffer.capacity_mib=100000", f"compute.op_group_launch_ns={L}"]
    runs = {}
    for per in ("op_group", "segment", None):
        sets = base + [f"compute.launch_per={per}"] if per else base[:-1] + ["compute.op_group_launch_ns=0"]
        prep = prepare(_config(tmp_path), sets, ["lru"])
        runs[per] = build_plan(prep, prep.policies[0])
    free, seg, per_group = runs[None], runs["segment"], runs["op_group"]
    m = prepare(_config(tmp_path), base, ["lru"]).workload.model
    warm = [t for t in range(1, seg.tokens) if not any(a[0] == "issue" and a[1] in (t - 1, t) for a in seg.actions)]
    assert len(warm) >= 5, warm  # tokens that fetch nothing, after one that fetched nothing
    for t in warm:
        assert seg.sim_latency_ms[t] == pytest.approx(free.sim_latency_ms[t] + L / 1e6, abs=2e-6)
        assert per_group.sim_latency_ms[t] > free.sim_latency_ms[t] + 2 * m.num_layers * L / 1e6


def test_hwcompare_recomputes_a_case_and_reports_its_error(tmp_path):
    from chipsim.hwreplay import compare

    meas = _measurement("h200-pcie5-phi-mini-moe")
    meas["cases"] = [c for c in meas["cases"] if c["context_length"] == 2048 and c["policy"] in ("no-prefetch", "oracle")]
    meas["config"] = os.path.join(ROOT, meas["config"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(meas))
    res = compare.compare_file(str(path))
    assert [r["policy"] for r in res["rows"]] == ["no-prefetch", "oracle"]
    for row, case in zip(res["rows"], meas["cases"]):
        measured = case["latency_ms"][meas["warmup_tokens"]:]
        assert row["measured_ms"] == pytest.approx(sum(measured) / len(measured))
        assert row["error_pct"] == pytest.approx(100 * (row["simulated_ms"] - row["measured_ms"]) / row["measured_ms"])
        assert row["decisions_match"] and row["plan_bytes"] == row["copied_bytes"]
    assert compare.mape(res["rows"]) == pytest.approx(sum(abs(r["error_pct"]) for r in res["rows"]) / 2)
    text = compare.report([res], None, "phi-mini-moe", ["cmd"], ["- a finding"])
    assert "| held out (phi-mini-moe) | 2 |" in text and "- a finding" in text


def test_hwcompare_rejects_a_file_that_is_not_a_measurement(tmp_path):
    from chipsim.hwreplay import compare

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="not a chipsim hwreplay measurement"):
        compare.compare_file(str(bad))
    with pytest.raises(InputError, match="file not found"):
        compare.compare_file(str(tmp_path / "missing.json"))


def _one_case(tmp_path, edit=None) -> str:
    """validation/h200-pcie5-granite-1b.json cut to its first case (its config named from anywhere), edited."""
    meas = _measurement("h200-pcie5-granite-1b")
    meas["cases"] = meas["cases"][:1]
    meas["config"] = os.path.join(ROOT, meas["config"])
    if edit:
        edit(meas, meas["cases"][0])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(meas))  # NaN and Infinity as Python's json writes them (and reads them back)
    return str(path)


def _hwcompare_error(capsys, tmp_path, argv) -> str:
    """chipsim hwcompare ARGV --report R --json J: exit 2, one line, no traceback, neither output written."""
    from chipsim.cli import main

    report, rows = tmp_path / "out" / "V.md", tmp_path / "out" / "rows.json"
    report.parent.mkdir(exist_ok=True)
    code = main(["hwcompare", *argv, "--jobs", "1", "--report", str(report),
                 *([] if "--json" in argv else ["--json", str(rows)])])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("chipsim: error: "), (code, err)
    assert "Traceback" not in err and not report.exists() and not rows.exists()
    return lines[0]


def _set(field, value):
    return lambda meas, case: case.__setitem__(field, value)


def _set_token(index, value):
    return lambda meas, case: case["latency_ms"].__setitem__(index, value)


# each bad measurement field, refused when the file is read, naming the file, the case and the field
BAD_MEASUREMENTS = {
    "warm-up negative": (lambda m, c: m.__setitem__("warmup_tokens", -5), "warmup_tokens: must be at least 0, got -5"),
    "warm-up a string": (lambda m, c: m.__setitem__("warmup_tokens", "x"),
                         "warmup_tokens: expected an integer, got 'x'"),
    "latency negative": (_set_token(20, -1.5), "cases[0].latency_ms[20]: must be positive, got -1.5"),
    "latency boolean": (_set_token(20, True), "cases[0].latency_ms[20]: expected a number, got True"),
    "latency a string": (_set_token(20, "5"), "cases[0].latency_ms[20]: expected a number, got '5'"),
    "latency NaN": (_set_token(20, float("nan")), "cases[0].latency_ms[20]: must be finite, got nan"),
    "latency infinite": (_set_token(20, float("inf")), "cases[0].latency_ms[20]: must be finite, got inf"),
    "latencies all 0": (lambda m, c: c.__setitem__("latency_ms", [0.0] * 144),
                        "cases[0].latency_ms[0]: must be positive, got 0.0"),
    "no latency": (_set("latency_ms", []), "cases[0].latency_ms: 0 tokens, not more than the 16 warm-up tokens"),
    "latencies within the warm-up": (lambda m, c: c.__setitem__("latency_ms", c["latency_ms"][:16]),
                                     "cases[0].latency_ms: 16 tokens, not more than the 16 warm-up tokens"),
    "latencies missing": (lambda m, c: c.pop("latency_ms"), "cases[0].latency_ms: missing"),
    "a repeat's NaN": (lambda m, c: c.__setitem__("repeat_latency_ms", [[float("nan")] * 144]),
                       "cases[0].repeat_latency_ms[0][0]: must be finite"),
    "host enqueue missing": (lambda m, c: c.pop("host_enqueue_ms"), "cases[0].host_enqueue_ms: missing"),
    "copied bytes negative": (_set("copied_bytes", -1), "cases[0].copied_bytes: must be at least 0"),
    "energy of 0 J": (_set("energy", {"energy_j": 0, "seconds": 1.0, "power_w": 100.0}),
                      "cases[0].energy.energy_j: must be positive"),
    "a stall past the last token": (_set("stall_ms", [[144, 0, 0.1]]), "cases[0].stall_ms[0][0]: must be at most 143"),
    "a stall past the last layer": (_set("stall_ms", [[20, 24, 0.1]]), "cases[0].stall_ms[0][1]: must be at most 23"),
    "a case not an object": (lambda m, c: m.__setitem__("cases", [[1]]),
                             "cases[0]: expected a JSON object, got a list"),
    "no case": (lambda m, c: m.__setitem__("cases", []), "cases: expected a non-empty list of objects, got 0"),
    "cases an object": (lambda m, c: m.__setitem__("cases", {}), "cases: expected a list of objects, got an object"),
    "no device": (lambda m, c: m.pop("device"), "device: missing"),
}


@pytest.mark.parametrize("name", BAD_MEASUREMENTS)
def test_hwcompare_refuses_a_bad_measurement_field_naming_it_before_any_work(tmp_path, capsys, name):
    """Each was a silently wrong MAPE, 'nan %', bare NaN in --json, an empty table or a traceback."""
    edit, words = BAD_MEASUREMENTS[name]
    path = _one_case(tmp_path, edit)
    line = _hwcompare_error(capsys, tmp_path, [path])
    assert line.startswith(f"chipsim: error: {path}: ") and words in line, line


def _json_file(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _microbench_without(tmp_path, key) -> str:
    mb = _measurement("h200-microbench")
    del mb[key]
    return _json_file(tmp_path, f"mb-{key}.json", mb)


MICROBENCH = os.path.join(ROOT, "validation", "h200-microbench.json")
PCIE = [os.path.join(ROOT, "validation", "pcie", f) for f in ("h200-host-pcie.json", "h200-copy-latency.json")]
CYCLE_LEVEL = os.path.join(ROOT, "hwconfigs", "h200-cycle-level.yaml")
# each option's bad file, unwritable output or meaningless pairing: (its arguments, the line's words)
BAD_OPTIONS = {
    "microbench without gemv_fit": (lambda t: ["--microbench", _microbench_without(t, "gemv_fit")],
                                    "gemv_fit: missing"),
    "microbench []": (lambda t: ["--microbench", _json_file(t, "e.json", [])], "e.json: expected a JSON object"),
    "op-energy []": (lambda t: ["--op-energy", _json_file(t, "e.json", [])], "e.json: expected a JSON object"),
    "pcie-probes []": (lambda t: ["--microbench", MICROBENCH, "--pcie-probes", PCIE[0], _json_file(t, "e.json", [])],
                       "e.json: expected a JSON object"),
    "pcie-probes without microbench": (lambda t: ["--pcie-probes", *PCIE], "--pcie-probes: goes with --microbench"),
    "json in a missing folder": (lambda t: ["--json", str(t / "missing" / "x.json")], "does not exist"),
    "figures a regular file": (lambda t: ["--regime", "r", _one_case(t), "--figures", _json_file(t, "f", 1)],
                               "exists and is not a directory"),
    "held-out no file has": (lambda t: ["--held-out", "nope"], "--held-out nope: no measurement file is of this model"),
    "cycle-level without microbench": (lambda t: ["--cycle-level", CYCLE_LEVEL], "--cycle-level: goes with --microbench"),
    "cycle-level without op_times": (lambda t: ["--microbench", _microbench_without(t, "op_times"), "--cycle-level",
                                                CYCLE_LEVEL], "has no op_times"),
    "gemv-probe without cycle-level": (lambda t: ["--gemv-probe", MICROBENCH], "--gemv-probe: goes with --cycle-level"),
}


@pytest.mark.parametrize("name", BAD_OPTIONS)
def test_hwcompare_refuses_a_bad_option_before_any_work(tmp_path, capsys, name):
    """Each was a traceback (a KeyError, an AttributeError, a FileNotFoundError after the report was written) or
    silently unused."""
    argv_of, words = BAD_OPTIONS[name]
    argv = argv_of(tmp_path)  # (writes its files first)
    line = _hwcompare_error(capsys, tmp_path, [_one_case(tmp_path), *argv])
    assert words in line, line


def test_hwcompare_says_no_case_where_a_mape_has_none_never_nan():
    """A regime without an overlapped policy's case, a run without the held-out shape: '–' in the summary, 'no case'
    on the printed line; the committed VALIDATION.md has no such cell."""
    from chipsim.hwreplay import compare

    row = {"policy": "lru", "model": "granite", "context_length": 512, "error_pct": 2.0, "array_model_error_pct": 3.0,
           "plan_bytes": 1, "copied_bytes": 1, "measured_plan_bytes": 1, "decisions_match": True, "profiled_ops": 1,
           "modelled_ops": 0}
    (line,) = compare.summary_lines({"all": [row]})[2:]
    assert line.startswith("| all | 1 | 2.0 % | – | +2.0 % ") and "nan" not in line
    assert compare._table([]) == ["No measurement file has a case of this shape."]
    with open(os.path.join(ROOT, "VALIDATION.md"), encoding="utf-8") as f:
        assert "nan %" not in f.read()


def test_hwcompare_prints_no_case_for_a_held_out_shape_it_has_not(capsys):
    from chipsim.hwreplay import compare

    compare._print_mapes([{"model": "granite", "error_pct": -4.0}], "deepseek-v2-lite", [])
    assert capsys.readouterr().out == "latency MAPE 4.0 % over 1 cases; held out (deepseek-v2-lite) no case\n"


def test_h200_config_is_written_from_the_committed_microbenchmarks_alone():
    """Every value of hwconfigs/h200-pcie5.yaml comes back from the committed single-op measurements: the copy and
    kernel microbenchmarks, the long-context and 4-bit kernel shapes and the energy probe (its header names the
    command)."""
    import yaml

    from chipsim.hwreplay.energy_table import derive
    from chipsim.hwreplay.gpuconfig import render

    def load(*parts):
        with open(os.path.join(ROOT, *parts)) as f:
            return json.load(f)

    mb = load("validation", "h200-microbench.json")
    extra_names = ("long", "q4", "q8", "prefill-phi", "prefill-gpt-oss")
    extra = tuple((f"validation/compute/h200-op-times-{n}.json", load("validation", "compute", f"h200-op-times-{n}.json"))
                  for n in extra_names)
    long_ops, q4_ops, q8_ops = (e[1] for e in extra[:3])
    fit = derive(load("validation", "energy", "h200-energy-probe-bf16.json"))
    with open(os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")) as f:
        text = f.read()
    committed = yaml.safe_load(text)
    assert " ".join(f"--op-times-extra {path}" for path, _ in extra) in text.splitlines()[2]
    assert "--host-cpu validation/compute/h200-host-cpu-expert.json" in text.splitlines()[2]
    assert "--energy-probe validation/energy/h200-energy-probe-bf16.json" in text.splitlines()[2]
    assert ("--handoff validation/compute/h200-handoff.json --launch-gaps validation/compute/h200-launch-gaps.json"
            " --op-energy validation/energy/h200-op-energy-settled.json --op-energy "
            "validation/energy/h200-op-energy-q4.json") in text.splitlines()[2]
    op_energy = tuple((f"validation/energy/{n}", load("validation", "energy", n))
                      for n in ("h200-op-energy-settled.json", "h200-op-energy-q4.json"))
    launches = {c["kernel_launch"] for name in MEASUREMENTS for c in _measurement(name)["cases"]}
    assert len(launches) == 1  # every committed replay ran the same way, and the config says which
    mode = launches.pop()
    rendered = render(mb, mode, extra, fit, "validation/energy/h200-energy-probe-bf16.json",
                      handoff=load("validation", "compute", "h200-handoff.json"),
                      handoff_source="validation/compute/h200-handoff.json",
                      launch_gaps=load("validation", "compute", "h200-launch-gaps.json"),
                      launch_gaps_source="validation/compute/h200-launch-gaps.json", op_energy=op_energy,
                      host_probe=load("validation", "compute", "h200-host-cpu-expert.json"),
                      host_probe_source="validation/compute/h200-host-cpu-expert.json")
    assert yaml.safe_load(rendered) == committed  # every value, nothing edited by hand
    tiny = mb["tiny_kernels"]
    per_kernel = tiny["gpu_us_per_kernel"] if mode == "eager" else tiny["graph_us_per_kernel"]
    assert committed["compute"]["op_overhead_cycles"] == round(per_kernel * committed["compute"]["clock_mhz"])
    field = "eager_us" if mode == "eager" else "graph_us"
    profiled = {r["key"]: round(r[field] * 1e3, 1) for r in mb["op_times"]}  # the main file's shapes keep its times
    for r in long_ops["op_times"] + q4_ops["op_times"] + q8_ops["op_times"]:
        profiled.setdefault(r["key"], round(r[field] * 1e3, 1))
    fused = [k for k, r in ((r["key"], r) for r in q4_ops["op_times"]) if r.get("fused")]
    assert len(fused) == 2 and all(profiled[k] == 0.0 for k in fused)  # the 4-bit experts' dequantisation
    # the decode files' shapes by hand (the prefill files' rows: chipsim.hwreplay.gpuconfig's table, rendered above)
    assert {k: committed["compute"]["op_times_ns"][k] for k in profiled} == profiled
    assert committed["links"]["pcie"]["bandwidth_gbps"] == mb["h2d_pinned_queued16_fit"]["bandwidth_gbps"]
    assert committed["dma"]["setup_ns"] == round(mb["h2d_pinned_queued16_fit"]["intercept_us"] * 1e3, 1)
    # energy: the board's idle power over the SMs, the busy SMs' power while they run, a copied bit's energy
    # split between the link and its HBM write
    arrays = committed["compute"]["arrays"]
    assert committed["compute"]["leakage_power_w_per_array"] * arrays == pytest.approx(fit.idle_w, abs=0.01)
    assert committed["compute"]["clock_power_w_per_array"] * arrays == pytest.approx(fit.busy_w, abs=0.01)
    assert committed["compute"]["clock_gated_when_idle"] is True
    assert committed["compute"]["clock_power_by_occupancy"] is True  # one-block kernels draw ~nothing above idle
    hbm, pcie = committed["memory"]["hbm"]["energy_pj_per_bit"], committed["links"]["pcie"]["energy_pj_per_bit"]
    assert hbm + pcie == pytest.approx(fit.pcie_pj_per_bit, abs=1e-3)
    # each kernel shape's energy alone, per kernel: (its window's power - the idle windows' mean) x seconds / kernels
    by_hand = {}
    for _, probe in op_energy:
        idle = [w["energy_j"] / w["seconds"] for w in probe["windows"] if w["kind"] == "idle"]
        for w in probe["windows"]:
            if w["kind"] == "op" and w["key"] not in by_hand:
                pj = 1e12 * (w["energy_j"] / w["seconds"] - sum(idle) / len(idle)) * w["seconds"] / (
                    w["kernels_per_call"] * w["calls"])
                if pj > 0:  # a shape that drew no measurable energy is left to the table
                    by_hand[w["key"]] = round(pj)
            elif w["kind"] == "fused":
                by_hand.setdefault(w["key"], 0)  # inside the 4-bit matvecs, whose energy holds it
    assert committed["compute"]["op_energy_pj"] == by_hand
    assert len(by_hand) == 68 + 6 and set(fused) <= set(by_hand)  # every shape of both probes, the fused ones at 0


def test_the_handoff_and_launch_gap_probes_give_their_keys_medians():
    """gpuconfig --handoff / --launch-gaps: compute.copy_wait_ns is the median over copy sizes of the committed
    probe's copy-then-graph hand-off, compute.op_group_launch_ns the median over graph sizes of what a graph adds
    after another (by hand from the files: 2.368 and 1.712 us -> 2040 ns; 1.19, 2.807, 2.035 us -> 2035 ns)."""
    import yaml

    from chipsim.hwreplay.gpuconfig import render

    def load(*parts):
        with open(os.path.join(ROOT, *parts)) as f:
            return json.load(f)

    handoff = load("validation", "compute", "h200-handoff.json")
    gaps = load("validation", "compute", "h200-launch-gaps.json")
    assert sorted(v["summary"]["handoff_copy_to_compute_us"]["median"] for v in handoff["copies"].values()) == [1.712, 2.368]
    assert sorted(v["us_per_graph_over_chain"]["graphs"] for v in gaps["results"].values()) == [1.19, 2.035, 2.807]
    cfg = yaml.safe_load(render(load("validation", "h200-microbench.json"), "graph", handoff=handoff,
                                handoff_source="h.json", launch_gaps=gaps, launch_gaps_source="g.json"))
    assert cfg["compute"]["copy_wait_ns"] == 2040.0 and cfg["compute"]["op_group_launch_ns"] == 2035.0
    with pytest.raises(InputError, match="g.json: not probe_launch_gaps.py's output"):
        render(load("validation", "h200-microbench.json"), "graph", launch_gaps={"results": {"K=1": {}}},
               launch_gaps_source="g.json")


def test_the_step_cost_probe_gives_the_median_launch_beside_a_copy():
    """gpuconfig --step-costs: compute.launch_beside_copy_ns is the median, over both committed H100 files' op groups,
    of what a graph launch adds beside copies (graphs_beside_copies less graphs, per graph; by hand: 16-bit expert
    17.288 - 14.648 = 2.640, combine 0.779, attention and router (53.674 - 49.062) / 2 = 2.306; 4-bit 1.757, 0.796,
    1.687 us -> the median of the six, (1.687 + 1.757) / 2 = 1.722 us)."""
    import yaml

    from chipsim.hwreplay.gpuconfig import render

    def load(*parts):
        with open(os.path.join(ROOT, *parts)) as f:
            return json.load(f)

    files = tuple((p, load("validation", "h100", p)) for p in ("h100-step-costs.json", "h100-step-costs-q4.json"))
    cfg = yaml.safe_load(render(load("validation", "h200-microbench.json"), "graph", step_costs=files))
    assert cfg["compute"]["launch_beside_copy_ns"] == 1722.0
    assert "launch_beside_copy_ns" not in yaml.safe_load(render(load("validation", "h200-microbench.json"), "graph"))["compute"]
    # a whole layer's segment graph (the probe's "layer" kind) is reported, not part of the per-op-group key
    layered = tuple((p, {**f, "kinds": {**f["kinds"], "layer": {"config": {"graphs_per_step": 1},
                                                              "graphs": {"us_per_step": 100.0},
                                                              "graphs_beside_copies": {"us_per_step": 900.0}}}})
                    for p, f in files)
    cfg = yaml.safe_load(render(load("validation", "h200-microbench.json"), "graph", step_costs=layered))
    assert cfg["compute"]["launch_beside_copy_ns"] == 1722.0
    with pytest.raises(InputError, match="s.json: not probe_step_costs.py's output"):
        render(load("validation", "h200-microbench.json"), "graph", step_costs=(("s.json", {"kinds": {"expert": {}}}),))


def test_the_step_cost_probe_gives_each_groups_cost_in_sequence():
    """gpuconfig --step-costs: compute.in_sequence_ns is, per op-group kind, the median over the files of its steps'
    kernels in one graph (chain) less each kernel chained alone (kernels_alone_us). By hand from lease s's two files
    (16- and 4-bit experts): expert 12.051 - 11.970 = 0.081 and 9.966 - 9.813 = 0.153 -> 0.117 us; combine 0.005 and
    0.003 -> 0.004; attention and router (charged to attention) 44.422 - 42.631 = 1.791 and 44.398 - 42.727 = 1.671
    -> 1.731. The whole layer's figures (143.023 - 137.946 = 5.08, 125.778 - 121.566 = 4.21) are listed beside."""
    import yaml

    from chipsim.hwreplay.gpuconfig import render

    def load(*parts):
        with open(os.path.join(ROOT, *parts)) as f:
            return json.load(f)

    files = tuple((p, load("validation", "h100", p)) for p in ("h100-step-costs-lease-s.json",
                                                               "h100-step-costs-q4-lease-s.json"))
    text = render(load("validation", "h200-microbench.json"), "graph", step_costs=files)
    assert yaml.safe_load(text)["compute"]["in_sequence_ns"] == {"attention": 1731.0, "expert": 117.0, "combine": 4.0}
    line = next(x for x in text.splitlines() if x.startswith("  in_sequence_ns:"))
    assert "5.08 (h100-step-costs-lease-s.json), 4.21 (h100-step-costs-q4-lease-s.json) us" in line
    assert "in_sequence_ns" not in yaml.safe_load(render(load("validation", "h200-microbench.json"), "graph"))["compute"]
    no_chain = (("s.json", {**files[0][1], "kinds": {**files[0][1]["kinds"], "combine": {
        **files[0][1]["kinds"]["combine"], "chain": {}}}}),)
    with pytest.raises(InputError, match=r"^s.json: not probe_step_costs.py's output \(no kinds.combine.chain"):
        render(load("validation", "h200-microbench.json"), "graph", step_costs=no_chain)


def test_a_leases_own_keys_plan_its_keyed_replay():
    """validation/regimes/lease_sets.py (measure-bare.sh's keyed step): from lease u's files by hand, attention and
    router 1.739 and 1.827 us over their kernels alone -> median 1.783 us; expert 0.256 and 0.295 -> 0.2755; combine
    -0.004 and 0.028 -> 0.012; the link's cold fit 55.146 GB/s plus 2.893 us. A file that is not the probe's: exit 2."""
    import subprocess
    import sys

    h100 = os.path.join(ROOT, "validation", "h100")
    script = os.path.join(ROOT, "validation", "regimes", "lease_sets.py")
    steps = [os.path.join(h100, f"h100-step-costs{q}-lease-u.json") for q in ("", "-q4")]
    out = subprocess.run([sys.executable, script, *steps, "--copy-source",
                          os.path.join(h100, "h100-copy-source-lease-u.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "--set", "compute.in_sequence_ns.attention=1783.0", "--set", "compute.in_sequence_ns.expert=275.5",
        "--set", "compute.in_sequence_ns.combine=12.0", "--set", "links.pcie.bandwidth_gbps=55.146",
        "--set", "dma.setup_ns=2893"]
    bad = subprocess.run([sys.executable, script, *steps, "--copy-source", steps[0]], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().endswith("h100-step-costs-lease-u.json: not probe_copy_source.py's output (no fit.cold)")


@pytest.mark.parametrize("name", MEASUREMENTS)
def test_every_op_of_a_validated_decode_step_takes_its_profiled_time(name):
    """The validation configs cost every kernel of their decode steps from the microbenchmark's per-shape table."""
    from chipsim.hwreplay.ops import profile_coverage

    for ctx in (512, 2048):
        prep = prepare(f"{ROOT}/hwconfigs/{name}.yaml", [f"workload.context_length={ctx}"], ["no-prefetch"])
        profiled, modelled = profile_coverage(prep.config.hw)
        assert modelled == 0 and profiled > 0, (name, ctx)


def test_an_op_key_names_its_shape_exactly():
    """op_for_key(p.key) is the very operation the primitive costs (hwcompare's array-model column)."""
    from chipsim.hw.compute_formula import ArrayModel, parse_op_key
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.compare import ARRAY_MODEL_ONLY

    hw = load_config(f"{ROOT}/hwconfigs/h200-pcie5-deepseek-v2-lite.yaml",
                     ["workload.context_length=512", *ARRAY_MODEL_ONLY]).hw
    am = ArrayModel(hw)
    prims = [p for group in primitive_ops(hw).values() for p in group]
    assert {p.kind for p in prims} == {"matvec", "sfu", "vector"}
    for p in prims:
        kind, f = parse_op_key(p.key)
        assert kind == p.kind
        if p.kind == "matvec":
            assert (f["reduction"], f["outputs"], f["read_bytes"]) == (p.reduction, p.outputs, p.weight_bytes)
            want = am.matvec(p.name, p.reduction, p.outputs, p.weight_bytes)
        elif p.kind == "sfu":
            assert f == {"elements": p.elements}
            want = am.sfu(p.name, p.elements)
        else:
            assert f == {"elements": p.elements, "read_bytes": p.weight_bytes}
            want = am.vector(p.name, p.elements, p.weight_bytes)
        assert am.op_for_key(p.key, p.groups).duration_ps == want.duration_ps


class _CountingNvml:
    """NVML's calls as pynvml names them, over a counter that gains 2,500 mJ between two energy readings."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        self.energy_mj = 1_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_mj += 2_500
        return self.energy_mj - 2_500

    def nvmlDeviceGetPowerUsage(self, handle):
        return 80_000

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980 if clock == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 40


def test_the_boards_energy_over_a_window_is_the_counters_difference():
    """2,500 mJ over 0.5 s: 2.5 J at 5 W; with no counter (this machine has no NVML) there is no GPU to read."""
    from chipsim.hwreplay.nvml import Gpu, open_gpu, window

    gpu = Gpu(_CountingNvml(), handle=None)
    first, second = gpu.read(), gpu.read()
    assert (first.energy_mj, second.energy_mj, first.sm_clock_mhz, first.mem_clock_mhz) == (1_000, 3_500, 1980, 3201)
    w = window(first, second, 0.5)
    assert (w["energy_j"], w["power_w"], w["sm_clock_mhz"]) == (2.5, 5.0, [1980, 1980])
    if importlib.util.find_spec("pynvml") is None:
        assert open_gpu() is None


class _SteppedCounter(_CountingNvml):
    """A board drawing `idle_w`, or `load_w` while a load runs, whose counter moves every `step_s` and then
    reports the energy up to `delay_s` earlier. Time is `clock()`: each NVML call advances it by `poll_s`
    (or, with clock=time.perf_counter, it is the host's)."""

    def __init__(self, idle_w=125.0, load_w=225.0, step_s=0.1, delay_s=0.3, poll_s=1e-4, clock=None):
        self.idle_w, self.load_w, self.step_s, self.delay_s, self.poll_s = idle_w, load_w, step_s, delay_s, poll_s
        self.t, self.loads, self._clock = 10.0, [], clock

    def clock(self) -> float:
        return self._clock() if self._clock else self.t

    def run(self, seconds: float) -> None:
        self.loads.append((self.t, self.t + seconds))
        self.t += seconds

    def _true_mj(self, t: float) -> float:
        busy = sum(max(0.0, min(t, e) - s) for s, e in self.loads)
        return 1e3 * (self.idle_w * t + (self.load_w - self.idle_w) * busy)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.t += self.poll_s
        step = int(self.clock() / self.step_s) * self.step_s
        return int(self._true_mj(step - self.delay_s))


def test_a_loads_energy_is_read_from_counter_steps_after_idle_not_around_the_load():
    """A 1 s load at 225 W on a 125 W board is 225 J. A counter that steps every 100 ms and trails the power by
    300 ms, read right before and right after the load, gives about 30 J less (0.3 s x 100 W) and misses up to a
    step at each end; read from a step after idle to a step after `settle_s` of idle, less the idle power over
    the idle part, it gives 225 J to the polling interval."""
    from chipsim.hwreplay.nvml import Gpu, Meter

    for load_s in (0.25, 1.0, 3.0):
        board = _SteppedCounter()
        meter = Meter(Gpu(board, handle=None), settle_s=0.5, clock=board.clock)
        meter.start()
        board.run(load_s)
        w = meter.stop(load_s)
        assert w["energy_j"] == pytest.approx(225.0 * load_s, abs=0.1)
        assert w["idle_w"] == pytest.approx(125.0, abs=0.1)
        assert w["power_w"] == pytest.approx(225.0, rel=0.1 / load_s / 225)
        assert w["naive_energy_j"] == pytest.approx(225.0 * load_s - 30.0, abs=22.6 + 0.1)  # one 100 ms step at 225 W
    # a delay longer than the idle waited for is not absorbed: the window then starts inside the earlier load
    board = _SteppedCounter(delay_s=0.9)
    board.run(1.0)
    meter = Meter(Gpu(board, handle=None), settle_s=0.2, clock=board.clock)
    meter.start()
    board.run(1.0)
    assert meter.stop(1.0)["energy_j"] != pytest.approx(225.0, abs=1.0)


def test_a_replay_records_its_energy_window_with_the_idle_power(tmp_path):
    """On a board drawing 100 W throughout (its counter stepping every 2 ms on the host's clock), a replay's
    window is 100 W over the replay's own seconds, the idle power 100 W; without a counter it records none."""
    import time

    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.nvml import Gpu

    prep = prepare(_config(tmp_path), ["workload.max_tokens=2"], ["lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    board = _SteppedCounter(idle_w=100.0, load_w=100.0, step_s=0.002, delay_s=0.0, clock=time.perf_counter)
    res = replay(plan, step, host, slots, m.first_dense_layers, gpu=Gpu(board, handle=None), energy_settle_s=0.02)
    e = res["energy"]
    assert e["seconds"] > 0 and e["idle_w"] == pytest.approx(100.0, rel=0.05)
    assert e["energy_j"] == pytest.approx(100.0 * e["seconds"], abs=100.0 * 0.004)  # to a counter step at each end
    assert res["enqueue"] == "torch"
    assert replay(plan, step, host, slots, m.first_dense_layers)["energy"] is None


def test_a_tokens_kernels_counted_by_shape_are_the_kernels_the_replay_launches(tmp_path):
    """kernels_per_token (the launches of each kernel shape in one decode step) sums to the kernel calls a replay
    run kernel by kernel makes per token (a CPU dry run, LRU: every routed expert computed); a shape only the
    experts launch counts MoE layers x top-k per place in the expert."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.ops import kernels_per_token

    prep = prepare(_config(tmp_path), ["workload.max_tokens=3"], ["lru"])
    m = prep.workload.model
    groups = primitive_ops(prep.config.hw)
    step = GpuDecodeStep(groups, m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers)
    counts = kernels_per_token(prep.config.hw)
    assert sum(counts.values()) == res["launches_per_token"]
    others = {p.key for name, ps in groups.items() if name != "expert" for p in ps}
    only_experts = {p.key for p in groups["expert"]} - others
    assert only_experts
    for k in only_experts:  # a shape only the experts launch: once per routed expert per place in the expert
        assert counts[k] == m.num_moe_layers * m.top_k * sum(p.key == k for p in groups["expert"])


def test_a_replay_against_its_kernels_alone_is_their_sum_plus_its_copies():
    """By hand: a replay measured 300 mJ per token above its board's idle (two windows: 3.2 and 2.8 J above idle
    over 10 tokens); its token launches 100 kernels of one shape at 2 mJ each alone (200 mJ) and copies 10 GB
    over its 10 tokens at 20 pJ per bit (160 mJ per token): (200 + 160 - 300) / 300 = +20 %."""
    from chipsim.hwreplay.compare import _energy_fields, step_against_kernels_lines

    windows = [{"energy_j": 3.2 + 100.0 * 1.0, "idle_w": 100.0, "seconds": 1.0, "power_w": 103.2},
               {"energy_j": 2.8 + 100.0 * 1.0, "idle_w": 100.0, "seconds": 1.0, "power_w": 102.8}]
    case = {"latency_ms": [1.0] * 10, "energy": windows[0], "repeat_energy": [windows[1]]}

    class Plan:
        sim_energy_mj = [{"hbm": 1.0}]
        sim_latency_ms = [1.0]
    fields = _energy_fields(case, Plan())
    assert fields["measured_above_idle_mj"] == pytest.approx(300.0)
    probe = {"windows": [_probe_window("idle", 100.0, 1.0),
                         _probe_window("op", 100.0 + 2e-3 * 1000, 1.0, key="vector n64 b0", kernels_per_call=1000)]}
    row = {"model": "m", "context_length": 1024, "policy": "lru", "kernels_per_token": {"vector n64 b0": 100},
           "copied_bytes": 10 * 10**9, "copy_pj_per_bit": 20.0, "replayed_tokens": 10, **fields}
    lines = step_against_kernels_lines(probe, [("r", [row])])
    assert lines[-2] == "| r | m | 1024 | lru | normal BF16 | 300.0 | 200.0 | 160.0 | +20.0 % |"
    row["kernels_per_token"]["sfu n64"] = 1  # a shape the probe did not run: the case is left out
    assert step_against_kernels_lines(probe, [("r", [row])]) == []


def _probe_window(kind, power_w, seconds, calls=1, **per_call):
    return {"kind": kind, "seconds": seconds, "energy_j": power_w * seconds, "calls": calls, **per_call}


def test_the_energy_table_comes_back_from_windows_made_with_it():
    """Windows drawn from a known table (idle 80 W, SMs busy 60 W, copies 10 pJ/bit over 85 W, HBM 12 pJ/bit, a MAC
    0.5 pJ) give that table back: idle from the resting windows only (the warm one after the GEMM is not idle's),
    the copies' line by least squares, busy, HBM and MAC from the three kernels' power above idle."""
    from chipsim.hwreplay.energy_table import derive

    per_byte_copy, per_byte_hbm, per_mac, busy = 10e-12 * 8, 12e-12 * 8, 0.5e-12, 60.0
    windows = [_probe_window("idle_cold", 80.0, 2.0), _probe_window("idle_settled", 80.0, 3.0),
               _probe_window("idle_warm", 95.0, 2.0), _probe_window("tiny_kernels", 81.5, 2.0)]
    for rate in (50e9, 25e9, 12.5e9, 6.25e9):  # bytes per second
        windows.append(_probe_window("h2d_copy", 85.0 + per_byte_copy * rate, 2.0, calls=int(rate * 2 / 1e8),
                                     bytes_per_call=1e8))
    small_power = 80.0 + busy + 6e11 * per_byte_hbm + 3e11 * per_mac  # 197.75 W
    gemv_power = 80.0 + busy + 3.2e12 * per_byte_hbm + 1.6e12 * per_mac  # 448 W
    gemm_power = 80.0 + busy + 2e11 * per_byte_hbm + 4e14 * per_mac  # 359.2 W
    windows.append(_probe_window("gemv_small", small_power, 2.0, calls=100, bytes_per_call=1.2e10, macs_per_call=6e9))
    windows.append(_probe_window("gemv", gemv_power, 2.0, calls=200, bytes_per_call=3.2e10, macs_per_call=1.6e10))
    windows.append(_probe_window("gemm", gemm_power, 1.0, calls=100, bytes_per_call=2e9, macs_per_call=4e12))
    fit = derive({"windows": windows})
    assert fit.idle_w == pytest.approx(80.0) and fit.idle_warm_w == pytest.approx(95.0)
    assert fit.busy_w == pytest.approx(60.0) and fit.tiny_above_idle_w == pytest.approx(1.5)
    assert fit.copy_idle_w == pytest.approx(85.0) and fit.pcie_pj_per_bit == pytest.approx(10.0)
    assert fit.hbm_pj_per_bit == pytest.approx(12.0) and fit.mac_pj == pytest.approx(0.5)
    assert fit.copy_rates_gbps == pytest.approx((50.0, 25.0, 12.5, 6.25))
    assert max(abs(r) for r in fit.copy_residuals_w) < 1e-9
    assert [k for k, _ in fit.kernel_residuals_w] == ["gemv_small", "gemv", "gemm"]
    assert max(abs(r) for _, r in fit.kernel_residuals_w) < 1e-6
    # a middle-rate GEMV on the same line (1.6e12 B/s, 8e11 MAC/s: 80 + 60 + 153.6 + 0.4 = 294 W) changes nothing
    mid = _probe_window("gemv_mid", 80.0 + busy + 1.6e12 * per_byte_hbm + 8e11 * per_mac, 2.0, calls=200,
                        bytes_per_call=1.6e10, macs_per_call=8e9)
    assert mid["energy_j"] == pytest.approx(294.0 * 2.0)
    fit4 = derive({"windows": windows + [mid]})
    assert (fit4.busy_w, fit4.hbm_pj_per_bit, fit4.mac_pj) == pytest.approx((60.0, 12.0, 0.5))
    assert [k for k, _ in fit4.kernel_residuals_w] == ["gemv_small", "gemv", "gemv_mid", "gemm"]
    # 20 W more there than the line allows: least squares spreads it, and the residuals show it
    off = derive({"windows": windows + [{**mid, "energy_j": (294.0 + 20.0) * 2.0}]})
    assert dict(off.kernel_residuals_w)["gemv_mid"] > 5.0 and off.busy_w > 60.0


def test_an_energy_probe_missing_a_window_or_a_spread_of_rates_is_refused_naming_it():
    from chipsim.hwreplay.energy_table import derive

    idle = [_probe_window("idle_cold", 75.0, 2.0), _probe_window("idle_settled", 75.0, 2.0),
            _probe_window("idle_warm", 80.0, 2.0)]
    with pytest.raises(InputError, match="no 'h2d_copy' window"):
        derive({"windows": idle})
    same_rate = [_probe_window("h2d_copy", 89.0, 2.0, calls=1000, bytes_per_call=1e8)] * 2
    with pytest.raises(InputError, match="rates at least 10 % apart"):
        derive({"windows": idle + same_rate})
    copies = [_probe_window("h2d_copy", 89.0, 2.0, calls=c, bytes_per_call=1e8) for c in (1000, 500)]
    with pytest.raises(InputError, match="no 'gemv_small' window"):  # a probe from before the busy-power kernels
        derive({"windows": idle + copies + [_probe_window("gemv", 400.0, 2.0, calls=1, bytes_per_call=1e9,
                                                          macs_per_call=5e8)]})
    alike = [_probe_window(k, 300.0, 2.0, calls=1, bytes_per_call=1e9, macs_per_call=5e8)
             for k in ("gemv_small", "gemv", "gemm")]
    with pytest.raises(InputError, match="too alike"):
        derive({"windows": idle + copies + alike})


def test_hwcompare_sets_the_boards_energy_and_each_layers_stall_beside_the_simulators(tmp_path):
    """A compute-bound case (validation/regimes/cached): the measured energy per token is each replay's window over
    all its tokens, averaged; the simulated one is the simulator's ledger less the host's entries; every (token, MoE
    layer) after the warm-up has one measured stall (0 where it waited for no copy) beside the simulator's."""
    from chipsim.hwreplay import compare
    from chipsim.hwreplay.energy_table import BOARD_EXCLUDES

    with open(os.path.join(ROOT, "validation", "regimes", "cached", "h200-pcie5.json")) as f:
        meas = json.load(f)
    meas["cases"] = [c for c in meas["cases"] if c["context_length"] == 1024 and c["policy"] == "lru"]
    meas["config"] = os.path.join(ROOT, meas["config"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(meas))
    (row,) = compare.compare_file(str(path))["rows"]
    case, warm = meas["cases"][0], meas["warmup_tokens"]
    windows = [case["energy"], *case["repeat_energy"]]
    assert row["measured_mj"] == pytest.approx(sum(1e3 * w["energy_j"] / len(case["latency_ms"]) for w in windows) / 2)
    prep = prepare(meas["config"], [*replayed_overrides(meas), "workload.context_length=1024"], ["lru"])
    plan = build_plan(prep, prep.policies[0])
    board = [sum(v for k, v in t.items() if k not in BOARD_EXCLUDES) for t in plan.sim_energy_mj]
    assert row["simulated_mj"] == pytest.approx(sum(board) / len(board))
    assert "lpddr5x" in plan.sim_energy_mj[0] and "static_arrays" in plan.sim_energy_mj[0]
    layers = prep.workload.model.num_moe_layers
    assert len(row["measured_stalls_ms"]) == len(row["simulated_stalls_ms"]) == (plan.tokens - warm) * layers
    assert sum(row["measured_stalls_ms"]) == pytest.approx(sum(ms for t, _, ms in case["stall_ms"] if t >= warm))
    assert sum(row["simulated_stalls_ms"]) == pytest.approx(sum(map(sum, plan.sim_stall_ms[warm:])))


def test_hwcompare_refuses_a_regime_without_cases_naming_it(tmp_path, capsys):
    from chipsim.cli import main

    path = os.path.join(ROOT, "validation", "regimes", "cached", "h200-pcie5.json")
    rc = main(["hwcompare", os.path.join(ROOT, "validation", "h200-pcie5-phi-mini-moe.json"), "--jobs", "1",
               "--regime", "long", f"{path}@99999"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--regime long: no case" in err[0]


def test_a_kernels_energy_alone_is_its_windows_power_above_idle_over_its_kernels():
    """By hand: idle windows at 100 and 102 W; a shape's window at 151 W for 2 s running 1,000,000 calls of 10
    kernels is 50 W × 2 s / 10,000,000 kernels = 10 µJ = 10,000 nJ per kernel, 0.2 µs each."""
    from chipsim.hwreplay.energy_table import op_energy_rows

    probe = {"windows": [_probe_window("idle", 100.0, 1.0), _probe_window("idle", 102.0, 1.0),
                         _probe_window("op", 151.0, 2.0, calls=1_000_000, key="vector n1024 b0",
                                       kernels_per_call=10)]}
    (row,) = op_energy_rows(probe)
    assert row["idle_w"] == pytest.approx(101.0)
    assert row["nj_per_kernel"] == pytest.approx(10_000.0) and row["us_per_kernel"] == pytest.approx(0.2)


def test_the_energy_table_charges_an_operation_alone_its_actions_and_its_clock_time():
    """A vector operation on thor's arrays by hand: its lane operations × pJ each, its operand bits through HBM,
    UCIe (per wire bit: 68 B flits of 64 data bytes) and SRAM (written once, read once), and clock power over its
    time (thor: every array while any runs)."""
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.energy_table import modelled_op_energy_nj

    hw = load_config(os.path.join(ROOT, "hwconfigs", "thor.yaml")).hw
    key = "vector n65536 b131072"
    op = ArrayModel(hw).op_for_key(key)
    c, bits = hw.compute, 8 * 131072
    by_hand_pj = (65536 * c.vector_op_energy_pj
                  + bits * (hw.memory["hbm"].energy_pj_per_bit + hw.links["ucie"].energy_pj_per_bit * 68 / 64)
                  + bits * (c.sram_read_pj_per_bit + c.sram_write_pj_per_bit)
                  + op.duration_ps * c.clock_power_w_per_array * c.arrays)
    assert op.hbm_read_bytes == 131072 and op.vector_ops == 65536
    assert modelled_op_energy_nj(hw, key) == pytest.approx(by_hand_pj / 1e3, rel=1e-12)


def test_hwcompare_sets_each_kernels_measured_energy_beside_the_tables(tmp_path):
    """Two shapes measured at exactly what hwconfigs/h200-pcie5.yaml's per-action table charges them (without its
    measured per-shape energies, compute.op_energy_pj) come out at 0 % error; a shape that drew nothing above idle
    is counted and left out."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.compare import op_energy_lines
    from chipsim.hwreplay.energy_table import modelled_op_energy_nj

    config = os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")
    hw = load_config(config, ["compute.op_energy_pj={}"]).hw
    keys = ["matvec r1536 o1024 b3145728", "vector n1536 b0"]
    windows = [_probe_window("idle", 120.0, 1.0)]
    for key in keys:  # one call of 1,000 kernels per second: power above idle = 1,000 × nJ × 1e-9 W
        windows.append(_probe_window("op", 120.0 + 1000 * modelled_op_energy_nj(hw, key) * 1e-9, 1.0, calls=1,
                                     key=key, kernels_per_call=1000, users=[key]))
    windows.append(_probe_window("op", 120.0, 1.0, calls=1, key="sfu n64", kernels_per_call=1000, users=["x"]))
    text = "\n".join(op_energy_lines({"windows": windows}, config))
    assert "1 shapes drew no measurable energy above idle" in text
    assert "| matvec | 1 | +0 % | 0 % |" in text and "| vector | 1 | +0 % | 0 % |" in text


def test_a_segment_replay_charges_a_launch_per_segment_unless_told_otherwise():
    from chipsim.hwreplay.run import replay_overrides

    assert replay_overrides(["workload.max_tokens=8"], segments=True) == ["workload.max_tokens=8",
                                                                          "compute.launch_per=segment"]
    assert replay_overrides(["compute.op_group_launch_ns=500"], segments=True) == ["compute.op_group_launch_ns=500",
                                                                                   "compute.launch_per=segment"]
    assert replay_overrides(["compute.launch_per=op_group"], segments=True) == ["compute.launch_per=op_group"]
    assert replay_overrides(["workload.max_tokens=8"], segments=False) == ["workload.max_tokens=8"]


def test_the_cudart_front_end_issues_the_programs_steps_as_raw_runtime_calls():
    """A program step that copies two parts of expert (layer 1, expert 2) into slot 3 after waiting for a marker,
    then a compute graph that waits for it, then a token's end, lowered: the copies are cudaMemcpyAsync calls
    host-to-device (kind 1) between exactly the parts' bytes, on the copy stream, between the wait and the record;
    the graph is launched on the compute stream; every handle is the object's own."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay import cudart

    host = torch.zeros((2, 4, 96), dtype=torch.uint8)
    slots = torch.zeros((5, 96), dtype=torch.uint8)

    class Graph:
        def replay(self):
            pass

    ids = {}
    handle = lambda obj: ids.setdefault(id(obj), 1000 + len(ids))  # noqa: E731
    cs, copy_stream, marker, done, tok, graph = object(), object(), object(), object(), object(), Graph()
    prog = [("rec", marker, cs),
            ("x", copy_stream, marker, [(slots[3, 0:64], host[1, 2, 0:64]), (slots[3, 64:96], host[1, 2, 64:96])], done),
            ("wait", cs, done), ("c", [(graph.replay, (), {})]), ("tok", tok)]
    low = cudart.lower(prog, cs, handle, lambda fn: isinstance(getattr(fn, "__self__", None), Graph))
    h = handle
    assert low == [
        ("cudaEventRecord", (h(marker), h(cs))),
        ("cudaStreamWaitEvent", (h(copy_stream), h(marker), 0)),
        ("cudaMemcpyAsync", (slots.data_ptr() + 3 * 96, host.data_ptr() + (1 * 4 + 2) * 96, 64, 1, h(copy_stream))),
        ("cudaMemcpyAsync", (slots.data_ptr() + 3 * 96 + 64, host.data_ptr() + (1 * 4 + 2) * 96 + 64, 32, 1, h(copy_stream))),
        ("cudaEventRecord", (h(done), h(copy_stream))),
        ("cudaStreamWaitEvent", (h(cs), h(done), 0)),
        ("cudaGraphLaunch", (h(graph), h(cs))),
        ("token", (h(tok), h(cs)))]
    # a graph whose executable PyTorch does not expose is replayed through PyTorch, in the same order
    assert cudart.lower(prog[3:4], cs, lambda obj: None if obj is graph else h(obj),
                        lambda fn: isinstance(getattr(fn, "__self__", None), Graph)) == [("call", (graph.replay,))]
    with pytest.raises(ValueError, match="captured CUDA graphs only"):
        cudart.lower([("c", [(print, ("eager kernel",), {})])], cs, handle, lambda fn: False)


def _meter_window(kind, above_j, seconds, idle_w=100.0, calls=1, **fields):
    return {"kind": kind, "seconds": seconds, "energy_j": above_j + idle_w * seconds, "idle_w": idle_w,
            "calls": calls, **fields}


def test_a_token_together_against_its_kernels_alone_by_hand():
    """By hand: a step window of 2 calls x 5 tokens over 0.05 s with 3 J above idle is 5 ms and 300 mJ per token;
    its kernels alone: 100 launches of one shape whose window ran 1,000 kernels in 0.01 s with 2 J above idle
    (10 us, 2 mJ each), 1 ms and 200 mJ per token, so alone is -33.3 % in energy and -80.0 % in time; inside the
    token that group took 1.2 ms against 1.0 ms alone, +20.0 %."""
    from chipsim.hwreplay.probe_tables import step_energy_lines

    probe = {"config": "c.yaml", "context": 1024, "kernels_per_token": 100,
             "in_situ_against_alone": {"expert": {"groups": 4, "in_situ_ms": 1.2, "alone_ms": 1.0}},
             "windows": [_meter_window("idle", 0.0, 3.0),
                         _meter_window("step", 3.0, 0.05, calls=2, tokens_per_call=5, launches_per_token=1),
                         _meter_window("groups", 1.5, 0.5, calls=1, tokens_per_call=5, launches_per_token=9),
                         _meter_window("op", 2.0, 0.01, calls=1, kernels_per_call=1000, per_token=100, key="k")]}
    lines = step_energy_lines([("p.json", probe)])
    assert "| p.json | 100 | 100.0 | 5.000 | 300.0 | 100.000 | 300.0 | 1.000 | 200.0 | -33.3 % | -80.0 % |" in lines
    assert "| p.json | expert | 4 | 1.200 | 1.000 | +20.0 % |" in lines
    del probe["windows"][1]  # no step window: one error naming the file
    with pytest.raises(InputError, match="p.json: not probe_step_energy.py's output"):
        step_energy_lines([("p.json", probe)])


def test_the_handoff_table_is_each_sequence_less_its_parts():
    """The hand-off columns are the probe's per-repeat medians; a span's synchronisation cost is the replay's
    layout (wait, copies, record) less the copies alone: 9.5 - 7.5 = +2.00 us."""
    from chipsim.hwreplay.probe_tables import handoff_lines

    def med(x):
        return {"median": x, "p10": x, "p90": x}
    summary = {"copy_us": med(28.0), "graph_us": med(15.0), "copy_then_graph_us": med(45.0),
               "one_stream_us": med(45.5), "handoff_copy_to_compute_us": med(2.0), "graph_then_copy_us": med(40.0),
               "handoff_compute_to_copy_us": med(-3.0)}
    spans = {f"256KiB x1 {m}": {"us_per_span": med(t)} for m, t in (("plain", 7.5), ("record", 8.0),
                                                                       ("wait_record", 9.5))}
    under = {"gemv x64": {"alone_us": med(640.0), "under_copies_us": med(800.0), "slowdown_pct": 25.0}}
    lines = handoff_lines({"repeats": 10, "copies": {"1024KiB": {"summary": summary}}, "spans": spans,
                           "under_copies": under}, "h.json")
    assert "| 1024KiB | 28.00 | 15.00 | 45.00 | 45.50 | +2.00 | 40.00 | -3.00 |" in lines
    assert "| 256KiB x1 | 7.50 | 8.00 | 9.50 | +2.00 |" in lines
    assert "| gemv x64 | 640.00 | 800.00 | +25.0 % |" in lines
    with pytest.raises(InputError, match="h.json: not probe_handoff.py's output"):
        handoff_lines({"copies": {"1024KiB": {}}}, "h.json")


def test_the_replays_experts_in_host_memory_hold_normal_bf16_numbers():
    """Every byte of the host's experts is overwritten, odd lengths and chunk edges included: as BF16 words they
    are normal numbers (mean ~0, std ~1), not the zeros fresh memory holds, which GEMVs run over for less power."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.run import fill_normal_bf16

    buf = torch.zeros((3, 5, 4002), dtype=torch.uint8)
    fill_normal_bf16(buf, torch.device("cpu"), chunk_bytes=1000)
    words = buf.view(-1).view(torch.bfloat16).float()
    assert (buf.view(-1)[-1000:] != 0).float().mean() > 0.9  # the last chunk too
    assert abs(words.mean().item()) < 0.05 and 0.95 < words.std().item() < 1.05
