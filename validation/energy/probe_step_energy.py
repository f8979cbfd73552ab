"""A decode step's kernels run together against the same kernels run alone, for energy, on one board (the device
machine: torch with CUDA, nvidia-ml-py). On the settled lease the sum of each kernel's energy alone (a chain of
its own shape) overpriced a cached replay's energy above idle by 14-19 % at context 1,024 while the chains' times
summed to the token's time (validation/NOTES.md). This separates the candidates:

- `step`: one token's compute, every kernel of the step in its order (attention, router, shared experts, top-k
  experts each over its own weights, combine; the head), captured as one CUDA graph and replayed back to back
  for `--seconds`: no copies, no events, no host;
- `groups`: the same kernels, one CUDA graph per op group launched back to back (as `hwreplay --graphs`);
- `op`: each distinct kernel shape of the step alone, as probe_op_energy.py runs it;
- `idle` windows before and after;
- each group's GPU time inside the token (events between the per-group graphs, the host well ahead) against its
  kernels' times alone (`in_situ_against_alone`, by group label): where a step's time departs from the sum of
  its kernels alone, which groups do.

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
from chipsim.hwreplay.run import expert_slots  # noqa: E402
from chipsim.runner import prepare  # noqa: E402


def token_groups(step: GpuDecodeStep, model, slots: torch.Tensor) -> list[tuple[str, list]]:
    """One token's op groups in the replay's order, as (label, kernel calls); expert i of MoE layer l reads slot
    l * top_k + i (every routed expert its own weights, as in a decode step)."""
    out = []
    for layer in range(model.num_layers):
        if layer < model.first_dense_layers:
            out += [("attention", step.group_calls("attention", layer)), ("dense", step.group_calls("dense", layer))]
            continue
        moe = layer - model.first_dense_layers
        out.append(("attention+router", step.group_calls("attention", layer) + step.group_calls("router", layer)))
        if "shared" in step.groups:
            out.append(("shared", step.group_calls("shared", layer)))
        out += [("expert", step.expert_calls(slots[moe * model.top_k + i])) for i in range(model.top_k)]
        out.append(("combine", step.group_calls("combine", layer)))
    out.append(("head", step.group_calls("head", -1)))
    return out


def group_keys(groups: dict, label: str) -> list[str]:
    """The kernel shapes (op keys) of a token group labelled as token_groups labels it, in launch order."""
    return [p.key for name in label.split("+") for p in groups[name] if not p.fused]


def in_situ_ms(per_group: list, tokens: int = 5) -> list[float]:
    """Each group's GPU time inside a token, ms (median over `tokens`): events between the groups' graphs, all
    enqueued behind a spin long enough for the host to get ahead, so the GPU runs them back to back."""
    runs = []
    for _ in range(tokens):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(per_group) + 1)]
        torch.cuda.synchronize()
        torch.cuda._sleep(400_000_000)  # ~0.2 s: the host enqueues ~2 launches and records per group meanwhile
        marks[0].record()
        for graph, mark in zip(per_group, marks[1:]):
            graph.replay()
            mark.record()
        torch.cuda.synchronize()
        runs.append([a.elapsed_time(b) for a, b in zip(marks, marks[1:])])
    return [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(len(per_group))]


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
    slots = expert_slots(model.num_moe_layers * model.top_k, step.expert_bytes, dev)  # laid out as the replay's
    token = token_groups(step, model, slots)
    kernels = sum(len(g) for _, g in token)
    prims = {p.key: p for ps in groups.values() for p in ps if not p.fused}  # each distinct shape, its launches
    count = {key: (prims[key], n) for key, n in kernels_per_token(prep.config.hw).items()}
    assert sum(n for _, n in count.values()) == kernels, "the token's kernels are the shapes' launches"
    if dev.type != "cuda":  # a dry run: every call once, in order
        for label, g in token:
            assert len(g) == len(group_keys(groups, label)), "a group's kernels are its shapes"
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
    whole = capture_graph([c for _, g in token for c in g])
    per_group = [capture_graph(g) for _, g in token]
    situ = in_situ_ms(per_group)
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
    alone_ms: dict[str, float] = {}
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
        alone_ms[key] = 1e3 * windows[-1]["seconds"] / (windows[-1]["calls"] * reps * len(chain))
        del graph, chain
    measure("idle", lambda: time.sleep(0.05), a.seconds)
    by_label: dict[str, dict] = {}  # in situ against alone, summed over the token's groups of each label
    for (label, _), ms in zip(token, situ):
        row = by_label.setdefault(label, {"groups": 0, "in_situ_ms": 0.0, "alone_ms": 0.0})
        row["groups"] += 1
        row["in_situ_ms"] += ms
        row["alone_ms"] += sum(alone_ms[k] for k in group_keys(groups, label))
    for row in by_label.values():
        row["in_situ_ms"], row["alone_ms"] = round(row["in_situ_ms"], 4), round(row["alone_ms"], 4)
    print(json.dumps({"machine": gpu.describe(), "torch": torch.__version__, "config": a.config, "context": a.context,
                      "settle_s": a.settle, "kernels_per_token": kernels, "in_situ_against_alone": by_label,
                      "in_situ_ms_per_group": [[label, round(ms, 4)] for (label, _), ms in zip(token, situ)],
                      "windows": windows}, indent=1))


if __name__ == "__main__":
    main()
