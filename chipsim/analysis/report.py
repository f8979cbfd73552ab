"""Human-readable table and machine-readable files (CSV, JSON) of a run's results, and the generated sweep tables
of REPRODUCTION.md (experiments with no paper numbers to set beside)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile

import pandas as pd

from chipsim.errors import InputError
from chipsim.hw.dram import dram_timing

# (column header, key, format) of the printed table
TABLE_COLUMNS = [
    ("policy", "policy", "{}"),
    ("lat ms", "latency_ms_per_token", "{:.3f}"),
    ("p99 ms", "latency_p99_ms", "{:.3f}"),
    ("stall ms", "stall_ms_per_token", "{:.3f}"),
    ("E mJ", "energy_mj_per_token", "{:.2f}"),
    ("on-chip", "energy_onchip_active_mj", "{:.2f}"),
    ("off-chip", "energy_offchip_io_mj", "{:.2f}"),
    ("idle", "energy_idle_leakage_mj", "{:.2f}"),
    ("PCIe", "energy_pcie_mj", "{:.2f}"),
    ("EDP mJ*ms", "edp_mj_ms", "{:.1f}"),
    ("off-chip MB", "offchip_bytes_per_token", "{:.1f}"),
    ("overlap", "overlap", "{:.3f}"),
]

# flat columns written to results.csv (and the keys every JSON row has)
CSV_COLUMNS = [
    "policy", "tokens", "latency_ms_per_token", "latency_p99_ms", "stall_ms_per_token",
    "energy_mj_per_token", "energy_onchip_active_mj", "energy_offchip_io_mj", "energy_idle_leakage_mj",
    "energy_host_cpu_mj", "energy_pcie_mj", "edp_mj_ms", "offchip_bytes_per_token", "pcie_utilization", "overlap",
    "recall", "fallback_rate", "demand_fetches_per_token", "prefetches_issued", "prefetches_dropped",
    "prefetches_unused", "fetches_total", "peak_buffer_slots", "host_experts_per_token", "host_wait_ms_per_token",
    "surrogate_experts_per_token", "substitutions_per_token", "dropped_experts_per_token", "warmup_tokens",
]


def header_lines(prep, fetch_path) -> list[str]:
    hw = prep.config.hw
    wl = prep.workload
    hbm = dram_timing(hw.memory.hbm)
    lp = dram_timing(hw.memory.lpddr5x)
    return [
        f"config: {prep.config.path}",
        f"trace:  {prep.trace.provenance_line()}",
        f"model:  {wl.model.name} ({wl.model.num_layers} layers, {wl.model.num_experts} experts top-{wl.model.top_k}), "
        f"experts at {wl.expert_bits} bit = {wl.expert_bytes / 1e6:.2f} MB each, context {wl.context_length}, "
        f"buffer {wl.buffer_slots} experts",
        f"path:   expert fetch LPDDR5X {lp.effective_gbps:.0f} -> PCIe {hw.links.pcie.bandwidth_gbps:g} per direction "
        f"({2 * hw.links.pcie.bandwidth_gbps:g} both) -> UCIe {hw.links.ucie.bandwidth_gbps:g} -> HBM {hbm.effective_gbps:.0f} GB/s; "
        f"bottleneck {fetch_path.bottleneck} {fetch_path.bandwidth_gbps:.1f} GB/s, latency {fetch_path.latency_ns:.0f} ns",
    ]


def format_table(rows: list[dict]) -> str:
    columns = list(TABLE_COLUMNS)
    if any(row.get("energy_host_cpu_mj") for row in rows):  # only policies that use the host CPU have it
        columns.insert(8, ("host", "energy_host_cpu_mj", "{:.2f}"))
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        line = []
        for _, key, fmt in columns:
            value = row[key]
            if key == "offchip_bytes_per_token":
                value = value / 1e6
            line.append(fmt.format(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for n, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# rates of a quality record (chipsim.trace.quality), in the order `quality_lines` prints them: key, text after
# the percentage; drop_rate only when non-zero
QUALITY_RATES = (
    ("substitution_rate", "of routed experts substituted"),
    ("drop_rate", "dropped"),
    ("deviation_rate", "of routed experts replaced by the pre-gate's choice"),
    ("surrogate_rate", "of routed experts replaced by surrogates (every low-confidence draft miss, SPICE cache "
                       "ignored: an upper bound)"),
)
def _quality_measured(label: str, mode: str | None, entry: dict, source: str) -> str:
    head = f"quality: {label}" + (f" ({mode})" if mode else "")
    if not all(isinstance(entry.get(k), (int, float)) for k in ("baseline_ppl", "ppl", "delta_ppl_pct")):
        return f"{head}: {json.dumps(entry, sort_keys=True)}; measured on the trace's model ({source})"
    parts = [f"held-out perplexity {entry['baseline_ppl']:.2f} -> {entry['ppl']:.2f} ({entry['delta_ppl_pct']:+.2f} %)"]
    for key, text in QUALITY_RATES:
        value = entry.get(key)
        if isinstance(value, (int, float)) and (key != "drop_rate" or value > 0):
            parts.append(f"{100 * value:.2f} % {text}")
    err = entry.get("heldout_relative_sq_error")
    if isinstance(err, (int, float)):
        parts.append(f"LoRE held-out relative squared error {err:.3f}")
    return f"{head}: {', '.join(parts)}; measured on the trace's model ({source})"


def quality_lines(rows: list[dict]) -> list[str]:
    """One line per policy whose run changes what the model computes: the held-out perplexity cost measured
    on the trace's model (meta['quality'], chipsim.trace.quality), or why it is not measured. Policies that
    compute every routed expert as routed print nothing."""
    lines = []
    for row in rows:
        mode = row.get("quality_mode")  # set by every approximating policy (chipsim.policies.base.quality_fields)
        if mode is None:
            continue
        label, entry, source = row["policy"], row.get("quality_cost"), row.get("quality_source", "")
        lines.append(_quality_measured(label, mode, entry, source) if isinstance(entry, dict)
                     else f"quality: {label} ({mode}): {source}")
    return lines


def json_rows(rows: list[dict], with_details: bool) -> list[dict]:
    if with_details:
        return rows
    return [{k: v for k, v in row.items() if k not in ("per_layer", "energy_by_component_mj", "warmup")} for row in rows]


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def csv_columns(rows: list[dict]) -> list[str]:
    """CSV_COLUMNS, then every other scalar field the rows carry (a policy's own metrics, e.g. APEX's
    mean_delta_hat or SPICE's counters, and quality_mode / quality_source), in order of first appearance; a
    field that is a list or mapping in any row (per-layer breakdowns, records) stays in the JSON only."""
    nested = {k for row in rows for k, v in row.items() if isinstance(v, (list, dict))}
    extra = {}
    for row in rows:
        extra.update((k, None) for k in row if k not in CSV_COLUMNS and k not in nested)
    return CSV_COLUMNS + list(extra)


def csv_cell(value) -> str:
    """A value as results.csv writes it: floats exactly (repr), None (a field this row lacks) empty."""
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def to_csv(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or csv_columns(rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([csv_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def write_outputs(out_dir: str, rows: list[dict], run_info: dict) -> None:
    """Write results.csv and results.json, each atomically (temporary file, then rename)."""
    os.makedirs(out_dir, exist_ok=True)
    files = {
        "results.csv": to_csv(rows),
        "results.json": to_json({"run": run_info, "results": rows}),
    }
    for name, text in files.items():
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(out_dir, name))


# ---------------------------------------------------------------------------------------------- sweep tables
BASELINE_POLICY = "no-prefetch"
FOCUS_POLICY = "apex"
# metrics a sweep table shows: (column, header suffix, format); energy only where the plot draws it
LATENCY = ("latency_ms_per_token", "ms", "{:.3f}")
ENERGY = ("energy_mj_per_token", "mJ", "{:.1f}")


def load_csv_results(exp: dict, out_dir: str) -> pd.DataFrame:
    """Every results.csv row of an experiment's sweeps, with a `config` column (the config file's stem)."""
    from chipsim.analysis.experiments import sweep_dirs

    frames = []
    for _, stem, directory in sweep_dirs(exp, out_dir):
        path = os.path.join(directory, "results.csv")
        if not os.path.isfile(path):
            raise InputError(f"{path}: missing; run chipsim reproduce {exp['name']}")
        frames.append(pd.read_csv(path).assign(config=stem))
    return pd.concat(frames, ignore_index=True)


def sweep_keys(exp: dict) -> list[str]:
    """The columns that tell one swept point from another: the config (when several) and the grid keys."""
    return (["config"] if len(exp["configs"]) > 1 else []) + list(exp["grid"])


def baseline_and_focus(policies: list[str]) -> tuple[str, str | None]:
    """The policy every change is relative to (no-prefetch, else the first) and the one the summary sentence
    follows (APEX, else the first other policy that is not the oracle bound)."""
    base = BASELINE_POLICY if BASELINE_POLICY in policies else policies[0]
    others = [p for p in policies if p != base]
    focus = FOCUS_POLICY if FOCUS_POLICY in others else next((p for p in others if p != "oracle"), None)
    return base, focus


def _unit(label: str) -> str:
    """'leakage per array (W)' -> 'W'."""
    m = re.search(r"\(([^()]*)\)\s*$", label)
    return m.group(1) if m else ""


def _key_header(exp: dict, key: str) -> str:
    return exp["plot"]["xlabel"] if key == exp["plot"].get("x") else key


def _point_text(exp: dict, keys: list[str], point: tuple) -> str:
    """A swept point in words, e.g. '0.25 W' or 'DMA engines 4'."""
    parts = []
    for key, value in zip(keys, point):
        text = f"{value:g}" if isinstance(value, float) else str(value)
        header = _key_header(exp, key)
        unit = _unit(header)
        parts.append(f"{text} {unit}" if unit else (text if key == "config" else f"{header} {text}"))
    return ", ".join(parts) or "the one point"


def _change_pct(value: float, base: float) -> float:
    return (value / base - 1.0) * 100.0


def sweep_table(exp: dict, df: pd.DataFrame) -> dict:
    """One row per swept point: latency (and energy, where plotted) of each policy and each policy's latency
    change vs the baseline. Returns {keys, points, policies, base, focus, metrics, cells}, cells[point][name]."""
    keys = sweep_keys(exp)
    policies = list(dict.fromkeys(df["policy"]))  # the labels results.csv carries, in run order
    base, focus = baseline_and_focus(policies)
    metrics = [LATENCY] + ([ENERGY] if ENERGY[0] in exp["plot"]["y"] else [])
    points = list(dict.fromkeys(tuple(r) for r in df[keys].itertuples(index=False))) if keys else [()]
    cells = {}
    for point in points:
        sel = df
        for key, value in zip(keys, point):
            sel = sel[sel[key] == value]
        row = {}
        for col, _, _ in metrics:
            for p in policies:
                match = sel[sel["policy"] == p]
                row[(col, p)] = float(match[col].iloc[0]) if not match.empty else float("nan")
        lat = LATENCY[0]
        for p in policies:
            if p != base:
                row[("change", p)] = _change_pct(row[(lat, p)], row[(lat, base)])
        cells[point] = row
    return {"keys": keys, "points": points, "policies": policies, "base": base, "focus": focus,
            "metrics": metrics, "cells": cells}


def _cell(fmt: str, v: float) -> str:
    return "n/a" if v != v else fmt.format(v)


def sweep_table_lines(exp: dict, out_dir: str) -> list[str]:
    """REPRODUCTION.md lines of an experiment with no paper numbers: the generated table and one sentence on
    how far the focus policy's latency gap to the baseline moves over the sweep; every number from results.csv."""
    t = sweep_table(exp, load_csv_results(exp, out_dir))
    base, focus, policies = t["base"], t["focus"], t["policies"]
    others = [p for p in policies if p != base]
    header = [_key_header(exp, k) for k in t["keys"]] or ["point"]
    header += [f"{p} {suffix}" for col, suffix, _ in t["metrics"][:1] for p in policies]
    header += [f"{p} vs {base}" for p in others]
    header += [f"{p} {suffix}" for col, suffix, _ in t["metrics"][1:] for p in policies]
    lines = [f"No paper numbers to set beside this one; chipsim's values from `results.csv`: latency per token "
             f"(ms){' and energy per token (mJ)' if len(t['metrics']) > 1 else ''} of each policy, and each "
             f"policy's latency change vs `{base}` at the same point.", "",
             "| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    (lat, _, lat_fmt), energy = t["metrics"][0], t["metrics"][1:]
    for point in t["points"]:
        c = t["cells"][point]
        row = [f"{v:g}" if isinstance(v, float) else str(v) for v in point] or ["-"]
        row += [_cell(lat_fmt, c[(lat, p)]) for p in policies]
        row += [_cell("{:+.2f} %", c[("change", p)]) for p in others]
        row += [_cell(fmt, c[(col, p)]) for col, _, fmt in energy for p in policies]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if focus is not None:
        lines += [gap_sentence(exp, t), ""]
    return lines


def metric_table_lines(exp: dict, out_dir: str) -> list[str]:
    """REPRODUCTION.md lines of an experiment's `table`: one row per swept point and policy (policies named as
    in the figure's legend), one column per listed metric, every number from results.csv."""
    df = load_csv_results(exp, out_dir)
    keys = sweep_keys(exp)
    labels = exp["plot"].get("series_labels") or {}
    columns = exp["table"]
    header = [_key_header(exp, k) for k in keys] + ["policy"] + [c["label"] for c in columns]
    lines = ["Per policy, from `results.csv`:", "", "| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    for _, r in df.iterrows():
        row = [f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]) for k in keys]
        row.append(f"{labels[r['policy']]} (`{r['policy']}`)" if r["policy"] in labels else f"`{r['policy']}`")
        row += [_cell(c["format"], float(r[c["metric"]]) * c["factor"]) for c in columns]
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def _moves(exp: dict, t: dict, values: list[float]) -> str:
    """'-5.18 % at 0.25 W … -5.20 % at 4 W (range -5.20 … -5.18 % over the 5 points)'."""
    keys, points = t["keys"], t["points"]
    first = f"{values[0]:+.2f} % at {_point_text(exp, keys, points[0])}"
    if len(points) == 1:
        return first
    return (f"{first} … {values[-1]:+.2f} % at {_point_text(exp, keys, points[-1])} "
            f"(range {min(values):+.2f} … {max(values):+.2f} % over the {len(points)} points)")


def gap_sentence(exp: dict, t: dict) -> str:
    """How far the focus policy's gap to the baseline moves over the sweep: latency, and energy where plotted."""
    focus, base = t["focus"], t["base"]
    lat = [t["cells"][p][("change", focus)] for p in t["points"]]
    text = f"{focus} vs {base}: latency per token {_moves(exp, t, lat)}"
    if len(t["metrics"]) > 1:
        col = t["metrics"][1][0]
        energy = [_change_pct(t["cells"][p][(col, focus)], t["cells"][p][(col, base)]) for p in t["points"]]
        text += f"; energy per token {_moves(exp, t, energy)}"
    return text + "."
