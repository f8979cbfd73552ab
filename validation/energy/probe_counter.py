"""How the board's NVML energy counter moves, and which way of reading it gives a load's true energy (the device
machine: torch with CUDA, nvidia-ml-py). The counter is polled as fast as the host can while the GPU runs:

1. idle, then a steady load (an HBM-bound GEMV replayed back to back in CUDA graphs) for 3 s, then idle: every
   change of the counter, so its update interval and how long after the load starts and stops its rate moves;
2. a square wave (100 ms of load, 100 ms idle, for 2 s): whether the counter integrates the power or samples it;
3. the same load for 0.25, 0.5, 1, 2 and 4 s, each read two ways: `naive`, the counter read right before the
   load is enqueued and right after the GPU finishes (as the replay harness read it before); `settled`, by
   chipsim.hwreplay.nvml.Meter, the replays' own reading (from a counter step after `--settle` s of idle to one
   after `--settle` s of idle, less the idle power measured just before over the window's idle part). A way of
   reading that is right gives the same energy per second of load at every length.

Prints JSON; the replay harness's energy window (chipsim.hwreplay.nvml) is chosen from it.

    python validation/energy/probe_counter.py > validation/energy/h200-energy-counter.json

(The committed file was written before step 3 called nvml.Meter: it spelled out the same reading, polling for
the same counter steps, with one step less of idle before the idle power.)
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
from chipsim.hwreplay.nvml import Meter  # noqa: E402
from probe_energy import board  # noqa: E402  (validation/energy/probe_energy.py)


class Counter:
    """Polls the counter; remembers every change as [seconds since t0, mJ]."""

    def __init__(self, gpu) -> None:
        self.h, self.n = gpu._handle, gpu._nvml
        self.t0 = time.perf_counter()
        self.last = int(self.n.nvmlDeviceGetTotalEnergyConsumption(self.h))
        self.changes = [[0.0, self.last]]
        self.polls = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def poll(self) -> bool:
        v = int(self.n.nvmlDeviceGetTotalEnergyConsumption(self.h))
        self.polls += 1
        if v != self.last:
            self.changes.append([round(self.now(), 6), v])
            self.last = v
            return True
        return False

    def poll_for(self, seconds: float) -> None:
        end = self.now() + seconds
        while self.now() < end:
            self.poll()

    def next_change(self) -> list:
        """Spin until the counter moves; its new value and when."""
        while not self.poll():
            pass
        return self.changes[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds after a load before the settled read")
    a = ap.parse_args()
    gpu = board("probe_counter")
    w = torch.empty(16384, 16384, dtype=torch.bfloat16, device="cuda").normal_()  # 512 MiB: an HBM-bound GEMV
    x = torch.randn(16384, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(16384, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.mv(w, x, out=y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(40):
                torch.mv(w, x, out=y)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    graph_s = (time.perf_counter() - t) / 20
    stream = torch.cuda.current_stream()
    c = Counter(gpu)

    def load(seconds: float) -> tuple[float, float]:
        """Enqueue `seconds` of GEMVs on an idle GPU and poll until they finish: (start, end) on c's clock."""
        start = c.now()
        for _ in range(max(1, round(seconds / graph_s))):
            g.replay()
        while not stream.query():
            c.poll()
        return start, c.now()

    # 1. a steady load
    c.poll_for(1.5)
    step_start, step_end = load(3.0)
    c.poll_for(1.5)
    # 2. a square wave
    wave = []
    for _ in range(10):
        wave.append(load(0.1))
        c.poll_for(0.1)
    c.poll_for(1.0)
    n_step = len(c.changes)

    # 3. loads of several lengths, each read by nvml.Meter, the plain two-reading window beside it
    lengths = []
    for seconds in (0.25, 0.5, 1.0, 2.0, 4.0, 0.25, 0.5, 1.0, 2.0, 4.0):
        meter = Meter(gpu, a.settle)
        meter.start()
        start, end = load(seconds)
        w = meter.stop(end - start)
        lengths.append({"seconds": round(end - start, 4), "idle_w": w["idle_w"],
                        "naive_w_above_idle": round(w["naive_energy_j"] / (end - start) - w["idle_w"], 2),
                        "settled_w_above_idle": round(w["power_w"] - w["idle_w"], 2)})

    ch = c.changes[:n_step]
    gaps = [b[0] - a_[0] for a_, b in zip(ch, ch[1:])]
    rates = [[b[0], round((b[1] - a_[1]) / (b[0] - a_[0]) / 1e3, 1)] for a_, b in zip(ch, ch[1:])]
    loaded = [r for t, r in rates if step_start + 0.5 < t < step_end]
    idle = [r for t, r in rates if t < step_start]
    hi, lo = statistics.median(loaded), statistics.median(idle)
    mid = (hi + lo) / 2
    up = next((t for t, r in rates if t > step_start and r > mid), None)
    down = next((t for t, r in rates if t > step_end and r < mid), None)
    on = sum(e - s_ for s_, e in wave)
    wave_span = [wave[0][0], wave[-1][1] + 0.1]
    in_wave = [p for p in ch if wave_span[0] <= p[0] <= wave_span[1] + 0.5]
    print(json.dumps({
        "machine": gpu.describe(), "polls": c.polls, "graph_ms": round(1e3 * graph_s, 3), "settle_s": a.settle,
        "summary": {"interval_ms_median": round(1e3 * statistics.median(gaps), 3), "interval_ms_max": round(1e3 * max(gaps), 3),
                    "idle_w": lo, "load_w": hi,
                    "rate_up_after_load_start_ms": round(1e3 * (up - step_start), 1) if up else None,
                    "rate_down_after_load_end_ms": round(1e3 * (down - step_end), 1) if down else None,
                    "wave_duty": round(on / (wave_span[1] - wave_span[0]), 3),
                    "wave_w_over_its_span": round((in_wave[-1][1] - in_wave[0][1]) / 1e3 / (in_wave[-1][0] - in_wave[0][0]), 1)
                    if len(in_wave) > 1 else None},
        "step": {"start_s": round(step_start, 6), "end_s": round(step_end, 6)},
        "wave": [[round(s_, 6), round(e, 6)] for s_, e in wave],
        "lengths": lengths,
        "watts_between_changes": rates, "changes": ch}, indent=1))


if __name__ == "__main__":
    main()
