"""A second GPU's config from its own probes (chipsim.hwreplay.gpuconfig, validation/calibrate-gpu.sh): the committed
H100 config comes back from its committed probe files alone, a GPU without datasheet facts is refused in one line, the
calibration script measures nothing on a machine without the card, and hwcompare names each regime's machine."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml
from helpers import module_error

from chipsim.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = os.path.join(ROOT, "hwconfigs", "h100-pcie5.yaml")


def _load_json(*parts) -> dict:
    with open(os.path.join(ROOT, *parts)) as f:
        return json.load(f)


def _header_command(path: str) -> list[str]:
    with open(path) as f:
        line = f.read().splitlines()[2]
    assert line.startswith("#   python -m chipsim.hwreplay.gpuconfig ")
    return shlex.split(line[len("#   python -m chipsim.hwreplay.gpuconfig "):])


def test_the_h100_config_is_written_from_its_committed_probes_alone(tmp_path):
    """Its header's command, run again on the committed files, gives every value of hwconfigs/h100-pcie5.yaml; the
    datasheet facts are the H100 SXM5's (3.35 TB/s = 80 channels x 64 bit x 5,234 MT/s / 8 = 3,349.8 GB/s), the link
    and the per-copy cost are the microbenchmark's own fit."""
    from chipsim.hwreplay.gpuconfig import main

    args = _header_command(H100)
    assert args[args.index("--out") + 1] == "hwconfigs/h100-pcie5.yaml"
    args[args.index("--out") + 1] = str(tmp_path / "again.yaml")
    cwd = os.getcwd()
    os.chdir(ROOT)  # the command names the probe files from the repository root
    try:
        assert main(args) == 0
    finally:
        os.chdir(cwd)
    with open(H100) as f:
        committed = yaml.safe_load(f)
    with open(tmp_path / "again.yaml") as f:
        assert yaml.safe_load(f) == committed  # every value, nothing edited by hand
    hbm = committed["memory"]["hbm"]
    assert committed["name"] == "h100-pcie5"
    assert (hbm["channels"], hbm["channel_width_bits"], hbm["data_rate_mtps"]) == (80, 64, 5234)
    assert hbm["channels"] * hbm["channel_width_bits"] * hbm["data_rate_mtps"] / 8 / 1e3 == pytest.approx(3349.76)
    mb = _load_json("validation", "h100", "h100-microbench.json")
    assert mb["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"
    fit = mb["h2d_pinned_queued16_fit"]
    assert committed["links"]["pcie"]["bandwidth_gbps"] == fit["bandwidth_gbps"]
    assert committed["dma"]["setup_ns"] == round(fit["intercept_us"] * 1e3, 1)
    for extra in ("long", "prefill-phi", "prefill-gpt-oss", "batch", "served"):  # each regime's shapes in its table
        key = _load_json("validation", "h100", f"h100-op-times-{extra}.json")["op_times"][0]["key"]
        assert key in committed["compute"]["op_times_ns"], extra


def test_a_gpu_without_datasheet_facts_is_refused_in_one_line(tmp_path):
    mb = _load_json("validation", "h100", "h100-microbench.json")
    mb["machine"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    bad = tmp_path / "a100.json"
    bad.write_text(json.dumps(mb))
    out = tmp_path / "out.yaml"
    run = subprocess.run([sys.executable, "-m", "chipsim.hwreplay.gpuconfig", str(bad), "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 2 and run.stdout == "" and not out.exists()
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"chipsim: error: {bad}: machine.gpu 'NVIDIA A100-SXM4-80GB' has no datasheet facts")


def _edited(edit):
    def make(mb):
        edit(mb)
        return mb
    return make


def _set(section, key, value):
    return _edited(lambda mb: mb[section].__setitem__(key, value))


# each bad microbenchmark field, once a config written that `chipsim check` refused, or a traceback
BAD_MICROBENCH = {
    "gemv bandwidth NaN": (_set("gemv_fit", "bandwidth_gbps", float("nan")), "gemv_fit.bandwidth_gbps: must be finite"),
    "gemv bandwidth negative": (_set("gemv_fit", "bandwidth_gbps", -1), "gemv_fit.bandwidth_gbps: must be positive"),
    "gemv bandwidth 0": (_set("gemv_fit", "bandwidth_gbps", 0), "gemv_fit.bandwidth_gbps: must be positive"),
    "copy bandwidth infinite": (_set("h2d_pinned_queued16_fit", "bandwidth_gbps", float("inf")),
                                "h2d_pinned_queued16_fit.bandwidth_gbps: must be finite"),
    "copy intercept negative": (_set("h2d_pinned_queued16_fit", "intercept_us", -0.5),
                                "h2d_pinned_queued16_fit.intercept_us: must be at least 0"),
    "op key not op_key's": (_edited(lambda mb: mb["op_times"][0].__setitem__("key", "matvec r1024")),
                            "op_times[0].key: 'matvec r1024': not of the form 'matvec rR oO bB'"),
    "op key twice": (_edited(lambda mb: mb["op_times"].append(dict(mb["op_times"][3]))),
                     "op_times[106].key: 'matvec r1024 o2048 b4194304' is listed twice (first at op_times[3])"),
    "a list": (lambda mb: [], ": expected a JSON object, got a list of 0"),
    "no gemv_fit": (_edited(lambda mb: mb.pop("gemv_fit")), "gemv_fit: missing"),
    "machine a string": (_edited(lambda mb: mb.__setitem__("machine", "x")),
                         "machine: expected a JSON object, got 'x'"),
    "gemv_fit a string": (_edited(lambda mb: mb.__setitem__("gemv_fit", "x")), "gemv_fit: expected a JSON object"),
    "tiny kernel NaN": (_set("tiny_kernels", "gpu_us_per_kernel", float("nan")),
                        "tiny_kernels.gpu_us_per_kernel: must be finite"),
    "a user's line break": (_edited(lambda mb: mb["op_times"][0].__setitem__("users", ["a\nb: 1"])),
                            "op_times[0].users[0]: expected printable text"),
}


@pytest.mark.parametrize("name", BAD_MICROBENCH)
def test_gpuconfig_refuses_a_bad_microbenchmark_field_naming_it(tmp_path, capsys, name):
    from chipsim.hwreplay.gpuconfig import main

    make, words = BAD_MICROBENCH[name]
    bad = tmp_path / "mb.json"
    bad.write_text(json.dumps(make(_load_json("validation", "h200-microbench.json"))))
    out = tmp_path / "out.yaml"
    line = module_error(capsys, main, [str(bad), "--out", str(out), "--kernel-launch", "graph"])
    assert line.startswith(f"chipsim: error: {bad}") and words in line, line
    assert not out.exists()


def test_gpuconfig_refuses_an_out_path_it_cannot_write_before_any_work(tmp_path, capsys):
    from chipsim.hwreplay.gpuconfig import main

    mb = os.path.join(ROOT, "validation", "h200-microbench.json")
    missing = tmp_path / "missing" / "x.yaml"
    assert module_error(capsys, main, [mb, "--out", str(missing)]) == \
        f"chipsim: error: --out {missing}: directory {missing.parent} does not exist"
    assert module_error(capsys, main, [mb, "--out", str(tmp_path)]) == \
        f"chipsim: error: --out {tmp_path}: is a directory"
    assert not missing.parent.exists()


def test_the_h200_and_h100_are_named_after_their_cards_and_links():
    from chipsim.hwreplay.gpuconfig import config_name, host_link

    assert config_name(_load_json("validation", "h200-microbench.json")["machine"], "x") == "h200-pcie5"
    h100 = _load_json("validation", "h100", "h100-microbench.json")["machine"]
    assert host_link(h100) == ("5", "16") and config_name(h100, "x") == "h100-pcie5"
    assert host_link({"nvidia_smi": "1980 MHz, 2619 MHz, 4, 8, 580"}) == ("4", "8")
    with pytest.raises(InputError, match="machine.gpu 'None' has no datasheet facts"):
        config_name({}, "x")


def test_calibration_measures_nothing_without_the_card(tmp_path):
    """On a machine whose nvidia-smi names no H100 (or has none), the script stops with exit 3 before any probe and
    writes no config."""
    probes = tmp_path / "probes"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")  # another card than GPU names
    fake.chmod(0o755)
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    env = dict(os.environ, GPU="h100", PROBES=str(probes), PATH=path)
    with open(H100, "rb") as f:
        before = f.read()
    run = subprocess.run(["bash", "validation/calibrate-gpu.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 3, run.stderr
    assert "the card is 'NVIDIA H200' (slug 'h200'), not GPU=h100: nothing measured" in run.stdout
    assert not probes.exists()  # not even its folder
    with open(H100, "rb") as f:
        assert f.read() == before


def test_a_regime_names_the_machine_config_its_replays_ran_under(tmp_path):
    """hwcompare's machine of a measurement: its config's base chain's root, as the file names its config."""
    from chipsim.hwreplay.compare_prefill import machine_config

    meas = os.path.join(ROOT, "validation", "h100", "regimes", "prefill", "h100-pcie5-phi-mini-moe.json")
    assert machine_config("hwconfigs/h100-pcie5-phi-mini-moe.yaml", meas) == "hwconfigs/h100-pcie5.yaml"
    assert machine_config("hwconfigs/h200-pcie5.yaml", meas) == "hwconfigs/h200-pcie5.yaml"
    with pytest.raises(InputError, match="config hwconfigs/none.yaml not found"):
        machine_config("hwconfigs/none.yaml", meas)


def test_hwcompare_refuses_a_machine_config_gpuconfig_did_not_write_before_any_work(tmp_path, capsys):
    from chipsim.errors import run_module_main
    from chipsim.hwreplay.compare import main

    for config in (os.path.join(ROOT, "hwconfigs", "thor.yaml"), str(tmp_path / "none.yaml")):
        with pytest.raises(SystemExit) as exc:
            run_module_main(lambda: main([os.path.join(ROOT, "validation", "h200-pcie5.json"), "--machine", config]))
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err == (f"chipsim: error: --machine {config}: not a config written by chipsim.hwreplay.gpuconfig "
                       "(its command belongs on its third line)\n")


def test_the_mac_costs_more_at_the_full_clock_than_at_the_power_caps():
    """probe_gemm_clock.py's windows: back to back the cap pulls the SM clock down and a MAC (everything above idle)
    costs 1.74-1.76 pJ; paced below the cap (532 and 323 W against 704-707), 2.16-2.17 pJ. The table's MAC solved from the paced
    windows lies between the back-to-back solve and the paced windows' all-in figure (busy power and HBM take the
    rest), and the config carries it."""
    from chipsim.hwreplay.energy_table import derive

    probe = _load_json("validation", "h100", "h100-energy-probe.json")
    clock = _load_json("validation", "h100", "h100-gemm-clock.json")
    back_to_back = [w for w in clock["windows"] if w["gap_calls"] == 0]
    paced = [w for w in clock["windows"] if w["gap_calls"] > 0]
    assert all(w["sm_clock_mhz"][1] < 1500 for w in back_to_back)  # read right after the last GEMM: the cap's clock
    assert max(w["power_w"] for w in paced) < 0.8 * min(w["power_w"] for w in back_to_back)  # well below the cap
    assert max(w["pj_per_mac_above_idle"] for w in back_to_back) < min(w["pj_per_mac_above_idle"] for w in paced)
    capped, full = derive(probe).mac_pj, derive(probe, clock).mac_pj
    assert capped < full < min(w["pj_per_mac_above_idle"] for w in paced)
    with open(H100) as f:
        assert yaml.safe_load(f)["compute"]["mac_energy_pj"] == round(full, 4)
    with pytest.raises(InputError, match="no paced window"):
        derive(probe, {**clock, "windows": back_to_back})


def test_the_paced_gemm_equation_by_hand():
    """The paced windows as one equation per second of GEMM time: calls x 5.785 ms of 4 GEMMs of 8192^3, bytes
    3 x 8192^2 x 2 per GEMM, energy above each window's own idle; 822.7 W above idle over that time."""
    from chipsim.hwreplay.energy_table import _paced_gemm_row

    clock = _load_json("validation", "h100", "h100-gemm-clock.json")
    paced = [w for w in clock["windows"] if w["gap_calls"] > 0]
    busy_s = sum(w["calls"] for w in paced) * clock["call_seconds"]
    gemms = sum(w["calls"] for w in paced) * clock["gemms_per_call"]
    above_j = sum(w["energy_j"] - w["idle_w"] * w["seconds"] for w in paced)
    row, above_w = _paced_gemm_row(clock)
    assert row == pytest.approx([1.0, gemms * 3 * 8192**2 * 2 / busy_s, gemms * 8192**3 / busy_s])
    assert above_w == pytest.approx(above_j / busy_s) and above_w == pytest.approx(822.7, abs=0.1)


def test_clock_power_follows_occupancy_only_where_the_probe_says_so():
    """The H200's one-block kernels drew 1.6 W above idle against 78 W for every SM: power by occupancy; the H100's
    9.0 W against 9.5 W: a kernel draws the busy power whatever its share of the SMs."""
    cfg = {}
    for name in ("h200-pcie5", "h100-pcie5"):
        with open(os.path.join(ROOT, "hwconfigs", f"{name}.yaml")) as f:
            cfg[name] = yaml.safe_load(f)["compute"]["clock_power_by_occupancy"]
    assert cfg == {"h200-pcie5": True, "h100-pcie5": False}


def test_the_machine_section_names_its_command_fits_and_table():
    from chipsim.hwreplay.compare import machine_lines

    lines = machine_lines(H100)
    assert lines[0] == "## Another GPU calibrated from its own probes: NVIDIA H100 SXM5 80GB"
    assert f"    {_header_command_text(H100)}" in lines
    assert "### NVIDIA H100 SXM5 80GB: machine and microbenchmarks" in lines
    fit = _load_json("validation", "h100", "h100-microbench.json")["h2d_pinned_queued16_fit"]
    assert any(f"| {fit['bandwidth_gbps']} GB/s, {fit['intercept_us']} µs per copy |" in line for line in lines)
    assert any(line.startswith("Its energy table (validation/h100/h100-energy-probe.json, the MAC from "
                               "validation/h100/h100-gemm-clock.json;") for line in lines)


def _header_command_text(path: str) -> str:
    with open(path) as f:
        return f.read().splitlines()[2].lstrip("# ").strip()
