"""The energy of each kernel shape of the decode steps, alone, from the board's NVML energy counter (the device
machine: torch with CUDA, nvidia-ml-py). Each shape runs as the op-times microbenchmark runs it (its kernel over
weights rotating through 2 GiB, a chain in one CUDA graph: chipsim.hwreplay.microbench.shape_chain), replayed
back to back for `--seconds`, read by chipsim.hwreplay.nvml.Meter (`--settle` s of idle each side); idle windows
(nothing running, clocks up) open and close the run.

    python validation/energy/probe_op_energy.py --shapes-from hwconfigs/h200-pcie5.yaml \
        hwconfigs/h200-pcie5-deepseek-v2-lite.yaml --contexts 1024,8192,32768 > validation/energy/h200-op-energy.json

chipsim.hwreplay.energy_table.op_energy_rows turns the windows into each kernel's energy above idle, to set beside
what the H200 config's energy table charges that operation (hwcompare --op-energy).
"""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
from chipsim.hwreplay.harness import capture_graph  # noqa: E402
from chipsim.hwreplay.microbench import chain_buffers, decode_shapes, shape_chain  # noqa: E402
from probe_energy import board, measured  # noqa: E402  (validation/energy/probe_energy.py)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes-from", nargs="+", required=True, metavar="CONFIG")
    ap.add_argument("--contexts", default="1024")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds each side of a window (nvml.Meter; 0: none)")
    a = ap.parse_args()
    gpu = board("probe_op_energy")
    dev = torch.device("cuda")
    shapes = decode_shapes(a.shapes_from, [int(c) for c in a.contexts.split(",")])
    pool, x, sa, sb, out = chain_buffers(shapes, dev)
    windows = []

    def measure(kind: str, run, **fields) -> None:
        row = {"kind": kind, **fields, **measured(gpu, run, a.seconds, a.settle)}  # probe_energy's window: same counter reads
        windows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def idle() -> None:
        time.sleep(0.05)

    measure("idle", idle)
    for p, users in shapes:
        chain = shape_chain(p, pool, x, sa, sb, out)
        graph = capture_graph(chain)

        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        reps = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-6)))  # ~20 ms per call: few host gaps

        def run(graph=graph, reps=reps):
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
        measure("op", run, key=p.key, users=users, kernels_per_call=reps * len(chain))
        del graph
    measure("idle", idle)
    print(json.dumps({"machine": gpu.describe(), "torch": torch.__version__, "seconds_per_window": a.seconds, "settle_s": a.settle,
                      "shapes_from": a.shapes_from, "contexts": a.contexts, "windows": windows}, indent=1))


if __name__ == "__main__":
    main()
