"""chipsim.sim.flows.FlowNetwork for the fast path (chipsim.sim.fast): the same rates and the same ticks, re-planned
(advance, allocate, reschedule) in one pass, with each flow's signature interned as a small int for the memo."""

from __future__ import annotations

import heapq
from operator import attrgetter

from chipsim.sim.flows import _MEMO_MAX, FlowNetwork
from chipsim.sim.flows import Flow as _ReferenceFlow
from chipsim.sim.wake import _NORMAL, Wake

_ORDER = attrgetter("order")


class Flow(_ReferenceFlow):
    """A flow that also carries its signature's id and its sort key (signature, id), computed once."""

    __slots__ = ("sid", "order")


class FastFlowNetwork(FlowNetwork):
    """chipsim.sim.flows.FlowNetwork, re-planning in one pass."""

    def __init__(self, env, names, capacities, turnaround_ppm=None, shared_capacities=None):
        super().__init__(env, names, capacities, turnaround_ppm, shared_capacities)
        self._env = env
        # each distinct (path, level, cap) gets a small id: the memo's key is then a tuple of ints, cheap to hash
        self._sig_ids: dict[tuple, int] = {}
        self._sigs: list[tuple] = []
        self._fast_memo: dict[tuple, tuple[int, ...]] = {}

    def add(self, nbytes, path, level=0, cap=0, on_target=None, tag=None, not_before=0):
        if nbytes <= 0 or not path:
            raise ValueError("a flow moves at least one byte over at least one resource")
        now = self._env._now
        if now != self.last_update:
            self._advance_to(now)
        flow = Flow(self._next_fid, int(nbytes), path, int(level), int(cap), on_target, tag)
        flow.not_before = int(not_before)
        sid = self._sig_ids.get(flow.sig)
        if sid is None:
            sid = self._sig_ids[flow.sig] = len(self._sigs)
            self._sigs.append(flow.sig)
        flow.sid = sid
        flow.order = (flow.sig, flow.fid)
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
            flows.sort(key=_ORDER)
            key = tuple([f.sid for f in flows])
            rates = self._fast_memo.get(key)
            if rates is None:
                sigs = self._sigs
                rates = self._solve(tuple([sigs[i] for i in key]))
                if len(self._fast_memo) >= _MEMO_MAX:
                    self._fast_memo.clear()
                self._fast_memo[key] = rates
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
