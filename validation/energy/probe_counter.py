"""How the board's NVML energy counter moves (the device machine: torch with CUDA, nvidia-ml-py): polled as fast as
the host can, idle for a second, then under a steady load (a large GEMV replayed back to back) for two seconds,
then idle again. Prints JSON: every change of the counter as [seconds since the start, mJ], when the load began
and ended, and a summary: the intervals between changes, and how long after the load began and ended the
counter's rate moved. A replay's energy window (chipsim.hwreplay.nvml) is only as good as this cadence and lag.

    python validation/energy/probe_counter.py > validation/energy/h200-energy-counter.json
"""

import json
import os
import statistics
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
from probe_energy import board  # noqa: E402  (validation/energy/probe_energy.py)


def main() -> None:
    gpu = board("probe_counter")
    h, n = gpu._handle, gpu._nvml
    w = torch.empty(16384, 16384, dtype=torch.bfloat16, device="cuda").normal_()  # 512 MiB: HBM-bound GEMV
    x = torch.randn(16384, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(16384, dtype=torch.bfloat16, device="cuda")
    torch.mv(w, x, out=y)
    torch.cuda.synchronize()
    stop = threading.Event()
    marks = {}

    def load():
        time.sleep(1.0)
        marks["load_start_s"] = time.perf_counter() - t0
        while time.perf_counter() - t0 < 3.0:
            for _ in range(50):
                torch.mv(w, x, out=y)
            torch.cuda.synchronize()
        marks["load_end_s"] = time.perf_counter() - t0
        stop.set()

    changes = []
    t0 = time.perf_counter()
    last = n.nvmlDeviceGetTotalEnergyConsumption(h)
    changes.append([0.0, int(last)])
    th = threading.Thread(target=load)
    th.start()
    polls = 0
    while time.perf_counter() - t0 < 4.0:
        v = n.nvmlDeviceGetTotalEnergyConsumption(h)
        polls += 1
        if v != last:
            changes.append([round(time.perf_counter() - t0, 6), int(v)])
            last = v
    th.join()
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    rates = [[round(b[0], 4), round((b[1] - a[1]) / (b[0] - a[0]) / 1e3, 1)] for a, b in zip(changes, changes[1:])]
    loaded = [r for t, r in rates if marks["load_start_s"] + 0.5 < t < marks["load_end_s"]]
    idle = [r for t, r in rates if t < marks["load_start_s"]]
    hi = statistics.median(loaded) if loaded else None
    lo = statistics.median(idle) if idle else None
    up = down = None
    if hi is not None and lo is not None:
        mid = (hi + lo) / 2
        up = next((t for t, r in rates if t > marks["load_start_s"] and r > mid), None)
        down = next((t for t, r in rates if t > marks["load_end_s"] and r < mid), None)
    print(json.dumps({"machine": gpu.describe(), "polls": polls, **{k: round(v, 6) for k, v in marks.items()},
                      "summary": {"changes": len(changes), "interval_ms_median": round(1e3 * statistics.median(gaps), 3) if gaps else None,
                                  "interval_ms_max": round(1e3 * max(gaps), 3) if gaps else None, "idle_w": lo, "load_w": hi,
                                  "rate_up_after_load_start_ms": round(1e3 * (up - marks["load_start_s"]), 1) if up else None,
                                  "rate_down_after_load_end_ms": round(1e3 * (down - marks["load_end_s"]), 1) if down else None},
                      "watts_between_changes": rates, "changes": changes}, indent=1))


if __name__ == "__main__":
    main()
