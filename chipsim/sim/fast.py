"""The fast path of the event model: the same model as chipsim.sim.engine, dma and flows, giving the same results
to the picosecond, with less Python per event and fewer events.

What differs is only how the work is done, never what is computed:
- wake-ups (a flow tick, the end of a DMA setup, a landing, the arrays' fixed time) go onto SimPy's queue as
  small `Wake`s (chipsim.sim.wake), scheduled exactly where the reference creates a `Timeout` or triggers an
  `Event`, so SimPy orders them as it orders the reference's;
- the flow network (chipsim.sim.fast_flows) memoises its rates by interned signatures; the DMA queue
  (chipsim.sim.fast_dma) does not settle again after a batch that changed nothing;
- an arrays operation that is alone until it ends (no flow in the network, nothing scheduled before its end,
  its operand rate within what its path gives one flow) is one wake-up instead of the reference's fixed wait,
  operand flow, tick and trigger: nothing can happen meanwhile, and alone it ends at exactly its own time.

`chipsim.sim.engine.Simulation` stays the engine of record (`run.engine: reference`); tests/test_fast_engine.py
runs every policy on six configs through both and asserts identical results.
"""

from __future__ import annotations

from typing import Any, Generator

from chipsim.hw.config import HardwareConfig
from chipsim.policies.base import Policy
from chipsim.sim.engine import Simulation, _Work
from chipsim.sim.fast_dma import FastDmaPath
from chipsim.sim.fast_flows import FastFlowNetwork
from chipsim.sim.wake import AllOf, Loop, Process, Resource, pending, trigger, wake_in
from chipsim.trace.format import Trace
from chipsim.units import PS_PER_S
from chipsim.workload.decode import DecodeWorkload


class FastSimulation(Simulation):
    """chipsim.sim.engine.Simulation on the fast network and DMA queue, its waits as `Wake`s."""

    def __init__(self, hw: HardwareConfig, workload: DecodeWorkload, trace: Trace, policy: Policy,
                 max_tokens: int = 0, record_events: bool = False, record_tokens: int = 0) -> None:
        super().__init__(hw, workload, trace, policy, max_tokens, record_events, record_tokens)
        self._loop: Loop = self.env  # the same clock, typed: compiled code reads it natively

    @classmethod
    def _network_class(cls) -> Any:
        return FastFlowNetwork

    def _dma_class(self) -> Any:
        return FastDmaPath

    @staticmethod
    def _environment() -> Any:
        return Loop()

    def _now(self) -> int:
        return self._loop.now

    def _timeout(self, delay_ps: int) -> Any:
        return wake_in(self._loop, delay_ps)

    def _event(self) -> Any:
        return pending(self.env)

    def _succeed(self, event: Any) -> None:
        trigger(event)

    def _process(self, generator: Generator[Any, Any, Any]) -> Any:
        return Process(self.env, generator)

    def _all_of(self, events: list[Any]) -> Any:
        return AllOf(self.env, events)

    def _resource(self, capacity: int) -> Any:
        return Resource(self.env, capacity)

    def _undisturbed(self, work: _Work, start: int) -> bool:
        queue = self._loop._queue
        return _alone_until_end(self, queue[0][0] if queue else -1, work, start)


def _alone_until_end(sim: Simulation, next_event_ps: int, work: _Work, start: int) -> bool:
    """No flow in the network and nothing scheduled before `work` ends (`next_event_ps`: the earliest pending
    event, -1: none): nothing can start meanwhile. Each of its operand streams, capped at its bytes over its time
    alone, then ends at exactly its own time, unless that cap exceeds what the path gives one flow alone."""
    if sim.network.flows:
        return False
    if 0 <= next_event_ps <= start + work.ps:
        return False
    return _within_alone_rates(sim, work)


def _within_alone_rates(sim: Simulation, work: _Work) -> bool:
    """Whether each of `work`'s operand streams, capped at its bytes over its time alone, gets that cap from its
    path alone (then, with nothing else running, it ends at exactly its own time)."""
    hbm_ps = work.ps - work.fixed - work.sram_ps
    if work.bytes and hbm_ps > 0 and -(-work.bytes * PS_PER_S // hbm_ps) > sim._operand_alone_rate:
        return False
    sram_ps = work.sram_ps
    return not (work.sram_bytes and sram_ps > 0 and sim._sram_flow_path is not None
                and -(-work.sram_bytes * PS_PER_S // sram_ps) > sim._sram_alone_rate)


class NativeSimulation(Simulation):
    """FastSimulation on chipsim.sim.native's C event loop, flow network and DMA queue (built where Cython and a C
    compiler were there at install; `native_available()` says). The same events in the same order: the same results.
    """

    def __init__(self, hw: HardwareConfig, workload: DecodeWorkload, trace: Trace, policy: Policy,
                 max_tokens: int = 0, record_events: bool = False, record_tokens: int = 0) -> None:
        native = _native()
        # its functions held here: a call per wake-up, not a module lookup too
        self._wake_in: Any = native.wake_in
        self._pending: Any = native.pending
        self._trigger: Any = native.trigger
        self._operation: Any = native.operation
        super().__init__(hw, workload, trace, policy, max_tokens, record_events, record_tokens)

    @classmethod
    def _network_class(cls) -> Any:
        return _native().FlowNetwork

    def _dma_class(self) -> Any:
        return _native().DmaPath

    @staticmethod
    def _environment() -> Any:
        return _native().Loop()

    def _now(self) -> int:
        now: int = self.env.now
        return now

    def _timeout(self, delay_ps: int) -> Any:
        return self._wake_in(self.env, delay_ps)

    def _event(self) -> Any:
        return self._pending(self.env)

    def _succeed(self, event: Any) -> None:
        self._trigger(event)

    def _process(self, generator: Generator[Any, Any, Any]) -> Any:
        return _native().Process(self.env, generator)

    def _all_of(self, events: list[Any]) -> Any:
        return _native().AllOf(self.env, events)

    def _resource(self, capacity: int) -> Any:
        return _native().Resource(self.env, capacity)

    def _compute(self, work: _Work, label: str, *label_args: object) -> Generator[Any, Any, None]:
        """Simulation._compute as one C operation (chipsim.sim.native.Operation): the same check that it is alone until
        it ends, the same fixed wait and operand streams, no generator, event or callback of its own; it hands back
        the time it took."""
        self._tally_work(work)
        busy: int = yield self._operation(self.network, work.ps, work.fixed, work.bytes, self._operand_flow_path,
                                          self._operand_alone_rate, work.sram_bytes, work.sram_ps,
                                          self._sram_flow_path, self._sram_alone_rate)
        self._tally_busy_ps += busy
        self._tally_occupied(work, busy)
        if self.events is not None:
            end = self._now()
            self.events.append(("arrays", label % label_args, end - busy, end))


def _native() -> Any:
    """chipsim.sim.native, imported once."""
    if _NATIVE[0] is None:
        import chipsim.sim.native
        _NATIVE[0] = chipsim.sim.native
    return _NATIVE[0]


_NATIVE: list[Any] = [None]


def native_available() -> bool:
    """Whether chipsim.sim.native was built and may run: not when the engine runs as Python (CHIPSIM_PURE_PYTHON, a
    stale build; chipsim.sim.BUILD)."""
    import chipsim.sim
    if not chipsim.sim.NATIVE:
        return False
    try:
        _native()
    except ImportError:
        return False
    return True


def fast_engine() -> type[Simulation]:
    """The fast path's engine: on chipsim.sim.native where it may run, else the compiled (or pure) Python classes."""
    return NativeSimulation if native_available() else FastSimulation
