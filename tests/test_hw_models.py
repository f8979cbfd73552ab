"""DRAM timing and array operation costs, checked against hand arithmetic on the thor config."""

import dataclasses
import math

from conftest import THOR

from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.config import load_config
from chipsim.hw.dram_formula import dram_timing
from chipsim.workload.decode import _mixer, dense_weights
from chipsim.workload.shape import FULL
from chipsim.workload.models import MODELS


def hw():
    """thor on the closed-form DRAM timing and the analytic arrays, whose figures these tests sum by hand
    (test_dram_calibration.py checks the command-level ones, test_compute_tiles.py the cycle-level arrays)."""
    return load_config(THOR, ["memory.hbm.timing_model=closed-form", "memory.lpddr5x.timing_model=closed-form",
                              "compute.timing=analytic"]).hw


def test_hbm3_streaming_bandwidth_loses_only_refresh_when_banks_hide_row_switches():
    t = dram_timing(hw().memory["hbm"])
    assert math.isclose(t.peak_gbps, 16 * 64 / 8 * 6.4)  # 819.2 GB/s
    # one 1 KB row per channel streams in 20 ns; (tRCD + 20 + tRP) / 16 banks = 3.5 ns is hidden
    assert t.row_efficiency == 1.0
    assert math.isclose(t.effective_gbps, 819.2 * (1 - 260 / 3900))  # tRFC 260 ns: HBM3_8Gb_8hi's density
    assert math.isclose(t.access_latency_ns, 19.375 + 12.5 + 8 / 6.4)


def test_row_switches_show_when_there_is_one_bank_to_interleave():
    cfg = dataclasses.replace(hw().memory["hbm"], banks_per_channel=1)
    t = dram_timing(cfg)
    # each 20 ns row now costs tRCD + 20 + tRP = 55.625 ns
    assert math.isclose(t.row_efficiency, 20 / 55.625)


def test_tfaw_limits_small_pages():
    cfg = dataclasses.replace(hw().memory["hbm"], page_bytes=64)
    t = dram_timing(cfg)
    # 64 B rows stream in 1.25 ns but only four activates fit in tFAW = 15 ns: one row per 3.75 ns
    assert math.isclose(t.row_efficiency, 1.25 / 3.75)


def test_lpddr5x_thor_bandwidth():
    t = dram_timing(hw().memory["lpddr5x"])
    assert math.isclose(t.peak_gbps, 16 * 2 * 8.533)
    assert math.isclose(t.effective_gbps, 16 * 2 * 8.533 * (1 - 280 / 3906))


def _stream_bytes_per_s():
    return round(819.2e9 * (1 - 260 / 3900))  # HBM is the narrower of HBM (765) and UCIe (1024 GB/s)


def _fixed_ps():
    overhead = math.ceil(32 * 1e6 / 750)  # 32 overhead cycles at 750 MHz
    first_operand = math.ceil((19.375 + 12.5 + 1.25 + 2.0 + 2.0) * 1000)  # HBM access + UCIe + SRAM, ns
    return overhead, first_operand


def test_gemv_cost_is_the_slower_of_tiling_and_streaming_plus_fixed_latency():
    am = ArrayModel(hw())
    # Granite-3B expert gate+up: reduction 1536, 1024 outputs, BF16 weights
    op = am.matvec("gate_up", 1536, 1024, 1536 * 1024 * 2)
    # 1024 outputs x 48 chunks of 32 over 4*16*16 = 1024 units -> 48 cycles
    assert op.compute_ps == math.ceil(48 * 1e6 / 750)
    memory_ps = -(-1536 * 1024 * 2 * 10**12 // _stream_bytes_per_s())
    assert op.memory_ps == memory_ps
    overhead, first = _fixed_ps()
    assert op.duration_ps == max(op.compute_ps, memory_ps) + overhead + first
    assert op.macs == 1536 * 1024


def test_a_gemm_of_a_prefill_chunk_is_compute_bound_by_hand():
    """The same gate+up for a 512-token chunk: 512 x 1024 outputs x 48 chunks of 32 on 1,024 units = 24,576
    cycles (32.8 µs), far above the 3 MiB's stream; the weights cross once; one token is the GEMV itself."""
    am = ArrayModel(hw())
    op = am.matmul("gate_up", 512, 1536, 1024, 1536 * 1024 * 2)
    assert op.compute_ps == math.ceil(512 * 48 * 1e6 / 750)
    assert op.memory_ps == -(-1536 * 1024 * 2 * 10**12 // _stream_bytes_per_s())
    overhead, first = _fixed_ps()
    assert op.duration_ps == op.compute_ps + overhead + first
    assert (op.macs, op.hbm_read_bytes) == (512 * 1536 * 1024, 1536 * 1024 * 2)
    assert am.matmul("gate_up", 1, 1536, 1024, 1536 * 1024 * 2) == am.matvec("gate_up", 1536, 1024, 1536 * 1024 * 2)


def test_the_cycle_level_gemm_agrees_with_the_analytic_one_where_both_are_compute_bound():
    """thor's cycle-level tile loop on the 512-token GEMM: its MACs and the tiling's cycles are the analytic
    model's; the time within 2 % (SRAM tiles, issue and sync on top)."""
    cycle = ArrayModel(load_config(THOR).hw).matmul("gate_up", 512, 1536, 1024, 1536 * 1024 * 2)
    analytic = ArrayModel(hw()).matmul("gate_up", 512, 1536, 1024, 1536 * 1024 * 2)
    assert cycle.macs == analytic.macs and cycle.compute_ps == analytic.compute_ps
    assert analytic.duration_ps <= cycle.duration_ps * 1.02 and cycle.duration_ps <= analytic.duration_ps * 1.02


def test_gemv_with_few_outputs_leaves_units_idle():
    am = ArrayModel(hw())
    # 8 outputs of length 64: 8 x 2 chunks = 16 work items on 1024 units: still one cycle
    op = am.matvec("tiny", 64, 8, 0)
    assert op.compute_ps == math.ceil(1e6 / 750)


def test_one_attention_step_of_granite_3b_at_1024_context_by_hand():
    am = ArrayModel(hw())
    m = MODELS["granite-3.1-3b-a800m"]
    ctx = 1024
    d, nq, nkv, hd = 1536, 24, 8, 64
    B = _stream_bytes_per_s()
    overhead, first = _fixed_ps()

    def cyc(c):
        return math.ceil(c * 1e6 / 750)

    def mem(nbytes):
        return -(-nbytes * 10**12 // B)

    def matvec(red, outs, nbytes):
        return max(cyc(-(-outs * -(-red // 32) // 1024)), mem(nbytes)) + overhead + first

    expected = (
        cyc(1) + overhead  # rsqrt on the SFUs (128 per cycle)
        + cyc(1) + overhead  # 2d lane ops of scaling on 32768 lanes
        + max(cyc(-(-(nq + 2 * nkv) * hd * 48 // 1024)), mem(d * (nq + 2 * nkv) * hd * 2 + 2 * nkv * hd * 2)) + overhead + first
        + cyc(-(-2 * (nq + nkv) * hd // 32768)) + overhead  # RoPE
        + matvec(hd, nq * ctx, nkv * ctx * hd * 2)  # scores: 24 x 1024 dot products of 64
        + cyc(-(-nq * ctx // 128)) + overhead  # exp on the SFUs
        + cyc(-(-3 * nq * ctx // 32768)) + overhead  # max, sum, scale
        + matvec(ctx, nq * hd, nkv * ctx * hd * 2)  # value mix
        + matvec(nq * hd, d, nq * hd * d * 2)  # output projection
        + cyc(1) + overhead  # residual
    )
    assert _mixer(am, m, dense_weights(hw()), FULL, ctx).duration_ps == expected


def test_expert_bytes_scale_with_precision_plus_group_scales():
    from chipsim.workload.decode import weight_bytes

    params = 3 * 1536 * 512
    assert weight_bytes(params, 16, 128, 16) == params * 2
    assert weight_bytes(params, 32, 128, 16) == params * 4
    assert weight_bytes(params, 8, 128, 16) == params + params // 128 * 2
    assert weight_bytes(params, 4, 128, 16) == params // 2 + params // 128 * 2


def test_a_profiled_op_takes_its_measured_time_and_the_rest_the_array_model():
    base = hw()
    key = "matvec r1536 o1024 b3145728"
    prof = dataclasses.replace(base, compute=dataclasses.replace(base.compute, op_times_ns={key: 10114.0}))
    am, ref = ArrayModel(prof), ArrayModel(base)
    op = am.matvec("gate_up", 1536, 1024, 1536 * 1024 * 2)
    assert op.duration_ps == 10_114_000
    assert (op.hbm_read_bytes, op.macs) == (1536 * 1024 * 2, 1536 * 1024)  # energy still counts its actions
    other = am.matvec("down", 512, 1536, 512 * 1536 * 2)  # not in the table: the array model's cost
    assert other.duration_ps == ref.matvec("down", 512, 1536, 512 * 1536 * 2).duration_ps
    assert (am.profiled_ops, am.modelled_ops) == (1, 1)


def test_op_group_launch_is_charged_once_per_group():
    from chipsim.workload.decode import build_workload

    base = hw()
    launched = dataclasses.replace(base, compute=dataclasses.replace(base.compute, op_group_launch_ns=800.0))
    a, b = build_workload(base), build_workload(launched)
    for group in ("attention", "router", "expert", "combine"):
        assert getattr(b.moe_layer(0), group).duration_ps == getattr(a.moe_layer(0), group).duration_ps + 800_000
    assert b.token_head.duration_ps == a.token_head.duration_ps + 800_000


def test_read_write_turnaround_is_two_switches_per_drained_batch_of_writes():
    """thor HBM3 (Ramulator 2.1 HBM3_6400Mbps): RD->WR 12.5 ns + WR->RD 11.875 ns per batch of 38 write bursts
    (a 64-entry write queue drained from 80 to 20 %) of 8 beats at 6400 MT/s (1.25 ns each): every written byte
    costs 24.375 / 47.5 = 0.513 more bytes of time."""
    t = dram_timing(hw().memory["hbm"])
    assert math.isclose(t.turnaround, 24.375 / 47.5, rel_tol=1e-12)
    lp = dram_timing(hw().memory["lpddr5x"])  # LPDDR5X-8533, BL16: 1.875 ns per burst
    assert math.isclose(lp.turnaround, 35.0 / (38 * 16 / 8533e-3), rel_tol=1e-12)
