"""The discrete-event replay of decode on the chip (SimPy), driven by a trace and a policy plug-in.

One SimPy process runs the decode step token by token and layer by layer on the arrays (operations are
sequential: each uses all arrays). Expert weights reach the on-package buffer through `DmaPath`
transfers that run concurrently with compute. The chip's memories and links are shared resources
(chipsim.sim.flows): a fetch is a flow LPDDR5X -> PCIe -> UCIe (I/O to memory die) -> HBM (write), an
operation's operand stream a flow HBM (read) -> UCIe (memory to compute die), capped at the rate its
arrays consume operands, and a host-CPU expert's weight read a flow on LPDDR5X; each resource's bandwidth
is shared by all flows crossing it at that moment, so an operation overlapping a fetch streams slower and
HBM pays its read/write turnaround. The process stalls only when the next expert it must
compute has not arrived; that waiting is the `stall`. Every byte moved and every picosecond of array
time goes into the token's `Ledger` and every per-layer outcome into the `RunRecorder`
(chipsim.sim.record); energy is computed from the ledgers afterwards (chipsim.sim.metrics).

A policy's hooks receive `Simulation.context` (chipsim.sim.context.PolicyContext): exactly
chipsim.policies.base.SimContext (read the trace, prefetch, evict, query the buffer and the link), with the checks
of every id it hands over, never the engine itself. The engine runs on an event core (chipsim.sim.core: SimPy, the
engine of record, or the native C core) and publishes what it does to observers (chipsim.sim.observe: the timeline,
the GPU replay's plan recorder).

A decode step, as the methods below run it: `_token` runs the dense layers, each MoE layer
(`_moe_layer`: the policy's layer start, attention and router, `_route`, `_run_experts`, the policy's
layer end) and the LM head; `_layer_costs` prices each layer's operations once per run.
"""

from __future__ import annotations

from typing import Any, Final, Generator, Sequence

import numpy as np

from chipsim.errors import InputError
from chipsim.hw.config import HardwareConfig
from chipsim.hw.machine import SRAM
from chipsim.hw.machine import roles as machine_roles
from chipsim.hw.paths import components, copy_timing, fetch_components, fetch_path_timing
from chipsim.policies.base import LayerPlan, Policy, PolicyError
from chipsim.sim.buffer import Entry, ExpertBuffer
from chipsim.sim.context import PolicyContext
from chipsim.sim.core import EventCore, simpy_core
from chipsim.sim.demands import DemandQueue
from chipsim.sim.dma import DEMAND, PREFETCH
from chipsim.sim.flows import PPM, READ, WRITE, Path
from chipsim.sim.host_pace import HostPace
from chipsim.sim.observe import Observer, combined
from chipsim.sim.record import RunCounts, RunRecorder, SimResult
from chipsim.sim.tally import TokenTally
from chipsim.sim.timeline_recorder import TimelineRecorder
from chipsim.sim.work import NO_WORK, LayerCost, Work, cost_of
from chipsim.trace.format import TokenRows, Trace
from chipsim.units import PS_PER_S, gbps_to_bytes_per_s, ns_to_ps
from chipsim.workload.batch import BatchLayer, BatchWorkload
from chipsim.workload.decode import DecodeWorkload
from chipsim.workload.host import HostTiming, host_timing
from chipsim.workload.request import PrefillChunk, RequestWorkload, trace_tokens_needed
from chipsim.workload.speculative import SpecStep, SpecWorkload


# the operand link is two resources where fetches cross it too (thor's UCIe: the I/O die's link for fetches, the
# memory-to-compute link for operand streams): its name with these suffixes (a ':' no config name has)
_FETCH_SIDE: Final = ":io"
_OPERAND_SIDE: Final = ":compute"
# no prefill chunk is running: every routing read is checked against the routed cell alone
_NO_STEP: Final = 1 << 62
# a served run's step records are made for this many steps first, and doubled as the run needs
SERVED_STEPS_FIRST: Final = 256



def _groups(*works: Work) -> int:
    """The op groups a GPU launches for these parts of a run of compute (a part with no work launches nothing)."""
    return sum(1 for w in works if w.ps > 0)

class Simulation:
    """One policy replaying one trace on one hardware config."""

    def __init__(self, hw: HardwareConfig, workload: DecodeWorkload, trace: Trace, policy: Policy,
                 max_tokens: int = 0, record_events: bool = False, record_tokens: int = 0,
                 core: EventCore | None = None, observers: Sequence[Observer] = (),
                 request: RequestWorkload | None = None, prefill_policy: Policy | None = None,
                 batch: BatchWorkload | None = None, speculative: SpecWorkload | None = None,
                 served: Any = None) -> None:
        """`record_events` keeps a timeline of the first `record_tokens` tokens (0: all of them; a TimelineRecorder);
        `core`: the event core to run on (chipsim.sim.core; SimPy, the engine of record, unless given); `observers`
        watch the run (chipsim.sim.observe). With `request` (chipsim.workload.request) the run is a whole request:
        `prefill_policy` runs its prefill chunks, then `policy` its decode steps; max_tokens is not read. With
        `batch` (chipsim.workload.batch) each step decodes one token of every sequence, over `trace` as
        chipsim.workload.batch.interleave lays it out; with `speculative` (chipsim.workload.speculative) each step
        verifies its planned drafts with its input token. With `served` (chipsim.serve.server.Server) the run serves
        many requests, each step the parts its scheduler picks (chipsim.workload.served)."""
        self.hw = hw
        self.workload = workload
        self.trace = trace
        # a plug-in, not compiled with the engine (chipsim.sim is compiled by mypyc at install): typed Any, so that
        # what its hooks return is used as it is, not checked against their annotations
        self.policy: Any = policy
        self.model = workload.model
        self.top_k = self.model.top_k
        self.num_experts = self.model.num_experts
        self.num_moe_layers = self.model.num_moe_layers
        self.num_tokens = trace.num_tokens if not max_tokens else min(max_tokens, trace.num_tokens)
        self.request = request
        self.batch = batch
        self.speculative = speculative
        self.served: Any = served
        # what prices a routed expert as a GEMM over several tokens: the request's, the batch's or the verify steps'
        self._gemm_source: Any = request if request is not None else batch if batch is not None else speculative
        if served is not None:
            self._gemm_source = served.costs
        self._host_timings: dict[int, HostTiming] = {}
        self._served_steps = 0
        self._routers: list[Work] = []  # (made by _layer_costs)
        self._mixer_kinds: list[str] = []
        # the recorded steps: one per decode token, or a request's prefill chunks and then its decode steps
        self.num_steps = self.num_tokens
        if request is not None:
            self.num_tokens = trace_tokens_needed(hw)
            self.num_steps = len(request.chunks) + request.decode_steps
        if batch is not None:
            self.num_steps = min(batch.steps, max_tokens or batch.steps)
            self.num_tokens = self.num_steps * batch.batch
        if speculative is not None:
            self.num_steps = len(speculative.steps)
            last = speculative.steps[-1]
            self.num_tokens = last.first + last.tokens
        if served is not None:  # requests read windows of the whole trace; the steps are as many as the run takes
            self.num_tokens = trace.num_tokens
            self.num_steps = SERVED_STEPS_FIRST
        self._on_core(core if core is not None else simpy_core())
        self._fetch_path(hw)
        self._expert_format(policy, workload, hw)
        self._run_state(hw, workload, trace)
        # what the policy's hooks receive: exactly chipsim.policies.base.SimContext, with its checks (chipsim.sim.context)
        self.context = PolicyContext(self, trace, self._routed, bool(policy.sees_future_routing))
        self.prefill_policy: Any = prefill_policy
        self.prefill_context: PolicyContext | None = None
        if request is not None and prefill_policy is not None:
            self.context._first_token = request.prompt_tokens  # the decode policy's steps start after the prompt
            # prefill moves and computes experts in its own format (as stored, unless its policy says otherwise),
            # with its own context: its label, the trace arrays it declares; the run starts in it
            self.policy = prefill_policy
            self._expert_format(prefill_policy, workload, hw)
            self.buffer.slots = self.slots
            self.prefill_context = PolicyContext(self, trace, self._routed, bool(prefill_policy.sees_future_routing))
            self.policy = policy
        self._watched_by(observers, record_events, record_tokens)

    def _on_core(self, core: EventCore) -> None:
        """The event core the run schedules on (chipsim.sim.core), its constructors held here: one call per event,
        no lookup through the core."""
        self.core = core
        self._new_timeout: Any = core.timeout
        self._new_event: Any = core.event
        self._fire: Any = core.succeed
        self._new_process: Any = core.process
        self._new_all_of: Any = core.all_of
        self._operation: Any = core.operation
        self.env: Any = core.environment()  # a SimPy Environment, or the native core's Loop

    def _fetch_path(self, hw: HardwareConfig) -> None:
        """The chip's shared resources as a flow network, the paths of fetches, operand streams and host reads
        across it, and the DMA queue that moves experts."""
        comps = components(hw)  # every memory and link: priced once here
        # host_frontend.expert_memory: pageable: each copy is staged by the driver (its own rate and fixed cost), and
        # the host thread that issued it enqueues nothing more until it ends
        self._pageable = hw.host_frontend.expert_memory == "pageable"
        path = fetch_path_timing(hw, comps)
        self.path_timing = path
        copy = self.copy_timing = copy_timing(hw, path)
        self._copy_setup_ns = copy.setup_ns
        if not hw.dma.demand_first and hw.dma.demand_preempts_prefetch:
            raise InputError("dma.demand_first: false (one FIFO queue) needs dma.demand_preempts_prefetch: false")
        roles = self.roles = machine_roles(hw)
        self._stage_in_sram = roles.stage_in_sram
        self._in_place = roles.in_place  # every expert read where it is stored: nothing is fetched or evicted
        self.network: Any = self._network(self.env, hw, comps)
        net = self.network
        self._components = tuple(comps)
        self._fetch_components = fetch_components(hw)
        self._fetch_flow_path = net.path(*self._fetch_hops(self._fetch_components))
        operand_hops = [(roles.operand_memory, READ)]
        if roles.operand_link:
            operand_hops.append((roles.operand_link + _OPERAND_SIDE, READ))
        self._operand_flow_path = net.path(*operand_hops)
        self._sram_flow_path = net.path((SRAM, READ)) if self._stage_in_sram else None
        self._host_flow_path = net.path((roles.host_memory, READ))
        # what one flow alone gets on the operand paths (the native core runs an operation alone until it ends as one
        # wait)
        self._operand_alone_rate = net.alone_rate(self._operand_flow_path)
        self._sram_alone_rate = net.alone_rate(self._sram_flow_path) if self._sram_flow_path else 0
        self.dma: Any = self.core.dma_path(
            self.env,
            bandwidth_bytes_per_s=None,
            latency_ps=ns_to_ps(copy.latency_ns),
            setup_ps=ns_to_ps(self._copy_setup_ns),
            engines=hw.dma.engines,
            chunk_bytes=int(hw.dma.chunk_kib * 1024),
            on_landed=self._on_fetch_done,
            preempt=hw.dma.demand_preempts_prefetch,
            demand_first=hw.dma.demand_first,
            network=net,
            path=self._fetch_flow_path,
        )
        self._cancel_in_flight = hw.dma.cancel_in_flight
        if copy.cap_gbps:  # the driver's staging copy sets the pace, whatever the link allows
            self.dma.flow_cap = gbps_to_bytes_per_s(copy.cap_gbps)

    def _expert_format(self, policy: Policy, workload: DecodeWorkload, hw: HardwareConfig) -> None:
        """How this policy moves and stores its experts, and the buffer slots that gives."""
        fmt = policy.expert_format(workload, hw)
        self.expert_format = fmt
        self._part_bytes = fmt.part_bytes
        self._fetch_bytes = fmt.fetch_bytes
        # fetch_estimate_ps's constants: a setup per part, the path's latency, its bottleneck bandwidth
        copy = self.copy_timing
        self._fetch_fixed_ps = ns_to_ps(copy.setup_ns) * len(self._part_bytes) + ns_to_ps(copy.latency_ns)
        self._fetch_bytes_per_s = gbps_to_bytes_per_s(copy.bandwidth_gbps)
        self.slots = workload.buffer_bytes // fmt.slot_bytes
        if self.slots < self.top_k:
            raise InputError(f"expert_buffer.capacity_mib: holds {self.slots} experts in policy {policy.label}'s "
                             f"format, fewer than top-{self.top_k}")

    def _run_state(self, hw: HardwareConfig, workload: DecodeWorkload, trace: Trace) -> None:
        """The buffer, the demand queue, the token's tallies, the routing as it becomes known, the run's counters
        and records, and the host CPU."""
        self.buffer = ExpertBuffer(self.num_moe_layers, self.num_experts, self.slots)
        self._slot_of = self.buffer.slot_of  # the buffer's entries by index: read on every routed expert
        if self._in_place:  # every expert is where the arrays read it, from the start
            for index in range(self.num_moe_layers * self.num_experts):
                entry = Entry((index // self.num_experts, index % self.num_experts), index, False)
                entry.resident = True
                self.buffer.link(entry)
        self._demands = DemandQueue(self)
        self._tally = TokenTally(self._components, self._fetch_components, self.roles)
        # the run's counters as plain ints (compiled code counts them natively); rec.counts gets them at the end
        self._prefetches_issued = self._prefetches_dropped = self._prefetches_unused = 0
        self._fetches_total = self._expert_computes = self._peak_buffer_slots = 0
        # what routing the run knows: every (token, MoE layer) up to this cell, t * MoE layers + layer (-1: none yet;
        # _route moves it on just before on_route); only the oracle reads beyond it
        self._routed_upto = -1
        self._step_first = _NO_STEP  # a prefill chunk's first token while it runs: its later layers are not routed
        self._current_token = 0  # the step's (last) token
        self._expert_works: dict[int, Work] = {}  # a prefill expert's arrays work by the tokens routed to it
        self._waiting_layer = -1
        self._arrival_event: Any = None
        self._copy_wait_ps = ns_to_ps(hw.compute.copy_wait_ns)  # the arrays resume this long after a stall ends
        # compute.launch_beside_copy_ns: a launch the GPU starts while a copy is in flight costs this much more
        beside = ns_to_ps(hw.compute.launch_beside_copy_ns)
        self._beside_copy: Work | None = Work(beside, 0, beside) if beside else None  # the arrays idle meanwhile
        self._unlanded = 0  # transfers issued and not yet landed (or stopped): a copy is in flight
        # host_frontend.routing: host: the machine idles this long after each router while the host reads it back
        frontend = hw.host_frontend
        self._readback_ps = ns_to_ps(frontend.routing_readback_ns) if frontend.routing == "host" else 0
        # pageable copies issued and not yet landed, the events waiting for the host they hold (the arrays' next
        # work, host-CPU experts), the time the arrays waited
        self._pageable_in_flight = 0
        self._host_waiters: list[Any] = []
        self._host_blocked_ps = 0
        self._blocked_in_layers = 0  # of it, what MoE layers counted as their stall
        # host_frontend's issue costs: the host thread's own pace (None: it is always ahead)
        self._pace: HostPace | None = None
        if frontend.paced:
            self._pace = HostPace(ns_to_ps(frontend.launch_issue_ns), ns_to_ps(frontend.copy_issue_ns),
                                  ns_to_ps(frontend.event_issue_ns), frontend.launch_queue_depth)
        self._segments_now = 0  # segment launches _launched added to the work about to run (the host enqueues them)
        self.host_issue_marks: list[int] = []  # the host's enqueueing time so far at each step's end (ps; paced runs)
        self._marker_due = True  # no transfer issued since the last compute: the next records an issue point
        # compute.launch_per: segment: one launch per run of compute between synchronisations with the DMA (a
        # transfer issued, the first use of a fetched expert, a token's end); _synced: one happened since the last
        seg = workload.segment_launch
        self._segment_launch: Work | None = cost_of(seg) if seg is not None else None
        # runs of compute between synchronisations are launched as one (compute.launch_per: segment): counted where
        # they cost a launch, where the host's pace counts its launches, or where a launch beside a copy costs more
        self._segments = self._segment_launch is not None or (
            (self._pace is not None or self._beside_copy is not None) and hw.compute.launch_per == "segment")
        self._synced = True
        self.segment_launches = 0
        n_tokens = self.num_tokens
        # nested lists per token, fast per-layer reads: every token of the widest step kept converted
        self._routed = TokenRows(trace["routed_ids"][:n_tokens], keep=self.row_keep())
        self._routed_per_layer = trace["routed_ids"].shape[-1]  # every (token, layer) routes this many experts
        self._token_routed: list[list[int]] = []
        self.rec = RunRecorder(self.num_steps, self.num_moe_layers, self._components)
        # what routing found and each layer's stall, per (step, MoE layer) at step * layers + layer: plain lists as
        # the run goes (a store into a numpy array from compiled code is a generic call), into rec.layers at its end
        cells = self.num_steps * self.num_moe_layers
        self._layer_hits = [0] * cells
        self._layer_demands = [0] * cells
        self._layer_stall = [0] * cells
        # a batch's or verify steps' union of routed experts per (step, MoE layer), noted where it is formed (a
        # one-token step routes top-k); None where every step is one token or a prefill chunk
        several = self.batch is not None or self.speculative is not None or self.served is not None
        self._layer_union: list[int] | None = [self._routed_per_layer] * cells if several else None
        # a served run: each trace token's last MoE layer routed by its current request (what a policy may read), the
        # step's tokens, and the step index that stamps an expert's use (its tokens are not in time order)
        self._known: list[int] | None = self.served.known if self.served is not None else None
        self._step_tokens: Any = ()
        self._use_clock = -1
        self.host = self.core.resource(self.env, 1)  # one expert at a time, on all cores
        self.host_timing = host_timing(hw, workload)

    def widest_step(self) -> int:
        """The most tokens one step of this run reads: a prefill chunk's, a batch's, a verify step's, a served step's
        (workload.scheduler.max_step_tokens)."""
        if self.request is not None:
            return max(chunk.tokens for chunk in self.request.chunks)
        if self.batch is not None:
            return self.batch.batch
        if self.speculative is not None:
            return max(step.tokens for step in self.speculative.steps)
        if self.served is not None:
            widest: int = self.served.plan.max_step_tokens
            return widest
        return 1

    def row_keep(self) -> int:
        """Tokens a TokenRows of this run keeps converted: at least every token of its widest step (a step reads
        each of its tokens once per MoE layer; fewer kept would convert them again at every layer)."""
        return max(64, self.widest_step())

    def _watched_by(self, observers: Sequence[Observer], record_events: bool, record_tokens: int) -> None:
        """The observers of the run (chipsim.sim.observe), a TimelineRecorder among them with `record_events`."""
        self._timeline = TimelineRecorder(record_tokens) if record_events else None
        watching = list(observers) + ([self._timeline] if self._timeline is not None else [])
        self._observer: Any = combined(watching)  # None: nothing published
        if self._observer is not None:
            self._observer.attach(self)

    def _network(self, env: Any, hw: HardwareConfig, comps: dict) -> Any:
        """The chip's shared resources: each memory at its effective bandwidth (with its read/write turnaround),
        each link in the direction flows cross it (the operand link twice: the fetches' side and the operand
        streams'), and, with experts staged there, the arrays' SRAM (fetch writes and expert reads share its ports)."""
        operand_link = self.roles.operand_link
        names, gbps, turnaround, shared = [], [], [], []
        for comp in comps.values():
            names.append(comp.name + _FETCH_SIDE if comp.name == operand_link else comp.name)
            gbps.append(comp.gbps)
            turnaround.append(round(comp.turnaround * PPM))
            shared.append(comp.shared_gbps)
        if operand_link:
            names.append(operand_link + _OPERAND_SIDE)
            gbps.append(comps[operand_link].gbps)
            turnaround.append(0)
            shared.append(0)
        if self._stage_in_sram:
            names.append(SRAM)
            gbps.append(hw.compute.sram_read_gbps)
            turnaround.append(0)
            shared.append(0)
        return self.core.flow_network(env, names, [gbps_to_bytes_per_s(g) for g in gbps], turnaround,
                                      [gbps_to_bytes_per_s(g) if g else 0 for g in shared])

    def _fetch_hops(self, crossed: tuple[str, ...]) -> list[tuple[str, bool]]:
        """The network hops of a fetch: the experts' store read, each link towards the package, the landing
        written (the operand memory, or the arrays' SRAM)."""
        operand_link = self.roles.operand_link
        if not crossed:  # read in place: no fetch is ever issued (the DMA queue still needs a path)
            return [(self.roles.expert_store, READ)]
        hops = [(crossed[0], READ)]
        hops += [(c + _FETCH_SIDE if c == operand_link else c, WRITE) for c in crossed[1:]]
        if self._stage_in_sram:
            hops.append((SRAM, WRITE))
        return hops

    # ======================================================================== what the policy context acts through
    def _prefetch_at(self, index: int) -> bool:
        """Stage the expert at buffer index `index` ahead of need; False if no slot is free (nothing is evicted)."""
        if self._slot_of[index] is not None:
            return True
        if self.buffer.free_slots() <= 0:
            self._prefetches_dropped += 1
            return False
        n = self.num_experts
        self._issue((index // n, index % n), PREFETCH)
        self._prefetches_issued += 1
        return True

    def _evict_at(self, index: int, stop_transfer: bool) -> None:
        """Free the slot of the expert at buffer index `index`, if present. One still on its way stops at its next
        chunk boundary, or, with stop_transfer=False, moves all its bytes first, as a demand fetch (its slot frees
        when they land)."""
        entry = self._slot_of[index]
        if entry is None or self._in_place:  # in place, every expert stays where it is stored
            return
        if self._observer is not None:
            self._observer.evicted(entry.key[0], entry.key[1])
        self.buffer.unlink(entry)
        entry.evicted = True
        if entry.prefetched and not entry.used:
            self._prefetches_unused += 1
        if not entry.resident:
            self.buffer.zombies += 1  # the slot frees when its transfers stop (at once if they never started)
            if stop_transfer and self._cancel_in_flight:
                with self.dma.batch():
                    for tr in entry.transfers:
                        self.dma.cancel(tr)
            elif not stop_transfer:
                # it must complete: ahead of later prefetches, which would otherwise starve it for as long as the
                # arrays keep demanding (and let it hold its slot meanwhile)
                with self.dma.batch():
                    for tr in entry.transfers:
                        self.dma.promote(tr)
        if self._demands.pending:
            self._demands.serve()

    # ======================================================================== internals
    def _issue(self, key: tuple[int, int], priority: int) -> Entry:
        entry = Entry(key, key[0] * self.num_experts + key[1], priority == PREFETCH)
        self._synced = True  # the compute after the issue point starts a new segment
        self.buffer.link(entry)
        # an expert in several parts (gate, up, down) is one descriptor chain on one DMA engine
        # (positional: a call with keywords takes the generic path into the C core's DmaPath)
        parts = len(self._part_bytes)
        ready = self._copy_enqueued(parts) if self._pace is not None else 0  # the host's pace: not before it is
        transfer = self.dma.submit(self._fetch_bytes, priority, entry, parts, ready)
        self._unlanded += 1
        entry.transfers.append(transfer)
        entry.parts_left = 1
        if self._pageable:
            self._pageable_in_flight += 1
        if self._observer is not None:
            self._observer.issued(key[0], key[1], priority == DEMAND, transfer)
        self._fetches_total += 1
        held = self.buffer.held + self.buffer.zombies
        if held > self._peak_buffer_slots:
            self._peak_buffer_slots = held
        return entry

    def _on_fetch_done(self, tr: Any) -> None:  # a chipsim.sim.dma.Transfer (or chipsim.sim.native's)
        entry: Entry = tr.tag  # typed: compiled code reads its fields natively
        key = entry.key
        moved: int = tr.moved_bytes  # typed: added natively below (tr is Any)
        self._unlanded -= 1
        if self._pageable:
            self._pageable_in_flight -= 1
            if not self._pageable_in_flight and self._host_waiters:
                waiters, self._host_waiters = self._host_waiters, []
                for ev in waiters:  # (a copy issued at this instant holds them again: they wait in a loop)
                    self._succeed(ev)
        self._tally.fetched += moved
        if self._stage_in_sram:  # it lands in the arrays' SRAM
            self._tally.sram_write_bits += 8 * moved
        if self._observer is not None:
            self._observer.landed(key[0], key[1], tr.priority == DEMAND, tr.issue_ps, self._now())
        entry.parts_left -= 1
        if entry.parts_left:
            return
        # every transfer has landed: drop the entry <-> transfer cycle, so that both go by reference counting
        # once evicted instead of waiting for the cyclic garbage collector
        entry.transfers.clear()
        if entry.evicted:
            self.buffer.zombies -= 1
            self._demands.serve()
            return
        entry.resident = True
        if self._demands.pending:
            self._demands.serve()
        if self._arrival_event is not None and key[0] == self._waiting_layer:
            ev, self._arrival_event = self._arrival_event, None
            self._succeed(ev)

    # the events the engine creates, on its core (chipsim.sim.core)
    def _now(self) -> int:
        now: int = self.env.now  # typed: compiled code reads it as a native int
        return now

    def _timeout(self, delay_ps: int) -> Any:
        return self._new_timeout(self.env, delay_ps)

    def _event(self) -> Any:
        return self._new_event(self.env)

    def _succeed(self, event: Any) -> None:
        self._fire(event)

    def _process(self, generator: Generator[Any, Any, Any]) -> Any:
        return self._new_process(self.env, generator)

    def _all_of(self, events: list[Any]) -> Any:
        return self._new_all_of(self.env, events)

    def _host_job(self, layer: int, expert: int, timing: HostTiming | None = None) -> Generator[Any, Any, None]:
        """An expert computed on the host CPU: activations over PCIe, weights from LPDDR5X (a flow sharing it
        with the fetches, no faster than the CPU computes or its own memory bandwidth allows), result back.
        `timing`: for the tokens a prefill chunk routes to it (default: one token)."""
        if timing is None:
            timing = self.host_timing
        while self._pageable_in_flight:  # the host thread computes it once its pageable copies let it go
            yield self._host_released()
        with self.host.request() as req:
            yield req
            start = self._now()
            nbytes = self.workload.expert_bytes
            yield self._timeout(timing.total_ps - timing.compute_ps)  # dispatch + activations over PCIe
            done = self._event()
            self.network.add(nbytes, self._host_flow_path, cap=-(-nbytes * PS_PER_S // timing.compute_ps),
                             on_target=lambda _f: self._succeed(done), not_before=self._now() + timing.compute_ps)
            yield done
        tally = self._tally
        tally.host_busy_ps += self._now() - start - timing.transit_ps
        tally.bytes[tally.at_host_memory] += nbytes  # the CPU reads its own copy
        tally.bytes[tally.at_host_link] += timing.activation_bytes
        tally.bytes[tally.at_operand_link] += timing.activation_bytes
        if self._observer is not None:
            self._observer.host_job(layer, expert, start, self._now())

    def _compute(self, work: Work, kind: str, index: int, groups: int = 1, experts: list[int] | None = None,
                 waits: int = 0) -> Generator[Any, Any, None]:
        """Run arrays work: an op group of `kind` (chipsim.sim.observe.OP_KINDS) of layer `index`, `groups` op
        groups as a GPU launches them (after `waits` waits for fetched experts). Its fixed part takes its own time;
        its operands then stream as a flow over HBM and the memory-to-compute UCIe link, no faster than the arrays
        consume them alone, slower when other flows share those resources. Work the program enqueues while pageable
        copies hold the host starts once they have ended; with the host's pace, once the host has enqueued it (the
        pace sees the work before the next charge); its launches cost compute.launch_beside_copy_ns more each where
        a copy is in flight, from its issue to its landing, when the work starts."""
        launches = groups
        if self._segments:  # the segment launches _launched added to it
            launches = self._segments_now
            self._segments_now = 0
        if self._pageable_in_flight:
            yield from self._await_host(-1 if kind == "dense" or kind == "head" else index)
        if self._pace is not None:
            yield from self._await_enqueued(work, -1 if kind == "dense" or kind == "head" else index, launches, waits)
        if self._beside_copy is not None and launches and self._unlanded:
            work = work + self._beside_copy.times(launches)
        self._tally.work(work)
        if self._operation is not None:  # the core runs it as one event, which hands back the time it took
            busy: int = yield self._operation(self.network, work.ps, work.fixed, work.bytes, self._operand_flow_path,
                                              self._operand_alone_rate, work.sram_bytes, work.sram_ps,
                                              self._sram_flow_path, self._sram_alone_rate)
            self._ran(work, kind, index, experts, busy)
            return
        start = self._now()
        fixed, hbm_ps, sram_ps = work.fixed, work.ps - work.fixed - work.sram_ps, work.sram_ps
        streams_hbm = work.bytes and hbm_ps > 0
        sram_path = self._sram_flow_path
        streams_sram = work.sram_bytes and sram_ps > 0 and sram_path is not None
        if streams_hbm or streams_sram:
            fixed += (0 if streams_hbm else hbm_ps) + (0 if streams_sram else sram_ps)
            if fixed:
                yield self._timeout(fixed)
            if streams_hbm:
                yield self._stream(work.bytes, hbm_ps, self._operand_flow_path)
            if streams_sram and sram_path is not None:  # experts staged in SRAM: their reads share its ports with
                yield self._stream(work.sram_bytes, sram_ps, sram_path)  # the fetches landing there
        else:
            yield self._timeout(work.ps)
        self._ran(work, kind, index, experts, self._now() - start)

    def _await_host(self, index: int) -> Generator[Any, Any, None]:
        """The arrays wait for the host thread, held in pageable copies until every one issued so far has ended
        (what it enqueued before them runs meanwhile: the launch queue's run-ahead); a stall of MoE layer `index`
        (-1: outside MoE layers)."""
        start = self._now()
        while self._pageable_in_flight:
            yield self._host_released()
        self._host_blocked_ps += self._now() - start
        self._host_synced()  # the host comes back from its copies now
        if self._observer is not None:
            self._observer.stall(index, start, self._now())

    def _host_released(self) -> Any:
        """An event that fires when no pageable copy holds the host any more."""
        ev = self._event()
        self._host_waiters.append(ev)
        return ev

    def _await_enqueued(self, work: Work, index: int, launches: int, waits: int) -> Generator[Any, Any, None]:
        """The arrays wait for the host to enqueue `work`: its `launches` (op groups, or the segment launches
        _launched added) after `waits` event waits; a stall of MoE layer `index` (-1: outside MoE layers)."""
        pace = self._pace
        assert pace is not None
        self._marker_due = True  # a transfer issued after this compute records its own issue point
        delay = pace.start_delay(launches, waits, work.ps, self._now())
        if delay:
            start = self._now()
            yield self._timeout(delay)
            self._host_blocked_ps += delay
            if self._observer is not None:
                self._observer.stall(index, start, self._now())

    def _host_synced(self) -> None:
        """The host waited for the machine until now (a read-back, its copies or experts, an arrival, a draft): with
        its pace modelled, what it enqueues next starts from here."""
        if self._pace is not None:
            self._pace.synced(self._now())

    def _copy_enqueued(self, parts: int) -> int:
        """The host enqueues a transfer: an issue point (one per run of issues), the copy stream's wait for it, a
        copy per part (a pageable copy's call is inside its own fixed cost) and an event after. Returns when it
        has (0: before now)."""
        pace = self._pace
        assert pace is not None
        events = 2 + int(self._marker_due)
        self._marker_due = False
        now = self._now()
        done = pace.enqueue_now(0, 0 if self._pageable else parts, events, now)
        return done if done > now else 0

    def _step_marked(self) -> None:
        """A step's end is marked between it and the next (an event the host records): a segment ends."""
        self._synced = True
        pace = self._pace
        if pace is not None:
            pace.enqueue_now(0, 0, 1, self._now())
            self.host_issue_marks.append(pace.busy_ps)

    def _read_back(self, layer: int) -> Generator[Any, Any, int]:
        """host_frontend.routing: host: the arrays idle while the host reads the layer's routing back (a stall: what
        follows waits for the host's decision on the layer's experts). Returns it (ps; 0 where routing is on the
        device)."""
        if not self._readback_ps:
            return 0
        start = self._now()
        yield self._timeout(self._readback_ps)
        self._host_synced()  # the host has the routing now: what follows is enqueued from here
        self._synced = True  # the host synchronised: the compute after it starts a new segment (launch_per: segment)
        if self._observer is not None:
            self._observer.stall(layer, start, self._now())
        return self._readback_ps

    def _in_layer_blocked(self, before: int) -> int:
        """The time the arrays waited for a host held in pageable copies since `before` (_host_blocked_ps then),
        counted as the layer's stall."""
        blocked = self._host_blocked_ps - before
        self._blocked_in_layers += blocked
        return blocked

    def _blocked_outside_layers(self, before: tuple[int, int]) -> int:
        """Of the time the arrays waited for a host held in pageable copies since `before` (_host_blocked_ps,
        _blocked_in_layers then), what no MoE layer counted (in dense layers, the head): the step's own stall."""
        return (self._host_blocked_ps - before[0]) - (self._blocked_in_layers - before[1])

    def _ran(self, work: Work, kind: str, index: int, experts: list[int] | None, busy: int) -> None:
        """Arrays work has run, taking `busy` ps up to now."""
        self._tally.busy_ps += busy
        self._tally.occupied(work, busy)
        if self._observer is not None:
            end = self._now()
            self._observer.ops(kind, index, experts, end - busy, end)

    def _stream(self, nbytes: int, alone_ps: int, path: Path) -> Any:
        """An operand stream as a flow: the cap (rounded up) lets it move as fast as its arrays consume and no
        faster, so alone it ends after exactly `alone_ps`, with other flows on its resources later."""
        done = self._event()
        self.network.add(nbytes, path, cap=-(-nbytes * PS_PER_S // alone_ps), on_target=lambda _f: self._succeed(done),
                         not_before=self._now() + alone_ps)
        return done

    def _launched(self, work: Work) -> Work:
        """`work` with a segment launch (compute.launch_per: segment) if a synchronisation with the DMA came
        since the last compute."""
        launch = self._segment_launch
        if not self._segments or not self._synced:
            return work
        self._synced = False
        self.segment_launches += 1
        self._segments_now = 1
        if self._observer is not None:
            self._observer.launches(1)
        return work + launch if launch is not None else work

    def _launched_experts(self, work: Work, entries: list[Entry]) -> Work:
        """A batch of experts with its segment launches: each expert in turn starts one after a synchronisation,
        and a fetched expert's first use is one (a wait for its transfer). The layer's shared experts, computed
        with the batch here, run before the route's issues on a GPU, in attention's segment: no launch."""
        launch = self._segment_launch
        if not self._segments:
            return work
        n = 0
        synced = self._synced
        for entry in entries:
            if not entry.waited:
                entry.waited = True
                synced = True
            if synced:
                n += 1
                synced = False
        self._synced = False
        if not n:
            return work
        self.segment_launches += n
        self._segments_now = n
        if self._observer is not None:
            self._observer.launches(n)
        if launch is None:  # segments counted for the host's pace alone
            return work
        return work + (launch if n == 1 else launch.times(n))

    def _layer_costs(self) -> list[LayerCost]:
        # each layer's router and mixer kind, for the decode steps whose mixer depends on the context (_decode_costs)
        self._routers = [cost_of(layer.router) for layer in self.workload.layers]
        self._mixer_kinds = [self.model.mixer(li) for li in range(len(self.workload.layers))]
        costs = []
        fmt = self.expert_format
        for layer in self.workload.layers:
            if not layer.expert:
                expert = NO_WORK
            elif fmt.operands_in_sram:
                expert = Work(fmt.compute_ps, 0, fmt.fixed_ps, fmt.macs, fmt.sfu_ops, fmt.vector_ops, fmt.hbm_bytes,
                               fmt.compute_ps - fmt.fixed_ps, fmt.occupied_ps, fmt.profiled_pj,
                               unpriced_sram_bytes=fmt.unpriced_bytes)
            else:
                expert = Work(fmt.compute_ps, fmt.hbm_bytes, fmt.fixed_ps, fmt.macs, fmt.sfu_ops, fmt.vector_ops,
                               occupied=fmt.occupied_ps, profiled_pj=fmt.profiled_pj, unpriced_bytes=fmt.unpriced_bytes)
            costs.append(LayerCost(cost_of(layer.attention) + cost_of(layer.router), cost_of(layer.dense),
                                    expert, cost_of(layer.combine)))
        return costs

    def _decode(self) -> Generator[Any, Any, None]:
        costs = self._layer_costs()
        head = cost_of(self.workload.token_head)
        if self.request is not None:
            yield from self._request(costs, head, self.request)
            return
        self.policy.on_run_start(self.context)
        if self.served is not None:
            yield from self._serve(costs, head, self.served)
            return
        if self.batch is not None:
            size, layers, head_work = self.batch.batch, self.batch.layers, self.batch.head
            for i in range(self.num_steps):
                yield from self._batch_step(i, range(i * size, i * size + size), layers, head_work)
            return
        if self.speculative is not None:
            for row, step in enumerate(self.speculative.steps):
                yield from self._speculative_step(row, step, costs, head, self.speculative)
            return
        for t in range(self.num_tokens):
            yield from self._token(t, costs, head, t)
        # transfers still in flight land after this, charged to the last token's ledger

    def _token(self, t: int, costs: list[LayerCost], head: Work, row: int) -> Generator[Any, Any, None]:
        """One decode step of trace token t, recorded as step `row`: dense layers, MoE layers, LM head; records its
        latency and stall."""
        token_start = self._now()
        self._current_token = t
        if self._observer is not None:
            self._observer.token_start(t, token_start)
        self._token_routed = self._routed[t]  # this token's routing, per MoE layer
        self.rec.start_token()
        stall = 0
        blocked = (self._host_blocked_ps, self._blocked_in_layers)
        with self.dma.batch():
            self.policy.on_token_start(self.context, t)
        dense = self.model.first_dense_layers
        for li, cost in enumerate(costs):
            if li < dense:
                yield from self._compute(self._launched(cost.pre + cost.dense), "dense", li, 2)
            else:
                stall += yield from self._moe_layer(t, li - dense, cost, row)
        yield from self._compute(self._launched(head), "head", -1, 1)
        self._step_marked()
        if self._observer is not None:
            self._observer.token_end(t, token_start, self._now())
        self._tally.add_to(self.rec.ledger)
        stall += self._blocked_outside_layers(blocked)
        self.rec.end_token(row, self._now() - token_start, stall)

    def _moe_layer(self, t: int, layer: int, cost: LayerCost, row: int) -> Generator[Any, Any, int]:
        """One MoE layer: the policy prefetches, attention and the router run, routing decides, the experts
        run as their bytes arrive, the policy evicts. Returns the layer's stall (ps)."""
        if self._observer is not None:
            self._observer.layer_start(t, layer)
        blocked = self._host_blocked_ps
        with self.dma.batch():
            self.policy.on_layer_start(self.context, t, layer)
        yield from self._compute(self._launched(cost.pre), "attention", layer, 2)
        readback = yield from self._read_back(layer)
        plan = self._route(t, layer, row)
        stall = yield from self._run_experts(t, layer, plan, cost, row)
        stall += readback + self._in_layer_blocked(blocked)
        self._layer_stall[row * self.num_moe_layers + layer] = stall
        if self._observer is not None:
            self._observer.layer_end(t, layer)
        with self.dma.batch():
            self.policy.on_layer_end(self.context, t, layer)
        return stall

    def _route(self, t: int, layer: int, row: int, routed: list[int] | None = None) -> LayerPlan:
        """Routing is known: record what the buffer held, ask the policy what runs, demand-fetch what is
        missing of it. `routed`: a prefill chunk's union of its tokens' experts (default: token t's)."""
        if routed is None:
            routed = list(self._token_routed[layer])  # (a copy: the policy may keep or change it)
        slot_of = self._slot_of
        base = layer * self.num_experts  # (routed experts are checked against the model when the trace loads)
        hits = 0
        for e in routed:
            if slot_of[base + e] is not None:
                hits += 1
        cell = t * self.num_moe_layers + layer
        self._layer_hits[row * self.num_moe_layers + layer] = hits  # (overlap: hits == routed experts, at the end)
        self._routed_upto = cell  # this layer's routing is known from here on
        known = self._known
        if known is not None:  # a served step: its tokens' routing of this layer is known from here on
            for token in self._step_tokens:
                known[token] = layer
        with self.dma.batch():
            if self._observer is not None:
                self._observer.route(t, layer)
            plan = self.context._checked_plan(t, layer, self.policy.on_route(self.context, t, layer, routed))
            if self._observer is not None:
                self._observer.plan(t, layer, plan)
            execute = plan.execute  # (exact ids of the model: _run_experts copies it)
            demands = 0
            for expert in execute:
                if slot_of[base + expert] is None:
                    demands += 1
                self._demands.demand(layer, expert, execute)
        self._layer_demands[row * self.num_moe_layers + layer] = demands
        return plan

    def _run_experts(self, t: int, layer: int, plan: LayerPlan, cost: LayerCost, row: int,
                     tokens: dict[int, int] | None = None) -> Generator[Any, Any, int]:
        """The layer's shared experts, then its routed experts in batches as their bytes land (stalling
        while none has), host-CPU experts and surrogates, then the weighted sum. Returns the stall (ps).
        `tokens`: a prefill chunk's tokens routed to each expert (each then a GEMM over them; default: one token)."""
        expert, combine = cost.expert, cost.combine
        extra = cost.dense  # shared experts run first, while fetches proceed
        if tokens is None:
            host_jobs = [self._process(self._host_job(layer, e)) for e in plan.on_host]
        else:
            host_jobs = [self._process(self._host_job(layer, e, self._host_timing_for(tokens.get(e, 1))))
                         for e in plan.on_host]
        if plan.on_host or plan.surrogate or plan.substituted or plan.dropped:
            layers = self.rec.layers
            layers.host[row, layer] = len(plan.on_host)
            layers.surrogate[row, layer] = len(plan.surrogate)
            layers.substituted[row, layer] = plan.substituted
            layers.dropped[row, layer] = plan.dropped
            if plan.surrogate:
                extra = extra + cost_of(self.policy.surrogate_op).times(len(plan.surrogate))
            if host_jobs:  # the weighted sum waits for the host's results
                combine_later, combine = combine, NO_WORK
        stall = 0
        remaining = list(plan.execute)
        slot_of = self._slot_of
        base = layer * self.num_experts  # (_route checked each executed expert)
        while remaining:
            ready: list[int] = []
            ready_entries: list[Entry] = []
            waiting: list[int] = []
            for e in remaining:
                entry = slot_of[base + e]
                if entry is not None and entry.resident:
                    ready.append(e)
                    ready_entries.append(entry)
                else:
                    waiting.append(e)
            if ready:
                last = len(ready) == len(remaining)
                batch = expert.times(len(ready)) if tokens is None else self._gemm_experts_work(ready, tokens)
                work = extra + batch + (combine if last else NO_WORK)
                groups = waits = 0  # what the host enqueues for them (counted where its pace or launches cost)
                if self._pace is not None or self._beside_copy is not None:
                    # op groups the replay launches (each expert, the shared experts, the weighted sum), and a wait
                    # for each fetched expert used for the first time
                    groups = len(ready) + _groups(extra, combine if last else NO_WORK)
                    waits = 0 if self._in_place else sum(1 for entry in ready_entries if not entry.used)
                extra = NO_WORK
                use = (t if self._use_clock < 0 else self._use_clock) * self.num_moe_layers + layer
                for entry in ready_entries:
                    entry.used = True
                    entry.last_use = use
                if self._segments:
                    work = self._launched_experts(work, ready_entries)
                yield from self._compute(work, "experts", layer, groups, ready, waits)
                self._expert_computes += len(ready)
                remaining = waiting
            elif extra.ps:  # shared experts do not wait for routed ones
                yield from self._compute(extra, "shared", layer, 1)
                extra = NO_WORK
            else:
                stall += yield from self._await_arrival(layer)
        if host_jobs:
            wait_start = self._now()
            yield self._all_of(host_jobs)
            self._host_synced()  # the host computed them: it enqueues what follows now
            self.rec.host_wait_ps[row] += self._now() - wait_start
            if self._observer is not None:
                self._observer.host_wait(layer, wait_start, self._now())
            yield from self._compute(self._launched(extra + combine_later), "combine", layer,
                                     _groups(extra, combine_later))
        elif not plan.execute:
            yield from self._compute(self._launched(extra + combine), "combine", layer, _groups(extra, combine))
        return stall

    def _await_arrival(self, layer: int) -> Generator[Any, Any, int]:
        """The arrays wait for the next of this layer's experts to land; returns the stall (ps)."""
        self._waiting_layer = layer
        self._arrival_event = self._event()
        wait_start = self._now()
        yield self._arrival_event
        if self._copy_wait_ps:  # the hand-off from the copy engine back to compute
            yield self._timeout(self._copy_wait_ps)
        if self._observer is not None:
            self._observer.stall(layer, wait_start, self._now())
        return self._now() - wait_start

    # ======================================================================== a whole request
    def _request(self, costs: list[LayerCost], head: Work, req: RequestWorkload) -> Generator[Any, Any, None]:
        """A request: its prefill chunks under the prefill policy, which then says what stays in the buffer, and
        its decode steps under the decode policy, step j attending over the prompt and the j tokens since."""
        decode_policy, decode_context = self.policy, self.context
        self.policy = self.prefill_policy
        prefill_context = self.prefill_context
        assert prefill_context is not None
        self.context = prefill_context
        self.policy.on_run_start(self.context)
        for k, chunk in enumerate(req.chunks):
            yield from self._prefill_chunk(k, chunk, chunk.offset)
        with self.dma.batch():
            self.policy.on_prefill_end(self.context)
        self._step_first = _NO_STEP
        self.policy, self.context = decode_policy, decode_context
        self._decode_format(decode_policy)
        self.policy.on_run_start(self.context)
        chunks, prompt = len(req.chunks), req.prompt_tokens
        for step in range(1, req.output_tokens):
            step_costs = self._decode_costs(costs, req.decode_mixer, req.step_context(step))
            yield from self._token(prompt + step - 1, step_costs, head, chunks + step - 1)

    def _decode_costs(self, costs: list[LayerCost], mixer: Any, context: int) -> list[LayerCost]:
        """A request's decode step over `context` tokens: each layer's costs with `mixer(kind, context)` (and the
        router) in place of the decode workload's mixer."""
        routers, kinds = self._routers, self._mixer_kinds
        return [cost._replace(pre=cost_of(mixer(kinds[li], context)) + routers[li]) for li, cost in enumerate(costs)]

    def _decode_format(self, policy: Any) -> None:
        """Decode moves and stores experts in its policy's format: where that is not prefill's (FloE's compressed
        experts, per-matrix transfers), nothing prefill left in the buffer is of use and it is evicted; so it is for a
        policy that keeps its own record of the buffer (Policy.adopts_buffer)."""
        prefill_format = self.expert_format
        self._expert_format(policy, self.workload, self.hw)
        if self.expert_format != prefill_format or not policy.adopts_buffer:
            with self.dma.batch():
                for entry in self.buffer.in_buffer():
                    self._evict_at(entry.index, True)
        self.buffer.slots = self.slots

    def _prefill_chunk(self, k: int, chunk: PrefillChunk, first: int) -> Generator[Any, Any, None]:
        """Prefill chunk k, recorded as step k, over trace tokens first ..: every layer over its tokens at once, each
        MoE layer's experts the union of its tokens' routed sets; the prompt's last chunk ends with the first output
        token's LM head."""
        start = self._now()
        last = first + chunk.tokens - 1
        self._step_first = first
        self._current_token = last
        if self._observer is not None:
            self._observer.prefill_start(k, first, last, start)
        self.rec.start_token()
        with self.dma.batch():
            self.policy.on_token_start(self.context, last)
        stall = 0
        blocked = (self._host_blocked_ps, self._blocked_in_layers)
        dense = self.model.first_dense_layers
        for li, layer in enumerate(chunk.layers):
            if li < dense:
                yield from self._compute(self._launched(cost_of(layer.mixer) + cost_of(layer.dense)), "dense", li,
                                         2)
            else:
                stall += yield from self._tokens_layer(k, range(first, last + 1), li - dense,
                                                       cost_of(layer.mixer) + cost_of(layer.router),
                                                       cost_of(layer.dense), cost_of(layer.combine))
        yield from self._compute(self._launched(cost_of(chunk.head)), "head", -1, 1)
        self._step_marked()
        if self._observer is not None:
            self._observer.prefill_end(k, first, last, start, self._now())
        self._tally.add_to(self.rec.ledger)
        stall += self._blocked_outside_layers(blocked)
        self.rec.end_token(k, self._now() - start, stall)

    def _tokens_layer(self, k: int, tokens: Sequence[int], layer: int, pre: Work, dense: Work, combine: Work
                      ) -> Generator[Any, Any, int]:
        """One MoE layer of step k, its `tokens` at once (a prefill chunk, a batch step, a served step; the last
        one is the hooks' t): the policy's layer start, the mixer and router (`pre`), the union of the tokens'
        experts routed, run (each a GEMM over its tokens) and ended as a decode layer is. Returns the layer's stall
        (ps)."""
        last = tokens[-1]
        if self._observer is not None:
            self._observer.layer_start(last, layer)
        blocked = self._host_blocked_ps
        with self.dma.batch():
            self.policy.on_layer_start(self.context, last, layer)
        yield from self._compute(self._launched(pre), "attention", layer, 2)
        readback = yield from self._read_back(layer)
        counts: dict[int, int] = {}  # expert -> the step's tokens routed to it, in order of first appearance
        routed = self._routed
        for t in tokens:
            for e in routed[t][layer]:
                counts[e] = counts.get(e, 0) + 1
        if self._layer_union is not None:
            self._layer_union[k * self.num_moe_layers + layer] = len(counts)
        plan = self._route(last, layer, k, list(counts))
        if plan.tokens is not None:  # the policy changed what runs: its own count of each expert's tokens
            counts = plan.tokens
        cost = LayerCost(NO_WORK, dense, NO_WORK, combine)
        stall = yield from self._run_experts(last, layer, plan, cost, k, counts)
        stall += readback + self._in_layer_blocked(blocked)
        self._layer_stall[k * self.num_moe_layers + layer] = stall
        if self._observer is not None:
            self._observer.layer_end(last, layer)
        with self.dma.batch():
            self.policy.on_layer_end(self.context, last, layer)
        return stall

    def _speculative_step(self, row: int, step: SpecStep, costs: list[LayerCost], head: Work,
                          spec: SpecWorkload) -> Generator[Any, Any, None]:
        """A speculative step: a plain decode step where nothing was drafted, else the draft's wait and one pass
        over the input token and its drafts. What was routed from the input token on (drafts an earlier step verified,
        some rejected) is not known until this step routes it again."""
        self._routed_upto = step.first * self.num_moe_layers - 1
        if step.tokens == 1:
            yield from self._token(step.first, costs, head, row)
            return
        layers, verify_head = spec.verify(step.tokens)
        yield from self._batch_step(row, range(step.first, step.first + step.tokens), layers, verify_head,
                                    spec.draft_ps)

    def _batch_step(self, i: int, tokens: Sequence[int], layers: Sequence[BatchLayer], head: Any, wait_ps: int = 0
                    ) -> Generator[Any, Any, None]:
        """Step i over `tokens` at once (one of every sequence of a batch, a verify step's input and drafts, a served
        step's parts) through every layer, each MoE layer's experts the union of the tokens' routed sets, then their
        LM heads; `wait_ps` first (a speculative step's draft)."""
        start = self._now()
        if wait_ps:
            yield self._timeout(wait_ps)
            self._host_synced()  # the host enqueues the verify step once the draft is done
        last = tokens[-1]
        self._step_first = tokens[0]
        self._current_token = last
        if self._observer is not None:
            self._observer.token_start(last, start)
        self.rec.start_token()
        with self.dma.batch():
            self.policy.on_token_start(self.context, last)
        stall = 0
        blocked = (self._host_blocked_ps, self._blocked_in_layers)
        dense = self.model.first_dense_layers
        for li, layer in enumerate(layers):
            if li < dense:
                yield from self._compute(self._launched(cost_of(layer.pre) + cost_of(layer.dense)), "dense", li, 2)
            else:
                stall += yield from self._tokens_layer(i, tokens, li - dense, cost_of(layer.pre),
                                                       cost_of(layer.dense), cost_of(layer.combine))
        yield from self._compute(self._launched(cost_of(head)), "head", -1, 1)
        self._step_marked()
        if self._observer is not None:
            self._observer.token_end(last, start, self._now())
        self._tally.add_to(self.rec.ledger)
        stall += self._blocked_outside_layers(blocked)
        self.rec.end_token(i, self._now() - start, stall)
        self._step_first = _NO_STEP  # a later one-token step's routing rule is the cell's alone

    # ======================================================================== many requests served
    def _serve(self, costs: list[LayerCost], head: Work, served: Any) -> Generator[Any, Any, None]:
        """A served run: step after step, the parts its scheduler picks at the step's start; with none to run, the
        chip waits for the next arrival (idle). Ends when every request has finished."""
        row = 0
        while not served.done:
            now = self._now()
            parts = served.plan_step(now)
            if not parts:
                arrival = served.next_arrival_ps()
                assert arrival is not None and arrival > now, "a served run has requests left but none can run"
                served.idle(now, arrival)
                yield self._timeout(arrival - now)
                self._host_synced()  # nothing to enqueue before the arrival: the host starts from it
                continue
            if row == self.num_steps:
                self._grow_steps()
            if self._observer is not None:
                self._observer.served_step(row, parts, now)
            self._use_clock = row
            yield from self._served_step(row, parts, costs, head, served.costs)
            served.step_done(parts, now, self._now())
            row += 1
        self._served_steps = row

    def _served_step(self, row: int, parts: list[Any], costs: list[LayerCost], head: Work, priced: Any
                     ) -> Generator[Any, Any, None]:
        """Step `row` of a served run: one decode token or one prompt chunk as a lone request runs it, several parts
        as a batch step (chipsim.workload.served)."""
        if len(parts) > 1:
            step = priced.mixed(parts)
            tokens = tuple([t for p in parts for t in range(p.first, p.first + p.tokens)])
            self._step_tokens = tokens
            yield from self._batch_step(row, tokens, step.layers, step.head)
            return
        part = parts[0]
        if part.decode:
            self._step_tokens = (part.first,)
            yield from self._token(part.first, self._decode_costs(costs, priced.decode_mixer, part.position + 1),
                                   head, row)
            return
        self._step_tokens = range(part.first, part.first + part.tokens)
        yield from self._prefill_chunk(row, priced.chunk(part.position, part.tokens, part.emits), part.first)
        self._step_first = _NO_STEP

    def _grow_steps(self) -> None:
        """Twice the steps recorded so far (a served run's steps are known only as it runs)."""
        more = self.num_steps
        cells = more * self.num_moe_layers
        self._layer_hits += [0] * cells
        self._layer_demands += [0] * cells
        self._layer_stall += [0] * cells
        if self._layer_union is not None:
            self._layer_union += [self._routed_per_layer] * cells
        self.num_steps += more
        self.rec.grow(self.num_steps)

    def _host_timing_for(self, tokens: int) -> HostTiming:
        """A host-CPU expert over `tokens` tokens (one per token count, made once)."""
        timing = self._host_timings.get(tokens)
        if timing is None:
            timing = self._host_timings[tokens] = host_timing(self.hw, self.workload, tokens)
        return timing

    def _gemm_experts_work(self, experts: list[int], tokens: dict[int, int]) -> Work:
        """Experts of a step of several tokens (a prefill chunk, a batch, a verify step), each a GEMM over its tokens."""
        work = NO_WORK
        for e in experts:
            work = work + self._gemm_expert_work(tokens.get(e, 1))
        return work

    def _gemm_expert_work(self, tokens: int) -> Work:
        """One routed expert as a GEMM over `tokens` tokens, as arrays work (operands from SRAM where experts are
        staged there)."""
        work = self._expert_works.get(tokens)
        if work is None:
            op = self._gemm_source.expert(tokens)
            if self.expert_format.operands_in_sram:
                nbytes = op.hbm_read_bytes + op.hbm_write_bytes
                work = Work(op.duration_ps, 0, op.fixed_ps, op.macs, op.sfu_ops, op.vector_ops, nbytes,
                            op.duration_ps - op.fixed_ps, op.occupied_ps, op.profiled_pj,
                            unpriced_sram_bytes=op.unpriced_bytes)
            else:
                work = cost_of(op)
            self._expert_works[tokens] = work
        return work

    def run(self) -> SimResult:
        process = self._process(self._decode())
        self.env.run()
        if not process.triggered:
            raise PolicyError(
                f"policy {self.policy.label} stalled for good at t={self._now()} ps: the layer waits for experts "
                f"that can never arrive (buffer of {self.slots} slots full: {self.buffer.held} entries, "
                f"{self.buffer.zombies} stopping, {len(self._demands.pending)} demands waiting)"
            )
        self._tally.add_to(self.rec.ledger)  # transfers that landed after the last token: charged to it
        if self.served is not None:  # the steps the run took
            self.num_steps = self._served_steps
            cells = self.num_steps * self.num_moe_layers
            for cell_list in (self._layer_hits, self._layer_demands, self._layer_stall, self._layer_union):
                if cell_list is not None:
                    del cell_list[cells:]
            self.rec.grow(self.num_steps)
        union = None
        if self._layer_union is not None:
            union = np.array(self._layer_union, dtype=np.int64).reshape(self.num_steps, self.num_moe_layers)
        self._record_layers(union)
        self.rec.counts = RunCounts(prefetches_issued=self._prefetches_issued,
                                    prefetches_dropped=self._prefetches_dropped,
                                    prefetches_unused=self._prefetches_unused, fetches_total=self._fetches_total,
                                    peak_buffer_slots=self._peak_buffer_slots, expert_computes=self._expert_computes)
        timeline = self._timeline.timeline() if self._timeline is not None else None
        label = self.policy.label
        if self.request is None:
            result = self.rec.result(label, self.num_moe_layers, self.policy.extra_metrics(), timeline)
            result.union = union
            if self.batch is not None:
                result.batch = self.batch.batch
            if self.speculative is not None:
                steps = self.speculative.steps
                result.speculative = np.array([(s.first, s.tokens, s.accepted) for s in steps], dtype=np.int64)
            if self.served is not None:
                result.served = self.served.record()
            return result
        extra = {f"prefill_{k}": v for k, v in self.prefill_policy.extra_metrics().items()}
        result = self.rec.result(label, self.num_moe_layers, {**extra, **self.policy.extra_metrics()}, timeline)
        result.prefill_steps = len(self.request.chunks)
        result.prefill_chunk_tokens = tuple(c.tokens for c in self.request.chunks)
        return result

    def _record_layers(self, union: np.ndarray | None) -> None:
        """The per-(token, MoE layer) lists into rec.layers (overlap: every routed expert was in the buffer; in a step
        of several tokens, every one of their `union`)."""
        layers = self.rec.layers
        shape = layers.hits.shape
        layers.hits[...] = np.array(self._layer_hits, dtype=np.int64).reshape(shape)
        layers.demand_fetches[...] = np.array(self._layer_demands, dtype=np.int64).reshape(shape)
        layers.stall_ps[...] = np.array(self._layer_stall, dtype=np.int64).reshape(shape)
        layers.overlap[...] = layers.hits == (self._routed_per_layer if union is None else union)
