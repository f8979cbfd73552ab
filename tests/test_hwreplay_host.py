"""Host-CPU experts in the hardware replay (issue #44 item 2), on CPU tensors: the plan holds each layer's host experts
as the policy chose them, the replay computes every one of them on the CPU and lands its result on the "GPU", the
probe and gpuconfig turn two single-op measurements into the config's host_cpu keys by hand-checkable arithmetic,
and 8-bit experts replay with their own kernel."""

import json
import os

import pytest
import yaml

from chipsim.errors import InputError
from chipsim.hwreplay.ops import primitive_ops
from chipsim.hwreplay.plan import build_plan
from chipsim.runner import prepare

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, tokens=3):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: {ROOT}/hwconfigs/h200-pcie5-granite-1b.yaml\nworkload:\n  max_tokens: {tokens}\n"
                    "  warmup_tokens: 0\n")
    return str(path)


def test_a_fiddler_plan_runs_on_the_host_exactly_the_routed_experts_it_did_not_place(tmp_path):
    """Fiddler places experts before the first token (its only issues) and never moves one again: in every layer of
    every token the plan's host experts are the routed ones outside that set, its GPU experts the routed ones in it."""
    prep = prepare(_config(tmp_path), [], ["fiddler:slots=200"])
    plan = build_plan(prep, prep.policies[0])
    placed = {(a[3], a[4]) for a in plan.actions if a[0] == "issue"}
    assert len(placed) == 200
    routed = prep.trace["routed_ids"]
    host = {(a[1], a[2]): a[3] for a in plan.actions if a[0] == "host"}
    on_gpu: dict = {}
    for a in plan.actions:
        if a[0] == "compute":
            on_gpu.setdefault((a[1], a[2]), []).extend(a[3])
    layers = prep.workload.model.num_moe_layers
    for t in range(plan.tokens):
        for layer in range(layers):
            ids = [int(e) for e in routed[t, layer]]
            assert host.get((t, layer), []) == [e for e in ids if (layer, e) not in placed]
            assert sorted(on_gpu.get((t, layer), [])) == sorted(e for e in ids if (layer, e) in placed)
    assert plan.host_experts == sum(map(len, host.values())) > 0
    assert plan.to_json()["host_experts"] == plan.host_experts


def test_the_replay_computes_every_host_expert_of_the_plan_on_the_cpu(tmp_path):
    from chipsim.hwreplay.harness import GpuDecodeStep, replay

    prep = prepare(_config(tmp_path), [], ["fiddler:slots=200", "cg-moe"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    for policy in prep.policies:
        plan = build_plan(prep, policy)
        assert plan.host_experts > 0, policy.label
        slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
        res = replay(plan, step, host, slots, m.first_dense_layers)
        assert res["host_experts"] == plan.host_experts
        assert res["copied_bytes"] == plan.fetch_bytes
        # the simulator's PCIe bytes also hold each host expert's activation down and result up (BF16 hidden vectors)
        assert plan.sim_fetch_bytes == plan.fetch_bytes + plan.host_experts * 2 * 2 * m.hidden_size
        assert len(res["latency_ms"]) == plan.tokens
        assert 0 < res["host_compute_us_median"] <= res["host_roundtrip_us_median"]


def test_a_host_experts_result_is_its_weights_times_the_activation_landed_on_the_gpu_side(tmp_path):
    """Granite-1B's expert (hidden 1,024, FFN 512): its down projection is 1,024 rows over 512. With every down
    weight 0.5 and the activation all ones, the result the host copies up is 512 x 0.5 = 256 in each of the 1,024
    rows (each matvec reads the activation, as the GPU's expert kernels do)."""
    from chipsim.hwreplay.harness import _sync_api
    from chipsim.hwreplay.host_experts import HostExperts, expert_width

    prep = prepare(_config(tmp_path), [], ["lru"])
    prims = primitive_ops(prep.config.hw)["expert"]
    mv = [p for p in prims if p.kind == "matvec"]
    n_in, n_out = expert_width(prims)
    assert (n_in, n_out) == (mv[0].reduction, mv[-1].outputs) == (prep.workload.model.hidden_size,) * 2
    nbytes = prep.workload.expert_bytes
    host = torch.zeros((1, 2, nbytes), dtype=torch.uint8)
    down_at = nbytes - 2 * mv[-1].outputs * mv[-1].reduction
    host[0, 1, down_at:].view(torch.bfloat16).fill_(0.5)
    api = _sync_api(torch.device("cpu"))
    runner = HostExperts(prims, host, torch.device("cpu"), api)
    runner.activation.fill_(1.0)
    cs, ev = api[0](), api[1]()
    ev.record(cs)
    runner.run(ev, [(0, 1)], cs)
    assert (mv[-1].reduction, n_out) == (512, 1024)
    assert runner.result.tolist() == [256.0] * 1024
    runner.run(ev, [(0, 0), None], cs)  # an expert of zero weights, then an empty job: the result is the first's
    assert runner.result.tolist() == [0.0] * n_out
    assert len(runner.compute_us) == 3


def test_host_experts_in_a_batch_or_a_prefill_are_refused_in_one_line(tmp_path):
    for overrides in (["workload.batch=2"], ["workload.prompt_tokens=16", "workload.output_tokens=2"]):
        prep = prepare(_config(tmp_path), overrides, ["fiddler-prefill+no-prefetch" if "prompt" in overrides[0]
                                                      else "fiddler:slots=200"])
        with pytest.raises(InputError, match="host CPU in a prefill, batch or served step"):
            build_plan(prep, prep.policies[0])


def test_a_replay_of_4bit_host_experts_is_refused_before_any_replay(tmp_path):
    from chipsim.hwreplay.run import main

    with pytest.raises(InputError, match="host-CPU experts are BF16"):
        main([_config(tmp_path), "--device", "cpu", "--set", "model.expert_bits=4", "--policy", "fiddler:slots=200",
              "--contexts", "512", "--jobs", "1", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_gpuconfig_writes_the_host_keys_from_the_probe_by_hand(tmp_path):
    """memory_bandwidth_gbps = 4,718,592 bytes / 128 µs = 36.86 GB/s; dispatch = 21.0 µs less two trips of the 3,072-
    byte activation, each the PCIe latency of the config plus 3,072 B at the copies' bandwidth; cores = threads."""
    from chipsim.hwreplay.gpuconfig import main

    with open(os.path.join(ROOT, "hwconfigs", "h100-pcie5.yaml")) as f:
        command = f.readlines()[2].split("gpuconfig ", 1)[1].split()
    probe = {"model": "granite-3.1-3b-a800m", "threads": 12, "expert_bytes": 4718592, "activation_bytes": 3072,
             "expert_us": {"median": 128.0}, "roundtrip_us": {"median": 21.0}}
    (tmp_path / "p.json").write_text(json.dumps(probe))
    out = tmp_path / "h.yaml"
    args = [a for a in command]
    args[args.index("--out") + 1] = str(out)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        main(args + ["--host-cpu", str(tmp_path / "p.json")])
    finally:
        os.chdir(cwd)
    cfg = yaml.safe_load(out.read_text())
    pcie = cfg["links"]["pcie"]
    h = cfg["host_cpu"]
    assert h["cores"] == 12
    assert h["memory_bandwidth_gbps"] == round(4718592 / 128.0 / 1e3, 2) == 36.86
    assert h["dispatch_overhead_ns"] == pytest.approx(
        21000 - 2 * (pcie["latency_ns"] + 3072 / pcie["bandwidth_gbps"]), abs=0.05)
    probe["model"] = "phi-mini-moe"
    (tmp_path / "p.json").write_text(json.dumps(probe))
    os.chdir(ROOT)
    try:
        with pytest.raises(InputError, match="must time this config's expert"):
            main(args + ["--host-cpu", str(tmp_path / "p.json")])
    finally:
        os.chdir(cwd)


def test_the_host_probe_times_the_configs_own_expert_on_this_cpu(tmp_path):
    from chipsim.hwreplay.host_cpu import main

    out = tmp_path / "h.json"
    assert main([_config(tmp_path), "--device", "cpu", "--reps", "5", "--pool-gib", "0.05", "--threads", "1",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    prep = prepare(_config(tmp_path), [], ["lru"])
    assert res["expert_bytes"] == prep.workload.expert_bytes
    assert res["activation_bytes"] == res["result_bytes"] == 2 * prep.workload.model.hidden_size
    assert res["threads"] == 1 and res["expert_us"]["n"] == 5 and res["roundtrip_us"]["n"] == 5
    assert res["beside_copies"] is None  # copies beside the CPU's expert: a GPU's copy engine only
    with pytest.raises(InputError, match="--threads 0"):
        main([_config(tmp_path), "--device", "cpu", "--threads", "0", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_8bit_reference_kernel_is_offset_and_scale_per_weight_by_hand():
    """A 256-column row of bytes 130 (weight +2) in group 0 and 120 (-8) in group 1, scales 0.5 and 0.25, x = 1
    at columns 0, 1 and 200: 2 x 0.5 + 2 x 0.5 + (-8) x 0.25 = 0."""
    from chipsim.hwreplay.harness import _mv_q8_reference, dequantise_q8

    packed = torch.tensor([[130] * 128 + [120] * 128], dtype=torch.uint8)
    scales = torch.tensor([[0.5, 0.25]], dtype=torch.bfloat16)
    w = dequantise_q8(packed, scales)
    assert w[0, 0].item() == 1.0 and w[0, 200].item() == -2.0
    x = torch.zeros(256, dtype=torch.bfloat16)
    x[[0, 1, 200]] = 1.0
    out = torch.empty(1, dtype=torch.bfloat16)
    _mv_q8_reference(packed, scales, x, out)
    assert out.item() == 0.0


def test_an_8bit_plan_replays_on_cpu_moving_exactly_its_packed_bytes(tmp_path):
    from chipsim.hwreplay.harness import GpuDecodeStep, replay, weight_views

    prep = prepare(_config(tmp_path), ["model.expert_bits=8"], ["lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    mv = [p for p in step.expert_prims if p.kind == "matvec"]
    assert [p.bits for p in mv] == [8, 8]
    for p in mv:  # a byte per weight and a BF16 scale per 128
        assert p.weight_bytes == p.reduction * p.outputs + p.reduction * p.outputs // 128 * 2
        packed, scales = weight_views(torch.zeros(p.weight_bytes, dtype=torch.uint8), p)
        assert packed.shape == (p.outputs, p.reduction) and scales.shape == (p.outputs, p.reduction // 128)
    assert step.expert_bytes == prep.workload.expert_bytes
    host = torch.full((m.num_moe_layers, m.num_experts, step.expert_bytes), 0x81, dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers)
    assert res["copied_bytes"] == plan.fetch_bytes == plan.sim_fetch_bytes > 0


def test_a_per_shape_config_gets_its_own_rate_and_keeps_every_other_key(tmp_path):
    """A host_cpu block followed at once by another key: the block is replaced, the key after it kept; the rate is
    the probe's bytes / median µs (23,592,960 B / 331.9 µs = 71.08 GB/s)."""
    from chipsim.hwreplay.host_cpu import set_shape_rate

    cfg = tmp_path / "s.yaml"
    cfg.write_text("base: b.yaml\nhost_cpu:\n  memory_bandwidth_gbps: 1.0   # old\nworkload:\n  trace: t.npz\n")
    set_shape_rate(str(cfg), "p.json", {"expert_us": {"median": 331.9}, "expert_bytes": 23592960, "threads": 15})
    got = yaml.safe_load(cfg.read_text())
    assert got == {"base": "b.yaml", "workload": {"trace": "t.npz"}, "host_cpu": {"memory_bandwidth_gbps": 71.08}}
    set_shape_rate(str(cfg), "p.json", {"expert_us": {"median": 100.0}, "expert_bytes": 1000000, "threads": 15})
    assert yaml.safe_load(cfg.read_text())["host_cpu"] == {"memory_bandwidth_gbps": 10.0}  # replaced, not added twice


def test_bad_probe_input_is_one_line_before_any_work(tmp_path):
    from chipsim.hwreplay.gpuconfig import _host_cpu_text
    from chipsim.hwreplay.host_cpu import main

    with pytest.raises(InputError, match="--device foo"):
        main([_config(tmp_path), "--device", "foo", "--out", str(tmp_path / "x.json")])
    with pytest.raises(InputError, match="no such config"):
        main([str(tmp_path / "none.yaml"), "--device", "cpu", "--out", str(tmp_path / "x.json")])
    with pytest.raises(InputError, match="the one timed"):  # --shape-config is the timed config itself
        main([_config(tmp_path), "--device", "cpu", "--shape-config", str(tmp_path / "other.yaml"),
              "--out", str(tmp_path / "x.json")])
    base = os.path.join(ROOT, "hwconfigs", "h100-pcie5.yaml")  # a config with no base: is not a per-shape one
    with pytest.raises(InputError, match="not a per-shape config"):
        main([base, "--device", "cpu", "--shape-config", base, "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(InputError, match="not a host probe"):
        _host_cpu_text({}, None, 50.0, {"model": "granite-3.1-3b-a800m", "expert_us": {}}, "p.json")


def test_warm_replay_is_for_decode_steps_only(tmp_path):
    from chipsim.hwreplay.run import main

    with pytest.raises(InputError, match="--warm-replay: for decode steps"):
        main([_config(tmp_path), "--device", "cpu", "--batch", "2", "--warm-replay", "--out", str(tmp_path / "o")])


def test_the_board_idle_note_is_the_idle_difference_over_each_window():
    """A window of 2.0 s and 250 J on a board idling at 116.5 W, the config charging 122.5 W: 6 W x 2 s = 12 J, 4.8 %
    of the window's energy."""
    from chipsim.hwreplay.compare import _energy_fields, _idle_note

    case = {"latency_ms": [1.0] * 4, "energy": {"energy_j": 250.0, "seconds": 2.0, "power_w": 125.0, "idle_w": 116.5}}

    class Plan:
        sim_energy_mj = [{"static_arrays": 122.5, "hbm": 1.0}]  # 122.5 mJ over 1 ms: 122.5 W
        sim_latency_ms = [1.0]
    fields = _energy_fields(case, Plan())
    assert fields["config_idle_w"] == pytest.approx(122.5) and fields["idle_share_pct"] == pytest.approx(4.8)
    assert _idle_note(fields).endswith("the config charges 122.5 W: +4.8 % of the measured energy")
    assert _idle_note({**fields, "measured_idle_w": 122.0}) == ""  # within a watt: nothing said


def test_the_cudart_front_end_hands_a_host_step_to_its_runner():
    from chipsim.hwreplay.cudart import lower

    seen = []

    class Runner:
        def run(self, event, keys, stream):
            seen.append((event, keys, stream))

    low = lower([("host", Runner(), "ev", [(0, 3)])], "cs", lambda obj: 7, lambda fn: False)
    assert [name for name, _ in low] == ["call"]
    low[0][1][0]()
    assert seen == [("ev", [(0, 3)], "cs")]
