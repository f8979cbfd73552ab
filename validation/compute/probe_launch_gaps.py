"""What separate CUDA graphs cost the GPU between them (the device machine: torch with CUDA). The replays launch
each op group, or each stretch of them between two synchronisations with the copy stream, as its own graph, with
event records and waits between; the simulator charges compute.op_group_launch_ns per group. Timed with CUDA events
on the GPU's clock, the host well ahead behind a spin, medians over `--repeats`:

- chain: N x K GEMVs (over distinct weights, 1.5 MiB each, a few us) in one graph: each kernel's own time;
- graphs: the same kernels as N graphs of K launched back to back;
- graphs_record / graphs_wait / graphs_wait_record: with an event recorded after each graph, a wait for an event
  another stream has passed before each, or both (what the replay puts between its graphs);

per mode and K, the time each graph adds over its K kernels in the chain (us_per_graph_over_chain).

    python validation/compute/probe_launch_gaps.py > validation/compute/h200-launch-gaps.json
"""

import argparse
import json
import statistics

import torch

SPIN_CYCLES = 200_000_000  # ~0.1 s: the host enqueues N graph launches (and events) through PyTorch meanwhile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--graphs", type=int, default=64)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_launch_gaps: needs a CUDA GPU")
    dev = torch.device("cuda")
    n = a.graphs
    cs, other = torch.cuda.Stream(), torch.cuda.Stream()
    v = torch.randn(1536, dtype=torch.bfloat16, device=dev)
    o = torch.empty(512, dtype=torch.bfloat16, device=dev)
    out = {}
    for k in (1, 5, 15):
        ws = [torch.randn(512, 1536, dtype=torch.bfloat16, device=dev) for _ in range(n * k)]

        def capture(weights):
            for w in weights:
                torch.mv(w, v, out=o)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for w in weights:
                    torch.mv(w, v, out=o)
            return g
        chain = capture(ws)
        graphs = [capture(ws[i * k:(i + 1) * k]) for i in range(n)]
        passed = torch.cuda.Event()
        passed.record(other)
        torch.cuda.synchronize()

        def timed(mode: str) -> float:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            marks = [torch.cuda.Event() for _ in range(n)]
            torch.cuda.synchronize()
            with torch.cuda.stream(cs):
                torch.cuda._sleep(SPIN_CYCLES)
                begin.record(cs)
                if mode == "chain":
                    chain.replay()
                else:
                    for g, m in zip(graphs, marks):
                        if "wait" in mode:
                            cs.wait_event(passed)
                        g.replay()
                        if "record" in mode:
                            m.record(cs)
                end.record(cs)
            torch.cuda.synchronize()
            return 1e3 * begin.elapsed_time(end)

        modes = ("chain", "graphs", "graphs_record", "graphs_wait", "graphs_wait_record")
        times = {m: [] for m in modes}
        for i in range(2 + a.repeats):
            for m in modes:
                t = timed(m)
                if i >= 2:
                    times[m].append(t)
        med = {m: statistics.median(x) for m, x in times.items()}
        out[f"K={k}"] = {"kernels_per_graph": k, "graphs": n, "median_us": {m: round(x, 3) for m, x in med.items()},
                         "us_per_kernel_in_chain": round(med["chain"] / (n * k), 3),
                         "us_per_graph_over_chain": {m: round((med[m] - med["chain"]) / n, 3) for m in modes[1:]}}
        del ws, chain, graphs
    print(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "repeats": a.repeats,
                      "gemv": "512 x 1536 bf16, distinct weights per kernel", "results": out}, indent=1))


if __name__ == "__main__":
    main()
