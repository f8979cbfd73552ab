"""chipsim.sim.flows.FlowNetwork for the fast path (chipsim.sim.fast): the same rates and the same ticks, re-planned
(advance, allocate, reschedule) in one pass, with each flow's signature interned as a small int for the memo."""

from __future__ import annotations

from operator import attrgetter

from chipsim.sim.flows import _MEMO_MAX, FlowNetwork
from chipsim.sim.flows import Flow as _ReferenceFlow
from chipsim.sim.wake import wake_in

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
        """The reference's `_allocate` (rates memoised by interned signatures) then `_reschedule`."""
        flows = self.flows
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
        self._arm(self._soonest(now))

    def _schedule_tick(self, delay_ps, generation):
        wake_in(self._env, delay_ps, self._tick, generation)

    def _tick(self, wake):
        self._on_tick(wake._value)
