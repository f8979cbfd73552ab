"""The host's front-end costs, each measured alone on the GPU machine it runs on (issue #44 item 1): what software
that drives a GPU from a host thread pays besides the GPU's own work.

- pageable copies: a host-to-device copy from ordinary (pageable) host memory against the same from pinned memory,
  per size, each from a stretch of a 4 GiB buffer that no cache holds: the GPU's time (events), the host's time inside the call (the driver stages pageable memory through a
  pinned buffer while the caller waits) and the rate fitted as t = a + N/B;
- a pageable copy beside a kernel running on another stream: whether the copy overlaps it and whether the host
  returns before the kernel ends (pinned for reference);
- issue costs: the host's time per call for a pinned copy, an eager kernel, a CUDA graph launch (of 1, 8 and 32
  kernels), an event record and a stream's wait for an event, through PyTorch and as raw CUDA runtime calls, each
  enqueued behind a sleeping kernel so the GPU never waits for the host (what the host spends, not the GPU);
- a routing read-back: the GPU idle from the moment a small result (a layer's chosen experts) is ready to the start
  of work the host enqueues after reading it (`.tolist()`, as PyTorch offloading code does), and the same with an
  event wait and a pinned copy;
- the launch queue's run-ahead: how many kernels (and graph launches) the host can enqueue behind a long kernel
  before its call blocks;
- the host DRAM's read rate alone (every thread streaming a pinned buffer) and beside pinned copies that stream
  out of the same memory: whether the CPU's reads and the copy engine share one bandwidth on this host.

    python -m chipsim.hwreplay.host_frontend --out validation/h100/h100-host-frontend.json [--threads N]

Every part is measured on its own and recorded even when another part fails (its error is kept in its place).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms
from chipsim.hwreplay.fits import fit_intercept_and_rate

MIB = 1 << 20


def _median(xs) -> float:
    return round(statistics.median(xs), 3)


def stream_copies(device, count: int, chunk: int = 16 * MIB) -> tuple:
    """`count` pinned host-to-device copies of `chunk` bytes, each from the next stretch of a 1 GiB pinned buffer,
    enqueued on a stream of their own (the host returns at once): (start event, end event, bytes, the buffers,
    kept alive until they have run). Their rate once done: bytes / start.elapsed_time(end)."""
    src = torch.ones(1 << 30, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(chunk, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        a.record(stream)
        for i in range(count):
            off = (i * chunk) % (src.numel() - chunk)
            dst.copy_(src[off:off + chunk], non_blocking=True)
        b.record(stream)
    return a, b, count * chunk, (src, dst, stream)


def copies(device, sizes: list[int], reps: int, pool_bytes: int) -> dict:
    """Pinned and pageable host-to-device copies, one at a time on an idle copy stream, each from the next stretch of
    a `pool_bytes` buffer: no copy's source sits in the host's caches, as an expert's does not in a replay (a
    pageable copy's driver memcpy from the last-level cache ran 1.7-2.2x as fast on the H100s' hosts)."""
    stream = torch.cuda.Stream()
    out = {}
    for pinned in (True, False):
        pool = torch.ones(pool_bytes, dtype=torch.uint8, pin_memory=pinned)  # written: every page present
        rows = []
        for n in sizes:
            dst = torch.empty(n, dtype=torch.uint8, device=device)
            gpu, host = [], []
            for i in range(reps + 2):
                off = (i * n) % (pool_bytes - n)
                src = pool[off:off + n]
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                with torch.cuda.stream(stream):
                    a.record(stream)
                    t0 = time.perf_counter()
                    dst.copy_(src, non_blocking=True)
                    t1 = time.perf_counter()
                    b.record(stream)
                b.synchronize()
                if i >= 2:
                    gpu.append(a.elapsed_time(b) * 1e3)
                    host.append((t1 - t0) * 1e6)
            rows.append({"bytes": n, "gpu_us": _median(gpu), "host_call_us": _median(host),
                         "gbps": round(n / statistics.median(gpu) / 1e3, 3)})
            del dst
        del pool
        fit = fit_intercept_and_rate([r["bytes"] for r in rows], [r["gpu_us"] for r in rows])
        out["pinned" if pinned else "pageable"] = {"copies": rows, "fit": fit, "pool_bytes": pool_bytes}
    return out


def beside_kernel(device, nbytes: int, kernel_us: float, reps: int) -> dict:
    """A copy on a copy stream enqueued right after a sleeping kernel on the compute stream: when it starts and ends
    against the kernel, and when the host's call returns (µs from the kernel's start)."""
    compute, copy = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = int(kernel_us * sleep_cycles_per_ms(device) / 1e3)
    out = {"bytes": nbytes, "kernel_us": kernel_us}
    for pinned in (True, False):
        src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
        rows = []
        for i in range(reps + 1):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.synchronize()
            with torch.cuda.stream(compute):
                ev[0].record(compute)
                torch.cuda._sleep(cycles)
                ev[1].record(compute)
            t0 = time.perf_counter()
            with torch.cuda.stream(copy):
                ev[2].record(copy)
                dst.copy_(src, non_blocking=True)
                t1 = time.perf_counter()
                ev[3].record(copy)
            torch.cuda.synchronize()
            if i:
                rows.append({"kernel_end_us": ev[0].elapsed_time(ev[1]) * 1e3,
                             "copy_start_us": ev[0].elapsed_time(ev[2]) * 1e3,
                             "copy_end_us": ev[0].elapsed_time(ev[3]) * 1e3, "host_call_us": (t1 - t0) * 1e6})
        med = {k: _median([r[k] for r in rows]) for k in rows[0]}
        med["overlaps_kernel"] = med["copy_start_us"] < med["kernel_end_us"] - 1.0
        med["host_returns_before_kernel_end"] = med["host_call_us"] < med["kernel_end_us"]
        out["pinned" if pinned else "pageable"] = med
        del src, dst
    return out


def _graph_of(x, stream, kernels: int):
    """A CUDA graph of `kernels` tiny kernels (x += 1 each), captured on `stream` after one eager run."""
    with torch.cuda.stream(stream):
        g = torch.cuda.CUDAGraph()
        x.add_(1)
        stream.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(kernels):
                x.add_(1)
    return g


def _host_us(op, stream, cycles: int, calls: int, reps: int) -> float:
    """The host's µs per call of `op`, `calls` of them enqueued on `stream` behind a kernel sleeping `cycles` (0:
    none, the GPU idle at the first call), median of `reps` runs."""
    per = []
    for _ in range(reps):
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            if cycles:
                torch.cuda._sleep(cycles)
            t0 = time.perf_counter()
            for _ in range(calls):
                op()
            per.append((time.perf_counter() - t0) * 1e6 / calls)
    return _median(per)


def _host_us_per_call(op, stream, cycles: int, calls: int, reps: int) -> dict:
    """The host's µs per call of `op` with the GPU busy ahead of every call (behind a sleeping kernel: what a host
    that is ahead pays), and with the GPU idle at the first call (each call's work may start as it is enqueued)."""
    return {"host_us_per_call": _host_us(op, stream, cycles, calls, reps),
            "idle_gpu_host_us_per_call": _host_us(op, stream, 0, calls, reps), "calls": calls, "reps": reps}


def issue_costs(device, calls: int, reps: int) -> dict:
    """The host's µs per call, every call enqueued behind a long sleeping kernel on the same stream (the GPU never
    waits for the host, and the queue is far from full). Through PyTorch (what offloading code calls): a pinned
    64 KiB copy, an eager add, a graph launch of 1, 8 and 32 kernels (a segment graph holds several), an event
    record, a stream's wait for an event; and as a program makes them, each call on other memory: launches of 256
    distinct 8-kernel graphs in turn, copies from distinct 64 KiB stretches of a 64 MiB buffer into distinct
    places. Through the CUDA runtime's own calls (chipsim.hwreplay.cudart, what `hwreplay --enqueue cudart`
    issues): the same copies, graph launches, record and wait."""
    stream, other = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = int(20_000 * sleep_cycles_per_ms(device) / 1e3)  # 20 ms ahead
    src = torch.ones(64 << 10, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(64 << 10, dtype=torch.uint8, device=device)
    x = torch.ones(4096, device=device)
    graphs = {k: _graph_of(x, stream, k) for k in (1, 8, 32)}
    distinct = _Distinct(device, stream)
    ev = torch.cuda.Event()
    ev.record(other)  # a recorded event: a wait for it is a real wait entry
    torch.cuda.synchronize()
    ops = {"pinned_copy_64kib": lambda: dst.copy_(src, non_blocking=True), "eager_kernel": lambda: x.add_(1),
           "graph_launch": graphs[1].replay, "graph_launch_8_kernels": graphs[8].replay,
           "graph_launch_32_kernels": graphs[32].replay, "event_record": lambda: ev.record(stream),
           "stream_wait_event": lambda: stream.wait_event(ev), "graph_launch_distinct": distinct.launch,
           "pinned_copy_64kib_distinct": distinct.copy}
    out = {name: _host_us_per_call(op, stream, cycles, calls, reps) for name, op in ops.items()}
    out["cudart"] = _cudart_issue_costs(stream, src, dst, graphs, ev, cycles, calls, reps, distinct)
    torch.cuda.synchronize()
    return out


class _Distinct:
    """Calls on other memory each time, as a program makes them: `launch` replays the next of 256 distinct
    8-kernel graphs, `copy` copies the next 64 KiB stretch of a 64 MiB pinned buffer into the next place (its views
    made beforehand, as the replay's program makes them)."""

    def __init__(self, device, stream) -> None:
        self.xs = [torch.ones(4096, device=device) for _ in range(256)]
        self.graphs = [_graph_of(x, stream, 8) for x in self.xs]
        self.src = torch.ones(64 << 20, dtype=torch.uint8, pin_memory=True)
        self.dst = torch.empty(64 << 20, dtype=torch.uint8, device=device)
        self.views = [(self.dst[o:o + (64 << 10)], self.src[o:o + (64 << 10)]) for o in range(0, 64 << 20, 64 << 10)]
        self.i = self.j = 0

    def launch(self) -> None:
        self.graphs[self.i].replay()
        self.i = (self.i + 1) % len(self.graphs)

    def copy(self) -> None:
        dst, src = self.views[self.j]
        dst.copy_(src, non_blocking=True)
        self.j = (self.j + 1) % len(self.views)


def _cudart_issue_costs(stream, src, dst, graphs: dict, ev, cycles: int, calls: int, reps: int, distinct) -> dict:
    """issue_costs' calls made as raw CUDA runtime calls through ctypes (chipsim.hwreplay.cudart.Runtime)."""
    from chipsim.hwreplay.cudart import Runtime
    from chipsim.hwreplay.harness import _handle

    fns = Runtime().fns
    s, e = _handle(stream), _handle(ev)
    copy, record, wait, launch = (fns[n] for n in ("cudaMemcpyAsync", "cudaEventRecord", "cudaStreamWaitEvent",
                                                   "cudaGraphLaunch"))
    exes = [_handle(g) for g in distinct.graphs]
    ptrs = [(d.data_ptr(), c.data_ptr()) for d, c in distinct.views]
    turn = {"g": 0, "c": 0}

    def launch_distinct():
        turn["g"] = (turn["g"] + 1) % len(exes)
        return launch(exes[turn["g"]], s)

    def copy_distinct():
        turn["c"] = (turn["c"] + 1) % len(ptrs)
        d, c = ptrs[turn["c"]]
        return copy(d, c, 64 << 10, 1, s)

    ops = {"pinned_copy_64kib": lambda: copy(dst.data_ptr(), src.data_ptr(), src.numel(), 1, s),
           "event_record": lambda: record(e, s), "stream_wait_event": lambda: wait(s, e, 0),
           "pinned_copy_64kib_distinct": copy_distinct}
    if exes[0] is not None:
        ops["graph_launch_distinct"] = launch_distinct
    for k, g in graphs.items():
        exe = _handle(g)
        if exe is not None:  # this PyTorch exposes the executable
            ops["graph_launch" + ("" if k == 1 else f"_{k}_kernels")] = (lambda exe=exe: launch(exe, s))
    for name, op in ops.items():  # each call once, checked, before any timing
        err = op()
        if err:
            raise RuntimeError(f"cudart {name}: CUDA error {err}")
    torch.cuda.synchronize()
    return {name: _host_us_per_call(op, stream, cycles, calls, reps) for name, op in ops.items()}


def readback(device, experts: int, reps: int) -> dict:
    """A layer's chosen experts read by the host, then work enqueued after them: the GPU's idle time from the ids
    being ready (an event after the kernel that writes them) to the next kernel's start (an event before it), the
    GPU busy before the ids as in a decode step. Two ways: `.tolist()` (a pageable read, what PyTorch offloading
    code writes) and a pinned non-blocking copy with an event wait."""
    stream = torch.cuda.Stream()
    cycles = int(200 * sleep_cycles_per_ms(device) / 1e3)  # 200 µs of GPU work before the ids
    logits = torch.randn(64, device=device)
    pinned = torch.empty(experts, dtype=torch.int64, pin_memory=True)
    y = torch.ones(4096, device=device)
    out = {}
    for way in ("tolist", "pinned_event"):
        gaps = []
        for i in range(reps + 3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            with torch.cuda.stream(stream):
                torch.cuda._sleep(cycles)
                ids = torch.topk(logits, experts).indices
                a.record(stream)
                if way == "tolist":
                    chosen = ids.tolist()
                else:
                    pinned.copy_(ids, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(stream)
                    done.synchronize()
                    chosen = pinned.tolist()
                b.record(stream)
                y.add_(len(chosen))
            torch.cuda.synchronize()
            if i >= 3:
                gaps.append(a.elapsed_time(b) * 1e3)
        out[way] = {"gpu_idle_us": _median(gaps), "p10": round(sorted(gaps)[len(gaps) // 10], 3),
                    "p90": round(sorted(gaps)[9 * len(gaps) // 10], 3), "n": len(gaps)}
    return out


def launch_queue(device, limit: int, kernel_ms: float) -> dict:
    """Kernels (and one-kernel graph launches) enqueued behind a `kernel_ms` sleeping kernel until a call blocks:
    the run-ahead is the number enqueued before the first call that took longer than a tenth of the sleep (the host
    waited for the GPU to free a queue entry). Where none blocks before half the sleep has passed, the count so far
    is a lower bound."""
    stream = torch.cuda.Stream()
    cycles = int(kernel_ms * 1e3 * sleep_cycles_per_ms(device) / 1e3)
    x = torch.ones(1024, device=device)
    g = _graph_of(x, stream, 1)
    out = {}
    for name, op in (("eager_kernel", lambda: x.add_(1)), ("graph_launch", g.replay)):
        torch.cuda.synchronize()
        blocked_at, count, longest = None, 0, 0.0
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            t_start = time.perf_counter()
            for i in range(limit):
                t0 = time.perf_counter()
                op()
                t1 = time.perf_counter()
                longest = max(longest, t1 - t0)
                count = i + 1
                if t1 - t0 > kernel_ms * 1e-4:
                    blocked_at = i
                    break
                if t1 - t_start > kernel_ms * 5e-4:
                    break
        torch.cuda.synchronize()
        out[name] = {"enqueued_before_blocking": blocked_at, "enqueued": count,
                     "longest_call_us": round(longest * 1e6, 1), "kernel_ms": kernel_ms,
                     "lower_bound": blocked_at is None}
    return out


def host_reads(device, threads: int, gib: float, reps: int) -> dict:
    """The host DRAM's read rate with `threads` threads summing a pinned buffer (float32), alone and while pinned
    16 MiB copies stream out of another pinned buffer to the GPU (enqueued ahead to outlast the reads), with the
    copies' own rate over their span."""
    torch.set_num_threads(threads)
    n = int(gib * (1 << 30)) // 4
    buf = torch.ones(n, dtype=torch.float32, pin_memory=True)

    def rates(k):
        rs = []
        for _ in range(k):
            t0 = time.perf_counter()
            buf.sum()
            rs.append(n * 4 / (time.perf_counter() - t0) / 1e9)
        return rs

    rates(1)
    alone = rates(reps)
    span_s = reps * n * 4 / (statistics.median(alone) * 1e9)
    a, b, nbytes, _buffers = stream_copies(device, max(64, int(1.3 * span_s * 60e9 / (16 * MIB))))
    beside = rates(reps)
    outlasted = not b.query()
    torch.cuda.synchronize()
    copy_gbps = nbytes / (a.elapsed_time(b) * 1e-3) / 1e9
    return {"threads": threads, "buffer_gib": gib, "alone_gbps": _median(alone),
            "beside_copies_gbps": _median(beside), "copies_gbps": round(copy_gbps, 3),
            "copies_outlasted_reads": outlasted, "reps": reps}


def probe(threads: int, expert_bytes: int, quick: bool) -> dict:
    device = torch.device("cuda")
    reps = 5 if quick else 25
    sizes = sorted({256 << 10, MIB, 4 * MIB, expert_bytes, 16 * MIB, 64 * MIB})
    parts = {
        "copies": lambda: copies(device, sizes, reps, 4 << 30),
        "beside_kernel": lambda: beside_kernel(device, 16 * MIB, 5000.0, reps),
        "issue_costs": lambda: issue_costs(device, 200, reps),
        "readback": lambda: readback(device, 8, 4 * reps),
        "launch_queue": lambda: launch_queue(device, 1 << 16, 1000.0),
        "host_reads": lambda: host_reads(device, threads, 1.0 if quick else 4.0, 3 if quick else 8),
    }
    res = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "cpus": os.cpu_count(),
           "threads": threads, "expert_bytes": expert_bytes}
    for name, part in parts.items():
        t0 = time.perf_counter()
        try:
            res[name] = part()
        except Exception as exc:  # one part's failure keeps the others (module docstring)
            res[name] = {"error": repr(exc)}
        print(f"  {name}: {time.perf_counter() - t0:.1f} s {json.dumps(res[name])[:400]}", flush=True)
    return res


def main(argv=None) -> int:
    from chipsim.errors import InputError, OneLineParser
    from chipsim.files import write_atomic

    ap = OneLineParser(prog="python -m chipsim.hwreplay.host_frontend",
                       description="measure the host's front-end costs, each alone (module docstring)")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="host threads reading (default: all)")
    ap.add_argument("--expert-bytes", type=int, default=4718592,
                    help="one expert's bytes, a copy size timed (default: Granite-3B's BF16 expert)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a check that it runs)")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.expert_bytes < 1:
        raise InputError(f"--threads {a.threads}, --expert-bytes {a.expert_bytes}: expected whole numbers >= 1")
    if not torch.cuda.is_available():
        raise InputError("python -m chipsim.hwreplay.host_frontend: needs a CUDA GPU (none is visible)")
    res = probe(a.threads, a.expert_bytes, a.quick)
    write_atomic(a.out, json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    from chipsim.errors import run_module_main

    run_module_main(main)
