"""Paper-style figures of experiment results (matplotlib, Agg): one PNG and one PDF per experiment.

Every figure uses the same colour for a policy (POLICY_COLORS) and for a model config (CONFIG_COLORS); the
files' metadata are fixed, so the same results give the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from chipsim.analysis.experiments import load_results, select  # noqa: E402

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
}
_FALLBACK = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354", "#756bb1"]
STACK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]
MARKERS = "osD^v<>ph*"

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
    if plot.get("xscale") == "log2":
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()
    sec = plot.get("secondary_x")
    if sec:
        f = float(sec.get("factor", 1))
        top = ax.secondary_xaxis("top", functions=(lambda x, f=f: x * f, lambda x, f=f: x / f))
        top.set_xlabel(sec.get("label", ""))
        if plot.get("xscale") == "log2":
            top.set_xscale("log", base=2)
            top.set_xticks([x * f for x in xs])
            top.set_xticklabels([f"{x * f:g}" for x in xs])
            top.minorticks_off()


def _legend(ax, handles=None, labels=None):
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)


def _draw_per_layer(fig, exp, df, rows):
    plot = exp["plot"]
    field = plot["y"][0]
    ax = fig.add_subplot(1, 1, 1)
    where = plot["where"]
    series = plot["series"]
    keep = set(select(df, where).index)
    chosen = [r for i, r in enumerate(rows) if i in keep]
    for i, name in enumerate(_series_order([r[series] for r in chosen], plot)):
        r = next(r for r in chosen if r[series] == name)
        values = r.get("per_layer", {}).get(field)
        if values is None:
            continue
        layers = np.arange(1, len(values) + 1)
        ax.plot(layers, values, marker=MARKERS[i % len(MARKERS)], markersize=3, linewidth=1.2,
                color=color_for(name), label=_label(plot, name))
    ax.set_xlabel(plot["xlabel"])
    ax.set_ylabel(plot["ylabel"][0])
    if plot.get("ylim"):
        ax.set_ylim(*plot["ylim"])
    _legend(ax)


def _draw_line(fig, exp, df, rows):
    plot = exp["plot"]
    sel = select(df, plot["where"])
    ys = plot["y"]
    series = plot["series"]
    for p, (y, ylabel) in enumerate(zip(ys, plot["ylabel"])):
        ax = fig.add_subplot(1, len(ys), p + 1)
        xs_all = sorted(set(sel[plot["x"]].tolist()))
        for i, name in enumerate(_series_order(sel[series].tolist(), plot)):
            s = sel[sel[series] == name].sort_values(plot["x"])
            ax.plot(s[plot["x"]], s[y], marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.3,
                    color=color_for(name), label=_label(plot, name))
            if plot.get("annotate"):
                for _, r in s.iterrows():
                    ax.annotate(f"{r[plot['annotate']]:g}", (r[plot["x"]], r[y]), textcoords="offset points",
                                xytext=(3, -9), fontsize=6, color=color_for(name))
        if plot.get("xscale") == "log2" or plot.get("secondary_x"):
            _x_axis(ax, plot, xs_all)
        ax.set_xlabel(plot["xlabel"])
        ax.set_ylabel(ylabel)
        if plot.get("ylim"):
            ax.set_ylim(*plot["ylim"])
        if p == len(ys) - 1:
            _legend(ax)


def _draw_bar(fig, exp, df, rows):
    plot = exp["plot"]
    sel = select(df, plot["where"]).copy()
    norm = plot.get("normalize")
    ys = plot["y"]
    series = plot["series"]
    cats = _series_order(sel[plot["x"]].tolist(), plot)
    names = _series_order(sel[series].tolist(), plot)
    width = 0.8 / max(1, len(names))
    for p, (y, ylabel) in enumerate(zip(ys, plot["ylabel"])):
        ax = fig.add_subplot(1, len(ys), p + 1)
        for i, name in enumerate(names):
            heights = []
            for c in cats:
                r = sel[(sel[plot["x"]] == c) & (sel[series] == name)]
                v = float(r[y].iloc[0]) if not r.empty else np.nan
                if norm and not r.empty:
                    b = sel[(sel[plot["x"]] == c) & (sel[norm["column"]] == norm["value"])]
                    v = v / float(b[y].iloc[0]) if not b.empty else np.nan
                heights.append(v)
            pos = np.arange(len(cats)) + (i - (len(names) - 1) / 2) * width
            ax.bar(pos, heights, width=width * 0.95, color=color_for(name), label=_label(plot, name))
        ax.set_xticks(np.arange(len(cats)))
        ax.set_xticklabels([_label(plot, c) for c in cats], rotation=0 if len(cats) < 5 else 20)
        ax.set_xlabel(plot["xlabel"])
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)
        if norm:
            ax.axhline(1.0, color="#000000", linewidth=0.6, linestyle="--")
        if plot.get("ylim"):
            ax.set_ylim(*plot["ylim"])
        if p == len(ys) - 1:
            _legend(ax)


def _draw_stacked(fig, exp, df, rows):
    plot = exp["plot"]
    sel = select(df, plot["where"])
    ax = fig.add_subplot(1, 1, 1)
    cats = _series_order(sel[plot["x"]].tolist(), plot)
    bottom = np.zeros(len(cats))
    for i, (col, label) in enumerate(plot["stack"].items()):
        h = np.array([float(sel[sel[plot["x"]] == c][col].iloc[0]) for c in cats])
        if not h.any():
            continue  # e.g. host CPU energy of policies that never use it
        ax.bar(np.arange(len(cats)), h, bottom=bottom, width=0.6, color=STACK_COLORS[i % len(STACK_COLORS)],
               label=label, edgecolor=[color_for(c) for c in cats], linewidth=1.5)
        bottom += h
    for j, total in enumerate(bottom):
        ax.text(j, total, f"{total:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(np.arange(len(cats)))
    ax.set_xticklabels([_label(plot, c) for c in cats])
    for tick, c in zip(ax.get_xticklabels(), cats):
        tick.set_color(color_for(c))
    ax.set_xlabel(plot["xlabel"])
    ax.set_ylabel(plot["ylabel"][0])
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, max(bottom) * 1.12 if len(bottom) else 1)
    handles, labels = ax.get_legend_handles_labels()
    _legend(ax, handles[::-1], labels[::-1])


DRAW = {"per_layer": _draw_per_layer, "line": _draw_line, "bar": _draw_bar, "stacked_bar": _draw_stacked}


def draw(exp: dict, out_dir: str) -> list[str]:
    """Draw one experiment from its saved results; returns the PNG and PDF paths."""
    df, rows = load_results(exp, out_dir)
    plot = exp["plot"]
    _style()
    panels = len(plot["y"]) if plot["kind"] in ("line", "bar") else 1
    width = 3.6 * panels + 0.6 if panels > 1 else 5.2
    fig = plt.figure(figsize=(width, 3.3))
    try:
        DRAW[plot["kind"]](fig, exp, df, rows)
        title = plot.get("title") or f"{exp['title']} ({exp['paper']})"
        fig.suptitle(textwrap.fill(title, width=int(width * 15)), fontsize=9)
        fig.tight_layout()
        base = os.path.join(out_dir, exp["name"], exp["name"])
        fig.savefig(base + ".png", metadata=PNG_METADATA, bbox_inches="tight")  # legends sit outside the axes
        fig.savefig(base + ".pdf", metadata=PDF_METADATA, bbox_inches="tight")
    finally:
        plt.close(fig)
    return [base + ".png", base + ".pdf"]
