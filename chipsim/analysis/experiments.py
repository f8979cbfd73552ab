"""Experiments: one YAML file per paper figure or table (`experiments/*.yaml`), run as sweeps and drawn.

An experiment file names

    name:      the file's stem (a figure/table id, e.g. apex_fig12)
    title:     one line, what it reproduces
    paper:     which figure or table of which paper
    config:    a hardware config (path relative to the experiment file), or a list of them (one sweep each;
               the results get a `config` column = the config file's stem)
    grid:      {dotted config key: [values]} swept as in `chipsim sweep` (may be empty)
    grid_mode: product (default: every combination of the grid's values) or one_at_a_time (each key swept on its
               own around the config's values, into DIR/<name>/<key>/; the results get `parameter` = the key
               and `value` = its value)
    policies:  policy specs, as for `chipsim run --policy`
    overrides: `--set` strings applied at every point (workload.max_tokens: 1024 for the papers' figures, as
               `chipsim run` replays; 256 for the sensitivity sweeps)
    plot:      what to draw (see PLOT_KEYS; `chipsim.analysis.plots` draws it)
    compare:   optional rows set beside the paper's numbers in REPRODUCTION.md (see COMPARE_KEYS); a row that
               gives an absolute paper value at a plotted position is also drawn on the figure (hollow marker)
    paper_points: optional paper values to draw that no compare row places (see PAPER_POINT_KEYS), e.g. a
               point whose x is itself a paper number (APEX Fig. 9: overlap against the paper's mean δ̂)
    table:     optional columns (see TABLE_KEYS) of a per-policy table written into REPRODUCTION.md below the
               comparison, one row per swept point and policy (e.g. fallback rate and host-link traffic)

`load_experiment` checks all of that (one-line `InputError`s) before anything runs; `run_experiment` runs the
sweeps into DIR/<name>/ (one config) or DIR/<name>/<config stem>/ (several) and saves the resolved experiment
as DIR/<name>/experiment.json, so that `chipsim plot DIR` redraws from DIR alone. `load_results` reads the saved
rows back; chipsim.analysis.reproduction writes REPRODUCTION.md from them and chipsim.analysis.plots draws them.
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pandas as pd
import yaml

from chipsim.analysis.columns import all_columns
from chipsim.analysis.report import CSV_COLUMNS
from chipsim.serve.metrics import SERVED_COLUMNS
from chipsim.sim.metrics import (BATCH_COLUMNS, PER_LAYER_FIELDS, REQUEST_COLUMNS, SPECULATIVE_COLUMNS,
                                 UNION_COLUMN, fill_batch_columns)
from chipsim.analysis.sweep import fill_cache, run_sweep
from chipsim.errors import InputError
from chipsim.files import GIB, JSON_MAX_BYTES, YAML_MAX_BYTES, read_input_text, write_atomic
from chipsim.hw.config import load_config, parse_set, yaml_text
from chipsim.values import YamlLimitError, yaml_load
from chipsim.policies import REGISTRY
from chipsim.policies.base import SHORTHANDS, split_request_spec

EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               "experiments")

TOP_KEYS = ("name", "title", "paper", "config", "grid", "grid_mode", "policies", "overrides", "plot", "compare",
            "paper_points", "table", "notes")
GRID_MODES = ("product", "one_at_a_time")
# a sweep.json chipsim wrote, read back by `chipsim plot`: every row with its per-layer arrays (a 1,000-point grid
# of seven policies is tens of MB); far beyond that it is not one of ours
SWEEP_RECORD_MAX_BYTES = 1 * GIB
REQUIRED = ("title", "paper", "config", "policies", "plot")
PLOT_KINDS = ("per_layer", "line", "bar", "stacked_bar", "gain")
PLOT_KEYS = (
    "kind",          # per_layer | line | bar | stacked_bar | gain (one_at_a_time grids: one panel per key, each
                     # series' change of y vs plot.baseline in %; xlabel: one label per grid key)
    "baseline",      # gain: the policy the others' change is relative to
    "x",             # column on the x axis (per_layer: the layer index; stacked_bar: the category column)
    "y",             # column, or list of columns (one panel each); per_layer: a per_layer field
    "series",        # column whose values are the lines / bar groups (default: policy)
    "where",         # {column: value} rows to draw (e.g. one context of a grid)
    "xlabel", "ylabel",  # axis labels with units (ylabel: a string, or a list matching y)
    "title",
    "xscale",        # linear | log2 | log (base 10); ticks at the swept values
    "yscale",        # linear | log
    "yfactor",       # number, or list matching y: y (and paper values) × this before drawing (e.g. 1e-9: B -> GB)
    "secondary_x",   # {label: ..., factor: F}: a second x axis above, at F × x (e.g. both-direction PCIe)
    "annotate",      # column whose value is written beside each point (e.g. τ)
    "annotate_only", # list: write only these values of the annotate column (keeps crowded curves readable)
    "normalize",     # {column: C, value: V}: divide y by the row with C == V at the same x (and series key)
    "stack",         # stacked_bar: {column: label}, bottom first
    "total",         # stacked_bar: column written above each bar (default: the sum of the stack)
    "series_labels", # {series value: legend text}
    "ylim",
)
COMPARE_KEYS = ("what", "paper", "unit", "metric", "where", "vs", "why",
                "draw")  # draw: false keeps a row off the figure (e.g. a value on another platform's scale)
PAPER_POINT_KEYS = ("series", "x", "metric", "value")  # value: a number or [low, high], in the plotted units
TABLE_KEYS = ("metric", "label", "factor", "format")  # label with its unit; value × factor, written with format
# plot options only some kinds draw: given to another kind they would be ignored without a word
KIND_OPTIONS = {"normalize": ("bar",), "stack": ("stacked_bar",), "total": ("stacked_bar",), "annotate": ("line",),
                "annotate_only": ("line",), "secondary_x": ("line",), "xscale": ("line",), "baseline": ("gain",),
                "yfactor": ("line", "bar"), "yscale": ("line", "bar", "per_layer"),
                "ylim": ("line", "bar", "per_layer")}
# result columns that hold words: never a number to draw, compare or tabulate
WORD_COLUMNS = ("policy", "config", "parameter", "expert_link", "quality_mode", "quality_source", "floe_note",
                "spice_surrogate")


# ---------------------------------------------------------------------------------------------- loading
def _err(path: str, msg: str) -> InputError:
    return InputError(f"{path}: {msg}")


def find_experiment(name: str, directory: str | None = None) -> str:
    """NAME (a stem in `directory`, default experiments/) or a path to a .yaml file -> its path."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        if not os.path.exists(name):  # anything else than a regular file is refused by the read (load_experiment)
            raise InputError(f"{name}: no such experiment file")
        return name
    directory = directory or EXPERIMENTS_DIR
    path = os.path.join(directory, f"{name}.yaml")
    if not os.path.isfile(path):
        known = ", ".join(list_experiments(directory)) or "none"
        raise InputError(f"experiment {name}: not found in {directory} (known: {known})")
    return path


def list_experiments(directory: str | None = None) -> list[str]:
    directory = directory or EXPERIMENTS_DIR
    if not os.path.isdir(directory):
        return []
    return sorted(f[:-5] for f in os.listdir(directory) if f.endswith(".yaml") and not f.startswith("."))


def _check_key(path: str, config: str, key: str, value, overrides: list[str]) -> None:
    """A grid key must be a config key the config accepts (load_config checks the schema; policy params are
    checked against the policy registry)."""
    parts = key.split(".")
    if parts[0] == "policies":
        if len(parts) != 3:
            raise _err(path, f"grid key {key}: expected policies.<policy>.<parameter>")
        name, param = parts[1], parts[2]
        cls = REGISTRY.get(name)
        if cls is None and name != "static":
            raise _err(path, f"grid key {key}: unknown policy '{name}' (chipsim policies lists them)")
        if cls is not None and param not in cls.param_specs():
            raise _err(path, f"grid key {key}: policy {name} has no parameter '{param}' "
                             f"(expected one of: {', '.join(cls.param_specs())})")
    try:
        parse_set(f"{key}={yaml_text(key, value)}")
        load_config(config, [*overrides, f"{key}={yaml_text(key, value)}"])
    except InputError as exc:
        raise _err(path, f"grid {key}={value!r}: {exc}") from None


def _check_overrides(path: str, config_paths: list[str], overrides, grid: dict) -> None:
    """The overrides are KEY=VALUE strings each config accepts, alone or with the grid's first point where that
    completes them (a request's output tokens need the prompt its grid sweeps)."""
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise _err(path, "overrides: expected a list of KEY=VALUE strings")
    first_point = [f"{k}={yaml_text(k, v[0])}" for k, v in grid.items() if isinstance(k, str) and isinstance(v, list)
                   and v and k.split(".")[0] != "policies"]
    for cp in config_paths:
        try:
            load_config(cp, overrides)
        except InputError as exc:
            try:
                load_config(cp, [*overrides, *first_point])
            except InputError:
                raise _err(path, f"overrides: {exc}") from None


def _read_yaml(path: str) -> dict:
    text = read_input_text(path, "experiment", YAML_MAX_BYTES)
    try:
        raw = yaml_load(text)
    except YamlLimitError as exc:
        mark = exc.problem_mark
        raise InputError(f"{path}: {exc.problem}" + (f" (line {mark.line + 1})" if mark else "")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise _err(path, "expected a mapping of experiment keys")
    return raw


def load_experiment(path: str) -> dict:
    """Read and check an experiment file; returns the resolved experiment (config paths made absolute)."""
    raw = _read_yaml(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise _err(path, f"unknown key '{unknown[0]}' (expected one of: {', '.join(TOP_KEYS)})")
    for key in REQUIRED:
        if key not in raw:
            raise _err(path, f"missing key '{key}'")
    name = raw.get("name", stem)
    if name != stem:
        raise _err(path, f"name '{name}' differs from the file name '{stem}'")
    for key in ("title", "paper", "notes"):
        if key in raw and not isinstance(raw[key], str):
            raise _err(path, f"{key}: expected a string")
    base = os.path.dirname(os.path.abspath(path))
    configs = raw["config"] if isinstance(raw["config"], list) else [raw["config"]]
    if not configs or not all(isinstance(c, str) and c for c in configs):
        raise _err(path, "config: expected a config path or a list of them")
    config_paths = []
    for c in configs:
        p = os.path.normpath(os.path.join(base, c))
        if not os.path.exists(p):
            raise _err(path, f"config {c}: no such file")
        if not os.path.isfile(p):
            raise _err(path, f"config {c}: not a regular file")
        config_paths.append(p)
    stems = [os.path.splitext(os.path.basename(p))[0] for p in config_paths]
    if len(set(stems)) != len(stems):
        raise _err(path, "config: two configs with the same file name")
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise _err(path, "grid: expected a mapping {dotted.key: [values]}")
    overrides = raw.get("overrides") or []
    _check_overrides(path, config_paths, overrides, grid)
    for key, values in grid.items():
        if not isinstance(key, str) or not isinstance(values, list) or not values:
            raise _err(path, f"grid {key}: expected a non-empty list of values")
        # with the other grid keys at their first values (a request's prompt and chunk swept together)
        others = [f"{k}={yaml_text(k, v[0])}" for k, v in grid.items() if k != key and isinstance(k, str)
                  and isinstance(v, list) and v and k.split(".")[0] != "policies"]
        for cp in config_paths:
            for v in values:
                _check_key(path, cp, key, v, [*overrides, *others])
    policies = raw["policies"]
    if not isinstance(policies, list) or not policies or not all(isinstance(p, str) and p for p in policies):
        raise _err(path, "policies: expected a non-empty list of policy specs")
    grid_mode = raw.get("grid_mode", "product")
    if grid_mode not in GRID_MODES:
        raise _err(path, f"grid_mode {grid_mode!r}: expected one of {', '.join(GRID_MODES)}")
    if grid_mode == "one_at_a_time" and (len(config_paths) != 1 or not grid):
        raise _err(path, "grid_mode: one_at_a_time sweeps the grid's keys of one config (give one config and a grid)")
    exp = {"name": name, "title": str(raw["title"]), "paper": str(raw["paper"]), "notes": str(raw.get("notes", "")),
           "source": os.path.abspath(path), "configs": config_paths, "config_names": stems, "grid": grid,
           "grid_mode": grid_mode, "policies": list(policies), "overrides": list(overrides)}
    return _check_sections(path, exp, raw)


def _check_sections(path: str, exp: dict, raw: dict) -> dict:
    """`exp` with its plot, compare rows, paper points and table checked from `raw` (an experiment file, or the
    experiment.json `run_experiment` saved), every column they name one its results can have."""
    plot = _check_plot(path, raw["plot"], exp["grid"])
    if (plot["kind"] == "gain") != (exp["grid_mode"] == "one_at_a_time"):
        raise _err(path, "plot.kind: gain draws a one_at_a_time grid, and such a grid is drawn as gain")
    if plot["kind"] == "gain":
        if plot.get("baseline") not in exp["policies"]:
            raise _err(path, f"plot.baseline {plot.get('baseline')!r}: must be one of the policies")
        if not isinstance(plot["xlabel"], list) or len(plot["xlabel"]) != len(exp["grid"]):
            raise _err(path, "plot.xlabel: a gain plot needs one label per grid key")
    compare = _check_compare(path, raw.get("compare") or [])
    points = _check_paper_points(path, raw.get("paper_points") or [], plot)
    table = _check_table(path, raw.get("table") or [])
    exp = {**exp, "plot": plot, "compare": compare, "paper_points": points, "table": table}
    _check_names(path, exp)
    return exp


def _check_plot(path: str, plot, grid) -> dict:
    if not isinstance(plot, dict):
        raise _err(path, "plot: expected a mapping")
    unknown = [k for k in plot if k not in PLOT_KEYS]
    if unknown:
        raise _err(path, f"plot: unknown key '{unknown[0]}' (expected one of: {', '.join(PLOT_KEYS)})")
    kind = plot.get("kind")
    if kind not in PLOT_KINDS:
        raise _err(path, f"plot.kind {kind!r}: expected one of {', '.join(PLOT_KINDS)}")
    for key in ("x", "y", "xlabel", "ylabel"):
        if key not in plot and not (kind == "stacked_bar" and key == "y"):
            raise _err(path, f"plot: missing key '{key}'")
    if kind == "stacked_bar" and not isinstance(plot.get("stack"), dict):
        raise _err(path, "plot.stack: a stacked_bar needs {column: label}")
    if plot.get("xscale", "linear") not in ("linear", "log2", "log"):
        raise _err(path, f"plot.xscale {plot['xscale']!r}: expected linear, log2 or log")
    if "annotate_only" in plot and (not plot.get("annotate") or not isinstance(plot["annotate_only"], list)):
        raise _err(path, "plot.annotate_only: a list of values of the plot.annotate column")
    if plot.get("yscale", "linear") not in ("linear", "log"):
        raise _err(path, f"plot.yscale {plot['yscale']!r}: expected linear or log")
    _check_plot_text(path, plot, kind)
    _check_plot_options(path, plot, kind)
    ys = plot.get("y", [])
    ys = ys if isinstance(ys, list) else [ys]
    ylabels = plot["ylabel"] if isinstance(plot["ylabel"], list) else [plot["ylabel"]] * max(1, len(ys))
    if kind != "stacked_bar" and len(ylabels) != len(ys):
        raise _err(path, "plot.ylabel: give one label, or one per y")
    factors = plot.get("yfactor", 1.0)
    factors = factors if isinstance(factors, list) else [factors] * max(1, len(ys))
    if len(factors) != max(1, len(ys)) or not all(_is_number(f) and f > 0 for f in factors):
        raise _err(path, "plot.yfactor: give one positive finite number, or one per y")
    out = dict(plot)
    out["y"] = ys
    out["ylabel"] = ylabels
    out["yfactor"] = [float(f) for f in factors]
    out.setdefault("series", "policy")
    out.setdefault("where", {})
    if kind == "gain":
        out["panels"] = list(grid)  # one panel per key swept
    return out


def _is_text(value) -> bool:
    return isinstance(value, str) and value != ""


def _is_number(value) -> bool:
    """A finite number (not true or false)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_plot_text(path: str, plot: dict, kind: str) -> None:
    """The plot's column names and labels are strings (y: one or a list; xlabel of a gain plot: a list)."""
    for key in ("x", "series", "annotate", "total"):
        if key in plot and not _is_text(plot[key]):
            raise _err(path, f"plot.{key}: expected a result column name (a string), got {plot[key]!r}")
    ys = plot.get("y", [])
    if "y" in plot and not (_is_text(ys) or (isinstance(ys, list) and (ys or kind == "stacked_bar")
                                              and all(_is_text(y) for y in ys))):
        raise _err(path, f"plot.y: expected a result column name or a non-empty list of them, got {ys!r}")
    for key in ("title", "baseline"):
        if key in plot and not _is_text(plot[key]):
            raise _err(path, f"plot.{key}: expected a string, got {plot[key]!r}")
    for key in ("xlabel", "ylabel"):
        labels = plot[key] if isinstance(plot[key], list) and (key == "ylabel" or kind == "gain") else [plot[key]]
        if not labels or not all(isinstance(label, str) for label in labels):
            raise _err(path, f"plot.{key}: expected a string" + (" or a list of them" if key == "ylabel" else ""))


def _check_plot_options(path: str, plot: dict, kind: str) -> None:
    """Each option is one the plot's kind draws, and of the shape it draws."""
    for key, kinds in KIND_OPTIONS.items():
        if key not in plot or kind in kinds:
            continue
        values = plot[key] if isinstance(plot[key], list) else [plot[key]]
        if key == "yfactor" and all(v == 1 and not isinstance(v, bool) for v in values):  # (a saved plot's default)
            continue
        raise _err(path, f"plot.{key}: a {kind} plot does not draw it (only {' and '.join(kinds)})")
    _check_where(path, "plot.where", plot.get("where", {}))
    for key in ("stack", "series_labels"):
        if key in plot and not isinstance(plot[key], dict):
            raise _err(path, f"plot.{key}: expected a mapping")
    if "stack" in plot and not all(_is_text(c) and isinstance(v, str) for c, v in plot["stack"].items()):
        raise _err(path, "plot.stack: expected {result column: label}")
    sec = plot.get("secondary_x")
    if sec is not None and not (isinstance(sec, dict) and set(sec) <= {"label", "factor"}
                                and isinstance(sec.get("label", ""), str)
                                and _is_number(sec.get("factor", 1)) and sec.get("factor", 1) > 0):
        raise _err(path, "plot.secondary_x: expected {label: text, factor: a positive finite number}")
    norm = plot.get("normalize")
    if norm is not None and not (isinstance(norm, dict) and set(norm) == {"column", "value"}
                                 and _is_text(norm["column"]) and _is_scalar(norm["value"])):
        raise _err(path, "plot.normalize: expected {column: a result column, value: the value its baseline row has}")
    if "annotate_only" in plot and not all(_is_number(v) for v in plot["annotate_only"]):
        raise _err(path, "plot.annotate_only: expected a list of numbers (values of the plot.annotate column)")
    ylim = plot.get("ylim")
    if ylim is not None and not (isinstance(ylim, list) and len(ylim) == 2 and all(_is_number(v) for v in ylim)
                                 and ylim[0] < ylim[1]):
        raise _err(path, f"plot.ylim: expected [low, high], two finite numbers with low < high, got {ylim!r}")
    if ylim is not None and plot.get("yscale") == "log" and ylim[0] <= 0:
        raise _err(path, f"plot.ylim: a log axis needs low > 0, got {ylim!r}")


def _is_scalar(value) -> bool:
    """A value a condition can match: a string, true or false, or a finite number."""
    return isinstance(value, (str, bool)) or _is_number(value)


def _check_where(path: str, field: str, where) -> None:
    """A condition {result column: value}."""
    if not isinstance(where, dict) or not all(_is_text(k) and _is_scalar(v) for k, v in where.items()):
        raise _err(path, f"{field}: expected a mapping {{result column: a string or finite number}}, got {where!r}")


def _entries(path: str, section: str, value, allowed: tuple, required: tuple, shape: str) -> list[tuple[int, dict]]:
    """The checks every list-of-mappings section shares (compare, paper_points, table): a list, each entry a
    mapping with only `allowed` keys and every `required` one; returns [(index, entry)]."""
    if not isinstance(value, list):
        raise _err(path, f"{section}: expected a list of {shape}")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise _err(path, f"{section}[{i}]: expected a mapping")
        unknown = [k for k in entry if k not in allowed]
        if unknown:
            raise _err(path, f"{section}[{i}]: unknown key '{unknown[0]}' (expected one of: {', '.join(allowed)})")
        missing = [k for k in required if k not in entry]
        if missing:
            raise _err(path, f"{section}[{i}]: missing key '{missing[0]}'")
    return list(enumerate(value))


def _check_compare(path: str, rows) -> list[dict]:
    out = []
    for i, row in _entries(path, "compare", rows, COMPARE_KEYS, ("what", "paper", "metric", "where", "why"),
                           "rows"):
        if not _is_value(row["paper"]):
            raise _err(path, f"compare[{i}].paper: expected a number or [low, high] (finite, low <= high), "
                             f"got {row['paper']!r}")
        if not isinstance(row.get("draw", True), bool):
            raise _err(path, f"compare[{i}].draw: expected true or false")
        for key in ("what", "why", "unit"):
            if key in row and not isinstance(row[key], str):
                raise _err(path, f"compare[{i}].{key}: expected a string")
        if not _is_text(row["metric"]):
            raise _err(path, f"compare[{i}].metric: expected a result column name (a string), got {row['metric']!r}")
        _check_where(path, f"compare[{i}].where", row["where"])
        if row.get("vs") is not None:
            _check_where(path, f"compare[{i}].vs", row["vs"])
        out.append({"unit": "", "vs": None, "draw": True, **row})
    return out


def _is_value(v) -> bool:
    """A paper value: a finite number or [low, high] with low <= high."""
    return _is_number(v) or (isinstance(v, list) and len(v) == 2 and all(_is_number(p) for p in v) and v[0] <= v[1])


def _check_paper_points(path: str, points, plot: dict) -> list[dict]:
    drawn = set(plot["y"]) | set(plot.get("stack") or {}) | ({plot["total"]} if plot.get("total") else set())
    for i, pt in _entries(path, "paper_points", points, PAPER_POINT_KEYS, PAPER_POINT_KEYS,
                          "{series, x, metric, value}"):
        if pt["metric"] not in drawn:
            raise _err(path, f"paper_points[{i}].metric {pt['metric']!r}: not drawn by the plot "
                             f"(expected one of: {', '.join(sorted(drawn))})")
        if not _is_value(pt["value"]):
            raise _err(path, f"paper_points[{i}].value: expected a number or [low, high] (finite, low <= high), "
                             f"got {pt['value']!r}")
        if not _is_scalar(pt["x"]) or not _is_scalar(pt["series"]):
            raise _err(path, f"paper_points[{i}]: series and x: expected a string or finite number each")
    return [dict(pt) for pt in points]


def _policy_columns() -> set[str]:
    """The scalar metrics policies declare (Policy.result_columns): results.csv carries them for their rows."""
    return {c for cls in REGISTRY.values() for c in cls.result_columns}


def _check_table(path: str, columns) -> list[dict]:
    out = []
    for i, col in _entries(path, "table", columns, TABLE_KEYS, ("metric", "label"),
                           "{metric, label[, factor, format]}"):
        if col["metric"] not in CSV_COLUMNS and col["metric"] not in (REQUEST_COLUMNS + BATCH_COLUMNS + SPECULATIVE_COLUMNS
                                                                      + SERVED_COLUMNS + (UNION_COLUMN,)) \
                and col["metric"] not in _policy_columns():
            raise _err(path, f"table[{i}].metric {col['metric']!r}: not a results.csv column")
        factor = col.get("factor", 1.0)
        if not _is_number(factor) or factor <= 0:
            raise _err(path, f"table[{i}].factor: expected a positive finite number")
        fmt = col.get("format", "{:.3g}")
        try:
            fmt.format(1.0)
        except (ValueError, IndexError, KeyError, AttributeError):
            raise _err(path, f"table[{i}].format {fmt!r}: not a format for one number (e.g. '{{:.3f}}')") from None
        out.append({"metric": col["metric"], "label": str(col["label"]), "factor": float(factor), "format": fmt})
    return out


# ---------------------------------------------------------------------------------------------- result columns
def known_columns(exp: dict) -> set[str] | None:
    """Every column the experiment's results can have, known from the code before anything runs: chipsim's
    documented columns (chipsim.analysis.columns: every run's, every mode's, every built-in policy's), the grid's
    keys, `config` and `point_id` (and `parameter`, `value` one key at a time). None where a policy of the
    experiment is not one of chipsim's own: its metrics are known only once it has run."""
    for spec in exp["policies"]:
        for part in split_request_spec(spec) or (spec,):
            head = part.partition(":")[0].strip()
            name = head if head in REGISTRY else next((hit[0] for hit in (p(head) for p in SHORTHANDS) if hit), None)
            if name not in REGISTRY or not REGISTRY[name].__module__.startswith("chipsim."):
                return None
    out = set(all_columns()) | set(CSV_COLUMNS) | _policy_columns() | set(exp["grid"]) | {"config", "point_id"}
    return out | ({"parameter", "value"} if exp.get("grid_mode") == "one_at_a_time" else set())


def named_columns(exp: dict) -> list[tuple[str, str, bool]]:
    """(field, column, drawn as a number) of every result column the experiment names: what its plot draws and
    selects on, its compare rows' metrics and conditions, its table's metrics."""
    plot, kind = exp["plot"], exp["plot"]["kind"]
    out = [("plot.where", k, False) for k in plot["where"]]
    out += [("plot.x", plot["x"], False)] if kind in ("line", "bar", "stacked_bar") else []
    out += [("plot.y", y, True) for y in plot["y"]] if kind in ("line", "bar", "gain") else []
    out += [("plot.series", plot["series"], False)] if kind != "stacked_bar" else []
    out += [("plot.annotate", plot["annotate"], True)] if plot.get("annotate") else []
    out += [("plot.normalize", plot["normalize"]["column"], False)] if plot.get("normalize") else []
    out += [("plot.stack", c, True) for c in plot.get("stack") or {}]
    out += [("plot.total", plot["total"], True)] if plot.get("total") else []
    for i, row in enumerate(exp["compare"]):
        out += [(f"compare[{i}].metric", row["metric"], True)] + [(f"compare[{i}].where", k, False)
                                                                  for k in row["where"]]
        out += [(f"compare[{i}].vs", k, False) for k in row.get("vs") or {}]
    return out + [(f"table[{i}].metric", c["metric"], True) for i, c in enumerate(exp["table"])]


def _conditions(exp: dict) -> list[tuple[str, str, object]]:
    """(field, column, value) of every condition the experiment sets on its results."""
    plot = exp["plot"]
    out = [("plot.where", k, v) for k, v in plot["where"].items()]
    norm = plot.get("normalize")
    out += [("plot.normalize", norm["column"], norm["value"])] if norm else []
    for i, row in enumerate(exp["compare"]):
        out += [(f"compare[{i}].where", k, v) for k, v in row["where"].items()]
        out += [(f"compare[{i}].vs", k, v) for k, v in (row.get("vs") or {}).items()]
    return out


def _check_names(path: str, exp: dict) -> None:
    """Before anything runs: each column the experiment names is one its results can have (a number where it is
    drawn, compared or tabulated), a per_layer plot's y a per-layer field, and each condition on a column whose
    values are known now (policy, config, a grid key, the parameter swept) names one of them."""
    known = known_columns(exp)
    for field, column, number in named_columns(exp):
        if known is not None and column not in known:
            raise _err(path, f"{field}: no result column {column!r} (docs/reference/columns.md lists them; or a "
                             "grid key, config, point_id)")
        if number and column in WORD_COLUMNS:
            raise _err(path, f"{field}: {column!r} holds words, not a number")
    if exp["plot"]["kind"] == "per_layer" and exp["plot"]["y"][0] not in PER_LAYER_FIELDS:
        raise _err(path, f"plot.y: {exp['plot']['y'][0]!r} is not a per-layer field (expected one of: "
                         f"{', '.join(PER_LAYER_FIELDS)})")
    for field, column, value in _conditions(exp):
        known_values = _known_values(exp, column)
        if known_values is None:
            continue
        if column == "policy":
            # a request run labels a policy without a prefill policy of its own as PREFILL+DECODE
            hit = isinstance(value, str) and any(value == p or value.endswith(f"+{p}") for p in known_values)
        else:
            hit = any(matches(v, value) for v in known_values)
        if not hit:
            raise _err(path, f"{field}: {column} {value!r} selects no result (the experiment's: "
                             f"{', '.join(map(str, known_values))})")


def _known_values(exp: dict, column: str) -> list | None:
    """The values a column takes in every result, where they are known before anything runs."""
    if column == "policy":
        return [p.strip() for p in exp["policies"]]
    if column == "config":
        return list(exp["config_names"])
    if column == "parameter" and exp.get("grid_mode") == "one_at_a_time":
        return list(exp["grid"])
    return list(exp["grid"][column]) if column in exp["grid"] else None


# ---------------------------------------------------------------------------------------------- running
def sweeps(exp: dict, out_dir: str) -> list[tuple[str, str, str, dict, str | None]]:
    """[(config path, config stem, sweep directory, its grid, the one key it sweeps or None)] under out_dir."""
    root = os.path.join(out_dir, exp["name"])
    if exp.get("grid_mode") == "one_at_a_time":
        c, s = exp["configs"][0], exp["config_names"][0]
        return [(c, s, os.path.join(root, key), {key: values}, key) for key, values in exp["grid"].items()]
    if len(exp["configs"]) == 1:
        return [(exp["configs"][0], exp["config_names"][0], root, exp["grid"], None)]
    return [(c, s, os.path.join(root, s), exp["grid"], None) for c, s in zip(exp["configs"], exp["config_names"])]


def simulate_experiments(experiments: list[dict], out_dir: str, jobs: int = 0, extra_overrides=(),
                         progress: bool = True, frames: dict | None = None) -> int:
    """Simulate every result the experiments need that out_dir/cache/ lacks, all in one pool (their DRAM
    calibrations first): `run_experiment` then reads them from the cache. Returns the number simulated. `frames`,
    where given, gets each experiment's results as `load_results` will read them back, {name: (DataFrame, rows)},
    so that they can be checked before anything of the experiment is written."""
    specs = []
    for exp in experiments:
        overrides = list(exp["overrides"]) + list(extra_overrides)
        specs += [(config, grid, exp["policies"], overrides) for config, _, _, grid, _ in sweeps(exp, out_dir)]
    results: list[list[dict]] = []
    simulated = fill_cache(specs, os.path.join(out_dir, "cache"), jobs=jobs, progress=progress, rows_out=results)
    for exp in experiments:
        mine, results = results[:len(sweeps(exp, out_dir))], results[len(sweeps(exp, out_dir)):]
        if frames is not None:
            frames[exp["name"]] = results_frame(exp, mine)
    return simulated


def run_experiment(exp: dict, out_dir: str, jobs: int = 0, extra_overrides=(), progress: bool = True) -> float:
    """Run every sweep of `exp` into out_dir/<name>/; returns the wall time in seconds. The experiments share
    one cache (out_dir/cache/, by content): a point two of them contain is simulated once."""
    t0 = time.perf_counter()
    overrides = list(exp["overrides"]) + list(extra_overrides)
    for config, _, directory, grid, _ in sweeps(exp, out_dir):
        run_sweep(config, grid, exp["policies"], directory, overrides=overrides, jobs=jobs, progress=progress,
                  cache_dir=os.path.join(out_dir, "cache"))
    saved = dict(exp, overrides=overrides)
    # key order kept (not sorted): plot.stack is drawn bottom first
    write_atomic(os.path.join(out_dir, exp["name"], "experiment.json"), json.dumps(saved, indent=1) + "\n",
                 what="--out")
    return time.perf_counter() - t0


def saved_experiments(out_dir: str) -> list[dict]:
    """The experiments `chipsim reproduce` ran into out_dir (each DIR/<name>/experiment.json)."""
    if not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: no such directory")
    out = []
    for name in sorted(os.listdir(out_dir)):
        if os.path.isfile(os.path.join(out_dir, name, "experiment.json")):
            out.append(saved_experiment(out_dir, name))
    if not out:
        raise InputError(f"{out_dir}: no experiment results (DIR/<name>/experiment.json); run chipsim reproduce")
    return out


def saved_experiment(out_dir: str, name: str) -> dict:
    """The experiment `name` as `run_experiment` saved it in out_dir (DIR/<name>/experiment.json), checked."""
    return _read_saved(os.path.join(out_dir, name, "experiment.json"), name)


# what `run_experiment` saves, and the type each key must have when read back
SAVED_KEYS = {"name": str, "title": str, "paper": str, "configs": list, "config_names": list, "grid": dict,
              "policies": list, "overrides": list, "plot": dict, "compare": list, "paper_points": list, "table": list}


def _read_saved(path: str, name: str) -> dict:
    """A saved experiment.json, checked: a truncated, edited or foreign file is one line naming it."""
    again = f"run chipsim reproduce {name} again"
    try:
        exp = json.loads(read_input_text(path, "experiment record", JSON_MAX_BYTES))
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable experiment record ({type(exc).__name__}); {again}") from None
    if not isinstance(exp, dict):
        raise InputError(f"{path}: not an experiment record (expected a JSON object); {again}")
    for key, tp in SAVED_KEYS.items():
        if not isinstance(exp.get(key), tp):
            raise InputError(f"{path}: incomplete experiment record ({key} missing or not a {tp.__name__}); {again}")
    if len(exp["configs"]) != len(exp["config_names"]) or not all(isinstance(c, str) for c in exp["config_names"]):
        raise InputError(f"{path}: incomplete experiment record (configs and config_names differ); {again}")
    if not all(isinstance(p, str) and p for p in exp["policies"]) or exp.get("grid_mode", "product") not in GRID_MODES \
            or not all(isinstance(v, list) and v for v in exp["grid"].values()):
        raise InputError(f"{path}: incomplete experiment record (policies, grid or grid_mode); {again}")
    plot = {k: v for k, v in exp["plot"].items() if k != "panels"}  # (a gain plot's panels: its grid's keys)
    try:  # what load_experiment checked in the experiment file, checked again: an edited record is one line too
        _check_sections(path, {**exp, "grid_mode": exp.get("grid_mode", "product")}, {**exp, "plot": plot})
    except InputError as exc:
        raise InputError(f"{exc}; {again}") from None
    return exp


def load_results(exp: dict, out_dir: str) -> tuple[pd.DataFrame, list[dict]]:
    """Every row of the experiment's sweeps: a DataFrame of the scalar fields (grid values, CSV columns and
    extra policy metrics such as mean_delta_hat, plus `config`) and the full rows (per_layer included)."""
    per_sweep = []
    for _, stem, directory, _, swept in sweeps(exp, out_dir):
        p = os.path.join(directory, "sweep.json")
        if not os.path.isfile(p):
            raise InputError(f"{p}: missing; run chipsim reproduce {exp['name']}")
        try:
            info = json.loads(read_input_text(p, "sweep record", SWEEP_RECORD_MAX_BYTES))
            results = info["results"]
            if not isinstance(results, list) or not all(isinstance(r, dict) and isinstance(r.get("values"), dict)
                                                        and isinstance(r.get("policy"), str) for r in results):
                raise TypeError("results is not a list of rows")
        except (ValueError, RecursionError, KeyError, TypeError) as exc:
            raise InputError(f"{p}: not a readable sweep record ({type(exc).__name__}); run chipsim reproduce "
                             f"{exp['name']} again") from None
        per_sweep.append(results)
    return results_frame(exp, per_sweep)


def results_frame(exp: dict, per_sweep: list[list[dict]]) -> tuple[pd.DataFrame, list[dict]]:
    """The DataFrame of scalar fields and the full rows of an experiment, from each of its sweeps' rows (as sweep.json
    holds them: {"values": {grid key: value}, "point_id", ..., and the result's fields})."""
    rows = []
    for (_, stem, _, _, swept), results in zip(sweeps(exp, ""), per_sweep):
        for r in results:
            one = {"parameter": swept, "value": r.get("values", {}).get(swept)} if swept else {}
            rows.append({"config": stem, **one, **r.get("values", {}), **{k: v for k, v in r.items() if k != "values"}})
    scalars = [{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in rows]
    return fill_batch_columns(pd.DataFrame(scalars)), rows


def check_results(exp: dict, df: pd.DataFrame, label: str) -> None:
    """Right after simulating (or reading saved results back), before anything is drawn or written: each column
    the experiment names is in its results (a policy's own metric is there only where that policy ran, a
    request's only in a request run), holds numbers where they are drawn, compared or tabulated, and each
    condition selects results. `label` names the file the experiment came from."""
    for field, column, number in named_columns(exp):
        if column not in df.columns:
            raise InputError(f"{label}: {field}: no result column {column!r} in this experiment's results (a "
                             "policy's own metric is there only where that policy ran)")
        if number and not all(_is_result_number(v) for v in df[column].dropna()):
            raise InputError(f"{label}: {field}: column {column!r} holds something other than numbers")
    for field, where in [("plot.where", exp["plot"]["where"])] + [
            (f"compare[{i}].where", row["where"]) for i, row in enumerate(exp["compare"])]:
        if select(df, where).empty:
            raise InputError(f"{label}: {field}: {where} selects no result")


def _is_result_number(v) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))


def matches(v, value) -> bool:
    """A result's value `v` meets the condition `value` (a float within rounding)."""
    return v == value or (isinstance(v, float) and isinstance(value, (int, float)) and math.isclose(v, value))


def select(df: pd.DataFrame, where: dict) -> pd.DataFrame:
    mask = pd.Series(True, index=df.index)
    for key, value in (where or {}).items():
        if key not in df.columns:
            raise InputError(f"where {key}: no such result column")
        mask &= df[key].map(lambda v, value=value: matches(v, value))
    return df[mask]
