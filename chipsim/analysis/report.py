"""Human-readable table and machine-readable files (CSV, JSON) of a run's results."""

from __future__ import annotations

import csv
import io
import json
import math
import os

from chipsim.errors import InputError
from chipsim.files import write_atomic
from chipsim.hw.config import UcieConfig, flash_memories, memories, serial_links
from chipsim.hw.flash import flash_text
from chipsim.hw.machine import roles
from chipsim.hw.paths import components, fetch_components, memory_timing

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
    ("PCIe", "energy_expert_link_mj", "{:.2f}"),  # headed by the expert link's name (thor: PCIe)
    ("EDP mJ*ms", "edp_mj_ms", "{:.1f}"),
    ("off-chip MB", "expert_link_bytes_per_token", "{:.1f}"),
    ("overlap", "overlap", "{:.3f}"),
]
# inserted after idle where any row's policy computes experts on the host CPU
HOST_COLUMN = ("host", "energy_host_cpu_mj", "{:.2f}")

# flat columns written to results.csv (and the keys every JSON row has)
CSV_COLUMNS = [
    "policy", "tokens", "latency_ms_per_token", "latency_p99_ms", "stall_ms_per_token",
    "energy_mj_per_token", "energy_onchip_active_mj", "energy_offchip_io_mj", "energy_idle_leakage_mj",
    "energy_host_cpu_mj", "energy_pcie_mj", "edp_mj_ms", "offchip_bytes_per_token", "pcie_utilization", "overlap",
    "recall", "fallback_rate", "demand_fetches_per_token", "prefetches_issued", "prefetches_dropped",
    "prefetches_unused", "fetches_total", "peak_buffer_slots", "host_experts_per_token", "host_wait_ms_per_token",
    "surrogate_experts_per_token", "substitutions_per_token", "dropped_experts_per_token", "warmup_tokens",
    "expert_link", "expert_link_bytes_per_token", "expert_link_utilization", "energy_expert_link_mj",
]


_DISPLAY = {"lpddr5x": "LPDDR5X", "pcie": "PCIe", "ucie": "UCIe", "hbm": "HBM"}


def _hop_text(hw, name: str, comp) -> str:
    """One component of the fetch path as the header shows it: its name and usable GB/s (a serial link's data
    rate with the protocol figures it comes from)."""
    label = _DISPLAY.get(name, name)
    links = serial_links(hw)
    if name in links:
        link = links[name][1]
        if link.timing_model == "link-layer":
            completions = link.read_completion_bytes or link.max_payload_bytes
            return (f"{label} {link.data_gbps:.1f} of data per direction (link layer: {link.bandwidth_gbps:g} "
                    f"after {link.encoding}, {completions} B completions, {link.read_tags} reads of "
                    f"{link.max_read_request_bytes} B in flight; {2 * link.bandwidth_gbps:g} both ways; "
                    f"{link.wire_bytes_per_data_byte:.3f} wire bits per data bit)")
        return (f"{label} {link.data_gbps:.1f} of data per direction ({link.bandwidth_gbps:g} x "
                f"{link.max_payload_bytes}/{link.max_payload_bytes + link.tlp_overhead_bytes} TLP payload; "
                f"{2 * link.bandwidth_gbps:g} both ways)")
    u = hw.links.get(name)
    if isinstance(u, UcieConfig):  # a die-to-die link
        return f"{label} {comp.gbps:g}" if u.flit_format == "raw" else \
            f"{label} {comp.gbps:.1f} ({u.bandwidth_gbps:g} in {u.flit_format} flits)"
    if name in flash_memories(hw):
        return f"{label} {comp.gbps:.2f} (flash)"
    return f"{label} {comp.gbps:.0f}"


def _where(r, name: str) -> str:
    return "in package" if name in r.in_package else "off package"


def machine_lines(hw) -> list[str]:
    """The machine the config built, one line per role: what computes, where its operands live and how it reads
    them, where the experts are stored and staged and what a fetch crosses, what the host CPU reads."""
    r = roles(hw)
    c = hw.compute
    operand, store = hw.memory[r.operand_memory], hw.memory[r.expert_store]
    buffer = f"buffer {hw.expert_buffer.capacity_mib:g} MiB"
    staged = (f"the arrays' SRAM ({buffer} of {c.arrays} x {c.sram_mib_per_array:g} MiB)" if r.stage_in_sram
              else f"{r.staging} ({buffer})")
    link = f"; expert link {r.expert_link}" if r.expert_link else ""
    read_over = f"over {r.operand_link} ({_where(r, r.operand_link)})" if r.operand_link else "directly (no link)"
    fetched = ("read in place (no fetch, no staging copy)" if r.in_place
               else f"fetched over {' -> '.join(r.fetch_links)} into {staged}{link}")
    return [
        f"machine: compute   {c.arrays} arrays of {c.unit_rows}x{c.unit_cols} units x {c.vector_length} lanes at "
        f"{c.clock_mhz:g} MHz, {c.timing} timing",
        f"         operands  {r.operand_memory} ({operand.capacity_gib:g} GiB, {_where(r, r.operand_memory)}), read "
        f"{read_over}",
        f"         experts   stored in {r.expert_store} ({store.capacity_gib:g} GiB, {_where(r, r.expert_store)}), "
        f"{fetched}",
        f"         host CPU  {hw.host_cpu.cores} cores at {hw.host_cpu.clock_ghz:g} GHz, reads {r.host_memory}, "
        f"activations {f'over {r.host_link}' if r.host_link else 'in the same memory (no link)'}",
    ]


def header_lines(prep, fetch_path) -> list[str]:
    hw = prep.config.hw
    wl = prep.workload
    comps = components(hw)
    hops = [_hop_text(hw, name, comps[name]) for name in fetch_components(hw)]
    r = roles(hw)
    operand, host = comps[r.operand_memory], comps[r.host_memory]
    operand_label, host_label = _DISPLAY.get(operand.name, operand.name), _DISPLAY.get(host.name, host.name)
    if r.in_place:
        shared = [f"{operand_label} {operand.gbps:.0f} GB/s among operand and expert reads (read in place)"]
    elif r.stage_in_sram:
        hops.append(f"SRAM {hw.compute.sram_read_gbps:g}")
        shared = [f"SRAM {hw.compute.sram_read_gbps:g} GB/s between expert reads and "
                  f"fetch writes", f"{operand_label} {operand.gbps:.0f} GB/s among operand reads"]
    else:
        shared = [f"{operand_label} {operand.gbps:.0f} GB/s between operand reads and fetch writes (a written byte "
                  f"costs {1 + operand.turnaround:.2f} while reads run: read/write turnaround)"]
    if r.in_place and r.host_memory == r.operand_memory:
        shared[0] = shared[0].replace(" (read in place)", " and host-CPU reads (read in place)")
    elif r.in_place:
        shared.append(f"{host_label} {host.gbps:.0f} GB/s among host-CPU reads")
    elif r.expert_store == r.host_memory:
        both = f" ({host.shared_gbps:.0f} while both read: two streams in the banks)" if host.shared_gbps else ""
        shared.append(f"{host_label} {host.gbps:.0f} GB/s between fetches and host-CPU reads{both}")
    else:
        store = r.expert_store
        rate = f"{comps[store].gbps:.2f}" if store in flash_memories(hw) else f"{comps[store].gbps:.0f}"
        shared.append(f"{_DISPLAY.get(store, store)} {rate} GB/s among fetches, {host_label} "
                      f"{host.gbps:.0f} GB/s among host-CPU reads")
    return [
        f"config: {prep.config.given_path or prep.config.path}",
        f"trace:  {prep.trace.provenance_line()}",
        f"model:  {wl.model.name} ({wl.model.num_layers} layers, {wl.model.num_experts} experts top-{wl.model.top_k}), "
        f"experts at {hw.model.expert_format or f'{wl.expert_bits} bit'} = {wl.expert_bytes / 1e6:.2f} MB each, "
        + (f"non-expert weights at {hw.model.dense_bits} bit = {wl.hbm_non_expert_bytes / 1e9:.2f} GB, "
           if hw.model.dense_bits != 16 else "")
        + (_served_text(prep) if prep.served is not None else
           f"speculative ({_speculative_text(prep)}), context {wl.context_length}, " if prep.speculative is not None
           else f"{prep.batch.batch} sequences of {prep.batch.steps} tokens at context {wl.context_length}"
                f"{' (staggered)' if hw.workload.batch_contexts == 'staggered' else ''}, "
           if prep.batch is not None else f"context {wl.context_length}, " if prep.request is None else
           f"request of {prep.request.prompt_tokens} prompt + {prep.request.output_tokens} output tokens "
           f"(prefill chunks of {prep.request.chunk_tokens}), ")
        + f"buffer {wl.buffer_slots} experts",
        *machine_lines(hw),
        (f"path:   experts read in place from {fetch_path.bottleneck} {fetch_path.bandwidth_gbps:.1f} GB/s, first byte "
         f"{fetch_path.latency_ns:.0f} ns" if r.in_place else
         f"path:   expert fetch {' -> '.join(hops)} GB/s; bottleneck {fetch_path.bottleneck} "
         f"{fetch_path.bandwidth_gbps:.1f} GB/s, latency {fetch_path.latency_ns:.0f} ns"),
        f"shared: {', '.join(shared)}",
        f"memory: {'; '.join(_memory_text(hw, name) for name in memories(hw))}",
        f"compute: {wl.compute_timing}",
    ]


def _served_text(prep) -> str:
    """A served run's requests, arrivals and scheduler, as the header's model line shows them."""
    w, plan = prep.config.hw.workload, prep.served
    a, sizes = w.arrivals, plan.sizes
    when = (f"Poisson {a.poisson_rps:g}/s" if a.poisson_rps else
            f"{a.closed_users} users thinking {a.think_ms:g} ms" if a.closed_users else f"from {a.file}")
    size = (f"{w.prompt_tokens} prompt + {w.output_tokens} output tokens" if not a.file else
            f"{int(sizes.prompt.mean())} prompt + {int(sizes.output.mean())} output tokens on average")
    chunk = f", prompt chunks of {plan.chunk_tokens}" if plan.chunk_tokens else ""
    return (f"{sizes.count} requests of {size} arriving {when}, {plan.scheduler} scheduler ({plan.max_sequences} "
            f"sequences, {plan.max_step_tokens} tokens a step{chunk}; KV cache {plan.kv_capacity_bytes / 2**20:.0f} "
            f"MiB; {plan.windows} trace windows of {plan.window_tokens}), ")


def _speculative_text(prep) -> str:
    s = prep.config.hw.workload.speculative
    steps = prep.speculative.steps
    draft = (f"prompt lookup of up to {s.draft_tokens} tokens, n-gram {s.ngram}" if s.draft == "prompt-lookup" else
             f"{s.draft_tokens} draft tokens accepted at rate {s.acceptance:g}")
    return f"{draft}: {sum(st.accepted + 1 for st in steps)} tokens in {len(steps)} steps"


def _memory_text(hw, name: str) -> str:
    """Where a memory's figures come from: the closed form or the command-level model, and what they are; a flash
    device's, its closed-loop read bound (chipsim/hw/flash.py)."""
    label = _DISPLAY.get(name, name)
    flash = flash_memories(hw).get(name)
    if flash:
        return f"{label} flash: {flash_text(flash[1])}"
    t = memory_timing(hw, name)
    model = t.source if t.source != "closed-form" else "closed form"
    return (f"{label} {model}: {100 * t.effective_gbps / t.peak_gbps:.1f} % of {t.peak_gbps:.0f} GB/s, turnaround "
            f"{t.turnaround:.2f}, first byte {t.access_latency_ns:.1f} ns")


def table_preface(prep, rows: list[dict]) -> list[str]:
    """What comes before the results table: a request's own table, and what a row is when it is not one token."""
    if prep.served is not None:
        steps = rows[0]["served"]["steps"] if rows else 0
        return [format_served_table(rows), "", f"per step (means over the steps each policy's run took; "
                f"the first policy's: {steps}):"]
    if prep.request is not None:
        return [format_request_table(rows), "", f"per decode step (means over its {prep.request.decode_steps} steps):"]
    if prep.speculative is not None:
        return ["per step (lat ms: a step, its input token and drafts verified in one pass; tok/step: accepted "
                "drafts + 1; ms/tok, tok/s, mJ/tok: per output token):"]
    if prep.batch is not None:
        return [f"per decode step of {prep.batch.batch} tokens, one of each sequence (lat ms: each sequence's time "
                "per token; E mJ and off-chip MB: the step's; tok/s and mJ/tok: per output token):"]
    return []


def table_columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(header, key, format) of the printed results table for these rows (`chipsim report` shows the same)."""
    link = rows[0].get("expert_link", "") if rows else ""
    columns = [(_DISPLAY.get(link, link) or "link", key, fmt) if key == "energy_expert_link_mj" else (head, key, fmt)
               for head, key, fmt in TABLE_COLUMNS]
    if any(row.get("energy_host_cpu_mj") for row in rows):  # only policies that use the host CPU have it
        columns.insert(8, HOST_COLUMN)
    if rows and rows[0].get("batch", 1) > 1:  # per step of B tokens, then per output token
        columns += [("tok/s", "tokens_per_s", "{:.1f}"), ("mJ/tok", "energy_mj_per_output_token", "{:.2f}")]
    if rows and "tokens_per_step" in rows[0]:  # per verify step, then per output token
        columns += [("tok/step", "tokens_per_step", "{:.2f}"), ("ms/tok", "latency_ms_per_output_token", "{:.3f}"),
                    ("tok/s", "tokens_per_s", "{:.1f}"), ("mJ/tok", "energy_mj_per_output_token", "{:.2f}")]
    return columns


def table_value(row: dict, key: str):
    """A row's value as the table shows it (the link's bytes in MB)."""
    value = row[key]
    return value / 1e6 if key == "expert_link_bytes_per_token" and value is not None else value


def format_table(rows: list[dict]) -> str:
    columns = table_columns(rows)
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        cells.append([fmt.format(table_value(row, key)) for _, key, fmt in columns])
    return _aligned(cells)


def _aligned(cells: list[list[str]]) -> str:
    """Rows of cells as a text table: the first column left-aligned, the others right, a rule under the header."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    out = []
    for n, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# (column header, key in row["request"], format) of a request's table (chipsim.sim.metrics.request_summary)
REQUEST_TABLE = [
    ("policy", None, "{}"),
    ("TTFT ms", "ttft_ms", "{:.3f}"),
    ("TPOT ms", "tpot_ms_mean", "{:.3f}"),
    ("p50", "tpot_ms_p50", "{:.3f}"),
    ("p99", "tpot_ms_p99", "{:.3f}"),
    ("e2e ms", "e2e_ms", "{:.2f}"),
    ("tok/s", "tokens_per_s", "{:.2f}"),
    ("prefill mJ", "energy_prefill_mj", "{:.1f}"),
    ("decode mJ", "energy_decode_mj", "{:.1f}"),
    ("request mJ", "energy_request_mj", "{:.1f}"),
    ("prefill MB", "prefill_link_mb", "{:.1f}"),
    ("prefill stall ms", "prefill_stall_ms", "{:.3f}"),
]


# (column header, key in row["served"], format) of a served run's table (chipsim.serve.metrics.served_summary)
SERVED_TABLE = [
    ("policy", None, "{}"),
    ("TTFT p50", "ttft_ms_p50", "{:.2f}"),
    ("p99", "ttft_ms_p99", "{:.2f}"),
    ("TPOT p50", "tpot_ms_p50", "{:.3f}"),
    ("p99", "tpot_ms_p99", "{:.3f}"),
    ("queue p99", "queue_ms_p99", "{:.2f}"),
    ("e2e ms", "e2e_ms_mean", "{:.1f}"),
    ("req/s", "requests_per_s", "{:.2f}"),
    ("tok/s", "tokens_per_s", "{:.1f}"),
    ("mJ/req", "energy_mj_per_request", "{:.1f}"),
    ("mJ/tok", "energy_mj_per_output_token", "{:.2f}"),
    ("in system", "mean_in_system", "{:.2f}"),
]


def format_served_table(rows: list[dict]) -> str:
    """A served run per policy (ms): TTFT and TPOT p50 and p99 over the requests, queueing p99, mean end to end,
    throughput, energy per request and per output token, the mean number of requests in the system, and SLO
    attainment where --slo gave one."""
    columns = list(SERVED_TABLE)
    if rows and rows[0]["served"].get("slo"):
        columns.append(("SLO met", "slo_attainment", "{:.3f}"))
    cells = [[head for head, _, _ in columns]]
    for row in rows:
        cells.append([fmt.format(row["policy"] if key is None else row["served"][key]) for _, key, fmt in columns])
    return _aligned(cells)


def format_request_table(rows: list[dict]) -> str:
    """A whole request per policy: TTFT, TPOT (mean, p50, p99), end to end, output tokens/s, energy of prefill, decode
    and the request, the bytes prefill moved over the expert link and its stall."""
    cells = [[head for head, _, _ in REQUEST_TABLE]]
    for row in rows:
        req = dict(row["request"], prefill_link_mb=row["request"]["prefill"]["expert_link_bytes"] / 1e6,
                   prefill_stall_ms=row["request"]["prefill"]["stall_ms"])
        cells.append([fmt.format(row["policy"] if key is None else req[key]) for _, key, fmt in REQUEST_TABLE])
    return _aligned(cells)


# rates of a quality record (chipsim.tracegen.quality), in the order `quality_lines` prints them: key, text after
# the percentage; drop_rate only when non-zero
QUALITY_RATES = (
    ("substitution_rate", "of routed experts substituted"),
    ("drop_rate", "dropped"),
    ("deviation_rate", "of routed experts replaced by the pre-gate's choice"),
    ("surrogate_rate", "of routed experts replaced by surrogates (every low-confidence draft miss, SPICE cache "
                       "ignored: an upper bound)"),
    ("kept_channel_share", "of the gate/down channels kept"),
    ("intra_predictor_recall", "of the kept channels foreseen by the intra-expert predictor"),
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
    on the trace's model (meta['quality'], chipsim.tracegen.quality), or why it is not measured. Policies that
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


def json_rows(rows: list[dict]) -> list[dict]:
    """The rows as `--json` prints them: without the per-layer breakdowns, energy per component, the warm-up summary
    and a served run's per-request lists (results.json keeps them)."""
    out = []
    for row in rows:
        brief = {k: v for k, v in row.items() if k not in ("per_layer", "energy_by_component_mj", "warmup")}
        if "served" in brief:  # (each request's times: results.json and requests-POLICY.csv)
            brief["served"] = {k: v for k, v in brief["served"].items() if k not in SERVED_PER_REQUEST}
        out.append(brief)
    return out


# a served row's per-request lists (row["served"]): in results.json, not in --json
SERVED_PER_REQUEST = ("per_request", "arrival_ms", "window")


def _json_safe(obj):
    """NaN and infinities (a value that is undefined for a run) become null: JSON has no such numbers, and
    a reader should never meet the non-standard `NaN` that Python writes by default."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def to_json(obj) -> str:
    return json.dumps(_json_safe(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


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
    """Write results.csv and results.json, each whole or not at all (a served run: requests-POLICY.csv too), then
    remove the requests-*.csv an earlier run left in the folder that this one did not write: the folder holds one
    run's results, as results.csv and results.json replace the earlier run's."""
    write_atomic(os.path.join(out_dir, "results.csv"), to_csv(rows), what="--out")
    write_atomic(os.path.join(out_dir, "results.json"), to_json({"run": run_info, "results": rows}), what="--out")
    written = set()
    for row in rows:  # a served run: one line per request and policy
        if "served" in row:
            name = f"requests-{_file_label(row['policy'])}.csv"
            written.add(name)
            write_atomic(os.path.join(out_dir, name), requests_csv(row), what="--out")
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if name.startswith("requests-") and name.endswith(".csv") and name not in written and os.path.isfile(path):
            try:
                os.unlink(path)
            except OSError as exc:
                raise InputError(f"--out {out_dir}: cannot remove {name}, an earlier run's ({exc.strerror})") from None


def _file_label(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def requests_csv(row: dict) -> str:
    """A served run's requests, one line each (chipsim.serve.metrics.REQUEST_CSV_COLUMNS) from a result row."""
    served = row["served"]
    times = served["per_request"]
    lines = ["request,arrival_ms,window,queue_ms,ttft_ms,tpot_ms,e2e_ms"]
    for r, arrival in enumerate(served["arrival_ms"]):
        cells = [str(r), repr(arrival), str(served["window"][r])]
        cells += ["" if v is None or v != v else repr(v) for v in (times[k][r] for k in ("queue_ms", "ttft_ms",
                                                                                        "tpot_ms", "e2e_ms"))]
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"
