"""A memory controller as data: its address mapping and bank hash (chipsim/dramsim/mapping.py), its queues and
write-drain watermarks as config keys, and LPDDR5's two-part activate; each checked by hand."""

import json
import math
from pathlib import Path

import pytest

from chipsim import cli
from chipsim.dramsim import validate
from chipsim.dramsim.controller import ControllerConfig, _Channel, _Request, simulate
from chipsim.dramsim.mapping import fold
from chipsim.dramsim.standard import load_standard
from chipsim.dramsim.streams import requests, stream_mapping
from chipsim.errors import InputError
from chipsim.hw.config import load_config

ROOT = Path(__file__).resolve().parents[1]
THOR = str(ROOT / "hwconfigs" / "thor.yaml")
HBM3 = load_standard("hbm3")  # levels channel, pseudochannel (2), sid (2), bankgroup (4), bank (4); 32 columns


def test_ramulators_robaracoch_reads_channel_column_levels_row_from_the_least_significant_digit():
    """RoBaRaCoCh over one HBM3 channel: 32 columns, then pseudo-channel, SID, bank group, bank, row. Burst
    address 32 * (1 + 2 * (1 + 2 * (3 + 4 * (2 + 4 * 5)))) + 7 is column 7, pseudo-channel 1, SID 1, bank group 3,
    bank 2, row 5."""
    m = stream_mapping(HBM3, 1, "RoBaRaCoCh")
    address = 32 * (1 + 2 * (1 + 2 * (3 + 4 * (2 + 4 * 5)))) + 7
    assert m.decode(address) == {"channel": 0, "column": 7, "pseudochannel": 1, "sid": 1, "bankgroup": 3, "bank": 2,
                                 "row": 5}


def test_a_split_column_puts_its_low_and_high_digits_back_together():
    """MOP4CL: four columns, then the levels (2 x 2 x 4 x 4 = 64), then the other 8 column groups. Address
    3 + 4 * (1 + 64 * 5) is column 3 + 4 * 5 = 23 of pseudo-channel 1, everything else 0."""
    m = stream_mapping(HBM3, 1, "MOP4CL")
    value = m.decode(3 + 4 * (1 + 64 * 5))
    assert (value["column"], value["pseudochannel"], value["sid"], value["bankgroup"], value["bank"], value["row"]) \
        == (23, 1, 0, 0, 0, 0)


def test_the_bank_hash_xors_the_row_folded_to_the_fields_width():
    """Row 6 = 0b0110 folds to 2 bits as 0b10 ^ 0b01 = 3; row 4096 = 2^12 folds to (4096 >> 12) & 3 = 1. With
    `xor: bank`, the bank index of those rows' addresses moves by exactly that."""
    assert fold(6, 4) == 3 and fold(4096, 4) == 1 and fold(12345, 1) == 0
    plain = stream_mapping(HBM3, 1, "RoBaRaCoCh")
    hashed = stream_mapping(HBM3, 1, "RoBaRaCoCh", "bank")
    per_row = 32 * 2 * 2 * 4 * 4
    for row in (6, 4096):
        for address in (row * per_row, row * per_row + 32 * 2 * 2 * 4 * 2):  # bank 0 and bank 2 of the row
            a, b = plain.decode(address), hashed.decode(address)
            assert b["bank"] == a["bank"] ^ fold(row, 4)
            assert {k: v for k, v in a.items() if k != "bank"} == {k: v for k, v in b.items() if k != "bank"}


def test_two_streams_in_their_own_rows_conflict_in_every_bank_unless_the_bank_bits_are_hashed():
    """Two sequential read streams, 4,096 rows apart, in turn: with the plain mapping each request lands in the
    bank the other stream just opened another row in (a row conflict nearly every time: bandwidth halves or worse);
    XOR-ing the bank group and bank with the row puts them in different banks (4096 folds to 1), and the pair runs
    nearly as fast as one stream."""
    ctrl = ControllerConfig(refresh="off")
    one = simulate(HBM3, requests(HBM3, 20000, seed=3), offers_per_cycle=4, controller=ctrl, warmup=2000)
    plain = simulate(HBM3, requests(HBM3, 20000, streams=2, seed=3), offers_per_cycle=4, controller=ctrl, warmup=2000)
    hashed = simulate(HBM3, requests(HBM3, 20000, streams=2, seed=3,
                                     mapping=stream_mapping(HBM3, 1, "interleaved", "bankgroup,bank")),
                      offers_per_cycle=4, controller=ctrl, warmup=2000)
    assert plain.row_conflicts > 0.5 * (plain.reads - plain.row_hits)
    assert plain.bandwidth_gbps < 0.6 * one.bandwidth_gbps
    assert hashed.bandwidth_gbps > 0.95 * one.bandwidth_gbps
    assert hashed.row_conflicts < 0.2 * plain.row_conflicts


def test_lpddr5s_second_activate_takes_a_command_slot_before_the_column_command_and_the_next_activate():
    """With tRCD and tRRD cut to one cycle, two reads to two bank groups of an idle LPDDR5 channel: ACT-1 of bank
    A at 0, its ACT-2 at 1 (nothing else may go: A's read waits for its row, B's ACT-1 for A's ACT-2), A's RD at 2,
    B's ACT-1 at 3, ACT-2 at 4, RD at 5. Read latency = RD + nCL + nBL: 2 + 19 and 5 + 19 cycles. Without the
    second activate: ACT A 0, RD A 1, ACT B 2, RD B 3."""
    fast = {"nRCD": 1, "nRRDS": 1, "nRRDL": 1}
    std = load_standard("lpddr5", timing_overrides=fast)
    late = std.params["nCL"] + std.params["nBL"]
    assert _read_latencies(std) == [2 + late, 5 + late]
    assert _read_latencies(load_standard(_without_second_activate(std.path), timing_overrides=fast)) == \
        [1 + late, 3 + late]


def _read_latencies(std) -> list[int]:
    """Two reads (bank group 0 and 1, bank 0, row 0) queued at cycle 0 on an idle channel: their latencies."""
    ch = _Channel(std, ControllerConfig(refresh="off"))
    for group in (0, 1):
        ch.enqueue(_Request(False, [0, 0, group, group * 4], 0), 0)
    done: list[int] = []
    now = 0
    while len(done) < 2 and now < 1000:
        wake = ch.tick(now, done)
        now = max(now + 1, wake if wake < 1 << 60 else now + 1)
    return done


def _without_second_activate(path: str) -> str:
    import tempfile

    text = "".join(line for line in open(path) if not line.startswith("second_activate_window"))
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def test_chipsim_dram_point_runs_a_validation_point_exactly_as_validate_does(capsys):
    """`chipsim dram --point NAME` takes the point's stream, controller (queues included) and front end: the same
    bandwidth and latency as `chipsim dram --validate` computes for it, and it prints the options that do so."""
    name = "hbm3-sequential-r50-ch1-s1-ref-q128x64"
    point = {p["name"]: p for p in validate.POINTS}[name]
    expected = validate.run_point(point)
    assert cli.main(["dram", "--point", name, "--json"]) == 0
    out = capsys.readouterr()
    row = json.loads(out.out)
    assert row["bandwidth_gbps"] == expected.bandwidth_gbps
    assert row["read_latency_avg_ns"] == expected.read_latency_avg_ns
    assert "--read-buffer 128 --write-buffer 64" in out.err and "--warmup 0" in out.err


@pytest.mark.parametrize("args, message", [
    (["--point", "nope"], "chipsim dram --point nope: not a validation point"),
    (["hbm3", "--mapping", "channel,column,row"], "chipsim dram --mapping: the order leaves out pseudochannel"),
    (["hbm3", "--xor", "row"], "chipsim dram --xor: 'row' is not a level or the channel"),
    (["hbm3", "--write-low-watermark", "0.9"], "--write-low-watermark must be below --write-high-watermark"),
    (["hbm3", "--offers-per-cycle", "0"], "--offers-per-cycle must be within 1 ... 64"),
    (["hbm3", "--requests", "100", "--warmup", "100"], "--warmup must be within 0 ... 99"),
])
def test_bad_chipsim_dram_options_are_one_line_and_exit_2(capsys, args, message):
    assert cli.main(["dram", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize("override, message", [
    ("memory.hbm.controller_queue_entries=64", "memory.hbm.controller_queue_entries: renamed; give "
                                               "read_queue_entries and write_queue_entries"),
    ("memory.hbm.write_low_watermark=0.9", "memory.hbm.write_low_watermark: must be below "
                                           "memory.hbm.write_high_watermark"),
    ("memory.hbm.address_mapping=RoCh", "memory.hbm.address_mapping: 'RoCh' is not a preset"),
    ("memory.hbm.address_mapping=channel,column,row", "memory.hbm.address_mapping: the order leaves out"),
    ("memory.lpddr5x.address_xor=rank,column", "memory.lpddr5x.address_xor: 'column' is not a level"),
])
def test_a_bad_controller_key_is_one_line_naming_it_before_any_work(override, message):
    with pytest.raises(InputError) as err:
        load_config(THOR, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_kernels_streams_write_one_request_in_k_plus_one(capsys):
    """--kernel 6r1w: six read streams and one write stream in turn (validation/dram/probe_hbm.py's 6r1w kernel):
    one request in seven writes; 1r1w (a copy) writes every other."""
    for kernel, share in (("6r1w", 1 / 7), ("1r1w", 1 / 2)):
        assert cli.main(["dram", "hbm3", "--kernel", kernel, "--requests", "14000", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert row["writes"] / (row["reads"] + row["writes"]) == pytest.approx(share, abs=0.01)
    assert cli.main(["dram", "hbm3", "--kernel", "6x"]) == 2
    assert "--kernel 6x: read, or KrNw" in capsys.readouterr().err


def test_an_organisation_brings_its_die_densitys_refresh_time():
    """JESD238's tRFCab per channel density (hbm3.yaml's timings_ns): 260 ns at 4 Gb per channel (HBM3_8Gb_8hi),
    350 at 8 Gb, 450 at 12 Gb (HBM3E_24Gb_8hi), in cycles of 625 ps rounded up: 416, 560, 720. A config that names
    the organisation and gives another trfc_ns is one line naming the key."""
    for org, cycles in (("HBM3_8Gb_8hi", 416), ("HBM3_16Gb_8hi", 560), ("HBM3E_24Gb_8hi", 720)):
        assert load_standard("hbm3", org).params["nRFC"] == cycles
    hw = load_config(THOR, ["memory.hbm.organization=HBM3_16Gb_8hi", "memory.hbm.trfc_ns=350"]).hw
    assert hw.memory["hbm"].trfc_ns == 350
    with pytest.raises(InputError) as err:
        load_config(THOR, ["memory.hbm.organization=HBM3_16Gb_8hi"])  # thor's trfc_ns is 8 Gb dies' 260
    assert "memory.hbm.trfc_ns: 260 ns, but organisation HBM3_16Gb_8hi of hbm3.yaml sets 350 ns" in str(err.value)


def test_the_lpddr5x_8533_preset_is_the_6400_presets_times_at_its_clock():
    """LPDDR5X-8533: 8 data beats per 938 ps clock, so an x16 channel peaks at 8533 x 2 B = 17.06 GB/s (thor's 16
    channels: 273 GB/s, Jetson Thor's figure); every parameter JEDEC gives in ns is the 6400 preset's ns at the new
    clock, rounded up (tRCD 15 x 1.25 = 18.75 ns -> 20 CK), the clock counts (nBL, nCCDL, nAAD) stay."""
    x = load_standard("lpddr5", timing="LPDDR5X_8533")
    base = load_standard("lpddr5")
    assert x.tck_ps == 938 and x.peak_gbps(1) == pytest.approx(8533 * 2 / 1000, rel=1e-3)
    assert 16 * x.peak_gbps(1) == pytest.approx(273, rel=1e-3)
    for name in ("nRCD", "nRP", "nRPab", "nRAS", "nWR", "nRTP", "nWTRS", "nWTRL", "nCL", "nCWL", "nPBR2PBR"):
        assert x.params[name] == math.ceil(base.params[name] * 1250 / 938 - 1e-9), name
    assert (x.params["nBL"], x.params["nCCDL"], x.params["nAAD"]) == (2, 4, 8)


def test_every_built_in_standard_retimes_to_a_slower_clock_and_rejects_another_kinds_bus():
    """Every organisation and timing preset of every built-in standard, re-timed for a config at its own rate and at
    three quarters of it (the ns keys from the preset itself), loads: no latency expression goes below zero, no
    density timing disagrees. And a memory whose channel width is another kind's (thor's 64-bit HBM3 channel for
    LPDDR5's 16 bits) is one line naming the key."""
    import dataclasses

    import yaml

    from chipsim.dramsim.calibrate import retimed_standard
    from chipsim.dramsim.standard import builtin_standards, standard_path

    base = load_config(THOR).hw.memory["hbm"]
    for name in builtin_standards():
        data = yaml.safe_load(open(standard_path(name)))
        for org in data["organizations"]:
            for timing in data["timings"]:
                s = load_standard(name, org, timing)
                bits = s.org.channel_width_bits * math.prod(s.org.counts[1:s.data_level + 1])
                ns = {k: s.params[p] * s.tck_ps / 1000 for k, p in s.config_keys.items()}
                for share in (0.75, 1.0):
                    cfg = dataclasses.replace(base, standard=name, organization=org, timing_preset=timing,
                                              data_rate_mtps=s.params["rate_mtps"] * share, channel_width_bits=bits,
                                              burst_length=s.org.burst_length, **ns)
                    assert retimed_standard(cfg, "memory.x").tck_ps >= s.tck_ps
    wrong = dataclasses.replace(base, standard="lpddr5", organization="", timing_preset="")
    with pytest.raises(InputError, match=r"memory.x.channel_width_bits: 64, but memory.x.standard LPDDR5 has 16"):
        retimed_standard(wrong, "memory.x")


def test_a_probe_of_a_real_memory_is_compared_kernel_by_kernel(tmp_path, capsys):
    """chipsim dram --probe (validation/dram/probe_hbm.py's JSON) with --config: each kernel it can run (read, KrNw;
    torch's own kernels are left out) through the config's memory description. Its read share is the calibration's
    efficiency (the same stream, over 6 refresh intervals instead of 12: within 0.5 %); a copy (1r1w) is slower
    than a read; a measured share 10 % above the model's is a -9.1 % error and exit 1, one 1 % above it passes."""
    from chipsim.dramsim import calibrate as cal
    from chipsim.dramsim.probe_check import compare

    h200 = str(ROOT / "hwconfigs" / "h200-cycle-level.yaml")
    hw = load_config(h200).hw
    efficiency = cal.calibrate(hw.memory["hbm"], "memory.hbm", 0.1).efficiency
    probe = tmp_path / "probe.json"
    kernels = [{"kernel": "read", "share_of_pin_peak": efficiency * 1.01},
               {"kernel": "1r1w", "share_of_pin_peak": 0.5}, {"kernel": "torch-sum", "share_of_pin_peak": 0.9}]
    probe.write_text(json.dumps({"kernels": kernels}))
    rows = compare(str(probe), hw.memory["hbm"], "memory.hbm")
    assert [r["kernel"] for r in rows] == ["read", "1r1w"]
    assert rows[0]["model"] == pytest.approx(efficiency, rel=5e-3) and rows[0]["within_target"]
    assert rows[1]["model"] < rows[0]["model"]
    kernels[0]["share_of_pin_peak"] = rows[0]["model"] * 1.1
    kernels[1]["share_of_pin_peak"] = rows[1]["model"]
    probe.write_text(json.dumps({"kernels": kernels}))
    assert cli.main(["dram", "--probe", str(probe), "--config", h200]) == 1
    out = capsys.readouterr().out
    assert "-9.1%  MISSES TARGET" in out
    assert cli.main(["dram", "--probe", str(probe)]) == 2
    assert "chipsim dram --probe: give --config CONFIG" in capsys.readouterr().err
    probe.write_text("{}")
    assert cli.main(["dram", "--probe", str(probe), "--config", h200]) == 2
    assert "not a probe_hbm.py result" in capsys.readouterr().err
