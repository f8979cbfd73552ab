"""The fast path of the event model: the same model as chipsim.sim.engine, dma and flows, with the same SimPy
events at the same instants in the same order, and less Python around each of them.

What differs is only how the work is done, never what is computed:
- wake-ups (a flow tick, the end of a DMA setup, a landing, the arrays' fixed time) go onto SimPy's queue as
  one small object each, scheduled exactly where the reference creates a `Timeout` or triggers an `Event`
  (same time, same priority, the next sequence number), so SimPy orders them as it orders the reference's;
- the flow network re-plans (advance, allocate, reschedule) in one pass, and reads `env._now` directly;
- the DMA queue and the decode step do their bookkeeping with local variables, without the reference's
  per-call helpers.

`chipsim.sim.engine.Simulation` stays the engine of record (`run.engine: reference`); tests/test_fast_engine.py
runs every policy on three configs through both and asserts identical integer results.
"""

from __future__ import annotations

import heapq

from chipsim.sim.dma import ACTIVE, DEMAND, DONE, PAUSED, PREFETCH, QUEUED, SETUP, DmaPath, Transfer
from chipsim.sim.engine import Simulation
from chipsim.sim.flows import _MEMO_MAX, Flow, FlowNetwork, _order
from chipsim.units import PS_PER_S

_NORMAL = 1  # simpy.events.NORMAL: the priority of a Timeout and of a triggered Event
_PENDING = object()


class Wake:
    """The smallest object SimPy's `step()` processes: what `env.timeout(d)` or a triggered `env.event()` is to
    it (callbacks, ok, value), without their checks and bookkeeping."""

    __slots__ = ("callbacks", "_ok", "_value", "_defused", "env")

    def __init__(self, env, callback=None, value=None):
        self.env = env
        self.callbacks = [] if callback is None else [callback]
        self._ok = True
        self._value = value

    @property
    def triggered(self) -> bool:
        return self._value is not _PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def value(self):
        return self._value

    @property
    def ok(self) -> bool:
        return self._ok


def wake_in(env, delay: int, callback=None, value=None) -> Wake:
    """`env.timeout(delay, value)` with `callback` appended: scheduled now, as a Timeout is at its creation."""
    wake = Wake(env, callback, value)
    heapq.heappush(env._queue, (env._now + delay, _NORMAL, next(env._eid), wake))
    return wake


def pending(env) -> Wake:
    """`env.event()`: waits until `trigger` schedules it."""
    wake = Wake(env)
    wake._value = _PENDING
    return wake


def trigger(wake: Wake, value=None) -> None:
    """`event.succeed(value)`: processed after everything already scheduled for now."""
    wake._value = value
    env = wake.env
    heapq.heappush(env._queue, (env._now, _NORMAL, next(env._eid), wake))


class FastFlowNetwork(FlowNetwork):
    """chipsim.sim.flows.FlowNetwork, re-planning in one pass."""

    def __init__(self, env, names, capacities, turnaround_ppm=None, shared_capacities=None):
        super().__init__(env, names, capacities, turnaround_ppm, shared_capacities)
        self._env = env

    def add(self, nbytes, path, level=0, cap=0, on_target=None, tag=None, not_before=0):
        if nbytes <= 0 or not path:
            raise ValueError("a flow moves at least one byte over at least one resource")
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        flow = Flow(self._next_fid, int(nbytes), path, int(level), int(cap), on_target, tag)
        flow.not_before = int(not_before)
        self._next_fid += 1
        self.flows.append(flow)
        if self._batch_depth:
            self._dirty = True
        else:
            self._replan(now)
        return flow

    def resume(self, flow, target_units=0):
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        flow.target = target_units if target_units > 0 else 0
        self.flows.append(flow)
        if self._batch_depth:
            self._dirty = True
        else:
            self._replan(now)

    def set_target(self, flow, target_units):
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        flow.target = target_units if target_units > 0 else 0
        if self._batch_depth:
            self._dirty = True
        else:
            self._replan(now)

    def remove(self, flow):
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        self.flows.remove(flow)
        flow.rate = 0
        if self._batch_depth:
            self._dirty = True
        else:
            self._replan(now)

    def end(self):
        self._batch_depth -= 1
        if not self._batch_depth and self._dirty:
            self._dirty = False
            now = self._env._now
            if now != self.last_update:
                self._advance_to(now)
            self._replan(now)

    def advance(self):
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)

    def _advance(self):
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)

    def _advance_to(self, now):
        dt = now - self.last_update
        if dt > 0:
            for flow in self.flows:
                flow.remaining -= flow.rate * dt
            self.last_update = now

    def _changed(self):
        if self._batch_depth:
            self._dirty = True
        else:
            now = self._env._now
            if now != self.last_update:
                self._advance_to(now)
            self._replan(now)

    def _replan(self, now):
        """The reference's `_allocate` then `_reschedule`, in one pass over the flows."""
        flows = self.flows
        soonest = None
        if flows:
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
                left = flow.remaining - flow.target
                if left <= 0:
                    dt = 0
                elif rate:
                    dt = -(-left // rate)
                else:
                    continue
                if flow.not_before > now + dt:
                    dt = flow.not_before - now
                if soonest is None or dt < soonest:
                    soonest = dt
        if soonest is None:
            self._generation += 1
            self._tick_at = -1
            return
        when = now + soonest
        if when == self._tick_at:
            return
        self._generation += 1
        self._tick_at = when
        env = self._env
        heapq.heappush(env._queue, (when, _NORMAL, next(env._eid), Wake(env, self._wake, self._generation)))

    def _wake(self, wake):
        if wake._value != self._generation:
            return  # superseded by a later change
        self._tick_at = -1
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        reached, staying = [], []
        for flow in self.flows:
            (reached if flow.remaining <= flow.target and flow.not_before <= now else staying).append(flow)
        self.flows = staying
        self._batch_depth += 1
        for flow in reached:
            flow.rate = 0
            if flow.on_target is not None:
                flow.on_target(flow)
        self._dirty = False
        self._batch_depth -= 1
        if not self._batch_depth:  # the flows that reached their targets left: re-allocate and re-arm
            now = self._env._now
            if now != self.last_update:
                self._advance_to(now)
            self._replan(now)
        else:
            self._dirty = True


class FastDmaPath(DmaPath):
    """chipsim.sim.dma.DmaPath with its wake-ups as `Wake`s and its hot paths inlined."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._batch = _FastBatch(self)
        self._env = self.env

    def submit(self, nbytes, priority, tag=None, descriptors=1):
        tr = Transfer(self._next_tid, nbytes, priority, tag, self._env._now, descriptors)
        self.descriptors_submitted += descriptors
        self._next_tid += 1
        if priority == DEMAND:
            self.demands_live += 1
            if self.demand_first:
                self.queue_demand.append(tr)
            else:
                self.queue_prefetch.append(tr)
        else:
            self.queue_prefetch.append(tr)
        if not self._batch_depth:
            self._settle()
        return tr

    def _settle(self):
        if not self._batch_depth:
            network = self.network
            network._batch_depth += 1
            self._dispatch()
            network.end()
            if self.in_setup and self.in_setup[0][0] != self._setup_tick_at:
                self._reschedule_setups()
            if self.recorder is not None:
                self.recorder.sample(self)

    def _dispatch(self):
        paused = self.paused
        if paused and self.demands_live == 0:
            for tr in sorted(paused, key=_tid, reverse=True):
                tr.state = QUEUED
                self.queue_prefetch.appendleft(tr)
            paused.clear()
        queue_demand, queue_prefetch = self.queue_demand, self.queue_prefetch
        recorder = self.recorder
        now = self._env._now
        while self.free_engines > 0 and (queue_demand or (queue_prefetch and (self.demands_live == 0 or not self.preempt))):
            tr = queue_demand.popleft() if queue_demand else queue_prefetch.popleft()
            self.free_engines -= 1
            if recorder is not None:
                recorder.take(tr, now, "data" if tr.setup_done else "setup")
            if tr.setup_done:
                self._start_data(tr)
            else:
                tr.state = SETUP
                heapq.heappush(self.in_setup, (now + self.setup_ps * tr.descriptors, tr.tid, tr))
        if self.preempt and self.flowing:
            flowing = self.flowing
            if queue_demand or any(t.priority == DEMAND for t in flowing):
                for tr in flowing:
                    if tr.priority == PREFETCH and tr.state == ACTIVE:
                        self._set_boundary(tr)

    def _start_data(self, tr):
        tr.state = ACTIVE
        self.flowing.append(tr)
        if not tr.setup_done:
            tr.setup_done = True
            tr.data_start_ps = self._env._now
            tr.flow = self.network.add(tr.nbytes, self.flow_path, 0, 0, self._flow_reached, tr)
        else:
            self.network.resume(tr.flow, 0)

    def _flow_reached(self, flow):
        tr = flow.tag
        rem = flow.remaining
        tr.remaining = rem if rem > 0 else 0
        self.flowing.remove(tr)
        self.free_engines += 1
        if self.recorder is not None:
            self.recorder.release(tr, self._env._now)
        if rem <= 0:
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

    def _reschedule_setups(self):
        if not self.in_setup:
            return
        when = self.in_setup[0][0]
        if when == self._setup_tick_at:
            return
        self._setup_tick_at = when
        wake_in(self._env, when - self._env._now, self._setup_wake, when)

    def _setup_wake(self, wake):
        self._on_setup_tick(wake._value)

    def _on_setup_tick(self, when):
        if when != self._setup_tick_at:
            return
        self._setup_tick_at = -1
        now = self._env._now
        in_setup = self.in_setup
        network = self.network
        network._batch_depth += 1
        while in_setup and in_setup[0][0] <= now:
            tr = heapq.heappop(in_setup)[2]
            if tr.cancelled:
                self.free_engines += 1
                if self.recorder is not None:
                    self.recorder.release(tr, now)
                self._end(tr, moved_units=0, latency=False)
            else:
                if self.recorder is not None:
                    self.recorder.next_phase(tr, now, "data")
                self._start_data(tr)
        self._dispatch()
        network.end()
        if in_setup and in_setup[0][0] != self._setup_tick_at:
            self._reschedule_setups()
        if self.recorder is not None:
            self.recorder.sample(self)

    def _end(self, tr, moved_units, latency):
        now = self._env._now
        tr.remaining = 0
        moved = tr.moved_bytes = -(-moved_units // PS_PER_S)
        tr.data_end_ps = now
        finish = tr.finish_ps = now + self.latency_ps if latency else now
        self.bytes_moved += moved
        tr.state = DONE
        group = self._landing.get(finish)
        if group is None:
            self._landing[finish] = [tr]
            wake_in(self._env, finish - now, self._on_landing, finish)
        else:
            group.append(tr)

    def _on_landing(self, event):
        on_landed = self.on_landed
        for tr in self._landing.pop(event._value):
            on_landed(tr)


def _tid(tr):
    return tr.tid


class _FastBatch:
    __slots__ = ("path",)

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        path = self.path
        path._batch_depth += 1
        path.network._batch_depth += 1
        return path

    def __exit__(self, *exc):
        path = self.path
        path._batch_depth -= 1
        path._settle()
        path.network.end()
        return False



def _trigger_tag(flow) -> None:
    trigger(flow.tag)


class FastSimulation(Simulation):
    """chipsim.sim.engine.Simulation on the fast network and DMA queue, its waits as `Wake`s."""

    network_class = FastFlowNetwork
    dma_class = FastDmaPath

    def _timeout(self, delay_ps):
        return wake_in(self.env, delay_ps)

    def _event(self):
        return pending(self.env)

    @staticmethod
    def _succeed(event):
        trigger(event)

    def _compute(self, work, label, *label_args):
        ledger = self.rec.ledger
        nbytes = work.bytes
        ledger_bytes = ledger.bytes
        ledger_bytes["hbm"] += nbytes
        ledger_bytes["ucie"] += nbytes
        actions = ledger.actions
        actions["mac"] += work.macs
        actions["sfu_op"] += work.sfu_ops
        actions["vector_op"] += work.vector_ops
        actions["sram_write_bit"] += 8 * nbytes
        actions["sram_read_bit"] += 8 * (nbytes + work.sram_bytes)
        env = self.env
        start = env._now
        fixed, sram_ps = work.fixed, work.sram_ps
        hbm_ps = work.ps - fixed - sram_ps
        streams_hbm = nbytes and hbm_ps > 0
        streams_sram = work.sram_bytes and sram_ps > 0 and self._sram_flow_path is not None
        if streams_hbm or streams_sram:
            fixed += (0 if streams_hbm else hbm_ps) + (0 if streams_sram else sram_ps)
            if fixed:
                yield wake_in(env, fixed)
            if streams_hbm:
                yield self._stream(nbytes, hbm_ps, self._operand_flow_path)
            if streams_sram:
                yield self._stream(work.sram_bytes, sram_ps, self._sram_flow_path)
        else:
            yield wake_in(env, work.ps)
        ledger.busy_ps += env._now - start
        if self.events is not None:
            self.events.append(("arrays", label % label_args, start, env._now))

    def _stream(self, nbytes, alone_ps, path):
        done = pending(self.env)
        self.network.add(nbytes, path, 0, -(-nbytes * PS_PER_S // alone_ps), _trigger_tag, done,
                         self.env._now + alone_ps)
        return done
