"""A policy's decisions on a trace, as the ordered action list the hardware replay executes (no torch).

The simulator runs the policy as usual; a recorder watching it (an observer, chipsim.sim.observe) notes, in the order
they happen, every point where the decode step moves on and every decision the policy (or the engine on its behalf)
takes:

    ["token", t]                          token t starts (on_token_start)
    ["dense", t, i]                       dense first layer i runs
    ["attention", t, l]                   MoE layer l's attention + router run
    ["route", t, l]                       routing is known: the shared experts run now, beside the fetches
    ["host", t, l, [e, ...]]              these routed experts run on the host CPU, one after another, each its own
                                          round trip (activation down, the CPU's expert, result up); the layer's
                                          weighted sum waits for the last (decode steps of one sequence only)
    ["issue", t, l, key_layer, e, kind]   a fetch of expert e of layer key_layer is issued ("demand"/"prefetch")
    ["evict", t, l, key_layer, e]         an expert leaves the buffer
    ["compute", t, l, [e, ...]]           these routed experts run (in this order)
    ["layer_end", t, l]                   the weighted sum runs, then on_layer_end
    ["head", t]                           embedding, final norm and LM head: the token ends

A request's plan (workload.prompt_tokens > 0) holds its prefill chunks, and the replay stops after them (at the first
output token: TTFT); within a chunk the actions above run as in a decode step, with t the chunk's last token:

    ["prefill", k, first, last]           prefill chunk k of prompt tokens first .. last starts
    ["compute", t, l, [e, ...], [n, ...]] these routed experts run, each a GEMM over the n chunk tokens routed to it
    ["head", t]                           the chunk's embedding lookups (the prompt's last chunk: and its LM head)
    ["prefill_end", k]                    the chunk ends

What the run does after the prompt's last chunk (its decode steps) is not recorded.

A batch's plan (workload.batch B > 1) holds its decode steps, each B tokens, one of every sequence (the trace laid out
by chipsim.trace.interleave: step i's tokens are i·B .. i·B + B − 1); each step's actions are a decode token's, with t
the step's last token, and each "compute" carries the step's tokens routed to each expert, as a prefill chunk's.

A served run's plan (workload.requests, chipsim.serve) holds its steps, each the parts its scheduler ran then (each
part: trace token `first`, cache position, tokens, 1 for a decode token, 1 where it yields an output token):

    ["step", k, gap_ps, [[first, position, tokens, decode, emits], ...]]   step k starts, gap_ps after the last one
                                                                          ended (the chip idle, waiting for arrivals)
    ... a prefill chunk's actions, t the step's last token, each "compute" with the step's tokens per expert ...
    ["step_end", k]                                                       step k ends (after its head)

Issue points are program points: the replay may start a copy no earlier than the compute stream reaches
the action's place in the list. The buffer slot of every fetch is assigned here (lowest free slot; an
evicted slot is free again at once, since a later copy into it queues behind the earlier one on the
same FIFO copy stream; with several engines the two may overlap, which changes no time, as the evicted
expert is never computed again), so the replay and the CPU tests agree on slots as well.

With the config's DMA a single FIFO engine (`dma.engines: 1`, `demand_first`, `demand_preempts_prefetch`
and `cancel_in_flight` all false) the replay is one CUDA copy stream, which behaves so: each issued copy
moves all its bytes, in issue order. Otherwise the plan also holds the simulator's copy schedule,
`copies`: every span in which one DMA engine moved a contiguous run of one transfer's bytes,

    [engine, n, first byte, end byte]     the n-th "issue" of the action list moved [first, end) on `engine`

per engine in the order the simulator ran them. A GPU copy engine cannot pause a copy or drop one it has
begun, so the replay makes each span its own copy on that engine's stream: a demand that overtook a
prefetch at a chunk boundary runs between the prefetch's two spans, a prefetch abandoned at routing stops
after its last span, and its bytes are those the simulator moved (chipsim.hwreplay.harness). The order of
the spans is the simulator's decision, as slots and ProMoE's prefetches are; the replay measures its time.

A policy that computes with surrogates is rejected, and so is one that computes on the host CPU in a request's
prefill, a batch or a served run (its experts there would run over several tokens: the replay's host jobs are one
token's).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from chipsim.errors import InputError
from chipsim.hw.machine import roles
from chipsim.runner import Prepared, new_server
from chipsim.sim.dma import DmaRecorder
from chipsim.sim.energy import EnergyTable
from chipsim.sim.engine import Simulation
from chipsim.sim.metrics import per_token_energy_pj
from chipsim.sim.observe import Observer, record_dma
from chipsim.units import PS_PER_S



class _SpanRecorder(DmaRecorder):
    """The DMA path's recorder, also noting each data span's bytes: (engine, transfer id, start ps, first byte,
    end byte). A span starts when a transfer's data phase begins or a paused prefetch resumes, and ends when it
    pauses at a chunk boundary, stops (cancelled) or lands."""

    def __init__(self, engines: int):
        super().__init__(engines)
        self.data_spans: list[tuple[int, int, int, int, int]] = []
        self._moving: dict[int, tuple[int, int, int]] = {}  # tid -> (engine, start ps, bytes moved before)

    @staticmethod
    def _moved(tr, units_left: int) -> int:
        """Bytes moved with `units_left` to go, rounded up as the DMA path counts a stopped transfer's bytes."""
        return -(-(tr.nbytes * PS_PER_S - units_left) // PS_PER_S)

    def take(self, tr, now, phase):
        super().take(tr, now, phase)
        if phase == "data":  # a paused prefetch resumes where it stopped
            self._moving[tr.tid] = (self.held[tr.tid][0], now, self._moved(tr, tr.remaining))

    def next_phase(self, tr, now, phase):
        super().next_phase(tr, now, phase)
        if phase == "data":
            self._moving[tr.tid] = (self.held[tr.tid][0], now, 0)

    def release(self, tr, now):
        moving = self._moving.pop(tr.tid, None)
        super().release(tr, now)
        if moving is not None:
            end = self._moved(tr, tr.remaining)
            if end > moving[2]:
                self.data_spans.append((moving[0], tr.tid, moving[1], moving[2], end))


def fifo_copy_stream(dma) -> bool:
    """True when the config's DMA is one CUDA copy stream: one engine, one FIFO queue, nothing paused or dropped."""
    return dma.engines == 1 and not (dma.cancel_in_flight or dma.demand_first or dma.demand_preempts_prefetch)


class PlanRecorder(Observer):
    """An observer of the engine (chipsim.sim.observe) that records the action list and, unless the DMA is one FIFO
    copy stream, the copy schedule (module docstring)."""

    def __init__(self) -> None:
        self.actions: list[list] = []
        self.t = 0
        self.layer = -1
        self.issue_of_tid: dict[int, int] = {}  # DMA transfer id -> its "issue" among the actions (0, 1, ...)
        self.spans: _SpanRecorder | None = None
        self._label = ""
        self._routed = None  # a request's trace routing: (token, MoE layer, k) expert ids
        self._chunk: tuple[int, int] | None = None  # the prefill chunk running: (first, last) prompt token
        self._prompt = 0  # a request's prompt tokens (0: decode steps only)
        self._batch = 0  # a batch's sequences (0: one sequence)
        self._plan_tokens: dict | None = None  # the running layer's plan's own token counts (LayerPlan.tokens)
        self._served = False  # a served run: steps of parts (module docstring)
        self._step_tokens: list[int] = []  # a served step's trace tokens, in the engine's order
        self._step_end = -1  # when the last served step ended (ps; -1: none yet)
        self._row = -1  # the served step running
        self.done = False  # a request's prompt is read: nothing more is recorded

    def attach(self, sim) -> None:
        self._label = sim.policy.label
        if sim.request is not None:
            if not fifo_copy_stream(sim.hw.dma):
                raise InputError("hwreplay: a request's prefill is replayed on one FIFO copy stream (dma.engines 1, "
                                 "no demand_first, demand_preempts_prefetch or cancel_in_flight)")
            self._routed = sim.trace["routed_ids"]
            self._prompt = sim.request.prompt_tokens
        if sim.batch is not None:  # each step's experts run over the step's tokens routed to them
            self._routed = sim.trace["routed_ids"]
            self._batch = sim.batch.batch
        if sim.served is not None:
            self._routed = sim.trace["routed_ids"]
            self._served = True
        if not fifo_copy_stream(sim.hw.dma):
            self.spans = record_dma(sim, _SpanRecorder(sim.dma.engines))

    def served_step(self, row, parts, now) -> None:
        self._step_tokens = [t for p in parts for t in range(p.first, p.first + p.tokens)]
        self._chunk = (0, 0)  # every "compute" carries its tokens
        self.t, self._row = self._step_tokens[-1], row
        gap = now - self._step_end if self._step_end >= 0 else 0
        self.actions.append(["step", row, gap, [[p.first, p.position, p.tokens, int(p.decode), int(p.emits)]
                                               for p in parts]])

    def _served_end(self, end) -> None:
        self.actions.append(["step_end", self._row])
        self._step_end = end

    def token_end(self, t, start, end) -> None:
        if self._served:
            self._served_end(end)

    def token_start(self, t, now) -> None:
        if self.done:
            return
        self.t = t
        if self._served:
            return
        if self._batch:  # a batch step: t is its last token
            self._chunk = (t - self._batch + 1, t)
        self.actions.append(["token", t])

    def prefill_start(self, chunk, first, last, now) -> None:
        if self._served:
            return
        self.t = last
        self._chunk = (first, last)
        self.actions.append(["prefill", chunk, first, last])

    def prefill_end(self, chunk, first, last, start, end) -> None:
        if self._served:
            self._served_end(end)
            return
        self.actions.append(["prefill_end", chunk])
        self._chunk = None
        self.done = last == self._prompt - 1

    def _routed_tokens(self, layer: int, experts: list[int]) -> list[int]:
        """The running chunk's (or batch step's) tokens each of `experts` of MoE layer `layer` runs for, as the engine counts them: the
        policy's own count where its plan gives one (LayerPlan.tokens), else the tokens routed to it (at least 1)."""
        counts = self._plan_tokens
        if counts is None and self._served:
            ids = self._routed[self._step_tokens, layer].ravel().tolist()
            counts = {e: ids.count(e) for e in set(ids)}
        elif counts is None:
            first, last = self._chunk
            ids = self._routed[first:last + 1, layer].ravel().tolist()
            counts = {e: ids.count(e) for e in set(ids)}
        return [counts.get(e) or 1 for e in experts]

    def layer_start(self, t, layer) -> None:
        self.layer = layer

    def ops(self, kind, index, experts, start, end) -> None:
        if self.done:
            return
        if kind == "attention":
            self.layer = index
            self.actions.append(["attention", self.t, index])
        elif kind == "experts" and self._chunk is not None:
            ids = [int(e) for e in experts]
            self.actions.append(["compute", self.t, index, ids, self._routed_tokens(index, ids)])
        elif kind == "experts":
            self.actions.append(["compute", self.t, index, [int(e) for e in experts]])
        elif kind == "dense":
            self.actions.append(["dense", self.t, index])
        elif kind == "head":
            self.actions.append(["head", self.t])
        # "shared" and "combine" run inside the replay's route and layer_end steps

    def route(self, t, layer) -> None:
        if not self.done:
            self.actions.append(["route", t, layer])

    def plan(self, t, layer, plan) -> None:
        if self.done:
            return
        self._plan_tokens = getattr(plan, "tokens", None)
        if plan.surrogate:
            raise InputError(f"hwreplay: policy {self._label} computes experts with surrogates; the hardware replay "
                             "runs experts on the GPU or the host CPU")
        if plan.on_host and self._routed is not None:
            raise InputError(f"hwreplay: policy {self._label} computes experts on the host CPU in a prefill, batch or "
                             "served step; the replay runs host-CPU experts in one sequence's decode steps")
        if plan.on_host:
            self.actions.append(["host", t, layer, [int(e) for e in plan.on_host]])

    def issued(self, layer, expert, demand, transfer) -> None:
        if self.done:
            return
        self.actions.append(["issue", self.t, self.layer, layer, expert, "demand" if demand else "prefetch"])
        self.issue_of_tid[transfer.tid] = len(self.issue_of_tid)

    def evicted(self, layer, expert) -> None:
        if not self.done:
            self.actions.append(["evict", self.t, self.layer, layer, expert])

    def layer_end(self, t, layer) -> None:
        if not self.done:
            self.actions.append(["layer_end", t, layer])

    def copy_schedule(self) -> list | None:
        """[engine, issue, first byte, end byte] per data span, engine by engine in the order they ran (None for
        a FIFO copy stream: each issue is one copy of all its bytes, in issue order)."""
        if self.spans is None:
            return None
        spans = sorted(self.spans.data_spans, key=lambda s: (s[0], s[2], s[1]))
        return [[e, self.issue_of_tid[tid], a, b] for e, tid, _, a, b in spans]


@dataclass
class Plan:
    policy: str
    tokens: int
    slots: int
    part_bytes: list  # one copy per part (ProMoE: gate, up, down), in this order
    actions: list  # the action list, each "issue" extended with its buffer slot
    sim_latency_ms: list  # the simulator's per-token latency for this plan
    sim_fetch_bytes: int  # bytes the simulator moved over the expert-fetch path
    # the simulator's per-token, per-MoE-layer stall (arrays waiting only for expert bytes; with host_frontend also
    # for the host, which --stalls does not time: refused)
    sim_stall_ms: list
    sim_energy_mj: list  # the simulator's per-token energy by ledger entry ({entry: mJ}, chipsim.sim.metrics)
    sim_busy_ms: list | None = None  # the simulator's per-token time of the arrays running an operation
    engines: int = 1  # DMA engines: copy streams of the replay
    copies: list | None = None  # the copy schedule (module docstring); None: one FIFO copy stream
    sim_segment_launches: int = 0  # compute.launch_per: segment: the runs of compute the simulator launched
    sim_host_issue_ms: list | None = None  # host_frontend's issue costs: the host's time enqueueing each step (ms)
    prompt_tokens: int = 0  # a request's prompt: the plan is its prefill chunks (tokens: their number), else 0
    chunk_tokens: list | None = None  # a request's prefill chunks: [offset, tokens] each
    batch: int = 0  # a batch's sequences: the plan is its decode steps (tokens: their number), else 0
    requests: int = 0  # a served run's requests: the plan is its steps (tokens: their number), else 0

    @property
    def sim_ttft_ms(self) -> float:
        """A request's time to first token as simulated: its prefill chunks one after another."""
        return sum(self.sim_latency_ms)

    def digest(self) -> str:
        """sha256 of the action list (and the copy schedule, where there is one): two plans with the same decisions
        have the same digest."""
        decided = self.actions if self.copies is None else [self.actions, self.copies]
        return hashlib.sha256(json.dumps(decided, separators=(",", ":")).encode()).hexdigest()

    @property
    def fetches(self) -> int:
        return sum(1 for a in self.actions if a[0] == "issue")

    @property
    def expert_bytes(self) -> int:
        return sum(self.part_bytes)

    @property
    def host_experts(self) -> int:
        """Experts the plan runs on the host CPU (each one round trip)."""
        return sum(len(a[3]) for a in self.actions if a[0] == "host")

    @property
    def fetch_bytes(self) -> int:
        """Bytes the replay copies: every issue's, or, with a copy schedule, the spans' (a prefetch abandoned
        half-way moved only some)."""
        if self.copies is None:
            return self.fetches * self.expert_bytes
        return sum(b - a for _, _, a, b in self.copies)

    def to_json(self) -> dict:
        extra = {} if self.copies is None else {"engines": self.engines, "copy_spans": len(self.copies)}
        if self.sim_segment_launches:
            extra["sim_segment_launches"] = self.sim_segment_launches
        if self.sim_host_issue_ms:
            extra["sim_host_issue_ms"] = round(sum(self.sim_host_issue_ms) / len(self.sim_host_issue_ms), 6)
        if self.prompt_tokens:
            extra.update(prompt_tokens=self.prompt_tokens, chunk_tokens=self.chunk_tokens)
        if self.batch:
            extra["batch"] = self.batch
        if self.requests:
            extra["requests"] = self.requests
        if self.host_experts:
            extra["host_experts"] = self.host_experts
        return {"policy": self.policy, "tokens": self.tokens, "slots": self.slots, "part_bytes": self.part_bytes,
                "digest": self.digest(), "fetches": self.fetches, "fetch_bytes": self.fetch_bytes,
                "sim_fetch_bytes": self.sim_fetch_bytes, **extra}


def assign_slots(actions: list, slots: int) -> list:
    """Each issue gets the lowest free buffer slot; an evict frees its expert's slot (returns a new list)."""
    free = list(range(slots))
    where: dict[tuple[int, int], int] = {}
    out = []
    for a in actions:
        if a[0] == "issue":
            key = (a[3], a[4])
            if not free:
                raise RuntimeError(f"hwreplay: no free slot for {key} at token {a[1]} (the simulator's buffer "
                                   f"accounting and the replay's disagree)")
            free.sort()
            slot = free.pop(0)
            where[key] = slot
            out.append(a + [slot])
        else:
            if a[0] == "evict":
                free.append(where.pop((a[3], a[4])))
            out.append(list(a))
    return out


def _per_step_ms(marks: list[int]) -> list[float]:
    """Each step's share of a running total (ps, at each step's end) in ms."""
    return [round((b - a) / 1e9, 6) for a, b in zip([0, *marks[:-1]], marks)]


def build_plan(prep: Prepared, policy) -> Plan:
    """Run `policy` on the prepared config and trace with the recorder watching; return its Plan. For a request
    (prep.request) the run is the whole request under `policy`'s prefill policy, and the plan its prefill chunks; for
    a batch (prep.batch) its decode steps of B tokens each."""
    if getattr(prep, "speculative", None) is not None:  # verify steps: drafts the replay has no model of
        raise InputError("hwreplay: workload.speculative: the GPU replay runs one sequence's decode steps, a batch's, "
                         "or a request's prefill")
    recorder = PlanRecorder()
    prefill = prep.prefill_for.get(policy.label)
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy, max_tokens=prep.config.hw.workload.max_tokens,
                     observers=[recorder], request=prep.request, prefill_policy=prefill, batch=prep.batch,
                     served=new_server(prep))
    result = sim.run()
    energy = per_token_energy_pj(result, EnergyTable.from_config(prep.config.hw))
    fmt = sim.expert_format
    if fmt.slot_bytes != fmt.fetch_bytes:
        raise InputError(f"hwreplay: policy {policy.label} stores experts in another format than it moves them")
    actions = assign_slots(recorder.actions, sim.slots)
    served = prep.served is not None
    steps = len(prep.request.chunks) if prep.request is not None else result.tokens  # a request: its prefill chunks
    if served:
        steps = int(result.served.step_tokens.size)
    link = roles(prep.config.hw).expert_link
    stepped = prep.request is not None or prep.batch is not None or served  # plan.tokens: steps, not trace tokens
    plan = Plan(policy=prefill.label if prefill is not None else policy.label, tokens=steps if stepped else sim.num_tokens,
                slots=sim.slots, part_bytes=[int(b) for b in fmt.part_bytes], actions=actions,
                sim_latency_ms=[round(float(x) / 1e9, 6) for x in result.per_token.latency_ps[:steps]],
                sim_fetch_bytes=int(result.per_token.bytes[link][:steps].sum()),
                sim_stall_ms=[[round(float(x) / 1e9, 6) for x in row] for row in result.per_layer.stall_ps[:steps]],
                sim_busy_ms=[round(float(x) / 1e9, 6) for x in result.per_token.busy_ps[:steps]],
                sim_energy_mj=[dict(zip(energy, [round(float(v[t]) / 1e9, 6) for v in energy.values()]))
                               for t in range(steps)],
                engines=sim.dma.engines, copies=recorder.copy_schedule(), sim_segment_launches=sim.segment_launches,
                sim_host_issue_ms=_per_step_ms(sim.host_issue_marks[:steps]) if sim.host_issue_marks else None)
    if prep.request is not None:
        plan.prompt_tokens = prep.request.prompt_tokens
        plan.chunk_tokens = [[c.offset, c.tokens] for c in prep.request.chunks]
    if prep.batch is not None:
        plan.batch = prep.batch.batch
    if served:
        plan.requests = prep.config.hw.workload.requests
    return plan
