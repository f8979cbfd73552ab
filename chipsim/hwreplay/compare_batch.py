"""Simulated vs measured batch decode steps (per-step latency and the board's energy per step): `chipsim hwcompare
--batch-regime NAME PATH` (no torch).

A batch measurement file (`chipsim hwreplay --batch B`, chipsim.hwreplay.run.replay_batch_config) holds one case
per (context, policy). Each case's plan is rebuilt from the config and overrides the file names (same code, config
and trace give the same decisions: the digest must match the one measured); each step's simulated latency is set
beside its measured one (the mean over the measured replays), the simulated board energy per step beside the
counter's over each replay divided by its steps, and the plan's bytes beside the bytes the GPU copied. The 'array
model only' column is the same batch without the config's measured operation times.
"""

from __future__ import annotations

import statistics

from chipsim.errors import InputError
from chipsim.hwreplay.compare_prefill import (ARRAY_MODEL_ONLY, _resolve, mape, read_measurement, replay_regimes,
                                              rows_of, table_source)
from chipsim.hwreplay.energy_table import above_idle_j, board_mj
from chipsim.hwreplay.plan import build_plan
from chipsim.runner import prepare


def _plan(config: str, overrides: list, context: int, policy: str):
    prep = prepare(config, [*overrides, f"workload.context_length={context}"], [policy])
    return build_plan(prep, prep.policies[0])


def _energy_fields(case: dict, steps: int, sim_mj: float) -> dict:
    """The board's measured energy per step (each measured replay's window over its steps) beside the simulated."""
    windows = [e for e in [case.get("energy"), *case.get("repeat_energy", [])] if e]
    if not windows:
        return {}
    per_step = [1e3 * e["energy_j"] / steps for e in windows]
    measured = statistics.fmean(per_step)
    out = {"measured_mj": measured, "measured_mj_min": min(per_step), "measured_mj_max": max(per_step),
           "measured_w": statistics.fmean(e["power_w"] for e in windows), "simulated_mj": sim_mj,
           "energy_error_pct": 100.0 * (sim_mj - measured) / measured}
    if all("idle_w" in e for e in windows):
        out["measured_above_idle_mj"] = statistics.fmean(1e3 * above_idle_j(e) / steps for e in windows)
    return out


def _case_row(job) -> dict:
    """One case re-simulated: the mean step latency measured and simulated, each step's error, bytes, energy."""
    config, overrides, case, model, batch, real_weights = job
    ctx, policy = case["context_length"], case["policy"]
    plan = _plan(config, overrides, ctx, policy)
    runs = [case["latency_ms"], *case.get("repeat_latency_ms", [])]
    measured_steps = [statistics.fmean(r[i] for r in runs) for i in range(len(runs[0]))]  # each step's mean
    if len(measured_steps) != len(plan.sim_latency_ms):
        raise InputError(f"{policy} at {ctx}: {len(measured_steps)} steps measured, the plan has "
                         f"{len(plan.sim_latency_ms)}")
    measured, simulated = statistics.fmean(measured_steps), statistics.fmean(plan.sim_latency_ms)
    alt = statistics.fmean(_plan(config, [*overrides, *ARRAY_MODEL_ONLY], ctx, policy).sim_latency_ms)
    sim_mj = statistics.fmean(board_mj(step) for step in plan.sim_energy_mj)
    energy = _energy_fields(case, len(measured_steps), sim_mj) if real_weights else {}
    return {"model": model, "batch": batch, "context_length": ctx, "policy": policy, "steps": len(measured_steps),
            "measured_ms": measured, "measured_min_ms": min(statistics.fmean(r) for r in runs),
            "measured_max_ms": max(statistics.fmean(r) for r in runs), "replays": len(runs), "simulated_ms": simulated,
            "error_pct": 100.0 * (simulated - measured) / measured,
            "step_mape_pct": mape(100.0 * (s - m) / m for s, m in zip(plan.sim_latency_ms, measured_steps)),
            "array_model_ms": alt, "array_model_error_pct": 100.0 * (alt - measured) / measured,
            "plan_bytes": plan.fetch_bytes, "copied_bytes": case["copied_bytes"],
            "measured_plan_bytes": case["plan"]["fetch_bytes"], "decisions_match": plan.digest() == case["plan"]["digest"],
            "simulated_mj": sim_mj, **energy}


def compare_batch_file(path: str, jobs: int = 1) -> list[dict]:
    """Every case of one batch measurement file re-simulated: one row each."""
    meas = read_measurement(path, "batch", "context_length", "--batch")
    config = _resolve(meas["config"], path)
    real = meas.get("host_experts") == "normal-bf16"  # energy only over experts like real ones (not a dry run's zeros)
    work = [(config, list(meas.get("overrides", [])), case, meas["model"], meas["batch"], real) for case in meas["cases"]]
    return rows_of(meas, path, _case_row, work, jobs)


def batch_lines(name: str, rows: list[dict]) -> list[str]:
    """VALIDATION.md's batch regime: its MAPEs, then one row per case."""
    energy = [r for r in rows if "energy_error_pct" in r]
    exact = sum(r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] and r["decisions_match"] for r in rows)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    lines = [f"## {name}", "",
             "A batch's decode steps replayed on the GPU (`chipsim hwreplay --batch B`, chipsim.hwreplay.batch_harness): "
             "each step one token of each of B sequences through every layer, the projections, router and LM head "
             "cuBLAS BF16 GEMMs of B rows, each sequence's scores and value mix the decode step's matvecs over its own "
             "KV cache, each routed expert one GEMM per matrix over the step's tokens routed to it, read from the GPU "
             "slot its copy from pinned host memory landed in; copies in the plan's order. A step's latency is the time "
             "between the events after two steps' LM heads (CUDA events; each step's mean over the measured replays, "
             "after one unmeasured); energy the board's NVML counter over each measured replay (nvml.Meter) per step, "
             "against the simulator's board part. The operation times come from single-op probes only "
             f"(the measured table of {table_source(rows)}, the batch shapes timed alone by `microbench --batch`); no "
             "number is fitted to a step.", "",
             f"Mean step latency MAPE {mape(r['error_pct'] for r in rows):.1f} % over {len(rows)} cases (worst "
             f"{worst['error_pct']:+.1f} %, {worst['model']} B={worst['batch']} at {worst['context_length']} "
             f"{worst['policy']}); per-step MAPE {mape(r['step_mape_pct'] for r in rows):.1f} %; "
             + (f"energy per step MAPE {mape(r['energy_error_pct'] for r in energy):.1f} % over {len(energy)}; "
                if energy else "energy not measured over experts like real ones; ")
             + f"array model only: MAPE {mape(r['array_model_error_pct'] for r in rows):.1f} %; decisions same and "
             f"bytes exact {exact}/{len(rows)}.", "",
             "| model | B | context | policy | steps | measured ms/step (min–max) | simulated | error | per-step MAPE | "
             "array model only: ms, error | board mJ/step measured (min–max) | simulated | error | bytes copied (plan) "
             "| decisions |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        same = "equal" if r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] else "DIFFER"
        e = (f"{r['measured_mj']:.1f} ({r['measured_mj_min']:.1f}–{r['measured_mj_max']:.1f}) | {r['simulated_mj']:.1f} | "
             f"{r['energy_error_pct']:+.1f} %" if "measured_mj" in r else f"| {r['simulated_mj']:.1f} |")
        lines.append(f"| {r['model']} | {r['batch']} | {r['context_length']} | {r['policy']} | {r['steps']} | "
                     f"{r['measured_ms']:.3f} ({r['measured_min_ms']:.3f}–{r['measured_max_ms']:.3f}) | "
                     f"{r['simulated_ms']:.3f} | {r['error_pct']:+.1f} % | {r['step_mape_pct']:.1f} % | "
                     f"{r['array_model_ms']:.3f}, {r['array_model_error_pct']:+.1f} % | {e} | {r['copied_bytes']:,} "
                     f"({same}) | {'same' if r['decisions_match'] else 'DIFFER'} |")
    return lines + [""]


def batch_regimes(specs: list[list[str]], jobs: int) -> list[tuple[str, list]]:
    """Each --batch-regime NAME PATH...: its name and rows; a regime whose folders hold no file yet is left out."""
    return replay_regimes("--batch-regime", specs, compare_batch_file, jobs)


def batch_mape_line(name: str, rows: list[dict]) -> str:
    """The regime's one line printed after hwcompare."""
    energy = [r["energy_error_pct"] for r in rows if "energy_error_pct" in r]
    return (f"{name}: mean step latency MAPE {mape(r['error_pct'] for r in rows):.1f} % over {len(rows)} cases, worst "
            f"{max((r['error_pct'] for r in rows), key=abs):+.1f} %; "
            + (f"energy per step MAPE {mape(energy):.1f} %" if energy else "no energy over experts like real ones"))
