"""Single-op energy microbenchmarks of the H200, read from the board's NVML energy counter (the device machine,
torch with CUDA, nvidia-ml-py; nothing here runs a model or a decode step). Each window runs one thing for
`--seconds` and reads the counter before and after it; each is measured `--repeats` times.

- idle: nothing on the GPU, first before any work (its clocks down), then right after a load (clocks still up);
- host-to-device copies of 256 MiB from pinned memory, back to back and paced by the host to about 1/2, 1/4 and
  1/8 of that rate (the GPU idle between copies): power against bytes per second gives the copy's energy per
  byte (the slope) over the board's power with the copy engine idle (the intercept);
- tiny kernels (1,000 adds of 1,024 elements in one CUDA graph): the SMs busy with kernels that move almost nothing;
- small GEMVs as in a decode step (3 MiB each, 400 in one CUDA graph, each on its own weights): a check of the fit;
- middle-rate GEMVs (16 MiB each, 100 in one CUDA graph): a fourth equation, so the table is a least-squares fit
  whose residuals show whether one line of busy power and HBM energy holds across rates (files before 2026-12-05
  have no such window);
- a GEMV (torch.mv, BF16, a 1 GiB weight matrix: HBM-bound, ~1 FLOP per byte): power over bytes read per second;
- a GEMM (torch.mm, BF16, 8192^3: compute-bound, ~2,700 FLOPs per byte of operands): power over MACs per second.

    python validation/energy/probe_energy.py > validation/energy/h200-energy-probe.json

The energy table (chipsim/hwreplay/energy_table.py) is derived from these windows alone; no decode step is fitted.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from chipsim.hwreplay.nvml import Meter, open_gpu, window  # noqa: E402
from chipsim.hwreplay.run import fill_normal_bf16  # noqa: E402

MIB = 2**20


def measured(gpu, run, seconds: float, settle_s: float = 0.5) -> dict:
    """Call run() until `seconds` have passed (each call ends synchronised); the board's energy over that time,
    read by chipsim.hwreplay.nvml.Meter with `settle_s` of idle on each side (0: the counter read right before
    and right after, as before the counter's delay was measured)."""
    torch.cuda.synchronize()
    meter = Meter(gpu, settle_s) if settle_s > 0 else None
    if meter is not None:
        meter.start()
    before, t0 = gpu.read(), time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        run()
        calls += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    out = meter.stop(elapsed) if meter is not None else window(before, gpu.read(), elapsed)
    out["calls"] = calls
    return out


def board(script: str):
    """The GPU's NVML handle, or exit naming what the script needs."""
    gpu = open_gpu()
    if gpu is None or not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA GPU and NVML (pip package nvidia-ml-py)")
    return gpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds each side of a window (nvml.Meter; 0: none)")
    a = ap.parse_args()
    gpu = board("probe_energy")
    dev = torch.device("cuda")
    rows = []

    def record(kind: str, run, **fields) -> dict:
        for repeat in range(a.repeats):
            row = {"kind": kind, "repeat": repeat, **fields, **measured(gpu, run, a.seconds, a.settle)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        return rows[-1]

    record("idle_cold", lambda: time.sleep(0.05))

    # host-to-device copies: one 256 MiB copy per call, then (paced) the host sleeps the copy's time times `gap`
    nbytes = 256 * MIB
    # the bytes of weights like real ones, as the replays copy (a constant byte would toggle HBM's writes less);
    # the files committed before this line copied the byte 1 throughout
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    fill_normal_bf16(host, dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    for _ in range(3):
        dst.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    copy_s = (time.perf_counter() - t0) / 10
    for gap in (0, 1, 3, 7):
        def copy(gap=gap):
            dst.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            if gap:
                time.sleep(gap * copy_s)
        record("h2d_copy", copy, bytes_per_call=nbytes, host_gap_copies=gap)
    del host, dst

    # tiny kernels: the SMs busy starting and ending kernels that move almost nothing (1,000 adds of 1,024
    # elements in one CUDA graph, as a decode step's small ops): the board's power with its SMs busy, per second
    from chipsim.hwreplay.harness import capture_graph

    a_, b_, o_ = (torch.randn(1024, dtype=torch.bfloat16, device=dev) for _ in range(3))
    tiny = capture_graph([(torch.add, (a_, b_), {"out": o_})] * 1000)

    def tiny_run():
        tiny.replay()
        torch.cuda.synchronize()
    tiny_run()
    record("tiny_kernels", tiny_run, kernels_per_call=1000, bytes_per_call=1000 * 3 * 1024 * 2, macs_per_call=0)
    del tiny

    # small GEMVs as in a decode step (an expert's 1,536 x 1,024 BF16 gate/up projection, 3 MiB), each on its
    # own weights rotating through 2 GiB, 400 in one CUDA graph: not used in the fit, a check of it
    rows_s, cols_s = 1536, 1024
    pool = torch.randn(2 * 1024 * MIB // 2, dtype=torch.bfloat16, device=dev)
    xs_ = torch.randn(cols_s, dtype=torch.bfloat16, device=dev)
    ys_ = torch.empty(rows_s, dtype=torch.bfloat16, device=dev)
    n_s = rows_s * cols_s
    chain = capture_graph([(torch.mv, (pool[i * n_s:(i + 1) * n_s].view(rows_s, cols_s), xs_), {"out": ys_})
                           for i in range(400)])

    def gemv_small():
        chain.replay()
        torch.cuda.synchronize()
    gemv_small()
    record("gemv_small", gemv_small, kernels_per_call=400, bytes_per_call=400 * n_s * 2, macs_per_call=400 * n_s,
           shape=[rows_s, cols_s])
    del chain

    # middle-rate GEMVs (4,096 x 2,048 BF16, 16 MiB each, on their own weights through the same 2 GiB, 100 in one
    # graph): a fourth equation between the small and the large GEMV's rates; the table is then a least-squares fit
    # whose residuals say whether one line of busy power and HBM energy holds across rates
    rows_m, cols_m = 4096, 2048
    n_m = rows_m * cols_m
    xm_ = torch.randn(cols_m, dtype=torch.bfloat16, device=dev)
    ym_ = torch.empty(rows_m, dtype=torch.bfloat16, device=dev)
    chain = capture_graph([(torch.mv, (pool[i * n_m:(i + 1) * n_m].view(rows_m, cols_m), xm_), {"out": ym_})
                           for i in range(100)])

    def gemv_mid():
        chain.replay()
        torch.cuda.synchronize()
    gemv_mid()
    record("gemv_mid", gemv_mid, kernels_per_call=100, bytes_per_call=100 * n_m * 2, macs_per_call=100 * n_m,
           shape=[rows_m, cols_m])
    del chain, pool

    # GEMV: HBM-bound. 20 per call keeps the queue full between the host's synchronisations
    rows_, cols = 8192, 65536
    w = torch.randn(rows_, cols, dtype=torch.bfloat16, device=dev)
    x = torch.randn(cols, dtype=torch.bfloat16, device=dev)

    def gemv():
        for _ in range(20):
            torch.mv(w, x)
        torch.cuda.synchronize()
    gemv()
    record("gemv", gemv, kernels_per_call=20, bytes_per_call=20 * w.numel() * 2, macs_per_call=20 * w.numel(),
           shape=[rows_, cols])
    del w, x

    # GEMM: compute-bound
    n = 8192
    p = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    q = torch.randn(n, n, dtype=torch.bfloat16, device=dev)

    def gemm():
        for _ in range(10):
            torch.mm(p, q)
        torch.cuda.synchronize()
    gemm()
    record("gemm", gemm, kernels_per_call=10, bytes_per_call=10 * 3 * n * n * 2, macs_per_call=10 * n**3, shape=[n, n, n])
    del p, q
    torch.cuda.empty_cache()

    record("idle_warm", lambda: time.sleep(0.05))
    record("idle_settled", lambda: time.sleep(0.05))

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"machine": {**gpu.describe(), "torch": torch.__version__, "nvidia_smi": smi,
                                  "copy_seconds_256mib": round(copy_s, 6)},
                      "seconds_per_window": a.seconds, "settle_s": a.settle, "windows": rows}, indent=1))


if __name__ == "__main__":
    main()
