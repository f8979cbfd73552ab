"""experiments/*.yaml, `chipsim reproduce` and `chipsim plot`."""

import os
import shutil

import pytest

from chipsim import cli
from chipsim.analysis import experiments as ex
from chipsim.analysis import reproduction
from chipsim.analysis import sweep
from chipsim.analysis.docs_concepts import assumed_keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")
NAMES = ex.list_experiments(EXPERIMENTS)


def test_the_papers_figures_are_all_there():
    for name in ("apex_fig8", "apex_fig9", "apex_fig12", "apex_fig13", "apex_table5", "apex_fig14", "apex_fig15"):
        assert name in NAMES


def test_the_committed_report_has_each_experiment_under_its_title():
    """REPRODUCTION.md is regenerated whenever an experiment is added or retitled (a title says SYNTHETIC or a
    trained model's routing, so a trace switched under an experiment shows here too): one section per experiment,
    headed by its name and its file's title, in the report's order."""
    with open(os.path.join(ROOT, "REPRODUCTION.md"), encoding="utf-8") as f:
        headings = [line[3:].rstrip("\n") for line in f if line.startswith("## ")]
    want = [f"{name}: {ex.load_experiment(ex.find_experiment(name, EXPERIMENTS))['title']}" for name in NAMES]
    assert sorted(headings) == sorted(want)


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_loads_and_validates(name):
    exp = ex.load_experiment(ex.find_experiment(name, EXPERIMENTS))
    assert exp["name"] == name
    assert exp["policies"] and exp["plot"]["kind"] in ex.PLOT_KINDS
    assert all(os.path.isfile(c) for c in exp["configs"])
    # fast: every experiment caps its tokens (a request: its output tokens; its prompt is what it sweeps)
    assert any(o.startswith(("workload.max_tokens=", "workload.output_tokens=")) for o in exp["overrides"])


GOOD = """\
title: t
paper: p
config: {config}
grid: {{workload.context_length: [512]}}
policies: [no-prefetch]
overrides: [workload.max_tokens=2]
plot: {{kind: line, x: workload.context_length, y: latency_ms_per_token, xlabel: x (tokens), ylabel: y (ms)}}
"""


@pytest.mark.parametrize("edit, fragment", [
    (lambda t: t + "colour: red\n", "unknown key 'colour'"),
    (lambda t: t.replace("workload.context_length: [512]", "workload.context_lenght: [512]"),
     "grid workload.context_lenght=512"),
    (lambda t: t.replace("workload.context_length: [512]", "policies.apex.tua: [0.5]"),
     "policy apex has no parameter 'tua'"),
    (lambda t: t.replace("kind: line", "kind: pie"), "plot.kind 'pie'"),
    (lambda t: t.replace("policies: [no-prefetch]\n", ""), "missing key 'policies'"),
    (lambda t: t.replace("{config}", "nowhere.yaml"), "config nowhere.yaml: no such file"),
    (lambda t: t.replace("kind: line", "kind: line, yscale: ln"), "plot.yscale 'ln'"),
    (lambda t: t.replace("kind: line", "kind: line, yfactor: [1, 2]"), "plot.yfactor"),
    (lambda t: t + "paper_points: [{{series: no-prefetch, x: 512, metric: energy_mj_per_token, value: 1}}]\n",
     "paper_points[0].metric 'energy_mj_per_token': not drawn by the plot"),
    (lambda t: t + "paper_points: [{{series: no-prefetch, x: 512, metric: latency_ms_per_token}}]\n",
     "paper_points[0]: missing key 'value'"),
    (lambda t: t + "paper_points: [{{series: no-prefetch, x: 512, metric: latency_ms_per_token, value: [1]}}]\n",
     "paper_points[0].value: expected a number or [low, high]"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: latency_ms_per_token, where: {{}}, why: w, draw: 0}}]\n",
     "compare[0].draw: expected true or false"),
    (lambda t: t.replace("kind: line", "kind: line, annotate_only: [0.5]"), "plot.annotate_only"),
    (lambda t: t + "table: [{{metric: latency_ms, label: x}}]\n",
     "table[0].metric 'latency_ms': not a results.csv column"),
    (lambda t: t + "table: [{{metric: fallback_rate}}]\n", "table[0]: missing key 'label'"),
    (lambda t: t + "grid_mode: diagonal\n", "grid_mode 'diagonal'"),
    (lambda t: t + "grid_mode: one_at_a_time\n", "plot.kind: gain draws a one_at_a_time grid"),
    (lambda t: t.replace("kind: line", "kind: gain"), "plot.kind: gain draws a one_at_a_time grid"),
    (lambda t: t.replace("kind: line", "kind: gain, baseline: apex") + "grid_mode: one_at_a_time\n",
     "plot.baseline 'apex': must be one of the policies"),
    (lambda t: t + "table: [{{metric: fallback_rate, label: x, format: '{{:q}}'}}]\n", "table[0].format"),
    # every field the plot, compare rows and table name, checked before anything is simulated or written
    (lambda t: t.replace("x: workload.context_length", "x: nosuch"), "plot.x: no result column 'nosuch'"),
    (lambda t: t.replace("y: latency_ms_per_token", "y: nosuch"), "plot.y: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: line, series: nosuch"), "plot.series: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: line, annotate: nosuch"), "plot.annotate: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: stacked_bar, stack: {{nosuch: a}}"),
     "plot.stack: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: bar, normalize: 3"), "plot.normalize: expected {column"),
    (lambda t: t.replace("kind: line", "kind: bar, normalize: {{column: nosuch, value: 1}}"),
     "plot.normalize: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: line, normalize: {{column: policy, value: no-prefetch}}"),
     "plot.normalize: a line plot does not draw it"),
    (lambda t: t.replace("kind: line", "kind: line, secondary_x: 3"), "plot.secondary_x: expected {label"),
    (lambda t: t.replace("kind: line", "kind: line, title: [1, 2]"), "plot.title: expected a string"),
    (lambda t: t.replace("kind: line", "kind: line, ylim: abc"), "plot.ylim: expected [low, high]"),
    (lambda t: t.replace("kind: line", "kind: line, ylim: [.nan, 1]"), "plot.ylim: expected [low, high]"),
    (lambda t: t.replace("kind: line", "kind: line, ylim: [5, 1]"), "plot.ylim: expected [low, high]"),
    (lambda t: t.replace("kind: line", "kind: line, yfactor: .inf"), "plot.yfactor: give one positive finite"),
    (lambda t: t.replace("kind: line", "kind: line, yfactor: true"), "plot.yfactor: give one positive finite"),
    (lambda t: t.replace("kind: line", "kind: line, where: {{nosuch: 1}}"), "plot.where: no result column 'nosuch'"),
    (lambda t: t.replace("kind: line", "kind: line, where: {{policy: apex}}"),
     "plot.where: policy 'apex' selects no result"),
    (lambda t: t.replace("kind: line", "kind: line, where: {{workload.context_length: 1024}}"),
     "plot.where: workload.context_length 1024 selects no result"),
    (lambda t: t.replace("kind: line", "kind: bar, normalize: {{column: policy, value: apex}}"),
     "plot.normalize: policy 'apex' selects no result"),
    (lambda t: t.replace("kind: line", "kind: per_layer").replace("y: latency_ms_per_token", "y: nosuchfield"),
     "plot.y: 'nosuchfield' is not a per-layer field"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: nosuch, where: {{}}, why: w}}]\n",
     "compare[0].metric: no result column 'nosuch'"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: policy, where: {{}}, why: w}}]\n",
     "compare[0].metric: 'policy' holds words"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: latency_ms_per_token, where: {{}}, vs: nosuch, why: w}}]\n",
     "compare[0].vs: expected a mapping"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: latency_ms_per_token, where: 3, why: w}}]\n",
     "compare[0].where: expected a mapping"),
    (lambda t: t + "compare: [{{what: a, paper: 1, metric: latency_ms_per_token, where: {{nosuch: 1}}, why: w}}]\n",
     "compare[0].where: no result column 'nosuch'"),
    (lambda t: t + "compare: [{{what: a, paper: .nan, metric: latency_ms_per_token, where: {{}}, why: w}}]\n",
     "compare[0].paper: expected a number or [low, high] (finite, low <= high)"),
    (lambda t: t + "compare: [{{what: a, paper: [5, 1], metric: latency_ms_per_token, where: {{}}, why: w}}]\n",
     "compare[0].paper: expected a number or [low, high] (finite, low <= high)"),
    (lambda t: t + "paper_points: [{{series: no-prefetch, x: 512, metric: latency_ms_per_token, value: [5, 1]}}]\n",
     "paper_points[0].value: expected a number or [low, high] (finite, low <= high), got [5, 1]"),
    (lambda t: t + "table: [{{metric: fallback_rate, label: x, factor: .inf}}]\n", "table[0].factor"),
])
def test_bad_experiment_is_one_line_exit_2(tmp_path, capsys, edit, fragment):
    text = edit(GOOD).format(config=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    (tmp_path / "bad.yaml").write_text(text)
    out = tmp_path / "out"
    rc = cli.main(["reproduce", "bad", "--experiments", str(tmp_path), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("chipsim: error: ")
    assert fragment in err
    assert not out.exists()  # checked before anything is written


def _files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def test_every_named_experiment_is_checked_before_any_is_run(tmp_path, capsys):
    """`reproduce ok bad`: a bad file refuses the command before ok is simulated; a column only the results can
    lack (a policy's own metric, here APEX's tau where only no-prefetch ran) refuses it right after simulating,
    before anything of either experiment is written (only the results cache remains)."""
    good = GOOD.format(config=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    (tmp_path / "ok.yaml").write_text(good)
    (tmp_path / "bad.yaml").write_text(good.replace("kind: line", "kind: line, title: [1, 2]"))
    out = tmp_path / "out"
    argv = ["reproduce", "ok", "bad", "--experiments", str(tmp_path), "--out", str(out), "--quiet", "--jobs", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml: plot.title: expected a string" in err and not out.exists()
    (tmp_path / "bad.yaml").write_text(good.replace("kind: line", "kind: line, annotate: tau"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml: plot.annotate: no result column 'tau' in this experiment's results" in err
    assert all(f.startswith("cache" + os.sep) for f in _files(out))  # no ok/, no bad/, no figure, no report


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    """A reproduce DIR of one small experiment (two points), its figures and report removed."""
    folder = tmp_path_factory.mktemp("plot")
    good = GOOD.format(config=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    (folder / "ok.yaml").write_text(good.replace("[512]", "[512, 1024]"))
    out = folder / "out"
    assert cli.main(["reproduce", "ok", "--experiments", str(folder), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    for name in ("ok/ok.png", "ok/ok.pdf", "REPRODUCTION.md"):
        (out / name).unlink()
    return out


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: (d / "ok" / "results.csv").write_text("garbage\n1,2\n"),
     "ok/results.csv: no column 'policy' (not a results.csv chipsim wrote)"),
    (lambda d: (d / "ok" / "results.csv").unlink(), "ok/results.csv: missing"),
    (lambda d: (d / "ok" / "experiment.json").write_text(
        (d / "ok" / "experiment.json").read_text().replace('"x": "workload.context_length"', '"x": "nosuch"')),
     "ok/experiment.json: plot.x: no result column 'nosuch'"),
    (lambda d: (d / "ok" / "experiment.json").write_text(
        (d / "ok" / "experiment.json").read_text().replace('"kind": "line"', '"kind": "line", "ylim": [1, 1]')),
     "ok/experiment.json: plot.ylim: expected [low, high]"),
    (lambda d: (d / "ok" / "sweep.json").write_text(
        (d / "ok" / "sweep.json").read_text().replace('"latency_ms_per_token"', '"latency"')),
     "ok/experiment.json: plot.y: no result column 'latency_ms_per_token' in this experiment's results"),
])
def test_plot_checks_every_saved_file_before_drawing_any(reproduced, tmp_path, capsys, damage, fragment):
    out = tmp_path / "out"
    shutil.copytree(reproduced, out)
    damage(out)
    before = _files(out)
    assert cli.main(["plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chipsim: error: ") and fragment in err, err
    assert _files(out) == before  # no figure, no report, no temporary file


def test_unknown_experiment_name_is_one_line_exit_2(tmp_path, capsys):
    rc = cli.main(["reproduce", "apex_fig99", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "apex_fig99" in err


def test_plot_of_a_directory_without_results_is_one_line_exit_2(tmp_path, capsys):
    rc = cli.main(["plot", str(tmp_path)])
    assert rc == 2 and capsys.readouterr().err.count("\n") == 1


def _no_simulation(*args, **kwargs):
    raise AssertionError("chipsim plot must not simulate")


def test_reproduce_end_to_end_then_plot_redraws_identically(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    report = tmp_path / "REPRODUCTION.md"
    rc = cli.main(["reproduce", "apex_table5", "--out", str(out), "--jobs", "1", "--quiet",
                   "--set", "workload.max_tokens=2", "--report", str(report)])
    assert rc == 0, capsys.readouterr().err
    png, pdf = out / "apex_table5" / "apex_table5.png", out / "apex_table5" / "apex_table5.pdf"
    assert png.stat().st_size > 10_000 and pdf.stat().st_size > 5_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-"
    assert (out / "apex_table5" / "results.csv").is_file() and (out / "timings.json").is_file()
    text = report.read_text()
    assert "## apex_table5:" in text and "| no-prefetch PCIe only | 48.00 mJ |" in text
    assert "apex_table5/apex_table5.png" in text
    before = {p: p.read_bytes() for p in (png, pdf, report)}

    # plot: from the saved results only; the simulator must not run
    monkeypatch.setattr(sweep, "_run_task", _no_simulation)
    monkeypatch.setattr(sweep, "simulate", _no_simulation)
    monkeypatch.setattr("chipsim.runner.simulate", _no_simulation)
    for p in (png, pdf):
        p.unlink()
    shutil.rmtree(out / "cache")  # the experiments' shared cache: not needed to draw
    assert cli.main(["plot", str(out), "--report", str(report)]) == 0
    after = {p: p.read_bytes() for p in (png, pdf, report)}
    assert after == before  # byte-identical: fixed metadata, same results


def test_compare_rows_fill_from_results_and_ranges():
    import pandas as pd

    exp = {"name": "x", "grid": {"b": [1, 2]}, "compare": [
        {"what": "a", "paper": 10.0, "unit": "ms", "metric": "lat", "where": {"policy": "apex", "b": 1}, "vs": None,
         "why": "w"},
        {"what": "r", "paper": [-40, -20], "unit": "%", "metric": "lat", "where": {"policy": "apex"},
         "vs": {"policy": "none"}, "why": "w"},
    ]}
    df = pd.DataFrame([
        {"config": "c", "b": 1, "policy": "apex", "lat": 8.0}, {"config": "c", "b": 1, "policy": "none", "lat": 10.0},
        {"config": "c", "b": 2, "policy": "apex", "lat": 5.0}, {"config": "c", "b": 2, "policy": "none", "lat": 10.0},
    ])
    one, rng = reproduction.compare_rows(exp, df)
    assert one["ours"] == (8.0, 8.0) and one["ratio"] == pytest.approx(0.8) and one["difference"] == pytest.approx(-2)
    assert rng["ours"] == (pytest.approx(-50.0), pytest.approx(-20.0))
    assert rng["ratio"] == pytest.approx(35 / 30)


def test_one_colour_per_policy_everywhere():
    from chipsim.analysis import plots

    colours = [plots.color_for(p) for p in ("no-prefetch", "promoe", "static-2", "static-4", "static-8", "apex",
                                            "apex-sf", "oracle", "spice")]
    assert len(set(colours)) == len(colours)
    assert plots.color_for("apex") == plots.POLICY_COLORS["apex"]


def test_every_assumption_in_thor_yaml_has_a_sensitivity_sweep():
    """Each thor.yaml key whose comment says ASSUMPTION is the grid key of some experiments/sensitivity_*.yaml."""
    import glob

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assumed = assumed_keys(os.path.join(root, "hwconfigs", "thor.yaml"))
    swept = set()
    # the arrays' cycle-level microarchitecture is swept one key at a time in one figure
    for path in glob.glob(os.path.join(root, "experiments", "sensitivity_*.yaml")) + [
            os.path.join(root, "experiments", "whatif_cycle_level_assumptions.yaml")]:
        with open(path) as f:
            swept.update((yaml.safe_load(f).get("grid") or {}).keys())
    assert len(assumed) >= 15
    assert sorted(set(assumed) - swept) == []


def test_every_assumption_of_the_cycle_level_chiplet_is_in_the_one_gain_figure():
    """thor.yaml's ASSUMPTIONs of the cycle-level model (the compute chiplet's microarchitecture) are each a panel
    of whatif_cycle_level_assumptions: APEX's gain over no-prefetch against it, one key at a time."""
    exp = ex.load_experiment(os.path.join(ROOT, "experiments", "whatif_cycle_level_assumptions.yaml"))
    cycle_level = {f"compute.{k}" for k in ("sram_read_bytes_per_cycle_per_array", "operand_tile_kib",
                                            "hbm_request_bytes", "outstanding_requests_per_array",
                                            "array_sync_cycles", "sfu_pipeline_cycles")}
    assumed = [k for k in assumed_keys(os.path.join(ROOT, "hwconfigs", "thor.yaml")) if k in cycle_level]
    assert len(assumed) == 6 and sorted(assumed) == sorted(exp["grid"]) == sorted(exp["plot"]["panels"])
    assert exp["grid_mode"] == "one_at_a_time" and exp["plot"]["baseline"] == "no-prefetch"


def test_every_assumption_of_the_jetson_soc_is_in_its_sensitivity_figure():
    """hwconfigs/jetson-thor.yaml's ASSUMPTIONs (no public Thor figure) are each a panel of
    whatif_jetson_assumptions: SPICE's EDP against no-prefetch's, one key at a time."""
    exp = ex.load_experiment(os.path.join(ROOT, "experiments", "whatif_jetson_assumptions.yaml"))
    assumed = assumed_keys(os.path.join(ROOT, "hwconfigs", "jetson-thor.yaml"))
    assert len(assumed) == 18 and sorted(assumed) == sorted(exp["grid"]) == sorted(exp["plot"]["panels"])


def test_every_assumption_of_the_phone_is_in_its_sensitivity_figure():
    """hwconfigs/phone-ufs.yaml's ASSUMPTIONs (the NPU, the powers, the NAND inside the UFS device, the driver's
    commands and queue) are each a panel of whatif_phone_assumptions, one key at a time."""
    exp = ex.load_experiment(os.path.join(ROOT, "experiments", "whatif_phone_assumptions.yaml"))
    assumed = assumed_keys(os.path.join(ROOT, "hwconfigs", "phone-ufs.yaml"))
    assert len(assumed) == 47 and sorted(assumed) == sorted(exp["grid"]) == sorted(exp["plot"]["panels"])
    assert exp["grid_mode"] == "one_at_a_time" and exp["plot"]["baseline"] == "no-prefetch"


def _assert_swept_one_at_a_time(gpu: str, count: int) -> None:
    """hwconfigs/<gpu>.yaml's ASSUMPTIONs are each a panel of whatif_<gpu>_assumptions, one key at a time."""
    exp = ex.load_experiment(os.path.join(ROOT, "experiments", f"whatif_{gpu}_assumptions.yaml"))
    assumed = assumed_keys(os.path.join(ROOT, "hwconfigs", f"{gpu}.yaml"))
    assert len(assumed) == count and sorted(assumed) == sorted(exp["grid"]) == sorted(exp["plot"]["panels"])
    assert exp["grid_mode"] == "one_at_a_time" and exp["plot"]["baseline"] == "no-prefetch"


def test_every_assumption_of_the_rtx3090_is_in_its_sensitivity_figure():
    """hwconfigs/rtx3090.yaml (FloE's GPU): the H200's stand-ins, GDDR6X's timings, the unnamed host, the buffer."""
    _assert_swept_one_at_a_time("rtx3090", 50)


def test_every_assumption_of_the_rtx4060_is_in_its_sensitivity_figure():
    """hwconfigs/rtx4060.yaml (SPICE's RTX 4060): the H200's stand-ins, GDDR6's refresh, the unnamed host."""
    _assert_swept_one_at_a_time("rtx4060", 44)


def test_every_assumption_of_the_rtx5090_is_in_its_sensitivity_figure():
    """hwconfigs/rtx5090.yaml (SPICE's RTX 5090): the H200's stand-ins, GDDR7's preset timings, the unnamed host."""
    _assert_swept_one_at_a_time("rtx5090", 49)


def test_every_assumption_of_the_a800_is_in_its_sensitivity_figure():
    """hwconfigs/a800.yaml (SPICE's A800): the H200's stand-ins, the 40/80 GB part, HBM2E's timings, the host."""
    _assert_swept_one_at_a_time("a800", 49)


def test_an_experiment_table_lists_every_policy_with_its_results_csv_values(tmp_path, capsys):
    import pandas as pd

    text = GOOD.format(config=os.path.join(ROOT, "hwconfigs", "thor.yaml")).replace(
        "policies: [no-prefetch]", "policies: [no-prefetch, oracle]") + (
        "table:\n"
        "  - {metric: fallback_rate, label: fallback rate, format: '{:.3f}'}\n"
        "  - {metric: offchip_bytes_per_token, label: traffic (MB), factor: 1.0e-6, format: '{:.2f}'}\n")
    (tmp_path / "tab.yaml").write_text(text)
    out, report = tmp_path / "out", tmp_path / "R.md"
    rc = cli.main(["reproduce", "tab", "--experiments", str(tmp_path), "--out", str(out), "--quiet",
                   "--jobs", "1", "--report", str(report)])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(out / "tab" / "results.csv")
    lines = report.read_text().splitlines()
    assert "| x (tokens) | policy | fallback rate | traffic (MB) |" in lines  # swept key, then the columns
    for _, r in df.iterrows():
        row = f"| 512 | `{r['policy']}` | {r['fallback_rate']:.3f} | {r['offchip_bytes_per_token'] * 1e-6:.2f} |"
        assert row in lines
    assert df.set_index("policy").loc["no-prefetch", "fallback_rate"] == 1.0  # nothing is there before routing


def test_fig14_axes_are_the_papers_raw_rates_and_thors_per_direction_flit_rate():
    """APEX Fig. 14 labels links by their raw both-direction rate (32…1024 GB/s); the grid is per direction after
    PCIe 6.0's FLIT overhead (236 of 256 bytes), and the top axis maps it back exactly; 118 GB/s is thor's link."""
    exp = ex.load_experiment(ex.find_experiment("apex_fig14", EXPERIMENTS))
    grid = exp["grid"]["links.pcie.bandwidth_gbps"]
    factor = exp["plot"]["secondary_x"]["factor"]
    assert [round(v * factor, 9) for v in grid] == [32, 64, 128, 256, 512, 1024]
    assert factor == pytest.approx(2 * 256 / 236, rel=1e-15) and 118 in grid


def test_a_one_at_a_time_grid_runs_each_key_on_its_own_and_draws_one_gain_panel_each(tmp_path, capsys):
    text = GOOD.format(config=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    text = text.replace("grid: {workload.context_length: [512]}", "grid: {dma.engines: [1, 2], links.pcie.latency_ns: [300, 600, 900]}")
    text = text.replace("policies: [no-prefetch]", "policies: [no-prefetch, apex]")
    text = text.replace("plot: {kind: line, x: workload.context_length, y: latency_ms_per_token, xlabel: x (tokens), ylabel: y (ms)}",
                        "grid_mode: one_at_a_time\nplot: {kind: gain, x: value, y: latency_ms_per_token, baseline: no-prefetch, "
                        "xlabel: [engines, latency (ns)], ylabel: change (%)}")
    (tmp_path / "oat.yaml").write_text(text)
    out, report = tmp_path / "out", tmp_path / "R.md"
    rc = cli.main(["reproduce", "oat", "--experiments", str(tmp_path), "--out", str(out), "--quiet", "--jobs", "1",
                   "--report", str(report)])
    assert rc == 0, capsys.readouterr().err
    assert (out / "oat" / "dma.engines" / "results.csv").is_file()
    assert (out / "oat" / "links.pcie.latency_ns" / "results.csv").is_file()
    assert (out / "oat" / "oat.png").stat().st_size > 10_000
    md = report.read_text()
    rows = [line for line in md.splitlines() if line.startswith("| dma.engines |") or line.startswith("| links.pcie")]
    assert len(rows) == 2 + 3  # one row per value of each key, not the 6 combinations
    assert "one parameter at a time: dma.engines 1 … 2" in md
    df, _ = ex.load_results(ex.saved_experiments(str(out))[0], str(out))
    assert sorted(set(df["parameter"])) == ["dma.engines", "links.pcie.latency_ns"] and len(df) == 2 * 5
