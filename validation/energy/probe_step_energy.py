"""A decode step's kernels run together against the same kernels run alone, for energy, on one board (the device
machine: torch with CUDA, nvidia-ml-py). On the settled lease the sum of each kernel's energy alone (a chain of
its own shape) overpriced a cached replay's energy above idle by 14-19 % at context 1,024 while the chains' times
summed to the token's time (validation/NOTES.md). This separates the candidates:

- `step`: one token's compute, every kernel of the step in its order (attention, router, shared experts, top-k
  experts each over its own weights, combine; the head), captured as one CUDA graph and replayed back to back
  for `--seconds`: no copies, no events, no host;
- `groups`: the same kernels, one CUDA graph per op group launched back to back (as `hwreplay --graphs`);
- `op`: each distinct kernel shape of the step alone, as probe_op_energy.py runs it;
- `idle` windows before and after.

Every window is read by chipsim.hwreplay.nvml.Meter. If `step` comes out at the chains' sum, what the replays
add (copies, cross-stream waits, stalls) is the difference; if below it, running kernels of different shapes in
turn draws less than running each back to back.

    python validation/energy/probe_step_energy.py hwconfigs/h200-pcie5.yaml --context 1024 > OUT.json
    python validation/energy/probe_step_energy.py hwconfigs/h200-pcie5.yaml --device cpu   # a dry run, no energy
"""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), HERE]
from chipsim.hwreplay.harness import GpuDecodeStep, capture_graph  # noqa: E402
from chipsim.hwreplay.microbench import chain_buffers, shape_chain  # noqa: E402
from chipsim.hwreplay.ops import kernels_per_token, primitive_ops  # noqa: E402
from chipsim.runner import prepare  # noqa: E402


def token_groups(step: GpuDecodeStep, model, slots: torch.Tensor) -> list[list]:
    """One token's op groups in the replay's order, as lists of kernel calls; expert i of MoE layer l reads slot
    l * top_k + i (every routed expert its own weights, as in a decode step)."""
    out = []
    for layer in range(model.num_layers):
        if layer < model.first_dense_layers:
            out += [step.group_calls("attention", layer), step.group_calls("dense", layer)]
            continue
        moe = layer - model.first_dense_layers
        out.append(step.group_calls("attention", layer) + step.group_calls("router", layer))
        if "shared" in step.groups:
            out.append(step.group_calls("shared", layer))
        out += [step.expert_calls(slots[moe * model.top_k + i]) for i in range(model.top_k)]
        out.append(step.group_calls("combine", layer))
    out.append(step.group_calls("head", -1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--op-seconds", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    prep = prepare(a.config, [f"workload.context_length={a.context}"], ["lru"])
    model = prep.workload.model
    groups = primitive_ops(prep.config.hw)
    step = GpuDecodeStep(groups, model.num_layers, model.first_dense_layers, dev)
    slots = torch.empty((model.num_moe_layers * model.top_k, step.expert_bytes // 2 + 1), dtype=torch.bfloat16,
                        device=dev).normal_().view(torch.uint8)[:, :step.expert_bytes]
    token = token_groups(step, model, slots)
    kernels = sum(len(g) for g in token)
    prims = {p.key: p for ps in groups.values() for p in ps if not p.fused}  # each distinct shape, its launches
    count = {key: (prims[key], n) for key, n in kernels_per_token(prep.config.hw).items()}
    assert sum(n for _, n in count.values()) == kernels, "the token's kernels are the shapes' launches"
    if dev.type != "cuda":  # a dry run: every call once, in order
        for g in token:
            for fn, args, kw in g:
                fn(*args, **kw)
        print(json.dumps({"config": a.config, "context": a.context, "kernels_per_token": kernels, "shapes": len(count),
                          "dry_run": True}))
        return
    from probe_energy import board, measured  # validation/energy/probe_energy.py

    gpu = board("probe_step_energy")
    windows = []

    def measure(kind: str, run, seconds: float, **fields) -> None:
        row = {"kind": kind, **fields, **measured(gpu, run, seconds, a.settle)}
        windows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def timed(run) -> float:
        run()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    measure("idle", lambda: time.sleep(0.05), a.seconds)
    whole = capture_graph([c for g in token for c in g])
    per_group = [capture_graph(g) for g in token]
    for kind, launches in (("step", [whole]), ("groups", per_group)):
        def once(launches=launches):
            for gr in launches:
                gr.replay()
        reps = max(1, int(0.05 / timed(once)))  # ~50 ms per call: few host gaps

        def run(once=once, reps=reps):
            for _ in range(reps):
                once()
            torch.cuda.synchronize()
        measure(kind, run, a.seconds, tokens_per_call=reps, kernels_per_token=kernels, launches_per_token=len(launches))
    del whole, per_group
    pool, x, sa, sb, out = chain_buffers([(p, []) for p, _ in count.values()], dev)
    for key, (p, n) in count.items():
        chain = shape_chain(p, pool, x, sa, sb, out)
        graph = capture_graph(chain)
        reps = max(1, int(0.02 / timed(graph.replay)))

        def run(graph=graph, reps=reps):
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
        measure("op", run, a.op_seconds, key=key, per_token=n, kernels_per_call=reps * len(chain))
        del graph, chain
    measure("idle", lambda: time.sleep(0.05), a.seconds)
    print(json.dumps({"machine": gpu.describe(), "torch": torch.__version__, "config": a.config, "context": a.context,
                      "settle_s": a.settle, "kernels_per_token": kernels, "windows": windows}, indent=1))


if __name__ == "__main__":
    main()
