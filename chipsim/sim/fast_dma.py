"""chipsim.sim.dma.DmaPath for the fast path (chipsim.sim.fast): the same queue, engines, setups, preemption and
landings, its wake-ups as `Wake`s, and no second settling after a batch that changed nothing."""

from __future__ import annotations

from chipsim.sim.dma import DmaPath, _Batch
from chipsim.sim.fast_flows import FastFlowNetwork
from chipsim.sim.wake import wake_in


class FastDmaPath(DmaPath):
    """chipsim.sim.dma.DmaPath with its wake-ups as `Wake`s; a batch that changed nothing does not settle."""

    network_class = FastFlowNetwork

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._batch = _FastBatch(self)
        # a submit, promote or cancel since the queue last settled: a batch without one has nothing to settle
        # (the queue settles after every change, so dispatching again would change nothing)
        self._touched = False

    def submit(self, nbytes, priority, tag=None, descriptors=1):
        self._touched = True
        return DmaPath.submit(self, nbytes, priority, tag, descriptors)

    def promote(self, tr):
        self._touched = True
        DmaPath.promote(self, tr)

    def cancel(self, tr):
        self._touched = True
        DmaPath.cancel(self, tr)

    def _settle(self):
        if not self._batch_depth:
            self._touched = False
            DmaPath._settle(self)

    def _wake_in(self, delay_ps, callback, value=None):
        wake_in(self.env, delay_ps, callback, value)


class _FastBatch(_Batch):
    """A batch of submits, promotes and cancels: settles the queue at its end only if one of them happened."""

    def __exit__(self, *exc):
        path = self.path
        path._batch_depth -= 1
        if path._touched and not path._batch_depth:
            path._settle()
        path.network.end()
        return False
