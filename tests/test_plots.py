"""Paper values on the figures (hollow markers, hatched bars) and the generated sweep tables of REPRODUCTION.md.

The drawing tests feed made-up results to the drawing functions and read back what landed on the axes, so
they need no simulation and no trace."""

import json
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from chipsim.analysis import experiments as ex
from chipsim.analysis import plots
from chipsim.analysis import reproduction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")


def load(name: str) -> dict:
    return ex.load_experiment(ex.find_experiment(name, EXPERIMENTS))


def key(p: dict) -> tuple:
    return (p["series"], p["x"], p["metric"], round(p["lo"], 6), round(p["hi"], 6))


# ---------------------------------------------------------------------------------------------- which values
def test_absolute_compare_rows_at_a_plotted_point_become_paper_points_relative_ones_do_not():
    points = {key(p) for p in plots.paper_points(load("apex_fig12"))}
    assert points == {
        ("apex", 512, "latency_ms_per_token", 11.41, 11.41),
        ("no-prefetch", 512, "latency_ms_per_token", 19.77, 19.77),
        ("promoe", 512, "latency_ms_per_token", 15.39, 15.39),
        ("apex", 512, "energy_mj_per_token", 287.3, 287.3),
    }  # the six '%' rows (vs no-prefetch / ProMoE) are not drawn


def test_a_relative_row_is_drawn_only_where_the_plot_is_normalised_to_its_baseline():
    # Fig. 13 divides EDP by no-prefetch's: "-42 … -36 % vs no-prefetch" is the plotted 0.58 … 0.64;
    # the rows vs ProMoE have no place on that axis
    points = {key(p) for p in plots.paper_points(load("apex_fig13"))}
    assert points == {("apex", "thor-granite-1b", "edp_mj_ms", 0.58, 0.64),
                      ("apex", "thor-phi-mini-moe", "edp_mj_ms", 0.51, 0.52)}


def test_draw_false_keeps_a_row_off_the_figure_and_rows_sit_at_their_swept_x():
    exp = load("spice_ablation")
    points = plots.paper_points(exp)
    assert [key(p) for p in points] == [  # the '%' rows (vs full SPICE, AdapMoE, naive) are not drawn
        ("spice", 3200, "fallback_rate", 0.03, 0.03),
        ("adapmoe", 3200, "fallback_rate", 0.061, 0.061),
        ("spice", 3200, "pcie_utilization", 0.82, 0.91),
        ("adapmoe", 3200, "pcie_utilization", 0.38, 0.45),
        ("lru", 3200, "pcie_utilization", 0.21, 0.27),
        ("no-prefetch", 3200, "pcie_utilization", 0.15, 0.2),
    ]
    assert any(r["metric"] == "latency_ms_per_token" and r["draw"] is False for r in exp["compare"])


def test_a_row_without_the_x_key_takes_the_one_config_of_a_single_config_experiment():
    exp = load("apex_table5")  # one config (thor); drawn here against the config as x
    exp["plot"] = dict(exp["plot"], kind="bar", x="config", y=["energy_pcie_mj"], ylabel=["PCIe (mJ)"])
    points = plots.paper_points(exp)
    assert ("no-prefetch", "thor", "energy_pcie_mj", 48.0, 48.0) in [key(p) for p in points]


def test_per_layer_mean_is_a_level_and_fig9_points_carry_the_papers_own_x():
    assert [key(p) for p in plots.paper_points(load("apex_fig8"))] == [("apex", None, "overlap", 0.981, 0.981)]
    fig9 = plots.paper_points(load("apex_fig9"))
    assert len(fig9) == 12 and {p["series"] for p in fig9} == {"thor-granite-1b", "thor", "thor-phi-mini-moe",
                                                               "thor-deepseek-v2-lite"}
    assert ("thor", 2.86, "overlap", 0.981, 0.981) in {key(p) for p in fig9}


def test_experiments_without_paper_numbers_draw_none():
    for name in ("apex_fig14", "apex_fig15", "floe_compare", "sensitivity_leakage"):
        assert plots.paper_points(load(name)) == []


# ---------------------------------------------------------------------------------------------- drawn markers
def hollow_markers(ax) -> list[tuple[str, float, float]]:
    """(edge colour, x, y) of every paper marker (white face) on the axes."""
    out = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "None", "") or to_hex(line.get_markerfacecolor()) != "#ffffff":
            continue
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            out.append((to_hex(line.get_markeredgecolor()), float(x), float(y)))
    return out


def legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def fake_fig12() -> pd.DataFrame:
    rows = []
    for i, policy in enumerate(["no-prefetch", "promoe", "static-4", "static-8", "apex", "apex-sf", "oracle"]):
        for ctx in (512, 1024, 2048):
            rows.append({"config": "thor", "workload.context_length": ctx, "policy": policy,
                         "latency_ms_per_token": 12.0 - i * 0.2, "energy_mj_per_token": 360.0 - i})
    return pd.DataFrame(rows)


def test_line_plot_draws_hollow_markers_at_the_yaml_values_in_the_policys_colour():
    exp = load("apex_fig12")
    fig = plt.figure()
    try:
        plots._draw_line(fig, exp, fake_fig12(), [])
        latency, energy = fig.axes
        assert set(hollow_markers(latency)) == {(plots.color_for("apex"), 512.0, 11.41),
                                                (plots.color_for("no-prefetch"), 512.0, 19.77),
                                                (plots.color_for("promoe"), 512.0, 15.39)}
        assert hollow_markers(energy) == [(plots.color_for("apex"), 512.0, 287.3)]
        assert plots.PAPER_LABEL in legend_texts(fig)
    finally:
        plt.close(fig)


def test_no_paper_legend_entry_where_nothing_is_drawn():
    exp = dict(load("apex_fig12"), compare=[], paper_points=[])
    fig = plt.figure()
    try:
        plots._draw_line(fig, exp, fake_fig12(), [])
        assert all(not hollow_markers(ax) for ax in fig.axes)
        assert plots.PAPER_LABEL not in legend_texts(fig)
    finally:
        plt.close(fig)


def test_normalised_bar_plot_draws_the_range_on_the_policys_bar():
    exp = load("apex_fig13")
    policies = exp["policies"]
    df = pd.DataFrame([{"config": c, "policy": p, "edp_mj_ms": 100.0 - 5 * i}
                       for c in exp["config_names"] for i, p in enumerate(policies)])
    fig = plt.figure()
    try:
        plots._draw_bar(fig, exp, df, [])
        ax = fig.axes[0]
        apex = plots.color_for("apex")
        width = 0.8 / len(policies)
        x_apex_g1b = 0 + (policies.index("apex") - (len(policies) - 1) / 2) * width  # Granite-1B: category 0
        marks = [(round(x, 6), round(y, 6)) for c, x, y in hollow_markers(ax) if c == apex]
        assert (round(x_apex_g1b, 6), 0.58) in marks and (round(x_apex_g1b, 6), 0.64) in marks
        heights = sorted(round(p.get_height(), 6) for p in ax.patches)
        assert heights[-1] == 1.0  # no-prefetch normalised to itself
    finally:
        plt.close(fig)


def test_a_figure_with_nothing_to_draw_is_refused_in_one_line_naming_the_field():
    """What only the results tell (plots.check, run before any figure is drawn): a normalised bar with no baseline
    row at one of its bars, a per_layer plot whose rows lack its field, a gain plot without its baseline."""
    from chipsim.errors import InputError

    exp = load("apex_fig13")
    df = pd.DataFrame([{"config": c, "policy": p, "edp_mj_ms": 1.0} for c in exp["config_names"]
                       for p in exp["policies"] if not (c == exp["config_names"][1] and p == "no-prefetch")])
    with pytest.raises(InputError, match=r"^fig13.yaml: plot.normalize: no result with policy = 'no-prefetch' at "
                                         rf"config = '{exp['config_names'][1]}'"):
        plots.check(exp, df, [], "fig13.yaml")
    exp = load("apex_fig8")
    df = pd.DataFrame([{"policy": p} for p in exp["policies"]])
    rows = [{"policy": p, "per_layer": {"recall": [1.0]}} for p in exp["policies"]]
    with pytest.raises(InputError, match="^fig8.yaml: plot.y: no result the plot selects has the per-layer field"):
        plots.check(exp, df, rows, "fig8.yaml")
    exp = load("sensitivity_dram_queue")
    key = exp["plot"]["panels"][0]
    df = pd.DataFrame([{"parameter": key, "value": 1, "policy": "apex", "latency_ms_per_token": 1.0}])
    with pytest.raises(InputError, match=f"^q.yaml: plot.baseline: no result of 'no-prefetch' in the {key} panel"):
        plots.check(exp, df, [{}], "q.yaml")


def test_yfactor_scales_bars_and_paper_values_alike():
    exp = load("spice_ablation")
    df = pd.DataFrame([{"config": "thor-deepseek-v2-lite", "expert_buffer.capacity_mib": mib, "policy": p,
                        "latency_ms_per_token": 20.0, "fallback_rate": 0.2, "offchip_bytes_per_token": 2.5e9,
                        "pcie_utilization": 0.9} for mib in (1056, 3200) for p in exp["policies"]])
    fig = plt.figure()
    try:
        plots._draw_bar(fig, exp, df, [])
        tpot, fallback, traffic, util = fig.axes
        # four panels: two rows of two, the legend on the top-right one
        assert [ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes] == [(2, 2)] * 4
        assert fallback.get_legend() is not None and util.get_legend() is None
        assert {round(p.get_height(), 9) for p in traffic.patches} == {2.5}  # bytes drawn as GB
        assert sorted(round(y, 6) for _, _, y in hollow_markers(fallback)) == [0.03, 0.061]
        assert not hollow_markers(fig.axes[0])  # the TPOT row has draw: false
    finally:
        plt.close(fig)


def test_stacked_bar_draws_the_papers_components_hatched_beside_and_its_total():
    exp = load("apex_table5")
    stack = list(exp["plot"]["stack"])
    df = pd.DataFrame([{"config": "thor", "policy": p, **{c: 10.0 * (j + 1) for j, c in enumerate(stack)},
                        "energy_mj_per_token": 60.0} for p in exp["policies"]])
    fig = plt.figure()
    try:
        plots._draw_stacked(fig, exp, df, [])
        ax = fig.axes[0]
        hatched = [p for p in ax.patches if p.get_hatch()]
        paper = {(r["where"]["policy"], r["metric"]): r["paper"] for r in exp["compare"] if r["metric"] in stack}
        for j, policy in enumerate(exp["policies"]):
            mine = sorted((p for p in hatched if abs(p.get_x() + p.get_width() / 2 - (j + 0.19)) < 1e-6),
                          key=lambda p: p.get_y())
            assert [p.get_height() for p in mine] == [paper[(policy, c)] for c in stack if (policy, c) in paper]
        texts = {t.get_text() for t in ax.texts}
        assert {"340", "299", "377"} <= texts  # the paper's stated totals (Table V), not sums of rounded rows
        assert plots.PAPER_BAR_LABEL in legend_texts(fig)
    finally:
        plt.close(fig)


def test_per_layer_paper_level_is_drawn_at_the_papers_mean():
    exp = load("apex_fig8")
    df = pd.DataFrame([{"config": "thor", "policy": p} for p in exp["policies"]])
    rows = [{"policy": p, "per_layer": {"overlap": list(np.linspace(0.5, 0.9, 8))}} for p in exp["policies"]]
    fig = plt.figure()
    try:
        plots._draw_per_layer(fig, exp, df, rows)
        marks = hollow_markers(fig.axes[0])
        assert marks and {(c, y) for c, _, y in marks} == {(plots.color_for("apex"), 0.981)}
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------- sweep tables
def fake_sweep(exp: dict, out_dir: str, seed: int = 0) -> pd.DataFrame:
    """results.csv and sweep.json of a one-key, one-config experiment, with made-up numbers."""
    (key_name, values), = exp["grid"].items()
    rng = np.random.default_rng(seed)
    rows = [{key_name: v, "point_id": i, "policy": p, "latency_ms_per_token": float(rng.uniform(5, 20)),
             "energy_mj_per_token": float(rng.uniform(200, 500))}
            for i, v in enumerate(values) for p in exp["policies"]]
    df = pd.DataFrame(rows)
    directory = os.path.join(out_dir, exp["name"])
    os.makedirs(directory)
    df.to_csv(os.path.join(directory, "results.csv"), index=False)
    results = [{"values": {key_name: r[key_name]}, **{k: v for k, v in r.items() if k != key_name}} for r in rows]
    with open(os.path.join(directory, "sweep.json"), "w") as f:
        json.dump({"results": results}, f)
    return df


def table_rows(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    table = [line for line in lines if line.startswith("| ")]
    split = [[c.strip() for c in line.strip("| ").split(" | ")] for line in table]
    return split[0], split[2:]


@pytest.mark.parametrize("name", ["sensitivity_leakage", "sensitivity_dma_engines", "sensitivity_host_cpu_bandwidth"])
def test_sensitivity_table_has_one_row_per_grid_value_with_the_csvs_numbers(tmp_path, name):
    exp = load(name)
    df = fake_sweep(exp, str(tmp_path))
    (key_name, values), = exp["grid"].items()
    policies = exp["policies"]
    base = "no-prefetch"
    header, rows = table_rows(reproduction.sweep_table_lines(exp, str(tmp_path)))
    assert header[0] == exp["plot"]["xlabel"]
    assert len(rows) == len(values)
    for value, row in zip(values, rows):
        at = df[df[key_name] == value].set_index("policy")
        assert float(row[0]) == pytest.approx(value)
        cells = dict(zip(header, row))
        for p in policies:
            assert cells[f"{p} ms"] == f"{at.loc[p, 'latency_ms_per_token']:.3f}"
            assert cells[f"{p} mJ"] == f"{at.loc[p, 'energy_mj_per_token']:.1f}"  # energy is plotted
        for p in policies:
            if p != base:
                change = (at.loc[p, "latency_ms_per_token"] / at.loc[base, "latency_ms_per_token"] - 1) * 100
                assert cells[f"{p} vs {base}"] == f"{change:+.2f} %"


def test_gap_sentence_names_the_first_and_last_value_and_the_range(tmp_path):
    exp = load("sensitivity_leakage")
    df = fake_sweep(exp, str(tmp_path), seed=3)
    lines = reproduction.sweep_table_lines(exp, str(tmp_path))
    sentence = [line for line in lines if line.startswith("apex vs no-prefetch:")]
    assert len(sentence) == 1
    key_name = "compute.leakage_power_w_per_array"
    lat = df.pivot(index=key_name, columns="policy", values="latency_ms_per_token")
    changes = (lat["apex"] / lat["no-prefetch"] - 1) * 100
    assert f"{changes.iloc[0]:+.2f} % at 0.25 W … {changes.iloc[-1]:+.2f} % at 4 W" in sentence[0]
    assert f"range {changes.min():+.2f} … {changes.max():+.2f} % over the 5 points" in sentence[0]
    assert "energy per token" in sentence[0]  # the plot shows energy


def test_baseline_and_focus_policies():
    assert reproduction.baseline_and_focus(["no-prefetch", "promoe", "apex", "oracle"]) == ("no-prefetch", "apex")
    assert reproduction.baseline_and_focus(["no-prefetch", "spice", "fiddler", "oracle"]) == ("no-prefetch", "spice")
    assert reproduction.baseline_and_focus(["lru", "oracle"]) == ("lru", None)


def test_report_prints_the_sweep_table_for_an_experiment_without_paper_numbers(tmp_path):
    exp = load("sensitivity_dma_engines")
    fake_sweep(exp, str(tmp_path))
    text = reproduction.report_markdown([exp], str(tmp_path), str(tmp_path / "REPRODUCTION.md"))
    assert "figure only" not in text
    section = text.split("## sensitivity_dma_engines", 1)[1]  # after the front matter (the APEX window's table)
    header, rows = table_rows(section.splitlines())
    assert header[0] == "DMA engines" and [r[0] for r in rows] == ["1", "2", "4", "8"]
    assert "apex vs no-prefetch: latency per token" in text
