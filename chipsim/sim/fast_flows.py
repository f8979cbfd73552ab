"""chipsim.sim.flows.FlowNetwork for the fast path (chipsim.sim.fast): the same rates and the same ticks, each flow's
signature interned as a small int for the rate memo, the ticks scheduled as `Wake`s."""

from __future__ import annotations

from typing import Any, Callable

from chipsim.sim.flows import _MEMO_MAX, Flow, FlowNetwork, Path, Signature, _order
from chipsim.sim.wake import Wake, wake_in


class FastFlowNetwork(FlowNetwork):
    """chipsim.sim.flows.FlowNetwork with its rates memoised by interned signatures and its ticks as `Wake`s."""

    def __init__(self, env: Any, names: list[str], capacities: list[int], turnaround_ppm: list[int] | None = None,
                 shared_capacities: list[int] | None = None) -> None:
        super().__init__(env, names, capacities, turnaround_ppm, shared_capacities)
        # each distinct (path, level, cap) gets a small id: the memo's key is then a tuple of ints, cheap to hash
        self._sig_ids: dict[Signature, int] = {}
        self._sigs: list[Signature] = []

    def add(self, nbytes: int, path: Path, level: int = 0, cap: int = 0,
            on_target: Callable[[Flow], None] | None = None, tag: Any = None, not_before: int = 0) -> Flow:
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
        self._next_fid += 1
        self.flows.append(flow)
        self._changed()
        return flow

    def _advance(self) -> None:
        now: int = self.env._now
        dt = now - self.last_update
        if dt > 0:
            for flow in self.flows:
                flow.remaining -= flow.rate * dt
            self.last_update = now

    def _allocate(self) -> None:
        """The reference's, in the reference's order (signature, id), memoised by signature ids."""
        flows = self.flows
        if not flows:
            return
        flows.sort(key=_order)
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

    def _schedule_tick(self, delay_ps: int, generation: int) -> None:
        wake_in(self.env, delay_ps, self._tick, generation)

    def _tick(self, wake: Wake) -> None:
        self._on_tick(wake._value)  # type: ignore[arg-type]  # the generation it was scheduled with
