"""Simulated vs measured prefill (TTFT and the board's energy over it): `chipsim hwcompare --prefill-regime NAME PATH`
(no torch).

A prefill measurement file (`chipsim hwreplay --prompts`, chipsim.hwreplay.run.replay_prefill_config) holds one case
per (prompt length, prefill policy). Each case's plan is rebuilt from the config the file names (same code, config
and trace give the same decisions: the digest must match the one measured); the simulated TTFT (its prefill
chunks) is set beside the measured one (the mean over the measured replays), the simulated board energy of the
prefill beside the counter's, and the plan's bytes beside the bytes the GPU copied. The simulator's operation times
come from the config's measured table only (single-op probes); the 'array model only' column is the same request
without it.
"""

from __future__ import annotations

import json
import os
import statistics

import yaml

from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, read_input_text
from chipsim.hwreplay.energy_table import above_idle_j, board_mj
from chipsim.hwreplay.plan import build_plan
from chipsim.hwreplay.run import request_overrides, request_spec
from chipsim.pool import worker_pool
from chipsim.runner import prepare

# the simulator without the profiled operators (as chipsim.hwreplay.compare.ARRAY_MODEL_ONLY)
ARRAY_MODEL_ONLY = ("compute.op_times_ns={}", "compute.op_group_launch_ns=0")


def _resolve(config: str, measurement_path: str) -> str:
    """A measurement file's config: as written (from the working directory), or from the repository root it sits
    under (validation/regimes/<name>/ is three folders down)."""
    here = os.path.dirname(os.path.abspath(measurement_path))
    for candidate in (config, *(os.path.join(here, *[".."] * up, config) for up in range(1, 5))):
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"{measurement_path}: config {config} not found")


def machine_config(config: str, measurement_path: str) -> str:
    """The config at the root of a measurement's config's `base:` chain (the GPU's measured config under a per-model
    one), named as the measurement names its config (hwconfigs/h100-pcie5-phi-mini-moe.yaml -> hwconfigs/h100-pcie5.yaml)."""
    path, named = _resolve(config, measurement_path), config
    for _ in range(16):  # a loop's guard: the loader refuses a chain that comes back on itself before this runs
        with open(path) as f:
            base = (yaml.safe_load(f) or {}).get("base")
        if not isinstance(base, str):
            break
        path, named = os.path.join(os.path.dirname(path), base), os.path.join(os.path.dirname(named), base)
    return os.path.normpath(named)


def _plan(config: str, overrides: list, prompt: int, policy: str):
    prep = prepare(config, [*overrides, *request_overrides(prompt)], [request_spec(policy)])
    return prep, build_plan(prep, prep.policies[0])


def _coverage(hw, plan) -> tuple[int, int]:
    """(operations of the prefill costed from compute.op_times_ns, all of them): every primitive of every chunk's
    layers and head, and of every routed expert over its tokens."""
    from chipsim.hwreplay.ops import prefill_chunk_ops, prefill_expert_ops
    from chipsim.workload.decode import MIXER_GROUP
    from chipsim.workload.models import model_of

    table, m = hw.compute.op_times_ns, model_of(hw.model)
    keys: list[str] = []
    for offset, tokens in plan.chunk_tokens:
        groups = prefill_chunk_ops(hw, offset, tokens, offset + tokens == plan.prompt_tokens)
        for layer in range(m.num_layers):
            names = [MIXER_GROUP[m.mixer(layer)]] + (["dense"] if layer < m.first_dense_layers else
                                                     ["router", "shared", "combine"])
            keys += [p.key for name in names for p in groups.get(name, [])]
        keys += [p.key for p in groups["head"]]
    experts: dict[int, list[str]] = {}
    for a in plan.actions:
        if a[0] == "compute":
            for n in a[4]:
                keys += experts.setdefault(n, [p.key for p in prefill_expert_ops(hw, n)])
    return sum(k in table for k in keys), len(keys)


def _energy_fields(case: dict, sim_mj: float) -> dict:
    """The board's measured energy over each measured replay (nvml.Meter's window) beside the simulated prefill's."""
    windows = [e for e in [case.get("energy"), *case.get("repeat_energy", [])] if e]
    if not windows:
        return {}
    joules = [e["energy_j"] for e in windows]
    measured = 1e3 * statistics.fmean(joules)
    out = {"measured_mj": measured, "measured_mj_min": 1e3 * min(joules), "measured_mj_max": 1e3 * max(joules),
           "measured_w": statistics.fmean(e["power_w"] for e in windows), "simulated_mj": sim_mj,
           "energy_error_pct": 100.0 * (sim_mj - measured) / measured}
    if all("idle_w" in e for e in windows):
        out["measured_above_idle_mj"] = 1e3 * statistics.fmean(above_idle_j(e) for e in windows)
    return out


def _case_row(job) -> dict:
    config, overrides, case, model, real_weights = job
    prompt, policy = case["prompt_tokens"], case["policy"]
    prep, plan = _plan(config, overrides, prompt, policy)
    runs = [sum(case["latency_ms"]), *[sum(r) for r in case.get("repeat_latency_ms", [])]]
    measured, simulated = statistics.fmean(runs), plan.sim_ttft_ms
    _, alt = _plan(config, [*overrides, *ARRAY_MODEL_ONLY], prompt, policy)
    profiled, ops = _coverage(prep.config.hw, plan)
    sim_mj = sum(board_mj(step) for step in plan.sim_energy_mj)
    energy = _energy_fields(case, sim_mj) if real_weights else {}
    return {"model": model, "prompt_tokens": prompt, "policy": policy, "chunks": len(plan.chunk_tokens),
            "measured_ttft_ms": measured, "measured_ttft_min_ms": min(runs), "measured_ttft_max_ms": max(runs),
            "replays": len(runs), "simulated_ttft_ms": simulated, "error_pct": 100.0 * (simulated - measured) / measured,
            "array_model_ttft_ms": alt.sim_ttft_ms, "array_model_error_pct": 100.0 * (alt.sim_ttft_ms - measured) / measured,
            "sim_stall_ms": sum(map(sum, plan.sim_stall_ms)), "plan_bytes": plan.fetch_bytes,
            "copied_bytes": case["copied_bytes"], "measured_plan_bytes": case["plan"]["fetch_bytes"],
            "decisions_match": plan.digest() == case["plan"]["digest"], "profiled_ops": profiled, "ops": ops,
            "simulated_mj": sim_mj, **energy}


def read_measurement(path: str, kind: str, case_key: str, option: str) -> dict:
    """A replay measurement file of `kind` ("prefill", "batch": its flag in the file), each case with `case_key`,
    a policy and latencies; refused in one line naming the hwreplay `option` that writes one."""
    text = read_input_text(path, "measurement file", JSON_MAX_BYTES)
    try:
        meas = json.loads(text)
        if not meas.get(kind):
            raise KeyError(kind)
        _ = meas["config"], meas["model"], [(c[case_key], c["policy"], c["latency_ms"]) for c in meas["cases"]]
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a {kind} measurement of chipsim hwreplay {option} "
                         f"({type(exc).__name__}: {exc})") from None
    return meas


def compare_prefill_file(path: str, jobs: int = 1) -> list[dict]:
    """Every case of one prefill measurement file re-simulated: one row each."""
    meas = read_measurement(path, "prefill", "prompt_tokens", "--prompts")
    config = _resolve(meas["config"], path)
    real = meas.get("host_experts") == "normal-bf16"  # energy only over experts like real ones (not a dry run's zeros)
    work = [(config, list(meas.get("overrides", [])), case, meas["model"], real) for case in meas["cases"]]
    return rows_of(meas, path, _case_row, work, jobs)


def rows_of(meas: dict, path: str, case_row, work: list, jobs: int) -> list[dict]:
    """case_row over `work` (in worker processes where jobs > 1), each row naming the measurement's machine config
    (the file at `path`'s config's base)."""
    if jobs > 1 and len(work) > 1:
        with worker_pool(min(jobs, len(work))) as pool:
            rows = list(pool.map(case_row, work))
    else:
        rows = [case_row(job) for job in work]
    machine = machine_config(meas["config"], path)
    return [{**row, "machine_config": machine} for row in rows]


def table_source(rows: list[dict]) -> str:
    """The configs whose measured operation tables the rows' simulations used, for a section's text."""
    return ", ".join(sorted({r["machine_config"] for r in rows}))


def prefill_files(paths: list[str], option: str = "--prefill-regime") -> list[str]:
    """The measurement files of a regime's paths: a .json file as named (it must exist), a folder's *.json; an
    empty folder (made for replays not run yet) gives none, a path that does not exist is refused (a typo)."""
    out = []
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"{option} {path}: no such file or folder")
        if os.path.isdir(path):
            out += sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
        elif path.endswith(".json"):
            out.append(path)
        else:
            raise InputError(f"{option} {path}: not a .json measurement file or a folder of them")
    return out


def mape(values) -> float:
    values = list(values)
    return statistics.fmean(abs(v) for v in values) if values else float("nan")


def prefill_lines(name: str, rows: list[dict]) -> list[str]:
    """VALIDATION.md's prefill regime: its MAPEs, then one row per case."""
    energy = [r for r in rows if "energy_error_pct" in r]
    exact = sum(r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] and r["decisions_match"] for r in rows)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    lines = [f"## {name}", "",
             "A request's prefill replayed on the GPU (`chipsim hwreplay --prompts`, chipsim.hwreplay.prefill_harness): "
             "the plan's prefill chunks, every layer over the chunk's tokens, each GEMM a cuBLAS BF16 GEMM of the "
             "simulator's shape, each routed expert one GEMM per matrix over the tokens routed to it, read from the GPU "
             "slot its copy from pinned host memory landed in, the attention one scaled_dot_product_attention kernel; "
             "copies on one FIFO copy stream in the plan's order. TTFT is the time from the replay's start to the "
             "event after the last chunk's LM head (CUDA events; the mean of the measured replays, after one "
             "unmeasured); energy the board's NVML counter over each measured replay (nvml.Meter), against the "
             "simulator's board part of the prefill. The simulated operation times come from single-op probes only "
             f"(the measured table of {table_source(rows)}, the prefill shapes timed alone by `microbench --prompts`); "
             "no number is fitted to a TTFT. The replay stops at the first output token.", "",
             f"TTFT MAPE {mape(r['error_pct'] for r in rows):.1f} % over {len(rows)} cases (worst "
             f"{worst['error_pct']:+.1f} %, {worst['model']} at {worst['prompt_tokens']} {worst['policy']}); "
             + (f"prefill energy MAPE {mape(r['energy_error_pct'] for r in energy):.1f} % over {len(energy)}; "
                if energy else "energy not measured over experts like real ones; ")
             + f"array model only: TTFT MAPE {mape(r['array_model_error_pct'] for r in rows):.1f} %; decisions same "
             f"and bytes exact {exact}/{len(rows)}.", "",
             "| model | prompt | policy | chunks | measured TTFT ms (min–max) | simulated | error | array model only: ms, "
             "error | board mJ measured (min–max) | simulated | error | bytes copied (plan) | decisions | ops from "
             "the profile |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        same = "equal" if r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] else "DIFFER"
        e = (f"{r['measured_mj']:.0f} ({r['measured_mj_min']:.0f}–{r['measured_mj_max']:.0f}) | {r['simulated_mj']:.0f} | "
             f"{r['energy_error_pct']:+.1f} %" if "measured_mj" in r else f"| {r['simulated_mj']:.0f} |")
        lines.append(f"| {r['model']} | {r['prompt_tokens']} | {r['policy']} | {r['chunks']} | "
                     f"{r['measured_ttft_ms']:.2f} ({r['measured_ttft_min_ms']:.2f}–{r['measured_ttft_max_ms']:.2f}) | "
                     f"{r['simulated_ttft_ms']:.2f} | {r['error_pct']:+.1f} % | {r['array_model_ttft_ms']:.2f}, "
                     f"{r['array_model_error_pct']:+.1f} % | {e} | {r['copied_bytes']:,} ({same}) | "
                     f"{'same' if r['decisions_match'] else 'DIFFER'} | {r['profiled_ops']}/{r['ops']} |")
    return lines + [""]


def prefill_regimes(specs: list[list[str]], jobs: int) -> list[tuple[str, list]]:
    """Each --prefill-regime NAME PATH...: its name and rows; a regime whose paths hold no file yet is left out."""
    return replay_regimes("--prefill-regime", specs, compare_prefill_file, jobs)


def replay_regimes(option: str, specs: list[list[str]], compare_file, jobs: int) -> list[tuple[str, list]]:
    """Each `option` NAME PATH...: its name and the rows `compare_file(path, jobs)` gives for every replay file the
    paths hold; a regime whose folders hold no file yet is left out."""
    out = []
    for spec in specs:
        if len(spec) < 2:
            raise InputError(f"{option} {' '.join(spec)}: expected a name and at least one file or folder")
        rows = [row for path in prefill_files(spec[1:], option) for row in compare_file(path, jobs)]
        if rows:
            out.append((spec[0], rows))
    return out
