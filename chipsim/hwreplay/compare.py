"""Simulated vs measured: re-run every replayed case in the simulator and write VALIDATION.md (no torch).

    chipsim hwcompare validation/h200-pcie5*.json --microbench validation/h200-microbench.json --report VALIDATION.md

For each case of each measurement file: the plan is rebuilt from the config named in the file (same code,
config and trace give the same decisions: the digest must match the one measured), the simulated mean
latency over the measured tokens (after the warm-up) is set beside the measured mean, and the bytes the
plan fetches beside the bytes the GPU copied.
"""

from __future__ import annotations

import json
import os
import statistics

from chipsim.errors import InputError, OneLineParser
from chipsim.files import (JSON_MAX_BYTES, TEXT_MAX_BYTES, check_output_dir, check_output_file, read_input_text,
                           read_json, same_file, write_atomic)
from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.config import load_config
from chipsim.hw.machine import roles
from chipsim.hwreplay import pcie_check
from chipsim.hwreplay.checks import (check_decode_measurement, check_gemv_probe, check_microbench, check_op_energy,
                                     check_op_times)
from chipsim.hwreplay.compare_batch import batch_lines, batch_mape_line, batch_regimes
from chipsim.hwreplay.compare_served import served_lines, served_mape_line, served_regimes
from chipsim.hwreplay.compare_prefill import (machine_config, mape as prefill_mape, prefill_lines, prefill_regimes,
                                              table_source)
from chipsim.hwreplay.energy_table import BOARD_EXCLUDES, above_idle_j, board_mj
from chipsim.hwreplay.gpuconfig import gpu_facts
from chipsim.hwreplay.ops import kernels_per_token, key_groups, profile_coverage
from chipsim.pool import worker_pool
from chipsim.hwreplay.plan import build_plan
from chipsim.hwreplay.probe_tables import handoff_lines, step_energy_lines
from chipsim.runner import prepare

OVERLAPPED = ("oracle", "static-4", "promoe", "apex", "apex-sf")  # policies that prefetch ahead of need
HELD_OUT = "deepseek-v2-lite"  # the model shape kept out of all debugging (--held-out's default)


def _resolve(config: str, measurement_path: str) -> str:
    if os.path.exists(config):
        return config
    alt = os.path.join(os.path.dirname(os.path.abspath(measurement_path)), "..", config)
    if os.path.exists(alt):
        return alt
    raise InputError(f"{measurement_path}: config {config} not found")


# the simulator without the profiled operators: every op from the array model, no per-group launch
ARRAY_MODEL_ONLY = ("compute.op_times_ns={}", "compute.op_group_launch_ns=0")


def _energy_fields(case: dict, plan) -> dict:
    """The board's measured energy per token (each replay's window over all its tokens, warm-up included) beside
    the simulator's board part over the same tokens; nothing where the replay read no counter."""
    windows = [e for e in [case.get("energy"), *case.get("repeat_energy", [])] if e]
    if not windows:
        return {}
    per_token = [1e3 * e["energy_j"] / len(case["latency_ms"]) for e in windows]
    measured = statistics.fmean(per_token)
    simulated = statistics.fmean(board_mj(t) for t in plan.sim_energy_mj)
    out = {"measured_mj": measured, "measured_mj_min": min(per_token), "measured_mj_max": max(per_token),
           "measured_w": statistics.fmean(e["power_w"] for e in windows), "simulated_mj": simulated,
           "energy_error_pct": 100.0 * (simulated - measured) / measured}
    if all("idle_w" in e for e in windows):  # read by nvml.Meter: the board's own idle power beside each window
        out["measured_above_idle_mj"] = statistics.fmean(
            1e3 * above_idle_j(e) / len(case["latency_ms"]) for e in windows)
        out["measured_idle_w"] = statistics.fmean(e["idle_w"] for e in windows)
        # the board's idle power as the config charges it: its static entries over the simulated time
        static_mj = sum(v for t in plan.sim_energy_mj for k, v in t.items() if k.startswith("static_")
                        and k not in BOARD_EXCLUDES)
        out["config_idle_w"] = idle_w = static_mj / sum(plan.sim_latency_ms)
        # what the config's idle power against the board's own adds to each window's energy, as a share of it
        out["idle_share_pct"] = statistics.fmean(100.0 * (idle_w - e["idle_w"]) * e["seconds"] / e["energy_j"]
                                                 for e in windows)
    return out


def _stall_fields(case: dict, plan, warm: int) -> dict:
    """Every measured (token, MoE layer)'s stall after the warm-up, a layer that waited for no copy counting 0,
    beside the simulator's, in the same order."""
    if "stall_ms" not in case:
        return {}
    layers = len(plan.sim_stall_ms[0])
    measured = [[0.0] * layers for _ in plan.sim_stall_ms]
    for t, layer, ms in case["stall_ms"]:
        if t >= len(measured) or layer >= layers:
            raise InputError(f"measurement of {case['policy']} @{case['context_length']}: stall_ms: token {t}, layer "
                             f"{layer}: its plan has {len(measured)} tokens of {layers} MoE layers")
        measured[t][layer] += ms
    flat = [x for row in measured[warm:] for x in row]
    sim = [x for row in plan.sim_stall_ms[warm:] for x in row]
    return {"measured_stalls_ms": flat, "simulated_stalls_ms": sim}


def _spread_pct(case: dict, warm: int) -> float:
    """The largest difference between the replays of one plan, % of their mean latency."""
    runs = [case["latency_ms"][warm:], *[r[warm:] for r in case.get("repeat_latency_ms", [])]]
    means = [statistics.fmean(r) for r in runs]
    return 100.0 * (max(means) - min(means)) / statistics.fmean(means)


def _case_row(job) -> dict:
    config, ctx, policy, overrides, case, warm, model = job
    prep = prepare(config, [f"workload.context_length={ctx}", *overrides], [policy])
    plan = build_plan(prep, prep.policies[0])
    measured = case["latency_ms"][warm:]
    simulated = plan.sim_latency_ms[warm:]
    m_ms, s_ms = statistics.fmean(measured), statistics.fmean(simulated)
    profiled, modelled = profile_coverage(prep.config.hw)
    alt = prepare(config, [f"workload.context_length={ctx}", *overrides, *ARRAY_MODEL_ONLY], [policy])
    a_ms = statistics.fmean(build_plan(alt, alt.policies[0]).sim_latency_ms[warm:])
    energy = _energy_fields(case, plan)
    return {
        "array_model_ms": a_ms, "array_model_error_pct": 100.0 * (a_ms - m_ms) / m_ms,
        "profiled_ops": profiled, "modelled_ops": modelled,
        "model": model, "context_length": ctx, "policy": policy,
        "measured_ms": m_ms, "measured_p10_ms": sorted(measured)[len(measured) // 10],
        "measured_p90_ms": sorted(measured)[(9 * len(measured)) // 10],
        "simulated_ms": s_ms, "error_pct": 100.0 * (s_ms - m_ms) / m_ms,
        "plan_bytes": plan.fetch_bytes, "copied_bytes": case["copied_bytes"],
        "measured_plan_bytes": case["plan"]["fetch_bytes"],
        "decisions_match": plan.digest() == case["plan"]["digest"],
        "host_enqueue_ms": statistics.fmean(case["host_enqueue_ms"][warm:]),
        "tokens": len(measured), "replays": 1 + len(case.get("repeat_latency_ms", [])),
        "spread_pct": _spread_pct(case, warm), "kernel_launch": case.get("kernel_launch", "eager"),
        "overrides": list(overrides), "copy_streams": case.get("copy_streams", 1),
        # the host enqueueing one token at a time on an idle GPU (hwreplay --dispatch-tokens): its own pace
        **({"host_alone_ms": statistics.median(case["host_dispatch_ms"])} if case.get("host_dispatch_ms") else {}),
        **({"host_ahead_ms": statistics.median(case["host_dispatch_ahead_ms"])}
           if case.get("host_dispatch_ahead_ms") else {}),
        **_sim_host_fields(case, plan, warm),
        **_span_fields(case, plan, warm),
        **energy, **_stall_fields(case, plan, warm),
        **(_kernel_fields(prep.config.hw, case) if "measured_above_idle_mj" in energy else {}),
        **(_host_fields(prep, case) if case.get("host_experts") else {}),
    }


def _sim_host_fields(case: dict, plan, warm: int) -> dict:
    """The simulator's host time per token (host_frontend's issue costs), over the tokens the replay's host was
    timed alone on (--dispatch-tokens: the first after token 0), else over the measured ones."""
    per = plan.sim_host_issue_ms
    if not per:
        return {}
    n = len(case.get("host_dispatch_ms") or [])
    window = per[1:1 + n] if n else per[warm:len(case["latency_ms"])]
    return {"sim_host_ms": statistics.fmean(window)}


def _span_fields(case: dict, plan, warm: int) -> dict:
    """hwreplay --op-spans: the GPU's mean time per token inside compute steps, and the simulator's arrays time per
    token (its latency less its MoE layers' stalls)."""
    spans = case.get("op_span_ms")
    if not spans:
        return {}
    arrays = [lat - sum(stall) for lat, stall in zip(plan.sim_latency_ms[warm:], plan.sim_stall_ms[warm:])]
    return {"compute_span_ms": statistics.fmean(ms for ms, _ in spans[warm:len(case["latency_ms"])]),
            "sim_arrays_ms": statistics.fmean(arrays)}


def _host_fields(prep, case: dict) -> dict:
    """A replay with host-CPU experts: how many per token, and one expert's CPU time measured in the replay against
    the config's (chipsim.workload.host.host_timing)."""
    from chipsim.workload.host import host_timing

    timing = host_timing(prep.config.hw, prep.workload)
    return {"host_experts_per_token": case["host_experts"] / len(case["latency_ms"]),
            "host_compute_us": case["host_compute_us_median"], "host_roundtrip_us": case["host_roundtrip_us_median"],
            "config_host_compute_us": timing.compute_ps / 1e6, "config_host_total_us": timing.total_ps / 1e6}


def _idle_note(r: dict) -> str:
    """Where the replay's board idled at another power than the config's: that difference over the measured time,
    as a share of the measured energy (what it alone adds to the energy error)."""
    if "measured_idle_w" not in r or abs(r["config_idle_w"] - r["measured_idle_w"]) < 1.0:
        return ""
    return (f"; the board idled at {r['measured_idle_w']:.1f} W, the config charges {r['config_idle_w']:.1f} W: "
            f"{r['idle_share_pct']:+.1f} % of the measured energy")


def host_lines(rows: list[dict]) -> list[str]:
    """Under a regime's table: each case that ran experts on the host CPU, its count and per-expert times."""
    out = [f"- {r['policy']} @{r['context_length']}: {r['host_experts_per_token']:.1f} experts per token on the host "
           f"CPU; one computed in {r['host_compute_us']:.1f} µs in the replay (median) against the config's "
           f"{r['config_host_compute_us']:.1f} µs; each on the host {r['host_roundtrip_us']:.1f} µs from "
           f"enqueueing its activation's copy to its computation's end (median; the config charges {r['config_host_total_us']:.1f} µs "
           "from dispatch to the result's landing)" + _idle_note(r) for r in rows if "host_experts_per_token" in r]
    return out + [""] if out else []


def _kernel_fields(hw, case: dict) -> dict:
    """What a Meter-read replay's energy above idle is set against (step_against_kernels_lines): its kernel shapes'
    launches per token, its tokens, a copied bit at the config's expert-link and operand-memory energies (the copy
    probe's slope, split in two)."""
    r = roles(hw)
    return {"kernels_per_token": kernels_per_token(hw), "replayed_tokens": len(case["latency_ms"]),
            "copy_pj_per_bit": (hw.links[r.expert_link].energy_pj_per_bit
                                + hw.memory[r.operand_memory].energy_pj_per_bit)}


def replayed_overrides(meas: dict) -> list[str]:
    """The config settings a measurement file's replay ran with: the values of config keys that changed since
    ("config_pins", set where the committed config moved on), then the replay's own overrides."""
    return [*meas.get("config_pins", []), *meas.get("overrides", [])]


def read_measurement(path: str) -> dict:
    """A decode replay's measurement file, every field the comparison reads checked (chipsim.hwreplay.checks) and
    its config found: one line naming the file and the field where not."""
    text = read_input_text(path, "measurement file", JSON_MAX_BYTES)
    try:
        meas = json.loads(text)
        _ = meas["config"], meas["cases"], meas["warmup_tokens"], meas["model"]
    except (ValueError, RecursionError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a chipsim hwreplay measurement file ({type(exc).__name__}: {exc})") from None
    check_decode_measurement(meas, path)
    _resolve(meas["config"], path)
    return meas


def compare_file(path: str, overrides=(), jobs: int = 1, contexts=None, meas: dict | None = None) -> dict:
    """Every case of one measurement file re-simulated (`contexts`: only these context lengths; `meas`: the file
    as read_measurement gave it, else read here)."""
    meas = meas if meas is not None else read_measurement(path)
    config = _resolve(meas["config"], path)
    warm = int(meas["warmup_tokens"])
    overrides = (*replayed_overrides(meas), *overrides)  # the settings the replay ran with
    work = [(config, case["context_length"], case["policy"], tuple(overrides), case, warm, meas["model"])
            for case in meas["cases"] if contexts is None or case["context_length"] in contexts]
    if jobs > 1 and len(work) > 1:
        with worker_pool(min(jobs, len(work))) as pool:
            rows = list(pool.map(_case_row, work))
    else:
        rows = [_case_row(job) for job in work]
    zero = meas.get("host_experts") != "normal-bf16"  # replays before the fill ran their copied experts over zeros
    for r in rows:
        r["zero_experts"] = zero
    return {"config": meas["config"], "model": meas["model"], "device": meas["device"], "torch": meas["torch"],
            "warmup_tokens": warm, "rows": rows,
            "kernel_launch": sorted({c.get("kernel_launch", "eager") for c in meas["cases"]})}


def mape(rows) -> float:
    return statistics.fmean(abs(r["error_pct"]) for r in rows) if rows else float("nan")


def mape_text(rows, none: str = "–") -> str:
    """A MAPE as the report prints it, or `none` where no case has one (never 'nan %')."""
    return f"{mape(rows):.1f} %" if rows else none


def _table(rows) -> list[str]:
    if not rows:  # no file of the shape: said, not an empty table
        return ["No measurement file has a case of this shape."]
    out = ["| model | context | policy | measured ms/token (p10–p90) | simulated ms/token | error | array model only: ms, error "
           "| bytes fetched (plan) | bytes copied (GPU) | decisions |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        same = "equal" if r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] else "DIFFER"
        out.append(f"| {r['model']} | {r['context_length']} | {r['policy']} | {r['measured_ms']:.3f} "
                   f"({r['measured_p10_ms']:.2f}–{r['measured_p90_ms']:.2f}) | {r['simulated_ms']:.3f} | "
                   f"{r['error_pct']:+.1f} % | {r['array_model_ms']:.3f}, {r['array_model_error_pct']:+.1f} % | "
                   f"{r['plan_bytes']:,} | {r['copied_bytes']:,} ({same}) | "
                   f"{'same' if r['decisions_match'] else 'DIFFER'} |")
    return out


def summary_lines(groups: dict[str, list]) -> list[str]:
    out = ["| cases | n | latency MAPE | MAPE, overlapped policies | max error | array model only: MAPE | bytes exact "
           "| decisions same | ops from the profile |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, rows in groups.items():
        if not rows:
            continue
        ov = [r for r in rows if r["policy"] in OVERLAPPED]
        exact = sum(r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] for r in rows)
        same = sum(r["decisions_match"] for r in rows)
        worst = max(rows, key=lambda r: abs(r["error_pct"]))
        out.append(f"| {name} | {len(rows)} | {mape(rows):.1f} % | {mape_text(ov)} | {worst['error_pct']:+.1f} % "
                   f"({worst['model']}, {worst['policy']} @{worst['context_length']}) | "
                   f"{statistics.fmean(abs(r['array_model_error_pct']) for r in rows):.1f} % | {exact}/{len(rows)} | "
                   f"{same}/{len(rows)} | {sum(r['profiled_ops'] for r in rows)}/"
                   f"{sum(r['profiled_ops'] + r['modelled_ops'] for r in rows)} |")
    return out


def _energy_rows(rows, zero_experts: bool = False) -> list[dict]:
    """The cases with a measured energy whose replay computed over weights like real ones (or, `zero_experts`,
    over zero-valued experts)."""
    return [r for r in rows if "energy_error_pct" in r and bool(r.get("zero_experts")) == zero_experts]


def energy_mape(rows, zero_experts: bool = False) -> float:
    """Over the cases whose replay computed over weights like real ones (`zero_experts`: over the others)."""
    rs = _energy_rows(rows, zero_experts)
    return statistics.fmean(abs(r["energy_error_pct"]) for r in rs) if rs else float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def regime_summary_lines(regimes: list[tuple[str, list]]) -> list[str]:
    """One row per regime: latency and energy against the simulator, the replays' own spread."""
    out = ["| regime | cases | latency MAPE | worst latency error | energy MAPE (board) | worst energy error | "
           "replays per case | largest spread between replays | decisions same, bytes exact |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, rows in regimes:
        worst = max(rows, key=lambda r: abs(r["error_pct"]))
        er = _energy_rows(rows)
        worst_e = max(er, key=lambda r: abs(r["energy_error_pct"])) if er else None
        exact = sum(r["plan_bytes"] == r["copied_bytes"] == r["measured_plan_bytes"] and r["decisions_match"]
                    for r in rows)
        out.append(f"| {name} | {len(rows)} | {mape(rows):.1f} % | {worst['error_pct']:+.1f} % ({worst['model']}, "
                   f"{worst['policy']} @{worst['context_length']}) | "
                   + (f"{energy_mape(er):.1f} % | {worst_e['energy_error_pct']:+.1f} % ({worst_e['model']}, "
                      f"{worst_e['policy']} @{worst_e['context_length']}) | " if worst_e else
                      f"not valid: measured over zero-valued experts ({energy_mape(rows, zero_experts=True):.1f} %) | | "
                      if _energy_rows(rows, zero_experts=True) else "not measured | | ")
                   + f"{min(r['replays'] for r in rows)}–{max(r['replays'] for r in rows)} | "
                   f"{max(r['spread_pct'] for r in rows):.1f} % | {exact}/{len(rows)} |")
    return out


def regime_case_lines(rows: list[dict]) -> list[str]:
    out = ["| model | context | policy | launch | measured ms/token | simulated | error | board mJ/token measured "
           "(min–max) | at W | simulated | error | stall ms per layer, measured: mean, p90, p99 | simulated |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        e = (f"{r['measured_mj']:.1f} ({r['measured_mj_min']:.0f}–{r['measured_mj_max']:.0f}) | {r['measured_w']:.0f} | "
             f"{r['simulated_mj']:.1f} | {r['energy_error_pct']:+.1f} %" + (" (zero experts)" if r.get("zero_experts") else "")
             if "measured_mj" in r else "| | |")
        if "measured_stalls_ms" in r:
            m, sm = r["measured_stalls_ms"], r["simulated_stalls_ms"]
            st = (f"{statistics.fmean(m):.4f}, {_pct(m, 0.9):.4f}, {_pct(m, 0.99):.4f} | "
                  f"{statistics.fmean(sm):.4f}, {_pct(sm, 0.9):.4f}, {_pct(sm, 0.99):.4f}")
        else:
            st = "| "
        launch = r["kernel_launch"] + (f"; host alone {r['host_alone_ms']:.2f} ms/token" if "host_alone_ms" in r else "")
        if "host_ahead_ms" in r:
            launch += f" ({r['host_ahead_ms']:.2f} ahead of the GPU)"
        if "compute_span_ms" in r:  # the GPU's time inside compute steps (hwreplay --op-spans) and the arrays' time
            launch += (f"; inside compute {r['compute_span_ms']:.3f} ms/token (simulated arrays "
                       f"{r['sim_arrays_ms']:.3f})")
        if r.get("sim_host_ms"):  # the host's enqueueing time per token as the config's issue costs price it
            launch += f"; simulated host {r['sim_host_ms']:.2f} ms/token"
        out.append(f"| {r['model']} | {r['context_length']} | {r['policy']} | {launch} | "
                   f"{r['measured_ms']:.3f} | {r['simulated_ms']:.3f} | {r['error_pct']:+.1f} % | {e} | {st} |")
    return out


def stall_figure(name: str, rows: list[dict], path: str) -> bool:
    """Per-layer stall distributions (CDFs of every measured token and MoE layer) of replay and simulator, one panel
    per case; False where no case of the regime timed its stalls."""
    rows = [r for r in rows if "measured_stalls_ms" in r]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.8 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        for key, label, style in (("measured_stalls_ms", "replay (H200)", "-"), ("simulated_stalls_ms", "simulator", "--")):
            xs = sorted(r[key])
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, label=label)
        ax.set_title(f"{r['model'][:16]} @{r['context_length']} {r['policy']}", fontsize=8)
        ax.set_xlabel("stall per MoE layer (ms)", fontsize=8)
        ax.set_ylabel("fraction of layers", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{name}: per-layer stall distributions", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return True


def regime_lines(regimes: list[tuple[str, list]], figure_dir: str | None, report_dir: str) -> list[str]:
    """VALIDATION.md's regimes: the summary, then each regime's cases and, where stalls were timed, its figure."""
    if not regimes:
        return []
    lines = ["## Regimes", "", "Each regime is replayed and re-simulated on its own; the energy is the GPU board's "
             "(NVML total-energy counter over each replay, warm-up tokens included: read by chipsim.hwreplay.nvml.Meter "
             "from a counter step after idle to one after idle, less the idle power over the idle part, where the "
             "file records an idle power; read right before and right after the replay in the earlier leases' "
             "files) against the simulator's "
             "board part (every ledger entry but the host DRAM's and the host CPU's) with the energy table of "
             f"{table_source([r for _, rows in regimes for r in rows])}, derived from single-op microbenchmarks only. Until the replay filled its "
             "experts in host memory with normal BF16 numbers, every copied expert was zeros (freshly pinned "
             "memory), and GEMVs over zero weights draw less power: those files' energies are shown, marked, and "
             "left out of the energy MAPE.", ""]
    lines += regime_summary_lines(regimes) + [""]
    for name, rows in regimes:
        settings = []  # each distinct set of config overrides the regime's replays ran with, in order
        for r in rows:
            extra = r.get("compared_with", [])
            replayed = [o for o in r["overrides"] if o not in extra]
            line = f"- {r['model']}: " + (", ".join(f"`{o}`" for o in replayed) or "none") + (
                f"; {r['copy_streams']} copy streams" if r["copy_streams"] > 1 else "") + (
                "; simulated with " + ", ".join(f"`{o}`" for o in extra) if extra else "")
            if line not in settings:
                settings.append(line)
        lines += [f"### {name}", "", "Replayed with these config overrides:", ""] + settings + [""]
        lines += regime_case_lines(rows) + [""] + host_lines(rows)
        if figure_dir:
            path = os.path.join(figure_dir, _figure_file(name))
            if stall_figure(name, rows, path):
                lines += [f"![{name}: per-layer stalls]({os.path.relpath(path, report_dir)})", ""]
    return lines


def op_energy_lines(probe: dict, config: str) -> list[str]:
    """VALIDATION.md lines: each kernel shape's measured energy alone (validation/energy/probe_op_energy.py) against
    what `config`'s energy table charges that operation, by kind."""
    from chipsim.hwreplay.energy_table import modelled_op_energy_nj, op_energy_rows

    hw = load_config(config, ["compute.op_energy_pj={}"]).hw  # the table's per-action prices, not the probe itself
    rows = op_energy_rows(probe)
    check = []
    for r in rows:
        model = modelled_op_energy_nj(hw, r["key"], key_groups(r["key"]))
        check.append({"key": r["key"], "users": r["users"] or [r["key"]], "measured_us": r["nj_per_kernel"],
                      "model_us": model, "error_pct": 100.0 * (model - r["nj_per_kernel"]) / r["nj_per_kernel"]
                      if r["nj_per_kernel"] > 0 else float("nan")})
    usable = [c for c in check if c["error_pct"] == c["error_pct"]]
    lines = ["### Energy per kernel shape, alone", "",
             f"Each kernel shape of the decode steps run alone as a chain in one CUDA graph with the board's counter read "
             f"around it (validation/energy/probe_op_energy.py; energy above the idle windows' "
             f"{rows[0]['idle_w']:.1f} W), against what {config}'s energy table, without its measured per-shape "
             f"energies (compute.op_energy_pj, which list these), charges that "
             f"operation (chipsim.hwreplay.energy_table.modelled_op_energy_nj). {len(check) - len(usable)} shapes drew "
             "no measurable energy above idle and are left out.", ""]
    return lines + _kind_rows(usable, split_shared=True, unit="nJ per kernel") + [""]


def step_against_kernels_lines(probe: dict, regimes: list) -> list[str]:
    """VALIDATION.md lines: every replay whose energy windows record the board's idle power (nvml.Meter), its
    energy above that idle per token beside the sum of its kernels' energies alone (`probe`, the same kernels
    times their launches per token) and its copies at the config's per-bit energy; only cases whose every kernel
    shape the probe ran."""
    from chipsim.hwreplay.energy_table import op_energy_rows

    alone = {r["key"]: r["nj_per_kernel"] for r in op_energy_rows(probe)}
    out = []
    for name, rows in regimes:
        for r in rows:
            if "measured_above_idle_mj" not in r or not set(r["kernels_per_token"]) <= set(alone):
                continue
            if "host_experts_per_token" in r:  # its token's experts ran on the host CPU, not as the counted kernels
                continue
            counts = r["kernels_per_token"]
            kernels = sum(alone[k] * n for k, n in counts.items()) / 1e6
            copies = r["copied_bytes"] * 8 * r["copy_pj_per_bit"] / 1e9 / r["replayed_tokens"]
            above = r["measured_above_idle_mj"]
            out.append(f"| {name} | {r['model']} | {r['context_length']} | {r['policy']} | "
                       f"{'zeros' if r.get('zero_experts') else 'normal BF16'} | {above:.1f} | "
                       f"{kernels:.1f} | {copies:.1f} | {100.0 * (kernels + copies - above) / above:+.1f} % |")
    if not out:
        return []
    return ["### A decode step against its kernels alone", "",
            "Each replay read by nvml.Meter: its energy above the board's own idle power per token (warm-up "
            "included), beside the same token's kernels each at its energy alone (the table above: every kernel "
            "shape times its launches per token) and its copies at the config's PCIe and HBM per-bit energies. "
            "Cases with a kernel shape the probe did not run are left out. The probe's weights are normal BF16 "
            "numbers; the replays' copied experts were zeros until the harness filled its host memory (`experts`).",
            "", "| regime | model | context | policy | experts | measured above idle, mJ/token | kernels alone | "
            "copies | kernels + copies against measured |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + out + [""]


def array_model_vs_profile(mb: dict, config: str, graphs: bool) -> list[dict]:
    """Each profiled kernel shape: the array model's estimate (config without op_times_ns) vs its measured time
    (inside a CUDA graph when the replays ran with graphs, else launched eagerly)."""
    am = ArrayModel(load_config(config, list(ARRAY_MODEL_ONLY)).hw)
    field = "graph_us" if graphs else "eager_us"
    out = []
    for r in mb.get("op_times", []):
        op = am.op_for_key(r["key"], key_groups(r["key"]))
        model_us = op.duration_ps / 1e6
        out.append({"key": r["key"], "users": r["users"], "measured_us": r[field], "model_us": model_us,
                    "error_pct": 100.0 * (model_us - r[field]) / r[field]})
    return out


def _kind_of(r: dict, split_shared: bool) -> str:
    """A profile row's kind; with split_shared, a matvec whose operand rows several outputs share apart."""
    kind = r["key"].split()[0]
    return "matvec, shared operand" if split_shared and key_groups(r["key"]) > 1 else kind


def _signed_pct(x: float) -> str:
    """A whole per cent with its sign; an error that rounds to 0 is +0 %, whichever side of it a rounding left it."""
    return f"{round(x) + 0:+d} %"


def _kind_rows(check: list[dict], split_shared: bool = False, unit: str = "µs") -> list[str]:
    """Per operation kind: shapes, median and worst error of a model against the profiled kernels (`unit`: what
    the rows' model_us and measured_us hold)."""
    out = ["| kind | shapes | median error | median |error| | worst |", "| --- | --- | --- | --- | --- |"]
    for kind in ("matvec", "matvec, shared operand", "sfu", "vector"):
        rs = [r for r in check if _kind_of(r, split_shared) == kind]
        if not rs:
            continue
        errs = sorted(r["error_pct"] for r in rs)
        worst = max(rs, key=lambda r: abs(r["error_pct"]))
        out.append(f"| {kind} | {len(rs)} | {_signed_pct(statistics.median(errs))} | "
                   f"{statistics.median(abs(e) for e in errs):.0f} % | {_signed_pct(worst['error_pct'])} "
                   f"({worst['users'][0]}: {worst['model_us']:.2f} {unit} modelled, {worst['measured_us']:.2f} {unit} "
                   "measured) |")
    every = [abs(r["error_pct"]) for r in check]
    out.append(f"| all | {len(check)} | | {statistics.median(every):.0f} % | |")
    return out


def cycle_level_lines(config: str, check: list[dict], gemv_probe: dict | None,
                      known: list[dict] | None = None) -> list[str]:
    """VALIDATION.md lines: the cycle-level description of the SM array against kernels of the structure it
    describes (`known`: the same shapes timed with chipsim/hwreplay/triton_kernels.py), against the profiled
    (cuBLAS / PyTorch) kernels, and, where the GEMV probe ran, the worst GEMVs both ways."""
    lines = ["### The cycle-level model of the SM array against the profiled kernels", "",
             f"`{config}`: the SMs as the cycle-level model's arrays, from published figures, single-op "
             "microbenchmarks (validation/compute/) and the GEMV kernel's own structure (chipsim/hwreplay/"
             "triton_kernels.py: 8 rows per program, 8 KiB tiles, not pipelined, 7 programs per SM by its registers); "
             "every kernel shape of the profile, modelled without it, against its measured time inside a CUDA graph.",
             ""]
    if known:
        lines += ["Against the same shapes run by that GEMV kernel (validation/compute/h200-op-times-triton.json; "
                  "SFU and vector kernels as in the profile):", ""] + _kind_rows(known, split_shared=True) + [
                  "", "Against the profiled kernels (cuBLAS picks its own GEMV kernel per shape):", ""]
    lines += _kind_rows(check) + [""]
    if gemv_probe:
        am = ArrayModel(load_config(config, list(ARRAY_MODEL_ONLY)).hw)
        lines += ["The worst-modelled GEMV shapes again, each as a chain in one CUDA graph on the same machine: a "
                  "Triton GEMV of known structure (8 output rows per program, validation/compute/probe_sm.py "
                  "--gemv) beside torch.mv (cuBLAS), and the cycle-level model:", "",
                  "| shape | programs | Triton µs | cuBLAS µs | model µs | model vs Triton | model vs cuBLAS |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in gemv_probe["gemv_in_graph"]:
            outputs = int(r["key"].split()[2][1:])
            if r["programs"] * 8 < outputs:  # the 8-rows-per-program kernel only
                continue
            m = am.op_for_key(r["key"]).duration_ps / 1e6
            lines.append(f"| {r['key']} | {r['programs']} | {r['triton_us']} | {r['cublas_us']} | {m:.2f} | "
                         f"{100 * (m / r['triton_us'] - 1):+.0f} % | {100 * (m / r['cublas_us'] - 1):+.0f} % |")
        lines.append("")
    return lines


def report(results: list[dict], microbench: dict | None, held_out: str, commands: list[str], notes: list[str],
           profile_check: list[dict] | None = None, pcie: dict | None = None,
           cycle_level: list[str] | None = None, regimes: list[str] | None = None,
           machines: list[str] | None = None, other_gpus: list[str] = ()) -> str:
    rows = [r for res in results for r in res["rows"]]
    dev = [r for r in rows if r["model"] != held_out]
    held = [r for r in rows if r["model"] == held_out]
    title = ("# Validation against a real machine: the lent NVIDIA H200" if not other_gpus else
             "# Validation against real machines: the lent NVIDIA H200 and " + " and ".join(other_gpus))
    lines = [title, "",
             "Written by `chipsim hwcompare` from the measurement files in `validation/` (numbers are read from them "
             "and from the simulator, none typed by hand).", ""]
    lines += ["## Summary", ""]
    groups = {"all": rows, "development shapes": dev, f"held out ({held_out})": held}
    for model in dict.fromkeys(r["model"] for r in rows):
        groups[model] = [r for r in rows if r["model"] == model]
    lines += summary_lines(groups) + [""]
    lines += regimes or []
    if microbench:
        lines += _microbench_lines(microbench)
        if profile_check:
            lines += _profile_check_lines(profile_check)
        if cycle_level:
            lines += cycle_level
        if pcie:
            lines += pcie_check.report_lines(pcie)
    lines += machines or []
    lines += ["## Findings", ""] + notes + [""]
    lines += [f"## Development shapes ({', '.join(dict.fromkeys(r['model'] for r in dev))})", ""] + _table(dev) + [""]
    lines += [f"## Held-out shape: {held_out}", "",
              "Kept out of all tuning of the harness and the microbenchmarks (see Findings for what was seen when).", ""]
    lines += _table(held) + [""]
    lines += _method_lines(commands)
    return "\n".join(lines)


def _microbench_lines(mb: dict, heading: str = "## Machine and microbenchmarks (the only source of "
                                                 "hwconfigs/h200-pcie5.yaml's timing)") -> list[str]:
    """The machine and the microbenchmark fits the config's timing comes from, with the keys each sets."""
    lines = [heading, "",
             f"{mb['machine']['gpu']}, {mb['machine']['sm_count']} SMs, host {mb['machine'].get('host_cpu')} "
             f"({mb['machine'].get('host_cpus')} CPUs, {mb['machine'].get('host_memory_gib')} GiB); "
             f"torch {mb['machine']['torch']}, CUDA {mb['machine']['cuda']}; nvidia-smi (max SM clock, max memory "
             f"clock, PCIe gen, width, driver): {mb['machine'].get('nvidia_smi')}.", "",
             "| measurement | fit | used for |", "| --- | --- | --- |",
             f"| pinned host-to-device copies, 16 back to back, 256 KiB–16 MiB | {mb['h2d_pinned_queued16_fit']['bandwidth_gbps']} GB/s, "
             f"{mb['h2d_pinned_queued16_fit']['intercept_us']} µs per copy | links.pcie.bandwidth_gbps, dma.setup_ns |",
             f"| pinned copies one at a time, 1–64 MiB | {mb['h2d_pinned_single_fit']['bandwidth_gbps']} GB/s, "
             f"{mb['h2d_pinned_single_fit']['intercept_us']} µs | links.pcie.latency_ns (single − queued intercept) |",
             f"| pageable copy, 16 MiB | {mb['h2d_pageable'][0]['gbps']} GB/s | (reference only: one reused buffer, "
             "from the host's cache; python -m chipsim.hwreplay.host_frontend times cold ones) |",
             f"| GEMV, 8–256 MiB of weights, each on a different weight | {mb['gemv_fit']['bandwidth_gbps']} GB/s, "
             f"{mb['gemv_fit']['intercept_us']} µs | operand path bandwidth (links.ucie), compute.sram_access_ns |",
             f"| tiny kernel, GPU side ({mb['tiny_kernels'].get('queued_kernels', '')} queued behind a sleep) | "
             f"{mb['tiny_kernels']['gpu_us_per_kernel']} µs | compute.op_overhead_cycles |",
             f"| tiny kernel, eager PyTorch chain (host dispatch included) | {mb['tiny_kernels']['eager_chain_us_per_kernel']} µs "
             "| not used (see Findings) |"]
    if isinstance(mb["tiny_kernels"].get("graph_us_per_kernel"), (int, float)):
        lines.append(f"| tiny kernel inside one CUDA graph | {mb['tiny_kernels']['graph_us_per_kernel']} µs | "
                    "compute.op_overhead_cycles of the graph config (ops outside the profile) |")
    if isinstance(mb.get("graph_launch", {}).get("us_per_one_kernel_graph"), (int, float)):
        lines.append(f"| one-kernel CUDA graph, GPU time per launch | {mb['graph_launch']['us_per_one_kernel_graph']} µs | "
                    "compute.op_group_launch_ns (minus the kernel's own time) |")
    if mb.get("op_times"):
        src = mb.get("op_times_from", {})
        lines.append(f"| every kernel shape of the decode steps ({len(mb['op_times'])} shapes: those of "
                    f"{', '.join(src.get('configs', []))} at contexts {', '.join(map(str, src.get('contexts', [])))}), "
                    "each alone, in a CUDA graph | "
                    "per shape | compute.op_times_ns (profiled operators) |")
    lines.append("")
    return lines


def _written_by(config: str) -> tuple[str, str, dict]:
    """A gpuconfig-written config's command (its header's third line), its microbenchmark file and its options."""
    import shlex

    try:
        with open(config) as f:
            command = f.read().splitlines()[2].lstrip("# ").strip()
        words = shlex.split(command)
        assert words[:3] == ["python", "-m", "chipsim.hwreplay.gpuconfig"] and len(words) > 3
    except (OSError, IndexError, ValueError, AssertionError):
        raise InputError(f"--machine {config}: not a config written by chipsim.hwreplay.gpuconfig (its command "
                         "belongs on its third line)") from None
    options = {k: v for k, v in zip(words[4:], words[5:]) if k.startswith("--")}
    return command, words[3], options


def machine_gpu(config: str) -> str:
    """The GPU a gpuconfig-written config describes, by its datasheet title (chipsim.hwreplay.gpuconfig.GPUS)."""
    microbench = _written_by(config)[1]
    mb = read_json(microbench)
    return gpu_facts(mb.get("machine", {}) if isinstance(mb, dict) else {}, microbench).title


def machine_lines(config: str) -> list[str]:
    """--machine: another GPU calibrated from its own probes: how its config was written (its header's command),
    the microbenchmark's fits and the energy table its probes give."""
    from chipsim.hwreplay.energy_table import derive

    command, microbench, options = _written_by(config)
    energy_probe = options.get("--energy-probe")
    mb, gpu = check_microbench(read_json(microbench), microbench, report=True), machine_gpu(config)
    lines = [f"## Another GPU calibrated from its own probes: {gpu}", "",
             f"{config} was written from single-op probes on lent machines of that GPU alone "
             "(`validation/calibrate-gpu.sh`, then each regime's script added the kernel shapes its replays needed; "
             f"{os.path.dirname(microbench)}/README.md says which probe ran on which machine), by", "",
             f"    {command}", ""]
    if energy_probe:
        fit = derive(read_json(energy_probe), read_json(options.get("--gemm-clock")))
        lines += [f"Its energy table ({energy_probe}"
                  + (f", the MAC from {options['--gemm-clock']}" if "--gemm-clock" in options else "")
                  + f"; chipsim.hwreplay.energy_table): idle {fit.idle_w:.1f} W; every SM busy {fit.busy_w:.1f} W "
                  f"above idle (one-block kernels {fit.tiny_above_idle_w:.1f} W); {fit.hbm_pj_per_bit:.2f} pJ per bit "
                  f"read from HBM; {fit.mac_pj:.2f} pJ per BF16 MAC; host-to-device copies {fit.pcie_pj_per_bit:.2f} "
                  "pJ per bit.", ""]
    return lines + _microbench_lines(mb, f"### {gpu}: machine and microbenchmarks")


def _profile_check_lines(profile_check: list[dict]) -> list[str]:
    """The array model's estimate of each profiled kernel shape against its measured time, per kind."""
    lines = ["### The array model against the profiled kernels", "",
             "What chipsim's analytic array model (hwconfigs/h200-pcie5.yaml without `op_times_ns`) predicts for "
             "each profiled kernel shape, against its measured time inside a CUDA graph. The simulated latencies "
             "above use the measured times; the 'array model only' columns use these estimates.", "",
             "| kind | shapes | median error | worst |", "| --- | --- | --- | --- |"]
    for kind in ("matvec", "sfu", "vector"):
        rs = [r for r in profile_check if r["key"].startswith(kind)]
        if not rs:
            continue
        errs = sorted(rs, key=lambda r: r["error_pct"])
        worst = max(rs, key=lambda r: abs(r["error_pct"]))
        lines.append(f"| {kind} | {len(rs)} | {errs[len(errs) // 2]['error_pct']:+.0f} % | {worst['error_pct']:+.0f} % "
                     f"({worst['users'][0]}: {worst['model_us']:.2f} µs modelled, {worst['measured_us']:.2f} µs measured) |")
    lines.append("")
    return lines


def _method_lines(commands: list[str]) -> list[str]:
    """How the replays were measured and compared, and the commands that did it."""
    return ["## How it was measured", "",
            "- `chipsim hwreplay CONFIG` builds, for every policy and context, the simulator's decisions on the trace as an "
            "ordered action list (chipsim.hwreplay.plan: fetch issues with their buffer slot, evictions, expert "
            "computes, layer and token boundaries) and replays it on the GPU (chipsim.hwreplay.harness): expert weights "
            "of the published shape in pinned host memory, a bounded GPU buffer of the plan's slots, copies on one copy "
            "stream (FIFO, as the config's DMA: one engine, no preemption, no cancel), one kernel per primitive the "
            "simulator costs on the compute stream (with `--graphs`, each simulator op group captured once as a CUDA "
            "graph and launched as one), a copy waiting for the compute stream to reach its issue point and "
            "for its slot's last reader, an expert waiting for its copy. Per-token latency is measured with CUDA "
            "events; the first tokens are warm-up.",
            "- The regimes' replays with experts cached run with `--segments`: each run of compute between two "
            "synchronisations with the copy stream is one CUDA graph (18–20 launches per token instead of ~400), "
            "so the GPU, not the host's launches, sets the pace; the config then charges no per-group launch gap. "
            "With `--stalls`, CUDA events around every wait of the compute stream for a copy time each MoE layer's "
            "stall; the board's energy is read from NVML (nvmlDeviceGetTotalEnergyConsumption) before the first "
            "token is enqueued and after the last has run.",
            "- 4-bit experts (`--set model.expert_bits=4`): the host store and the GPU slots hold each expert's "
            "packed weights and BF16 scales (one per 128 weights); its matvecs run a Triton kernel that "
            "dequantises in registers as it streams them (chipsim/hwreplay/triton_kernels.py `gemv_q4`; no "
            "separate dequantisation kernel, so the profile times that primitive at 0), checked against the "
            "dequantised reference on the device (validation/compute/check_q4.py).",
            "- DMA semantics (`dma.engines` > 1, `demand_first`, `demand_preempts_prefetch`, `cancel_in_flight`): "
            "the plan also holds the simulator's copy schedule, every span in which one engine moved a run of one "
            "transfer's bytes; the replay gives each engine a copy stream and each span its own copy, in the "
            "schedule's order (a GPU copy engine cannot pause or drop a copy it has begun), so a prefetch "
            "abandoned at routing moves only the bytes the simulator moved.",
            "- Bytes: the plan's bytes (every issue's whole expert, or the schedule's spans), the bytes the GPU "
            "copied, and the bytes in the measurement file must be equal; decisions: the plan rebuilt here must "
            "have the digest recorded on the device.",
            "- error = (simulated − measured) / measured; MAPE = mean |error|. Overlapped policies: "
            + ", ".join(OVERLAPPED) + ".", "", "Commands:", "", "```"] + commands + ["```", ""]


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    measured, mb, notes, pcie = _read_inputs(a)  # before any work: every output path, option and input checked
    machines = [line for config in a.machine for line in machine_lines(config)]  # read first: a bad file stops all
    prefill = prefill_regimes(a.prefill_regime, a.jobs)
    batch = batch_regimes(a.batch_regime, a.jobs)
    served = served_regimes(a.served_regime, a.jobs)
    held_out = a.held_out or HELD_OUT
    if not a.measurements:  # the prefill, batch and served regimes alone, printed
        for name, rows in prefill:
            print("\n".join(prefill_lines(name, rows)))
        for name, rows in batch:
            print("\n".join(batch_lines(name, rows)))
        for name, rows in served:
            print("\n".join(served_lines(name, rows)))
        _print_mapes([], held_out, [], prefill, batch, served)
        return 0
    regimes = _regime_rows(a.regime, a.jobs, measured)
    results = [compare_file(p, jobs=a.jobs, meas=measured[p]) for p in a.measurements]
    report_dir = os.path.dirname(os.path.abspath(a.report)) if a.report else os.getcwd()
    graphs = all(res["kernel_launch"] == ["graph"] for res in results)
    commands = _commands(a, [res["config"] for res in results], graphs, [name for name, _ in prefill + batch + served])
    config = _resolve(results[0]["config"], a.measurements[0])
    check = array_model_vs_profile(mb, config, graphs) if mb and mb.get("op_times") else None
    cycle = None
    if a.cycle_level and mb and mb.get("op_times"):
        probe, known = (read_json(a.gemv_probe), read_json(a.kernel_times))
        known_check = array_model_vs_profile(known, a.cycle_level, True) if known else None
        cycle = cycle_level_lines(a.cycle_level, array_model_vs_profile(mb, a.cycle_level, graphs), probe, known_check)
    extra = (regime_lines(regimes, _figure_dir(a) if a.report else None, report_dir)
             + [line for name, rows in prefill for line in prefill_lines(name, rows)]
             + [line for name, rows in batch for line in batch_lines(name, rows)]
             + [line for name, rows in served for line in served_lines(name, rows)]
             + _probe_lines(a, config, regimes, machine_config(results[0]["config"], a.measurements[0])))
    others = [machine_gpu(config) for config in a.machine]
    text = report(results, mb, held_out, commands, notes, check, pcie, cycle, extra, machines, others)
    rows = [r for res in results for r in res["rows"]]
    rows_text = json.dumps(rows, indent=1, allow_nan=False) if a.json else None  # valid JSON, made before any write
    if a.report:  # never half-written
        write_atomic(a.report, text, "--report")
        print(f"wrote {a.report}")
    else:
        print(text)
    if a.json:
        write_atomic(a.json, rows_text, "--json")
    _print_mapes(rows, held_out, regimes, prefill, batch, served)
    return 0


# options that only a comparison of decode measurement files uses (without one, the regimes' sections are printed)
WITH_MEASUREMENTS = ("microbench", "pcie_probes", "cycle_level", "kernel_times", "gemv_probe", "regime", "machine",
                     "figures", "op_energy", "handoff", "step_energy", "held_out", "notes", "report", "json")
# an option and the one it goes with: alone, it would be silently unused
NEEDS = (("cycle_level", "microbench"), ("pcie_probes", "microbench"), ("gemv_probe", "cycle_level"),
         ("kernel_times", "cycle_level"), ("figures", "report"), ("figures", "regime"))


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_options(a) -> None:
    """Options that would be silently unused: one line naming the first."""
    if not a.measurements:
        if not a.prefill_regime and not a.batch_regime and not a.served_regime:
            raise InputError("chipsim hwcompare: give measurement files, or --prefill-regime, --batch-regime or "
                             "--served-regime NAME PATH alone")
        for dest in WITH_MEASUREMENTS:
            if getattr(a, dest):
                raise InputError(f"{_flag(dest)}: used with decode measurement files only (without them the "
                                 "--prefill-, --batch- and --served-regime sections alone are printed)")
    for dest, other in NEEDS:
        if getattr(a, dest) and not getattr(a, other):
            raise InputError(f"{_flag(dest)}: goes with {_flag(other)} (without it, it would not be used)")


def _figure_dir(a) -> str:
    """Where the regimes' stall figures go: --figures, else figures/ beside --report."""
    return a.figures or os.path.join(os.path.dirname(os.path.abspath(a.report)), "figures")


def _figure_file(name: str) -> str:
    """A regime's stall figure's file name."""
    return f"stalls-{''.join(c if c.isalnum() else '-' for c in name.lower()).strip('-')}.png"


def _check_outputs(a) -> None:
    """Before any work: the report, the JSON rows and the figures' folder can be written (nothing half-written)."""
    if a.report:
        check_output_file(a.report, "--report")
    if a.json:
        check_output_file(a.json, "--json")
        if a.report and same_file(a.json, a.report):
            raise InputError(f"--json {a.json}: the same file as --report")
    if a.report and a.regime:
        check_output_dir(_figure_dir(a), [_figure_file(spec[0]) for spec in a.regime],
                         "--figures" if a.figures else "--report's figures folder")


def _read_inputs(a) -> tuple[dict, dict | None, list[str], dict | None]:
    """Before any work: the options, the outputs, every decode measurement file ({path: file}, each checked; each
    --regime with a case), the microbenchmark (checked) with the probes that go with it, and the notes."""
    _check_options(a)
    _check_outputs(a)
    measured = {p: read_measurement(p) for p in a.measurements}
    for spec in a.regime:
        listed = _regime_items(spec)
        for path, _, _ in listed:
            if path not in measured:
                measured[path] = read_measurement(path)
        if not any(contexts is None or c["context_length"] in contexts
                   for path, contexts, _ in listed for c in measured[path]["cases"]):
            raise InputError(f"--regime {spec[0]}: no case in {' '.join(spec[1:])} (check the @contexts)")
    models = sorted({measured[p]["model"] for p in a.measurements})
    if a.held_out is not None and a.held_out not in models:
        raise InputError(f"--held-out {a.held_out}: no measurement file is of this model (theirs: "
                         f"{', '.join(models) or 'none'})")
    mb = check_microbench(read_json(a.microbench, "--microbench"), a.microbench, report=True) if a.microbench else None
    if a.cycle_level and not mb.get("op_times"):
        raise InputError(f"--cycle-level: --microbench {a.microbench} has no op_times (the profiled kernels it "
                         "estimates)")
    _check_probe_files(a)
    return (measured, mb, *_notes_and_pcie(a))


def _check_probe_files(a) -> None:
    """The single-op probes' files, each read and checked as its section will read it (no simulation in that)."""
    if a.cycle_level:
        load_config(a.cycle_level, list(ARRAY_MODEL_ONLY))
    if a.kernel_times:
        check_op_times(read_json(a.kernel_times, "--kernel-times"), a.kernel_times, ("graph_us",))
    if a.gemv_probe:
        check_gemv_probe(read_json(a.gemv_probe, "--gemv-probe"), a.gemv_probe)
    if a.op_energy:
        check_op_energy(read_json(a.op_energy, "--op-energy"), a.op_energy)
    if a.handoff:
        handoff_lines(read_json(a.handoff, "--handoff"), a.handoff)
    if a.step_energy:
        step_energy_lines([(path, read_json(path, "--step-energy")) for path in a.step_energy])


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="chipsim hwcompare", description="simulated vs measured latency and bytes of hardware "
                       "replays: re-simulates every measured case and writes the comparison (VALIDATION.md)")
    ap.add_argument("measurements", nargs="*", metavar="MEASUREMENT",
                    help="files written by chipsim hwreplay (validation/<config>.json), in report order (none: print "
                         "the --prefill-regime sections alone)")
    ap.add_argument("--microbench", default=None, metavar="FILE",
                    help="microbenchmark file (validation/h200-microbench.json): per-kernel array-model errors")
    ap.add_argument("--pcie-probes", nargs=2, default=None, metavar=("HOST", "COPIES"),
                    help="the link's config-space settings and the separately measured copy costs "
                         "(validation/pcie/h200-host-pcie.json validation/pcie/h200-copy-latency.json): the PCIe link "
                         "layer against the microbenchmark's copy curve")
    ap.add_argument("--cycle-level", default=None, metavar="CONFIG",
                    help="a cycle-level description of the GPU (hwconfigs/h200-cycle-level.yaml): its estimate of "
                         "every profiled kernel (needs --microbench)")
    ap.add_argument("--kernel-times", default=None, metavar="FILE",
                    help="validation/compute/h200-op-times-triton.json: every shape timed with the GEMV kernel the "
                         "cycle-level description describes (microbench --gemv triton)")
    ap.add_argument("--gemv-probe", default=None, metavar="FILE",
                    help="validation/compute/h200-gemv-probe.json: GEMVs of known structure beside cuBLAS")
    ap.add_argument("--regime", nargs="+", action="append", default=[], metavar="NAME FILE[@N,N][+KEY=VALUE]",
                    help="a regime reported on its own: its name, then measurement files (@N,N: only these context "
                         "lengths of a file; +KEY=VALUE: the file re-simulated with this config key set too, e.g. "
                         "a measured key its replays' config lacked); repeatable")
    ap.add_argument("--prefill-regime", nargs="+", action="append", default=[], metavar="NAME PATH",
                    help="a request's prefill replayed (chipsim hwreplay --prompts): its name, then measurement files "
                         "or folders of them (validation/regimes/prefill); TTFT and energy against the simulator, a "
                         "section of its own, left out while its folders hold no file; repeatable")
    ap.add_argument("--batch-regime", nargs="+", action="append", default=[], metavar="NAME PATH",
                    help="a batch's decode steps replayed (chipsim hwreplay --batch B): its name, then measurement "
                         "files or folders of them (validation/regimes/batch); per-step latency and energy against the "
                         "simulator, a section of its own, left out while its folders hold no file; repeatable")
    ap.add_argument("--served-regime", nargs="+", action="append", default=[], metavar="NAME PATH",
                    help="a served run replayed (chipsim hwreplay --served): its name, then measurement files or "
                         "folders of them (validation/regimes/served); per-step latency and the run's energy against "
                         "the simulator, a section of its own, left out while its folders hold no file; repeatable")
    ap.add_argument("--machine", action="append", default=[], metavar="CONFIG",
                    help="another GPU's config written from its own probes (hwconfigs/h100-pcie5.yaml): a section with "
                         "the command in its header, its microbenchmark's fits and its energy table; repeatable")
    ap.add_argument("--figures", default=None, metavar="DIR",
                    help="where the regimes' per-layer stall figures go (default: figures/ beside --report)")
    ap.add_argument("--op-energy", default=None, metavar="FILE",
                    help="validation/energy/h200-op-energy.json (probe_op_energy.py): each kernel shape's energy "
                         "alone against the config's energy table")
    ap.add_argument("--handoff", default=None, metavar="FILE",
                    help="validation/compute/h200-handoff.json (probe_handoff.py): the copy/compute hand-off table")
    ap.add_argument("--step-energy", nargs="+", default=[], metavar="FILE",
                    help="probe_step_energy.py files: a token's kernels together against alone, one row each")
    ap.add_argument("--held-out", default=None, metavar="SHAPE",
                    help=f"model shape kept out of all debugging, reported on its own (default {HELD_OUT}; given, "
                         "a measurement file must be of it)")
    ap.add_argument("--notes", default=None, metavar="FILE", help="markdown file whose lines go under Findings")
    ap.add_argument("--report", default=None, metavar="FILE", help="write the markdown report here (VALIDATION.md)")
    ap.add_argument("--json", default=None, help="also write every row as JSON")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes rebuilding plans (default: cores)")
    return ap


def _regime_items(spec: list[str]) -> list[tuple[str, set | None, list[str]]]:
    """--regime NAME FILE[@N,N][+KEY=VALUE...]...: each file's path, its contexts (None: all) and its config keys."""
    if len(spec) < 2:
        raise InputError(f"--regime {' '.join(spec)}: expected a name and at least one measurement file")
    out = []
    for item in spec[1:]:
        item, *sets = item.split("+")
        path, _, ctx = item.partition("@")
        try:
            contexts = {int(c) for c in ctx.split(",")} if ctx else None
        except ValueError:
            raise InputError(f"--regime {spec[0]}: {item!r}: expected FILE or FILE@N,N with whole numbers") from None
        out.append((path, contexts, sets))
    return out


def _regime_rows(specs: list[list[str]], jobs: int, measured: dict | None = None) -> list[tuple[str, list]]:
    """Each --regime NAME FILE[@N,N][+KEY=VALUE...]...: its name and the compared rows of its files (of those contexts
    only; each re-simulated with those config keys set besides the replay's own; `measured`: files read already)."""
    regimes = []
    for spec in specs:
        rows = []
        for path, contexts, sets in _regime_items(spec):
            res = compare_file(path, overrides=tuple(sets), jobs=jobs, contexts=contexts,
                               meas=(measured or {}).get(path))
            rows += [{**r, "machine_config": machine_config(res["config"], path), "compared_with": sets}
                     for r in res["rows"]]
        if not rows:
            raise InputError(f"--regime {spec[0]}: no case in {' '.join(spec[1:])} (check the @contexts)")
        regimes.append((spec[0], rows))
    return regimes


def _notes_and_pcie(a) -> tuple[list[str], dict | None]:
    """The --notes file's lines, and the PCIe probes checked against the microbenchmark (with --pcie-probes)."""
    try:
        notes = read_input_text(a.notes, "--notes", TEXT_MAX_BYTES).splitlines() if a.notes else []
        pcie = pcie_check.load(a.microbench, *a.pcie_probes) if a.pcie_probes and a.microbench else None
    except OSError as exc:
        raise InputError(f"{exc.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise InputError(f"{' / '.join(a.pcie_probes)}: not JSON ({exc})") from None
    except (KeyError, StopIteration, TypeError) as exc:
        raise InputError(f"{' / '.join(a.pcie_probes)}: not the probes' format ({exc!r})") from None
    return notes, pcie


def _commands(a, configs: list[str], graphs: bool, prefill_measured: list[str] = ()) -> list[str]:
    """The commands that measured and compared, for the report: on the GPU machine, then this one. A prefill or
    batch regime is named only once its files exist (`prefill_measured`: those regimes' names), as its section is."""
    prefill_specs = [spec for spec in a.prefill_regime if spec[0] in prefill_measured]
    batch_specs = [spec for spec in a.batch_regime if spec[0] in prefill_measured]
    served_specs = [spec for spec in a.served_regime if spec[0] in prefill_measured]
    commands = ["# on the GPU machine (microbenchmarks and the config first, then one command per shape)",
                "python -m chipsim.hwreplay.microbench --out validation/h200-microbench.json --shapes-from " + " ".join(configs),
                "python -m chipsim.hwreplay.gpuconfig validation/h200-microbench.json --out hwconfigs/h200-pcie5.yaml"
                + (" --kernel-launch graph" if graphs else "")]
    if a.pcie_probes:
        commands += [f"python validation/pcie/probe_pcie.py > {a.pcie_probes[0]}",
                     f"python validation/pcie/probe_copy_latency.py > {a.pcie_probes[1]}"]
    if a.cycle_level:
        commands += ["python validation/compute/probe_sm.py > validation/compute/h200-sm-probe.json"]
    if a.gemv_probe:
        commands += [f"python validation/compute/probe_sm.py --gemv > {a.gemv_probe}"]
    if a.kernel_times:
        commands += ["bash validation/compute-bound/measure.sh OUT  # its step 1 writes " + a.kernel_times]
    commands += [f"chipsim hwreplay {c} --contexts 512,2048{' --graphs' if graphs else ''} --out validation/" for c in configs]
    if prefill_specs:
        commands += ["bash validation/regimes/measure-prefill.sh OUT  # the prefill kernel shapes alone, then the "
                     "prefill replays (validation/regimes/README.md)"]
    if batch_specs:
        commands += ["bash validation/regimes/measure-batch.sh OUT  # the batch step's kernel shapes alone, then the "
                     "batch replays (validation/regimes/README.md)"]
    if served_specs:
        commands += ["bash validation/regimes/measure-served.sh OUT  # the served run's kernel shapes alone, then its "
                     "replays (validation/regimes/README.md)"]
    for config in a.machine:
        microbench = _written_by(config)[1]
        gpu, probes = gpu_facts(read_json(microbench)["machine"], microbench).slug, os.path.dirname(microbench)
        commands += [f"GPU={gpu} PROBES={probes} bash validation/calibrate-gpu.sh OUT  # {config} from that GPU's "
                     f"probes alone, then the regimes' scripts above with the same GPU and PROBES, and the decode "
                     f"replays {probes}/README.md lists"]
    if a.regime:
        commands += ["bash validation/regimes/measure-settled.sh OUT  # the energy counter and probe, every regime's "
                     "replays (validation/regimes/README.md: where each output went, and the earlier leases' commands)"]
    commands += ["# anywhere (no GPU)", "chipsim hwcompare " + " ".join(a.measurements)
                 + (f" --microbench {a.microbench}" if a.microbench else "")
                 + (f" --pcie-probes {' '.join(a.pcie_probes)}" if a.pcie_probes else "")
                 + (f" --cycle-level {a.cycle_level}" if a.cycle_level else "")
                 + (f" --gemv-probe {a.gemv_probe}" if a.gemv_probe else "")
                 + (f" --kernel-times {a.kernel_times}" if a.kernel_times else "")
                 + "".join(f" --regime {' '.join(repr(x) if ' ' in x else x for x in spec)}" for spec in a.regime)
                 + "".join(f" --prefill-regime {' '.join(repr(x) if ' ' in x else x for x in spec)}"
                           for spec in prefill_specs)
                 + "".join(f" --batch-regime {' '.join(repr(x) if ' ' in x else x for x in spec)}"
                           for spec in batch_specs)
                 + "".join(f" --served-regime {' '.join(repr(x) if ' ' in x else x for x in spec)}"
                           for spec in served_specs)
                 + "".join(f" --machine {config}" for config in a.machine)
                 + (f" --op-energy {a.op_energy}" if a.op_energy else "")
                 + (f" --handoff {a.handoff}" if a.handoff else "")
                 + (f" --step-energy {' '.join(a.step_energy)}" if a.step_energy else "")
                 + (f" --figures {a.figures}" if a.figures else "")
                 + (f" --notes {a.notes}" if a.notes else "")
                 + " --report VALIDATION.md"]
    return commands


def _probe_lines(a, config: str, regimes: list[tuple[str, list]], machine: str) -> list[str]:
    """The single-op probes' sections: each kernel's energy alone (and a step's against its kernels', for the regimes
    replayed on `machine`, the config the probes ran under), a token's kernels together against alone, and the
    copy/compute hand-off."""
    lines: list[str] = []
    if a.op_energy:
        op_probe = read_json(a.op_energy)
        lines += op_energy_lines(op_probe, config)
        own = [(name, rows) for name, rows in regimes if all(r["machine_config"] == machine for r in rows)]
        lines += step_against_kernels_lines(op_probe, own)  # the probe's board's regimes only
    if a.step_energy:
        lines += step_energy_lines([(path, read_json(path)) for path in a.step_energy])
    if a.handoff:
        lines += handoff_lines(read_json(a.handoff), a.handoff)
    return lines


def _print_mapes(rows: list[dict], held_out: str, regimes: list[tuple[str, list]], prefill=(), batch=(),
                 served=()) -> None:
    """One line of latency MAPE over every case and the held-out shape, and one per regime with its energy MAPE
    (a prefill regime: TTFT and prefill energy; a batch regime: step latency and energy per step)."""
    if rows:
        print(f"latency MAPE {mape(rows):.1f} % over {len(rows)} cases; held out ({held_out}) "
              f"{mape_text([r for r in rows if r['model'] == held_out], 'no case')}")
    for name, rs in prefill:
        energy = [r["energy_error_pct"] for r in rs if "energy_error_pct" in r]
        print(f"{name}: TTFT MAPE {prefill_mape(r['error_pct'] for r in rs):.1f} % over {len(rs)} cases, worst "
              f"{max((r['error_pct'] for r in rs), key=abs):+.1f} %; "
              + (f"prefill energy MAPE {prefill_mape(energy):.1f} %" if energy else "no energy over experts like real ones"))
    for name, rs in batch:
        print(batch_mape_line(name, rs))
    for name, rs in served:
        print(served_mape_line(name, rs))
    for name, rs in regimes:
        e = energy_mape(rs)
        print(f"{name}: latency MAPE {mape(rs):.1f} % over {len(rs)} cases, worst "
              f"{max((r['error_pct'] for r in rs), key=abs):+.1f} %; "
              + (f"energy MAPE {e:.1f} %" if e == e else "no energy over experts like real ones"))


if __name__ == "__main__":
    raise SystemExit(main())
