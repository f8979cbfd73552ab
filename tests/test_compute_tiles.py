"""The cycle-level tile loop of the compute chiplet (chipsim.tilesim.tile_sim), checked by hand: a GEMV's cycles
from the tile loop, a stream limited by outstanding requests (Little's law) or by double buffering, the closed
form where it is exact, an SFU-bound softmax, and the action counts."""

import math

import pytest

from chipsim.tilesim.tile_sim import ChipletParams, elementwise, matvec, sfu

# thor's arrays (APEX Table III): 4 arrays of 16 x 16 units x 32 lanes at 750 MHz, 32 SFUs each
THOR = dict(arrays=4, units_per_array=256, vector_length=32, clock_mhz=750.0, sfus_per_array=32, sfu_ops_per_cycle=1)
CYCLE_PS = 1e6 / 750


def params(**kw) -> ChipletParams:
    base = dict(sram_read_bytes_per_cycle=512, tile_bytes=8192, request_bytes=64, outstanding_requests_per_array=1 << 20,
                memory_gbps=1e9, memory_latency_ns=0.0, issue_cycles=0, sync_cycles=0)
    base.update(kw)
    return ChipletParams(**THOR, **base)


def test_a_compute_bound_gemv_takes_the_tile_loop_cycles_by_hand():
    """Granite-3B gate+up (1536 x 1024 BF16 = 3 MiB) on instant memory: each array holds 256 outputs x 1536 x 2 B =
    786,432 B = 96 tiles of 8 KiB; a tile is 4,096 MACs (one cycle of 8,192 lanes) but 16 cycles of a 512 B/cycle
    SRAM read port, so the SRAM sets the pace: 96 x 16 cycles, plus issue and sync."""
    r = matvec(params(issue_cycles=32, sync_cycles=8), 1536, 1024, 2)
    assert r.tiles == 96 and r.compute_cycles == 96 * 16
    assert r.ps == pytest.approx((96 * 16 + 32 + 8) * CYCLE_PS, abs=1)  # + the first tile's 0.03 ps of transfer
    assert r.macs == 1536 * 1024 and r.hbm_bytes == r.sram_write_bytes == r.sram_read_bytes == 1536 * 1024 * 2


def test_a_long_gemv_on_idle_memory_matches_the_closed_form():
    """Unlimited outstanding requests and tiles large enough that double buffering never binds: the stream is
    latency + bytes / (B / A), and the operation ends one tile's compute after the last byte; the closed form's
    bytes / B + first-operand latency is exact to within that tile."""
    p = params(memory_gbps=683.0, memory_latency_ns=50.0, tile_bytes=1 << 16)
    r = matvec(p, 8192, 8192, 2)
    closed_ps = r.hbm_bytes / (683.0) * 1e3 + 50.0e3
    last_tile_ps = math.ceil((1 << 16) / 512) * CYCLE_PS
    assert closed_ps <= r.ps <= closed_ps + last_tile_ps + 1


def test_outstanding_requests_bound_the_stream_by_littles_law():
    """4 requests of 64 B in flight per array against 100 ns of latency: 2.56 GB/s per array, far below its
    share of the bandwidth, so a 1 MiB-per-array GEMV takes 1 MiB / 2.56 GB/s (to within one latency)."""
    p = params(memory_gbps=683.0, memory_latency_ns=100.0, outstanding_requests_per_array=4)
    r = matvec(p, 1024, 2048, 2)  # 4 MiB in all, 1 MiB per array
    per_array = 512 * 1024 * 2
    expected = per_array / (4 * 64 / 100.0) * 1e3
    assert r.stream_ps == pytest.approx(expected, abs=110e3)


def test_double_buffering_bounds_the_stream_to_two_tiles_per_latency():
    """Small tiles (1 KiB), unlimited requests, fast links: only two tiles can be on their way, so each array
    moves 2 KiB per (latency + a tile's compute)."""
    p = params(memory_gbps=1e6, memory_latency_ns=100.0, tile_bytes=1024)
    r = matvec(p, 1024, 1024, 2)  # 512 KiB per array = 512 tiles
    tile_compute = math.ceil(1024 / 512) * CYCLE_PS
    expected = 512 / 2 * (100e3 + tile_compute)
    assert r.stream_ps == pytest.approx(expected, rel=0.01)


def test_softmax_on_the_sfus_takes_ops_over_sfu_throughput():
    """Granite-3B attention at 1,024 context: 24 heads x 1,024 exponentials over 4 x 32 SFUs at one per cycle."""
    r = sfu(params(issue_cycles=32), 24 * 1024)
    assert r.compute_cycles == 24 * 1024 // 128
    assert r.ps == math.ceil((192 + 32) * CYCLE_PS) and r.sfu_ops == 24 * 1024


def test_softmax_is_sfu_bound_until_the_sram_read_width_binds_and_pays_the_pipeline_drain():
    """24 x 1,024 exponentials: 6,144 per array over 32 SFUs = 192 cycles; reading 2 B inputs at 512 B per cycle
    takes 24, so the SFUs set the pace; a 16-stage pipeline drains once. At 32 B per cycle the SRAM takes 384."""
    r = sfu(params(issue_cycles=32, sync_cycles=16, sfu_pipeline_cycles=16), 24 * 1024)
    assert r.compute_cycles == 192 + 16
    assert r.ps == math.ceil((192 + 16 + 32 + 16) * CYCLE_PS)
    assert r.sram_read_bytes == r.sram_write_bytes == 24 * 1024 * 2
    slow = sfu(params(sram_read_bytes_per_cycle=32), 24 * 1024)
    assert slow.compute_cycles == 6144 * 2 // 32


def test_elementwise_work_runs_at_the_lanes_or_the_sram_width_and_an_hbm_operand_through_the_tile_loop():
    """A residual add over d = 1,536: 384 per array, one lane cycle, but 768 B at 512 B per cycle = 2 cycles.
    An embedding row (1,536 BF16 = 3 KiB from HBM, one lane op per element) streams like a GEMV's weights."""
    r = elementwise(params(issue_cycles=32), 1536)
    assert r.compute_cycles == 2 and r.ps == math.ceil((2 + 32) * CYCLE_PS) and r.hbm_bytes == 0
    p = params(memory_gbps=683.0, memory_latency_ns=50.0)
    emb = elementwise(p, 1536, read_bytes=3072)
    per_array = 3072 // 4
    assert emb.hbm_bytes == 3072 and emb.requests == per_array // 64
    # the last of 12 requests lands 50 ns + 11 x 64 B / (683 / 4 GB/s) after the first issue, then one SRAM cycle
    last = 50e3 + 11 * 64 / (683.0 / 4) * 1e3
    assert emb.ps == math.ceil(last + math.ceil(per_array / 512) * CYCLE_PS)


def test_one_heads_attention_by_hand_from_the_tile_loop():
    """One Granite-3B KV head at 1,024 context, on one array's share: scores read the head's K (1,024 x 64 BF16 =
    128 KiB) as a GEMV of 1,024 outputs x 64; with instant memory the SRAM read width sets the pace: 16 tiles of
    8 KiB, 16 cycles each; the softmax over 1,024 scores is 8 SFU cycles per array; the value mix reads V alike."""
    p = ChipletParams(**dict(THOR, arrays=1), sram_read_bytes_per_cycle=512, tile_bytes=8192, request_bytes=64,
                      outstanding_requests_per_array=1 << 20, memory_gbps=1e9, memory_latency_ns=0.0)
    scores = matvec(p, 64, 1024, 2)
    assert scores.tiles == 16 and scores.compute_cycles == 16 * 16 and scores.macs == 64 * 1024
    soft = sfu(p, 1024)
    assert soft.compute_cycles == 1024 // 32
    mix = matvec(p, 1024, 64, 2)
    assert mix.compute_cycles == scores.compute_cycles and mix.hbm_bytes == scores.hbm_bytes == 1024 * 64 * 2
    total_cycles = scores.compute_cycles + soft.compute_cycles + mix.compute_cycles
    assert scores.ps + soft.ps + mix.ps == pytest.approx(total_cycles * CYCLE_PS, abs=3)


def test_the_array_model_takes_matvec_times_from_the_tile_loop_when_asked():
    """hwconfigs/thor.yaml: a Granite-3B expert's gate+up costs what tile_sim gives for thor's arrays,
    HBM's stream bandwidth and its request latency (HBM's first byte + UCIe both ways); its fixed part is issue,
    that latency and the arrays meeting."""
    from pathlib import Path

    from chipsim.tilesim.tile_sim import matvec as tiled
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.hw.config import load_config
    from chipsim.hw.paths import memory_timing

    root = Path(__file__).resolve().parents[1]
    hw = load_config(str(root / "hwconfigs" / "thor.yaml")).hw
    am = ArrayModel(hw)
    latency = memory_timing(hw, "hbm").access_latency_ns + 2 * hw.links["ucie"].latency_ns
    assert am.tiles.memory_latency_ns == pytest.approx(latency) and am.tiles.memory_gbps == am.stream_gbps
    op = am.matvec("gate_up", 1536, 1024, 1536 * 1024 * 2)
    assert op.duration_ps == tiled(am.tiles, 1536, 1024, 2.0).ps
    assert op.fixed_ps == round((32 + 16) * CYCLE_PS + latency * 1e3)
    assert op.macs == 1536 * 1024 and op.hbm_read_bytes == 1536 * 1024 * 2


def test_with_requests_enough_the_tile_loop_lands_on_the_analytic_token_time_and_fewer_slow_it():
    from pathlib import Path

    from chipsim.runner import prepare, simulate

    cfg = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")
    base = ["workload.max_tokens=3"]

    def token_ms(extra):
        prep = prepare(cfg, base + extra, ["no-prefetch"])
        return simulate(prep, prep.policies[0]).per_token.latency_ps.mean() / 1e9

    analytic = token_ms(["compute.timing=analytic"])
    many = token_ms([])
    few = token_ms(["compute.outstanding_requests_per_array=32"])
    assert many == pytest.approx(analytic, rel=0.01)
    assert few > many * 1.2  # 32 x 64 B / ~48 ns = 43 GB/s per array, a quarter of its HBM share


def test_cycle_level_timing_needs_its_microarchitecture_keys():
    from pathlib import Path

    from chipsim.errors import InputError
    from chipsim.hw.config import load_config

    thor = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")
    with pytest.raises(InputError, match=r"compute.sram_read_bytes_per_cycle_per_array: compute.timing: cycle-level"):
        load_config(thor, ["compute.sram_read_bytes_per_cycle_per_array=0"])


def test_chipsim_calibrate_lists_every_operation_both_ways(capsys):
    """Each distinct operation of thor's decode step appears once per group, timed by the part of the
    cycle-level model its kind names."""
    import json
    from pathlib import Path

    from chipsim import cli

    cfg = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")
    assert cli.main(["calibrate", cfg, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_op = {(r["group"], r["op"]): r for r in rows}
    assert len(by_op) == len(rows)
    timed_by = {"matvec": "tile loop", "sfu": "SFU pipeline", "vector": "lanes"}
    for r in rows:
        assert r["timed_by"].startswith(timed_by[r["shape"].split()[0]])
        # matrix-vector: the tile loop within 20 % of the analytic time at 256 requests in flight; the short
        # SFU and lane operations pay the arrays' sync and the SFU drain the analytic model has no part for
        assert 1.0 <= r["ratio"] < (1.2 if r["timed_by"] == "tile loop" else 2.0), r
    lm = by_op[("head", "lm_head")]
    assert lm["hbm_bytes"] == 1536 * 49155 * 2 and lm["macs"] == 1536 * 49155
    analytic = str(Path(cfg).with_name("thor-analytic.yaml"))
    assert cli.main(["calibrate", analytic]) == 2
    assert "chipsim calibrate needs compute.timing: cycle-level" in capsys.readouterr().err


def test_the_cycle_level_table_is_cached_by_content_and_a_run_is_identical_cold_or_warm(tmp_path, monkeypatch, capsys):
    """The first run computes every operation shape and writes the table; the second reads all of them back and
    prints the same bytes; a changed microarchitecture key gets a table of its own."""
    from pathlib import Path

    from chipsim import cli
    from chipsim.tilesim import op_cache
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.hw.config import load_config
    from chipsim.workload.decode import build_workload

    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(op_cache, "_TABLES", {})
    cfg = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")
    argv = ["run", cfg, "--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1"]
    assert cli.main(argv) == 0
    cold = capsys.readouterr().out
    tables = list((tmp_path / "compute").glob("*.json"))
    assert len(tables) == 1
    monkeypatch.setattr(op_cache, "_TABLES", {})  # a new process: only the file is left
    hw = load_config(cfg, ["workload.max_tokens=4"]).hw
    am = ArrayModel(hw)
    assert am.op_cache.results  # read from the file
    wl = build_workload(hw)
    assert wl.compute_timing.startswith("cycle-level") and am.op_cache.digest[:12] in wl.compute_timing
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == cold
    warm = ArrayModel(hw)
    warm.matvec("gate_up", 1536, 1024, 1536 * 1024 * 2)  # a Granite-3B expert's shape
    assert warm.shapes_computed() == 0
    other = load_config(cfg, ["compute.array_sync_cycles=8"]).hw
    build_workload(other)
    assert len(list((tmp_path / "compute").glob("*.json"))) == 2


def _gpu(**kw) -> ChipletParams:
    """Two SMs at 1 GHz: 128 B requests at 1 ns each (128 GB/s per SM), 100 ns to memory, 1 KiB tiles read from
    shared memory at 64 B/cycle (16 cycles), lanes enough that MACs never bind; programs of 4 rows."""
    base = dict(arrays=2, units_per_array=64, vector_length=8, clock_mhz=1000.0, sfus_per_array=1, sfu_ops_per_cycle=1,
                sram_read_bytes_per_cycle=64, tile_bytes=1024, request_bytes=128, outstanding_requests_per_array=1 << 10,
                memory_gbps=256.0, memory_latency_ns=100.0, rows_per_program=4, programs_per_array=1, tile_buffers=1)
    base.update(kw)
    return ChipletParams(**base)


def test_a_single_buffered_program_loads_each_tile_after_computing_the_last_by_hand():
    """8 rows x 256 BF16 on 2 SMs: one program of 4 rows each, 2,048 B = 2 tiles of 8 requests. Tile 0 arrives
    at 100 ... 107 ns and is summed by 123 ns; single-buffered, tile 1 issues then: 223 ... 230, done at 246 ns.
    Double-buffered, tile 1 issues at once: 108 ... 115 ns, computed after tile 0, done at 139 ns."""
    assert matvec(_gpu(), 256, 8, 2).ps == 246_000
    assert matvec(_gpu(tile_buffers=2), 256, 8, 2).ps == 139_000


def test_resident_programs_are_the_bytes_in_flight_and_the_rest_wait_their_turn():
    """16 rows on 2 SMs: 4 programs, 2 per SM, 4 tiles per SM. One resident program at a time: every tile waits
    for the one before, 4 x 123 ns. Two resident (out of step, each its own tile): tiles 0 and 1 issue at 0,
    tile 2 when tile 0 is summed (123 ns: arrives 223 ... 230, done 246), tile 3 when tile 1 is (139 ns: 239 ...
    246, done 262 ns). The stream over more arrays than programs shares the memory among those that run."""
    assert matvec(_gpu(), 256, 16, 2).ps == 4 * 123_000
    assert matvec(_gpu(programs_per_array=2), 256, 16, 2).ps == 262_000
    assert matvec(_gpu(programs_per_array=0), 256, 16, 2).ps == 262_000  # no limit: both programs resident
    # 4 rows = one program on one of the two SMs: it has all 256 GB/s, 0.5 ns per request
    one = matvec(_gpu(), 256, 4, 2)
    assert one.ps == 100_000 + 7 * 500 + 16_000 + 100_000 + 7 * 500 + 16_000
    assert one.hbm_bytes == 2048 and one.macs == 1024


def test_shared_operands_make_fewer_rows_and_so_fewer_programs():
    """GQA: 3 heads share each KV row. 24 outputs of 256 over 8 rows are 2 programs, as 8 plain outputs are;
    without the groups the same bytes would look like 24 rows (6 programs, 3 per SM) of a third the length."""
    grouped = matvec(_gpu(), 256, 24, 2 / 3, groups=3)
    assert grouped.ps == matvec(_gpu(), 256, 8, 2).ps and grouped.macs == 24 * 256 and grouped.hbm_bytes == 4096


def test_the_h200_described_as_arrays_predicts_gemvs_of_known_structure_and_large_library_ones():
    """hwconfigs/h200-cycle-level.yaml (published figures, single-op microbenchmarks and the kernel's own
    structure) against every plain GEMV shape of the validation configs, timed on the machine in CUDA graphs
    with that kernel (validation/compute/h200-op-times-triton.json): each within 30 %, median within 10 %.
    cuBLAS (validation/compute/h200-gemv-probe.json): its large GEMVs within 25 %, its small ones 2-4x slower
    than the same kernel, which the machine does not explain (VALIDATION.md says so)."""
    import json
    import statistics
    from pathlib import Path

    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.ops import key_groups

    root = Path(__file__).resolve().parents[1]
    am = ArrayModel(load_config(str(root / "hwconfigs" / "h200-cycle-level.yaml"), ["compute.op_group_launch_ns=0"]).hw)
    assert am.tiles is not None and not am.op_times_ps  # no profiled kernel left
    timed = json.loads((root / "validation" / "compute" / "h200-op-times-triton.json").read_text())
    assert timed["gemv_kernel"] == "triton"
    errors = []
    for r in timed["op_times"]:
        if not r["key"].startswith("matvec"):
            continue
        if key_groups(r["key"]) > 1:
            continue  # a shared operand (attention): the grouped kernel is another structure (VALIDATION.md)
        errors.append(am.op_for_key(r["key"]).duration_ps / 1e6 / r["graph_us"] - 1)
        assert abs(errors[-1]) < 0.30, r
    assert len(errors) >= 25 and abs(statistics.median(errors)) < 0.10
    probe = json.loads((root / "validation" / "compute" / "h200-gemv-probe.json").read_text())
    for r in probe["gemv_in_graph"]:
        outputs, nbytes = int(r["key"].split()[2][1:]), int(r["key"].split()[3][1:])
        if r["programs"] * 8 < outputs:
            continue
        model = am.op_for_key(r["key"]).duration_ps / 1e6
        if nbytes >= 32 << 20:
            assert abs(model / r["cublas_us"] - 1) < 0.25, r
        elif nbytes <= 4 << 20:
            assert r["cublas_us"] > 1.9 * r["triton_us"]  # the library, not the machine


# ---------------------------------------------------------------------------------------------- matrix-matrix (prefill)
def test_a_gemm_of_many_tokens_turns_compute_bound_by_hand():
    """Granite-3B's gate+up for a 64-token chunk on instant memory: each 8 KiB tile (4,096 weights) is used by all
    64 tokens: 64 x 4,096 MACs = 32 cycles of 8,192 lanes, more than its 16 cycles of SRAM read, so 96 tiles x 32
    cycles; one token is the GEMV above (16 cycles a tile); the MACs are tokens x outputs x reduction."""
    r = matvec(params(), 1536, 1024, 2, tokens=64)
    assert r.tiles == 96 and r.compute_cycles == 96 * 32
    assert r.macs == 64 * 1536 * 1024 and r.hbm_bytes == 1536 * 1024 * 2  # weights stream once
    assert r.ps == pytest.approx(96 * 32 * CYCLE_PS, abs=1)
    assert matvec(params(), 1536, 1024, 2, tokens=1) == matvec(params(), 1536, 1024, 2)


def test_a_gemm_on_a_slow_memory_takes_the_weights_time_until_the_tokens_outweigh_it():
    """At 100 GB/s the 3 MiB of weights take 31.5 µs to arrive whatever the tokens; 8 tokens' MACs hide under
    that (8 x 3 MiB/2 weights / 32,768 lanes = 384 cycles = 0.5 µs), 4,096 tokens' do not (256x as many cycles)."""
    p = params(memory_gbps=100.0)
    weights_ps = 1536 * 1024 * 2 / 100.0 * 1e3
    few, many = matvec(p, 1536, 1024, 2, tokens=8), matvec(p, 1536, 1024, 2, tokens=4096)
    assert weights_ps <= few.ps <= weights_ps * 1.01
    compute_ps = 4096 * 1536 * 1024 / (4 * 8192) * CYCLE_PS
    assert compute_ps <= many.ps <= compute_ps * 1.01
