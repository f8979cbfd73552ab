"""Simulated vs measured served runs (each step's latency, the run's board energy): `chipsim hwcompare
--served-regime NAME PATH` (no torch).

A served measurement file (`chipsim hwreplay --served`, chipsim.hwreplay.run_served) holds one case per policy. Each
case's plan is rebuilt from the config and overrides the file names (same code, config and trace give the same
decisions and steps: the digest must match the one measured); each step's simulated latency is set beside its
measured one (the mean over the measured replays), the run's simulated board energy (its steps' board part and the
gaps' idle board, as the served run charges them) beside the counter's over each replay, the plan's bytes beside the
bytes the GPU copied, and the simulated gaps beside the slept ones. The 'array model only' column is the same run
without the config's measured operation times; "shapes unprofiled" counts the run's kernel shapes the config's table
lacks (costed by the array model).
"""

from __future__ import annotations

import statistics

from chipsim.errors import InputError
from chipsim.hwreplay.compare_prefill import (ARRAY_MODEL_ONLY, _resolve, mape, read_measurement, replay_regimes,
                                              rows_of, table_source)
from chipsim.hwreplay.energy_table import BOARD_EXCLUDES, board_mj
from chipsim.hwreplay.plan import build_plan
from chipsim.runner import prepare
from chipsim.sim.energy import EnergyTable


def _plan(config: str, overrides: list, policy: str):
    prep = prepare(config, overrides, [policy])
    return prep, build_plan(prep, prep.policies[0])


def board_idle_w(hw) -> float:
    """The board's power while the simulated chip waits (its static power, the host's parts left out)."""
    table = EnergyTable.from_config(hw)
    return sum(w for name, w in table.static_w.items() if name not in BOARD_EXCLUDES) \
        + (0.0 if table.clock_gated else table.clock_w)


def unprofiled_shapes(hw, plan) -> int:
    """The plan's kernel shapes (its steps' and experts') that hw's compute.op_times_ns lacks."""
    from chipsim.hwreplay.ops import prefill_expert_ops, served_step_ops
    from chipsim.hwreplay.served_harness import step_parts

    keys = {p.key for parts in {tuple(ps) for ps in step_parts(plan)}
            for ps in served_step_ops(hw, list(parts)).values() for p in ps if not p.fused or p.attention is not None}
    tokens = {n for a in plan.actions if a[0] == "compute" for n in a[4]}
    keys |= {p.key for n in tokens for p in prefill_expert_ops(hw, n) if not p.fused}
    return len(keys - set(hw.compute.op_times_ns))


def _energy_fields(case: dict, sim_mj: float, sim_steps_mj: float) -> dict:
    """The board's measured energy over each measured replay (steps and gaps) beside the simulated run's; and, where
    the meter read the board's idle power, the steps' alone (the slept gaps at that idle power taken out) beside the
    simulated steps': the gaps are idle on both sides, so the run's figure agrees on them by construction."""
    windows = [e for e in [case.get("energy"), *case.get("repeat_energy", [])] if e]
    if not windows:
        return {}
    runs = [1e3 * e["energy_j"] for e in windows]
    measured = statistics.fmean(runs)
    out = {"measured_mj": measured, "measured_mj_min": min(runs), "measured_mj_max": max(runs),
           "measured_w": statistics.fmean(e["power_w"] for e in windows), "simulated_mj": sim_mj,
           "energy_error_pct": 100.0 * (sim_mj - measured) / measured}
    if all("idle_w" in e for e in windows):
        slept_s = sum(case.get("gap_ms", [])) / 1e3
        steps = statistics.fmean(1e3 * (e["energy_j"] - e["idle_w"] * slept_s) for e in windows)
        out.update(measured_steps_mj=steps, simulated_steps_mj=sim_steps_mj,
                   steps_energy_error_pct=100.0 * (sim_steps_mj - steps) / steps)
    return out


def _case_row(job) -> dict:
    """One case re-simulated: each step's latency measured and simulated, bytes, gaps, the run's energy."""
    config, overrides, case, model, requests, real_weights = job
    policy = case["policy"]
    prep, plan = _plan(config, overrides, policy)
    runs = [case["latency_ms"], *case.get("repeat_latency_ms", [])]
    measured_steps = [statistics.fmean(r[i] for r in runs) for i in range(len(runs[0]))]
    if len(measured_steps) != len(plan.sim_latency_ms):
        raise InputError(f"{policy}: {len(measured_steps)} steps measured, the plan has {len(plan.sim_latency_ms)}")
    measured, simulated = statistics.fmean(measured_steps), statistics.fmean(plan.sim_latency_ms)
    _, alt_plan = _plan(config, [*overrides, *ARRAY_MODEL_ONLY], policy)
    alt = statistics.fmean(alt_plan.sim_latency_ms)  # (another run: its steps may differ in number and shape)
    gaps_ms = [a[2] / 1e9 for a in plan.actions if a[0] == "step"]
    sim_steps_mj = sum(board_mj(step) for step in plan.sim_energy_mj)
    sim_mj = sim_steps_mj + sum(gaps_ms) * board_idle_w(prep.config.hw)
    energy = _energy_fields(case, sim_mj, sim_steps_mj) if real_weights else {}
    return {"model": model, "requests": requests, "policy": policy, "steps": len(measured_steps),
            "tokens": sum(p[2] for a in plan.actions if a[0] == "step" for p in a[3]),
            "measured_ms": measured, "measured_min_ms": min(statistics.fmean(r) for r in runs),
            "measured_max_ms": max(statistics.fmean(r) for r in runs), "replays": len(runs), "simulated_ms": simulated,
            "error_pct": 100.0 * (simulated - measured) / measured,
            "step_mape_pct": mape(100.0 * (s - m) / m for s, m in zip(plan.sim_latency_ms, measured_steps)),
            "worst_step_pct": max((100.0 * (s - m) / m for s, m in zip(plan.sim_latency_ms, measured_steps)), key=abs),
            "array_model_ms": alt, "array_model_error_pct": 100.0 * (alt - measured) / measured,
            "gaps_ms": sum(gaps_ms), "measured_gaps_ms": sum(case.get("gap_ms", [])),
            "unprofiled_shapes": unprofiled_shapes(prep.config.hw, plan),
            "plan_bytes": plan.fetch_bytes, "copied_bytes": case["copied_bytes"],
            "measured_plan_bytes": case["plan"]["fetch_bytes"], "decisions_match": plan.digest() == case["plan"]["digest"],
            "simulated_mj": sim_mj, **energy}


def compare_served_file(path: str, jobs: int = 1) -> list[dict]:
    """Every case of one served measurement file re-simulated: one row each."""
    meas = read_measurement(path, "served", "policy", "--served")
    config = _resolve(meas["config"], path)
    real = meas.get("host_experts") == "normal-bf16"  # energy only over experts like real ones (not a dry run's zeros)
    work = [(config, list(meas.get("overrides", [])), case, meas["model"], meas["requests"], real)
            for case in meas["cases"]]
    return rows_of(meas, path, _case_row, work, jobs)


def served_lines(name: str, rows: list[dict]) -> list[str]:
    """VALIDATION.md's served regime: its MAPEs, then one row per case."""
    energy = [r for r in rows if "energy_error_pct" in r]
    steps_energy = [r for r in rows if "steps_energy_error_pct" in r]
    exact = sum(r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] and r["decisions_match"] for r in rows)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    lines = [f"## {name}", "",
             "A served run's steps replayed on the GPU (`chipsim hwreplay --served`, chipsim.hwreplay.served_harness): "
             "requests arriving as the config says, each step the parts the scheduler ran then (prompt chunks and "
             "decode tokens of several requests), every layer over the step's tokens, the projections, router and LM "
             "head cuBLAS BF16 GEMMs over them (GEMVs in a step of one decode token), each decode token's scores and value mix matvecs over its own KV cache, "
             "each prompt chunk's attention one kernel, each routed expert one GEMM per matrix over the step's tokens "
             "routed to it, read from the GPU slot its copy from pinned host memory landed in; copies in the plan's "
             "order; where the simulated chip waited for arrivals, the GPU sleeps as long. A step's latency is the "
             "time between the events at its start and after its LM heads (each step's mean over the measured "
             "replays, after one unmeasured); energy the board's NVML counter over each measured replay (steps and "
             "gaps), against the simulator's board part of the run (its steps, and the gaps at its idle power), and "
             "the steps' alone (the slept gaps at the meter's idle power taken out; the gaps agree by construction). "
             "A softmax fused into a prompt chunk's attention kernel whose shape a decode token's own softmax kernel "
             "has is charged that kernel's time (the table is keyed by shape). The "
             f"operation times come from single-op probes only (the measured table of {table_source(rows)}, the "
             "run's shapes timed alone by `microbench --served`); no number is fitted to a step.", "",
             f"Mean step latency MAPE {mape(r['error_pct'] for r in rows):.1f} % over {len(rows)} cases (worst "
             f"{worst['error_pct']:+.1f} %, {worst['model']} {worst['requests']} requests {worst['policy']}); per-step "
             f"MAPE {mape(r['step_mape_pct'] for r in rows):.1f} %; "
             + (f"run energy MAPE {mape(r['energy_error_pct'] for r in energy):.1f} % over {len(energy)}; "
                if energy else "energy not measured over experts like real ones; ")
             + (f"the steps' energy alone MAPE {mape(r['steps_energy_error_pct'] for r in steps_energy):.1f} %; "
                if steps_energy else "")
             + f"array model only: MAPE {mape(r['array_model_error_pct'] for r in rows):.1f} %; decisions same and "
             f"bytes exact {exact}/{len(rows)}.", "",
             "| model | requests | policy | steps (tokens) | measured ms/step (min–max) | simulated | error | per-step "
             "MAPE (worst) | array model only: ms, error | gaps ms simulated, slept | shapes unprofiled | board mJ "
             "measured (min–max) | simulated | error | steps alone: measured mJ, simulated, error | bytes copied "
             "(plan) | decisions |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        same = "equal" if r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] else "DIFFER"
        e = (f"{r['measured_mj']:.0f} ({r['measured_mj_min']:.0f}–{r['measured_mj_max']:.0f}) | {r['simulated_mj']:.0f} | "
             f"{r['energy_error_pct']:+.1f} %" if "measured_mj" in r else f"| {r['simulated_mj']:.0f} |")
        alone = (f"{r['measured_steps_mj']:.0f}, {r['simulated_steps_mj']:.0f}, {r['steps_energy_error_pct']:+.1f} %"
                 if "measured_steps_mj" in r else "")
        lines.append(f"| {r['model']} | {r['requests']} | {r['policy']} | {r['steps']} ({r['tokens']}) | "
                     f"{r['measured_ms']:.3f} ({r['measured_min_ms']:.3f}–{r['measured_max_ms']:.3f}) | "
                     f"{r['simulated_ms']:.3f} | {r['error_pct']:+.1f} % | {r['step_mape_pct']:.1f} % "
                     f"({r['worst_step_pct']:+.1f} %) | {r['array_model_ms']:.3f}, {r['array_model_error_pct']:+.1f} % | "
                     f"{r['gaps_ms']:.1f}, {r['measured_gaps_ms']:.1f} | {r['unprofiled_shapes']} | {e} | {alone} | "
                     f"{r['copied_bytes']:,} ({same}) | {'same' if r['decisions_match'] else 'DIFFER'} |")
    return lines + [""]


def served_regimes(specs: list[list[str]], jobs: int) -> list[tuple[str, list]]:
    """Each --served-regime NAME PATH...: its name and rows; a regime whose folders hold no file yet is left out."""
    return replay_regimes("--served-regime", specs, compare_served_file, jobs)


def served_mape_line(name: str, rows: list[dict]) -> str:
    """The regime's one line printed after hwcompare."""
    energy = [r["energy_error_pct"] for r in rows if "energy_error_pct" in r]
    return (f"{name}: mean step latency MAPE {mape(r['error_pct'] for r in rows):.1f} % over {len(rows)} cases, worst "
            f"{max((r['error_pct'] for r in rows), key=abs):+.1f} %; "
            + (f"run energy MAPE {mape(energy):.1f} %" if energy else "no energy over experts like real ones"))
