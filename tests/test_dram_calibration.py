"""The command-level DRAM model calibrating the system model: re-timing a standard to a config, the figures it
hands to the shared-resource model, the content-hash cache, and the closed form as a what-if."""

import json
import math
from pathlib import Path

import pytest

from chipsim import cli
from chipsim.dramsim import calibrate as cal
from chipsim.hw.config import load_config
from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.dram_formula import dram_timing
from chipsim.hw.paths import components, memory_timing

ROOT = Path(__file__).resolve().parents[1]
THOR = str(ROOT / "hwconfigs" / "thor.yaml")
CLOSED = ["memory.hbm.timing_model=closed-form", "memory.lpddr5x.timing_model=closed-form"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    cal.calibrate.cache_clear()
    yield tmp_path / "cache"
    cal.calibrate.cache_clear()


def test_the_standard_is_retimed_to_the_configs_clock_and_ns_keys():
    """thor's LPDDR5X runs at 8533 MT/s: the LPDDR5 preset's clock (8 beats per CK) becomes 938 ps; its ns keys set
    their parameters (tCL 21.25 ns -> 23 cycles); parameters JEDEC gives in ns scale (tRTP 8 x 1.25 ns -> 11);
    clock counts stay (nBL, nCCDL)."""
    hw = load_config(THOR).hw
    std = cal.retimed_standard(hw.memory["lpddr5x"], "memory.lpddr5x")
    p = std.params
    assert std.tck_ps == round(8e6 / 8533) == 938
    assert p["nCL"] == math.ceil(21.25e3 / 938) == 23
    assert p["nRAS"] == math.ceil(42.5e3 / 938)
    assert p["nRTP"] == math.ceil(8 * 1250 / 938) == 11
    assert (p["nBL"], p["nCCDL"]) == (2, 4)
    hbm = cal.retimed_standard(hw.memory["hbm"], "memory.hbm")  # thor's HBM3 runs at the preset's 6400: same clock
    assert hbm.tck_ps == 625 and hbm.params["nRFC"] == math.ceil(260e3 / 625) and hbm.params["nRCDRD"] == 31


def test_the_system_model_takes_the_command_level_figures(cache):
    hw = load_config(THOR).hw
    # the run's write share: 112.7 GB/s of fetches over the closed form's 764.6 GB/s (819.2 x (1 - 260 / 3900))
    c = cal.calibrate(hw.memory["hbm"], "memory.hbm", 0.147)
    t = memory_timing(hw, "hbm")
    closed = dram_timing(hw.memory["hbm"])
    assert t.source == "command-level hbm3"
    assert t.effective_gbps == pytest.approx(closed.peak_gbps * c.efficiency, rel=1e-12)
    assert components(hw)["hbm"].gbps == t.effective_gbps and components(hw)["hbm"].turnaround == c.turnaround
    assert ArrayModel(hw).stream_gbps == t.effective_gbps  # the arrays' operand stream (UCIe's 1024 is wider)
    # the measured efficiency is the stream's bandwidth over the data-bus peak of the model's own channel
    assert c.efficiency == pytest.approx(c.read_gbps / c.peak_gbps) and c.peak_gbps == pytest.approx(51.2)
    # and the turnaround closes the balance (1 - w) T + w T (1 + turnaround) = C
    w = c.write_share
    assert (1 - w) * c.mixed_gbps + w * c.mixed_gbps * (1 + c.turnaround) == pytest.approx(c.read_gbps)
    # a lone read to a random row: at least tRCD + tCL + a burst, at most a row conflict's tRP more and a refresh
    p = cal.retimed_standard(hw.memory["hbm"], "memory.hbm").params
    assert (p["nRCDRD"] + p["nCL"] + p["nBL"]) * 0.625 <= c.access_latency_ns
    assert c.access_latency_ns <= (p["nRP"] + p["nRCDRD"] + p["nCL"] + p["nBL"]) * 0.625


def test_paced_streams_take_their_share_of_requests_and_a_write_stream_only_writes():
    from chipsim.dramsim.standard import load_standard
    from chipsim.dramsim.streams import requests

    std = load_standard("hbm3")
    reqs = requests(std, 10_000, streams=2, paces=(0.8, 0.2), write_streams=(1,))
    assert abs(sum(w for w, *_ in reqs) - 2_000) < 3 * (10_000 * 0.2 * 0.8) ** 0.5  # the write stream's share
    assert reqs == requests(std, 10_000, streams=2, paces=(0.8, 0.2), write_streams=(1,))  # seeded
    rows = {w: {row for w2, _c, _a, row, _col in reqs if w2 == w} for w in (False, True)}
    assert rows[False].isdisjoint(rows[True])  # each stream in its own region of rows
    in_turn = requests(std, 100, streams=2)
    assert [r[3] for r in in_turn[::2]] == [in_turn[0][3]] * 50  # no paces: in turn, stream 0 on its first row
    with pytest.raises(ValueError):
        requests(std, 10, streams=2, paces=(1,))


def test_the_host_cpu_beside_the_dma_is_calibrated_as_two_read_streams(cache):
    """thor's LPDDR5X stores the experts and the host CPU reads them too (100 GB/s beside PCIe's 112.7): the
    DRAM model's two streams at that share reach less than one stream, and the flow network uses it while both
    read; HBM, read by the operand stream alone, has no such figure."""
    hw = load_config(THOR).hw
    lp = memory_timing(hw, "lpddr5x")
    share = 100 / (100 + hw.links["pcie"].data_gbps)
    c = cal.calibrate(hw.memory["lpddr5x"], "memory.lpddr5x", hw.links["pcie"].data_gbps / dram_timing(hw.memory["lpddr5x"]).effective_gbps,
                      share)
    assert c.second_read_share == round(share, 3)
    assert lp.shared_gbps == pytest.approx(lp.peak_gbps * c.shared_efficiency)
    assert 0.9 * lp.effective_gbps < lp.shared_gbps < lp.effective_gbps  # bank conflicts between the streams
    assert components(hw)["lpddr5x"].shared_gbps == lp.shared_gbps
    assert memory_timing(hw, "hbm").shared_gbps == 0.0


def test_twelve_refresh_intervals_measure_the_efficiency_and_turnaround_of_a_long_run(cache, monkeypatch):
    """The calibration's streams against three times as long ones: efficiency within 0.2 %, the two-stream
    turnaround (streams drawn at random) within 5 %."""
    hw = load_config(THOR).hw
    std = cal.retimed_standard(hw.memory["hbm"], "memory.hbm")
    short = cal.run_calibration(std, 0.151)
    monkeypatch.setattr(cal, "REFRESH_PERIODS", 3 * cal.REFRESH_PERIODS)
    long = cal.run_calibration(std, 0.151)
    assert short.efficiency == pytest.approx(long.efficiency, rel=2e-3)
    assert short.turnaround == pytest.approx(long.turnaround, rel=0.05)


def test_calibration_is_cached_by_content_and_a_changed_key_calibrates_anew(cache):
    hw = load_config(THOR).hw
    first = cal.calibrate(hw.memory["hbm"], "memory.hbm", 0.151)
    files = list((cache / "dram").glob("*.json"))
    assert len(files) == 1 and cal.Calibration(**json.loads(files[0].read_text())["payload"]) == first
    cal.calibrate.cache_clear()
    assert cal.calibrate(hw.memory["hbm"], "memory.hbm", 0.151) == first  # read back from the file, bit for bit
    slower = load_config(THOR, ["memory.hbm.trcd_ns=30"]).hw
    cal.calibrate(slower.memory["hbm"], "memory.hbm", 0.151)
    assert len(list((cache / "dram").glob("*.json"))) == 2


def test_a_run_is_byte_identical_with_a_cold_and_a_warm_cache(cache, tmp_path, capsys):
    argv = ["run", THOR, "--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1", "--json"]
    assert cli.main(argv) == 0
    cold = capsys.readouterr().out
    cal.calibrate.cache_clear()
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == cold


def test_the_closed_form_stays_a_what_if(cache):
    hw = load_config(THOR, CLOSED).hw
    assert memory_timing(hw, "hbm") == dram_timing(hw.memory["hbm"])
    assert not (cache / "dram").exists()  # nothing calibrated
    command = memory_timing(load_config(THOR).hw, "hbm")
    assert command.effective_gbps < dram_timing(hw.memory["hbm"]).effective_gbps  # row switches a 32-deep queue cannot hide


def test_command_level_without_a_standard_is_one_line(tmp_path):
    import yaml

    from chipsim.errors import InputError

    data = yaml.safe_load(open(THOR))
    del data["memory"]["lpddr5x"]["standard"]
    data["workload"]["trace"] = str(ROOT / "traces" / "real-granite-3b.npz")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="memory.lpddr5x.timing_model: command-level needs memory.lpddr5x.standard"):
        load_config(str(tmp_path / "c.yaml"))
    with pytest.raises(InputError, match=r"memory.hbm.standard: DRAM standard ddr9: not found"):
        memory_timing(load_config(THOR, ["memory.hbm.standard=ddr9"]).hw, "hbm")


def test_the_controller_queue_depth_is_a_key_and_a_deeper_queue_hides_more_row_switches(cache):
    """memory.hbm.read_queue_entries and write_queue_entries reach the command-level model: 64 entries see the
    next rows' requests earlier than 32 (higher efficiency) and drain writes in longer batches (lower
    turnaround); the calibration is cached apart."""
    thirty_two = memory_timing(load_config(THOR, ["memory.hbm.read_queue_entries=32",
                                                  "memory.hbm.write_queue_entries=32"]).hw, "hbm")
    sixty_four = memory_timing(load_config(THOR, ["memory.hbm.read_queue_entries=64",
                                                  "memory.hbm.write_queue_entries=64"]).hw, "hbm")
    assert sixty_four.effective_gbps > thirty_two.effective_gbps * 1.03
    assert sixty_four.turnaround < thirty_two.turnaround
    assert len(list((cache / "dram").glob("*.json"))) >= 3  # HBM twice, LPDDR5X once
