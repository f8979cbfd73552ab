"""Shared resources and the flows that cross them: a fluid model of bandwidth sharing in integer picoseconds.

A *resource* is a memory or one direction of a link, with a capacity in bytes/s. A *flow* moves N bytes over
a path of resources (each crossed as a read or a write), optionally no faster than a cap of its own (an
operation whose arrays cannot consume operands faster than they compute). At every instant the capacities
are divided among the flows crossing them:

- by priority level, lowest first: the flows of level 0 share the full capacities, level 1 what they leave;
- within a level by max-min fairness (progressive filling): equal flows on one resource get equal shares,
  a flow limited elsewhere (by its cap or another resource) leaves the rest to the others. Two equal flows
  on an idle resource of B bytes/s each move N bytes in 2N/B;
- a resource that is read and written at once (a DRAM serving operand reads and fetch writes) charges every
  written byte `1 + turnaround` bytes of its capacity while both directions are active: the read/write
  turnaround loss of that memory;
- a resource read by two or more flows at once (the host CPU and the DMA both reading LPDDR5X) has its shared
  capacity then: sequential streams in different rows conflict in the banks.

Rates are whole bytes per second (the floor of the fair share); progress is counted in units of 1e-12 byte,
so a flow at r bytes/s advances r units per picosecond and reaches a target after ceil(left / r) ps. Time
and progress are integers: the same flows always give the same times.

The allocation depends only on the multiset of (path, level, cap) of the flows present, so it is memoised:
a decode step meets the same few combinations again and again.
"""

from __future__ import annotations

from typing import Any, Callable, Final

from chipsim.units import PS_PER_S

READ: Final = False
WRITE: Final = True
PPM: Final = 1_000_000  # resource weights in parts per million: a written byte costs (PPM + turnaround_ppm) / PPM
_MEMO_MAX: Final = 1 << 14

Path = tuple[tuple[int, bool], ...]  # ((resource index, WRITE?), ...)
Signature = tuple[Path, int, int]  # (path, level, cap): what a flow's rate depends on


class Flow:
    """N bytes over a path; `remaining` in units of 1e-12 byte. Lives in the network from `add` until it
    reaches its target (then `on_target(flow)` is called) or is removed."""

    __slots__ = ("fid", "path", "level", "cap", "remaining", "target", "rate", "on_target", "tag", "sig", "not_before")

    def __init__(self, fid: int, nbytes: int, path: Path, level: int, cap: int,
                 on_target: Callable[["Flow"], None] | None, tag: Any) -> None:
        self.fid = fid
        self.path = path  # ((resource index, WRITE?), ...)
        self.level = level
        self.cap = cap  # bytes/s; 0: none
        self.remaining = nbytes * PS_PER_S
        self.target = 0  # the network calls on_target once remaining <= target, and lets the flow go
        self.rate = 0  # bytes/s now
        self.on_target = on_target
        self.tag = tag
        self.sig: Signature = (path, level, cap)
        self.not_before = 0  # ps: it does not reach its target earlier (an operation's own compute time)

    @property
    def remaining_bytes(self) -> int:
        return -(-self.remaining // PS_PER_S)


class FlowNetwork:
    """Resources with capacities and the flows sharing them, on one SimPy environment."""

    def __init__(self, env: Any, names: list[str], capacities: list[int],
                 turnaround_ppm: list[int] | None = None, shared_capacities: list[int] | None = None) -> None:
        if len(names) != len(capacities) or any(int(c) <= 0 for c in capacities):
            raise ValueError("every resource needs a name and a positive capacity (bytes/s)")
        # a DRAM read by two or more flows at once (sequential streams in different rows) reaches less than one
        # stream does: its capacity then (0: the same)
        self.shared_capacity = [int(s) or int(c) for s, c in zip(shared_capacities or [0] * len(names), capacities)]
        self.env = env
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.capacity = [int(c) for c in capacities]
        self.turnaround_ppm = [int(t) for t in (turnaround_ppm or [0] * len(names))]
        self.flows: list[Flow] = []
        self.last_update = env.now
        self._next_fid = 0
        self._generation = 0
        self._tick_at = -1
        self._batch_depth = 0
        self._dirty = False  # a change inside a batch: re-allocate when it ends
        self._batch = _Batch(self)
        self._memo: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self.allocations = 0  # allocations computed (memo misses), for benchmarks
        self._tick_callback = self._tick  # made once (a bound method made at every tick costs more than the call)

    # ------------------------------------------------------------------------------------ public
    def path(self, *hops: tuple[str, bool]) -> Path:
        """A path from (resource name, WRITE or READ) hops."""
        return tuple((self.index[name], bool(write)) for name, write in hops)

    def add(self, nbytes: int, path: Path, level: int = 0, cap: int = 0,
            on_target: Callable[[Flow], None] | None = None, tag: Any = None, not_before: int = 0) -> Flow:
        """Start a flow of `nbytes` now; `on_target(flow)` when its last byte is through, and not before the
        time `not_before` (ps): an operation whose arrays compute for that long, however fast operands come."""
        if nbytes <= 0 or not path:
            raise ValueError("a flow moves at least one byte over at least one resource")
        self._advance()
        flow = Flow(self._next_fid, int(nbytes), path, int(level), int(cap), on_target, tag)
        flow.not_before = int(not_before)
        self._next_fid += 1
        self._insert(flow)
        self._changed()
        return flow

    def resume(self, flow: Flow, target_units: int = 0) -> None:
        """Put a flow that reached an earlier target (or was removed) back, to run on to `target_units`."""
        self._advance()
        flow.target = max(int(target_units), 0)
        self._insert(flow)
        self._changed()

    def set_target(self, flow: Flow, target_units: int) -> None:
        """Let a flow in the network run on until `remaining <= target_units`, then call its on_target."""
        self._advance()
        flow.target = max(int(target_units), 0)
        self._changed()

    def remove(self, flow: Flow) -> None:
        """Take a flow out now (its `remaining` says what it did not move)."""
        self._advance()
        self.flows.remove(flow)
        flow.rate = 0
        self._changed()

    def alone_rate(self, path: Path) -> int:
        """The rate (bytes/s) one flow without a cap gets on `path` when no other flow is present: its least
        capacity (a lone reader pays no turnaround and meets no second stream)."""
        return min(self.capacity[r] for r, _ in path)

    def batch(self) -> "_Batch":
        """Context manager: many changes at one instant, one re-allocation at the end."""
        return self._batch

    def begin(self) -> None:
        """`batch()` without a context manager (for hot paths): pair every begin with an end."""
        self._batch_depth += 1

    def end(self) -> None:
        self._batch_depth -= 1
        if not self._batch_depth and self._dirty:
            self._dirty = False
            self._advance()
            self._allocate()
            self._reschedule()

    def advance(self) -> None:
        """Bring every flow's `remaining` up to env.now (before reading it)."""
        self._advance()

    # ------------------------------------------------------------------------------------ internals
    def _insert(self, flow: Flow) -> None:
        """A flow joins the network (added or resumed); the allocation sorts them."""
        self.flows.append(flow)

    def _now(self) -> int:
        """The clock (typed: compiled code reads it as a native int)."""
        now: int = self.env.now
        return now

    def _advance(self) -> None:
        now = self._now()
        dt = now - self.last_update
        if dt <= 0:
            return
        for flow in self.flows:
            flow.remaining -= flow.rate * dt
        self.last_update = now

    def _changed(self) -> None:
        if self._batch_depth:
            self._dirty = True
        else:
            self._advance()  # progress so far at the old rates, before they change
            self._allocate()
            self._reschedule()

    def _allocate(self) -> None:
        flows = self.flows
        if not flows:
            return
        flows.sort(key=_order)
        key = tuple([f.sig for f in flows])
        rates = self._memo.get(key)
        if rates is None:
            rates = self._solve(key)
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[key] = rates
        for flow, rate in zip(flows, rates):
            flow.rate = rate

    def _solve(self, sigs: tuple[Signature, ...]) -> tuple[int, ...]:
        self.allocations += 1
        return solve_rates(sigs, self.capacity, self.shared_capacity, self.turnaround_ppm)

    def _reschedule(self) -> None:
        self._arm(self._soonest(self._now()))

    def _soonest(self, now: int) -> int | None:
        """In how many ps the first flow reaches its target at the current rates (None: none ever does)."""
        soonest: int | None = None
        for flow in self.flows:
            left = flow.remaining - flow.target
            if left <= 0:
                dt = 0
            elif flow.rate:
                dt = -(-left // flow.rate)
            else:
                continue
            if flow.not_before > now + dt:
                dt = flow.not_before - now
            if soonest is None or dt < soonest:
                soonest = dt
        return soonest

    def _arm(self, soonest: int | None) -> None:
        """Keep one tick pending, at the soonest target: a pending one at that time stays, any other is dropped."""
        if soonest is None:
            self._generation += 1
            self._tick_at = -1
            return
        when = self._now() + soonest
        if when == self._tick_at:
            return
        self._generation += 1
        self._tick_at = when
        self._schedule_tick(soonest, self._generation)

    def _schedule_tick(self, delay_ps: int, generation: int) -> None:
        """A SimPy timeout for the tick."""
        self.env.timeout(delay_ps, value=generation).callbacks.append(self._tick_callback)

    def _tick(self, event: Any) -> None:
        self._on_tick(event.value)

    def _on_tick(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by a later change
        self._tick_at = -1
        self._advance()
        now = self._now()
        reached: list[Flow] = []
        staying: list[Flow] = []
        for flow in self.flows:
            (reached if flow.remaining <= flow.target and flow.not_before <= now else staying).append(flow)
        self.flows = staying
        self.begin()
        self._dirty = True  # the flows that reached their targets leave: re-allocate (and re-arm) at the end
        for flow in reached:
            flow.rate = 0
            if flow.on_target is not None:
                flow.on_target(flow)
        self.end()


def solve_rates(sigs: tuple[Signature, ...], capacity: list[int], shared_capacity: list[int],
                turnaround_ppm: list[int]) -> tuple[int, ...]:
    """Max-min fair rates (bytes/s) of flows with these (path, level, cap) signatures, level by level, on resources
    of these capacities (shared: when read by two or more flows; turnaround: what a written byte costs more while
    reads run, ppm). Every flow network solves with it (chipsim.sim.native too)."""
    n_res = len(capacity)
    readers = [0] * n_res  # flows reading each resource: there, written bytes pay the turnaround
    for path, _, _ in sigs:
        for r, write in path:
            if not write:
                readers[r] += 1
    reads = [n > 0 for n in readers]
    # weight (ppm) of each flow on each resource it crosses: written bytes cost more while reads run too
    weights = [tuple((r, PPM + (turnaround_ppm[r] if write and reads[r] else 0)) for r, write in path)
               for path, _, _ in sigs]
    residual = [(shared_capacity[r] if readers[r] > 1 else capacity[r]) * PPM  # left, ppm-weighted
                for r in range(n_res)]
    rates = [0] * len(sigs)
    for level in sorted({s[1] for s in sigs}):
        active = [i for i, s in enumerate(sigs) if s[1] == level]
        while active:
            load = [0] * n_res  # Σ weights of the unfrozen flows on each resource
            for i in active:
                for r, w in weights[i]:
                    load[r] += w
            # the fair rate each resource can still give every flow crossing it
            level_rate, bottleneck = -1, -1
            for r in range(n_res):
                if load[r]:
                    fair = residual[r] // load[r]
                    if level_rate < 0 or fair < level_rate:
                        level_rate, bottleneck = fair, r
            # flows whose own cap is below that rate freeze first, at their caps (the fair rate of the others
            # can only rise once they are fixed)
            frozen = [i for i in active if sigs[i][2] and sigs[i][2] <= level_rate]
            if frozen:
                for i in frozen:
                    rates[i] = sigs[i][2]
            else:
                frozen = [i for i in active if any(r == bottleneck for r, _ in weights[i])]
                for i in frozen:
                    rates[i] = level_rate
            for i in frozen:
                for r, w in weights[i]:
                    residual[r] = max(residual[r] - rates[i] * w, 0)
            frozen_set = set(frozen)
            active = [i for i in active if i not in frozen_set]
    return tuple(rates)


def _order(flow: Flow) -> tuple[Signature, int]:
    """The allocation's order of flows: by signature, then by id."""
    return (flow.sig, flow.fid)


class _Batch:
    def __init__(self, network: FlowNetwork) -> None:
        self.network = network

    def __enter__(self) -> FlowNetwork:
        self.network.begin()
        return self.network

    def __exit__(self, *exc: object) -> None:
        self.network.end()
