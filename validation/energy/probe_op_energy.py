"""The energy of each kernel shape of the decode steps, alone, from the board's NVML energy counter (the device
machine: torch with CUDA, nvidia-ml-py). Each shape runs as the op-times microbenchmark runs it (its kernel over
weights rotating through 2 GiB, a chain in one CUDA graph: chipsim.hwreplay.microbench.shape_chain), replayed
back to back for `--seconds`, read by chipsim.hwreplay.nvml.Meter (`--settle` s of idle each side); idle windows
(nothing running, clocks up) open and close the run.

    python validation/energy/probe_op_energy.py --shapes-from hwconfigs/h200-pcie5.yaml \
        hwconfigs/h200-pcie5-deepseek-v2-lite.yaml --contexts 1024,8192,32768 > validation/energy/h200-op-energy.json

chipsim.hwreplay.energy_table.op_energy_rows turns the windows into each kernel's energy above idle, to set beside
what the H200 config's energy table charges that operation (hwcompare --op-energy), and gpuconfig --op-energy
writes them into the config (compute.op_energy_pj). The 4-bit experts' shapes, those not in an earlier file:

    python validation/energy/probe_op_energy.py --shapes-from hwconfigs/h200-pcie5.yaml \
        hwconfigs/h200-pcie5-deepseek-v2-lite.yaml --contexts 1024 --set model.expert_bits=4 \
        --skip-in validation/energy/h200-op-energy-settled.json > validation/energy/h200-op-energy-q4.json

A shape with no kernel of its own (the 4-bit dequantisation, fused into its matvecs) is listed as a "fused"
window with no energy: the matvecs' windows hold it.
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
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. model.expert_bits=4")
    ap.add_argument("--skip-in", nargs="*", default=[], metavar="FILE", help="earlier outputs: their shapes are not run again")
    a = ap.parse_args()
    skip = set()
    for path in a.skip_in:
        with open(path) as f:
            skip.update(w["key"] for w in json.load(f)["windows"] if w.get("key"))
    gpu = board("probe_op_energy")
    dev = torch.device("cuda")
    shapes = [(p, users) for p, users in decode_shapes(a.shapes_from, [int(c) for c in a.contexts.split(",")], a.set)
              if p.key not in skip]
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
        if p.fused:  # no kernel of its own: its energy is in the kernels it is fused into
            windows.append({"kind": "fused", "key": p.key, "users": users})
            continue
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
                      "shapes_from": a.shapes_from, "contexts": a.contexts, "set": a.set, "skip_in": a.skip_in,
                      "windows": windows}, indent=1))


if __name__ == "__main__":
    main()
