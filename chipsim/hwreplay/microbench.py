"""Single-op and single-copy microbenchmarks of a CUDA machine, the only source of h200-pcie5.yaml's timing.

    python -m chipsim.hwreplay.microbench --out validation/h200-microbench.json

Measures (CUDA events, medians):
- host-to-device copies from pinned memory, one at a time and 16 back to back on one stream, 64 KiB … 64 MiB
  (fits t = a + N/B: B the link's usable bandwidth, a the fixed cost per copy); pageable for reference;
- GEMV time against weight size, 1 … 256 MiB, each call on a different weight so L2 never holds one
  (fit t = a + bytes/B: B the HBM read bandwidth a GEMV reaches, a its fixed cost);
- tiny kernels: GPU time per kernel when the host is far ahead (queued behind a sleep kernel), the
  steady rate of an eager chain of them (host dispatch included), the per-kernel time inside a CUDA graph
  and the GPU-side cost of launching one graph;
- every kernel shape of the decode steps of the given configs (--shapes-from, at --contexts): each one
  timed alone, as a chain of the same kernel over weights that rotate through more than the L2 cache,
  launched eagerly behind a sleep (GPU time only) and captured in one CUDA graph; the rows are the
  compute.op_times_ns table of gpuconfig (the simulator's profiled-operator mode);
- every kernel shape of the prefill chunks of requests of the given prompt lengths (--prompts, with --gemv): each
  GEMM (a chunk's projections and router over its tokens, each routed expert over the tokens the config's trace
  routes to it), the chunk's attention kernel, its elementwise work, each timed alone in one CUDA graph as a
  chain of about 1 ms (`prefill_op_times`);
- every kernel shape of the steps of a served run (--served, with --gemv and the run's keys in --set): each policy's
  steps as its run schedules them, timed as the prefill shapes are;
- every kernel shape of a batch's decode steps (--batch B, with --gemv): the GEMMs of B rows (projections, router,
  LM head), each sequence's attention matvecs over its own cache, each routed expert's GEMMs over the step's tokens
  the config's trace routes to it, the elementwise work over B tokens, timed as the prefill shapes are;
- machine facts: GPU name, SM count, clocks, host CPU and memory.
Nothing here is fitted to an end-to-end run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from chipsim.errors import InputError, OneLineParser, run_module_main
from chipsim.files import check_output_dir, check_output_file, write_atomic
from chipsim.hwreplay.fits import fit_intercept_and_rate
from chipsim.hwreplay.harness import capture_graph, kernel_call, weight_bytes, weight_views
from chipsim.hwreplay.ops import GEMV_KERNELS

KIB, MIB = 1 << 10, 1 << 20


def _time_us(fn, reps: int, stream) -> float:
    """GPU time of fn's work, queued behind a sleep kernel so the host is ahead (no dispatch time counted)."""
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(5e7))  # ~25 ms of spinning: time for the host to enqueue fn's work
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def _graph_us(graph, per: int, reps: int = 5) -> float:
    """Median GPU time of one replay of `graph` (CUDA events around it), divided by the `per` kernels in it."""
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / per)
    return statistics.median(ts)


def copy_sweep(device, pinned: bool, back_to_back: int, sizes, reps: int = 15) -> list[dict]:
    stream = torch.cuda.Stream()
    out = []
    for n in sizes:
        src = torch.empty(n * back_to_back, dtype=torch.uint8, pin_memory=pinned)
        dst = torch.empty(n * back_to_back, dtype=torch.uint8, device=device)

        def run():
            with torch.cuda.stream(stream):
                for i in range(back_to_back):
                    dst[i * n:(i + 1) * n].copy_(src[i * n:(i + 1) * n], non_blocking=True)
        run()
        us = _time_us(run, reps, stream) / back_to_back
        out.append({"bytes": n, "us_per_copy": round(us, 3), "gbps": round(n / us / 1e3, 3)})
        del src, dst
    return out


def gemv_sweep(device, sizes_mib, reps: int = 9) -> list[dict]:
    stream = torch.cuda.Stream()
    out = []
    cols = 2048
    for mib in sizes_mib:
        rows = max(1, mib * MIB // (2 * cols))
        count = max(2, (512 * MIB) // (rows * cols * 2))  # rotate through >= 512 MiB: L2 (~50 MB) never helps
        ws = [torch.empty(rows, cols, dtype=torch.bfloat16, device=device).normal_() for _ in range(count)]
        x = torch.randn(cols, dtype=torch.bfloat16, device=device)
        y = torch.empty(rows, dtype=torch.bfloat16, device=device)

        def run():
            with torch.cuda.stream(stream):
                for w in ws:
                    torch.mv(w, x, out=y)
        run()
        us = _time_us(run, reps, stream) / count
        out.append({"weight_bytes": rows * cols * 2, "us": round(us, 3), "gbps": round(rows * cols * 2 / us / 1e3, 2)})
        del ws
    return out


def tiny_kernels(device, n: int = 4000, queued: int = 500) -> dict:
    """GPU time per tiny kernel (`queued` of them behind a sleep: fewer than CUDA's pending-launch limit of
    ~1,000, else the host blocks and its dispatch rate leaks into the figure) and the eager chain rate."""
    stream = torch.cuda.Stream()
    a = torch.randn(64, device=device)
    b = torch.randn(64, device=device)
    c = torch.empty(64, device=device)
    with torch.cuda.stream(stream):
        for _ in range(100):
            torch.add(a, b, out=c)
    torch.cuda.synchronize()
    # GPU-side: queue the chain behind a long sleep so the host is far ahead when the GPU reaches it
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(2e8))  # ~0.1 s of spinning at ~2 GHz
        e0.record(stream)
        for _ in range(queued):
            torch.add(a, b, out=c)
        e1.record(stream)
    e1.synchronize()
    gpu_us = e0.elapsed_time(e1) * 1e3 / queued
    # eager chain, GPU caught up: the steady rate of host dispatch and GPU together
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        for _ in range(n):
            torch.add(a, b, out=c)
    stream.synchronize()
    chain_us = (time.perf_counter() - t0) * 1e6 / n
    # the same kernels captured in one CUDA graph: the per-kernel cost of a graph-launched segment
    try:
        graph_us = round(_graph_us(capture_graph([(torch.add, (a, b), {"out": c})] * queued), queued), 3)
    except RuntimeError as exc:  # recorded, not fatal: the eager figures stand on their own
        graph_us = f"failed: {exc}"
    return {"gpu_us_per_kernel": round(gpu_us, 3), "eager_chain_us_per_kernel": round(chain_us, 3), "kernels": n,
            "queued_kernels": queued, "graph_us_per_kernel": graph_us}


def graph_launch(device, replays: int = 200) -> dict:
    """GPU-side time per launch of a one-kernel CUDA graph, queued behind a sleep (host far ahead)."""
    stream = torch.cuda.Stream()
    a, b, c = (torch.randn(64, device=device) for _ in range(3))
    g = capture_graph([(torch.add, (a, b), {"out": c})])
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(5e7))
            e0.record(stream)
            for _ in range(replays):
                g.replay()
            e1.record(stream)
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / replays)
    return {"us_per_one_kernel_graph": round(statistics.median(ts), 3), "replays": replays}


def decode_shapes(configs: list[str], contexts: list[int], overrides=(), missing_from=()) -> list[tuple[object, list[str]]]:
    """Every distinct primitive (by op key) of the configs' decode steps at the contexts (with the config
    overrides, e.g. model.expert_bits=4), with its users; none whose key a `missing_from` config's
    compute.op_times_ns already has."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.ops import primitive_ops

    known = {k for path in missing_from for k in load_config(path, []).hw.compute.op_times_ns}
    found: dict[str, tuple[object, set]] = {}
    for path in configs:
        for ctx in contexts:
            hw = load_config(path, [*overrides, f"workload.context_length={ctx}"]).hw
            for prims in primitive_ops(hw).values():
                for p in prims:
                    if p.key not in known:
                        found.setdefault(p.key, (p, set()))[1].add(f"{p.name} ({hw.model.name})")
    return [(p, sorted(users)) for _, (p, users) in sorted(found.items())]


def prefill_shapes(configs: list[str], prompts: list[int], overrides=(), missing_from=()) -> list[tuple[object, list[str]]]:
    """Every distinct primitive (by op key) of the prefill chunks of each config's request of each prompt length
    (workload.prompt_tokens; chunks as the config's workload.prefill_chunk_tokens), its routed experts over the
    token counts its trace routes to them, with its users; none whose key a `missing_from` config's
    compute.op_times_ns already has. A fused primitive's key must not be a launching one's elsewhere (it would be
    timed at 0 there), unless it is the attention kernel's own key (the value mix, the scores' twin)."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.ops import prefill_chunk_ops, prefill_expert_ops
    from chipsim.hwreplay.run import request_overrides
    from chipsim.runner import prepare

    known = {k for path in missing_from for k in load_config(path, []).hw.compute.op_times_ns}
    found: dict[str, tuple[object, set]] = {}
    launched: set[str] = set()

    def add(p, user):
        if p.key in known:
            return
        if p.attention is not None or not p.fused:
            launched.add(p.key)
        held = found.get(p.key)
        if held is None or (held[0].fused and p.attention is not None):  # the attention kernel stands for its key
            found[p.key] = (p, held[1] if held else set())
        found[p.key][1].add(user)

    for path in configs:
        for prompt in prompts:
            prep = prepare(path, [*overrides, *request_overrides(prompt)], ())
            hw, routed, name = prep.config.hw, prep.trace["routed_ids"], prep.workload.model.name
            tokens = set()
            for chunk in prep.request.chunks:
                last = chunk.offset + chunk.tokens == prompt
                for prims in prefill_chunk_ops(hw, chunk.offset, chunk.tokens, last).values():
                    for p in prims:
                        add(p, f"{p.name} ({name}, prompt {prompt})")
                ids = routed[chunk.offset:chunk.offset + chunk.tokens]
                for layer in range(ids.shape[1]):
                    tokens.update(np.unique(ids[:, layer], return_counts=True)[1].tolist())
            for n in sorted(tokens):
                for p in prefill_expert_ops(hw, n):
                    add(p, f"{p.name} over {n} tokens ({name}, prompt {prompt})")
    clash = sorted(k for k, (p, _) in found.items() if p.fused and k in launched)
    if clash:
        raise RuntimeError(f"prefill shape {clash[0]} is fused into the attention kernel in one place and launches a "
                           "kernel of its own in another: one time cannot stand for both")
    return [(p, sorted(users)) for _, (p, users) in sorted(found.items())]


def batch_shapes(configs: list[str], batch: int, steps: int, contexts: list[int] | None, overrides=(),
                 missing_from=()) -> list[tuple[object, list[str]]]:
    """Every distinct primitive (by op key) of each config's batch decode step (B sequences, each at its context:
    `contexts`, else the config's workload.context_length), and of its routed experts over every count of a step's
    tokens its trace routes to one expert in `steps` steps, with its users; none whose key a `missing_from` config's
    compute.op_times_ns already has."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.ops import batch_step_ops, prefill_expert_ops
    from chipsim.hwreplay.run import batch_contexts, batch_overrides
    from chipsim.runner import prepare

    known = {k for path in missing_from for k in load_config(path, []).hw.compute.op_times_ns}
    found: dict[str, tuple[object, set]] = {}
    sets = [*overrides, *batch_overrides(batch, steps)]
    for path in configs:
        for ctx in batch_contexts(path, sets, contexts):
            prep = prepare(path, [*sets, f"workload.context_length={ctx}"], ())
            hw, name = prep.config.hw, prep.workload.model.name
            routed = prep.trace["routed_ids"][:steps * batch]  # step i's tokens: i*B .. i*B + B - 1
            tokens = {int(n) for i in range(steps) for layer in range(routed.shape[1])
                      for n in np.unique(routed[i * batch:(i + 1) * batch, layer], return_counts=True)[1]}
            users = [(p, f"{p.name} ({name}, batch {batch} at {ctx})") for ps in batch_step_ops(hw).values() for p in ps]
            users += [(p, f"{p.name} over {n} tokens ({name}, batch {batch})") for n in sorted(tokens)
                      for p in prefill_expert_ops(hw, n)]
            for p, user in users:
                if p.key not in known:
                    found.setdefault(p.key, (p, set()))[1].add(user)
    return [(p, sorted(users)) for _, (p, users) in sorted(found.items())]


def served_shapes(configs: list[str], policies: list[str] | None, overrides=(), missing_from=()
                  ) -> list[tuple[object, list[str]]]:
    """Every distinct primitive (by op key) of the steps each policy's served run of each config takes (the config's
    workload.requests with the overrides; each policy's steps are its own, as its timing schedules them), and of its
    routed experts over every count of a step's tokens routed to one, with its users; none whose key a
    `missing_from` config's compute.op_times_ns already has. The attention kernel stands for its key, as at prefill."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.ops import prefill_expert_ops, served_step_ops
    from chipsim.hwreplay.run_served import served_plans
    from chipsim.hwreplay.served_harness import step_parts

    known = {k for path in missing_from for k in load_config(path, []).hw.compute.op_times_ns}
    found: dict[str, tuple[object, set]] = {}
    for path in configs:
        prep, plans = served_plans(path, policies, 1, list(overrides))
        hw, name = prep.config.hw, prep.workload.model.name
        for label, plan in plans.items():
            shapes = sorted({tuple(ps) for ps in step_parts(plan)})
            users = [(p, f"{p.name} ({name}, served, {label})") for parts in shapes
                     for ps in served_step_ops(hw, list(parts)).values() for p in ps]
            tokens = {n for a in plan.actions if a[0] == "compute" for n in a[4]}
            users += [(p, f"{p.name} over {n} tokens ({name}, served)") for n in sorted(tokens)
                      for p in prefill_expert_ops(hw, n)]
            for p, user in users:
                if p.key in known:
                    continue
                held = found.get(p.key)
                if held is None or (held[0].fused and _launches_over(p, held[0])):
                    found[p.key] = (p, held[1] if held else set())
                found[p.key][1].add(user)
    return [(p, sorted(users)) for _, (p, users) in sorted(found.items())]


def _launches_over(p, held) -> bool:
    """Whether primitive `p` should stand for a key a fused primitive (`held`) holds: an attention kernel always; a
    kernel of its own over a softmax fused into a chunk's attention kernel, as the table is keyed by shape alone (a
    decode token's softmax over c keys has the shape of a chunk's over c query-key pairs): the launched one is timed,
    and the fused one is charged that time too (a few microseconds, where both meet in one run)."""
    return p.attention is not None or (not p.fused and held.attention is None)


def _in_attention(p) -> bool:
    """A prefill chunk's attention kernel or a primitive fused into it: its operands are the kernel's own."""
    from chipsim.hwreplay.ops import ATTENTION_FUSED

    return p.attention is not None or (p.fused and p.name in ATTENTION_FUSED)


def chain_buffers(shapes, device, pool_mib: int = 2048) -> tuple:
    """(weight pool, input vector, two scratch operands, output) wide enough for every shape's chain."""
    pool = torch.empty(pool_mib * MIB // 2, dtype=torch.bfloat16, device=device).normal_()
    shapes = [(p, u) for p, u in shapes if not _in_attention(p)]
    widest = max([p.reduction * p.groups * p.tokens for p, _ in shapes] + [1])
    longest = max([max(p.elements, p.outputs * p.tokens) for p, _ in shapes] + [1])
    x = torch.randn(widest, dtype=torch.bfloat16, device=device)
    sa = torch.randn(longest, dtype=torch.bfloat16, device=device)
    sb = torch.randn(longest, dtype=torch.bfloat16, device=device)
    return pool, x, sa, sb, torch.empty(longest + widest, dtype=torch.bfloat16, device=device)


def shape_chain(p, pool, x, sa, sb, out, max_chain: int = 400, gemv: str = "cublas") -> list:
    """A chain of primitive `p`'s kernel (chipsim.hwreplay.harness.kernel_call): a matvec over weights rotating
    through `pool` (each kernel reads its own, as each layer of a decode step does), other kernels repeated."""
    if p.kind in ("matvec", "matmul"):  # BF16, or packed 4-bit weights with their scales
        raw = pool.view(torch.uint8)
        n = weight_bytes(p) + weight_bytes(p) % 2  # each operand starts on a 2-byte boundary (BF16 views)
        count = max(1, min(max_chain, raw.numel() // n))  # (one when the pool holds the weight only once)
        return [kernel_call(p, weight_views(raw[i * n:], p), x, sa, sb, out, gemv) for i in range(count)]
    return [kernel_call(p, None, x, sa, sb, out)] * (max_chain // 2)


def op_times(device, shapes, pool_mib: int = 2048, max_chain: int = 400, reps: int = 5, gemv: str = "cublas") -> list[dict]:
    """Each shape timed alone: a chain of its kernel (chipsim.hwreplay.harness.kernel_call) over weights
    rotating through `pool_mib` (far beyond the 60 MB L2, as in the replay where every layer has its own
    weights), eagerly behind a sleep and inside one CUDA graph; µs per kernel. gemv "triton" times the
    matvecs with chipsim.hwreplay.triton_kernels and records each kernel's registers per thread."""
    stream = torch.cuda.Stream()
    pool, x, sa, sb, out = chain_buffers(shapes, device, pool_mib)
    rows_out = []
    for p, users in shapes:
        if p.fused:  # no kernel of its own: its time is inside the kernels it is fused into
            rows_out.append({"key": p.key, "users": users, "chain": 0, "eager_us": 0.0, "graph_us": 0.0,
                             "fused": "runs inside the 4- or 8-bit matvec kernels (triton_kernels.gemv_q4, gemv_q8)"})
            continue
        calls = shape_chain(p, pool, x, sa, sb, out, max_chain, gemv)
        count = len(calls)
        extra = {}
        if gemv == "triton" and p.kind == "matvec":
            from chipsim.hwreplay.triton_kernels import registers_per_thread

            extra["registers_per_thread"] = registers_per_thread(*calls[0][1])

        def run():
            with torch.cuda.stream(stream):
                for fn, args, kwargs in calls:
                    fn(*args, **kwargs)
        run()
        eager_us = _time_us(run, reps, stream) / count
        graph_us = _graph_us(capture_graph(calls), count, reps)
        rows_out.append({"key": p.key, "users": users, "chain": count, "eager_us": round(eager_us, 3),
                         "graph_us": round(graph_us, 3), **extra})
    del pool
    torch.cuda.empty_cache()
    return rows_out


def _chain_of(p, buffers, count: int, gemv: str) -> list:
    """`count` launches of a prefill primitive's kernel: a GEMM or matvec over weights rotating through the pool,
    the attention kernel over its own tensors, an elementwise kernel repeated."""
    from chipsim.hwreplay.prefill_harness import attention_call, attention_tensors

    if p.attention is not None:
        return [attention_call(*attention_tensors(p.attention, buffers[0].device))] * count
    if p.kind in ("matvec", "matmul"):
        return shape_chain(p, *buffers, max_chain=count, gemv=gemv)[:count]
    return [kernel_call(p, None, *buffers[1:])] * count


def _wall_us(calls: list, synchronize) -> float:
    """Wall time of one run of `calls`, synchronised before and after (µs)."""
    synchronize()
    t0 = time.perf_counter()
    for fn, args, kwargs in calls:
        fn(*args, **kwargs)
    synchronize()
    return (time.perf_counter() - t0) * 1e6


def prefill_op_times(device, shapes, pool_mib: int = 2048, chain_us: float = 1000.0, max_chain: int = 200,
                     reps: int = 3, gemv: str = "cublas", save=None, every: int = 200) -> list[dict]:
    """Each prefill shape timed alone (prefill_shapes): a chain of its kernel in one CUDA graph, µs per kernel
    (graph_us; the config's --kernel-launch graph field). The chain is about `chain_us` long, its length from
    three launches timed on the host first (a few for a large GEMM, up to `max_chain` for a small one). The
    attention kernel's key is also its value mix's (two matvecs of one shape in the simulator): each gets half the
    kernel's time (`kernel_us`); the softmax's primitives run inside it, at 0. On a CPU (--device cpu: a dry run of
    the same code) the chain's wall time stands for the graph's. `save(rows)` is called every `every` shapes (what
    a time limit leaves is kept)."""
    cuda = device.type == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    buffers = chain_buffers(shapes, device, pool_mib)
    rows = []
    for i, (p, users) in enumerate(shapes):
        if save is not None and i and i % every == 0:
            save(rows)
        if p.fused:
            rows.append({"key": p.key, "users": users, "chain": 0, "graph_us": 0.0,
                         "fused": "runs inside the attention kernel (scaled_dot_product_attention)"})
            continue
        probe = _chain_of(p, buffers, 3, gemv)
        _wall_us(probe, synchronize)  # cuBLAS's heuristics, the first launch
        count = max(3, min(max_chain, round(chain_us / (_wall_us(probe, synchronize) / 3))))
        calls = _chain_of(p, buffers, count, gemv)
        if cuda:
            us = _graph_us(capture_graph(calls), count, reps)
        else:
            us = statistics.median(_wall_us(calls, synchronize) for _ in range(reps)) / count
        row = {"key": p.key, "users": users, "chain": count, "graph_us": round(us, 3)}
        if p.attention is not None:  # the simulator charges this key twice per layer: scores and value mix
            row.update(graph_us=round(us / 2, 3), kernel_us=round(us, 3), kernel="scaled_dot_product_attention",
                       shared_by=["scores", "value_mix"])
        rows.append(row)
    del buffers
    if cuda:
        torch.cuda.empty_cache()
    return rows


def machine(device) -> dict:
    p = torch.cuda.get_device_properties(device)
    facts = {"gpu": p.name, "sm_count": p.multi_processor_count, "gpu_memory_gib": round(p.total_memory / 2**30, 1),
             "l2_cache_mib": round(getattr(p, "L2_cache_size", 0) / MIB, 1), "torch": torch.__version__,
             "cuda": torch.version.cuda, "host_cpu": platform.processor(), "host_cpus": os.cpu_count()}
    try:
        with open("/proc/meminfo") as f:
            facts["host_memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    facts["host_cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import subprocess

        q = "clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max,driver_version"
        facts["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # facts only
        facts["nvidia_smi"] = f"unavailable: {exc}"
    return facts


def run(device="cuda", shape_configs=(), contexts=(512, 1024, 2048)) -> dict:
    device = torch.device(device)
    sizes = [64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
    t0 = time.perf_counter()
    single = copy_sweep(device, True, 1, sizes)
    queued = copy_sweep(device, True, 16, sizes[:5])
    pageable = copy_sweep(device, False, 1, [16 * MIB])
    big = [r for r in single if r["bytes"] >= MIB]
    bigq = [r for r in queued if r["bytes"] >= 256 * KIB]
    gemv = gemv_sweep(device, [1, 2, 4, 8, 16, 32, 64, 128, 256])
    gemv_big = [r for r in gemv if r["weight_bytes"] >= 8 * MIB]
    result = {
        "machine": machine(device),
        "h2d_pinned_single": single,
        "h2d_pinned_single_fit": fit_intercept_and_rate([r["bytes"] for r in big], [r["us_per_copy"] for r in big]),
        "h2d_pinned_queued16": queued,
        "h2d_pinned_queued16_fit": fit_intercept_and_rate([r["bytes"] for r in bigq], [r["us_per_copy"] for r in bigq]),
        "h2d_pageable": pageable,
        "gemv": gemv,
        "gemv_fit": fit_intercept_and_rate([r["weight_bytes"] for r in gemv_big], [r["us"] for r in gemv_big]),
        "tiny_kernels": tiny_kernels(device),
    }
    try:  # recorded, not fatal: the copy and GEMV figures stand on their own
        result["graph_launch"] = graph_launch(device)
    except RuntimeError as exc:
        result["graph_launch"] = {"failed": str(exc)}
    if shape_configs:
        t1 = time.perf_counter()
        try:
            result["op_times"] = op_times(device, decode_shapes(list(shape_configs), list(contexts)))
        except RuntimeError as exc:
            result["op_times"] = []
            result["op_times_failed"] = str(exc)
        result["op_times_from"] = {"configs": list(shape_configs), "contexts": list(contexts),
                                   "seconds": round(time.perf_counter() - t1, 1)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def _check_out(path: str) -> None:
    """--out can be written (its folder is made when missing, as write_atomic does): checked before anything runs."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent):
        check_output_file(path, "--out")
    else:
        check_output_dir(parent, (), f"--out {path}: its folder")


def _whole_numbers(text: str, option: str, least: int = 1) -> list[int]:
    """"256,4096" -> [256, 4096]; anything else refused in one line naming `option`."""
    try:
        values = [int(c) for c in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < least:
        raise InputError(f"{option} {text!r}: expected whole numbers >= {least} separated by commas, e.g. 256,4096")
    return values


def _prefill_main(a) -> int:
    """--prompts (or --batch): the prefill chunks' (a batch step's) kernel shapes alone (prefill_op_times) into
    --out."""
    if a.served:
        if a.prompts or a.batch is not None:
            raise InputError("--served: not with --prompts or --batch (one probe: a served run's steps)")
        found = served_shapes(list(a.shapes_from), a.policy, a.set, a.missing_from)
        what, origin = "served", {"served": True, **({"policies": a.policy} if a.policy else {})}
    elif a.batch is not None:
        if a.prompts:
            raise InputError("--batch: not with --prompts (a batch's decode steps or a request's prefill, one a probe)")
        if a.batch < 2 or a.steps < 1:
            raise InputError(f"--batch {a.batch} --steps {a.steps}: expected whole numbers B >= 2 and N >= 1")
        contexts = _whole_numbers(a.contexts, "--contexts") if a.contexts else None
        found = batch_shapes(list(a.shapes_from), a.batch, a.steps, contexts, a.set, a.missing_from)
        what, origin = "batch", {"batch": a.batch, "steps": a.steps, **({"contexts": contexts} if contexts else {})}
    else:
        try:
            prompts = [int(c) for c in a.prompts.split(",")]
        except ValueError:
            raise InputError(f"--prompts {a.prompts!r}: expected whole numbers separated by commas, e.g. 256,4096") from None
        found = prefill_shapes(list(a.shapes_from), prompts, a.set, a.missing_from)
        what, origin = "prefill", {"prompts": prompts}
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {a.device}: torch {torch.__version__} sees no CUDA GPU (--device cpu for a dry run)")
    t0 = time.perf_counter()
    device = torch.device(a.device)
    # the GEMMs and attention kernels first (the array model has no tensor cores), then the rest: a time limit
    # that stops the probe leaves the elementwise shapes to the array model, not the GEMMs
    shapes = sorted(found, key=lambda s: (s[0].kind != "matmul" and s[0].attention is None, s[0].key))
    print(f"{len(shapes)} {what} kernel shapes to time", flush=True)
    info = machine(device) if device.type == "cuda" else {"gpu": "cpu (dry run)"}

    def save(rows, complete=False):
        res = {"machine": info, "gemv_kernel": a.gemv, "op_times": rows, "graph_only": True, "complete": complete,
               "shapes": len(shapes),
               "op_times_from": {"configs": list(a.shapes_from), **origin, **({"set": a.set} if a.set else {}),
                                 **({"missing_from": a.missing_from} if a.missing_from else {})},
               "seconds": round(time.perf_counter() - t0, 1)}
        write_atomic(a.out, json.dumps(res, indent=1, sort_keys=True), what="--out")
        print(f"{len(rows)} of {len(shapes)} shapes timed in {res['seconds']} s", flush=True)

    save(prefill_op_times(device, shapes, gemv=a.gemv, save=save), complete=True)
    return 0


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m chipsim.hwreplay.microbench",
                       description="single-op and single-copy microbenchmarks of a CUDA machine")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes-from", nargs="*", default=[], metavar="CONFIG",
                    help="time every kernel shape of these configs' decode steps (the op_times_ns table)")
    ap.add_argument("--contexts", default=None,
                    help="context lengths whose attention shapes to time (default 512,1024,2048; with --batch, the "
                         "config's workload.context_length)")
    ap.add_argument("--gemv", default=None, choices=GEMV_KERNELS,
                    help="only the per-shape kernel times (no copy or launch sweeps), with this GEMV kernel")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --gemv: override a key of the --shapes-from configs, e.g. model.expert_bits=4")
    ap.add_argument("--missing-from", nargs="*", default=[], metavar="CONFIG",
                    help="with --gemv: time only the shapes these configs' compute.op_times_ns lack")
    ap.add_argument("--prompts", default=None, metavar="N,N",
                    help="with --gemv: the kernel shapes of the prefill chunks of requests of these prompt lengths "
                         "instead of decode steps (each in one CUDA graph only)")
    ap.add_argument("--batch", type=int, default=None, metavar="B",
                    help="with --gemv: the kernel shapes of a batch's decode steps of B sequences (workload.batch) "
                         "instead (each in one CUDA graph only)")
    ap.add_argument("--steps", type=int, default=16, metavar="N",
                    help="with --batch: the decode steps whose experts' token counts to time (default 16)")
    ap.add_argument("--served", action="store_true",
                    help="with --gemv: the kernel shapes of the steps of each policy's served run of the configs "
                         "(workload.requests and the rest, --set) instead (each in one CUDA graph only)")
    ap.add_argument("--policy", action="append", default=None, metavar="SPEC",
                    help="with --served: the policies whose runs' steps to time (default: each config's run.policies)")
    ap.add_argument("--device", default="cuda",
                    help="with --prompts, --batch or --served: cuda, or cpu for a dry run (times meaningless)")
    a = ap.parse_args(argv)
    if (a.set or a.missing_from or a.prompts or a.batch is not None or a.served) and not a.gemv:
        ap.error("--set, --missing-from, --prompts, --batch and --served go with --gemv (the per-shape kernel times "
                 "alone)")
    if a.policy and not a.served:
        ap.error("--policy goes with --served (whose runs' steps to time)")
    _check_out(a.out)
    if a.prompts or a.batch is not None or a.served:
        return _prefill_main(a)
    if not a.device.startswith("cuda"):
        ap.error("--device goes with --prompts, --batch or --served (the copy and kernel sweeps run on the GPU)")
    contexts = _whole_numbers(a.contexts or "512,1024,2048", "--contexts")
    if not torch.cuda.is_available():  # before anything runs, as chipsim hwreplay says it
        raise InputError(f"python -m chipsim.hwreplay.microbench needs a CUDA GPU: torch {torch.__version__} sees none "
                         "(--gemv with --prompts, --batch or --served has --device cpu for a dry run)")
    if a.gemv:
        t0 = time.perf_counter()
        device = torch.device("cuda")
        rows = op_times(device, decode_shapes(list(a.shapes_from), contexts, a.set, a.missing_from), gemv=a.gemv)
        res = {"machine": machine(device), "gemv_kernel": a.gemv, "op_times": rows,
               "op_times_from": {"configs": list(a.shapes_from), "contexts": contexts,
                                 **({"set": a.set} if a.set else {}),
                                 **({"missing_from": a.missing_from} if a.missing_from else {})},
               "seconds": round(time.perf_counter() - t0, 1)}
        write_atomic(a.out, json.dumps(res, indent=1, sort_keys=True), "--out")
        print(json.dumps({k: res[k] for k in ("machine", "gemv_kernel", "seconds")}, indent=1))
        return 0
    from chipsim.hw.config import load_config

    for config in a.shapes_from:  # read now, not after the sweeps: a bad config ends the run before it starts
        load_config(config)
    res = run(shape_configs=a.shapes_from, contexts=contexts)
    write_atomic(a.out, json.dumps(res, indent=1, sort_keys=True), "--out")
    print(json.dumps({k: res[k] for k in ("machine", "h2d_pinned_single_fit", "h2d_pinned_queued16_fit", "gemv_fit",
                                          "tiny_kernels", "graph_launch", "op_times_from", "seconds") if k in res}, indent=1))
    return 0


if __name__ == "__main__":
    run_module_main(main)
