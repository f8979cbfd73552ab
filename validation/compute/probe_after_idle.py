"""A kernel's time after the GPU has idled, timed alone (the device machine: torch with CUDA). In the PCIe-bound and
4-bit replays every compute step inside a token ran 30-50 % longer than the same kernels alone back to back
(hwreplay --op-spans), while copies running beside kernels cost them nothing (probe_handoff.py, under_copies):
what differs is that the GPU idles between them, waiting for copies. Here one expert's kernels (a CUDA graph of
Granite-3B's gate, up and down GEMVs over weights no cache holds: each of 64 experts in turn) are timed with CUDA
events:

- back_to_back: the 64 graphs one after another behind a spin (the GPU never idles): µs per graph;
- after_idle: each graph launched once the GPU has been idle `gap` µs (the host synchronises, then waits), for
  gaps of 0-10,000 µs, behind a 30 µs one-block spin that hides the host's own launch call: the graph's own time
  (an event right before and right after it on its stream), median, and the SM clock NVML reads just before the
  launch (where pynvml is installed). (A first version had no spin: its spans held the host's launch call, about
  4 µs at every gap.)

    python validation/compute/probe_after_idle.py > validation/h100/h100-after-idle.json
"""

import argparse
import json
import statistics
import time

import torch

from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms

HIDDEN, FFN = 1536, 512  # Granite-3B's expert: d_model 1536, expert FFN 512 (gate, up: 1536 -> 512; down: 512 -> 1536)
GAPS_US = (0, 20, 100, 500, 2000, 10000)


def _nvml_clock():
    """A reader of the SM clock in MHz (None without pynvml)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception:  # no NVML: clocks are not read
        return None


def _expert_graphs(n: int, stream) -> list:
    """n CUDA graphs, each one expert's three GEMVs over its own weights (BF16)."""
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    graphs = []
    for _ in range(n):
        gate = torch.randn(HIDDEN, FFN, device="cuda", dtype=torch.bfloat16)
        up = torch.randn(HIDDEN, FFN, device="cuda", dtype=torch.bfloat16)
        down = torch.randn(FFN, HIDDEN, device="cuda", dtype=torch.bfloat16)
        with torch.cuda.stream(stream):
            (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down  # warm the kernels once
            stream.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down
        graphs.append((g, gate, up, down))
    return graphs


def _wait_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def back_to_back(graphs: list, stream, repeats: int) -> dict:
    per = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000)
            a.record(stream)
            for g, *_ in graphs:
                g.replay()
            b.record(stream)
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / len(graphs))
    return {"us_per_graph": round(statistics.median(per), 3), "repeats": repeats}


def after_idle(graphs: list, stream, gap_us: float, clock, spin: int) -> dict:
    times, clocks = [], []
    for i, (g, *_) in enumerate(graphs * 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        _wait_us(gap_us)
        if clock is not None:
            clocks.append(clock())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(spin)  # one block, ~30 µs: the host's calls below are enqueued before the GPU needs them
            a.record(stream)
            g.replay()
            b.record(stream)
        b.synchronize()
        if i >= 4:  # the first few wake the clocks after the previous case
            times.append(a.elapsed_time(b) * 1e3)
    s = sorted(times)
    out = {"gap_us": gap_us, "us_per_graph": round(statistics.median(s), 3), "p10": round(s[len(s) // 10], 3),
           "p90": round(s[9 * len(s) // 10], 3), "n": len(s)}
    if clocks:
        out["sm_clock_mhz_median"] = statistics.median(clocks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    stream = torch.cuda.Stream()
    graphs = _expert_graphs(64, stream)
    clock = _nvml_clock()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "expert": f"gate, up {HIDDEN}x{FFN}, down {FFN}x{HIDDEN} bf16, 64 experts' weights in turn",
           "back_to_back": back_to_back(graphs, stream, a.repeats),
           "after_idle": [after_idle(graphs, stream, gap, clock, int(30 * sleep_cycles_per_ms(torch.device("cuda")) / 1e3))
                          for gap in GAPS_US]}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
