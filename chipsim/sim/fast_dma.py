"""chipsim.sim.dma.DmaPath for the fast path (chipsim.sim.fast): the same queue, engines, setups, preemption and
landings, its wake-ups as `Wake`s, and no second settling after a batch that changed nothing."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from chipsim.sim.dma import DmaPath, Transfer, _Batch
from chipsim.sim.fast_flows import FastFlowNetwork
from chipsim.sim.flows import FlowNetwork, Path
from chipsim.sim.wake import Loop, wake_in


class FastDmaPath(DmaPath):
    """chipsim.sim.dma.DmaPath with its wake-ups as `Wake`s; a batch that changed nothing does not settle."""

    network_class: ClassVar[type[FlowNetwork]] = FastFlowNetwork

    def __init__(self, env: Any, bandwidth_bytes_per_s: int | None, latency_ps: int, setup_ps: int,
                 engines: int, chunk_bytes: int, on_landed: Callable[[Transfer], None] | None = None,
                 preempt: bool = True, demand_first: bool = True, network: FlowNetwork | None = None,
                 path: Path | None = None) -> None:
        super().__init__(env, bandwidth_bytes_per_s, latency_ps, setup_ps, engines, chunk_bytes, on_landed, preempt,
                         demand_first, network, path)
        self._batch: _Batch = _FastBatch(self)
        # a submit, promote or cancel since the queue last settled: a batch without one has nothing to settle
        # (the queue settles after every change, so dispatching again would change nothing)
        self._touched = False
        self._loop: Loop = env  # the same clock, typed: compiled code reads it natively

    def submit(self, nbytes: int, priority: int, tag: Any = None, descriptors: int = 1) -> Transfer:
        self._touched = True
        return DmaPath.submit(self, nbytes, priority, tag, descriptors)

    def promote(self, tr: Transfer) -> None:
        self._touched = True
        DmaPath.promote(self, tr)

    def cancel(self, tr: Transfer) -> None:
        self._touched = True
        DmaPath.cancel(self, tr)

    def _settle(self) -> None:
        if not self._batch_depth:
            self._touched = False
            DmaPath._settle(self)

    def _now(self) -> int:
        return self._loop.now

    def _wake_in(self, delay_ps: int, callback: Callable[[Any], None], value: object = None) -> None:
        wake_in(self._loop, delay_ps, callback, value)


class _FastBatch(_Batch):
    """A batch of submits, promotes and cancels: settles the queue at its end only if one of them happened."""

    def __init__(self, path: FastDmaPath) -> None:
        super().__init__(path)
        self.fast_path = path

    def __exit__(self, *exc: object) -> None:
        path = self.fast_path
        path._batch_depth -= 1
        if path._touched and not path._batch_depth:
            path._settle()
        path.network.end()
