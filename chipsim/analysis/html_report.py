"""`chipsim report DIR`: one self-contained HTML page of a run directory (`chipsim run --out`: results.json) or a
sweep directory (`chipsim sweep --out`: sweep.json) — the header, the results table and interactive plotly
figures, with plotly's JavaScript inline once, so that the page opens from disk with no server and no network.

The same directory gives the same bytes: no timestamps, and every figure's div id is fixed (plotly's own are
random UUIDs)."""

from __future__ import annotations

import html
import json
import math
import os

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from chipsim.analysis.report import CSV_COLUMNS, TABLE_COLUMNS, quality_lines, table_columns, table_value
from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, read_input_text

RUN_RECORD, SWEEP_RECORD = "results.json", "sweep.json"
SWEEP_RECORD_MAX_BYTES = 1 << 30  # as `chipsim plot` reads a sweep.json (a 1,000-point grid is tens of MB)
# every row needs what the table shows; per-layer lists and energy per component only draw their figures
REQUIRED_NUMBERS = [key for _, key, _ in TABLE_COLUMNS if key != "policy"]
# results.csv's numbers: none is below 0 in a row chipsim wrote (the cache holds its entries to the same)
NON_NEGATIVE = [key for key in CSV_COLUMNS if key not in ("policy", "expert_link")]
# the three categories every row has, then the host CPU's where a policy used it (chipsim.sim.energy.CATEGORIES)
ENERGY_CATEGORIES = [("on-chip active", "energy_onchip_active_mj"), ("off-chip IO", "energy_offchip_io_mj"),
                     ("idle / leakage", "energy_idle_leakage_mj"), ("host CPU", "energy_host_cpu_mj")]
PER_LAYER = [("stall_ms", "per-layer stall (ms per token)"), ("overlap", "per-layer overlap (share of tokens)")]
FIGURE_HEIGHT = "440px"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}  # no logo: its link would leave the page


# ------------------------------------------------------------------------------------------------ reading
def load(directory: str) -> dict:
    """The run or sweep in `directory`: {kind, record (its path), info, rows, grid}; one line naming the file and
    key when it is not one chipsim wrote."""
    if not os.path.isdir(directory):
        raise InputError(f"{directory}: not a directory (a `chipsim run --out` or `chipsim sweep --out` folder)")
    run_path, sweep_path = os.path.join(directory, RUN_RECORD), os.path.join(directory, SWEEP_RECORD)
    has_run, has_sweep = os.path.lexists(run_path), os.path.lexists(sweep_path)
    if has_run and has_sweep:
        raise InputError(f"{directory}: holds both {RUN_RECORD} (a run) and {SWEEP_RECORD} (a sweep); give a folder "
                         "with one of them")
    if has_run:
        return _load_run(run_path)
    if has_sweep:
        return _load_sweep(sweep_path)
    hint = (" (a `chipsim reproduce` experiment: give one of its sweep folders)"
            if os.path.exists(os.path.join(directory, "experiment.json")) else "")
    raise InputError(f"{directory}: no {RUN_RECORD} (chipsim run --out) or {SWEEP_RECORD} (chipsim sweep --out)"
                     f"{hint}")


def _read_object(path: str, max_bytes: int) -> dict:
    """A JSON object from `path`, or one line saying why not."""
    text = read_input_text(path, "", max_bytes)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _need(data: dict, key: str, kind: type, path: str):
    if not isinstance(data.get(key), kind):
        raise InputError(f"{path}: key {key!r} missing or not a {kind.__name__}")
    return data[key]


def _check_rows(rows: list, path: str) -> list[dict]:
    """Every row a dict with a policy and the table's numbers (null where a run left one undefined)."""
    if not rows:
        raise InputError(f"{path}: key 'results' holds no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("policy"), str):
            raise InputError(f"{path}: results[{i}]: not a row with a 'policy' string")
        for key in REQUIRED_NUMBERS:
            value = row.get(key, "missing")
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(f"{path}: results[{i}].{key}: missing or not a number")
        for key in NON_NEGATIVE:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise InputError(f"{path}: results[{i}].{key}: {value} is below 0")
        try:
            _check_finite(row, f"results[{i}]", path)
        except RecursionError:
            raise InputError(f"{path}: results[{i}]: nested too deeply") from None
    return rows


def _check_finite(value, where: str, path: str) -> None:
    """No number anywhere in a row is NaN or infinite: chipsim writes null for a value undefined for a run."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{path}: {where}: {value} is not a finite number (chipsim writes null where a value is "
                         "undefined)")
    if isinstance(value, dict):
        for key, v in value.items():
            _check_finite(v, f"{where}.{key}", path)
    elif isinstance(value, list):
        for j, v in enumerate(value):
            _check_finite(v, f"{where}[{j}]", path)


def _load_run(path: str) -> dict:
    data = _read_object(path, JSON_MAX_BYTES)
    info = _need(data, "run", dict, path)
    rows = _check_rows(_need(data, "results", list, path), path)
    return {"kind": "run", "record": path, "info": info, "rows": rows, "grid": {}}


def _load_sweep(path: str) -> dict:
    data = _read_object(path, SWEEP_RECORD_MAX_BYTES)
    grid = _need(data, "grid", dict, path)
    if not grid or not all(isinstance(v, list) and v for v in grid.values()):
        raise InputError(f"{path}: key 'grid': expected each swept key with a non-empty list of values")
    rows = _check_rows(_need(data, "results", list, path), path)
    for i, row in enumerate(rows):
        values = row.get("values")
        if not isinstance(values, dict) or any(key not in values for key in grid):
            raise InputError(f"{path}: results[{i}].values: missing or lacks a swept key ({', '.join(grid)})")
    return {"kind": "sweep", "record": path, "info": data, "rows": rows, "grid": grid}


# ------------------------------------------------------------------------------------------------ the page
def render(source: dict) -> str:
    """The whole page as text: header, table, quality lines, then the figures (plotly's JS once, in <head>)."""
    rows = source["rows"]
    figures = sweep_figures(rows, source["grid"]) if source["kind"] == "sweep" else run_figures(rows)
    title = f"chipsim report: {_config_name(source)}"
    body = [f"<h1>{_esc(title)}</h1>", _header_html(source), "<h2>Results</h2>", _table_html(rows, source["grid"])]
    body += [f"<p class=\"note\">{_esc(line)}</p>" for line in quality_lines(rows)]
    for div_id, heading, fig in figures:
        body += [f"<h2>{_esc(heading)}</h2>", _figure_html(fig, div_id)]
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{_esc(title)}</title>\n"
            f"<style>{PAGE_CSS}</style>\n<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script>\n"
            "</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


PAGE_CSS = " ".join([
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}",
    "table{border-collapse:collapse;font-size:13px} .wide{overflow-x:auto}",
    "th,td{padding:3px 8px;border-bottom:1px solid #ddd;white-space:nowrap}",
    "td{text-align:right;font-variant-numeric:tabular-nums} td.text,th.text{text-align:left}",
    "th small{display:block;font-weight:normal;color:#777}",
    "dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}",
    "dt{font-weight:bold} dd{margin:0;word-break:break-all} .note{font-size:13px;color:#555}",
])


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _config_name(source: dict) -> str:
    config = source["info"].get("config")
    return os.path.splitext(os.path.basename(config))[0] if isinstance(config, str) else "?"


def _header_html(source: dict) -> str:
    """What was run and the hashes the record carries, as a definition list."""
    items = _run_header(source["info"]) if source["kind"] == "run" else _sweep_header(source["info"])
    policies = list(dict.fromkeys(row["policy"] for row in source["rows"]))
    items.insert(3, ("policies", ", ".join(policies)))
    items.append(("record", os.path.basename(source["record"])))  # the page reads the same from any cwd
    return "<dl>" + "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in items) + "</dl>"


def _run_header(info: dict) -> list[tuple[str, str]]:
    resolved = info.get("config_resolved") if isinstance(info.get("config_resolved"), dict) else {}
    model = resolved.get("model") if isinstance(resolved.get("model"), dict) else {}
    provenance = info.get("trace_provenance") if isinstance(info.get("trace_provenance"), dict) else {}
    trace = str(info.get("trace", "?")) + (" (SYNTHETIC: routing from a generator, not a model)"
                                           if info.get("trace_synthetic") else "")
    items = [("config", info.get("config", "?")), ("trace", trace),
             ("model", model.get("name") or model.get("config") or provenance.get("shape") or "?")]
    if provenance.get("description"):
        items.insert(2, ("trace is", provenance["description"]))
    return items + _hashes(info)


def _sweep_header(info: dict) -> list[tuple[str, str]]:
    points = [p for p in (info["points"] if isinstance(info.get("points"), list) else []) if isinstance(p, dict)]
    traces = dict.fromkeys(f"{p.get('trace')} (sha256 {p.get('trace_sha256')})" for p in points)
    grid = "; ".join(f"{key} = {', '.join(map(str, values))}" for key, values in info["grid"].items())
    items = [("config", info.get("config", "?")), ("traces", "; ".join(traces) or "?"), ("grid", grid)]
    if info.get("overrides"):
        items.append(("overrides", " ".join(map(str, info["overrides"]))))
    return items + _hashes(info)


def _hashes(info: dict) -> list[tuple[str, str]]:
    """The SHA-256s and version a record carries (a run's trace and named input files too)."""
    items = [(key, info[key]) for key in ("config_sha256", "trace_sha256", "code_sha256", "chipsim_version")
             if info.get(key) is not None]
    files = info.get("input_files") if isinstance(info.get("input_files"), dict) else {}
    items += [(f"{key} sha256", f.get("sha256")) for key, f in sorted(files.items()) if isinstance(f, dict)]
    return items


def _shown(row: dict, key: str):
    """The value the table shows, None where the record has none (null: undefined for that run)."""
    return table_value(row, key) if row.get(key) is not None else None


def _cell(fmt: str, value) -> str:
    return "n/a" if value is None else fmt.format(value)


def _table_html(rows: list[dict], grid: dict) -> str:
    """The table `chipsim run` prints (same columns and formats); each header also names its results.csv column,
    whose name carries the unit. A sweep's rows lead with their grid values."""
    columns = table_columns(rows)
    heads = [f"<th class=\"text\">{_esc(key)}</th>" for key in grid]
    heads += [f"<th{_text_class(key)}>{_esc(head)}<small>{_esc(key)}</small></th>" for head, key, _ in columns]
    lines = ["<div class=\"wide\"><table>", "<tr>" + "".join(heads) + "</tr>"]
    for row in rows:
        cells = [f"<td class=\"text\">{_esc(row['values'][key])}</td>" for key in grid]
        cells += [f"<td{_text_class(key)}>{_esc(_cell(fmt, _shown(row, key)))}</td>" for _, key, fmt in columns]
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(lines + ["</table></div>"])


def _text_class(key: str) -> str:
    return " class=\"text\"" if key == "policy" else ""  # words left-aligned, numbers right


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return pio.to_html(fig, config=PLOTLY_CONFIG, include_plotlyjs=False, full_html=False, div_id=div_id,
                       default_height=FIGURE_HEIGHT)


# ------------------------------------------------------------------------------------------------ a run's figures
def run_figures(rows: list[dict]) -> list[tuple[str, str, go.Figure]]:
    """(div id, heading, figure) of a run: latency and energy per policy, the per-layer lines, the energy
    breakdowns (per-layer and per-component ones only where every row has them)."""
    figures = [("fig-latency-energy", "Latency and energy per token, per policy", latency_energy_figure(rows))]
    for field, heading in PER_LAYER:
        if all(isinstance(_per_layer(row).get(field), list) for row in rows):
            figures.append((f"fig-per-layer-{field}", heading.capitalize(), per_layer_figure(rows, field, heading)))
    figures.append(("fig-energy-categories", "Energy per token by category", energy_categories_figure(rows)))
    if all(isinstance(row.get("energy_by_component_mj"), dict) for row in rows):
        figures.append(("fig-energy-components", "Energy per token by component", energy_components_figure(rows)))
    return figures


def _per_layer(row: dict) -> dict:
    return row["per_layer"] if isinstance(row.get("per_layer"), dict) else {}


def _color(policy: str) -> str:
    from chipsim.analysis.plots import color_for  # the colour the matplotlib figures give the policy

    return color_for(policy)


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def latency_energy_figure(rows: list[dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("latency per token (ms)", "energy per token (mJ)"))
    policies = [row["policy"] for row in rows]
    colors = [_color(p) for p in policies]
    for col, key, unit in ((1, "latency_ms_per_token", "ms"), (2, "energy_mj_per_token", "mJ")):
        fig.add_trace(go.Bar(x=policies, y=[row[key] for row in rows], marker_color=colors, name=key,
                             showlegend=False, hovertemplate=f"%{{x}}: %{{y:.4g}} {unit}<extra></extra>"),
                      row=1, col=col)
    fig.update_layout(template="plotly_white", margin={"t": 40})
    return fig


def per_layer_figure(rows: list[dict], field: str, label: str) -> go.Figure:
    fig = go.Figure()
    for row in rows:
        values = [_number(v) for v in row["per_layer"][field]]
        fig.add_trace(go.Scatter(x=list(range(len(values))), y=values, mode="lines+markers", name=row["policy"],
                                 line={"color": _color(row["policy"])},
                                 hovertemplate=f"{row['policy']}, layer %{{x}}: %{{y:.4g}}<extra></extra>"))
    fig.update_layout(template="plotly_white", xaxis_title="MoE layer", yaxis_title=label, hovermode="x unified")
    return fig


def _stacked_bars(policies: list[str], parts: list[tuple[str, list]], title: str) -> go.Figure:
    fig = go.Figure()
    for name, values in parts:
        fig.add_trace(go.Bar(x=policies, y=values, name=name,
                             hovertemplate=f"%{{x}}, {name}: %{{y:.4g}} mJ<extra></extra>"))
    fig.update_layout(template="plotly_white", barmode="stack", yaxis_title=title)
    return fig


def energy_categories_figure(rows: list[dict]) -> go.Figure:
    """On-chip active, off-chip IO and idle/leakage stacked per policy (they sum to E mJ); the host CPU's
    energy as a fourth part where a policy used it."""
    parts = [(name, [_number(row.get(key)) for row in rows]) for name, key in ENERGY_CATEGORIES
             if name != "host CPU" or any(row.get(key) for row in rows)]
    return _stacked_bars([row["policy"] for row in rows], parts, "energy per token (mJ)")


def energy_components_figure(rows: list[dict]) -> go.Figure:
    """Every component and action (results.json's energy_by_component_mj) stacked per policy; ones that are zero
    for every policy are left out."""
    names = sorted({name for row in rows for name, v in row["energy_by_component_mj"].items() if _number(v)})
    parts = [(name, [_number(row["energy_by_component_mj"].get(name)) for row in rows]) for name in names]
    return _stacked_bars([row["policy"] for row in rows], parts, "energy per token (mJ)")


# ------------------------------------------------------------------------------------------------ a sweep's figures
def sweep_figures(rows: list[dict], grid: dict) -> list[tuple[str, str, go.Figure]]:
    """One figure per swept key: a metric (chosen in the figure's menu) against the key's values, one curve per
    policy (and per combination of the other keys' values)."""
    return [(f"fig-sweep-{i}", f"Metric vs {key}", sweep_figure(rows, grid, key)) for i, key in enumerate(grid)]


def _metrics(rows: list[dict]) -> list[tuple[str, str]]:
    """(label, key) of the menu: the table's numeric columns, latency first."""
    return [(f"{head} ({key})", key) for head, key, _ in table_columns(rows) if key != "policy"]


def _curves(rows: list[dict], grid: dict, key: str) -> dict[str, list[dict]]:
    """Curve label -> its rows in the order of `key`'s grid values: one curve per policy and combination of
    the other swept keys' values."""
    others = [k for k in grid if k != key]
    curves: dict[str, list[dict]] = {}
    for row in rows:
        rest = ", ".join(f"{k}={row['values'][k]}" for k in others)
        curves.setdefault(row["policy"] + (f" ({rest})" if rest else ""), []).append(row)
    order = {json.dumps(v, sort_keys=True): i for i, v in enumerate(grid[key])}

    def position(row):  # a numeric axis from left to right; otherwise the grid's own order
        value = row["values"][key]
        return value if _numeric_axis(grid[key]) else order.get(json.dumps(value, sort_keys=True), len(order))

    for members in curves.values():
        members.sort(key=position)
    return curves


def _numeric_axis(values: list) -> bool:
    return all(_number(v) is not None for v in values)


def sweep_figure(rows: list[dict], grid: dict, key: str) -> go.Figure:
    metrics = _metrics(rows)
    curves = _curves(rows, grid, key)
    numeric = _numeric_axis(grid[key])
    fig = go.Figure()
    for label, members in curves.items():
        xs = [m["values"][key] if numeric else str(m["values"][key]) for m in members]
        fig.add_trace(go.Scatter(x=xs, y=_metric_values(members, metrics[0][1]), mode="lines+markers", name=label,
                                 line={"color": _color(members[0]["policy"])},
                                 hovertemplate=f"{label}<br>{key} = %{{x}}<br>%{{y:.4g}}<extra></extra>"))
    buttons = [{"label": label, "method": "update",
                "args": [{"y": [_metric_values(m, metric) for m in curves.values()]}, {"yaxis.title.text": label}]}
               for label, metric in metrics]
    fig.update_layout(template="plotly_white", xaxis_title=key, yaxis_title=metrics[0][0],
                      updatemenus=[{"buttons": buttons, "x": 0, "xanchor": "left", "y": 1.15, "yanchor": "top"}],
                      margin={"t": 80})
    positive = numeric and min(grid[key]) > 0
    if positive and max(grid[key]) / min(grid[key]) >= 10:  # a sweep over decades reads best on a log axis
        fig.update_xaxes(type="log")
    if not numeric:
        fig.update_xaxes(type="category")
    return fig


def _metric_values(members: list[dict], metric: str) -> list:
    return [_number(_shown(m, metric)) for m in members]


# ------------------------------------------------------------------------------------------------ writing
def write_report(directory: str, out: str | None = None) -> str:
    """Read DIR, check where the page goes, then build it and write it whole (a temporary file renamed into
    place): any bad input is one line and leaves nothing behind. Returns the page's path."""
    from chipsim.files import check_output_file, write_atomic

    source = load(directory)
    out = out or os.path.join(directory, "report.html")
    check_output_file(out, "--out")
    write_atomic(out, render(source), what="--out")
    return out
