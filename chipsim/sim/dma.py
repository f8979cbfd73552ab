"""DMA engines and their queues, moving data over a shared path of resources (chipsim.sim.flows).

Model (all times integer picoseconds):
- A transfer first waits for a free DMA engine (demand fetches ahead of queued prefetches, FIFO within
  a class), then spends the per-descriptor setup time, then moves its bytes as a flow over the path's
  resources, then its last byte needs the path's summed latency to land. On an idle path an N-byte
  transfer therefore finishes at setup + ΣL + N / min(B).
- In their data phase transfers share every resource of the path with each other and with any other flow
  crossing it (operand reads of HBM, the host CPU's reads of LPDDR5X), max-min fairly
  (chipsim.sim.flows): two equal transfers started together on an idle path both finish at
  setup + ΣL + 2N/B.
- While a demand fetch is moving data or waiting for an engine, every prefetch in its data phase runs
  on to its next chunk boundary and then pauses, giving back its engine; paused prefetches resume
  (without a second setup) once no demand fetch is left.

With `demand_first` off there is one FIFO queue in issue order (a CUDA copy stream): a demand fetch waits
behind every transfer issued before it (preemption must then be off too).
"""

from __future__ import annotations

from heapq import heappop, heappush
from collections import deque
from typing import Any, Callable, ClassVar, Final

from mypy_extensions import mypyc_attr

from chipsim.sim.flows import WRITE, Flow, FlowNetwork, Path
from chipsim.units import PS_PER_S

DEMAND: Final = 0
PREFETCH: Final = 1

# transfer states
QUEUED: Final = 0
SETUP: Final = 1
ACTIVE: Final = 2
DRAINING: Final = 3
PAUSED: Final = 4
DONE: Final = 5


class Transfer:
    __slots__ = (
        "tid", "nbytes", "priority", "tag", "state", "remaining", "boundary",
        "issue_ps", "data_start_ps", "data_end_ps", "finish_ps", "setup_done", "cancelled", "moved_bytes",
        "descriptors", "flow", "not_before_ps",
    )

    def __init__(self, tid: int, nbytes: int, priority: int, tag: Any, now: int, descriptors: int = 1) -> None:
        self.tid = tid
        self.nbytes = nbytes
        self.priority = priority
        self.tag = tag
        self.state = QUEUED
        self.remaining = 0  # units (1e-12 byte) left when its flow last left the network
        self.boundary = 0  # remaining units at which a draining prefetch pauses
        self.issue_ps = now
        self.data_start_ps = -1
        self.data_end_ps = -1
        self.finish_ps = -1
        self.setup_done = False
        self.cancelled = False
        self.moved_bytes = 0  # set when the transfer ends: all its bytes, or what moved before a cancel
        self.descriptors = descriptors  # a chain (e.g. gate, up, down): one setup cost per descriptor
        self.flow: Flow | None = None  # its data phase in the flow network (from its first data byte)
        self.not_before_ps = 0  # its setup starts no earlier (the host enqueues it then: chipsim.sim.host_pace)


def _flow(tr: Transfer) -> Flow:
    """A transfer's flow, once its data phase has begun."""
    flow = tr.flow
    assert flow is not None
    return flow


@mypyc_attr(allow_interpreted_subclasses=True)  # chipsim.hwreplay.plan notes the bytes of each data span
class DmaRecorder:
    """What a timeline needs from the DMA path, kept only while one is recorded (`DmaPath.recorder`, and
    chipsim.sim.native's: its path and transfers are typed Any here): which engine each transfer holds (lowest
    free id first), the spans of its setup and data phases on that engine, and samples of the link's state.
    `stopping` takes no new transfers; once the held ones are done the path drops the recorder, so the rest of
    the run pays nothing."""

    __slots__ = ("free", "held", "spans", "link", "stopping")

    def __init__(self, engines: int) -> None:
        self.free = list(range(engines))  # heap of free engine ids
        self.held: dict[int, list[Any]] = {}  # tid -> [engine, phase, start ps, priority at start]
        # (engine, phase, transfer, start ps, end ps, priority at start)
        self.spans: list[tuple[int, str, Any, int, int, int]] = []
        self.link: list[tuple[int, int, int]] = []  # (ps, transfers moving data, transfers waiting)
        self.stopping = False

    def take(self, tr: Any, now: int, phase: str) -> None:
        if not self.stopping:
            self.held[tr.tid] = [heappop(self.free), phase, now, tr.priority]

    def next_phase(self, tr: Any, now: int, phase: str) -> None:
        h = self.held.get(tr.tid)
        if h is not None:
            self.spans.append((h[0], h[1], tr, h[2], now, h[3]))
            h[1], h[2], h[3] = phase, now, tr.priority

    def release(self, tr: Any, now: int) -> None:
        h = self.held.pop(tr.tid, None)
        if h is not None:
            self.spans.append((h[0], h[1], tr, h[2], now, h[3]))
            heappush(self.free, h[0])

    def sample(self, path: Any) -> None:
        if self.stopping and not self.held:
            path.recorder = None
            return
        now = path._now()
        point = (now, len(path.flowing), len(path.queue_demand) + len(path.queue_prefetch) + len(path.paused))
        link = self.link
        if link and link[-1][0] == now:  # a later sample at the same instant replaces it
            link.pop()
        # only changes, the link starting idle: the engines and cores sample different instants, not different states
        if (link[-1][1:] if link else (0, 0)) != point[1:]:
            link.append(point)


class DmaPath:
    """The shared expert-fetch path (e.g. LPDDR5X → PCIe → UCIe → HBM) and its DMA engines."""

    # the path's own resource when it is given a bandwidth, not a network
    network_class: ClassVar[type[FlowNetwork]] = FlowNetwork

    def __init__(self, env: Any, bandwidth_bytes_per_s: int | None, latency_ps: int, setup_ps: int,
                 engines: int, chunk_bytes: int, on_landed: Callable[[Transfer], None] | None = None,
                 preempt: bool = True, demand_first: bool = True, network: FlowNetwork | None = None,
                 path: Path | None = None) -> None:
        """`on_landed(transfer)` is called when a transfer's last byte has crossed the path (or, for a
        cancelled one, when it stopped: `cancelled` is set and `moved_bytes` says what moved).

        `network` and `path`: the shared resources the data crosses (then `bandwidth_bytes_per_s` is None: their
        bandwidths apply); without them the path is one resource of `bandwidth_bytes_per_s` used by these
        transfers alone."""
        if (network is None) == (bandwidth_bytes_per_s is None):
            raise ValueError("give either a bandwidth or a network with a path")
        if (bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0) or engines <= 0 or chunk_bytes <= 0:
            raise ValueError("bandwidth, engines and chunk size must be positive")
        self.env = env
        if network is None:
            network = self.network_class(env, ["dma"], [int(bandwidth_bytes_per_s or 0)])
            path = network.path(("dma", WRITE))
        elif path is None:
            raise ValueError("a network needs the path its transfers cross")
        self.network: FlowNetwork = network
        self.flow_path: Path = path
        self.latency_ps = int(latency_ps)
        self.setup_ps = int(setup_ps)
        self.engines = int(engines)
        self.chunk_units = int(chunk_bytes) * PS_PER_S
        self.free_engines = self.engines
        self.queue_demand: deque[Transfer] = deque()
        self.queue_prefetch: deque[Transfer] = deque()
        self.flowing: list[Transfer] = []  # ACTIVE or DRAINING: their flows are in the network
        self.paused: list[Transfer] = []
        self.in_setup: list[tuple[int, int, Transfer]] = []  # heap of (setup end ps, tid, transfer)
        self.demands_live = 0  # demand transfers not yet through their data phase
        self._setup_tick_at = -1  # time of the pending end-of-setup wake-up, -1 if none
        self._batch_depth = 0
        self._batch = _Batch(self)
        self.on_landed = on_landed or (lambda tr: None)
        self.preempt = preempt
        self.demand_first = demand_first  # False: one FIFO queue (demands wait behind earlier prefetches)
        self._landing: dict[int, list[Transfer]] = {}  # finish time -> transfers landing then
        self._next_tid = 0
        # its callbacks as bound methods made once (a bound method made at every use costs more than the call)
        self._flow_reached_callback = self._flow_reached
        self._setup_wake_callback = self._setup_wake
        self._landing_callback = self._on_landing
        # statistics
        self.bytes_moved = 0
        self.transfers_done = 0
        self.descriptors_submitted = 0
        self.recorder: DmaRecorder | None = None  # set only while a timeline is recorded
        self.flow_cap = 0  # bytes/s no transfer's data moves faster than, whatever the path allows (0: none)

    # ------------------------------------------------------------------------------------ public
    def submit(self, nbytes: int, priority: int, tag: Any = None, descriptors: int = 1, not_before_ps: int = 0
               ) -> Transfer:
        """Queue a transfer; `on_landed` is called with it when its last byte has landed.

        `descriptors` > 1 is a descriptor chain run by one engine (e.g. an expert's gate, up and down
        matrices): it pays the per-descriptor setup once per descriptor before its data moves. An engine that takes
        it before `not_before_ps` (the host has not enqueued it yet) starts its setup then."""
        now = self._now()
        tr = Transfer(self._next_tid, nbytes, priority, tag, now, descriptors)
        tr.not_before_ps = not_before_ps
        self.descriptors_submitted += descriptors
        self._next_tid += 1
        if priority == DEMAND:
            self.demands_live += 1
        if priority == DEMAND and self.demand_first:
            self.queue_demand.append(tr)
        else:
            self.queue_prefetch.append(tr)
        self._settle()
        return tr

    def promote(self, tr: Transfer) -> None:
        """Turn a not-yet-finished prefetch into a demand fetch (the data is now needed)."""
        if tr.priority == DEMAND or tr.state == DONE or tr.data_end_ps >= 0:
            return
        tr.priority = DEMAND
        self.demands_live += 1
        if tr.state == QUEUED:
            if self.demand_first:  # FIFO order keeps its place in the one queue
                self.queue_prefetch.remove(tr)
                self.queue_demand.append(tr)
        elif tr.state == PAUSED:
            self.paused.remove(tr)
            tr.state = QUEUED
            self.queue_demand.appendleft(tr)
        elif tr.state == DRAINING:
            tr.state = ACTIVE
            self.network.set_target(_flow(tr), 0)  # runs to its end now
        self._settle()

    def cancel(self, tr: Transfer) -> None:
        """Abandon a transfer: a queued one never starts, a moving one stops at its next chunk boundary.

        `on_landed` is still called (with `cancelled` set and `moved_bytes` what actually moved), so the
        owner can free its buffer slot and charge the bytes.
        """
        if tr.state == DONE or tr.cancelled:
            return
        tr.cancelled = True
        if tr.priority == DEMAND and tr.data_end_ps < 0:
            self.demands_live -= 1
            tr.priority = PREFETCH
        if tr.state == QUEUED:
            (self.queue_demand if tr in self.queue_demand else self.queue_prefetch).remove(tr)
            if tr.setup_done:  # paused earlier and queued to resume: what it moved has landed
                self._end(tr, moved_units=tr.nbytes * PS_PER_S - tr.remaining, latency=True)
            else:
                tr.state = DONE  # never started: nothing moved, nothing to wait for
                tr.data_end_ps = tr.finish_ps = self._now()
                self.on_landed(tr)
        elif tr.state == PAUSED:
            self.paused.remove(tr)
            self._end(tr, moved_units=tr.nbytes * PS_PER_S - tr.remaining, latency=True)
        elif tr.state in (ACTIVE, DRAINING):
            self._set_boundary(tr)
        # SETUP: handled when the setup time is over
        self._settle()

    def batch(self) -> "_Batch":
        """Context manager: submit/promote/cancel many transfers at one instant, re-plan once at the end."""
        return self._batch

    def _settle(self) -> None:
        if not self._batch_depth:
            network = self.network
            network.begin()
            self._dispatch()
            network.end()
            self._reschedule_setups()
            self._sample()

    def queued_bytes(self) -> int:
        """Bytes not yet moved by every transfer in the system (for policies' cost models)."""
        self.network.advance()
        total = sum(t.nbytes for t in self.queue_demand) + sum(t.nbytes for t in self.queue_prefetch)
        total += sum(t.nbytes for _, _, t in self.in_setup if not t.cancelled)
        total += sum(_flow(t).remaining_bytes for t in self.flowing)
        total += sum(-(-t.remaining // PS_PER_S) for t in self.paused)
        return total

    # ------------------------------------------------------------------------------------ internals
    def _now(self) -> int:
        """The clock (typed: compiled code reads it as a native int)."""
        now: int = self.env.now
        return now

    def _start_data(self, tr: Transfer) -> None:
        tr.state = ACTIVE
        self.flowing.append(tr)
        if not tr.setup_done:
            tr.setup_done = True
            tr.data_start_ps = self._now()
            tr.flow = self.network.add(tr.nbytes, self.flow_path, level=0, cap=self.flow_cap,
                                       on_target=self._flow_reached_callback, tag=tr)
        else:  # a paused prefetch resumes where it stopped
            self.network.resume(_flow(tr), 0)

    def _setup_over(self, tr: Transfer) -> None:
        if tr.cancelled:
            self.free_engines += 1
            if self.recorder is not None:
                self.recorder.release(tr, self._now())
            self._end(tr, moved_units=0, latency=False)
        else:
            if self.recorder is not None:
                self.recorder.next_phase(tr, self._now(), "data")
            self._start_data(tr)

    def _dispatch(self) -> None:
        """Give free engines to queued transfers; make prefetches yield while demand is waiting or moving."""
        if self.demands_live == 0 and self.paused:
            # no demand left: paused prefetches go back to the head of the queue, oldest first
            for tr in sorted(self.paused, key=lambda t: t.tid, reverse=True):
                tr.state = QUEUED
                self.queue_prefetch.appendleft(tr)
            self.paused.clear()
        # with preemption, prefetches wait while any demand is live; without, only queue order favours demand
        while self.free_engines > 0 and (self.queue_demand or (self.queue_prefetch and (self.demands_live == 0 or not self.preempt))):
            tr = self.queue_demand.popleft() if self.queue_demand else self.queue_prefetch.popleft()
            self.free_engines -= 1
            if self.recorder is not None:
                self.recorder.take(tr, self._now(), "data" if tr.setup_done else "setup")
            if tr.setup_done:  # a resumed prefetch: its descriptor is already programmed
                self._start_data(tr)
            else:
                tr.state = SETUP
                heappush(self.in_setup, (max(self._now(), tr.not_before_ps) + self.setup_ps * tr.descriptors, tr.tid, tr))
        if self.preempt and self.flowing:
            flowing = self.flowing
            if self.queue_demand or any(t.priority == DEMAND for t in flowing):
                for tr in flowing:
                    if tr.priority == PREFETCH and tr.state == ACTIVE:
                        self._set_boundary(tr)

    def _set_boundary(self, tr: Transfer) -> None:
        """Let a moving transfer run on to its next chunk boundary, then stop there."""
        self.network.advance()
        total = tr.nbytes * PS_PER_S
        done_units = total - _flow(tr).remaining
        next_boundary = -(-done_units // self.chunk_units) * self.chunk_units
        tr.boundary = max(total - next_boundary, 0)
        tr.state = DRAINING
        self.network.set_target(_flow(tr), tr.boundary)

    def _flow_reached(self, flow: Flow) -> None:
        """The network let a transfer's flow go: all its bytes moved, or a draining one reached its boundary."""
        tr: Transfer = flow.tag  # typed: compiled code reads its fields natively
        now = self._now()
        tr.remaining = max(flow.remaining, 0)
        self.flowing.remove(tr)
        self.free_engines += 1
        if self.recorder is not None:
            self.recorder.release(tr, now)
        if flow.remaining <= 0:
            if tr.priority == DEMAND:
                self.demands_live -= 1
            self.transfers_done += 1
            self._end(tr, tr.nbytes * PS_PER_S, True)
        elif tr.cancelled:
            self._end(tr, tr.nbytes * PS_PER_S - tr.remaining, True)
        else:
            tr.state = PAUSED
            self.paused.append(tr)
        self._settle()

    def _reschedule_setups(self) -> None:
        """Keep one wake-up pending at the end of the earliest setup."""
        if not self.in_setup:
            return
        when = self.in_setup[0][0]
        if when == self._setup_tick_at:
            return
        self._setup_tick_at = when
        self._wake_in(when - self._now(), self._setup_wake_callback, when)

    def _wake_in(self, delay_ps: int, callback: Callable[[Any], None], value: object = None) -> None:
        """A SimPy timeout of `delay_ps` whose processing calls `callback(event)`."""
        self.env.timeout(delay_ps, value=value).callbacks.append(callback)

    def _setup_wake(self, event: Any) -> None:
        self._on_setup_tick(event.value)

    def _on_setup_tick(self, when: int) -> None:
        if when != self._setup_tick_at:
            return  # an earlier setup took the wake-up's place; that one covers this
        self._setup_tick_at = -1
        now = self._now()
        in_setup = self.in_setup
        self.network.begin()
        while in_setup and in_setup[0][0] <= now:
            self._setup_over(heappop(in_setup)[2])
        self._dispatch()
        self.network.end()
        self._reschedule_setups()
        self._sample()

    def _sample(self) -> None:
        if self.recorder is not None:
            self.recorder.sample(self)

    def _end(self, tr: Transfer, moved_units: int, latency: bool) -> None:
        """Retire a transfer; `on_landed` runs once its last moved byte has crossed the path."""
        now = self._now()
        tr.remaining = 0
        moved = tr.moved_bytes = -(-moved_units // PS_PER_S)
        tr.data_end_ps = now
        finish = tr.finish_ps = now + self.latency_ps if latency else now
        self.bytes_moved += moved
        tr.state = DONE
        tr.flow = None  # its flow is done: no transfer <-> flow cycle left for the cyclic garbage collector
        # one SimPy event per distinct landing time, however many transfers land then
        group = self._landing.get(finish)
        if group is None:
            self._landing[finish] = [tr]
            self._wake_in(finish - now, self._landing_callback, finish)
        else:
            group.append(tr)

    def _on_landing(self, event: Any) -> None:
        when = event.value
        landing = self._landing[when]
        del self._landing[when]
        for tr in landing:
            self.on_landed(tr)


class _Batch:
    def __init__(self, path: DmaPath) -> None:
        self.path = path

    def __enter__(self) -> DmaPath:
        self.path._batch_depth += 1
        self.path.network.begin()  # one re-allocation of the shared resources at the end
        return self.path

    def __exit__(self, *exc: object) -> None:
        path = self.path
        path._batch_depth -= 1
        path._settle()
        path.network.end()
