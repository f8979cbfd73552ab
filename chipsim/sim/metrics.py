"""Per-policy metrics from a simulation result: the row of the results table, its per-layer breakdowns and the
warm-up summary.

- latency: wall time of one token's decode step; stall: array time spent waiting only for expert bytes
  (or for the host that issues them, where host_frontend describes it)
- energy: the ledger's per-component energy, summed into the three categories; EDP = mean energy ×
  mean latency per token
- overlap: share of token-layers whose whole routed set was in the buffer (arrived or on its way) when
  routing decided; recall: mean share of routed experts in the buffer then
- expert_link: the link that brings experts into the package (chipsim.hw.machine's roles; thor: pcie)
- expert_link_bytes_per_token: bytes that crossed it per token; energy_expert_link_mj: its energy per token
- expert_link_utilization: those bytes over what that link could have moved in the same time (mean bytes per
  token / (mean latency per token × its per-direction data bandwidth, after TLP overhead)); the SPICE paper's
  "PCIe utilisation"
- aliases kept for one release (the names from before components had roles): offchip_bytes_per_token =
  expert_link_bytes_per_token, pcie_utilization = expert_link_utilization, and energy_pcie_mj, the host link's
  energy (the link named pcie in every shipped config; thor's is also its expert link), or the expert link's where
  the host CPU has no link
Means are over the tokens after `warmup_tokens`; warm-up tokens are summarised separately.
"""

from __future__ import annotations

import numpy as np

from chipsim.sim.energy import ACTIONS, CATEGORIES, EnergyTable
from chipsim.sim.record import SimResult
from chipsim.units import PS_PER_MS

PJ_PER_MJ = 1e9


def per_token_energy_pj(result: SimResult, table: EnergyTable) -> dict[str, np.ndarray]:
    """Energy per token of every component and action (pJ): action counts × the table, static power × time."""
    tok = result.per_token
    act = {a: tok.actions[a].astype(np.float64) for a in ACTIONS}
    pj = table.pj_per_action
    out = {c: tok.bytes[c].astype(np.float64) * 8 * table.pj_per_bit[c] for c in table.moves}
    if table.profiled:  # operations with a measured energy: their operand bits are in it, not priced per bit
        for c in table.operand_components:
            out[c] -= tok.unpriced_operand_bytes.astype(np.float64) * 8 * table.pj_per_bit[c]
    out["arrays_mac"] = act["mac"] * pj["mac"]
    out["arrays_sfu"] = act["sfu_op"] * pj["sfu_op"]
    out["arrays_vector"] = act["vector_op"] * pj["vector_op"]
    out["arrays_sram"] = act["sram_read_bit"] * pj["sram_read_bit"] + act["sram_write_bit"] * pj["sram_write_bit"]
    clocked_ps = ((tok.occupied_ps if table.clock_by_occupancy else tok.busy_ps) if table.clock_gated
                  else tok.latency_ps)
    out["arrays_clock"] = clocked_ps.astype(np.float64) * table.clock_w  # W × ps = pJ
    latency_ps = tok.latency_ps.astype(np.float64)
    for comp, watts in table.static_w.items():
        out[f"static_{comp}"] = latency_ps * watts
    out["host_cpu"] = tok.host_busy_ps.astype(np.float64) * table.host_active_w
    if table.profiled:
        out["arrays_profiled"] = tok.profiled_pj.astype(np.float64)
    return out


def _span_summary(result: SimResult, table: EnergyTable, sl: slice, link: str) -> dict:
    tok = result.per_token
    latency_ms = tok.latency_ps[sl] / PS_PER_MS
    comp = {c: v[sl] for c, v in per_token_energy_pj(result, table).items()}
    comp_mj = {c: float(v.mean() / PJ_PER_MJ) for c, v in comp.items()}
    cat_mj = {cat: 0.0 for cat in CATEGORIES}
    for c, v in comp_mj.items():
        cat_mj[table.category_of[c]] += v
    total_mj = float(sum(cat_mj.values()))
    mean_latency = float(latency_ms.mean())
    hits = result.per_layer.hits[sl]
    return {
        "tokens": int(latency_ms.size),
        "latency_ms_per_token": mean_latency,
        "latency_p99_ms": float(np.percentile(latency_ms, 99)),
        "stall_ms_per_token": float((tok.stall_ps[sl] / PS_PER_MS).mean()),
        "energy_mj_per_token": total_mj,
        "energy_onchip_active_mj": cat_mj["onchip_active"],
        "energy_offchip_io_mj": cat_mj["offchip_io"],
        "energy_idle_leakage_mj": cat_mj["idle_leakage"],
        "energy_host_cpu_mj": cat_mj["host_cpu"],
        "energy_pcie_mj": comp_mj.get(table.host_link or link, 0.0),
        "energy_by_component_mj": comp_mj,
        "edp_mj_ms": total_mj * mean_latency,
        "offchip_bytes_per_token": float(tok.bytes[link][sl].mean()) if link else 0.0,
        "overlap": float(result.per_layer.overlap[sl].mean()),
        "hits_per_layer": float(hits.mean()),
    }


def summarize(result: SimResult, table: EnergyTable, top_k: int, warmup_tokens: int = 0,
              link_gbps: float | None = None, link: str = "pcie") -> dict:
    """The policy's row for the results table, plus per-layer breakdowns and a warm-up summary. `link`: the link
    into the package, whose bytes are the off-chip traffic; `link_gbps`: its data bandwidth per direction."""
    first = result.prefill_steps  # a request's decode steps follow its prefill chunks; it needs no warm-up
    warmup = min(warmup_tokens, result.tokens - 1) if not first and result.served is None else 0
    if result.speculative is not None:  # the steps whose input token is among the warm-up tokens
        warmup = min(int((result.speculative[:, 0] < warmup_tokens).sum()), result.tokens - 1)
    sl = slice(first + warmup, None)
    row = {"policy": result.policy}
    row.update(_span_summary(result, table, sl, link))
    row["recall"] = row.pop("hits_per_layer") / top_k
    row["pcie_utilization"] = (row["offchip_bytes_per_token"] / (row["latency_ms_per_token"] * 1e-3
                                                                  * link_gbps * 1e9)
                               if link_gbps else float("nan"))
    row["expert_link"] = link
    row["expert_link_bytes_per_token"] = row["offchip_bytes_per_token"]
    row["expert_link_utilization"] = row["pcie_utilization"]
    row["energy_expert_link_mj"] = row["energy_by_component_mj"].get(link, 0.0)  # no link: read in place
    layers, counts = result.per_layer, result.counts
    row["demand_fetches_per_token"] = float(layers.demand_fetches[sl].sum(axis=1).mean())
    row["host_wait_ms_per_token"] = float((result.per_token.host_wait_ps[sl] / PS_PER_MS).mean())
    row["host_experts_per_token"] = float(layers.host[sl].sum(axis=1).mean())
    row["surrogate_experts_per_token"] = float(layers.surrogate[sl].sum(axis=1).mean())
    row["substitutions_per_token"] = float(layers.substituted[sl].sum(axis=1).mean())
    row["dropped_experts_per_token"] = float(layers.dropped[sl].sum(axis=1).mean())
    if result.union is not None:  # a batch: each layer's routed experts are the union of its tokens' sets
        union, hits = result.union[sl], layers.hits[sl]
        row["recall"] = float(hits.sum() / union.sum())
        row["fallback_rate"] = float(((union - hits).sum(axis=1) / union.sum(axis=1)).mean())
        row[UNION_COLUMN] = float(union.mean())  # experts a step's MoE layer needs (top-k for one token)
    else:
        routed = top_k * layers.hits.shape[1]
        row["fallback_rate"] = float((routed - layers.hits[sl].sum(axis=1)).mean() / routed)
    row["prefetches_issued"] = counts.prefetches_issued
    row["prefetches_dropped"] = counts.prefetches_dropped
    row["prefetches_unused"] = counts.prefetches_unused
    row["fetches_total"] = counts.fetches_total
    row["peak_buffer_slots"] = counts.peak_buffer_slots
    row["warmup_tokens"] = warmup
    if warmup:
        w = _span_summary(result, table, slice(0, warmup), link)
        w["recall"] = w.pop("hits_per_layer") / top_k
        if result.union is not None:  # the union's experts, as in the measured steps
            w["recall"] = float(layers.hits[:warmup].sum() / result.union[:warmup].sum())
        row["warmup"] = {k: v for k, v in w.items() if k != "energy_by_component_mj"}
    row["per_layer"] = {
        "overlap": [float(x) for x in layers.overlap[sl].mean(axis=0)],
        "recall": ([float(x) for x in layers.hits[sl].mean(axis=0) / top_k] if result.union is None else
                   [float(x) for x in layers.hits[sl].sum(axis=0) / result.union[sl].sum(axis=0)]),
        "stall_ms": [float(x) for x in layers.stall_ps[sl].mean(axis=0) / PS_PER_MS],
        "demand_fetches": [float(x) for x in layers.demand_fetches[sl].mean(axis=0)],
    }
    if first:
        req = request_summary(result, table, link)
        row.update({key: req[key] for key in REQUEST_COLUMNS})
        row["request"] = req
    if result.batch > 1:  # a step is one token of each sequence: per output token, the step's share
        row.update(batch_columns(row, result.batch))
    if result.speculative is not None:
        row.update(speculative_columns(result, row, sl))
    row.update(result.extra)
    return row


# the per-layer lists of every result row (row["per_layer"], above): what a per_layer plot can draw
PER_LAYER_FIELDS = ("overlap", "recall", "stall_ms", "demand_fetches")

# a step of several tokens: the mean number of experts one of its MoE layers routes to (the union of its tokens')
UNION_COLUMN = "union_experts_per_layer"

# a batch run's columns (workload.batch > 1): the table's other columns are per step of `batch` tokens
BATCH_COLUMNS = ("batch", "tokens_per_s", "energy_mj_per_output_token", "offchip_bytes_per_output_token")


# a speculative run's columns (workload.speculative): the table's other columns are per step
SPECULATIVE_COLUMNS = ("tokens_per_step", "acceptance_rate", "tokens_per_s", "latency_ms_per_output_token",
                       "energy_mj_per_output_token")


def speculative_columns(result: SimResult, row: dict, sl: slice) -> dict:
    """Per output token of a speculative run: each step yields its accepted drafts and one token of its own."""
    steps = result.speculative[sl]
    produced = int((steps[:, 2] + 1).sum())
    drafted = int((steps[:, 1] - 1).sum())
    total_ms = float(result.per_token.latency_ps[sl].sum() / PS_PER_MS)
    return {
        "tokens_per_step": produced / len(steps),
        "acceptance_rate": float(steps[:, 2].sum() / drafted) if drafted else None,
        "tokens_per_s": produced / (total_ms / 1e3),
        "latency_ms_per_output_token": total_ms / produced,
        "energy_mj_per_output_token": row["energy_mj_per_token"] * len(steps) / produced,
    }


def fill_batch_columns(df):
    """A DataFrame of result rows with the batch columns a one-sequence decode-only row implies (batch 1, tokens/s
    from its latency, per-output-token shares equal to its per-step means), so that a sweep over workload.batch
    draws and tabulates its B = 1 point too; request rows and batch rows are left as they are."""
    if "latency_ms_per_token" not in df.columns:
        return df
    df = df.copy()
    for column in BATCH_COLUMNS:
        if column not in df.columns:
            df[column] = float("nan")
    single = df["batch"].isna() & df["tokens_per_s"].isna()  # (a speculative row has its own per-token columns)
    if "ttft_ms" in df.columns:
        single &= df["ttft_ms"].isna()
    df.loc[single, "batch"] = 1
    df.loc[single, "tokens_per_s"] = 1e3 / df.loc[single, "latency_ms_per_token"]
    for column, source in (("energy_mj_per_output_token", "energy_mj_per_token"),
                           ("offchip_bytes_per_output_token", "offchip_bytes_per_token")):
        if source in df.columns:
            df.loc[single, column] = df.loc[single, source]
    return df


def batch_columns(row: dict, batch: int) -> dict:
    """Throughput and per-token shares of a batch run's per-step means: every sequence gets one token a step."""
    return {
        "batch": batch,
        "tokens_per_s": batch / (row["latency_ms_per_token"] / 1e3),
        "energy_mj_per_output_token": row["energy_mj_per_token"] / batch,
        "offchip_bytes_per_output_token": row["offchip_bytes_per_token"] / batch,
    }


# a request's metrics that the results table, results.csv and sweeps carry as columns (all in row["request"])
REQUEST_COLUMNS = ("ttft_ms", "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99", "e2e_ms", "tokens_per_s",
                   "energy_request_mj", "energy_prefill_mj", "energy_decode_mj")


def _request_part(result: SimResult, energy: dict[str, np.ndarray], table: EnergyTable, sl: slice,
                  link: str) -> dict:
    """Sums over a request's prefill chunks or decode steps: time, stall, energy by category and component, bytes
    over the expert link, demand fetches."""
    tok = result.per_token
    comp = {c: float(v[sl].sum() / PJ_PER_MJ) for c, v in energy.items()}
    cat = {c: 0.0 for c in CATEGORIES}
    for c, v in comp.items():
        cat[table.category_of[c]] += v
    return {
        "steps": int(tok.latency_ps[sl].size),
        "latency_ms": float(tok.latency_ps[sl].sum() / PS_PER_MS),
        "stall_ms": float(tok.stall_ps[sl].sum() / PS_PER_MS),
        "energy_mj": float(sum(cat.values())),
        "energy_onchip_active_mj": cat["onchip_active"],
        "energy_offchip_io_mj": cat["offchip_io"],
        "energy_idle_leakage_mj": cat["idle_leakage"],
        "energy_host_cpu_mj": cat["host_cpu"],
        "energy_by_component_mj": comp,
        "expert_link_bytes": int(tok.bytes[link][sl].sum()) if link else 0,
        "demand_fetches": int(result.per_layer.demand_fetches[sl].sum()),
        "host_experts": int(result.per_layer.host[sl].sum()),
    }


def request_summary(result: SimResult, table: EnergyTable, link: str) -> dict:
    """A whole request: TTFT (its prefill chunks, the last one's LM head giving the first token), TPOT over its decode
    steps (mean, p50, p99), end-to-end time, output tokens per second, and energy split into prefill and decode."""
    n = result.prefill_steps
    latency = result.per_token.latency_ps
    energy = per_token_energy_pj(result, table)
    prefill = _request_part(result, energy, table, slice(0, n), link)
    decode = _request_part(result, energy, table, slice(n, None), link)
    tpot = latency[n:] / PS_PER_MS
    e2e_ms = float(latency.sum() / PS_PER_MS)
    output = int(tpot.size) + 1
    return {
        "prompt_tokens": int(sum(result.prefill_chunk_tokens)),
        "output_tokens": output,
        "prefill_chunk_tokens": list(result.prefill_chunk_tokens),
        "ttft_ms": prefill["latency_ms"],
        "tpot_ms_mean": float(tpot.mean()),
        "tpot_ms_p50": float(np.percentile(tpot, 50)),
        "tpot_ms_p99": float(np.percentile(tpot, 99)),
        "e2e_ms": e2e_ms,
        "tokens_per_s": output / (e2e_ms / 1e3),
        "energy_request_mj": prefill["energy_mj"] + decode["energy_mj"],
        "energy_prefill_mj": prefill["energy_mj"],
        "energy_decode_mj": decode["energy_mj"],
        "prefill": prefill,
        "decode": decode,
    }
