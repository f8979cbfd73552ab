"""What each results.csv column means, in one place: the documentation's reference page is generated from these
mappings (chipsim/analysis/docs_gen.py), and tests/test_columns.py holds them to the columns the code writes, so
that a column added without a meaning, or a meaning left for a column that is gone, fails a test.

A run's results.csv is report.CSV_COLUMNS (every run), then the columns of its mode (a whole request, a batch, a
speculative or a served run), then the scalar metrics its policies report (report.csv_columns). Lists and
mappings (per-layer breakdowns, energy per component, quality records) stay in results.json only.
"""

from __future__ import annotations

# report.CSV_COLUMNS, in that order: every run writes them
RUN_COLUMNS: dict[str, str] = {
    "policy": "the policy's label as given (`apex`, `static-4`, `apex:tau=0.6`, `on-demand+apex`)",
    "tokens": "decode steps the means are taken over (after the warm-up steps)",
    "latency_ms_per_token": "decode-step wall time per token, mean (ms)",
    "latency_p99_ms": "decode-step wall time per token, 99th percentile (ms)",
    "stall_ms_per_token": ("array time spent waiting only for expert bytes (or the host that issues them: "
                           "host_frontend), per token (ms)"),
    "energy_mj_per_token": ("total energy per token (mJ): on-chip + off-chip + idle + host CPU (the expert link's "
                            "energy is part of off-chip)"),
    "energy_onchip_active_mj": "energy of the in-package components' actions per token (arrays, SRAM, operand "
                               "memory and link; mJ)",
    "energy_offchip_io_mj": "energy of the actions outside the package per token (expert store, expert link; mJ)",
    "energy_idle_leakage_mj": "every component's static power over the decode time, per token (mJ)",
    "energy_host_cpu_mj": "the host CPU's busy energy per token, computing experts (mJ)",
    "energy_pcie_mj": "alias kept for one release: the host link's energy per token (the link named pcie in every "
                      "shipped config; on thor also the expert link, on thor-cxl not; mJ)",
    "edp_mj_ms": "mean energy per token × mean latency per token (mJ·ms)",
    "offchip_bytes_per_token": "alias kept for one release of `expert_link_bytes_per_token` (bytes)",
    "pcie_utilization": "alias kept for one release of `expert_link_utilization`",
    "overlap": "share of token-layers whose whole routed set was in the buffer (arrived or on its way) when routing "
               "decided",
    "recall": "mean share of a layer's routed experts in the buffer when routing decided",
    "fallback_rate": "share of routed experts not in the buffer when routing decided (fetched on demand, run on the "
                     "host CPU or replaced)",
    "demand_fetches_per_token": "expert fetches issued after routing, per token",
    "prefetches_issued": "expert prefetches the policy issued over the run",
    "prefetches_dropped": "prefetches refused because no buffer slot was free (a prefetch never evicts)",
    "prefetches_unused": "prefetched experts evicted before they were computed",
    "fetches_total": "expert transfers of any kind over the run",
    "peak_buffer_slots": "most expert slots held at once (arrived, on their way, or stopping)",
    "host_experts_per_token": "routed experts computed on the host CPU, per token",
    "host_wait_ms_per_token": "time the arrays waited for the host CPU's experts, per token (ms)",
    "surrogate_experts_per_token": "routed experts replaced by a low-rank surrogate (SPICE's LoRE), per token",
    "substitutions_per_token": "routed experts replaced by another expert already in the buffer, per token",
    "dropped_experts_per_token": "routed experts not computed at all, per token",
    "warmup_tokens": "decode steps set aside as cache warm-up (results.json summarises them apart)",
    "expert_link": "the link that brings experts into the package (`roles`: the last fetch link outside it; thor: "
                   "pcie); the table heads its energy column with its name",
    "expert_link_bytes_per_token": "bytes that crossed the expert link per token (the table's \"off-chip MB\")",
    "expert_link_utilization": "those bytes over what the link could move in the same time: bytes per token / "
                               "(latency per token × per-direction data bandwidth)",
    "energy_expert_link_mj": "the expert link's energy per token (mJ)",
}

# the columns of a run's mode, after RUN_COLUMNS (chipsim.sim.metrics and chipsim.serve.metrics name them)
MODE_COLUMNS: dict[str, dict[str, str]] = {
    "several tokens a step (a batch or speculative run)": {
        "union_experts_per_layer": "experts one MoE layer of a step routes to: the union of its tokens' sets, mean",
    },
    "a whole request (workload.prompt_tokens, workload.output_tokens)": {
        "ttft_ms": "time to first token: the prefill chunks, the first token's LM head included (ms)",
        "tpot_ms_mean": "time per output token over the decode steps, mean (ms)",
        "tpot_ms_p50": "time per output token over the decode steps, median (ms)",
        "tpot_ms_p99": "time per output token over the decode steps, 99th percentile (ms)",
        "e2e_ms": "the request end to end: prefill and every decode step (ms)",
        "tokens_per_s": "output tokens per second of the request end to end",
        "energy_request_mj": "energy of the whole request (mJ)",
        "energy_prefill_mj": "energy of the prefill chunks (mJ)",
        "energy_decode_mj": "energy of the decode steps (mJ)",
        "prefill_kept_experts": "experts the prefill policy left in the buffer for decode (its `keep`)",
        "prefill_host_experts": "experts fiddler-prefill computed on the host CPU during prefill",
    },
    "a batch (workload.batch > 1)": {
        "batch": "sequences decoded together; the other means are per step of that many tokens",
        "tokens_per_s": "output tokens per second over all sequences",
        "energy_mj_per_output_token": "energy per output token: the step's energy over the batch (mJ)",
        "offchip_bytes_per_output_token": "bytes over the expert link per output token",
    },
    "speculative decoding (workload.speculative.draft_tokens > 0)": {
        "tokens_per_step": "tokens each step yields: its accepted drafts and one of its own, mean",
        "acceptance_rate": "share of drafted tokens accepted (empty where none was drafted)",
        "tokens_per_s": "output tokens per second",
        "latency_ms_per_output_token": "decode time per output token (ms)",
        "energy_mj_per_output_token": "energy per output token (mJ)",
    },
    "served requests (workload.requests > 0)": {
        "requests": "requests served",
        "ttft_ms_p50": "time to first token, median over requests (ms)",
        "ttft_ms_p90": "time to first token, 90th percentile (ms)",
        "ttft_ms_p99": "time to first token, 99th percentile (ms)",
        "tpot_ms_p50": "time per output token, median over requests (ms)",
        "tpot_ms_p90": "time per output token, 90th percentile (ms)",
        "tpot_ms_p99": "time per output token, 99th percentile (ms)",
        "queue_ms_p50": "time a request waited before it was admitted, median (ms)",
        "queue_ms_p99": "time a request waited before it was admitted, 99th percentile (ms)",
        "e2e_ms_mean": "a request end to end, mean (ms)",
        "requests_per_s": "requests completed per second",
        "tokens_per_s": "output tokens per second over all requests",
        "energy_mj_per_request": "energy per request (mJ)",
        "energy_mj_per_output_token": "energy per output token (mJ)",
        "slo_attainment": "share of requests within `--slo` (empty without one)",
    },
}

# scalar metrics a policy reports (Policy.extra_metrics): results.csv carries them for that policy's rows only
POLICY_COLUMNS: dict[str, str] = {
    "quality_mode": "the approximation the run makes, in words (`tau 0.9`); empty where every routed expert is "
                    "computed as routed",
    "quality_cost": "the measured quality record, a mapping kept in results.json; results.csv has this column only "
                    "where no row of the run has a record, and then empty",
    "quality_source": "where the quality record came from, or why there is none (results.json's `quality_cost` "
                      "holds the record)",
    "tau": "apex, apex-sf: the CDF threshold τ the extra prefetches are chosen at",
    "mean_delta_hat": "apex, apex-sf: extra experts prefetched beyond top-k (δ̂), mean over token-layers",
    "mean_delta_star": "apex, apex-sf: extra experts that would have been needed to cover the routed set (δ*), mean",
    "coverage": "apex, apex-sf: share of token-layers where δ* ≤ δ̂ (the prefetch covered the routed set)",
    "substitution_rate": "apex-sf: share of routed experts replaced by a prefetched one",
    "drop_rate": "apex-sf: share of routed experts dropped",
    "cache_slots": "caching policies: expert slots of the cache (promoe: 0 with cache=false)",
    "resident_rate": "lru, lfu, adapmoe, cg-moe: share of executed experts already in the cache",
    "warmup_resident_rate": "lru, lfu, adapmoe, cg-moe: the same over the warm-up tokens",
    "gate_threshold": "adapmoe: cumulative router weight past which trailing experts are dropped",
    "deviation_rate": "adapmoe, pregated: share of routed experts not computed as the router chose",
    "prefetch_accuracy": "adapmoe: share of the predicted experts the router then chose",
    "prefetch_coverage": "adapmoe: share of executed experts that had been predicted",
    "prefetches_refused": "adapmoe, promoe: prefetches the policy wanted but could not place (no room it may "
                          "evict, or no free slot)",
    "cgmoe_host_share": "cg-moe: share of cache misses sent to the host CPU rather than fetched",
    "floe_expert_bytes": "floe: bytes of one compressed expert",
    "floe_compression": "floe: compression ratio of an expert against BF16",
    "floe_sparse_expert_speedup": "floe: speed-up of a sparse expert's compute against a dense one",
    "floe_quality_delta_ppl_pct": "floe: held-out perplexity change of FloE's format at the run's sparsity (%)",
    "floe_sparse_only_delta_ppl_pct": "floe: the same with the up projection left BF16 (%)",
    "floe_note": "floe: said where FloE's format replaces a model.expert_bits other than 16",
    "mixtral_offloading_expert_bytes": "mixtral-offloading: bytes of one HQQ-quantised expert",
    "mixtral_offloading_bits": "mixtral-offloading: bits per quantised weight",
    "fiddler_placed_experts": "fiddler: experts placed in the buffer for the whole run",
    "layers_without_pregate_per_token": "pregated: MoE layers per token with no pre-gate prediction, which run the "
                                        "router's set",
    "cache_resident_rate": "promoe: share of executed experts in the buffer when needed",
    "warmup_cache_resident_rate": "promoe: the same over the warm-up tokens",
    "resident_from_cache_rate": "promoe: share of executed experts kept from earlier tokens rather than prefetched",
    "prediction_recall": "promoe: share of the routed experts its next-layer predictor named",
    "spice_fetched_misses_per_token": "spice: misses fetched over the expert link, per token",
    "spice_low_confidence_misses_per_token": "spice: misses at low draft confidence (served by the surrogate), per "
                                             "token",
    "mean_prefetch_depth": "spice: layers ahead its drafts prefetched, mean",
    "spice_d_min": "spice: the least prefetch depth D_min",
    "spice_depth_cut_by_buffer": "spice: times a draft's prefetch stopped short of its depth for want of room in "
                                 "the buffer",
    "spice_cache_slots": "spice: expert slots of its cache",
    "spice_surrogate": "spice: what its surrogates are and where their quality comes from, in words",
    "spice_lore_hbm_bytes": "spice: bytes of the LoRE surrogates kept in HBM",
}


def all_columns() -> dict[str, str]:
    """Every column name chipsim documents, with its meaning (a mode's column that two modes share keeps the first
    mode's meaning here; the reference page lists each mode's own)."""
    out = dict(RUN_COLUMNS)
    for columns in MODE_COLUMNS.values():
        for name, meaning in columns.items():
            out.setdefault(name, meaning)
    out.update(POLICY_COLUMNS)
    return out
