"""The timeline of a run (`chipsim run --timeline`), recorded by an observer of the engine (chipsim.sim.observe):
each op group, stall, host-CPU job and landed fetch as a span on its lane, and the DMA queue's engines and link
through its recorder (chipsim.sim.dma.DmaRecorder), for the first `tokens` tokens (0: all of them); fetches still in
flight when it stops finish on the timeline."""

from __future__ import annotations

from typing import Any

from chipsim.sim.dma import DEMAND, PREFETCH, DmaRecorder
from chipsim.sim.observe import Observer, record_dma
from chipsim.sim.record import RecordedTimeline

# an op group's name on the arrays' lane, by kind (its MoE or dense layer, and for "experts" the experts that ran)
_OP_LABELS = {"dense": "dense layer %d", "attention": "L%d attention+router", "shared": "L%d shared",
              "combine": "L%d combine"}


class TimelineRecorder(Observer):
    """Spans of the first `tokens` steps (0: all; a step is a decode token or a request's prefill chunk), as (lane,
    name, start ps, end ps)."""

    def __init__(self, tokens: int = 0) -> None:
        self.until = tokens if tokens else -1
        self.steps = 0  # steps begun so far (in a decode-only run, the token's index)
        self.events: list[tuple[str, str, int, int]] = []
        self.recording = True
        self.dma: DmaRecorder | None = None
        self._sim: Any = None

    def attach(self, sim: Any) -> None:
        self._sim = sim
        self.dma = record_dma(sim, DmaRecorder(sim.dma.engines))

    def token_start(self, t: int, now: int) -> None:
        self._step_start()

    def prefill_start(self, chunk: int, first: int, last: int, now: int) -> None:
        self._step_start()

    def _step_start(self) -> None:
        """A step begins (a decode token, or a request's prefill chunk): the first `tokens` steps are recorded."""
        if self.steps == self.until:  # it has its steps: stop (fetches in flight finish their DMA spans)
            self.recording = False
            if self.dma is not None:
                self.dma.stopping = True
        self.steps += 1

    def ops(self, kind: str, index: int, experts: list[int] | None, start: int, end: int) -> None:
        if not self.recording:
            return
        if kind == "experts":
            name = "L%d experts %s" % (index, experts)
        elif kind == "head":
            name = "lm head"
        else:
            name = _OP_LABELS[kind] % index
        self.events.append(("arrays", name, start, end))

    def landed(self, layer: int, expert: int, demand: bool, issue_ps: int, end_ps: int) -> None:
        if self.recording:
            self.events.append(("dma-demand" if demand else "dma-prefetch", f"L{layer}E{expert}", issue_ps, end_ps))

    def stall(self, layer: int, start: int, end: int) -> None:
        if self.recording:
            self.events.append(("arrays", f"L{layer} stall", start, end))

    def host_job(self, layer: int, expert: int, start: int, end: int) -> None:
        if self.recording:
            self.events.append(("host-cpu", f"L{layer}E{expert}", start, end))

    def host_wait(self, layer: int, start: int, end: int) -> None:
        if self.recording:
            self.events.append(("arrays", f"L{layer} host wait", start, end))

    def token_end(self, t: int, start: int, end: int) -> None:
        if self.recording:
            self.events.append(("tokens", f"token {t}", start, end))

    def prefill_end(self, chunk: int, first: int, last: int, start: int, end: int) -> None:
        if self.recording:
            self.events.append(("tokens", f"prefill chunk {chunk} (prompt tokens {first}-{last})", start, end))

    def timeline(self) -> RecordedTimeline:
        """The DMA recorder's spans as plain tuples (engine, phase, start_ps, end_ps, layer, expert, bytes,
        "demand"/"prefetch" at the span's start, cancelled, promoted to demand), its link samples and the
        recorded events."""
        recorder = self.dma
        assert recorder is not None and self._sim is not None
        dma = []
        for engine, phase, tr, start, end, priority in recorder.spans:
            layer, expert = tr.tag.key
            dma.append((engine, phase, start, end, layer, expert, tr.nbytes,
                        "demand" if priority == DEMAND else "prefetch", tr.cancelled,
                        priority == PREFETCH and tr.priority == DEMAND and not tr.cancelled))
        return RecordedTimeline(arrays=self._sim.hw.compute.arrays, engines=self._sim.dma.engines,
                                events=self.events, dma=dma, link=list(recorder.link))
