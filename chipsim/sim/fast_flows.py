"""chipsim.sim.flows.FlowNetwork for the fast path (chipsim.sim.fast): the same rates and the same ticks, each flow's
signature interned as a small int for the rate memo, the ticks scheduled as `Wake`s."""

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
    """chipsim.sim.flows.FlowNetwork with its rates memoised by interned signatures and its ticks as `Wake`s."""

    def __init__(self, env, names, capacities, turnaround_ppm=None, shared_capacities=None):
        super().__init__(env, names, capacities, turnaround_ppm, shared_capacities)
        # each distinct (path, level, cap) gets a small id: the memo's key is then a tuple of ints, cheap to hash
        self._sig_ids: dict[tuple, int] = {}
        self._sigs: list[tuple] = []

    def add(self, nbytes, path, level=0, cap=0, on_target=None, tag=None, not_before=0):
        if nbytes <= 0 or not path:
            raise ValueError("a flow moves at least one byte over at least one resource")
        self._advance()
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
        self._changed()
        return flow

    def _advance(self):
        now = self.env._now
        dt = now - self.last_update
        if dt > 0:
            for flow in self.flows:
                flow.remaining -= flow.rate * dt
            self.last_update = now

    def _allocate(self):
        """The reference's, in the reference's order (signature, id), memoised by signature ids."""
        flows = self.flows
        if not flows:
            return
        flows.sort(key=_ORDER)
        key = tuple([f.sid for f in flows])
        rates = self._memo.get(key)
        if rates is None:
            sigs = self._sigs
            rates = self._solve(tuple([sigs[i] for i in key]))
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[key] = rates
        for flow, rate in zip(flows, rates):
            flow.rate = rate

    def _schedule_tick(self, delay_ps, generation):
        wake_in(self.env, delay_ps, self._tick, generation)

    def _tick(self, wake):
        self._on_tick(wake._value)
