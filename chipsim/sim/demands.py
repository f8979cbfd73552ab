"""Demand fetches: a routed expert the layer must compute that is not in the buffer is fetched at once, promoted if
on its way, or, with the buffer full, queued until the policy's victims (choose_victims) make room or an evicted
transfer stops or lands; queued demands are served in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from chipsim.sim.dma import DEMAND

if TYPE_CHECKING:  # the engine creates its demand queue: a type for the compiler, not an import at run time
    from chipsim.sim.engine import Simulation


class DemandQueue:
    """The demands waiting for a slot, as (key, the experts their layer needs), in order."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.pending: list[tuple[tuple[int, int], set]] = []
        self._serving = False

    def demand(self, layer: int, expert: int, execute: Iterable[int]) -> None:
        """Fetch an expert the layer executes (`execute`: all of them), promote it if on its way, or, when the
        buffer is full, queue it until the policy's victims make room."""
        sim = self._sim
        entry = sim.buffer.slot_of[layer * sim.num_experts + expert]  # (_route checked the expert id)
        if entry is not None:
            if not entry.resident:
                for tr in entry.transfers:
                    sim.dma.promote(tr)
            return
        if not self.pending and sim.buffer.free_slots() > 0:
            sim._issue((layer, expert), DEMAND)
            return
        self.pending.append(((layer, expert), set(execute)))
        self.serve()

    def serve(self) -> None:
        """Issue waiting demand fetches, evicting the policy's victims when the buffer is full."""
        if self._serving:
            return  # re-entered through an eviction: the outer loop carries on
        self._serving = True
        try:
            self._serve_in_order()
        finally:
            self._serving = False

    def _serve_in_order(self) -> None:
        sim = self._sim
        buffer, context, policy = sim.buffer, sim.context, sim.policy
        n = sim.num_experts
        while self.pending:
            key, needed = self.pending[0]
            if buffer.slot_of[key[0] * n + key[1]] is not None:
                self.pending.pop(0)
                continue
            if buffer.free_slots() <= 0:
                count = 1 - buffer.free_slots()
                victims: Any = policy.choose_victims(context, key[0], needed, count)
                for victim in victims:
                    layer, expert = context._victim(victim, key[0], count)
                    sim._evict_at(layer * n + expert, True)
            if buffer.free_slots() <= 0:
                return  # wait for an in-flight transfer to land or stop
            self.pending.pop(0)
            sim._issue(key, DEMAND)
