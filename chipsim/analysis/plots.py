"""Paper-style figures of experiment results (matplotlib, Agg): one PNG and one PDF per experiment.

Every figure uses the same colour for a policy (POLICY_COLORS) and for a model config (CONFIG_COLORS); the
files' metadata are fixed, so the same results give the same bytes. The paper's own values, where an
experiment gives them at a plotted position (`paper_points`), are drawn on the same axes as hollow markers
(stacked bars: a hatched, unfilled bar beside chipsim's) in the colour of the policy or model they belong to.
"""

from __future__ import annotations

import hashlib
import math
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import patheffects, ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from chipsim.analysis.experiments import load_results, select  # noqa: E402
from chipsim.errors import InputError  # noqa: E402
from chipsim.files import write_atomic  # noqa: E402

# one fixed colour per policy, in every figure
POLICY_COLORS = {
    "no-prefetch": "#4d4d4d",
    "promoe": "#1f77b4",
    "static-1": "#fdd0a2",
    "static-2": "#fdae6b",
    "static-4": "#fd8d3c",
    "static-8": "#d94801",
    "apex": "#d62728",
    "apex-sf": "#e377c2",
    "oracle": "#2ca02c",
    "pregated": "#9467bd",
    "lru": "#8c564b",
    "lfu": "#c49c94",
    "adapmoe": "#17becf",
    "fiddler": "#bcbd22",
    "floe": "#7f7f7f",
    "spice": "#6a3d9a",
    "spice:deep=true,cpu_fallback=false,surrogate=false,schedule=false": "#a6cee3",
    "spice:deep=true,cpu_fallback=true,surrogate=false,schedule=false": "#b2df8a",
    "spice:deep=false,cpu_fallback=true,surrogate=false,schedule=false": "#fb9a99",
    "spice:deep=false,cpu_fallback=false,surrogate=false,schedule=true": "#fdbf6f",
}
CONFIG_COLORS = {
    "thor-granite-1b": "#66c2a5",
    "thor": "#fc8d62",
    "thor-phi-mini-moe": "#8da0cb",
    "thor-deepseek-v2-lite": "#e78ac3",
}
CONFIG_NAMES = {
    "thor-granite-1b": "Granite-1B",
    "thor": "Granite-3B",
    "thor-phi-mini-moe": "Phi-mini-MoE",
    "thor-deepseek-v2-lite": "DeepSeek-V2-Lite",
    # the 2025-26 shapes (SYNTHETIC traces: the asterisk)
    "thor-olmoe-1b-7b-0125": "OLMoE-0125*",
    "thor-granite-4.0-h-tiny": "Granite-4.0-H*",
    "thor-moonlight-16b-a3b": "Moonlight*",
    "thor-gpt-oss-20b": "gpt-oss-20b",  # (a trained trace)
    "thor-ernie-4.5-21b-a3b": "ERNIE-4.5*",
    "thor-qwen3-30b-a3b": "Qwen3-30B*",
    "thor-phi-3.5-moe": "Phi-3.5-MoE*",
}
_FALLBACK = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354", "#756bb1"]
STACK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]
MARKERS = "osD^v<>ph*"

PAPER_LABEL = "paper (hollow)"
PAPER_BAR_LABEL = "paper (hatched)"

PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


def color_for(name) -> str:
    name = str(name)
    if name in POLICY_COLORS:
        return POLICY_COLORS[name]
    if name in CONFIG_COLORS:
        return CONFIG_COLORS[name]
    base = name.split(":")[0]
    if base in POLICY_COLORS:  # a variant (e.g. floe:compression=4.0): its family's colour, lightened
        r, g, b = (int(POLICY_COLORS[base][i:i + 2], 16) for i in (1, 3, 5))
        return "#{:02x}{:02x}{:02x}".format(*(int(c + (255 - c) * 0.5) for c in (r, g, b)))
    return _FALLBACK[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(_FALLBACK)]


def _label(plot: dict, value) -> str:
    labels = plot.get("series_labels") or {}
    if str(value) in labels:
        return str(labels[str(value)])
    return CONFIG_NAMES.get(str(value), str(value))


def _style():
    plt.rcParams.update({
        "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
        "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "savefig.dpi": 200,
        "pdf.fonttype": 42, "svg.hashsalt": "chipsim",
    })


def _series_order(values, plot) -> list:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def _x_axis(ax, plot, xs):
    """Log x axes tick at the swept values; secondary_x adds the same positions in other units on top."""
    scale = plot.get("xscale", "linear")
    if scale in ("log2", "log"):
        ax.set_xscale("log", base=2 if scale == "log2" else 10)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()
    sec = plot.get("secondary_x")
    if sec:
        f = float(sec.get("factor", 1))
        top = ax.secondary_xaxis("top", functions=(lambda x, f=f: x * f, lambda x, f=f: x / f))
        top.set_xlabel(sec.get("label", ""))
        if scale in ("log2", "log"):
            top.set_xscale("log", base=2 if scale == "log2" else 10)
            top.set_xticks([x * f for x in xs])
            top.set_xticklabels([f"{x * f:g}" for x in xs])
            top.minorticks_off()


def _legend(ax, handles=None, extra=()):
    """Legend outside the axes, right; `extra` handles (e.g. the paper marker) go last."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    handles = list(handles) + list(extra)
    ax.legend(handles, [h.get_label() for h in handles], frameon=False, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=7)


# ---------------------------------------------------------------------------------------------- paper values
def _single(exp: dict, column: str):
    """The one value a column takes in every result of the experiment, if it does (one config: its stem)."""
    if column == "config" and len(exp["configs"]) == 1:
        return exp["config_names"][0]
    return None


def _compare_point(exp: dict, row: dict) -> dict | None:
    """A compare row as a point on the figure, or None where it has no plotted position.

    Drawn: an absolute paper value of a plotted metric at a plotted (series, x). A relative row ('vs') is
    drawn only where the plot is normalised to the very baseline it names: there it is the plotted ratio."""
    plot = exp["plot"]
    if not row.get("draw", True):
        return None
    kind, where = plot["kind"], row["where"]
    metrics = set(plot["y"]) | set(plot.get("stack") or {}) | ({plot["total"]} if plot.get("total") else set())
    if row["metric"] not in metrics:
        return None
    lo, hi = (row["paper"] if isinstance(row["paper"], list) else [row["paper"]] * 2)
    if row.get("vs"):
        norm = plot.get("normalize")
        if not norm or row["vs"] != {norm["column"]: norm["value"]}:
            return None
        lo, hi = 1 + lo / 100.0, 1 + hi / 100.0
    x = where.get(plot["x"], _single(exp, plot["x"]))
    series = None if kind == "stacked_bar" else where.get(plot["series"], _single(exp, plot["series"]))
    if kind != "stacked_bar" and series is None:
        return None
    if x is None and kind != "per_layer":  # per_layer: a value over all layers is a level across the plot
        return None
    for key, value in where.items():  # any other condition must be one the plot fixes too
        if key not in (plot["x"], plot["series"]) and plot["where"].get(key) != value:
            return None
    return {"series": series, "x": x, "metric": row["metric"], "lo": float(lo), "hi": float(hi)}


def paper_points(exp: dict) -> list[dict]:
    """Every paper value to draw: from the compare rows that place one, then the experiment's paper_points."""
    out = [p for p in (_compare_point(exp, r) for r in exp.get("compare") or []) if p is not None]
    for pt in exp.get("paper_points") or []:
        v = pt["value"]
        lo, hi = (v if isinstance(v, list) else [v, v])
        out.append({"series": pt["series"], "x": pt["x"], "metric": pt["metric"], "lo": float(lo), "hi": float(hi)})
    return out


def _hollow(ax, x, lo, hi, color, marker="o", size=7, halo=False):
    """One paper value: a hollow marker, or a range drawn as a bar between two of them. halo: outlined in
    black, for markers that sit on a bar of their own colour."""
    effects = [patheffects.withStroke(linewidth=3.2, foreground="#000000")] if halo else []
    style = dict(marker=marker, markersize=size, markerfacecolor="white", markeredgecolor=color,
                 markeredgewidth=1.6, linestyle="none", zorder=5, path_effects=effects)
    if hi != lo:
        ax.plot([x, x], [lo, hi], color=color, linewidth=1.4, zorder=4, path_effects=effects)
        ax.plot([x, x], [lo, hi], **style)
    else:
        ax.plot([x], [lo], **style)


def _paper_handle() -> Line2D:
    return Line2D([], [], marker="o", markersize=7, markerfacecolor="white", markeredgecolor="#333333",
                  markeredgewidth=1.6, linestyle="none", label=PAPER_LABEL)


def _yfactor(plot: dict, y: str) -> float:
    factors = plot.get("yfactor") or [1.0] * len(plot["y"])
    return factors[plot["y"].index(y)] if y in plot["y"] else 1.0


def _minor_log_label(v, _pos) -> str:
    """Label the 2× and 5× minor ticks of a log axis only, so that they do not crowd."""
    if v <= 0:
        return ""
    mantissa = round(v / 10 ** np.floor(np.log10(v)), 6)
    return f"{v:g}" if mantissa in (2.0, 5.0) else ""


def _y_axis(ax, plot, ylabel):
    ax.set_ylabel(ylabel)
    if plot.get("yscale") == "log":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 20, not 2×10¹
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(_minor_log_label))
    if plot.get("ylim"):
        ax.set_ylim(*plot["ylim"])


def _title(exp: dict) -> str:
    plot = exp["plot"]
    if plot.get("title"):
        return plot["title"]
    if exp["paper"].lower().startswith("none"):  # a chipsim-only sweep: no paper to name
        return exp["title"]
    return f"{exp['title']} ({exp['paper']})"


# ---------------------------------------------------------------------------------------------- drawing
def _draw_per_layer(fig, exp, df, rows):
    plot = exp["plot"]
    field = plot["y"][0]
    ax = fig.add_subplot(1, 1, 1)
    series = plot["series"]
    keep = set(select(df, plot["where"]).index)
    chosen = [r for i, r in enumerate(rows) if i in keep]
    names = _series_order([r[series] for r in chosen], plot)
    n_layers = 0
    for i, name in enumerate(names):
        r = next(r for r in chosen if r[series] == name)
        values = r.get("per_layer", {}).get(field)
        if values is None:
            continue
        n_layers = max(n_layers, len(values))
        layers = np.arange(1, len(values) + 1)
        ax.plot(layers, values, marker=MARKERS[i % len(MARKERS)], markersize=3, linewidth=1.2,
                color=color_for(name), label=_label(plot, name))
    points = [p for p in paper_points(exp) if p["metric"] == field]
    for p in points:  # a paper value over all layers (x None): a dotted level of hollow markers
        layers = np.arange(1, n_layers + 1) if p["x"] is None else np.array([p["x"]])
        color = color_for(p["series"])
        ax.plot(layers, [p["lo"]] * len(layers), linestyle=":", linewidth=1.0, color=color, zorder=4)
        for x in layers[::4] if p["x"] is None else layers:
            _hollow(ax, x, p["lo"], p["hi"], color, size=6)
    ax.set_xlabel(plot["xlabel"])
    _y_axis(ax, plot, plot["ylabel"][0])
    _legend(ax, extra=[_paper_handle()] if points else [])


def _draw_line_paper(ax, plot, points, names):
    """Paper values of one panel, per series: hollow markers in the series' colour and marker, joined by a
    dotted line where the paper gives several (e.g. one model at three τ)."""
    for series in _series_order([p["series"] for p in points], plot):
        pts = sorted((p for p in points if p["series"] == series), key=lambda p: p["x"])
        i = names.index(series) if series in names else 0
        color, marker = color_for(series), MARKERS[i % len(MARKERS)]
        if len(pts) > 1:
            ax.plot([p["x"] for p in pts], [(p["lo"] + p["hi"]) / 2 for p in pts], linestyle=":", linewidth=1.0,
                    color=color, zorder=4)
        for p in pts:
            _hollow(ax, p["x"], p["lo"], p["hi"], color, marker=marker)


def _draw_line(fig, exp, df, rows):
    plot = exp["plot"]
    sel = select(df, plot["where"])
    series = plot["series"]
    names = _series_order(sel[series].tolist(), plot)
    points = paper_points(exp)
    for n, (y, ylabel) in enumerate(zip(plot["y"], plot["ylabel"])):
        ax = fig.add_subplot(*_panel_grid(plot), n + 1)
        f = _yfactor(plot, y)
        xs_all = sorted(set(sel[plot["x"]].tolist()))
        for i, name in enumerate(names):
            s = sel[sel[series] == name].sort_values(plot["x"])
            ax.plot(s[plot["x"]], s[y] * f, marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.3,
                    color=color_for(name), label=_label(plot, name))
            if plot.get("annotate"):
                only = plot.get("annotate_only")
                for _, r in s.iterrows():
                    if only is not None and not any(math.isclose(r[plot["annotate"]], v) for v in only):
                        continue
                    ax.annotate(f"{r[plot['annotate']]:g}", (r[plot["x"]], r[y] * f), textcoords="offset points",
                                xytext=(3, -9), fontsize=6, color=color_for(name))
        mine = [dict(p, lo=p["lo"] * f, hi=p["hi"] * f) for p in points if p["metric"] == y]
        _draw_line_paper(ax, plot, mine, names)
        if plot.get("xscale", "linear") != "linear" or plot.get("secondary_x"):
            _x_axis(ax, plot, xs_all)
        ax.set_xlabel(plot["xlabel"])
        _y_axis(ax, plot, ylabel)
        if n == _legend_panel(plot):
            _legend(ax, extra=[_paper_handle()] if points else [])


def _bar_heights(sel, plot, y, cats, name) -> list[float]:
    """One series' bar heights per category, normalised to the `normalize` row of the category if asked."""
    norm, series = plot.get("normalize"), plot["series"]
    heights = []
    for c in cats:
        r = sel[(sel[plot["x"]] == c) & (sel[series] == name)]
        v = float(r[y].iloc[0]) if not r.empty else np.nan
        if norm and not r.empty:
            b = sel[(sel[plot["x"]] == c) & (sel[norm["column"]] == norm["value"])]
            v = v / float(b[y].iloc[0]) if not b.empty else np.nan
        heights.append(v)
    return heights


def _draw_bar(fig, exp, df, rows):
    plot = exp["plot"]
    sel = select(df, plot["where"]).copy()
    series = plot["series"]
    cats = _series_order(sel[plot["x"]].tolist(), plot)
    names = _series_order(sel[series].tolist(), plot)
    width = 0.8 / max(1, len(names))
    points = paper_points(exp)

    def pos(i):  # centres of series i's bars
        return np.arange(len(cats)) + (i - (len(names) - 1) / 2) * width

    for n, (y, ylabel) in enumerate(zip(plot["y"], plot["ylabel"])):
        ax = fig.add_subplot(*_panel_grid(plot), n + 1)
        f = _yfactor(plot, y)
        for i, name in enumerate(names):
            ax.bar(pos(i), np.array(_bar_heights(sel, plot, y, cats, name)) * f, width=width * 0.95,
                   color=color_for(name), label=_label(plot, name))
        for p in points:
            if p["metric"] == y and p["series"] in names and p["x"] in cats:
                x = pos(names.index(p["series"]))[cats.index(p["x"])]
                _hollow(ax, x, p["lo"] * f, p["hi"] * f, color_for(p["series"]), halo=True)
        ax.set_xticks(np.arange(len(cats)))
        ax.set_xticklabels([_label(plot, c) for c in cats])
        ax.set_xlabel(plot["xlabel"])
        ax.grid(axis="x", visible=False)
        if plot.get("normalize"):
            ax.axhline(1.0, color="#000000", linewidth=0.6, linestyle="--")
        _y_axis(ax, plot, ylabel)
        if n == _legend_panel(plot):
            _legend(ax, extra=[_paper_handle()] if points else [])


def _draw_stacked(fig, exp, df, rows):
    """Stacked components per category; where the paper gives them, its stack stands beside, unfilled and
    hatched, with its total above."""
    plot = exp["plot"]
    sel = select(df, plot["where"])
    ax = fig.add_subplot(1, 1, 1)
    cats = _series_order(sel[plot["x"]].tolist(), plot)
    points = paper_points(exp)
    paper = {(p["x"], p["metric"]): p["lo"] for p in points}  # Table V gives single values
    has_paper = [any((c, col) in paper for col in plot["stack"]) for c in cats]
    offset = np.where(has_paper, -0.19, 0.0)  # chipsim's bar moves left where the paper's stands beside
    width = np.where(has_paper, 0.36, 0.6)
    bottom, paper_bottom = np.zeros(len(cats)), np.zeros(len(cats))
    for i, (col, label) in enumerate(plot["stack"].items()):
        color = STACK_COLORS[i % len(STACK_COLORS)]
        h = np.array([float(sel[sel[plot["x"]] == c][col].iloc[0]) for c in cats])
        ph = np.array([paper.get((c, col), 0.0) for c in cats])
        if h.any():  # e.g. host CPU energy of policies that never use it
            ax.bar(np.arange(len(cats)) + offset, h, bottom=bottom, width=width, color=color, label=label,
                   edgecolor=[color_for(c) for c in cats], linewidth=1.5)
        if ph.any():
            ax.bar(np.arange(len(cats)) - offset, ph, bottom=paper_bottom, width=width, facecolor="none",
                   edgecolor=color, hatch="////", linewidth=1.2)
        bottom += h
        paper_bottom += ph
    total = plot.get("total")
    for j, c in enumerate(cats):
        mine = float(sel[sel[plot["x"]] == c][total].iloc[0]) if total else bottom[j]
        ax.text(j + offset[j], bottom[j], f"{mine:.0f}", ha="center", va="bottom", fontsize=8)
        if has_paper[j]:
            theirs = paper.get((c, total), paper_bottom[j])
            ax.text(j - offset[j], paper_bottom[j], f"{theirs:.0f}", ha="center", va="bottom", fontsize=8,
                    color="#555555")
    ax.set_xticks(np.arange(len(cats)))
    ax.set_xticklabels([_label(plot, c) for c in cats])
    for tick, c in zip(ax.get_xticklabels(), cats):
        tick.set_color(color_for(c))
    ax.set_xlabel(plot["xlabel"] + ("  (left: chipsim, right: paper)" if any(has_paper) else ""))
    ax.set_ylabel(plot["ylabel"][0])
    ax.grid(axis="x", visible=False)
    top = max(list(bottom) + list(paper_bottom)) if len(cats) else 1.0
    ax.set_ylim(0, top * 1.12)
    handles, _ = ax.get_legend_handles_labels()
    paper_patch = Patch(facecolor="none", edgecolor="#555555", hatch="////", label=PAPER_BAR_LABEL)
    extra = [paper_patch] if any(has_paper) else []
    _legend(ax, handles[::-1], extra)


def _draw_gain(fig, exp, df, rows):
    """One panel per parameter swept on its own: each series' change of y against plot.baseline at each value,
    in %, negative = faster (a gain); the config's own value is the point every panel shares."""
    plot = exp["plot"]
    y = plot["y"][0]
    sel = select(df, plot["where"])
    series = plot["series"]
    base = plot["baseline"]
    names = [n for n in _series_order(sel[series].tolist(), plot) if n != base]
    for n, (key, xlabel) in enumerate(zip(plot["panels"], plot["xlabel"])):
        ax = fig.add_subplot(*_panel_grid(plot), n + 1)
        part = sel[sel["parameter"] == key]
        values = list(dict.fromkeys(part["value"].tolist()))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        order = sorted(values) if numeric else values
        xs = order if numeric else list(range(len(order)))
        b = {r["value"]: r[y] for _, r in part[part[series] == base].iterrows()}
        for i, name in enumerate(names):
            mine = {r["value"]: r[y] for _, r in part[part[series] == name].iterrows()}
            gains = [100.0 * (mine[v] / b[v] - 1.0) for v in order]
            ax.plot(xs, gains, marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.3, color=color_for(name),
                    label=_label(plot, name))
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        if numeric and len(order) > 2 and all(v > 0 for v in order) and max(order) / min(order) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks(order, [f"{v:g}" for v in order])
        elif not numeric:
            ax.set_xticks(xs, [str(v) for v in order])
        ax.set_xlabel(xlabel)
        if n % _panel_grid(plot)[1] == 0:
            ax.set_ylabel(plot["ylabel"][0])
        if n == _legend_panel(plot):
            _legend(ax)


DRAW = {"per_layer": _draw_per_layer, "line": _draw_line, "bar": _draw_bar, "stacked_bar": _draw_stacked,
        "gain": _draw_gain}


def _panel_grid(plot: dict) -> tuple[int, int]:
    """(rows, columns) of a line or bar figure's panels: side by side up to three, then two rows (a gain
    figure: one panel per key swept)."""
    if plot["kind"] == "gain":
        n = len(plot["panels"])
    else:
        n = len(plot["y"]) if plot["kind"] in ("line", "bar") else 1
    return (1, n) if n <= 3 else (2, math.ceil(n / 2))


def _legend_panel(plot: dict) -> int:
    """Index of the panel that carries the legend: the last of the first row (top right)."""
    return _panel_grid(plot)[1] - 1


def _width_in(exp: dict, df) -> float:
    """Figure width (inches): panels side by side, each wide enough for its bars' category labels."""
    plot = exp["plot"]
    panels = _panel_grid(plot)[1]
    panel = 3.6
    if plot["kind"] == "bar":
        sel = select(df, plot["where"])
        bars = sel[plot["x"]].nunique() * sel[plot["series"]].nunique()
        panel = max(panel, 0.25 * bars + 1.0)
    return panel * panels + 0.6 if panels > 1 or panel > 3.6 else 5.2


def check(exp: dict, df, rows: list[dict], label: str) -> None:
    """Before any figure is drawn: the plot has something to draw where experiments.check_results cannot tell (a
    blank figure is refused): a per_layer plot's field in the rows it selects, a normalised bar's baseline beside
    every bar, a gain plot's baseline in every panel. `label` names the file the experiment came from."""
    plot, kind = exp["plot"], exp["plot"]["kind"]
    sel = select(df, plot["where"])
    if kind == "per_layer":
        field = plot["y"][0]
        chosen = [rows[i] for i in sel.index]
        if not any(isinstance(r.get("per_layer"), dict) and isinstance(r["per_layer"].get(field), list)
                   for r in chosen):
            raise InputError(f"{label}: plot.y: no result the plot selects has the per-layer field {field!r}")
    norm = plot.get("normalize")
    if kind == "bar" and norm:
        for c in _series_order(sel[plot["x"]].tolist(), plot):
            if sel[(sel[plot["x"]] == c) & (sel[norm["column"]] == norm["value"])].empty:
                raise InputError(f"{label}: plot.normalize: no result with {norm['column']} = {norm['value']!r} at "
                                 f"{plot['x']} = {c!r} to divide by")
    if kind == "gain":
        for key in plot["panels"]:
            part = sel[sel["parameter"] == key]
            if part[part[plot["series"]] == plot["baseline"]].empty:
                raise InputError(f"{label}: plot.baseline: no result of {plot['baseline']!r} in the {key} panel")


def draw(exp: dict, out_dir: str) -> list[str]:
    """Draw one experiment from its saved results; returns the PNG and PDF paths, each written whole or not at
    all."""
    df, rows = load_results(exp, out_dir)
    plot = exp["plot"]
    _style()
    width = _width_in(exp, df)
    fig = plt.figure(figsize=(width, 3.3 * _panel_grid(plot)[0]))
    try:
        DRAW[plot["kind"]](fig, exp, df, rows)
        title = _title(exp)
        fig.suptitle(textwrap.fill(title, width=int(width * 15)), fontsize=9)
        fig.tight_layout()
        base = os.path.join(out_dir, exp["name"], exp["name"])
        for ext, metadata in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):  # legends sit outside the axes
            write_atomic(f"{base}.{ext}", lambda fh, ext=ext, metadata=metadata: fig.savefig(
                fh, format=ext, metadata=metadata, bbox_inches="tight"), what="--out")
    finally:
        plt.close(fig)
    return [base + ".png", base + ".pdf"]
