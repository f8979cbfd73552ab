"""Whole-token checks of the engine: hand-summed latency, ledger balance, invariants and determinism."""

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_shape

from chipsim.sim.metrics import per_token_energy_pj, summarize
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.sim.energy import CATEGORIES, EnergyTable
from chipsim.hw.config import load_config
from chipsim.hw.paths import fetch_path_timing
from chipsim.units import gbps_to_bytes_per_s, ns_to_ps

TINY = tiny_shape()
THOR_CONFIG = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")


def test_no_prefetch_token_latency_equals_the_hand_sum(tiny):
    routed = tiny.routing()
    cfg = tiny.config(routed)
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    wl, hw = prep.workload, prep.config.hw
    path = fetch_path_timing(hw)
    bandwidth = gbps_to_bytes_per_s(path.bandwidth_gbps)
    # per layer: attention + router; then both routed experts are fetched at once (4 engines: both
    # set up together, then share the bottleneck), land after the path latency, and are computed
    # back to back with the weighted sum.
    fetch_ps = ns_to_ps(hw.dma.setup_ns) + -(-2 * wl.expert_bytes * 10**12 // bandwidth) + ns_to_ps(path.latency_ns)
    per_layer = []
    for costs in wl.layers:
        per_layer.append(costs.attention.duration_ps + costs.router.duration_ps + fetch_ps
                         + 2 * costs.expert.duration_ps + costs.combine.duration_ps)
    expected = sum(per_layer) + wl.token_head.duration_ps
    result = simulate(prep, prep.policies[0])
    assert (result.per_token.latency_ps == expected).all()
    assert (result.per_token.stall_ps == 3 * fetch_ps).all()
    assert (result.per_token.idle_ps == result.per_token.stall_ps).all()  # compute is sequential: the arrays idle only when stalled


def test_the_arrays_resume_a_hand_off_after_each_stall(tiny):
    """compute.copy_wait_ns: the hand sum above with a 5 µs hand-off from the copy engine back to compute. Both
    routed experts of a layer land together, so each of the 3 layers stalls once and resumes 5 µs later: every
    token 15 µs longer, the hand-offs counted as stall (the arrays wait through them)."""
    routed = tiny.routing()
    cfg = tiny.config(routed)
    base = simulate(*_one(prepare(cfg, [], ["no-prefetch"])))
    prep = prepare(cfg, ["compute.copy_wait_ns=5000"], ["no-prefetch"])
    result = simulate(prep, prep.policies[0])
    assert (result.per_token.latency_ps == base.per_token.latency_ps + 3 * ns_to_ps(5000)).all()
    assert (result.per_token.stall_ps == base.per_token.stall_ps + 3 * ns_to_ps(5000)).all()
    assert (result.per_token.idle_ps == result.per_token.stall_ps).all()
    ref = prepare(cfg, ["compute.copy_wait_ns=5000", "run.engine=reference"], ["no-prefetch"])
    assert (simulate(ref, ref.policies[0]).per_token.latency_ps == result.per_token.latency_ps).all()


def _one(prep):
    return prep, prep.policies[0]


def test_ledger_balances_and_bytes_charged_equal_bytes_moved(tiny):
    routed = tiny.routing()
    cfg = tiny.config(routed)
    prep = prepare(cfg, policy_specs=["no-prefetch", "static-3"])
    table = EnergyTable.from_config(prep.config.hw)
    for policy in prep.policies:
        result = simulate(prep, policy)
        # every fetch crosses LPDDR5X, PCIe and UCIe once and is written into HBM
        moved = result.per_token.bytes["pcie"].sum()
        assert result.per_token.bytes["lpddr5x"].sum() == moved
        fetch_landed = prep.workload.expert_bytes * result.counts.fetches_total
        assert moved <= fetch_landed
        if policy.label == "no-prefetch":
            assert moved == prep.workload.expert_bytes * routed.size
        energy = per_token_energy_pj(result, table)
        total = sum(v.sum() for v in energy.values())
        by_cat = {c: 0.0 for c in CATEGORIES}
        for comp, v in energy.items():
            by_cat[table.category_of[comp]] += v.sum()
        assert math.isclose(sum(by_cat.values()), total, rel_tol=1e-12)
        pcie = prep.config.hw.links["pcie"]  # charged per wire bit
        assert math.isclose(energy["pcie"].sum(), moved * 8 * pcie.energy_pj_per_bit * pcie.wire_bytes_per_data_byte)
        row = summarize(result, table, TINY.top_k)
        parts = (row["energy_onchip_active_mj"] + row["energy_offchip_io_mj"] + row["energy_idle_leakage_mj"]
                 + row["energy_host_cpu_mj"])
        assert math.isclose(parts, row["energy_mj_per_token"], rel_tol=1e-12)
        assert (result.per_token.busy_ps + result.per_token.idle_ps == result.per_token.latency_ps).all()


def test_pcie_utilization_is_bytes_over_link_capacity_and_never_above_one(tiny):
    cfg = tiny.config()
    for bw in (8, 118):  # a slow link (the link binds) and thor's
        prep = prepare(cfg, overrides=[f"links.pcie.bandwidth_gbps={bw}"],
                       policy_specs=["no-prefetch", "static-3", "oracle"])
        for policy in prep.policies:
            result = simulate(prep, policy)
            row = summarize_result(prep, result, policy)
            seconds = result.per_token.latency_ps.sum() / 1e12
            # thor's TLPs: 256 B of payload, 12 B of header, packed into FLITs by the link layer (whole FLITs of a
            # 1 GiB read: within 1e-6 of the ratio)
            data_gbps = prep.config.hw.links["pcie"].data_gbps
            assert data_gbps == pytest.approx(bw * 256 / (256 + 12), rel=1e-6)
            by_hand = result.per_token.bytes["pcie"].sum() / (seconds * data_gbps * 1e9)
            assert row["pcie_utilization"] == pytest.approx(by_hand, rel=1e-12)
            assert 0 < row["pcie_utilization"] <= 1.0
            if bw == 8 and policy.label == "oracle":  # link-bound and always fetching ahead: near its peak
                assert row["pcie_utilization"] > 0.8


def test_no_expert_is_computed_before_its_bytes_arrive_and_the_buffer_never_overflows(tiny):
    cfg = tiny.config()
    prep = prepare(cfg, policy_specs=["static-4"])
    from chipsim.sim.engine import Simulation

    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0], record_events=True)
    result = sim.run()
    assert result.counts.peak_buffer_slots <= sim.slots
    landed = {}
    for lane, name, start, end in result.timeline.events:
        if lane.startswith("dma"):
            landed.setdefault(name, []).append(end)
    for lane, name, start, end in result.timeline.events:
        if lane == "arrays" and " experts " in name:
            layer = name.split()[0]
            for e in name.split("[")[1].rstrip("]").split(","):
                key = f"{layer}E{int(e)}"
                assert any(t <= start for t in landed[key]), key


def test_same_run_twice_gives_byte_identical_json(tmp_path, thor_path, tiny):
    from chipsim.cli import main

    cfg = tiny.config()
    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert main(["run", cfg, "--policy", "no-prefetch", "--policy", "oracle", "--out", str(out), "--jobs", "1"]) == 0
        outs.append(((out / "results.json").read_bytes(), (out / "results.csv").read_bytes()))
    assert outs[0] == outs[1]
    assert sorted(p.name for p in (tmp_path / "out0").iterdir()) == ["results.csv", "results.json"]


def test_more_pcie_bandwidth_never_slows_no_prefetch(tiny):
    cfg = tiny.config()
    latencies = []
    for gbps in (8, 16, 32, 64, 118, 256, 512):
        prep = prepare(cfg, [f"links.pcie.bandwidth_gbps={gbps}"], ["no-prefetch"])
        latencies.append(simulate(prep, prep.policies[0]).per_token.latency_ps.mean())
    # never slower, but for HBM's turnaround, calibrated at each run's write share to ~2 % (test_sweep's twin)
    assert all(a >= b * (1 - 0.005) for a, b in zip(latencies, latencies[1:]))
    assert all(a > b for a, b in zip(latencies[:5], latencies[1:6]))  # strictly faster while PCIe limits
    assert latencies[0] > latencies[-1]


def test_oracle_is_never_slower_than_no_prefetch_or_static(tiny):
    cfg = tiny.config()
    prep = prepare(cfg, policy_specs=["no-prefetch", "oracle", "oracle:lookahead=0", "static-0", "static-2"])
    lat = {p.label: simulate(prep, p).per_token.latency_ps for p in prep.policies}
    for other in ("no-prefetch", "static-0", "static-2", "oracle:lookahead=0"):
        assert (lat["oracle"] <= lat[other]).all()
    for other in ("no-prefetch", "static-0", "static-2"):
        assert (lat["oracle:lookahead=0"] <= lat[other]).all()
    assert lat["oracle"].mean() < lat["oracle:lookahead=0"].mean() < lat["no-prefetch"].mean()


def test_static_zero_with_a_perfect_ranking_is_exactly_the_apex_timed_oracle(tiny):
    cfg = tiny.config()  # the hand trace's APEX ranking puts the routed experts first
    prep = prepare(cfg, policy_specs=["oracle:lookahead=0", "static-0"])
    a, b = (simulate(prep, p) for p in prep.policies)
    assert (a.per_token.latency_ps == b.per_token.latency_ps).all()
    assert (a.per_token.bytes["pcie"] == b.per_token.bytes["pcie"]).all()


def test_a_wrong_ranking_makes_static_fetch_on_demand(tiny):
    routed = np.array([[[0, 1]] * 3] * 4, dtype=np.uint8)
    wrong = np.array([[[7, 6, 5, 4, 3, 2, 1, 0]] * 3] * 4, dtype=np.uint8)  # routed experts ranked last
    cfg = tiny.config(routed, apex_rank=wrong, extra_yaml="")
    prep = prepare(cfg, policy_specs=["static-2", "no-prefetch"])
    table = EnergyTable.from_config(prep.config.hw)
    static, none = (summarize(simulate(prep, p), table, 2) for p in prep.policies)
    assert static["overlap"] == 0.0 and static["demand_fetches_per_token"] == 2 * 3
    assert static["prefetches_unused"] == (2 + 2) * 3 * 4  # k+2 staged per layer, none used
    assert static["latency_ms_per_token"] >= none["latency_ms_per_token"]


def test_a_buffer_of_exactly_top_k_slots_still_completes_with_prefetches_for_other_layers(tiny):
    """Prefetches for the next layer fill the buffer; demand fetches must evict or wait, never deadlock."""
    from chipsim.policies.base import Policy
    from chipsim.sim.engine import Simulation

    routed = tiny.routing(5, seed=9)
    # two experts of 196,608 bytes each: 0.4 MiB holds exactly top-k = 2
    cfg = tiny.config(routed, extra_yaml="expert_buffer:\n  capacity_mib: 0.4\n")
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    assert prep.workload.buffer_slots == 2

    class NextLayerGreedy(Policy):
        name = "test-next-layer"
        caches_across_tokens = True

        def on_layer_start(self, ctx, t, layer):
            if layer + 1 < ctx.num_moe_layers:
                for e in range(ctx.num_experts):
                    ctx.prefetch(layer + 1, e)

        def on_layer_end(self, ctx, t, layer):
            ctx.evict_layer(layer)

    result = Simulation(prep.config.hw, prep.workload, prep.trace, NextLayerGreedy("greedy")).run()
    assert result.counts.expert_computes == routed.size
    assert (result.per_token.latency_ps > 0).all()


def test_experts_on_the_host_cpu_take_the_hand_computed_time_and_charge_its_energy(tiny):
    """A policy that sends every routed expert to the host: the layer waits dispatch + 2 PCIe crossings +
    max(FLOPs / peak, bytes / host bandwidth) per expert, one expert at a time."""
    from chipsim.policies.base import LayerPlan, Policy
    from chipsim.sim.engine import Simulation

    class AllOnHost(Policy):
        name = "test-host"

        def on_route(self, ctx, t, layer, routed):
            return LayerPlan(execute=[], on_host=list(routed))

    routed = tiny.routing()
    cfg = tiny.config(routed)
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    hw, wl = prep.config.hw, prep.workload
    cpu = hw.host_cpu
    flops_ps = -(-2 * TINY.expert_params * 10**12 // int(cpu.cores * cpu.clock_ghz * 1e9 * cpu.flops_per_cycle_per_core))
    bytes_ps = -(-wl.expert_bytes * 10**12 // int(cpu.memory_bandwidth_gbps * 1e9))
    act = TINY.hidden_size * 2
    pcie_data = gbps_to_bytes_per_s(hw.links["pcie"].bandwidth_gbps * 256 / 268)  # thor's TLPs: 256 B payload + 12 B
    transit = 2 * (ns_to_ps(hw.links["pcie"].latency_ns) + -(-act * 10**12 // pcie_data))
    per_expert = ns_to_ps(cpu.dispatch_overhead_ns) + transit + max(flops_ps, bytes_ps)
    expected = sum(c.attention.duration_ps + c.router.duration_ps + 2 * per_expert + c.combine.duration_ps
                   for c in wl.layers) + wl.token_head.duration_ps
    result = Simulation(hw, wl, prep.trace, AllOnHost("host")).run()
    assert (result.per_token.latency_ps == expected).all()
    assert (result.per_token.bytes["pcie"] == 3 * 2 * 2 * act).all()  # activations only: no expert crossed PCIe
    assert (result.per_token.bytes["lpddr5x"] == 3 * 2 * wl.expert_bytes).all()  # the CPU read its own copies
    assert (result.per_token.host_busy_ps == 3 * 2 * (per_expert - transit)).all()
    row = summarize(result, EnergyTable.from_config(hw), TINY.top_k)
    assert math.isclose(row["energy_host_cpu_mj"], 3 * 2 * (per_expert - transit) * 1e-12 * cpu.active_power_w * 1e3)
    assert row["host_experts_per_token"] == 6


def test_static_with_complete_unpicked_moves_every_prefetched_byte(tiny):
    """The APEX paper's accounting of static k+N: all k+N experts cross PCIe, picked or not."""
    routed = tiny.routing()
    cfg = tiny.config(routed)
    prep = prepare(cfg, policy_specs=["static-3", "static-3:complete_unpicked=true"])
    stopped, completed = (simulate(prep, p) for p in prep.policies)
    T, L, k = routed.shape
    assert completed.per_token.bytes["pcie"].sum() == T * L * (k + 3) * prep.workload.expert_bytes
    assert stopped.per_token.bytes["pcie"].sum() < completed.per_token.bytes["pcie"].sum()


def test_static_8_completing_unpicked_prefetches_moves_twice_the_bytes_of_no_prefetch_on_thor():
    """Granite-3B top-8 with a buffer that has room (768 MiB): static k+8 moves 16 experts per layer, picked or not,
    so twice no-prefetch's bytes (the APEX paper's Table V accounting). The unpicked ones complete as demand
    fetches once their layer has run; as prefetches they were starved by the next layers' demands and filled
    the buffer (1.21x, with prefetches dropped for want of a slot)."""
    prep = prepare(THOR_CONFIG, ["workload.max_tokens=16", "expert_buffer.capacity_mib=768"],
                   ["no-prefetch", "static:extra=8,complete_unpicked=true"])
    base, completed = (simulate(prep, p) for p in prep.policies)
    ratio = completed.per_token.bytes["pcie"].sum() / base.per_token.bytes["pcie"].sum()
    assert ratio == pytest.approx(2.0, abs=0.05)
    assert completed.counts.prefetches_dropped == 0


def test_energy_is_action_counts_times_the_table_plus_static_power_times_time(tiny):
    """Accelergy style, by hand for no-prefetch on the tiny model: the MACs, SFU and lane operations of every op
    the token runs, SRAM bits = 8 × operand bytes each way, clock power while the arrays run (gated when idle),
    every component's static power over the whole latency, and the components sum to the total."""
    routed = tiny.routing()
    cfg = tiny.config(routed)
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    hw, wl = prep.config.hw, prep.workload
    k = TINY.top_k
    ops = [wl.token_head]
    for c in wl.layers:
        ops += [c.attention, c.router, c.dense, c.combine] + ([c.expert] * k if c.expert else [])
    ops = [op for op in ops if op is not None]
    macs, sfu, vec = (sum(getattr(op, f) for op in ops) for f in ("macs", "sfu_ops", "vector_ops"))
    operand_bytes = sum(op.hbm_read_bytes + op.hbm_write_bytes for op in ops)
    result = simulate(prep, prep.policies[0])
    tok = result.per_token
    assert macs > 0 and (tok.actions["mac"] == macs).all() and (tok.actions["sfu_op"] == sfu).all()
    assert (tok.actions["vector_op"] == vec).all()
    assert (tok.actions["sram_write_bit"] == 8 * operand_bytes).all() and (tok.actions["sram_read_bit"] == 8 * operand_bytes).all()
    c = hw.compute
    latency_ps = int(tok.latency_ps[0])
    by_hand_pj = {
        "arrays_mac": macs * c.mac_energy_pj,
        "arrays_sfu": sfu * c.sfu_op_energy_pj,
        "arrays_vector": vec * c.vector_op_energy_pj,
        "arrays_sram": 8 * operand_bytes * (c.sram_read_pj_per_bit + c.sram_write_pj_per_bit),
        "arrays_clock": int(tok.busy_ps[0]) * c.clock_power_w_per_array * c.arrays,  # W × ps = pJ
        "static_arrays": latency_ps * c.leakage_power_w_per_array * c.arrays,
        "static_hbm": latency_ps * hw.memory["hbm"].background_power_w,
        "static_lpddr5x": latency_ps * hw.memory["lpddr5x"].background_power_w,
        "static_pcie": latency_ps * hw.links["pcie"].static_power_w,
        "static_ucie": latency_ps * hw.links["ucie"].static_power_w,
        "hbm": (operand_bytes + k * 3 * wl.expert_bytes) * 8 * hw.memory["hbm"].energy_pj_per_bit,  # reads + fetch writes
    }
    energy = per_token_energy_pj(result, EnergyTable.from_config(hw))
    for comp, pj in by_hand_pj.items():
        assert energy[comp][0] == pytest.approx(pj, rel=1e-12), comp
    row = summarize(result, EnergyTable.from_config(hw), k)
    assert sum(row["energy_by_component_mj"].values()) == pytest.approx(row["energy_mj_per_token"], rel=1e-12)
    # clocks that keep running while the arrays wait: clock power over the whole latency instead
    ungated = prepare(cfg, overrides=["compute.clock_gated_when_idle=false"], policy_specs=["no-prefetch"])
    energy = per_token_energy_pj(simulate(ungated, ungated.policies[0]), EnergyTable.from_config(ungated.config.hw))
    assert energy["arrays_clock"][0] == pytest.approx(latency_ps * c.clock_power_w_per_array * c.arrays, rel=1e-12)
    # clock power by occupancy: each operation's time weighted by the share of the arrays it occupies
    assert int(tok.busy_ps[0]) == sum(op.duration_ps for op in ops)  # every operation ran at its own pace here
    occupied = sum(op.occupied_ps for op in ops)
    assert 0 < occupied < int(tok.busy_ps[0])  # the tiny model's small operations leave arrays idle
    by_occ = prepare(cfg, overrides=["compute.clock_power_by_occupancy=true"], policy_specs=["no-prefetch"])
    res = simulate(by_occ, by_occ.policies[0])
    assert res.per_token.occupied_ps[0] == occupied
    energy = per_token_energy_pj(res, EnergyTable.from_config(by_occ.config.hw))
    assert energy["arrays_clock"][0] == pytest.approx(occupied * c.clock_power_w_per_array * c.arrays, rel=1e-12)


def test_an_operation_occupies_the_share_of_the_arrays_its_work_fills_in_one_pass():
    """By hand on thor's arrays: a vector operation of 3 arrays' lanes occupies 3 arrays for its whole time; one
    of 10,000 arrays' lanes occupies all of them; an op group's launch occupies none; a sum adds them up."""
    from chipsim.hw.compute_formula import ArrayModel

    hw = load_config(THOR_CONFIG).hw
    c = hw.compute
    am = ArrayModel(hw)
    per_array = c.unit_rows * c.unit_cols * c.vector_length  # lane operations one array does per cycle
    small = am.vector("small", 3 * per_array)
    assert small.occupied_ps == small.duration_ps * 3 // c.arrays
    big = am.vector("big", 10_000 * per_array)
    assert big.occupied_ps == big.duration_ps
    assert am.group_launch("attention").occupied_ps == 0
    assert (small + big).occupied_ps == small.occupied_ps + big.occupied_ps
    sfu = am.sfu("one_rsqrt", 1)  # one special-function op: one array's SFUs
    assert sfu.occupied_ps == sfu.duration_ps // c.arrays


def test_experts_staged_in_sram_skip_hbm_both_ways_and_land_in_sram(tiny):
    """expert_buffer.location: sram: a fetch crosses LPDDR5X, PCIe and UCIe and is written into the arrays'
    SRAM; the experts are read from SRAM. Against HBM staging, HBM moves exactly 2 × the fetched bytes less (no
    write, no read), PCIe the same, SRAM gets 8 bits per fetched byte written, and the experts' operand reads
    come from SRAM instead of HBM."""
    routed = tiny.routing()
    cfg = tiny.config(routed)
    sram = ["expert_buffer.location=sram", "compute.sram_read_gbps_per_array=1536", "compute.sram_mib_per_array=64"]
    in_hbm = prepare(cfg, policy_specs=["no-prefetch"])
    in_sram = prepare(cfg, overrides=sram, policy_specs=["no-prefetch"])
    a, b = (simulate(p, p.policies[0]).per_token for p in (in_hbm, in_sram))
    fetched = 3 * TINY.top_k * in_hbm.workload.expert_bytes  # per token: 3 MoE layers x top-k experts
    assert (a.bytes["pcie"] == fetched).all() and (b.bytes["pcie"] == fetched).all()
    assert (a.bytes["hbm"] - b.bytes["hbm"] == 2 * fetched).all()
    assert (b.actions["sram_write_bit"] - a.actions["sram_write_bit"] == 0).all()  # fetch writes replace operand writes
    assert (b.actions["sram_read_bit"] == a.actions["sram_read_bit"]).all()
    assert (b.latency_ps < a.latency_ps).all()  # experts read from SRAM, not streamed from HBM


def test_experts_staged_in_sram_must_fit_it():
    with pytest.raises(Exception) as exc:
        prepare(THOR_CONFIG, ["expert_buffer.location=sram", "compute.sram_read_gbps_per_array=1536"], ["no-prefetch"])
    assert "does not fit the arrays' 8 MiB" in str(exc.value) and "expert_buffer.capacity_mib" in str(exc.value)


def test_an_operation_with_a_measured_energy_is_charged_it_instead_of_its_actions(tiny):
    """compute.op_energy_pj, by hand for no-prefetch: every primitive shape of the expert FFN listed with its own
    energy. Every operation of that shape (in the experts, and wherever else the tiny model has it) is then charged
    its listed energy (ledger entry arrays_profiled); its MACs, lane operations and SRAM bits leave the priced
    actions and its operand bits the priced HBM and UCIe energy, while the bytes moved and every time stay."""
    import json

    from chipsim.hwreplay.ops import primitive_ops

    cfg = tiny.config(tiny.routing())
    base = prepare(cfg, policy_specs=["no-prefetch"])
    prims = primitive_ops(base.config.hw)["expert"]
    listed = {key: 1_000_003 + 7 * i for i, key in enumerate(sorted({p.key for p in prims}))}
    prof = prepare(cfg, overrides=[f"compute.op_energy_pj={json.dumps(listed)}"], policy_specs=["no-prefetch"])
    b_exp, p_exp = base.workload.moe_layer(0).expert, prof.workload.moe_layer(0).expert
    assert p_exp.profiled_pj == sum(listed[p.key] for p in prims) and b_exp.profiled_pj == 0
    assert (p_exp.macs, p_exp.vector_ops, p_exp.occupied_ps) == (0, 0, 0) and b_exp.macs > 0
    assert p_exp.unpriced_bytes == b_exp.hbm_read_bytes + b_exp.hbm_write_bytes > 0
    assert p_exp.duration_ps == b_exp.duration_ps  # timing unchanged

    def token_ops(wl):
        ops = [wl.token_head]
        for c in wl.layers:
            ops += [c.attention, c.router, c.dense, c.combine] + ([c.expert] * TINY.top_k if c.expert else [])
        return [op for op in ops if op is not None]

    ops_b, ops_p = token_ops(base.workload), token_ops(prof.workload)
    profiled, unpriced = sum(op.profiled_pj for op in ops_p), sum(op.unpriced_bytes for op in ops_p)
    assert profiled >= TINY.top_k * TINY.num_moe_layers * p_exp.profiled_pj  # the experts', and shapes shared
    rb, rp = simulate(base, base.policies[0]), simulate(prof, prof.policies[0])
    tb, tp = rb.per_token, rp.per_token
    assert (tp.latency_ps == tb.latency_ps).all() and (tp.bytes["hbm"] == tb.bytes["hbm"]).all()
    assert (tp.profiled_pj == profiled).all() and (tb.profiled_pj == 0).all()
    assert (tp.actions["mac"] == sum(op.macs for op in ops_p)).all()
    assert (tb.actions["mac"] == sum(op.macs for op in ops_b)).all()
    assert (tp.unpriced_operand_bytes == unpriced).all()
    assert (tp.actions["sram_read_bit"] == tb.actions["sram_read_bit"] - 8 * unpriced).all()
    hw = prof.config.hw
    eb = per_token_energy_pj(rb, EnergyTable.from_config(base.config.hw))
    ep = per_token_energy_pj(rp, EnergyTable.from_config(hw))
    assert "arrays_profiled" not in eb and ep["arrays_profiled"][0] == profiled
    assert eb["hbm"][0] - ep["hbm"][0] == pytest.approx(8 * unpriced * hw.memory["hbm"].energy_pj_per_bit, rel=1e-9)
    ucie = hw.links["ucie"]  # charged per wire bit (its flits)
    assert eb["ucie"][0] - ep["ucie"][0] == pytest.approx(
        8 * unpriced * ucie.energy_pj_per_bit * ucie.wire_bytes_per_data_byte, rel=1e-9)
    row = summarize(rp, EnergyTable.from_config(hw), TINY.top_k)
    assert sum(row["energy_by_component_mj"].values()) == pytest.approx(row["energy_mj_per_token"], rel=1e-12)
