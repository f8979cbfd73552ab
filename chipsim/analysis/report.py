"""Human-readable table and machine-readable files (CSV, JSON) of a run's results."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile

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
    "energy_host_cpu_mj", "energy_pcie_mj", "edp_mj_ms", "offchip_bytes_per_token", "overlap", "recall",
    "fallback_rate", "demand_fetches_per_token", "prefetches_issued", "prefetches_dropped", "prefetches_unused",
    "fetches_total", "host_experts_per_token", "host_wait_ms_per_token", "surrogate_experts_per_token",
    "substitutions_per_token", "dropped_experts_per_token", "warmup_tokens",
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


def json_rows(rows: list[dict], with_details: bool) -> list[dict]:
    if with_details:
        return rows
    return [{k: v for k, v in row.items() if k not in ("per_layer", "energy_by_component_mj", "warmup")} for row in rows]


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([repr(row[c]) if isinstance(row[c], float) else row[c] for c in CSV_COLUMNS])
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
