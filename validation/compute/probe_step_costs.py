"""What one compute step of the replay costs the GPU, back to back, beside copies and right after a wait for one
(the device machine: torch with CUDA; without a GPU, a dry run of the same program on the CPU).

With every compute step timed (hwreplay --op-spans) the H100's PCIe-bound replays spent 20.6 µs in each expert
step against the simulator's 13.6 (its kernels' profiled times plus compute.op_group_launch_ns), while the same
kernels in long segment graphs with the experts cached matched it. Here the replay's own op groups (chipsim.hwreplay
.harness.GpuDecodeStep, the config's model) are timed with CUDA events, `--steps` of each kind over distinct weights
(an expert: its gate-up, SiLU, product and down kernels; combine; attention and router, two graphs; and a layer:
attention, router, shared experts, the model's top-k experts and combine as ONE graph, as `--segments` launches a run
of compute), the host well ahead behind a spin, medians over `--repeats`:

- kernels_alone: each kernel of the group chained alone over rotating weights (the profile's method,
  chipsim.hwreplay.microbench.op_times), summed over the group: what the config's op_times_ns say on this lease;
- chain: every step's kernels in one graph; graphs: one graph per op group, the steps back to back (what
  compute.op_group_launch_ns is for); spans: the same with a timing event before and after each step (what
  --op-spans adds), and the spans themselves; records / plain_records: two event records per step (one event recorded
  twice, as a span's two) and nothing else, with timing (as --stalls and --op-spans record) or without (as a
  program's own synchronisation); waits_passed: a
  wait for an event passed long before, then the step;
- *_beside_copies: the same while host-to-device copies (`--copy-bytes` each, from pinned memory) run throughout on
  the copy stream, none waited for (beside_one_copy: one 512 MiB copy instead): what compute.launch_beside_copy_ns is
  (gpuconfig --step-costs);
- after_copy: each step waits for its own copy's event first (the copies enqueued ahead, one after another, so the
  next copies run beside the step), as an expert that stalled for its bytes; its span, and from the copy's end to
  the step's first event (the hand-off: meaningful only where a copy outlasts a step, else the steps queue behind
  one another and the copies end long before them); after_copy_alone: each copy starts only after the previous
  step ends (a wait, nothing beside); round_trips: the same with events that record no time (the dependent chain
  of an on-demand fetch, as a program runs it).

    python validation/compute/probe_step_costs.py --config hwconfigs/h100-pcie5.yaml > validation/h100/h100-step-costs.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from chipsim.hw.config import load_config
from chipsim.hwreplay.harness import GpuDecodeStep, _sync_api, capture_graph
from chipsim.hwreplay.microbench import op_times
from chipsim.hwreplay.ops import primitive_ops
from chipsim.workload.models import model_of

KINDS = {"expert": ("expert",), "combine": ("combine",), "attention+router": ("attention", "router"),
         "layer": ("attention", "router", "shared", "expert", "combine")}
# "layer": an MoE layer's op groups in the replay's order (attention, router, the shared experts where the model has
# them, its top-k experts, the weighted sum) launched as ONE graph, as `--segments` launches a run of compute with no
# wait inside it; "chain" then puts every layer in one graph, as a token whose experts are all cached
SEGMENT_KINDS = ("layer",)
# mode: what runs on the compute stream (each step's graphs, with an event before and after each step where "spans",
# or only events where "records": one event per step recorded twice, as a span's before and after, a timing event or
# a "plain" one; a wait for an event the copy stream passed long before, then the graphs, where "waits"), and what
# runs on the copy stream beside it ("queue": copies of copy_bytes enqueued back to back, outlasting the steps;
# "one": a single 512 MiB copy; "ahead": step i waits for copy i, the copies enqueued one after another; "serial":
# copy i starts after step i-1 ends; "plain": the events the copies and steps wait for record no time, as a
# program's own)
MODES = {
    "chain": {"chain": True},
    "graphs": {},
    "spans": {"spans": True},
    "records": {"records": True},
    "graphs_beside_copies": {"beside": "queue"},
    "spans_beside_copies": {"spans": True, "beside": "queue"},
    "records_beside_copies": {"records": True, "beside": "queue"},
    "plain_records": {"records": "plain"},
    "plain_records_beside_copies": {"records": "plain", "beside": "queue"},
    "waits_passed": {"waits": True},
    "waits_passed_beside_copies": {"waits": True, "beside": "queue"},
    "graphs_beside_one_copy": {"beside": "one"},
    "spans_beside_one_copy": {"spans": True, "beside": "one"},
    "after_copy": {"spans": True, "after": "ahead"},
    "after_copy_alone": {"spans": True, "after": "serial"},
    "round_trips": {"after": "serial", "plain": True},
}
ONE_COPY_BYTES = 512 << 20
HOST_US_PER_COPY = 60.0  # what the host needs at most to enqueue one copy through PyTorch (its spins cover this)


class Gpu:
    """The calls the probe makes, on CUDA or (a dry run) in order on the CPU: the replay harness's own."""

    def __init__(self, device: torch.device):
        stream, self._event, self.on, _, self.synchronize = _sync_api(device)
        self.cuda = device.type == "cuda"
        self.device = device
        self.cs, self.xs = stream(), stream()
        self.spin_cycles_per_us = 0.0
        if self.cuda:
            from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms

            self.spin_cycles_per_us = sleep_cycles_per_ms(device) / 1e3

    def event(self, timing: bool = True):
        return self._event(enable_timing=timing)

    def spin(self, us: float) -> None:
        if self.cuda:
            torch.cuda._sleep(int(us * self.spin_cycles_per_us))

    @staticmethod
    def wait(stream, ev) -> None:
        stream.wait_event(ev)

    def graph(self, calls: list) -> list:
        """calls as one CUDA graph's launch (on the CPU: the calls themselves)."""
        return [(capture_graph(calls).replay, (), {})] if self.cuda else calls


def _run(calls) -> None:
    for fn, args, kwargs in calls:
        fn(*args, **kwargs)


def _experts_per_step(kind: str, top_k: int) -> int:
    """How many experts one step of `kind` computes: a layer's top-k, else one (the "expert" kind's)."""
    return top_k if kind in SEGMENT_KINDS else 1


def _group_calls(step: GpuDecodeStep, slots: torch.Tensor, kind: str, i: int, top_k: int) -> list:
    """Step i's calls, one list per op group the model has, each over its own weights (its experts from the slots
    in turn)."""
    k = _experts_per_step(kind, top_k)
    out = []
    for g in KINDS[kind]:
        if g == "expert":
            out += [step.expert_calls(slots[(i * k + j) % len(slots)]) for j in range(k)]
        elif g in step.groups:
            out.append(step.group_calls(g, i))
    return out


def build_steps(step: GpuDecodeStep, slots: torch.Tensor, kind: str, n: int, gpu: Gpu, top_k: int
                ) -> tuple[list, list]:
    """n steps of one kind, each over its own weights: (raw kernel calls per step, graph launches per step: one per
    op group, or one per step for a segment kind)."""
    raw, launches = [], []
    for i in range(n):
        per_group = _group_calls(step, slots, kind, i, top_k)
        raw.append([c for calls in per_group for c in calls])
        launches.append(gpu.graph(raw[-1]) if kind in SEGMENT_KINDS
                        else [c for calls in per_group for c in gpu.graph(calls)])
    return raw, launches


class Copies:
    """Host-to-device copies on the copy stream from a 512 MiB pinned buffer: parts of `size` bytes in turn, or the
    whole buffer at once."""

    def __init__(self, size: int, gpu: Gpu):
        self.size, self.gpu = size, gpu
        self.src = torch.empty(ONE_COPY_BYTES, dtype=torch.uint8, pin_memory=gpu.cuda).fill_(1)
        self.dst = torch.empty(ONE_COPY_BYTES, dtype=torch.uint8, device=gpu.device)
        self.parts = ONE_COPY_BYTES // size
        self.us = self._copy_us()

    def _copy_us(self, n: int = 16) -> float:
        """One part's copy time, back to back (median of 3 runs of n)."""
        runs = []
        for _ in range(3):
            a, b = self.gpu.event(), self.gpu.event()
            with self.gpu.on(self.gpu.xs):
                self.gpu.spin(HOST_US_PER_COPY * n)  # the host enqueues the copies meanwhile
                a.record(self.gpu.xs)
            for i in range(n):
                self.enqueue(i)
            with self.gpu.on(self.gpu.xs):
                b.record(self.gpu.xs)
            self.gpu.synchronize()
            runs.append(1e3 * a.elapsed_time(b) / n)
        return statistics.median(runs)

    def enqueue(self, i: int, after=None, whole: bool = False, timing: bool = True):
        """Copy part i (or the whole buffer) after `after` (an event), and its end's event."""
        done = self.gpu.event(timing)
        first, size = (0, ONE_COPY_BYTES) if whole else ((i % self.parts) * self.size, self.size)
        with self.gpu.on(self.gpu.xs):
            if after is not None:
                self.gpu.wait(self.gpu.xs, after)
            self.dst[first:first + size].copy_(self.src[first:first + size], non_blocking=True)
            done.record(self.gpu.xs)
        return done

    def count(self, how: str, us: float) -> int:
        """How many copies outlast `us`: parts for twice that long, or the one big copy."""
        return 1 if how == "one" else int(2 * us / max(self.us, 1e-3)) + 8

    def beside(self, how: str, us: float, after):
        """The copies that outlast `us` from `after` (an event): the last one's end event."""
        last = None
        for i in range(self.count(how, us)):
            last = self.enqueue(i, after if i == 0 else None, whole=how == "one")
        return last


def _enqueue_steps(spec: dict, launches: list, chain: list, copies: Copies, gpu: Gpu, begin, spans: list,
                   passed) -> list:
    """The compute stream's work after `begin` (copies the steps wait for go on the copy stream): the copies' end
    events each step waited for."""
    copy_ends = []
    if spec.get("chain"):
        _run(chain)
        return copy_ends
    if spec.get("after") == "ahead":  # the first copy starts with the steps, the rest follow it
        copy_ends = [copies.enqueue(i, begin if i == 0 else None) for i in range(len(launches))]
    ends = []  # "plain": an event after each step, which the next copy waits for
    for i, calls in enumerate(launches):
        if spec.get("after") == "serial":
            last = (ends[-1] if spec.get("plain") else spans[i - 1][1]) if i else begin
            copy_ends.append(copies.enqueue(i, last, timing=not spec.get("plain")))
        if copy_ends:
            gpu.wait(gpu.cs, copy_ends[i])
        if spec.get("waits"):
            gpu.wait(gpu.cs, passed)
        if spans:
            spans[i][0].record(gpu.cs)
        if not spec.get("records"):
            _run(calls)
        if spans:
            spans[i][1].record(gpu.cs)
        if spec.get("plain"):
            ends.append(gpu.event(False))
            ends[-1].record(gpu.cs)
    return copy_ends


def timed(mode: str, launches: list, chain: list, copies: Copies, gpu: Gpu, lead_us: float) -> dict:
    """One run of `mode` over the steps: {"total_us": per step, "spans_us": [...], "handoff_us": [...],
    "copies_outlast": bool}."""
    spec, n = MODES[mode], len(launches)
    begin, end = gpu.event(), gpu.event()
    spans = [(gpu.event(), gpu.event()) for _ in range(n)] if spec.get("spans") else []
    if spec.get("records"):  # one event per step, recorded twice: as a span's "before" and, the same event, its "after"
        spans = [(ev, ev) for ev in (gpu.event(spec["records"] is True) for _ in range(n))]
    passed = gpu.event(False)
    with gpu.on(gpu.xs):
        passed.record(gpu.xs)
    gpu.synchronize()
    steps_us = 100.0 * n  # longer than any kind's steps take beside copies
    queued = copies.count(spec["beside"], steps_us) if "beside" in spec else 0
    waited = n if "after" in spec else 0  # the copies the steps wait for
    with gpu.on(gpu.cs):
        gpu.spin(lead_us + HOST_US_PER_COPY * (queued + waited))  # the host enqueues every copy and step meanwhile
        begin.record(gpu.cs)
    beside = copies.beside(spec["beside"], steps_us, begin) if queued else None  # they start with the steps
    with gpu.on(gpu.cs):
        copy_ends = _enqueue_steps(spec, launches, chain, copies, gpu, begin, spans, passed)
        end.record(gpu.cs)
    gpu.synchronize()
    out = {"total_us": 1e3 * begin.elapsed_time(end) / n,
           "spans_us": [1e3 * a.elapsed_time(b) for a, b in spans] if spec.get("spans") else [],
           "handoff_us": [1e3 * (begin.elapsed_time(s[0]) - begin.elapsed_time(c)) for c, s in zip(copy_ends, spans)
                          if not spec.get("plain")]}
    if beside is not None:
        out["copies_outlast"] = begin.elapsed_time(beside) > begin.elapsed_time(end)
    return out


def _median(xs: list) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def measure_kind(kind: str, step, slots, copies: Copies, gpu: Gpu, n: int, repeats: int, top_k: int) -> dict:
    raw, launches = build_steps(step, slots, kind, n, gpu, top_k)
    chain = gpu.graph([c for calls in raw for c in calls])
    lead_us = 200.0 + 30.0 * n  # the host enqueues the steps (and their events, waits and copies) meanwhile
    res = {}
    for mode in MODES:
        runs = [timed(mode, launches, chain, copies, gpu, lead_us) for _ in range(2 + repeats)][2:]
        row = {"us_per_step": _median([r["total_us"] for r in runs])}
        spans = [s for r in runs for s in r["spans_us"]]
        if spans:
            row["span_us"] = _median(spans)
            ordered = sorted(spans)
            row["span_p10_p90_us"] = [round(ordered[len(spans) // 10], 3), round(ordered[9 * len(spans) // 10], 3)]
        handoff = [h for r in runs for h in r["handoff_us"]]
        if handoff:
            row["handoff_us"] = _median(handoff)
        if "beside" in MODES[mode]:
            row["copies_outlast_every_run"] = all(r["copies_outlast"] for r in runs)
        res[mode] = row
    return res


def step_prims(prims_of: dict, kind: str, top_k: int) -> list:
    """One step's primitives in order, as _group_calls launches them (groups the model lacks left out)."""
    out = []
    for g in KINDS[kind]:
        if g in prims_of:
            out += prims_of[g] * (_experts_per_step(kind, top_k) if g == "expert" else 1)
    return out


def config_step_us(hw, prims_of: dict, kind: str, top_k: int) -> dict:
    """What the config charges one step of `kind`: its kernels' op_times_ns and op_group_launch_ns per graph."""
    t = hw.compute.op_times_ns
    prims = step_prims(prims_of, kind, top_k)
    missing = sorted({p.key for p in prims if p.key not in t})
    kernels = sum(t.get(p.key, 0.0) for p in prims) / 1e3
    graphs = 1 if kind in SEGMENT_KINDS else len(KINDS[kind])
    launch_us = hw.compute.op_group_launch_ns * graphs / 1e3
    return {"graphs_per_step": graphs, "kernels_us": round(kernels, 3), "launch_us": round(launch_us, 3),
            "step_us": round(kernels + launch_us, 3),
            **({"not_profiled": missing} if missing else {})}


def kernels_alone_us(prims_of: dict, kind: str, gpu: Gpu, top_k: int) -> float | None:
    """The group's kernels each chained alone (microbench.op_times, the profile's method), summed: µs."""
    if not gpu.cuda:
        return None
    prims = step_prims(prims_of, kind, top_k)
    unique = list({p.key: p for p in prims}.values())
    rows = {r["key"]: r["graph_us"] for r in op_times(gpu.device, [(p, [kind]) for p in unique], pool_mib=1024)}
    return round(sum(rows[p.key] for p in prims), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="hwconfigs/h100-pcie5.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--copy-bytes", type=int, default=0, help="each copy's size (default: one expert's bytes)")
    a = ap.parse_args()
    gpu = Gpu(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    hw = load_config(a.config, a.set).hw
    prims_of = primitive_ops(hw)
    step = GpuDecodeStep(prims_of, a.steps, 0, gpu.device)
    slots = torch.empty((a.steps, step.expert_bytes), dtype=torch.uint8, device=gpu.device)
    slots.view(torch.bfloat16).normal_() if step.expert_bytes % 2 == 0 else slots.random_(0, 64)
    copies = Copies(a.copy_bytes or step.expert_bytes, gpu)
    out = {"device": torch.cuda.get_device_name() if gpu.cuda else "cpu (dry run: no timing is meaningful)",
           "torch": torch.__version__, "config": a.config, "overrides": a.set, "steps": a.steps, "repeats": a.repeats,
           "copy_bytes": copies.size, "copy_us": round(copies.us, 3), "one_copy_bytes": ONE_COPY_BYTES, "kinds": {}}
    top_k = model_of(hw.model).top_k
    for kind in KINDS:
        out["kinds"][kind] = {"config": config_step_us(hw, prims_of, kind, top_k),
                              "kernels_alone_us": kernels_alone_us(prims_of, kind, gpu, top_k),
                              **measure_kind(kind, step, slots, copies, gpu, a.steps, a.repeats, top_k)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
