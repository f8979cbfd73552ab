"""The fast path of the event model: the same model as chipsim.sim.engine, dma and flows, giving the same results
to the picosecond, with less Python per event and fewer events.

What differs is only how the work is done, never what is computed:
- wake-ups (a flow tick, the end of a DMA setup, a landing, the arrays' fixed time) go onto SimPy's queue as
  small `Wake`s (chipsim.sim.wake), scheduled exactly where the reference creates a `Timeout` or triggers an
  `Event`, so SimPy orders them as it orders the reference's;
- the flow network (chipsim.sim.fast_flows) re-plans in one pass; the DMA queue (chipsim.sim.fast_dma) does its
  bookkeeping inline;
- an arrays operation that is alone until it ends (no flow in the network, nothing scheduled before its end,
  its operand rate within what its path gives one flow) is one wake-up instead of the reference's fixed wait,
  operand flow, tick and trigger: nothing can happen meanwhile, and alone it ends at exactly its own time.

`chipsim.sim.engine.Simulation` stays the engine of record (`run.engine: reference`); tests/test_fast_engine.py
runs every policy on six configs through both and asserts identical results.
"""

from __future__ import annotations

from chipsim.sim.engine import Simulation
from chipsim.sim.fast_dma import FastDmaPath
from chipsim.sim.fast_flows import FastFlowNetwork
from chipsim.sim.wake import AllOf, Process, Resource, pending, trigger, wake_in
from chipsim.units import PS_PER_S


def _trigger_tag(flow) -> None:
    trigger(flow.tag)


class FastSimulation(Simulation):
    """chipsim.sim.engine.Simulation on the fast network and DMA queue, its waits as `Wake`s."""

    network_class = FastFlowNetwork
    dma_class = FastDmaPath

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        capacity = self.network.capacity  # one flow alone on a path gets its least capacity (chipsim.sim.flows)
        self._operand_alone_rate = min(capacity[r] for r, _ in self._operand_flow_path)
        self._sram_alone_rate = (min(capacity[r] for r, _ in self._sram_flow_path)
                                 if self._sram_flow_path is not None else 0)

    def _timeout(self, delay_ps):
        return wake_in(self.env, delay_ps)

    def _event(self):
        return pending(self.env)

    @staticmethod
    def _succeed(event):
        trigger(event)

    def _process(self, generator):
        return Process(self.env, generator)

    def _all_of(self, events):
        return AllOf(self.env, events)

    def _resource(self, capacity):
        return Resource(self.env, capacity)

    def _compute(self, work, label, *label_args):
        ledger = self.rec.ledger
        nbytes = work.bytes
        ledger_bytes = ledger.bytes
        ledger_bytes["hbm"] += nbytes
        ledger_bytes["ucie"] += nbytes
        actions = ledger.actions
        actions["mac"] += work.macs
        actions["sfu_op"] += work.sfu_ops
        actions["vector_op"] += work.vector_ops
        actions["sram_write_bit"] += 8 * nbytes
        actions["sram_read_bit"] += 8 * (nbytes + work.sram_bytes)
        env = self.env
        start = env._now
        queue = env._queue
        if (not self.network.flows and (not queue or queue[0][0] > start + work.ps)
                and self._alone_in_time(work)):
            # Alone until it ends: no flow shares its resources and nothing is scheduled before its end, so
            # nothing can start meanwhile. The reference's fixed wait, operand flows, ticks and triggers end at
            # exactly start + ps (each flow's cap, below its path's capacity, moves its bytes in its time
            # alone): one wake does it.
            yield wake_in(env, work.ps)
            ledger.busy_ps += env._now - start
            if self.events is not None:
                self.events.append(("arrays", label % label_args, start, env._now))
            return
        fixed, sram_ps = work.fixed, work.sram_ps
        hbm_ps = work.ps - fixed - sram_ps
        streams_hbm = nbytes and hbm_ps > 0
        streams_sram = work.sram_bytes and sram_ps > 0 and self._sram_flow_path is not None
        if streams_hbm or streams_sram:
            fixed += (0 if streams_hbm else hbm_ps) + (0 if streams_sram else sram_ps)
            if fixed:
                yield wake_in(env, fixed)
            if streams_hbm:
                yield self._stream(nbytes, hbm_ps, self._operand_flow_path)
            if streams_sram:
                yield self._stream(work.sram_bytes, sram_ps, self._sram_flow_path)
        else:
            yield wake_in(env, work.ps)
        ledger.busy_ps += env._now - start
        if self.events is not None:
            self.events.append(("arrays", label % label_args, start, env._now))

    def _alone_in_time(self, work) -> bool:
        """Whether each operand stream of `work`, alone on its path, runs at its cap (its bytes in its time):
        true unless the arrays' operand rate exceeds what the path's resources give one flow."""
        hbm_ps = work.ps - work.fixed - work.sram_ps
        if work.bytes and hbm_ps > 0 and -(-work.bytes * PS_PER_S // hbm_ps) > self._operand_alone_rate:
            return False
        sram_ps = work.sram_ps
        return not (work.sram_bytes and sram_ps > 0 and self._sram_flow_path is not None
                    and -(-work.sram_bytes * PS_PER_S // sram_ps) > self._sram_alone_rate)

    def _stream(self, nbytes, alone_ps, path):
        done = pending(self.env)
        self.network.add(nbytes, path, 0, -(-nbytes * PS_PER_S // alone_ps), _trigger_tag, done,
                         self.env._now + alone_ps)
        return done
