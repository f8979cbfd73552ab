"""The command-level DRAM model: its constraint engine and closed-form limits checked by hand, and every
validation point against Ramulator 2.1's committed results (validation/dram/ramulator.json)."""

from pathlib import Path

import pytest

from chipsim.dramsim import validate
from chipsim.dramsim.controller import ControllerConfig, _Channel, simulate
from chipsim.dramsim.standard import ACT, PRE, RD, WR, evaluate, load_standard
from chipsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
HBM3 = load_standard("hbm3")
P = HBM3.params
BURST = HBM3.org.burst_bytes  # 32 B
TCK_NS = HBM3.tck_ps * 1e-3


def hbm_request(pc, sid, bg, bank, row, col=0, write=False):
    return (write, 0, (pc, sid, bg, bank), row, col)


def test_a_write_after_reads_waits_for_the_turnaround_and_a_read_after_it_for_twtr():
    """The constraint engine by hand: RD at 0 -> WR no earlier than nRTW; WR at t -> RD to the same bank group
    at t + nCWL + nBL + nWTRL, to another bank group at t + nCWL + nBL + nWTRS; ACT -> RD after nRCDRD."""
    ch = _Channel(HBM3, ControllerConfig())
    same_bg, other_bg = [0, 0, 0, 0, 0], [0, 0, 0, 1, 4]  # flat node ids: channel, pc 0, sid 0, bank group 0 / 1
    ch.issue(ACT, same_bg, 0)
    assert ch.earliest(RD, same_bg) == P["nRCDRD"]
    ch.issue(RD, same_bg, 100)
    assert ch.earliest(WR, same_bg) == 100 + P["nRTW"]
    assert ch.earliest(RD, same_bg) == 100 + P["nCCDL"] and ch.earliest(RD, other_bg) == 100 + P["nCCDS"]
    t = 100 + P["nRTW"]
    ch.issue(WR, same_bg, t)
    assert ch.earliest(RD, same_bg) == t + P["nCWL"] + P["nBL"] + P["nWTRL"]
    assert ch.earliest(RD, other_bg) == t + P["nCWL"] + P["nBL"] + P["nWTRS"]
    assert ch.earliest(PRE, same_bg) == max(P["nRAS"], t + P["nCWL"] + P["nBL"] + P["nWR"])


def test_a_fifth_activate_waits_for_the_four_activate_window():
    ch = _Channel(HBM3, ControllerConfig())
    banks = [[0, 0, 0, bg, bg * 4] for bg in range(4)] + [[0, 0, 0, 0, 1]]  # four bank groups, then group 0 again
    times = []
    for nodes in banks:
        t = ch.earliest(ACT, nodes)
        ch.issue(ACT, nodes, t)
        times.append(t)
    assert times[:4] == [0, P["nRRDS"], 2 * P["nRRDS"], 3 * P["nRRDS"]]  # tRRD_S apart (different bank groups)
    assert times[4] == P["nFAW"]  # the fifth: tFAW after the first


def test_a_long_row_hit_stream_reaches_the_data_bus_peak_and_refresh_takes_its_share():
    """Reads cycling over the 8 (pseudo-channel, bank group) pairs of one channel, always the same row of the
    same bank: after the first activates every request is a row hit, so the data bus (one 32 B burst per nBL
    per pseudo-channel) is the limit: 51.2 GB/s. All-bank refresh then costs nRFC plus reopening the rows
    (nRP + nRCD) every nREFI."""
    reqs = [hbm_request(i % 2, 0, (i // 2) % 4, 0, 0, (i // 8) % 32) for i in range(40000)]
    peak = HBM3.peak_gbps(1)
    assert peak == pytest.approx(2 * BURST / (P["nBL"] * TCK_NS))
    alone = simulate(HBM3, reqs, offers_per_cycle=4, controller=ControllerConfig(refresh="off"), warmup=1000)
    assert alone.bandwidth_gbps == pytest.approx(peak, rel=2e-3)
    assert alone.row_misses == 0 and alone.row_conflicts == 0
    refreshed = simulate(HBM3, reqs, offers_per_cycle=4, controller=ControllerConfig(refresh="all-bank"), warmup=1000)
    upper = peak * (1 - P["nRFC"] / P["nREFI"])
    lower = peak * (1 - (P["nRFC"] + P["nRP"] + P["nRCDRD"] + P["nCL"]) / P["nREFI"])
    assert lower <= refreshed.bandwidth_gbps <= upper


def test_a_row_miss_stream_on_one_bank_moves_one_burst_per_trc():
    """Every read a new row of the same bank: PRE, ACT, RD per request, bounded by ACT -> ACT nRC (72 cycles,
    more than nRAS + nRP = 71 and nRCD + nRTP + nRP = 66): 32 B per 45 ns."""
    reqs = [hbm_request(0, 0, 0, 0, row) for row in range(3000)]
    r = simulate(HBM3, reqs, controller=ControllerConfig(refresh="off"), warmup=100)
    assert r.bandwidth_gbps == pytest.approx(BURST / (P["nRC"] * TCK_NS), rel=5e-3)
    assert r.row_hits == 0


def test_row_misses_spread_over_the_banks_are_held_to_four_activates_per_tfaw():
    """New rows on the 16 banks of one pseudo-channel and stack in turn: each bank waits nRC, but 16 banks keep
    more than four activates per nFAW ready, so one request per nFAW / 4 cycles gets through."""
    reqs = [hbm_request(0, 0, i % 4, (i // 4) % 4, i // 16) for i in range(8000)]
    r = simulate(HBM3, reqs, controller=ControllerConfig(refresh="off"), warmup=200)
    assert r.bandwidth_gbps == pytest.approx(BURST / (P["nFAW"] / 4 * TCK_NS), rel=0.01)


def test_closed_pages_turn_a_row_hit_stream_into_misses_and_open_pages_keep_it():
    reqs = [hbm_request(0, 0, 0, 0, 0, col) for col in range(32)] * 10
    open_ = simulate(HBM3, reqs, controller=ControllerConfig(refresh="off"))
    closed = simulate(HBM3, [hbm_request(0, 0, 0, 0, 0, c) for c in range(1)] * 300,
                      interval=200, controller=ControllerConfig(refresh="off", page_policy="closed"))
    assert open_.row_misses + open_.row_conflicts == 1  # one activate, then hits
    assert closed.row_misses >= 290  # precharged after every lone request: each later one activates again


def test_ddr4_row_hits_in_one_bank_group_wait_tccd_l_and_spread_over_groups_fill_the_bus():
    """DDR4-3200AA (Ramulator 2.1 preset): a 64 B burst holds the 64-bit bus nBL = 4 CK (25.6 GB/s), but reads to
    one bank group are tCCD_L = 8 CK apart (half of it, 12.8 GB/s); the same row hits spread over the four bank
    groups are tCCD_S = 4 CK apart and fill the bus. By hand on the constraint engine too."""
    ddr4 = load_standard("ddr4")
    q, tck_ns, burst = ddr4.params, ddr4.tck_ps * 1e-3, ddr4.org.burst_bytes
    assert (q["nBL"], q["nCCDS"], q["nCCDL"], burst) == (4, 4, 8, 64)
    ch = _Channel(ddr4, ControllerConfig())
    bg0, bg0_other_bank, bg1 = [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 4]  # flat ids: channel, rank, bank group, bank
    ch.issue(RD, bg0, 100)
    assert ch.earliest(RD, bg0_other_bank) == 100 + q["nCCDL"] and ch.earliest(RD, bg1) == 100 + q["nCCDS"]
    one_group = [(False, 0, (0, 0, i % 4), 0, (i // 4) % 128) for i in range(20000)]  # 4 banks of bank group 0
    spread = [(False, 0, (0, i % 4, 0), 0, (i // 4) % 128) for i in range(20000)]  # bank 0 of each group
    for reqs, cycles in ((one_group, q["nCCDL"]), (spread, q["nBL"])):
        r = simulate(ddr4, reqs, offers_per_cycle=2, controller=ControllerConfig(refresh="off"), warmup=500)
        assert r.row_misses + r.row_conflicts == 0
        assert r.bandwidth_gbps == pytest.approx(burst / (cycles * tck_ns), rel=2e-3)
    assert ddr4.peak_gbps() == pytest.approx(25.6)


def test_ddr5_two_cycle_commands_and_random_rows_held_to_four_activates_per_tfaw():
    """DDR5-4800AN (Ramulator 2.1 preset): ACT, RD and WR take two CK of the command bus and count from the CK that
    completes them, so ACT -> PRE is nRAS + 1 and PRE -> ACT nRP - 1, while ACT -> RD stays nRCD; a row miss on
    each of the 32 banks in turn (8 bank groups x 4) is held by tFAW = 48 CK to four 64 B bursts per 48 CK."""
    ddr5 = load_standard("ddr5")
    q, tck_ns, burst = ddr5.params, ddr5.tck_ps * 1e-3, ddr5.org.burst_bytes
    assert ddr5.command_cycles[ACT] == ddr5.command_cycles[RD] == 2 and ddr5.command_cycles[PRE] == 1
    ch = _Channel(ddr5, ControllerConfig())
    bank = [0, 0, 0, 0]
    ch.issue(ACT, bank, 0)
    assert ch.row_bus_free == 2  # the command bus is held for ACT's two CK
    assert ch.earliest(RD, bank) == q["nRCD"] and ch.earliest(PRE, bank) == q["nRAS"] + 1
    ch.issue(PRE, bank, 200)
    assert ch.earliest(ACT, bank) == 200 + q["nRP"] - 1
    reqs = [(False, 0, (0, i % 8, (i // 8) % 4), i // 32, 0) for i in range(6000)]
    r = simulate(ddr5, reqs, offers_per_cycle=2, controller=ControllerConfig(refresh="off"), warmup=200)
    assert r.row_hits == 0
    assert r.bandwidth_gbps == pytest.approx(4 * burst / (q["nFAW"] * tck_ns), rel=5e-3)  # 12.8 GB/s


def test_same_stream_and_seed_give_identical_results():
    from chipsim.dramsim.streams import requests

    a = simulate(HBM3, requests(HBM3, 5000, kind="random", read_share=0.5, seed=3))
    b = simulate(HBM3, requests(HBM3, 5000, kind="random", read_share=0.5, seed=3))
    assert a == b


@pytest.mark.parametrize("point", validate.POINTS, ids=[p["name"] for p in validate.POINTS])
def test_every_validation_point_is_within_target_of_ramulator(point):
    """Bandwidth within 3 % and average read latency within 10 % of Ramulator 2.1 on the same requests."""
    ref = validate.load_reference(str(ROOT / "validation" / "dram" / "ramulator.json"))[point["name"]]
    r = validate.run_point(point)
    assert r.bandwidth_gbps == pytest.approx(ref["bandwidth_gbps"], rel=validate.BANDWIDTH_TOLERANCE)
    assert r.read_latency_avg_ns == pytest.approx(ref["read_latency_avg_ns"], rel=validate.LATENCY_TOLERANCE)


@pytest.mark.parametrize("expr, message", [
    ("nCL + ", "ends with an operator"),
    ("nCL nBL", "two terms without an operator"),
    ("nXYZ + 1", "'nXYZ' is not a timing parameter"),
    ("nCL * 2", "cannot read"),
])
def test_a_bad_latency_expression_is_one_line(expr, message):
    with pytest.raises(InputError) as exc:
        evaluate(expr, {"nCL": 20, "nBL": 2}, "hbm3.yaml.constraints[0].latency")
    assert message in str(exc.value)


def test_bad_standard_files_name_the_problem(tmp_path):
    text = (ROOT / "chipsim" / "dramsim" / "standards" / "hbm3.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("to: [RD], latency: nBL}", "to: [READ], latency: nBL}", 1))
    with pytest.raises(InputError, match=r"unknown command 'READ'"):
        load_standard(str(bad))
    bad.write_text(text + "\nspeed_grade: 3\n")
    with pytest.raises(InputError, match=r"bad.yaml.speed_grade: unknown key"):
        load_standard(str(bad))
    with pytest.raises(InputError, match=r"DRAM standard ddr9: not found \(built in: [a-z0-9, ]*hbm3, lpddr5\)"):
        load_standard("ddr9")
    with pytest.raises(InputError, match=r"no preset 'HBM3_9000'"):
        load_standard("hbm3", timing="HBM3_9000")


def test_any_mutation_of_a_standard_file_loads_or_fails_in_one_line(tmp_path):
    """300 seeded mutations of hbm3.yaml (a key deleted or a value replaced by None, -1, 'x', [], {}, 0, 1.5, true
    or a broken expression): each loads or raises one InputError, never another exception."""
    import copy
    import random

    import yaml

    base = yaml.safe_load((ROOT / "chipsim" / "dramsim" / "standards" / "hbm3.yaml").read_text())
    rng = random.Random(1)
    path = tmp_path / "m.yaml"

    def places(node, at):
        if isinstance(node, dict):
            for k, v in node.items():
                yield at + [k]
                yield from places(v, at + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield at + [i]
                yield from places(v, at + [i])

    spots = list(places(base, []))
    for _ in range(300):
        data = copy.deepcopy(base)
        where = rng.choice(spots)
        node = data
        for k in where[:-1]:
            node = node[k]
        if isinstance(node, dict) and rng.random() < 0.3:
            del node[where[-1]]
        else:
            node[where[-1]] = rng.choice([None, -1, "x", [], {}, 0, 1.5, True, "nCL +"])
        path.write_text(yaml.safe_dump(data))
        try:
            load_standard(str(path))
        except InputError as exc:
            assert "\n" not in str(exc)


def test_chipsim_dram_prints_a_streams_bandwidth_and_latency(capsys):
    import json

    from chipsim import cli

    assert cli.main(["dram", "lpddr5", "--stream", "random", "--requests", "3000", "--refresh", "off", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["standard"] == "LPDDR5" and row["peak_gbps"] == pytest.approx(12.8)
    assert 0 < row["bandwidth_gbps"] < row["peak_gbps"] and row["row_hits"] < 10  # random rows: nearly all misses
    assert cli.main(["dram", "hbm3", "--read-share", "1.5"]) == 2
    assert "--read-share must be within 0 ... 1" in capsys.readouterr().err
    assert cli.main(["dram", "ddr4", "--refresh", "per-bank"]) == 2  # DDR4 has none: no silent run without refresh
    assert "DDR4 DDR4_3200AA has no per-bank refresh" in capsys.readouterr().err


def test_the_dram_model_runs_compiled_where_it_was_installed():
    """`pip install -e .` compiles the controller and the streams with mypyc (setup.py), as it does the engine: a
    clean install here, as in CI, must run them compiled, not fall back to Python without anyone noticing."""
    import importlib.machinery
    import os

    import chipsim.dramsim
    from chipsim.dramsim import controller, streams

    if os.environ.get("CHIPSIM_PURE_PYTHON"):
        pytest.skip("CHIPSIM_PURE_PYTHON is set")
    assert chipsim.dramsim.BUILD == "compiled (mypyc)", chipsim.dramsim.BUILD
    for module in (controller, streams):
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module.__file__


def test_compiled_and_pure_python_dram_models_measure_the_same():
    """The same streams through the compiled controller and through its .py file (CHIPSIM_PURE_PYTHON=1): every
    figure identical, over the paths the controller takes (row conflicts, writes and their drain, two streams at
    random paces, per-bank refresh, closed and capped pages, a second channel)."""
    import json
    import os
    import subprocess
    import sys

    code = """
import json, sys
import chipsim.dramsim
from chipsim.dramsim.controller import ControllerConfig, simulate
from chipsim.dramsim.standard import load_standard
from chipsim.dramsim.streams import requests
sys.stderr.write(chipsim.dramsim.BUILD)
out = []
for name, kind, share, streams, paces, cfg, channels in [
        ("hbm3", "sequential", 0.7, 2, (3, 1), ControllerConfig(), 1),
        ("hbm3", "random", 0.8, 1, (), ControllerConfig(page_policy="closed"), 2),
        ("lpddr5", "sequential", 1.0, 3, (), ControllerConfig(refresh="per-bank"), 1),
        ("hbm3", "random", 0.5, 1, (), ControllerConfig(page_policy="capped", page_cap=2), 1),
        ("hbm2", "sequential", 0.8, 1, (), ControllerConfig(refresh="per-bank", page_policy="capped"), 1)]:
    std = load_standard(name)
    reqs = requests(std, 3000, kind=kind, read_share=share, channels=channels, streams=streams, paces=paces)
    out.append([reqs[:50], simulate(std, reqs, channels=channels, controller=cfg).as_dict()])
print(json.dumps(out))
"""
    outputs = {}
    for pure in ("", "1"):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(os.environ, CHIPSIM_PURE_PYTHON=pure))
        outputs[pure] = json.loads(run.stdout)
        assert run.stderr.startswith("pure Python" if pure else "compiled"), run.stderr
    assert outputs[""] == outputs["1"]
    assert all(result["reads"] + result["writes"] > 1000 for _, result in outputs[""])


# ---------------------------------------------------------------------------------------------- GDDR6, GDDR6X, GDDR7
GDDR6 = load_standard("gddr6")
GDDR7 = load_standard("gddr7")


@pytest.mark.parametrize("std, rate, per_pin, per_device", [
    ("gddr6:GDDR6_14000_1350mV", 14000, 1.75, 56.0),
    ("gddr6:GDDR6X_19000", 19000, 2.375, 76.0),
    ("gddr6:GDDR6X_21000", 21000, 2.625, 84.0),  # Micron: 84 GB/s per GDDR6X device at 21 Gb/s
    ("gddr7:GDDR7_28000_PAM3", 28000, 3.5, 112.0),
])
def test_gddr_peaks_follow_from_the_data_rate(std, rate, per_pin, per_device):
    """The data-bus peak is the rate per pin times the pins: a GDDR6 / GDDR6X device is two x16 channels, a GDDR7
    device four x8 ones, 32 DQ either way; per pin rate / 8 bytes. The presets' tCK is the rate's to 0.3 % (GDDR6
    14 Gb/s: the preset's 0.570 ns for 8 bits / 14 Gb/s = 0.5714 ns), so is the model's peak."""
    name, timing = std.split(":")
    s = load_standard(name, timing=timing)
    pins = s.org.counts[0] * s.org.channel_width_bits
    assert pins == 32 and s.params["rate_mtps"] == rate
    assert rate / 8 / 1000 == pytest.approx(per_pin)
    assert s.peak_gbps() == pytest.approx(per_device, rel=3e-3)
    assert s.peak_gbps() / pins == pytest.approx(per_pin, rel=3e-3)
    # one burst of 32 B per nBL cycles on each channel: burst_length bits per pin over nBL CK at the rate
    assert s.org.burst_length / s.params["nBL"] * 1e6 / rate == pytest.approx(s.tck_ps, rel=3e-3)


@pytest.mark.parametrize("timing", ["GDDR6_14000_1350mV", "GDDR6_14000_1250mV", "GDDR6X_19000", "GDDR6X_21000"])
def test_a_gddr6_row_miss_stream_on_one_bank_is_held_to_tras_plus_trp(timing):
    """Every read a new row of one bank: ACT, RD, PRE per request. The bank's cycle is the longest of nRC and
    ACT -> PRE -> ACT (nRAS + nRP), which the presets' rounded cycle counts make at least nRC (1350 mV:
    53 + 27 = 80 > 79): one 32 B burst per 80 CK = 45.6 ns, 0.70 GB/s."""
    s = load_standard("gddr6", timing=timing)
    p = s.params
    period = max(p["nRC"], p["nRAS"] + p["nRP"], p["nRCDRD"] + p["nRTP"] + p["nRP"])
    assert period == p["nRAS"] + p["nRP"]
    r = simulate(s, [(False, 0, (0, 0), row, 0) for row in range(1200)], controller=ControllerConfig(refresh="off"),
                 warmup=100)
    assert r.bandwidth_gbps == pytest.approx(s.org.burst_bytes / (period * s.tck_ps * 1e-3), rel=5e-3)
    assert r.row_hits == 0


def test_gddr6_reads_in_one_bank_group_wait_tccd_l_and_across_groups_tccd_s():
    """Row hits to the four banks of one bank group: one read per nCCDL = 4 CK, half the channel's peak
    (14.0 GB/s); the same reads spread over the four bank groups: one per nCCDS = nBL = 2 CK, the peak 28.1 GB/s."""
    p = GDDR6.params
    one_group = [(False, 0, (0, i % 4), 0, (i // 4) % 64) for i in range(8000)]
    groups = [(False, 0, (i % 4, (i // 4) % 4), 0, (i // 16) % 64) for i in range(8000)]
    off = ControllerConfig(refresh="off")
    a = simulate(GDDR6, one_group, offers_per_cycle=2, controller=off, warmup=200)
    b = simulate(GDDR6, groups, offers_per_cycle=2, controller=off, warmup=200)
    burst_ns = GDDR6.org.burst_bytes / (GDDR6.tck_ps * 1e-3)
    assert a.bandwidth_gbps == pytest.approx(burst_ns / p["nCCDL"], rel=2e-3)
    assert b.bandwidth_gbps == pytest.approx(burst_ns / p["nCCDS"], rel=2e-3) == pytest.approx(GDDR6.peak_gbps(1),
                                                                                               rel=2e-3)


def test_a_gddr6_fifth_activate_waits_for_trrd_and_the_four_activate_window():
    """Activates to the four bank groups go nRRDS = 8 CK apart (0, 8, 16, 24); the fifth waits for both nRRDS after
    the fourth (32) and nFAW after the first (29): at this preset four nRRDS outlast tFAW, so tFAW never binds. With
    nRRDS at 2 CK the window does: the fifth goes at nFAW = 29."""
    for overrides, fifth in (({}, 32), ({"nRRDS": 2, "nRRDL": 2}, 29)):
        s = load_standard("gddr6", timing_overrides=overrides)
        ch = _Channel(s, ControllerConfig())
        times = []
        for nodes in [[0, bg, bg * 4] for bg in range(4)] + [[0, 0, 1]]:  # four bank groups, then group 0 again
            t = ch.earliest(ACT, nodes)
            ch.issue(ACT, nodes, t)
            times.append(t)
        rrd = s.params["nRRDS"]
        assert times == [0, rrd, 2 * rrd, 3 * rrd, fifth]
        assert fifth == max(4 * rrd, s.params["nFAW"])


def test_a_gddr7_row_miss_stream_on_one_bank_moves_one_burst_per_trc():
    """Every read a new row of one bank: ACT (two CK), RD, PRE. JEDEC counts tRAS from the ACT's second cycle, tRP
    up to the next ACT's second: PRE at ACT + nRAS + 1, the next ACT at PRE + nRP - 1, so one burst per nRAS + nRP =
    nRC = 90 CK = 51.4 ns: 0.62 GB/s."""
    p = GDDR7.params
    assert p["nRAS"] + p["nRP"] == p["nRC"] == 90
    r = simulate(GDDR7, [(False, 0, (0,), row, 0) for row in range(1200)], controller=ControllerConfig(refresh="off"),
                 warmup=100)
    assert r.bandwidth_gbps == pytest.approx(GDDR7.org.burst_bytes / (p["nRC"] * GDDR7.tck_ps * 1e-3), rel=5e-3)
    assert r.row_hits == 0


def test_gddr7_two_cycle_commands_shift_their_timings_by_one_cycle():
    """The constraint engine with GDDR7's two-CK ACT, RD and WR: ACT at 0 -> RD at nRCDRD (both two CK: no shift),
    PRE at nRAS + 1, the next ACT to that bank nRP - 1 after the PRE, another bank's ACT nRPD - 1 after it; a second
    read waits nCCDSB in the same bank, nCCD (= nBL) in another."""
    p = GDDR7.params
    ch = _Channel(GDDR7, ControllerConfig())
    bank0, bank1 = [0, 0], [0, 1]
    ch.issue(ACT, bank0, 0)
    assert ch.earliest(RD, bank0) == p["nRCDRD"] == 30
    assert ch.earliest(PRE, bank0) == p["nRAS"] + 1 == 61
    ch.issue(RD, bank0, 30)
    assert ch.earliest(RD, bank0) == 30 + p["nCCDSB"] and ch.earliest(RD, bank1) == 30 + p["nCCD"]
    ch.issue(PRE, bank0, 61)
    assert ch.earliest(ACT, bank0) == 61 + p["nRP"] - 1 == p["nRC"]
    assert ch.earliest(ACT, bank1) == max(0 + p["nRRD"], 61 + p["nRPD"] - 1)


def test_gddr7_reads_to_one_bank_run_at_half_the_peak():
    """Row hits to one bank: one read per nCCDSB = 4 CK, half the channel's 28 GB/s; the same reads over all 16
    banks: one per nCCD = nBL = 2 CK, the peak. (The sequential validation streams walk one bank's columns
    before the next bank's, so they sit near the first figure.)"""
    off = ControllerConfig(refresh="off")
    one = simulate(GDDR7, [(False, 0, (0,), 0, i % 64) for i in range(6000)], offers_per_cycle=2, controller=off,
                   warmup=200)
    spread = simulate(GDDR7, [(False, 0, (i % 16,), 0, (i // 16) % 64) for i in range(6000)], offers_per_cycle=2,
                      controller=off, warmup=200)
    assert one.bandwidth_gbps == pytest.approx(GDDR7.peak_gbps(1) / 2, rel=2e-3)
    assert spread.bandwidth_gbps == pytest.approx(GDDR7.peak_gbps(1), rel=2e-3)


# ---------------------------------------------------------------------------------------------- HBM2 and HBM2E
HBM2 = load_standard("hbm2")


def hbm2_request(pc, bg, bank, row, col=0, write=False):
    return (write, 0, (pc, bg, bank), row, col)


@pytest.mark.parametrize("org, timing, gbit_per_pin, stack_gbps", [
    ("HBM2_8Gb", "HBM2_2000Mbps", 2.0, 256.0),
    ("HBM2_8Gb", "HBM2_2400Mbps", 2.4, 307.2),      # Samsung Aquabolt: 307 GB/s
    ("HBM2E_16Gb_8hi", "HBM2E_3200Mbps", 3.2, 409.6),  # Samsung Flashbolt: 410 GB/s
    ("HBM2E_16Gb_8hi", "HBM2E_3600Mbps", 3.6, 460.8),  # SK hynix HBM2E: 460 GB/s
])
def test_hbm2_peak_per_stack_is_the_pin_rate_times_1024_bits(org, timing, gbit_per_pin, stack_gbps):
    """A stack is 8 channels x 2 pseudo-channels x 64 DQ = 1024 pins; each pseudo-channel moves one BL4 burst of
    32 B per nBL = 2 CK, so the model's peak is the rate x 1024 / 8 (to the preset's whole-ps tCK: 0.833 and
    0.556 ns, 0.04 % and 0.08 % off). A row-hit stream over one channel's 2 x 4 (pseudo-channel, bank group) pairs
    then reaches an eighth of it."""
    s = load_standard("hbm2", org, timing)
    pins = s.org.counts[0] * s.org.counts[1] * s.org.channel_width_bits
    assert pins == 1024 and s.org.burst_bytes == 32 and s.params["nBL"] == 2
    assert stack_gbps == pytest.approx(gbit_per_pin * pins / 8)
    assert s.peak_gbps() == pytest.approx(stack_gbps, rel=1e-3)
    reqs = [hbm2_request(i % 2, (i // 2) % 4, 0, 0, (i // 8) % 32) for i in range(20000)]
    r = simulate(s, reqs, offers_per_cycle=2, controller=ControllerConfig(refresh="off"), warmup=500)
    assert r.bandwidth_gbps == pytest.approx(s.peak_gbps(1), rel=2e-3) and r.row_misses + r.row_conflicts == 0


@pytest.mark.parametrize("org, timing, ns_per_burst", [
    ("HBM2_8Gb", "HBM2_2000Mbps", 48.0),        # nRC 48 CK of 1 ns
    ("HBM2E_16Gb_8hi", "HBM2E_3200Mbps", 48.125),  # nRC 77 CK of 0.625 ns
])
def test_an_hbm2_row_miss_stream_on_one_bank_moves_one_burst_per_trc(org, timing, ns_per_burst):
    """Every read a new row of one bank: ACT, RD, PRE per request. ACT takes two CK and its timings count from its
    second: ACT -> PRE is nRAS + 1, PRE -> ACT nRP - 1, so the chain ACT -> PRE -> ACT is nRAS + nRP = nRC (HBM2
    2000: 34 + 14 = 48; ACT -> RD -> PRE, 15 + 5, is shorter): one 32 B burst per nRC, 0.667 GB/s at 2 Gb/s."""
    s = load_standard("hbm2", org, timing)
    p = s.params
    assert p["nRAS"] + p["nRP"] == p["nRC"] > p["nRCDRD"] + 1 + p["nRTPL"] + p["nRP"] - 1
    assert p["nRC"] * s.tck_ps * 1e-3 == pytest.approx(ns_per_burst)
    r = simulate(s, [hbm2_request(0, 0, 0, row) for row in range(2000)], controller=ControllerConfig(refresh="off"),
                 warmup=100)
    assert r.bandwidth_gbps == pytest.approx(32 / ns_per_burst, rel=5e-3) and r.row_hits == 0


def test_hbm2_activates_hold_the_row_bus_two_cycles_and_pseudo_channels_keep_their_own_timing():
    """The constraint engine by hand (HBM2 2000): an ACT holds the row command bus two cycles, so the other
    pseudo-channel's ACT waits 2 CK (not nRRDS: that is within a pseudo-channel) while the column bus stays free;
    RD waits nRCDRD + 1 after ACT; a read to the other pseudo-channel's banks is not held by this one's data bus."""
    p = HBM2.params
    ch = _Channel(HBM2, ControllerConfig())
    pc0, pc1 = [0, 0, 0, 0], [0, 1, 4, 16]  # flat node ids: channel, pseudo-channel, bank group, bank
    ch.issue(ACT, pc0, 0)
    assert ch.row_bus_free == 2 and ch.col_bus_free == 0
    assert ch.earliest(ACT, pc1) == 0 and ch.earliest(ACT, [0, 0, 1, 4]) == p["nRRDS"]
    assert ch.earliest(RD, pc0) == p["nRCDRD"] + 1 and ch.earliest(PRE, pc0) == p["nRAS"] + 1
    ch.issue(ACT, pc1, 2)
    ch.issue(RD, pc0, 15)
    assert ch.earliest(RD, pc1) == 2 + p["nRCDRD"] + 1  # only its own activate
    assert ch.earliest(RD, [0, 0, 1, 4]) == 15 + p["nCCDS"] and ch.earliest(RD, [0, 0, 0, 1]) == 15 + p["nCCDL"]
