"""chipsim.sim.flows.FlowNetwork for the fast path (chipsim.sim.fast): the same rates and the same ticks, each flow's
signature interned as a small int for the rate memo, the flows kept in the allocation's order as they come (not
sorted at every allocation), the ticks scheduled as `Wake`s."""

from __future__ import annotations

from typing import Any, Final

from chipsim.sim.flows import _MEMO_MAX, Flow, FlowNetwork, Signature
from chipsim.sim.wake import Loop, Wake, wake_in


_FID_BITS: Final = 40  # a flow's order key: its signature's rank above its fid


def _rank(flow: Flow) -> int:
    return flow.rank


class FastFlowNetwork(FlowNetwork):
    """chipsim.sim.flows.FlowNetwork with its rates memoised by interned signatures and its ticks as `Wake`s."""

    def __init__(self, env: Any, names: list[str], capacities: list[int], turnaround_ppm: list[int] | None = None,
                 shared_capacities: list[int] | None = None) -> None:
        super().__init__(env, names, capacities, turnaround_ppm, shared_capacities)
        self._loop: Loop = env  # the same clock, typed: compiled code reads it natively
        # each distinct (path, level, cap) gets a small id: the memo's key is then a tuple of ints, cheap to hash
        self._sig_ids: dict[Signature, int] = {}
        self._sigs: list[Signature] = []
        self._sig_rank: list[int] = []  # each signature's place among all interned ones, in the reference's order

    def _intern(self, sig: Signature) -> int:
        """A new signature's id; every signature's rank again (the flows present re-ordered by it)."""
        sid = self._sig_ids[sig] = len(self._sigs)
        self._sigs.append(sig)
        sigs = self._sigs
        rank = [0] * len(sigs)
        for place, i in enumerate(sorted(range(len(sigs)), key=lambda i: sigs[i])):
            rank[i] = place
        self._sig_rank = rank
        for flow in self.flows:
            flow.rank = (rank[flow.sid] << _FID_BITS) | flow.fid
        self.flows.sort(key=_rank)
        return sid

    def _insert(self, flow: Flow) -> None:
        """Into the flows, in the reference's allocation order (signature, then fid): one int compared per flow. A
        new flow's signature is interned first; a resumed one's finish time is not known at its new target."""
        if flow.sid < 0:
            sid = self._sig_ids.get(flow.sig)
            flow.sid = self._intern(flow.sig) if sid is None else sid
            if flow.fid >= 1 << _FID_BITS:
                raise OverflowError("more flows than the fast path's order key counts")
        flow.finish = -1
        key = flow.rank = (self._sig_rank[flow.sid] << _FID_BITS) | flow.fid
        flows = self.flows
        i = len(flows)
        while i > 0 and flows[i - 1].rank > key:
            i -= 1
        flows.insert(i, flow)

    def _now(self) -> int:
        return self._loop.now

    def _advance(self) -> None:
        now = self._loop.now
        dt = now - self.last_update
        if dt > 0:
            for flow in self.flows:
                flow.remaining -= flow.rate * dt
            self.last_update = now

    def _allocate(self) -> None:
        """The reference's, in the reference's order (signature, id), memoised by signature ids."""
        flows = self.flows  # already in order (_insert)
        if not flows:
            return
        key = tuple([f.sid for f in flows])
        rates = self._memo.get(key)
        if rates is None:
            sigs = self._sigs
            rates = self._solve(tuple([sigs[i] for i in key]))
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[key] = rates
        for flow, rate in zip(flows, rates):
            if flow.rate != rate:
                flow.rate = rate
                flow.finish = -1  # reaches its target at another time now

    def set_target(self, flow: Flow, target_units: int) -> None:
        flow.finish = -1
        FlowNetwork.set_target(self, flow, target_units)

    def _soonest(self, now: int) -> int | None:
        """The reference's, with each flow's finish time kept while its rate and target stay: at rate r a flow that
        is `left` from its target at time t finishes at t + ceil(left / r), and since it moves exactly r·dt in dt,
        that time is the same whenever it is computed (until its rate or target changes)."""
        soonest: int | None = None
        for flow in self.flows:
            rate = flow.rate
            if rate:
                finish = flow.finish
                if finish < 0:
                    left = flow.remaining - flow.target
                    finish = flow.finish = now + (-(-left // rate) if left > 0 else 0)
                dt = max(finish, flow.not_before) - now
                if dt < 0:
                    dt = 0
            elif flow.remaining <= flow.target:
                dt = flow.not_before - now if flow.not_before > now else 0
            else:
                continue
            if soonest is None or dt < soonest:
                soonest = dt
        return soonest

    def _schedule_tick(self, delay_ps: int, generation: int) -> None:
        wake_in(self._loop, delay_ps, self._tick_callback, generation)

    def _tick(self, wake: Wake) -> None:
        self._on_tick(wake._value)  # type: ignore[arg-type]  # the generation it was scheduled with
