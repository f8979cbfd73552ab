"""A served run replayed on the GPU (`chipsim hwreplay CONFIG --served`): the config's requests (workload.requests,
workload.arrivals, workload.scheduler, with --set) served by each policy in the simulator, its steps then replayed by
chipsim.hwreplay.served_harness once unmeasured and --repeats times measured, the board's energy read around each
(gaps included). The JSON keeps each step's measured latency, each gap's measured length, the plan's digest and bytes;
`chipsim hwcompare --served-regime NAME PATH` sets them beside the simulator's.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.hwreplay.replay_setup import _host_and_slots, _plan_job, replay_repeated
from chipsim.runner import prepare


def served_plans(config: str, policies: list[str] | None, jobs: int, overrides: list[str]):
    """(the Prepared run, {policy label: Plan}), built in parallel processes; the run and every policy checked first."""
    from chipsim.hwreplay.ops import replayable_prefill_model

    hw = load_config(config, overrides).hw
    if not hw.workload.requests:
        raise InputError(f"{config}: --served replays a served run: set workload.requests, workload.arrivals and the "
                         "requests' workload.prompt_tokens and workload.output_tokens (--set)")
    replayable_prefill_model(hw, "served")  # no kernels for MLA, Mamba, 4-bit
    prep = prepare(config, overrides, policies or ())
    work = [(config, overrides, p.label) for p in prep.policies]
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work)))) as pool:
        plans = list(pool.map(_plan_job, work))
    return prep, {w[2]: p for w, p in zip(work, plans)}


def served_replay(plan, step, host, gpu_slots, first_dense: int, repeats: int, kw: dict) -> dict:
    """One served plan replayed as replay_repeated does; each replay's timed intervals split into its steps'
    latencies and its gaps' measured lengths."""
    from chipsim.hwreplay.served_harness import split_gaps

    res = replay_repeated(plan, step, host, gpu_slots, first_dense, repeats, kw)
    res["latency_ms"], res["gap_ms"] = split_gaps(plan, res["latency_ms"])
    res["repeat_latency_ms"] = [split_gaps(plan, r)[0] for r in res["repeat_latency_ms"]]
    # replay() counts per timed interval; a gap is one of them, its sleep one launch
    gaps = sum(1 for g in res["gap_ms"] if g)
    steps = len(res["latency_ms"])
    res["launches_per_token"] = (res["launches_per_token"] * (steps + gaps) - gaps) / steps
    res["compute_steps_per_token"] = (res["compute_steps_per_token"] * (steps + gaps) - gaps) / steps
    return res


def _case_line(label: str, plan, res: dict) -> str:
    runs = [res["latency_ms"], *res["repeat_latency_ms"]]
    energies = [e for e in [res["energy"], *res["repeat_energy"]] if e]
    return (f"  {label:12} {len(runs[0])} steps, measured {statistics.fmean(runs[0]):9.3f} ms/step"
            + "".join(f", again {statistics.fmean(r):.3f}" for r in runs[1:])
            + f", simulated {statistics.fmean(plan.sim_latency_ms):9.3f}; gaps {sum(res['gap_ms']):.1f} ms; copies "
            f"{res['copies']} ({res['copied_bytes'] / 1e9:.2f} GB, plan {plan.fetch_bytes / 1e9:.2f})"
            + "".join(f", board {e['energy_j']:.2f} J at {e['power_w']:.0f} W" for e in energies))


def replay_served_config(config: str, policies: list[str] | None, jobs: int, log=print, device: str = "cuda",
                         graphs: bool = False, overrides=(), gemv: str = "cublas", repeats: int = 1,
                         energy_settle_s: float = 0.5) -> dict:
    """Every policy of a config's served run replayed (module docstring); the measurement file's content."""
    import torch

    from chipsim.hwreplay.nvml import open_gpu
    from chipsim.hwreplay.served_harness import GpuServed, step_gaps_ps, step_parts

    t0 = time.perf_counter()
    overrides = list(overrides)
    prep, plans = served_plans(config, policies, jobs, overrides)
    m, expert_bytes = prep.workload.model, prep.workload.expert_bytes
    log(f"{config}: {len(plans)} served plans ({prep.config.hw.workload.requests} requests) built in "
        f"{time.perf_counter() - t0:.1f} s")
    device = torch.device(device)
    gpu = open_gpu(device.index or 0) if device.type == "cuda" else None
    host, gpu_slots = _host_and_slots(m, expert_bytes, plans.values(), device, log)
    kw = dict(graphs=graphs, gpu=gpu, energy_settle_s=energy_settle_s)
    cases = []
    for label, plan in plans.items():  # each policy's steps are its own: a step object each
        tokens = {n for a in plan.actions if a[0] == "compute" for n in a[4]}
        step = GpuServed(prep.config.hw, step_parts(plan), step_gaps_ps(plan), tokens, device, gemv=gemv)
        if step.expert_bytes != expert_bytes:
            raise RuntimeError(f"expert primitives read {step.expert_bytes} bytes, the expert has {expert_bytes}")
        res = served_replay(plan, step, host, gpu_slots, m.first_dense_layers, repeats, kw)
        log(_case_line(label, plan, res))
        cases.append({"policy": label, "plan": plan.to_json(), "kernels_per_group": step.kernels_per_group,
                      "sleep_cycles_per_ms": step.sleep_rate, **res})
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"config": config, "overrides": overrides, "model": m.name,
            "trace": os.path.basename(prep.config.trace_path),
            "host_experts": "normal-bf16" if device.type == "cuda" else "zeros (cpu dry run: one expert stands for all)",
            "served": True, "requests": prep.config.hw.workload.requests, "warmup_replays": 1,
            "energy_settle_s": energy_settle_s,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
            "torch": torch.__version__, "cases": cases, "seconds": round(time.perf_counter() - t0, 1)}
