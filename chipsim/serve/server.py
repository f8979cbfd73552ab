"""A served run's requests as the engine meets them (chipsim.sim.engine runs the steps): arrivals join the queue,
the scheduler (chipsim.serve.scheduler) admits them and picks each step's parts, and each step's end moves the
requests on: prompt tokens read, an output token yielded, a request finished.

An admitted request holds a KV cache for all its tokens (prompt + output - 1, reserved at admission, freed when it
finishes: no preemption) and a window of the trace: its tokens' routing is trace tokens w·n .. w·n + P + O - 2 of
window w (n the longest request's tokens, the trace cut into windows of n), the free window used longest ago. Two
requests in the system at once never share trace tokens; later ones reuse windows, so a trace of T tokens serves
at most T // n requests at once (the runner refuses a scheduler that admits more). A window's routing is known to
the policies only as its current request routes it (`known`, per trace token: the last MoE layer routed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from chipsim.serve.arrivals import Arrivals, RequestSizes
from chipsim.hw.config import WorkloadConfig
from chipsim.serve.scheduler import SCHEDULERS, Scheduler
from chipsim.workload.served import Part


@dataclass(frozen=True)
class ServePlan:
    """What every run of the config serves: the requests, the trace's windows, the KV cache they are admitted
    against, and the scheduler's settings."""

    sizes: RequestSizes
    window_tokens: int  # n: trace tokens a window holds (the longest request's P + O - 1)
    windows: int  # T // n
    kv_capacity_bytes: int
    kv_bytes: np.ndarray  # each request's reserved cache (its P + O - 1 tokens)
    max_sequences: int
    scheduler: str
    max_step_tokens: int
    chunk_tokens: int


class _Sequence:
    """An admitted request's progress."""

    __slots__ = ("request", "first", "prompt", "output", "prefilled", "emitted", "window")

    def __init__(self, request: int, window: int, first: int, prompt: int, output: int):
        self.request, self.window, self.first = request, window, first
        self.prompt, self.output = prompt, output
        self.prefilled = 0  # prompt tokens read
        self.emitted = 0  # output tokens yielded


class Server:
    """One run's requests, queue, running sequences and records (a fresh one per policy run)."""

    def __init__(self, plan: ServePlan, workload: WorkloadConfig, costs, trace_tokens: int, moe_layers: int):
        """`costs`: the steps' costs (chipsim.workload.served.ServedCosts), which the engine reads here."""
        self.costs = costs

        self.plan = plan
        n = plan.sizes.count
        self.arrivals = Arrivals(workload, plan.sizes)
        self.scheduler: Scheduler = SCHEDULERS[plan.scheduler](plan.max_step_tokens, plan.chunk_tokens)
        self.waiting: deque[int] = deque()
        self.running: list[_Sequence] = []
        self._by_request: dict[int, _Sequence] = {}
        self._free_windows = deque(range(plan.windows))
        self.kv_free = plan.kv_capacity_bytes
        self.known = [moe_layers - 1] * trace_tokens  # per trace token: the last MoE layer its request has routed
        self.read = np.zeros(trace_tokens, dtype=bool)  # trace tokens some request has read (policies' results)
        self.finished = 0
        # per request (ps; -1 until it happens)
        self.arrival_ps = np.full(n, -1, dtype=np.int64)
        self.admitted_ps = np.full(n, -1, dtype=np.int64)
        self.scheduled_ps = np.full(n, -1, dtype=np.int64)
        self.first_token_ps = np.full(n, -1, dtype=np.int64)
        self.finish_ps = np.full(n, -1, dtype=np.int64)
        self.window = np.full(n, -1, dtype=np.int64)
        # per step: tokens and parts; the run's idle time between steps; Little's law's area under N(t)
        self.step_tokens: list[int] = []
        self.step_parts: list[int] = []
        self.idle_ps = 0
        self._in_system = 0
        self._changed_ps = 0
        self.area_ps = 0  # integral of the requests in the system over time (request-ps)
        self._now = 0  # the start of the step being planned
        self._arrived = False  # a request has arrived: idle time counts from here on

    # ------------------------------------------------------------------------------------ the engine's calls
    @property
    def done(self) -> bool:
        return self.finished == self.plan.sizes.count

    def next_arrival_ps(self) -> int | None:
        return self.arrivals.next_ps()

    def plan_step(self, now: int) -> list[Part]:
        """The parts of a step starting at `now` (empty: none can run before the next arrival)."""
        self._arrive_until(now)
        self._now = now
        return self.scheduler.step(self)

    def idle(self, start: int, end: int) -> None:
        """The chip waits from `start` to `end` for the next arrival: counted from the run's first arrival on (its
        span; before it, nothing is served yet)."""
        if self._arrived:
            self.idle_ps += end - start

    def step_done(self, parts: list[Part], start: int, end: int) -> None:
        """A step of `parts` ran from `start` to `end`: its requests move on; those it finished leave."""
        self._arrive_until(end)  # (arrivals during the step join the queue first: N(t) in time order)
        self.step_tokens.append(sum(p.tokens for p in parts))
        self.step_parts.append(len(parts))
        for p in parts:
            seq = self._by_request[p.request]
            if self.scheduled_ps[p.request] < 0:
                self.scheduled_ps[p.request] = start
            if not p.decode:
                seq.prefilled += p.tokens
            if p.emits:
                seq.emitted += 1
                if seq.emitted == 1:
                    self.first_token_ps[p.request] = end
                if seq.emitted == seq.output:
                    self._finish(seq, end)

    def record(self):
        """What the run reports of its requests (chipsim.sim.record.ServedRecord)."""
        from chipsim.sim.record import ServedRecord

        return ServedRecord(self.arrival_ps, self.admitted_ps, self.scheduled_ps, self.first_token_ps, self.finish_ps,
                            self.plan.sizes.prompt, self.plan.sizes.output, self.window,
                            np.array(self.step_tokens, dtype=np.int64), np.array(self.step_parts, dtype=np.int64),
                            self.idle_ps, self.area_ps, self.plan.scheduler)

    # ------------------------------------------------------------------------------------ the scheduler's calls
    def admit(self) -> int:
        """Admit waiting requests, first come first served, while max_sequences, the KV cache and the trace's windows
        allow (the queue's head waits if it does not fit, and everyone behind it). Returns how many."""
        admitted = 0
        plan = self.plan
        while self.waiting and len(self.running) < plan.max_sequences and self._free_windows:
            r = self.waiting[0]
            need = int(plan.kv_bytes[r])
            if need > self.kv_free:
                break
            self.waiting.popleft()
            self.kv_free -= need
            window = self._free_windows.popleft()
            first = window * plan.window_tokens
            seq = _Sequence(r, window, first, int(plan.sizes.prompt[r]), int(plan.sizes.output[r]))
            self.running.append(seq)
            self._by_request[r] = seq
            self.admitted_ps[r] = self._now
            self.window[r] = window
            n = seq.prompt + seq.output - 1
            self.known[first:first + n] = [-1] * n  # nothing of the new request is routed yet
            self.read[first:first + n] = True
            admitted += 1
        return admitted

    def prefill_parts(self, budget: int, chunk: int) -> list[Part]:
        """Prompt chunks of the running requests that have prompt left, first admitted first, within `budget`
        tokens, each at most `chunk`."""
        parts = []
        for seq in self.running:
            if budget <= 0:
                break
            left = seq.prompt - seq.prefilled
            if left:
                n = min(left, chunk, budget)
                parts.append(Part(seq.request, seq.first + seq.prefilled, seq.prefilled, n, False,
                                  seq.prefilled + n == seq.prompt))
                budget -= n
        return parts

    def decode_parts(self, budget: int) -> list[Part]:
        """A decode token of each running request that has its first output token, within `budget` tokens: output
        token j + 1 (j >= 1) reads trace position P + j - 1, attending over P + j tokens."""
        parts = []
        for seq in self.running:
            if len(parts) == budget:
                break
            if seq.emitted and seq.emitted < seq.output:
                position = seq.prompt + seq.emitted - 1
                parts.append(Part(seq.request, seq.first + position, position, 1, True, True))
        return parts

    # ------------------------------------------------------------------------------------ internals
    def _count(self, at_ps: int, change: int) -> None:
        self.area_ps += self._in_system * (at_ps - self._changed_ps)
        self._changed_ps = at_ps
        self._in_system += change

    def _arrive_until(self, now: int) -> None:
        arrivals = self.arrivals
        while True:
            at = arrivals.next_ps()
            if at is None or at > now:
                return
            at, r = arrivals.pop()
            self._count(at, +1)
            self._arrived = True
            self.arrival_ps[r] = at
            self.waiting.append(r)

    def _finish(self, seq: _Sequence, end: int) -> None:
        self.finish_ps[seq.request] = end
        self.running.remove(seq)
        del self._by_request[seq.request]
        self._free_windows.append(seq.window)
        self.kv_free += int(self.plan.kv_bytes[seq.request])
        self.finished += 1
        self._count(end, -1)
        self.arrivals.finished(end)
