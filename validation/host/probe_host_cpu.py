"""What a host CPU computing an expert costs, each part measured alone on the machine it runs on (torch on the CPU; no
GPU needed): the numbers chipsim's `host_cpu.*` keys stand for, which every GPU config so far carries as ASSUMPTIONs
(issue #44 item 1). Nothing here is fitted to an end-to-end run.

- memory read bandwidth: a sum over a 1 GiB FP32 array, at each thread count (STREAM-like; `host_cpu.
  memory_bandwidth_gbps` is the rate a CPU expert reaches, which the expert rows below give directly);
- one routed expert at decode (one token): gate and up GEMVs, SiLU and product, down GEMV (torch.mv on the CPU), its
  weights resident in host memory as the experts are, for each model shape and precision (BF16, FP32; BF16 runs
  natively only where the CPU has the instructions: `machine.bf16` says which), at each thread count; each call on
  the next of enough copies that no cache holds the weights; median of the reps; the rate = weight bytes / time;
- the hand-off: a job given to a waiting worker thread and its (empty) result taken back, the host side of
  `host_cpu.dispatch_overhead_ns` (the activation's trip over PCIe is the copy probes', not this one's).

    python validation/host/probe_host_cpu.py --out validation/host/h200-host-cpu.json
    python validation/host/probe_host_cpu.py --quick --out /tmp/host.json     (a minute on any machine)

The shapes are chipsim's bundled models' (chipsim/workload/shapes/): their hidden size and expert FFN width.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from chipsim.workload.models import get_model  # noqa: E402

MODELS = ("granite-3.1-3b-a800m", "deepseek-v2-lite", "qwen2-57b-a14b", "mixtral-8x7b")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
GIB = 1 << 30


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores, and the cores."""
    out, n = [], 1
    while n < cores:
        out.append(n)
        n *= 2
    return out + [cores]


def machine() -> dict:
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    names = set(flags.split())
    model = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "threads_default": torch.get_num_threads(),
            "avx512f": "avx512f" in names, "bf16": bool(names & {"avx512_bf16", "amx_bf16"}),
            "amx": "amx_tile" in names, "memory_gib": _memory_gib()}


def _memory_gib() -> float:
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        return round(kib / (1 << 20), 1)
    return 0.0


def read_bandwidth(threads: int, gib: float, reps: int) -> float:
    """GB/s of a sum over `gib` GiB of FP32 on `threads` threads (median of `reps`, after one warm-up)."""
    torch.set_num_threads(threads)
    a = torch.ones(int(gib * GIB) // 4, dtype=torch.float32)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        a.sum()
        times.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(times[1:]) / 1e9


def expert_time_us(d: int, ffn: int, dtype, threads: int, reps: int, pool_bytes: int) -> float:
    """Median µs of one expert at one token (gate and up GEMVs, SiLU x up, down GEMV) on `threads` threads, each call
    on the next of enough weight copies to exceed `pool_bytes` (no cache holds them)."""
    torch.set_num_threads(threads)
    size = 3 * d * ffn * torch.tensor([], dtype=dtype).element_size()
    copies = max(2, -(-pool_bytes // size))
    weights = [(torch.randn(2 * ffn, d).to(dtype), torch.randn(d, ffn).to(dtype)) for _ in range(copies)]
    x = torch.randn(d).to(dtype)
    times = []
    for i in range(reps + copies):
        gate_up, down = weights[i % copies]
        t0 = time.perf_counter()
        h = torch.mv(gate_up, x)
        y = torch.mv(down, torch.nn.functional.silu(h[:ffn]) * h[ffn:])
        times.append(time.perf_counter() - t0)
        del y
    return statistics.median(times[copies:]) * 1e6


def handoff_ns(reps: int) -> float:
    """Median ns from giving a waiting worker thread an empty job to taking its result back."""
    jobs, results = queue.Queue(), queue.Queue()

    def worker():
        while True:
            job = jobs.get()
            if job is None:
                return
            results.put(job)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    times = []
    for i in range(reps):
        t0 = time.perf_counter_ns()
        jobs.put(i)
        results.get()
        times.append(time.perf_counter_ns() - t0)
    jobs.put(None)
    t.join()
    return float(statistics.median(times[10:] if reps > 20 else times))


def run(quick: bool) -> dict:
    info = machine()
    threads = [1, info["cores"]] if quick else thread_counts(info["cores"])
    models = MODELS[:2] if quick else MODELS
    reps = 5 if quick else 15
    pool = (64 if quick else 512) << 20  # weight copies beyond the last-level cache
    out = {"machine": info, "quick": quick, "read_bandwidth_gbps": {}, "experts": [], "handoff_ns": handoff_ns(2000)}
    for n in threads:
        out["read_bandwidth_gbps"][str(n)] = round(read_bandwidth(n, 0.25 if quick else 1.0, reps), 2)
    for name in models:
        m = get_model(name)
        for label, dtype in DTYPES.items():
            for n in threads:
                us = expert_time_us(m.hidden_size, m.expert_ffn, dtype, n, reps, pool)
                nbytes = 3 * m.hidden_size * m.expert_ffn * torch.tensor([], dtype=dtype).element_size()
                out["experts"].append({"model": name, "hidden": m.hidden_size, "expert_ffn": m.expert_ffn,
                                       "dtype": label, "threads": n, "us": round(us, 1), "weight_bytes": nbytes,
                                       "gbps": round(nbytes / us / 1e3, 2)})
                print(f"{name} {label} {n} threads: {us:9.1f} us, {nbytes / us / 1e3:6.2f} GB/s", file=sys.stderr)
    torch.set_num_threads(info["threads_default"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a host CPU's expert, read bandwidth and hand-off, measured alone")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--quick", action="store_true", help="two thread counts, two models, smaller pools (a minute)")
    a = ap.parse_args(argv)
    res = run(a.quick)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
