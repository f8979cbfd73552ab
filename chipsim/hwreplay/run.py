"""Replay each policy of a config on the GPU, for each context length; write one measurement JSON per config.

    chipsim hwreplay hwconfigs/h200-pcie5.yaml --contexts 512,2048 --out validation/
    (= python -m chipsim.hwreplay.run ...)

For every (context, policy): the plan (the simulator's decisions, chipsim.hwreplay.plan) is built on the
CPU, then replayed on the GPU (chipsim.hwreplay.harness) once; the JSON keeps the plan's digest, fetch
count and bytes, the copies the GPU made, every token's measured latency and the host's enqueue time.

    chipsim hwreplay hwconfigs/h200-pcie5-phi-mini-moe.yaml --prompts 256,4096 --policy on-demand --graphs --out DIR

With --prompts, each case is a request's prefill instead (workload.prompt_tokens = N, workload.output_tokens = 2;
--policy names prefill policies, default the config's run.prefill_policy): its chunks replayed by
chipsim.hwreplay.prefill_harness once as a warm-up, then --repeats times measured, and the replay stops at the
first output token. The JSON keeps each chunk's measured latency (their sum: TTFT) and the board's energy over each
measured replay.

    chipsim hwreplay hwconfigs/h200-pcie5.yaml --batch 4 --steps 16 --policy no-prefetch --graphs --out DIR

With --batch, each case (context, policy) is a batch's decode steps instead: the config with workload.batch = B,
workload.max_tokens = N (each sequence's decode steps, --steps; default 16) and workload.warmup_tokens = 0, at
workload.context_length = the context (--contexts; default the config's own). Its plan (chipsim.hwreplay.plan: the
simulator's decisions, each step's experts over the step's tokens routed to them) is built on the CPU, then replayed
by chipsim.hwreplay.batch_harness once unmeasured and --repeats times measured, the board's energy read around each.
The JSON keeps each step's measured latency and the plan's digest and bytes; `chipsim hwcompare --batch-regime NAME
PATH` sets them beside the simulator's.

    chipsim hwreplay hwconfigs/h200-pcie5.yaml --served --set workload.requests=10 ... --graphs --out DIR

With --served, each policy's served run (chipsim.hwreplay.run_served) is replayed step by step instead.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from chipsim.errors import InputError, OneLineParser, run_module_main, torch_device
from chipsim.files import check_output_dir, write_atomic
from chipsim.hw.config import load_config
from chipsim.hwreplay.ops import GEMV_KERNELS, primitive_ops
from chipsim.hwreplay.replay_setup import (_host_and_slots, _plan_job, expert_slots, experts_in_host,  # noqa: F401
                                          fill_normal_bf16, replay_repeated)
from chipsim.hwreplay.plan import build_plan
from chipsim.runner import prepare




def plans_for(config: str, contexts: list[int], policies: list[str] | None, jobs: int, overrides=()):
    """{(context, policy label): Plan}, built in parallel processes."""
    base = prepare(config, list(overrides), policies or ())
    if base.request is not None:
        raise InputError(f"{config}: workload.prompt_tokens: --contexts replays decode steps at a fixed context; "
                         "replay a request's prefill with --prompts")
    if base.batch is not None:
        raise InputError(f"{config}: workload.batch {base.batch.batch}: --contexts replays one sequence's decode steps; "
                         f"replay a batch with --batch {base.batch.batch}")
    specs = [p.label for p in base.policies]
    work = [(config, [*overrides, f"workload.context_length={c}"], s) for c in contexts for s in specs]
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work)))) as pool:
        plans = list(pool.map(_plan_job, work))
    return base, {(w[1][-1].split("=")[1], w[2]): p for w, p in zip(work, plans)}






def plan_host_us(prep) -> float:
    """One host-CPU expert's compute time as the config prices it (µs)."""
    from chipsim.workload.host import host_timing

    return host_timing(prep.config.hw, prep.workload).compute_ps / 1e6


def _host_threads(hw, plans, config: str) -> int:
    """Where a plan runs experts on the host CPU: the threads PyTorch computes them on, the config's host_cpu.cores
    (no more than this machine has: a dry run on a smaller one), set now; else 0, nothing set."""
    import torch

    if not any(p.host_experts for p in plans):
        return 0
    if hw.model.expert_bits != 16:
        raise InputError(f"{config}: model.expert_bits {hw.model.expert_bits}: the replay's host-CPU experts are BF16 "
                         "(no CPU kernel of another format is measured)")
    threads = min(hw.host_cpu.cores, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    return threads


def _replayed_frontend(hw, config: str, enqueue_with: str, stalls: bool) -> tuple[bool, bool]:
    """The software the plan was simulated for, as the replay's host runs it (host_frontend): (experts in pinned
    memory, a read-back at every routing point); what the replay cannot run so is refused in one line."""
    frontend = hw.host_frontend
    pinned, host_routing = frontend.expert_memory == "pinned", frontend.routing == "host"
    if host_routing and enqueue_with != "torch":
        raise InputError(f"{config}: host_frontend.routing: host: the host's read-back is a PyTorch call; replay it "
                         "with --enqueue torch")
    if stalls and (host_routing or not pinned):
        raise InputError(f"{config}: --stalls times the waits for copies alone; the simulator's stall with "
                         "host_frontend also holds the read-backs and the host held in pageable copies")
    return pinned, host_routing


def _memory_word(pinned: bool, device) -> str:
    """How the log names the experts' host memory ("pinned ", "pageable "; nothing on a CPU dry run)."""
    return ("pinned " if pinned else "pageable ") if device.type == "cuda" else ""


def _host_alone_text(res: dict) -> str:
    """The log's host-alone part: the host's median time per token enqueueing on an idle GPU, and ahead of it."""
    idle, ahead = res.get("host_dispatch_ms"), res.get("host_dispatch_ahead_ms")
    return ((f", host alone {statistics.median(idle):.2f} ms/token" if idle else "")
            + (f" ({statistics.median(ahead):.2f} ahead of the GPU)" if ahead else ""))


def _replay_line(ctx: int, label: str, res: dict, plan, prep, warm: int) -> str:
    """A decode replay's log line: measured against simulated, and what else the replay recorded."""
    lat = res["latency_ms"][warm:]
    mean = sum(lat) / len(lat)
    sim = plan.sim_latency_ms[warm:]
    return (f"  ctx {ctx} {label:12} measured {mean:8.3f} ms/token, simulated {sum(sim) / len(sim):8.3f}, "
            f"copies {res['copies']}, host enqueue {sum(res['host_enqueue_ms'][warm:]) / len(lat):.2f} ms/token"
            + "".join(f", again {sum(r[warm:]) / len(lat):.3f}" for r in res["repeat_latency_ms"])
            + _host_alone_text(res)
            + "".join(f", board {e['energy_j'] * 1e3 / len(res['latency_ms']):.1f} mJ/token at {e['power_w']:.0f} W"
                      for e in [res["energy"], *res["repeat_energy"]] if e)
            + f", {res['launches_per_token']:.0f} launches/token"
            + (f", host CPU {res['host_experts'] / len(res['latency_ms']):.1f} experts/token at "
               f"{res['host_compute_us_median']:.1f} us (simulated {plan_host_us(prep):.1f})"
               if res.get("host_experts") else "")
            + (f", stall {sum(s[2] for s in res['stall_ms'] if s[0] >= warm) / len(lat):.3f} ms/token (simulated "
               f"{sum(map(sum, plan.sim_stall_ms[warm:])) / len(lat):.3f})" if "stall_ms" in res else ""))


def replay_config(config: str, contexts: list[int], policies: list[str] | None, jobs: int, log=print,
                  device: str = "cuda", graphs: bool = False, overrides=(), gemv: str = "cublas", repeats: int = 1,
                  dispatch_tokens: int = 0, segments: bool = False, stalls: bool = False,
                  energy_settle_s: float = 0.5, enqueue_with: str = "torch", warm_replay: bool = False,
                  op_spans: bool = False, activity: bool = False) -> dict:
    import torch

    from chipsim.hwreplay.activity import activity_text, traced_replay
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.nvml import open_gpu

    t0 = time.perf_counter()
    base, plans = plans_for(config, contexts, policies, jobs, overrides)
    hw = base.config.hw
    w = hw.model
    if w.expert_bits != 16 and (w.expert_bits in (4, 8), w.quant_scale_bits, w.quant_group_size % 2) != (True, 16, 0):
        raise InputError(f"{config}: the replay runs BF16 experts or 4- or 8-bit ones with BF16 scales over an even group "
                         f"(model.expert_bits {w.expert_bits}, quant_scale_bits {w.quant_scale_bits}, "
                         f"quant_group_size {w.quant_group_size})")
    if w.dense_bits != 16:
        raise InputError(f"{config}: model.dense_bits {w.dense_bits}: the replay runs BF16 non-expert weights (no "
                         "quantised attention, router, shared-expert or LM-head kernel)")
    m = base.workload.model
    log(f"{config}: {len(plans)} plans built in {time.perf_counter() - t0:.1f} s")
    host_threads = _host_threads(hw, plans.values(), config)
    device = torch.device(device)
    gpu = open_gpu(device.index or 0) if device.type == "cuda" else None  # the board's energy counter, where NVML is
    expert_bytes, t1 = base.workload.expert_bytes, time.perf_counter()
    pinned, host_routing = _replayed_frontend(hw, config, enqueue_with, stalls)
    host = experts_in_host((m.num_moe_layers, m.num_experts, expert_bytes), device, pinned)  # (a CPU dry run: zeros)
    slots = max(p.slots for p in plans.values())
    gpu_slots = expert_slots(slots, expert_bytes, device)
    log(f"  {_memory_word(pinned, device)}{host.numel() / 2**30:.2f} GiB of experts in host memory, {slots} GPU slots, in {time.perf_counter() - t1:.1f} s")
    cases = []
    for ctx in contexts:
        traced = []  # (case, plan, replay options) to replay once more under the activity record
        prep = prepare(config, [*overrides, f"workload.context_length={ctx}"], policies or ())
        groups = primitive_ops(prep.config.hw)
        step = GpuDecodeStep(groups, m.num_layers, m.first_dense_layers, device, gemv=gemv)
        if step.expert_bytes != expert_bytes:
            raise RuntimeError(f"expert primitives cover {step.expert_bytes} bytes, the expert has {expert_bytes}")
        for policy in prep.policies:
            plan = plans[(str(ctx), policy.label)]
            kw = dict(graphs=graphs, gpu=gpu, segments=segments, stalls=stalls, energy_settle_s=energy_settle_s,
                      enqueue_with=enqueue_with, host_routing=host_routing, op_spans=op_spans)
            if warm_replay:  # once unmeasured first, as the prefill, batch and served replays are
                replay(plan, step, host, gpu_slots, m.first_dense_layers, **{**kw, "gpu": None})
            res = replay(plan, step, host, gpu_slots, m.first_dense_layers, dispatch_tokens=dispatch_tokens, **kw)
            # further replays of the same plan: the run-to-run spread on one machine
            again = [replay(plan, step, host, gpu_slots, m.first_dense_layers, **kw) for _ in range(repeats - 1)]
            res["repeat_latency_ms"] = [r["latency_ms"] for r in again]
            res["repeat_energy"] = [r["energy"] for r in again]
            if stalls:
                res["repeat_stall_ms"] = [r["stall_ms"] for r in again]
            log(_replay_line(ctx, policy.label, res, plan, prep, hw.workload.warmup_tokens))
            cases.append({"context_length": ctx, "policy": policy.label, "plan": plan.to_json(),
                          **({"warm_replays": 1} if warm_replay else {}),
                          "kernels_per_group": step.kernels_per_group, **res})
            if activity:
                traced.append((cases[-1], plan, kw))
        for case, plan, kw in traced:  # after every measured replay (--activity: one context)
            case["activity"] = traced_replay(lambda: replay(plan, step, host, gpu_slots, m.first_dense_layers, **{
                **kw, "gpu": None, "stalls": False, "op_spans": False}), plan, case["copies"])
            log(f"  ctx {ctx} {case['policy']:12} traced{activity_text(case['activity'])}")
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"config": config, "overrides": list(overrides), "model": m.name, "trace": os.path.basename(base.config.trace_path),
            "host_experts": "normal-bf16",  # fill_normal_bf16: energy is measured over weights like real ones
            "warmup_tokens": hw.workload.warmup_tokens, "energy_settle_s": energy_settle_s, "tokens": hw.workload.max_tokens, "contexts": contexts,
            **({"host_threads": host_threads} if host_threads else {}),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)", "torch": torch.__version__, "cases": cases,
            "seconds": round(time.perf_counter() - t0, 1)}


PREFILL_OUTPUT_TOKENS = 2  # the fewest a request has: the replay stops at the first, which its prefill yields


def request_overrides(prompt: int) -> list[str]:
    """The config keys that make a config a request of `prompt` tokens whose prefill the replay runs."""
    return [f"workload.prompt_tokens={prompt}", f"workload.output_tokens={PREFILL_OUTPUT_TOKENS}"]


def request_spec(prefill_spec: str) -> str:
    """A prefill policy as a request's --policy spec (PREFILL+DECODE): the decode policy never runs in the replay,
    so it is the one that moves nothing of its own."""
    return prefill_spec if "+" in prefill_spec else f"{prefill_spec}+no-prefetch"


def _prefill_plan_job(args):
    config, overrides, spec = args
    prep = prepare(config, overrides, [spec])
    return build_plan(prep, prep.policies[0])


def prefill_plans(config: str, prompts: list[int], policies: list[str] | None, jobs: int, overrides=()):
    """(the first prompt's Prepared, {(prompt, prefill policy label): Plan}), built in parallel processes; every
    case is prepared first here, so a bad policy or prompt is refused before any plan runs."""
    from chipsim.hwreplay.ops import replayable_prefill_model

    hw = load_config(config, list(overrides)).hw
    replayable_prefill_model(hw)  # an attention the replay has no kernel for is refused before any plan runs
    specs = [request_spec(s) for s in (policies or [hw.run.prefill_policy])]
    preps = [prepare(config, [*overrides, *request_overrides(prompt)], specs) for prompt in prompts]
    work = [(config, [*overrides, *request_overrides(prompt)], spec) for prompt in prompts for spec in specs]
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work)))) as pool:
        plans = list(pool.map(_prefill_plan_job, work))
    return preps[0], {(p.prompt_tokens, p.policy): p for p in plans}










def _replay_prefill_case(plan, step, host, gpu_slots, first_dense: int, repeats: int, kw: dict) -> dict:
    """One prefill plan replayed as replay_repeated does, with its TTFT (the sum of its chunks)."""
    res = replay_repeated(plan, step, host, gpu_slots, first_dense, repeats, kw)
    res["ttft_ms"] = round(sum(res["latency_ms"]), 5)
    return res


def replay_prefill_config(config: str, prompts: list[int], policies: list[str] | None, jobs: int, log=print,
                          device: str = "cuda", graphs: bool = False, overrides=(), gemv: str = "cublas",
                          repeats: int = 1, energy_settle_s: float = 0.5) -> dict:
    """Every (prompt, prefill policy) of a config replayed (module docstring); the measurement file's content."""
    import torch

    from chipsim.hwreplay.nvml import open_gpu
    from chipsim.hwreplay.prefill_harness import GpuPrefill

    t0 = time.perf_counter()
    base, plans = prefill_plans(config, prompts, policies, jobs, overrides)
    m = base.workload.model
    log(f"{config}: {len(plans)} prefill plans built in {time.perf_counter() - t0:.1f} s")
    device = torch.device(device)
    gpu = open_gpu(device.index or 0) if device.type == "cuda" else None
    expert_bytes = base.workload.expert_bytes
    host, gpu_slots = _host_and_slots(m, expert_bytes, plans.values(), device, log)
    cases = []
    for prompt in prompts:
        hw = load_config(config, [*overrides, *request_overrides(prompt)]).hw
        mine = {label: plan for (p, label), plan in plans.items() if p == prompt}
        first = next(iter(mine.values()))
        tokens = {n for plan in mine.values() for a in plan.actions if a[0] == "compute" for n in a[4]}
        step = GpuPrefill(hw, first.chunk_tokens, prompt, tokens, device, gemv=gemv)
        if step.expert_bytes > expert_bytes:
            raise RuntimeError(f"expert primitives read {step.expert_bytes} bytes, the expert has {expert_bytes}")
        kw = dict(graphs=graphs, gpu=gpu, energy_settle_s=energy_settle_s)
        for label, plan in mine.items():
            res = _replay_prefill_case(plan, step, host, gpu_slots, m.first_dense_layers, repeats, kw)
            energies = [e for e in [res["energy"], *res["repeat_energy"]] if e]
            log(f"  prompt {prompt} {label:14} TTFT measured {res['ttft_ms']:9.3f} ms"
                + "".join(f", again {sum(r):.3f}" for r in res["repeat_latency_ms"])
                + f", simulated {plan.sim_ttft_ms:9.3f}; copies {res['copies']} ({res['copied_bytes'] / 1e9:.2f} GB)"
                + "".join(f", board {e['energy_j']:.2f} J at {e['power_w']:.0f} W" for e in energies)
                + f", {res['launches_per_token']:.0f} launches/chunk")
            cases.append({"prompt_tokens": prompt, "policy": label, "plan": plan.to_json(),
                          "kernels_per_group": step.kernels_per_group, **res})
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"config": config, "overrides": list(overrides), "model": m.name, "trace": os.path.basename(base.config.trace_path),
            "host_experts": "normal-bf16" if device.type == "cuda" else "zeros (cpu dry run: one expert stands for all)",
            "prefill": True, "prompts": prompts, "output_tokens": PREFILL_OUTPUT_TOKENS, "warmup_replays": 1,
            "energy_settle_s": energy_settle_s,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
            "torch": torch.__version__, "cases": cases, "seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------------------- a batch's decode steps (--batch)
BATCH_STEPS = 16  # --steps default: each sequence's decode steps
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
    from chipsim.hwreplay.ops import replayable_prefill_model

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
    host, gpu_slots = _host_and_slots(m, expert_bytes, plans.values(), device, log)
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


def replay_overrides(sets: list[str], segments: bool) -> list[str]:
    """The config overrides a replay runs with: the user's, and with segment graphs one launch per segment, not
    per op group (compute.launch_per=segment; the user's own setting of that key wins)."""
    if segments and not any(s.startswith("compute.launch_per=") for s in sets):
        return [*sets, "compute.launch_per=segment"]
    return list(sets)


def _contexts(text: str, option: str = "--contexts") -> list[int]:
    """--contexts "512,2048" -> [512, 2048]: whole numbers >= 1, each once (also --prompts')."""
    try:
        contexts = [int(x) for x in text.split(",")]
    except ValueError:
        contexts = []
    if not contexts or min(contexts) < 1 or len(set(contexts)) < len(contexts):
        raise InputError(f"{option} {text!r}: expected distinct whole numbers >= 1 separated by commas, e.g. 512,2048")
    return contexts


def _check_prefill_options(a) -> None:
    """--prompts replays prefill chunks: the decode replay's options that have no meaning there are refused."""
    for given, option in ((a.contexts is not None, "--contexts"), (a.segments, "--segments"), (a.stalls, "--stalls"),
                          (a.op_spans, "--op-spans"),
                          (a.dispatch_tokens, "--dispatch-tokens"), (a.enqueue != "torch", "--enqueue")):
        if given:
            raise InputError(f"{option}: not with --prompts (a request's prefill is replayed chunk by chunk, each op "
                             "group one launch; " + ("decode contexts are --contexts'" if option == "--contexts"
                                                     else "this option is the decode replay's") + ")")


def _check_batch_options(a) -> None:
    """--batch replays a batch's decode steps: --prompts, and the decode replay's options it does not carry, are
    refused; --steps needs --batch."""
    if a.batch is None:
        if a.steps is not None:
            raise InputError("--steps: goes with --batch (each sequence's decode steps)")
        return
    if a.batch < 2:
        raise InputError(f"--batch {a.batch}: expected a whole number >= 2 (one sequence: leave --batch out)")
    if a.steps is not None and a.steps < 1:
        raise InputError(f"--steps {a.steps}: expected a whole number >= 1")
    for given, option in ((a.prompts is not None, "--prompts"), (a.segments, "--segments"), (a.stalls, "--stalls"),
                          (a.op_spans, "--op-spans"),
                          (a.dispatch_tokens, "--dispatch-tokens"), (a.enqueue != "torch", "--enqueue")):
        if given:
            raise InputError(f"{option}: not with --batch (a batch's steps are replayed op group by op group; "
                             + ("a request's prefill is another replay)" if option == "--prompts"
                                else "this option is the one-sequence decode replay's)"))
    check_batch_sets(a.set)


def _check_served_options(a) -> None:
    """--served replays a served run's steps: the other replays' options are refused."""
    if not a.served:
        return
    for given, option in ((a.prompts is not None, "--prompts"), (a.batch is not None, "--batch"),
                          (a.contexts is not None, "--contexts"), (a.segments, "--segments"), (a.stalls, "--stalls"),
                          (a.op_spans, "--op-spans"),
                          (a.dispatch_tokens, "--dispatch-tokens"), (a.enqueue != "torch", "--enqueue")):
        if given:
            raise InputError(f"{option}: not with --served (a served run's steps, their prompts, batches and "
                             "contexts are the config's workload.requests and scheduler's)")


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="chipsim hwreplay", description="replay policies' decisions on the GPU and measure "
                       "per-token latency (needs torch with CUDA)")
    ap.add_argument("configs", nargs="+", metavar="CONFIG", help="hardware configs of the machine, one per model shape")
    ap.add_argument("--contexts", default=None, metavar="N,N", help="KV-cache lengths to replay (default 512,2048)")
    ap.add_argument("--prompts", default=None, metavar="N,N",
                    help="replay a request's prefill instead, for each of these prompt lengths (workload.prompt_tokens; "
                         "--policy then names prefill policies, default run.prefill_policy); the replay stops at the "
                         "first output token: TTFT and the board's energy")
    ap.add_argument("--batch", type=int, default=None, metavar="B",
                    help="replay a batch's decode steps instead: B sequences decoded together (workload.batch), each "
                         "step one token of every sequence, at the config's context (or --contexts); per-step latency "
                         "and the board's energy")
    ap.add_argument("--steps", type=int, default=None, metavar="N",
                    help="with --batch: each sequence's decode steps, all measured (workload.max_tokens; default 16)")
    ap.add_argument("--served", action="store_true",
                    help="replay the config's served run instead (workload.requests, workload.arrivals, "
                         "workload.scheduler; --set them): every step as the simulator ran it, the simulated gaps "
                         "between steps slept on the GPU; per-step latency and the board's energy")
    ap.add_argument("--policy", action="append", default=None, metavar="SPEC",
                    help="policy to replay (repeatable; default: each config's run.policies)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (repeatable), e.g. workload.max_tokens=4 and workload.warmup_tokens=1 "
                         "for a dry run (the GPU configs warm up 16 tokens)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                    help="processes building the plans (default: cores)")
    ap.add_argument("--out", required=True, help="folder: one <config name>.json per config")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of the same code (timings meaningless)")
    ap.add_argument("--graphs", action="store_true",
                    help="launch each compute segment as a captured CUDA graph (host dispatch out of the measurement); "
                         "pair with a config written by gpuconfig --kernel-launch graph")
    ap.add_argument("--segments", action="store_true",
                    help="with --graphs: one CUDA graph per run of compute between synchronisations with the copy "
                         "stream, not one per op group (where nearly every expert is cached, the host's launches "
                         "would otherwise pace the GPU); the config then charges one launch per segment "
                         "(compute.launch_per=segment, recorded with the other overrides)")
    ap.add_argument("--stalls", action="store_true",
                    help="time each MoE layer's wait for its copies (CUDA events around every wait): per-layer stalls")
    ap.add_argument("--op-spans", action="store_true",
                    help="time every compute step on the GPU (CUDA events around each): per token, the time inside "
                         "compute and between it")
    ap.add_argument("--gemv", default="cublas", choices=GEMV_KERNELS,
                    help="the GEMV kernels: cublas (torch.mv / torch.mm) or triton (chipsim/hwreplay/triton_kernels.py, "
                         "the structure hwconfigs/h200-cycle-level.yaml describes; needs Triton)")
    ap.add_argument("--repeats", type=int, default=1, metavar="N", help="replays of each plan (default 1)")
    ap.add_argument("--warm-replay", action="store_true",
                    help="decode steps: replay each plan once unmeasured before the measured replays (the prefill, "
                         "batch and served replays always do): a first pass over freshly pinned experts by a host "
                         "CPU computing them ran slower")
    ap.add_argument("--dispatch-tokens", type=int, default=0, metavar="N",
                    help="after each replay, time the host enqueueing N tokens one at a time on an idle GPU")
    ap.add_argument("--energy-settle", type=float, default=0.5, metavar="S",
                    help="seconds of idle on each side of a replay's energy window (chipsim.hwreplay.nvml.Meter; "
                         "longer than the NVML counter's delay, validation/energy/probe_counter.py; default 0.5)")
    ap.add_argument("--enqueue", default="torch", choices=("torch", "cudart"),
                    help="how the host issues the replay: torch (Tensor.copy_, CUDAGraph.replay) or cudart (the same "
                         "steps as raw CUDA runtime calls, chipsim/hwreplay/cudart.py: a few microseconds per copy; "
                         "needs --graphs)")
    ap.add_argument("--activity", action="store_true",
                    help="decode steps, one context: after every measured replay, replay each plan once more under "
                         "the GPU's own activity record (CUPTI through torch.profiler: every kernel's and copy's start "
                         "and end, no event on any stream, without --stalls' or --op-spans' events) and keep its "
                         "summary (chipsim.hwreplay.activity; read with python -m chipsim.hwreplay.compare_activity)")
    return ap


def _say(line: str) -> None:
    print(line, flush=True)


def _checked_options(a) -> tuple[list[int], list[int] | None, list[str]]:
    """(contexts, prompts or None, each config's output file name) from the parsed options; bad input refused in one
    line before any work."""
    _check_served_options(a)
    _check_batch_options(a)
    prompts = _contexts(a.prompts, "--prompts") if a.prompts is not None else None
    if prompts:
        _check_prefill_options(a)
    contexts = _contexts(a.contexts or "512,2048")
    if a.jobs < 1:
        raise InputError(f"--jobs {a.jobs}: expected a whole number >= 1")
    if a.repeats < 1:
        raise InputError(f"--repeats {a.repeats}: expected a whole number >= 1")
    if a.activity and (a.prompts is not None or a.batch is not None or a.served):
        raise InputError("--activity: for decode steps (not with --prompts, --batch or --served)")
    if a.activity and (len(contexts) > 1 or len(a.configs) > 1):  # the profiler stays attached once it has run
        raise InputError("--activity: one config and one context at a time (a replay measured after a traced one "
                         "would be measured with the profiler attached)")
    if a.warm_replay and (a.prompts is not None or a.batch is not None or a.served):
        raise InputError("--warm-replay: for decode steps (the prefill, batch and served replays always replay once "
                         "unmeasured first)")
    if a.segments and not a.graphs:
        raise InputError("--segments: needs --graphs (it captures runs of op groups as CUDA graphs)")
    if not 0 < a.energy_settle <= 10:
        raise InputError(f"--energy-settle {a.energy_settle}: expected seconds in (0, 10]")
    if a.enqueue == "cudart" and not (a.graphs and a.device.startswith("cuda")):
        raise InputError("--enqueue cudart: needs --graphs on a CUDA device (it launches captured graphs)")
    if a.dispatch_tokens < 0:
        raise InputError(f"--dispatch-tokens {a.dispatch_tokens}: expected a whole number >= 0")
    for config in a.configs:
        if not os.path.isfile(config):
            raise InputError(f"config {config}: file not found")
    names = [f"{os.path.splitext(os.path.basename(c))[0]}.json" for c in a.configs]
    if len(set(names)) < len(names):
        raise InputError(f"--out {a.out}: two configs would write the same {sorted(n for n in names if names.count(n) > 1)[0]}")
    check_output_dir(a.out, names, "--out")  # before hours of replay, not after
    return contexts, prompts, names


def main(argv=None) -> int:
    a = _parser().parse_args(argv)  # before torch: --help and bad options need no GPU
    contexts, prompts, names = _checked_options(a)
    try:
        import torch
    except ImportError:
        raise InputError("chipsim hwreplay needs torch with CUDA (pip install torch on the GPU machine)") from None
    torch_device(torch, a.device)  # a name torch knows, and a GPU where it names one: before --out is made
    if not prompts and a.batch is None and not a.served:
        os.makedirs(a.out, exist_ok=True)
    for config, name in zip(a.configs, names):
        if a.served:
            from chipsim.hwreplay.run_served import replay_served_config

            res = replay_served_config(config, a.policy, a.jobs, log=_say, device=a.device, graphs=a.graphs,
                                       overrides=list(a.set), gemv=a.gemv, repeats=a.repeats,
                                       energy_settle_s=a.energy_settle)
            os.makedirs(a.out, exist_ok=True)
        elif prompts:  # (--out is made once there is something to write: bad input leaves nothing behind)
            res = replay_prefill_config(config, prompts, a.policy, a.jobs, log=_say, device=a.device, graphs=a.graphs,
                                        overrides=list(a.set), gemv=a.gemv, repeats=a.repeats,
                                        energy_settle_s=a.energy_settle)
            os.makedirs(a.out, exist_ok=True)
        elif a.batch is not None:
            res = replay_batch_config(config, contexts if a.contexts else None, a.batch, a.steps or BATCH_STEPS,
                                      a.policy, a.jobs, log=_say, device=a.device, graphs=a.graphs,
                                      overrides=list(a.set), gemv=a.gemv, repeats=a.repeats,
                                      energy_settle_s=a.energy_settle)
            os.makedirs(a.out, exist_ok=True)
        else:
            res = replay_config(config, contexts, a.policy, a.jobs, log=_say, device=a.device, graphs=a.graphs,
                                overrides=replay_overrides(a.set, a.segments), gemv=a.gemv, repeats=a.repeats,
                                dispatch_tokens=a.dispatch_tokens, segments=a.segments, stalls=a.stalls,
                                energy_settle_s=a.energy_settle, enqueue_with=a.enqueue, warm_replay=a.warm_replay,
                                op_spans=a.op_spans, activity=a.activity)
        path = os.path.join(a.out, name)
        write_atomic(path, json.dumps(res, indent=1, sort_keys=True), what="--out")
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    run_module_main(main)
