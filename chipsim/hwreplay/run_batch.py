"""Replay a batch's decode steps on the GPU: `chipsim hwreplay CONFIG --batch B [--steps N]` (chipsim.hwreplay.run).

Each case (context, policy) is the config with workload.batch = B, workload.max_tokens = N (each sequence's decode
steps; default 16) and workload.warmup_tokens = 0, at workload.context_length = the context (--contexts; default
the config's own). Its plan (chipsim.hwreplay.plan: the simulator's decisions, each step's experts over the step's
tokens routed to them) is built on the CPU, then replayed by chipsim.hwreplay.batch_harness once unmeasured and
--repeats times measured, the board's energy read around each. The JSON keeps each step's measured latency and
the plan's digest and bytes; `chipsim hwcompare --batch-regime NAME PATH` sets them beside the simulator's.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.hwreplay.ops import replayable_prefill_model
from chipsim.hwreplay.run import _plan_job, _slots_used, expert_slots, experts_in_host, replay_repeated
from chipsim.runner import prepare

DEFAULT_STEPS = 16
# the keys --batch and --steps set: a --set of them would be overridden, so it is refused
BATCH_KEYS = ("workload.batch", "workload.max_tokens", "workload.warmup_tokens")


def batch_overrides(batch: int, steps: int) -> list[str]:
    """The config keys that make a config a batch of `batch` sequences decoding `steps` tokens each, every step
    measured (no warm-up: the replay runs one unmeasured pass of the whole plan first)."""
    return [f"workload.batch={batch}", f"workload.max_tokens={steps}", "workload.warmup_tokens=0"]


def check_batch_sets(sets: list[str]) -> None:
    for item in sets:
        key = item.partition("=")[0].strip()
        if key in BATCH_KEYS:
            raise InputError(f"--set {key}: not with --batch (--batch B sets workload.batch, --steps N "
                             "workload.max_tokens, and every step is measured: workload.warmup_tokens 0)")


def batch_contexts(config: str, overrides: list[str], contexts: list[int] | None) -> list[int]:
    """--contexts, else the config's own workload.context_length."""
    return contexts or [load_config(config, overrides).hw.workload.context_length]


def batch_plans(config: str, contexts: list[int], policies: list[str] | None, jobs: int, overrides: list[str]):
    """(each context's Prepared, {(context, policy label): Plan}), built in parallel processes; every case is
    prepared first, so a bad policy or a trace too short is refused before any plan runs."""
    replayable_prefill_model(load_config(config, overrides).hw, "batch")  # no kernels for MLA, Mamba, 4-bit
    preps = {c: prepare(config, [*overrides, f"workload.context_length={c}"], policies or ()) for c in contexts}
    work = [(config, [*overrides, f"workload.context_length={c}"], p.label) for c in contexts for p in preps[c].policies]
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work)))) as pool:
        plans = list(pool.map(_plan_job, work))
    return preps, {(int(w[1][-1].split("=")[1]), w[2]): p for w, p in zip(work, plans)}


def _case_line(ctx: int, label: str, plan, res: dict) -> str:
    """One replayed case in words: mean step latency measured (each replay) and simulated, copies, energy."""
    runs = [res["latency_ms"], *res["repeat_latency_ms"]]
    energies = [e for e in [res["energy"], *res["repeat_energy"]] if e]
    steps = len(res["latency_ms"])
    return (f"  ctx {ctx} {label:12} measured {statistics.fmean(runs[0]):9.3f} ms/step"
            + "".join(f", again {statistics.fmean(r):.3f}" for r in runs[1:])
            + f", simulated {statistics.fmean(plan.sim_latency_ms):9.3f}; copies {res['copies']} "
            f"({res['copied_bytes'] / 1e9:.2f} GB, plan {plan.fetch_bytes / 1e9:.2f})"
            + "".join(f", board {e['energy_j'] * 1e3 / steps:.1f} mJ/step at {e['power_w']:.0f} W" for e in energies)
            + f", {res['launches_per_token']:.0f} launches/step")


def replay_batch_config(config: str, contexts: list[int] | None, batch: int, steps: int, policies: list[str] | None,
                        jobs: int, log=print, device: str = "cuda", graphs: bool = False, overrides=(),
                        gemv: str = "cublas", repeats: int = 1, energy_settle_s: float = 0.5) -> dict:
    """Every (context, policy) of a config's batch replayed (module docstring); the measurement file's content."""
    import torch

    from chipsim.hwreplay.batch_harness import GpuBatch, expert_tokens_of
    from chipsim.hwreplay.nvml import open_gpu

    t0 = time.perf_counter()
    overrides = [*overrides, *batch_overrides(batch, steps)]
    contexts = batch_contexts(config, overrides, contexts)
    preps, plans = batch_plans(config, contexts, policies, jobs, overrides)
    base = preps[contexts[0]]
    m, expert_bytes = base.workload.model, base.workload.expert_bytes
    log(f"{config}: {len(plans)} batch plans ({batch} sequences, {steps} steps) built in {time.perf_counter() - t0:.1f} s")
    device = torch.device(device)
    gpu = open_gpu(device.index or 0) if device.type == "cuda" else None
    t1 = time.perf_counter()
    host = experts_in_host((m.num_moe_layers, m.num_experts, expert_bytes), device)
    slots = _slots_used(plans.values())
    gpu_slots = expert_slots(slots, expert_bytes, device)
    log(f"  {host.numel() / 2**30:.2f} GiB of experts in host memory, {slots} GPU slots, in {time.perf_counter() - t1:.1f} s")
    cases = []
    kw = dict(graphs=graphs, gpu=gpu, energy_settle_s=energy_settle_s)
    for ctx in contexts:
        mine = {label: plan for (c, label), plan in plans.items() if c == ctx}
        step = GpuBatch(preps[ctx].config.hw, expert_tokens_of(mine.values()), device, gemv=gemv)
        if step.expert_bytes != expert_bytes:
            raise RuntimeError(f"expert primitives read {step.expert_bytes} bytes, the expert has {expert_bytes}")
        for label, plan in mine.items():
            res = replay_repeated(plan, step, host, gpu_slots, m.first_dense_layers, repeats, kw)
            log(_case_line(ctx, label, plan, res))
            cases.append({"context_length": ctx, "policy": label, "plan": plan.to_json(),
                          "kernels_per_group": step.kernels_per_group, **res})
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"config": config, "overrides": overrides, "model": m.name, "trace": os.path.basename(base.config.trace_path),
            "host_experts": "normal-bf16" if device.type == "cuda" else "zeros (cpu dry run: one expert stands for all)",
            "batch": batch, "steps": steps, "contexts": contexts, "warmup_replays": 1, "energy_settle_s": energy_settle_s,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
            "torch": torch.__version__, "cases": cases, "seconds": round(time.perf_counter() - t0, 1)}
