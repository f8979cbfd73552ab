"""Replay a Plan on a CUDA GPU: real expert copies from pinned host memory, real kernels of the decode step.

Needs torch with CUDA. The model shape's expert weights live in pinned host memory (uninitialised: the
numbers do not change a copy's or a GEMV's time); a bounded GPU buffer of `plan.slots` expert slots
receives them on one copy stream per DMA engine (one, FIFO, unless the plan has a copy schedule), while one
compute stream runs the decode step one kernel per primitive the simulator costs (chipsim.hwreplay.ops):
every matvec a GEMV (or, for an operand shared by g heads, a (rows × reduction)·(reduction × g) matmul
reading exactly its bytes; for 4-bit weights, a kernel that dequantises them as it streams them), every
SFU op an exp, every vector op an add, over the primitive's element count. Each layer's non-expert
weights and KV cache are separate allocations, so nothing stays in the L2 cache from layer to layer.

Ordering follows the plan's action list (chipsim.hwreplay.plan):
- a copy waits for an event recorded on the compute stream at its action's place (it cannot start before
  the decode step reaches the point where the policy issued it) and for the compute that last read its
  slot (write-after-read);
- with a copy schedule (several engines, demand first, preemption at chunk boundaries, cancel), each span is
  its own copy on its engine's stream, in the schedule's order; a transfer's later span also waits for its
  earlier one when that ran on another engine;
- an expert's kernels wait for its copy's event (its last span's);
- per-token latency is the time between consecutive "token done" events on the compute stream.
The host enqueues everything asynchronously; it never waits for the GPU inside the measured tokens.
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch

from chipsim.hwreplay.host_experts import HostExperts, summary as host_summary
from chipsim.hwreplay.kernels import (QUANT_BITS, _mv_q4_reference, _mv_q8_reference, _nothing,  # noqa: F401
                                      dequantise_q4, dequantise_q8, kernel_call, operand_sizes, q4_views, quant_views,
                                      weight_bytes,
                                      weight_shape, weight_views)
from chipsim.hwreplay.nvml import Gpu, Meter
from chipsim.hwreplay.ops import Primitive
from chipsim.hwreplay.plan import Plan


def capture_graph(calls: list):
    """`calls` ((function, args, kwargs) tuples) captured into one CUDA graph, after one warm-up run on a side
    stream outside capture (library handles and workspaces are made there, not inside the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn, args, kwargs in calls:
            fn(*args, **kwargs)
    return graph


class GpuDecodeStep:
    """Weights and scratch buffers of one model shape on the GPU; enqueues op groups on the current stream."""

    def __init__(self, groups: dict[str, list[Primitive]], num_layers: int, first_dense: int, device,
                 gemv: str = "cublas"):
        self.groups = groups
        self.gemv = gemv
        self.device = device
        self.num_layers = num_layers
        self.first_dense = first_dense
        bf16 = torch.bfloat16
        all_prims = [p for ps in groups.values() for p in ps]
        n_scratch, n_in = operand_sizes(all_prims)
        self.scratch_a = torch.randn(n_scratch, device=device, dtype=bf16)
        self.scratch_b = torch.randn(n_scratch, device=device, dtype=bf16)
        self.scratch_out = torch.empty(n_scratch + n_in, device=device, dtype=bf16)
        self.x = torch.randn(n_in, device=device, dtype=bf16)
        # one flat weight buffer per layer (and one for the head): layers never share operands
        self.weights: dict[tuple[str, int], list[torch.Tensor]] = {}
        per_layer_groups = [g for g in ("attention", "router", "shared", "dense") if g in groups]
        for layer in range(num_layers):
            names = ["attention", "dense"] if layer < first_dense else [g for g in per_layer_groups if g != "dense"]
            self._alloc(names, layer)
        self._alloc(["head"], -1)
        self.expert_prims = groups["expert"]
        self.expert_bytes = sum(p.weight_bytes for p in self.expert_prims if p.kind == "matvec")
        self.kernels_per_group = {g: len(ps) for g, ps in groups.items()}

    @staticmethod
    def _rows(p: Primitive) -> int:
        return -(-p.outputs // p.groups)

    def _alloc(self, names, layer):
        shapes = [(name, [(self._rows(p), p.reduction) for p in self.groups[name] if p.kind == "matvec"]) for name in names]
        total = sum(r * c for _, sh in shapes for r, c in sh)
        flat = torch.empty(max(total, 1), device=self.device, dtype=torch.bfloat16).normal_()
        off = 0
        for name, sh in shapes:
            views = []
            for r, c in sh:
                views.append(flat[off:off + r * c].view(r, c))
                off += r * c
            self.weights[(name, layer)] = views

    def _bind(self, prims, weights) -> list:
        """The group's kernels as (function, args, kwargs) with every view made once, before any timing."""
        calls, wi = [], 0
        for p in prims:
            w = None
            if p.kind == "matvec":
                w = weights[wi]
                wi += 1
            calls.append(kernel_call(p, w, self.x, self.scratch_a, self.scratch_b, self.scratch_out, self.gemv))
        return calls

    def group_calls(self, name: str, layer: int) -> list:
        return self._bind(self.groups[name], self.weights.get((name, layer), []))

    def calls_for(self, key: tuple, gpu_slots: torch.Tensor) -> list:
        """The calls of a compiled program's compute key: ("group", name, layer) or ("expert", slot)."""
        return self.group_calls(key[1], key[2]) if key[0] == "group" else self.expert_calls(gpu_slots[key[1]])

    def expert_calls(self, slot: torch.Tensor) -> list:
        """The expert's kernels over the weights in `slot` (one expert's bytes, uint8): BF16 matrices, or 4-bit
        4- and 8-bit ones as quant_views lays them out, one after another in the order of its matvecs."""
        views, off = [], 0
        for p in self.expert_prims:
            if p.kind == "matvec":
                views.append(weight_views(slot[off:], p))
                off += weight_bytes(p)
        return self._bind(self.expert_prims, views)

    def as_graph(self, key, calls: list) -> list:
        """`calls` captured once into a CUDA graph (cached under `key`): one launch instead of one per kernel.

        With graphs the host's dispatch cost per kernel drops out of the replay; the microbenchmark's
        `graph_us_per_kernel` is then the per-operation cost to configure (gpuconfig --kernel-launch graph).
        """
        cache = self.__dict__.setdefault("_graphs", {})
        if key not in cache:
            cache[key] = [(capture_graph(calls).replay, (), {})]
        return cache[key]


def _bind_compute(prog: list, step: GpuDecodeStep, gpu_slots: torch.Tensor, graphs: bool, segments: bool,
                  labels: list | None = None) -> list:
    """The compiled program's compute entries ("c", [op group keys]) made into calls: kernel by kernel, one
    graph per op group (graphs), or one graph per run of consecutive groups between synchronisations with the
    copy stream (segments; without graphs, a CPU dry run, the same runs kernel by kernel). Keys are the step's
    (`step.calls_for`): ("group", name, layer) or ("expert", slot) of a decode step. `labels`, where given, gets
    each compute entry's op group names ("attention+router", "expert", ...) in order."""
    raw: dict[tuple, list] = {}

    def calls_of(key):
        if key not in raw:
            raw[key] = step.calls_for(key, gpu_slots)
        return raw[key]

    if segments:  # consecutive compute entries become one
        merged = []
        for op in prog:
            if op[0] == "c" and merged and merged[-1][0] == "c":
                merged[-1] = ("c", merged[-1][1] + op[1])
            else:
                merged.append(op)
        prog = merged
    out = []
    for op in prog:
        if op[0] == "c" and labels is not None:
            labels.append("+".join(sorted({"expert" if k[0] == "expert" else str(k[1]) for k in op[1]})))
        if op[0] != "c":
            out.append(op)
        elif segments and graphs:
            keys = tuple(op[1])
            out.append(("c", step.as_graph(("segment", keys), [c for k in keys for c in calls_of(k)])))
        elif graphs:
            out.append(("c", [c for k in op[1] for c in step.as_graph(k, calls_of(k))]))
        else:
            out.append(("c", [c for k in op[1] for c in calls_of(k)]))
    return out


class _CpuEvent:
    """Stand-in for torch.cuda.Event on a CPU dry run (the CPU runs everything in order)."""

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3

    def synchronize(self) -> None:
        pass


class _CpuStream:
    def wait_event(self, event):
        pass


def _sync_api(device):
    """(Stream, Event, use-stream context, make-current, synchronize) for CUDA, or in-order stand-ins for a CPU
    dry run. make-current (torch.cuda.set_stream) switches streams with one call, for the copies: the context
    manager costs the host several."""
    if device.type == "cuda":
        return torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream, torch.cuda.set_stream, torch.cuda.synchronize
    return _CpuStream, _CpuEvent, lambda s: contextlib.nullcontext(), lambda s: None, lambda: None


_RUNTIME: list = []  # the cudart front-end (chipsim.hwreplay.cudart.Runtime), bound once per process


def _handle(obj) -> int:
    """A stream's, an event's or a captured graph's raw CUDA handle."""
    if isinstance(obj, torch.cuda.CUDAGraph):  # None where this PyTorch does not expose it: replay() is called
        return obj.raw_cuda_graph_exec() if hasattr(obj, "raw_cuda_graph_exec") else None
    return obj.cuda_stream if isinstance(obj, torch.cuda.Stream) else obj.cuda_event


def _cudart_steps(prog: list, cs, synchronize) -> list:
    """The program as bound raw runtime calls (chipsim.hwreplay.cudart). PyTorch makes an event's CUDA handle at
    its first record, so each event is recorded once here, before timing (a wait on a recorded, finished event
    waits for nothing, as on one never recorded)."""
    from chipsim.hwreplay import cudart

    if not _RUNTIME:
        _RUNTIME.append(cudart.Runtime())
    for op in prog:
        kind = op[0]
        events = [op[2], op[4]] if kind == "x" else [op[1]] if kind == "rec" else [op[-1]] if kind in ("wait", "tok") else []
        for ev in events:
            if ev is not None and not ev.cuda_event:
                ev.record(cs)
    synchronize()
    low = cudart.lower(prog, cs, _handle, lambda fn: isinstance(getattr(fn, "__self__", None), torch.cuda.CUDAGraph))
    return _RUNTIME[0].bind(low)


class _ProgramCompiler:
    """A plan's action list compiled into a flat program, every tensor view and event made beforehand:
    ("c", [op group keys]) on the compute stream, ("x", copy stream, event to wait for or None,
    [(destination, source)], event recorded after), ("rec", event, stream), ("wait", stream, event), ("tok", event),
    ("sync", tensor) (host_frontend.routing: host: the host reads a layer's routing back), ("host", ...)."""

    def __init__(self, plan: Plan, step: GpuDecodeStep, host_experts: torch.Tensor, gpu_slots: torch.Tensor,
                 first_dense: int, stalls: bool, Event, cs, copy_streams: list) -> None:
        self.plan, self.step, self.host_experts, self.gpu_slots = plan, step, host_experts, gpu_slots
        self.first_dense, self.stalls, self.Event, self.cs, self.copy_streams = first_dense, stalls, Event, cs, copy_streams
        self.part_ranges = [(sum(plan.part_bytes[:i]), sum(plan.part_bytes[:i + 1])) for i in range(len(plan.part_bytes))]
        # the copy schedule, engine by engine: (issue, first byte, end byte); a FIFO copy stream's is every issue whole
        if plan.copies is None:
            self.queues = [[(n, 0, plan.expert_bytes) for n in range(plan.fetches)]]
        else:
            self.queues = [[] for _ in copy_streams]
            for e, n, first, end in plan.copies:
                self.queues[e].append((n, first, end))
        self.heads = [0] * len(self.queues)
        self.prog: list = []
        self.copy_done: dict[tuple[int, int], object] = {}
        self.waited: set = set()  # copy events the compute stream has waited for: later work is behind them in stream order
        self.slot_of: dict[tuple[int, int], int] = {}
        self.issued: list = []  # issue n -> (expert key, slot, the compute-stream marker it starts behind)
        self.span_done: dict = {}  # issue -> (engine, event after its latest enqueued span)
        self.marker = None
        self.token_events: list = []
        self.stall_marks: list = []  # (token, MoE layer, [(event before a wait for a copy, event after it), ...])
        self.copies = self.copied_bytes = 0
        self.host = None  # chipsim.hwreplay.host_cpu.HostExperts, where the plan runs experts on the host CPU
        self.host_layers = {(a[1], a[2]) for a in plan.actions if a[0] == "host"}
        self.routed_event = None  # where the running layer's activation is ready, when host experts take it
        self.host_keys: list = []  # the running layer's host experts: (MoE layer, expert)
        self.readback = None  # host_frontend.routing: host: a layer's chosen experts, read by the host at its routing

    def enqueue_spans(self) -> None:
        """Each engine's next spans, as far as their transfers have been issued (program order)."""
        for e, q in enumerate(self.queues):
            while self.heads[e] < len(q) and q[self.heads[e]][0] < len(self.issued):
                n, first, end = q[self.heads[e]]
                key, slot, mark = self.issued[n]
                before = self.span_done.get(n)
                after = None  # what the span waits for on its copy stream besides the spans before it there
                if before is None:
                    after = mark
                elif before[0] != e:  # a paused prefetch resumed on another engine: after its earlier span
                    after = before[1]
                pairs = []  # (destination, source) per part (descriptor) the span touches: one copy each
                for lo, hi in self.part_ranges:
                    a, b = max(lo, first), min(hi, end)
                    if a < b:
                        pairs.append((self.gpu_slots[slot, a:b], self.host_experts[key[0], key[1], a:b]))
                        self.copies += 1
                        self.copied_bytes += b - a
                ev = self.Event()
                self.prog.append(("x", self.copy_streams[e], after, pairs, ev))  # wait, copy, record: one program step
                self.span_done[n] = (e, ev)
                if end == self.plan.expert_bytes:  # spans run on from where the last stopped: this was the transfer's last
                    self.copy_done[key] = ev  # the transfer's bytes have all landed
                self.heads[e] += 1

    def add(self, a: tuple) -> None:
        """One plan action's program steps."""
        kind = a[0]
        if kind == "issue":
            key, slot = (a[3], a[4]), a[6]
            # the copy starts once the compute stream reaches the issue point. That point is also behind every
            # compute that read the slot's previous expert (the plan evicts before it reuses a slot, and an
            # evicted expert is not computed again), so the marker covers write-after-read as well
            if self.marker is None:
                self.marker = self.Event()
                self.prog.append(("rec", self.marker, self.cs))
            self.issued.append((key, slot, self.marker))
            self.copy_done.pop(key, None)
            self.enqueue_spans()
            self.slot_of[key] = slot
            return
        if kind == "evict":
            self.slot_of.pop((a[3], a[4]), None)
            return
        if kind == "token":
            return
        if kind == "attention":  # one launch per simulator op group: with graphs, one graph each
            layer = self.first_dense + a[2]
            self.prog.append(("c", [self.group(self.mixer(layer), layer), self.group("router", layer)]))
        elif kind == "dense":
            self.prog.append(("c", [self.group(self.mixer(a[2]), a[2]), self.group("dense", a[2])]))
        elif kind == "route":
            if self.readback is not None:  # the host reads the routing back before it enqueues what follows
                self.prog.append(("sync", self.readback))
            if (a[1], a[2]) in self.host_layers:  # the host experts' activation is ready here, before the shared experts
                self.routed_event = self.Event()
                self.prog.append(("rec", self.routed_event, self.cs))
            if self.has_shared():
                self.prog.append(("c", [self.group("shared", self.first_dense + a[2])]))
        elif kind == "host":
            self.host_keys = [(a[2], e) for e in a[3]]
            self.host.bind(self.host_keys)
        elif kind == "compute":
            self.add_compute(a)
        elif kind == "layer_end":
            if self.host_keys:  # after the layer's GPU experts are enqueued: they run while the host computes
                self.prog.append(("host", self.host, self.routed_event, self.host_keys))
                self.host_keys = []
            self.prog.append(("c", [self.group("combine", self.first_dense + a[2])]))
        elif kind == "head":
            self.prog.append(("c", [self.group("head", -1)]))
            self.step_done()
        else:
            self.add_other(a)
        self.marker = None

    # what a decode step's program names (a prefill chunk's compiler names its own: chipsim.hwreplay.prefill_harness)
    def group(self, name: str, layer: int) -> tuple:
        """The compute key of op group `name` of `layer` (-1: the head)."""
        return ("group", name, layer)

    def mixer(self, layer: int) -> str:
        """The op group of `layer`'s token mixer: the decode replay runs full attention in every layer."""
        return "attention"

    def has_shared(self) -> bool:
        return "shared" in self.step.groups

    def expert_key(self, a: tuple, i: int, slot: int) -> tuple:
        """The compute key of the i-th expert of compute action `a`, in `slot`."""
        return ("expert", slot)

    def step_done(self) -> None:
        """A token's end on the compute stream: the event its latency is measured to."""
        ev = self.Event(enable_timing=True)
        self.prog.append(("tok", ev))
        self.token_events.append(ev)

    def add_other(self, a: tuple) -> None:
        raise ValueError(f"unknown plan action {a!r}")

    def add_compute(self, a: tuple) -> None:
        """A "compute" action: each expert behind its copy's last span (a wait, timed when stalls are), then run."""
        layer = a[2]
        waits = []  # (event before, event after) around each wait, when stalls are timed
        for i, e in enumerate(a[3]):
            if (layer, e) in self.slot_of and (layer, e) not in self.copy_done:
                raise RuntimeError(f"hwreplay: expert {e} of MoE layer {layer} is computed at token {a[1]} before "
                                   "the copy schedule has enqueued its last bytes")
            ev = self.copy_done.get((layer, e))
            if ev is not None and ev not in self.waited:
                if self.stalls:
                    waits.append((self.Event(enable_timing=True), self.Event(enable_timing=True)))
                    self.prog.append(("rec", waits[-1][0], self.cs))
                self.prog.append(("wait", self.cs, ev))
                if self.stalls:
                    self.prog.append(("rec", waits[-1][1], self.cs))
                self.waited.add(ev)
            self.prog.append(("c", [self.expert_key(a, i, self.slot_of[(layer, e)])]))
        if waits:
            self.stall_marks.append((a[1], layer, waits))


def _torch_enqueue(cs, use, make_current):
    """enqueue(ops, host_marks) through PyTorch calls: the program's steps on their streams, in order."""

    def enqueue(ops, host_marks):
        with use(cs):
            for op in ops:
                kind = op[0]
                if kind == "c":
                    for fn, args, kwargs in op[1]:
                        fn(*args, **kwargs)
                elif kind == "x":
                    _, stream, after, pairs, done = op
                    make_current(stream)
                    if after is not None:
                        stream.wait_event(after)
                    for dst, src in pairs:
                        dst.copy_(src, True)  # non-blocking from pinned memory; from pageable memory the host waits
                    done.record(stream)
                    make_current(cs)
                elif kind == "wait":
                    op[1].wait_event(op[2])
                elif kind == "sync":  # .tolist(): a blocking read on the compute stream, as offloading code does
                    op[1].tolist()
                elif kind == "host":  # the host computes experts (chipsim.hwreplay.host_cpu), then enqueues on
                    op[1].run(op[2], op[3], cs)
                elif kind == "rec":
                    op[1].record(op[2])
                else:  # "tok"
                    op[1].record(cs)
                    host_marks.append(time.perf_counter())

    return enqueue


def _enqueuer(prog: list, cs, enqueue_with: str, use, make_current, synchronize):
    """(steps, enqueue(ops, host_marks), is_token(op)): the program as it is enqueued, through PyTorch or, with
    enqueue_with="cudart", as raw CUDA runtime calls (no PyTorch call per copy or launch)."""
    if enqueue_with == "cudart":
        steps = _cudart_steps(prog, cs, synchronize)

        def enqueue(ops, host_marks):
            with use(cs):  # for graphs replayed through PyTorch (no raw executable)
                _RUNTIME[0].run(ops, host_marks, time.perf_counter)

        return steps, enqueue, lambda op: op[2]
    return prog, _torch_enqueue(cs, use, make_current), lambda op: op[0] == "tok"


def _bound(prog: list, step, gpu_slots, graphs: bool, segments: bool, Event, cs, op_spans: bool) -> tuple:
    """_bind_compute's program, with every compute step timed where op_spans (_with_op_spans): (program, spans)."""
    labels: list = []
    return _with_op_spans(_bind_compute(prog, step, gpu_slots, graphs, segments, labels), Event, cs, op_spans, labels)


def _with_op_spans(prog: list, Event, cs, on: bool, labels: list) -> tuple[list, list | None]:
    """The program with a timing event recorded on the compute stream before and after each compute step (on), and
    the spans: (token, the step's label, event before, event after) per step (None where off)."""
    if not on:
        return prog, None
    out, spans, token, c = [], [], 0, 0
    for op in prog:
        if op[0] != "c":
            out.append(op)
            token += op[0] == "tok"
            continue
        before, after = Event(enable_timing=True), Event(enable_timing=True)
        out += [("rec", before, cs), op, ("rec", after, cs)]
        spans.append((token, labels[c], before, after))
        c += 1
    return out, spans


def _op_span_fields(spans: list | None) -> dict:
    """op_span_ms: per token [the GPU's ms inside its compute steps, their number]; op_span_kinds: per step label
    (its op group names) its ms per token (read after the run)."""
    if spans is None:
        return {}
    per: dict[int, list] = {}
    kinds: dict[str, dict[int, float]] = {}
    for token, label, before, after in spans:
        ms = before.elapsed_time(after)
        row = per.setdefault(token, [0.0, 0])
        row[0] += ms
        row[1] += 1
        by_token = kinds.setdefault(label, {})
        by_token[token] = by_token.get(token, 0.0) + ms
    tokens = sorted(per)
    return {"op_span_ms": [[round(per[t][0], 5), per[t][1]] for t in tokens],
            "op_span_kinds": {k: [round(v.get(t, 0.0), 5) for t in tokens] for k, v in sorted(kinds.items())}}


def _dispatch_ms(steps: list, enqueue, is_token, dispatch_tokens: int, synchronize, ahead=None) -> list[float]:
    """The host's own cost per token: each token's program enqueued again on an idle GPU (synchronised
    before), so the host never waits for a full launch queue; in the timed run it always may. With `ahead` (a
    call that enqueues a long sleeping kernel on the compute stream) the token is enqueued behind it instead: the
    host's cost while it is ahead of the GPU, as in the timed run between its waits for the queue."""
    ends = [i for i, op in enumerate(steps) if is_token(op)]
    dispatch_ms = []
    for t in range(min(dispatch_tokens, len(ends) - 1)):
        first, last = ends[t] + 1, ends[t + 1] + 1
        synchronize()
        if ahead is not None:
            ahead()
        t0 = time.perf_counter()
        enqueue(steps[first:last], [])
        dispatch_ms.append(round(1e3 * (time.perf_counter() - t0), 4))
    return dispatch_ms


def _dispatches(steps: list, enqueue, is_token, dispatch_tokens: int, synchronize, ahead) -> tuple[list, list]:
    """_dispatch_ms on an idle GPU, and behind a sleeping kernel (`ahead`, where there is one); synchronised after."""
    if not dispatch_tokens:
        return [], []
    idle = _dispatch_ms(steps, enqueue, is_token, dispatch_tokens, synchronize)
    behind = _dispatch_ms(steps, enqueue, is_token, dispatch_tokens, synchronize, ahead) if ahead else []
    synchronize()
    return idle, behind


def _sleeper(cs, use, host_experts: torch.Tensor, host_waits: bool):
    """A call that enqueues a 20 ms sleeping kernel on the compute stream `cs` (None off a GPU, or where the host
    waits for the GPU inside a token: its own experts' activations, a routing read back (`host_waits`), a copy from
    pageable memory, each of which would wait out the sleep)."""
    device = getattr(cs, "device", None)  # (the CPU dry run's stand-in stream has none)
    if device is None or device.type != "cuda" or host_waits or not host_experts.is_pinned():
        return None
    from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms

    cycles = int(20 * sleep_cycles_per_ms(device))

    def ahead():
        with use(cs):
            torch.cuda._sleep(cycles)

    return ahead


def _compiled(plan: Plan, step, host_experts, gpu_slots, first_dense: int, stalls: bool, Event, cs, copy_streams,
              host_routing: bool = False):
    """The plan's action list compiled (a prefill's steps bring their own compiler), with a host CPU runner
    (chipsim.hwreplay.host_experts) where the plan computes experts there, and with host_routing each MoE layer's
    routing read back by the host (a top-k's 8 ids) before it enqueues what follows."""
    compiler = getattr(step, "program_compiler", None) or _ProgramCompiler
    compiled = compiler(plan, step, host_experts, gpu_slots, first_dense, stalls, Event, cs, copy_streams)
    if host_routing:
        compiled.readback = torch.zeros(8, dtype=torch.int64, device=gpu_slots.device)
    if plan.host_experts:
        compiled.host = HostExperts(step.groups["expert"], host_experts, gpu_slots.device, _sync_api(gpu_slots.device))
    for a in plan.actions:
        compiled.add(a)
    return compiled


def replay(plan: Plan, step: GpuDecodeStep, host_experts: torch.Tensor, gpu_slots: torch.Tensor,
           first_dense: int, graphs: bool = False, dispatch_tokens: int = 0, gpu: Gpu | None = None,
           segments: bool = False, stalls: bool = False, energy_settle_s: float = 0.5,
           enqueue_with: str = "torch", host_routing: bool = False, op_spans: bool = False) -> dict:
    """Run the plan once; returns per-token latency (ms, CUDA events) and what was moved.

    host_experts: pinned (or pageable: host_frontend.expert_memory) (moe_layers, experts, expert bytes) uint8; gpu_slots: (slots, expert bytes) uint8 on the GPU
    (an expert's matrices as GpuDecodeStep.expert_calls reads them: BF16, or packed 4-bit with scales).
    The action list is first compiled into a flat program of (function, args, kwargs), every tensor view and
    event made beforehand: enqueueing a token costs the host as little as possible.
    graphs=True (CUDA only) launches each simulator op group (a layer's attention, its router, its shared
    experts, one expert in one slot, a combine, the head) as one captured CUDA graph instead of kernel by
    kernel; the config then charges compute.op_group_launch_ns per group.
    segments=True (with graphs) captures each stretch of compute between two synchronisations with the copy
    stream (an issued copy, a wait for one) as one graph instead: where nearly every expert is cached, the
    host's launches per op group (~400 per Granite-3B token) would otherwise pace the GPU.
    stalls=True records, at every MoE layer whose experts wait for a copy, a timing event before and after the
    wait ("stall_ms": [token, MoE layer, ms] per such layer; a layer that waits for nothing stalls 0).
    gpu (chipsim.hwreplay.nvml): the board's energy from the first token enqueued to the last run, read by a
    nvml.Meter with `energy_settle_s` of idle on each side ("energy": joules, seconds, mean watts over all
    tokens, warm-up included; the idle power and the plain two-reading window beside them).
    enqueue_with="cudart" (CUDA, with graphs) issues the same steps as raw CUDA runtime calls through ctypes
    (chipsim.hwreplay.cudart) instead of PyTorch calls: a copy costs the host one driver call, not a PyTorch
    dispatch, where hundreds of copies per token would otherwise pace the replay.
    host_routing=True (host_frontend.routing: host; through PyTorch only) has the host read each MoE layer's
    routing back (.tolist() on the compute stream) before it enqueues anything after it.
    op_spans=True times every compute step on the GPU (an event before and after each; _op_span_fields).
    """
    if host_routing and enqueue_with != "torch":
        raise ValueError("host_routing: the read-back is a PyTorch call (enqueue_with='torch')")
    Stream, Event, use, make_current, synchronize = _sync_api(gpu_slots.device)
    cs = Stream()
    copy_streams = [Stream() for _ in range(plan.engines if plan.copies is not None else 1)]
    graphs = graphs and gpu_slots.device.type == "cuda"
    compiled = _compiled(plan, step, host_experts, gpu_slots, first_dense, stalls, Event, cs, copy_streams,
                         host_routing)
    prog, spans = _bound(compiled.prog, step, gpu_slots, graphs, segments, Event, cs, op_spans)
    token_events = compiled.token_events
    # ---- execute: the host only enqueues; it never waits for the GPU until the end
    steps, enqueue, is_token = _enqueuer(prog, cs, enqueue_with, use, make_current, synchronize)
    host_at_token = []
    synchronize()
    start = Event(enable_timing=True)
    gc_was = gc.isenabled()
    gc.disable()
    meter = Meter(gpu, energy_settle_s) if gpu is not None else None
    if meter is not None:
        meter.start()
    t_host0 = time.perf_counter()
    try:
        with use(cs):
            start.record(cs)
        enqueue(steps, host_at_token)
        synchronize()
        t_host = time.perf_counter() - t_host0
        energy = meter.stop(t_host) if meter is not None else None
        marks = [start] + token_events  # read now: the check below records the token events again
        latency = [marks[i].elapsed_time(marks[i + 1]) for i in range(len(token_events))]
        stall_ms = [[t, layer, round(sum(b.elapsed_time(e) for b, e in waits), 5)]
                    for t, layer, waits in compiled.stall_marks]
        host_cpu = host_summary(compiled.host)  # before the dispatch timing runs the host experts again
        span_fields = _op_span_fields(spans)  # before the dispatch timing records their events again
        dispatch_ms, ahead_ms = _dispatches(steps, enqueue, is_token, dispatch_tokens, synchronize,
                                            _sleeper(cs, use, host_experts, plan.host_experts or host_routing))
    finally:
        if gc_was:
            gc.enable()
    host_ms = [1e3 * (host_at_token[i] - (host_at_token[i - 1] if i else t_host0)) for i in range(len(host_at_token))]
    return {"latency_ms": [round(x, 5) for x in latency], "host_enqueue_ms": [round(x, 4) for x in host_ms],
            "copies": compiled.copies, "copied_bytes": compiled.copied_bytes, "host_seconds": round(t_host, 3),
            "program_steps": len(prog), "kernel_launch": ("segment-" if segments else "") + ("graph" if graphs else "eager"),
            "launches_per_token": sum(len(op[1]) for op in prog if op[0] == "c") / max(1, len(token_events)),
            # runs of compute the program enqueues in one step: with graphs, each one graph (per op group or segment)
            "compute_steps_per_token": sum(1 for op in prog if op[0] == "c") / max(1, len(token_events)),
            "gemv": step.gemv, "enqueue": enqueue_with, "host_dispatch_ms": dispatch_ms,
            "host_dispatch_ahead_ms": ahead_ms, "energy": energy,
            "copy_streams": len(copy_streams), **({"stall_ms": stall_ms} if stalls else {}), **host_cpu,
            **({"host_routing": True} if host_routing else {}), **span_fields,
            **({"host_memory": "pageable"} if gpu_slots.device.type == "cuda" and not host_experts.is_pinned() else {})}
