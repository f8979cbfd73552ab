"""REPRODUCTION.md: each experiment's figure and every paper number beside chipsim's, all read from the saved
results of `chipsim reproduce` (`chipsim plot DIR` rewrites it without simulating).

- `compare_rows`: an experiment's `compare` rows with chipsim's value filled in (a value, a range or a change);
- `sweep_table_lines`: the generated table of an experiment with no paper numbers (latency per policy and
  point, each policy's change against the baseline, one sentence on how far the gap moves);
- `metric_table_lines`: an experiment's optional per-policy `table`;
- `report_markdown`: the whole file.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from chipsim import __version__
from chipsim.analysis.experiments import load_results, select, sweeps
from chipsim.workload.op_table import apex_window, value_reaching_window, window_lines
from chipsim.errors import InputError
from chipsim.files import write_atomic
from chipsim.runner import code_sha256
from chipsim.sim.metrics import fill_batch_columns


# ---------------------------------------------------------------------------------------------- comparison
def compare_rows(exp: dict, df: pd.DataFrame, label: str | None = None) -> list[dict]:
    """Each `compare` row of the experiment with chipsim's value filled in from the results.

    metric M over the rows matching `where`; with `vs` ({column: value} replacing parts of `where`), the value
    is the change M(where) / M(where | vs) − 1 in %. Several matching rows give a range [min, max]. A row that
    cannot be filled is one line naming it (`label`: the experiment's file, else its name)."""
    out = []
    for i, row in enumerate(exp["compare"]):
        def fail(field, problem, i=i):
            return InputError(f"{label or exp['name']}: compare[{i}].{field}: {problem}")

        sel = select(df, row["where"])
        if sel.empty:
            raise fail("where", f"no result matches {row['where']}")
        if row["metric"] not in df.columns:
            raise fail("metric", f"no result column {row['metric']!r}")
        try:
            values = sel[row["metric"]].astype(float).to_numpy()
        except (TypeError, ValueError):
            raise fail("metric", f"column {row['metric']!r} holds something other than numbers") from None
        if row.get("vs"):
            keys = [c for c in df.columns if c in exp["grid"] or c == "config"]
            base = select(df, {**row["where"], **row["vs"]})
            changes = []
            for _, r in sel.iterrows():
                b = base
                for k in keys:
                    if k not in row["vs"]:  # (a baseline on another config or grid point names it in `vs`)
                        b = b[b[k] == r[k]]
                if b.empty:
                    raise fail("vs", f"no baseline row for {row['vs']}")
                if not float(b[row["metric"]].iloc[0]):
                    raise fail("vs", f"the baseline's {row['metric']} is 0: no change relative to it")
                changes.append((float(r[row["metric"]]) / float(b[row["metric"]].iloc[0]) - 1.0) * 100.0)
            values = changes
        ours = (min(values), max(values)) if len(values) > 1 else (float(values[0]),) * 2
        paper = row["paper"]
        paper_lo, paper_hi = (paper if isinstance(paper, list) else [paper, paper])
        p_mid, o_mid = (paper_lo + paper_hi) / 2, (ours[0] + ours[1]) / 2
        ratio = o_mid / p_mid if p_mid else float("nan")
        out.append({**row, "ours": ours, "paper_range": (float(paper_lo), float(paper_hi)), "ratio": ratio,
                    "difference": o_mid - p_mid})
    return out


def _window_section() -> list[str]:
    """The APEX-window table, and which swept ASSUMPTION of the cycle-level chiplet would open the window the
    paper's gain needs at 1,024 context (and at what value): every number computed here."""
    rows = apex_window(WINDOW_CONFIG_PATH, WINDOW_CONTEXTS)
    at = next(r for r in rows if r["context"] == 1024)
    lines = window_lines(rows) + [""]
    found = []
    for key, candidates in (("compute.outstanding_requests_per_array", range(16, 0, -1)),
                            ("compute.sram_read_bytes_per_cycle_per_array", (128, 64, 32, 16, 8)),
                            ("compute.operand_tile_kib", (4, 2, 1, 0.5, 0.25))):
        hit = value_reaching_window(WINDOW_CONFIG_PATH, key, candidates, at["needed_attention_us"], 1024)
        found.append(f"`{key}` at {hit[0]:g} ({hit[1]:.0f} µs)" if hit else f"`{key}` at none of {list(candidates)}")
    lines.append(f"Swept ASSUMPTIONs that would stretch a 1,024-context layer's attention to the {at['needed_attention_us']:.0f} "
                 f"µs needed: {'; '.join(found)}. Each slows every operation alike (the experts' compute and the LM "
                 "head too), so the token grows with the window: see whatif_cycle_level_assumptions for the gain "
                 "that results.")
    return lines


def _num(v: float) -> str:
    if v != v:
        return "n/a"
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    return f"{v:.3g}" if a >= 0.01 or a == 0 else f"{v:.2e}"


def _span(lo: float, hi: float) -> str:
    return _num(lo) if lo == hi else f"{_num(lo)} … {_num(hi)}"


def write_report(experiments: list[dict], out_dir: str, report_path: str) -> None:
    """Write REPRODUCTION.md for the saved results of `experiments` under out_dir (whole, or not at all)."""
    write_atomic(report_path, report_markdown(experiments, out_dir, report_path, {"code_sha256": code_sha256()}),
                 what="--report")


def report_markdown(experiments: list[dict], out_dir: str, report_path: str, meta: dict | None = None) -> str:
    """REPRODUCTION.md: per experiment, its figure and each paper number beside chipsim's, all filled from
    the saved results."""
    report_dir = os.path.dirname(os.path.abspath(report_path))
    lines = [
        "# Reproducing the papers with chipsim",
        "",
        "Written by `chipsim reproduce` from the saved results; every chipsim number below is read from the "
        "sweeps (`results.csv` / `sweep.json` under the output directory), none is typed by hand. The paper "
        "numbers are the papers' own (APEX, arXiv 2608.11688; SPICE, arXiv 2608.21240; FloE, ICML 2025, "
        "arXiv 2505.05950), each section naming the figure or table they come from. No parameter was tuned to close a gap; "
        "where a single parameter would, the row names it.",
        "",
        "ratio = chipsim / paper (midpoints of ranges); difference = chipsim − paper, in the row's unit. "
        "A '%' row is a change relative to the baseline it names (negative: lower).",
        "",
        "Figures (PNG and PDF) are written beside each experiment's results, `DIR/<name>/<name>.png`; the links "
        "below point there (the PNGs of results/reproduce are committed; `chipsim reproduce` or `chipsim plot DIR` "
        "writes both formats). Where the paper gives a "
        "value at a plotted point, the figure draws it on the same axes as a hollow marker in the colour of its "
        "policy or model (stacked bars: a hatched, unfilled bar beside chipsim's); a '%' row is drawn only where "
        "the figure is normalised to the very baseline it names.",
        "",
        f"chipsim {__version__}" + (f"; code sha256 {meta['code_sha256'][:12]}" if meta and meta.get("code_sha256") else ""),
        "",
        "Common causes of the gaps, referred to below:",
        "",
        "- **trace model**: routing comes from reduced-width models of each shape trained for minutes on one lent "
        "GPU (traces/README-real.md), not the released checkpoints; predictor quality (overlap, δ̂) follows "
        "from that routing.",
        "- **modelling choice**: on this first-principles platform a Granite-3B layer's attention takes ~20 µs "
        "against ~340 µs of expert loading over PCIe (the APEX window, below), so a prefetch issued before attention "
        "has almost nothing to hide behind (docs/findings.md, \"What the thor model finds\"); the paper's numbers imply ~12 ms "
        "of non-expert work per token that a roofline of its stated platform does not reproduce.",
        "- **parameter source**: energies per bit are the paper's (Table III); leakage, DMA setup and the host "
        "CPU are `# ASSUMPTION` parameters of hwconfigs/thor.yaml.",
        "",
        "### The APEX window, re-derived",
        "",
        f"From `{WINDOW_CONFIG}` (every operation from the cycle-level model of the compute chiplet; the analytic "
        f"model beside it), `chipsim calibrate {WINDOW_CONFIG} --window "
        f"{','.join(map(str, WINDOW_CONTEXTS))}` prints the same. No parameter was set to reach the paper's "
        "window.",
        "",
        *_window_section(),
        "",
    ]
    for exp in experiments:
        df, _ = load_results(exp, out_dir)
        lines += [f"## {exp['name']}: {exp['title']}", "", f"Paper: {exp['paper']}. Configs: "
                  + ", ".join(f"`{c}`" for c in exp["config_names"]) + "; policies: "
                  + ", ".join(f"`{p}`" for p in exp["policies"]) + "; overrides: "
                  + (", ".join(f"`{o}`" for o in exp["overrides"]) or "none") + ".", ""]
        if exp.get("notes"):
            lines += [exp["notes"].strip(), ""]
        fig = os.path.relpath(os.path.join(out_dir, exp["name"], f"{exp['name']}.png"), report_dir)
        lines += [f"Figure: [{fig}]({fig}) (and .pdf beside it).", ""]
        rows = compare_rows(exp, df)
        if rows:
            lines += ["| result | paper | chipsim | ratio | difference | why they differ |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for r in rows:
                unit = f" {r['unit']}" if r["unit"] else ""
                lines.append(f"| {r['what']} | {_span(*r['paper_range'])}{unit} | {_span(*r['ours'])}{unit} | "
                             f"{_num(r['ratio'])} | {_num(r['difference'])}{unit} | {' '.join(str(r['why']).split())} |")
            lines.append("")
        else:  # nothing from the paper to set beside: a table generated from the sweep instead
            lines += sweep_table_lines(exp, out_dir)
        if exp.get("table"):
            lines += metric_table_lines(exp, out_dir)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------- sweep tables
BASELINE_POLICY = "no-prefetch"
WINDOW_CONFIG = "hwconfigs/thor.yaml"  # the APEX window section: Granite-3B on the cycle-level chiplet
WINDOW_CONFIG_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                  WINDOW_CONFIG)
WINDOW_CONTEXTS = (512, 1024, 2048)
FOCUS_POLICY = "apex"
# metrics a sweep table shows: (column, header suffix, format); energy only where the plot draws it
LATENCY = ("latency_ms_per_token", "ms", "{:.3f}")
ENERGY = ("energy_mj_per_token", "mJ", "{:.1f}")


def load_csv_results(exp: dict, out_dir: str) -> pd.DataFrame:
    """Every results.csv row of an experiment's sweeps, with a `config` column (the config file's stem)."""
    frames = []
    for _, stem, directory, _, swept in sweeps(exp, out_dir):
        path = os.path.join(directory, "results.csv")
        if not os.path.isfile(path):
            raise InputError(f"{path}: missing; run chipsim reproduce {exp['name']}")
        frame = _read_results_csv(exp, path, [swept] if swept else list(exp["grid"])).assign(config=stem)
        if swept:  # one key at a time: which key, and its value
            frame = frame.assign(parameter=swept, value=frame[swept].astype(str))
        frames.append(frame)
    return fill_batch_columns(pd.concat(frames, ignore_index=True))


def _read_results_csv(exp: dict, path: str, keys: list[str]) -> pd.DataFrame:
    """One sweep's results.csv, checked for what REPRODUCTION.md reads from it (the policy, the swept keys, latency
    and energy per token, the table's metrics): an edited or foreign file is one line naming it."""
    again = f"run chipsim reproduce {exp['name']} again"
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:  # (pandas' parser errors and a file that is not text are ValueErrors)
        raise InputError(f"{path}: not a readable results table ({type(exc).__name__}); {again}") from None
    numbers = [LATENCY[0], ENERGY[0]] + [c["metric"] for c in exp.get("table") or []]
    for column in ["policy", *keys, *numbers]:
        if column not in frame.columns:
            raise InputError(f"{path}: no column {column!r} (not a results.csv chipsim wrote); {again}")
    for column in numbers:
        if not pd.api.types.is_numeric_dtype(frame[column]) or pd.api.types.is_bool_dtype(frame[column]):
            raise InputError(f"{path}: {column}: not a column of numbers; {again}")
    if not (frame[LATENCY[0]] > 0).all() or not np.isfinite(frame[LATENCY[0]]).all():
        raise InputError(f"{path}: {LATENCY[0]}: expected finite numbers above 0; {again}")
    return frame


def sweep_keys(exp: dict) -> list[str]:
    """The columns that tell one swept point from another: the config (when several) and the grid keys (or,
    one key at a time, which key and its value)."""
    if exp.get("grid_mode") == "one_at_a_time":
        return ["parameter", "value"]
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
    xlabel = exp["plot"]["xlabel"]
    return xlabel if key == exp["plot"].get("x") and isinstance(xlabel, str) else key


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
    if focus is not None and exp.get("grid_mode") == "one_at_a_time":
        lines += [_per_parameter_sentence(exp, t), ""]
    elif focus is not None:
        lines += [gap_sentence(exp, t), ""]
    return lines


def _per_parameter_sentence(exp: dict, t: dict) -> str:
    """One key at a time: over each key's values, how far the focus policy's latency change moves."""
    parts = []
    for key in exp["grid"]:
        points = [pt for pt in t["points"] if pt[0] == key]
        changes = [t["cells"][pt][("change", t["focus"])] for pt in points]
        parts.append(f"{key} {points[0][1]} … {points[-1][1]}: {changes[0]:+.2f} … {changes[-1]:+.2f} %")
    return f"{t['focus']} vs {t['base']}, latency per token, one parameter at a time: " + "; ".join(parts) + "."


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
