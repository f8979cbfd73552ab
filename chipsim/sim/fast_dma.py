"""chipsim.sim.dma.DmaPath for the fast path (chipsim.sim.fast): the same queue, engines, setups, preemption and
landings, its wake-ups as `Wake`s and its hot paths inlined."""

from __future__ import annotations

import heapq

from chipsim.sim.dma import ACTIVE, DEMAND, PREFETCH, QUEUED, SETUP, DmaPath, Transfer
from chipsim.sim.fast_flows import FastFlowNetwork
from chipsim.sim.wake import wake_in


class FastDmaPath(DmaPath):
    """chipsim.sim.dma.DmaPath with its wake-ups as `Wake`s and its hot paths inlined."""

    network_class = FastFlowNetwork

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._batch = _FastBatch(self)
        self._env = self.env
        # a submit, promote or cancel since the queue last settled: a batch without one has nothing to settle
        # (the queue settles after every change, so dispatching again would change nothing)
        self._touched = False

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
        self._touched = True
        if not self._batch_depth:
            self._settle()
        return tr

    def promote(self, tr):
        self._touched = True
        DmaPath.promote(self, tr)

    def cancel(self, tr):
        self._touched = True
        DmaPath.cancel(self, tr)

    def _settle(self):
        if not self._batch_depth:
            self._touched = False
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

    def _wake_in(self, delay_ps, callback, value=None):
        wake_in(self._env, delay_ps, callback, value)


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
        if path._touched and not path._batch_depth:
            path._settle()
        path.network.end()
        return False
