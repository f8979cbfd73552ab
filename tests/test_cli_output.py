"""What `chipsim run` prints and writes."""

import csv
import json
import math

from conftest import ROOT, THOR

from chipsim.cli import main

REQUIRED_JSON_KEYS = {
    "policy", "latency_ms_per_token", "stall_ms_per_token", "energy_mj_per_token", "energy_onchip_active_mj",
    "energy_offchip_io_mj", "energy_idle_leakage_mj", "edp_mj_ms", "offchip_bytes_per_token",
}
SHORT = ["--set", "workload.max_tokens=3", "--jobs", "1"]


def test_json_has_one_object_per_policy_with_the_documented_keys(capsys):
    assert main(["run", THOR, "--json", "--policy", "no-prefetch", "--policy", "static-2", *SHORT]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["no-prefetch", "static-2"]
    for row in rows:
        assert REQUIRED_JSON_KEYS <= set(row)
        parts = (row["energy_onchip_active_mj"] + row["energy_offchip_io_mj"] + row["energy_idle_leakage_mj"]
                 + row["energy_host_cpu_mj"])
        assert math.isclose(parts, row["energy_mj_per_token"], rel_tol=1e-12)
        assert math.isclose(row["edp_mj_ms"], row["energy_mj_per_token"] * row["latency_ms_per_token"], rel_tol=1e-12)


SYNTHETIC_TRACE = f"{ROOT}/traces/synthetic-granite-3b.npz"


def test_table_names_config_and_says_synthetic_only_for_a_synthetic_trace(capsys):
    assert main(["run", THOR, "--policy", "oracle", *SHORT, "--trace", SYNTHETIC_TRACE]) == 0
    out = capsys.readouterr().out
    assert f"config: {THOR}" in out
    assert "SYNTHETIC" in out.splitlines()[1]
    assert "oracle" in out and "EDP" in out
    assert main(["run", THOR, "--policy", "oracle", *SHORT]) == 0  # thor's default: a trained model's trace
    out = capsys.readouterr().out
    assert "SYNTHETIC" not in out and "held-out loss" in out.splitlines()[1]


def test_out_dir_holds_csv_and_json_with_hashes_and_per_layer_breakdowns(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", THOR, "--policy", "no-prefetch", "--policy", "oracle", "--out", str(out), *SHORT]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.json"]
    doc = json.loads((out / "results.json").read_text())
    run = doc["run"]
    for key in ("config_sha256", "trace_sha256", "code_sha256"):
        assert len(run[key]) == 64
    assert run["trace_synthetic"] is False
    assert run["trace_provenance"]
    layers = doc["results"][0]["per_layer"]["overlap"]
    assert len(layers) == 32
    from chipsim.sim.metrics import PER_LAYER_FIELDS  # what experiments let a per_layer plot draw: every row's lists

    assert sorted(doc["results"][0]["per_layer"]) == sorted(PER_LAYER_FIELDS)
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == ["no-prefetch", "oracle"]
    assert float(rows[1]["latency_ms_per_token"]) == doc["results"][1]["latency_ms_per_token"]


def test_base_config_overrides_only_what_it_names(capsys):
    alt = f"{ROOT}/hwconfigs/alt-energy-public.yaml"
    assert main(["run", THOR, "--json", "--policy", "no-prefetch", *SHORT]) == 0
    paper = json.loads(capsys.readouterr().out)[0]
    assert main(["run", alt, "--json", "--policy", "no-prefetch", *SHORT]) == 0
    public = json.loads(capsys.readouterr().out)[0]
    assert public["latency_ms_per_token"] == paper["latency_ms_per_token"]  # energy keys only
    # PCIe energy scales with its pJ/bit: 6.5 vs 5.0
    assert math.isclose(public["energy_pcie_mj"] / paper["energy_pcie_mj"], 6.5 / 5.0, rel_tol=1e-12)


def test_set_and_inline_policy_parameters(capsys):
    assert main(["run", THOR, "--json", "--policy", "static:extra=3", "--policy", "static-3", *SHORT]) == 0
    a, b = json.loads(capsys.readouterr().out)
    assert a["latency_ms_per_token"] == b["latency_ms_per_token"]
    assert main(["run", THOR, "--json", "--policy", "static", "--set", "policies.static.extra=3", *SHORT]) == 0
    c = json.loads(capsys.readouterr().out)[0]
    assert c["latency_ms_per_token"] == a["latency_ms_per_token"]


def test_listing_commands(capsys):
    for cmd in ("models", "keys", "policies"):
        assert main([cmd]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v2-lite" in out and "links.<serial link>.bandwidth_gbps" in out and "policies.static.extra" in out


def test_every_bundled_hwconfig_runs(capsys):
    import glob

    for path in sorted(glob.glob(f"{ROOT}/hwconfigs/*.yaml")):
        assert main(["run", path, "--json", "--policy", "no-prefetch", "--policy", "oracle", *SHORT,
                     "--set", "workload.warmup_tokens=0"]) == 0, path
        rows = json.loads(capsys.readouterr().out)
        assert rows[1]["latency_ms_per_token"] <= rows[0]["latency_ms_per_token"], path


def test_run_profile_prints_where_the_time_goes_and_leaves_the_results_as_they_are(capsys):
    """--profile: the same JSON rows as a plain run, and per policy its SimPy events, flows, fetches, op groups,
    stalls and hook calls (one on_layer_start, on_route and on_layer_end per layer and token, one on_token_start per
    token, one on_run_start) with the seconds of each part; no-prefetch fetches every routed expert (8 per layer)."""
    import json
    from pathlib import Path

    from chipsim import cli

    thor = str(Path(__file__).resolve().parents[1] / "hwconfigs" / "thor.yaml")
    base = ["run", thor, "--policy", "no-prefetch", "--policy", "apex", "--set", "workload.max_tokens=4", "--json",
            "--jobs", "1"]
    assert cli.main(base) == 0
    plain = capsys.readouterr().out
    assert cli.main(base + ["--profile"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    lines = captured.err.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    rows = {line.split()[0]: line.split() for line in lines[header + 2:header + 4]}
    assert set(rows) == {"no-prefetch", "apex"}
    for name, cells in rows.items():
        events, transfers, fetches, op_groups, stalls, hooks = (int(c.replace(",", "")) for c in cells[2:8])
        assert events > transfers > 0 and fetches > 0 and stalls > 0
        assert op_groups >= 4 * (2 * 32 + 1)  # per token at least each layer's attention and experts, and the head
        assert hooks == 4 * 32 * 3 + 4 + 1
        assert float(cells[1]) >= sum(float(c) for c in cells[8:]) * 0.5
    assert int(rows["no-prefetch"][4].replace(",", "")) == 4 * 32 * 8  # every routed expert fetched on demand
    assert "slowest policy hook" in captured.err
    assert cli.main(base + ["--profile", "--timeline", str(Path(thor).parent / "never-written.json")]) == 2
    assert "--profile and --timeline" in capsys.readouterr().err
    assert not (Path(thor).parent / "never-written.json").exists()
