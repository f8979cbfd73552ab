"""When a served run's requests arrive and how long each is (workload.arrivals): a Poisson process, a closed loop of
users with think times, or a file. Times are integer picoseconds; every draw comes from one seeded generator, so a
run is reproducible."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from chipsim.errors import InputError
from chipsim.files import read_input_text
from chipsim.hw.config import WorkloadConfig
from chipsim.units import PS_PER_MS, PS_PER_S

ARRIVALS_MAX_BYTES = 256 << 20  # a file of requests: millions of lines
LAST_ARRIVAL_PS = 1 << 61  # the last arrival: half the run's integer picoseconds (chipsim.runner.MAX_SIM_PS)
FILE_HEADER = ("arrival_ms", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class RequestSizes:
    """Each request's prompt and output tokens, and, for an open loop, its arrival time (ps; None: closed loop)."""

    prompt: np.ndarray
    output: np.ndarray
    arrival_ps: np.ndarray | None

    @property
    def count(self) -> int:
        return len(self.prompt)


def request_sizes(w: WorkloadConfig) -> RequestSizes:
    """The requests of workload.requests: their sizes, and their arrival times where those do not depend on the run
    (Poisson, a file). A bad file is refused in one line naming its line."""
    n, a = w.requests, w.arrivals
    if a.file:
        return _from_file(a.file, n)
    prompt = np.full(n, w.prompt_tokens, dtype=np.int64)
    output = np.full(n, w.output_tokens, dtype=np.int64)
    if a.closed_users:
        return RequestSizes(prompt, output, None)
    gaps_s = np.random.default_rng(a.seed).exponential(1.0 / a.poisson_rps, n)
    arrival_s = np.cumsum(gaps_s)
    if not np.isfinite(arrival_s[-1]) or arrival_s[-1] * PS_PER_S >= LAST_ARRIVAL_PS:
        raise InputError(f"workload.arrivals.poisson_rps: {n} requests at {a.poisson_rps:g} per second arrive over "
                         f"{arrival_s[-1]:.3g} s, beyond the {LAST_ARRIVAL_PS / PS_PER_S / 86400:.0f} days of "
                         "picoseconds the simulator keeps")
    return RequestSizes(prompt, output, np.rint(arrival_s * PS_PER_S).astype(np.int64))


def _from_file(path: str, n: int) -> RequestSizes:
    what = "workload.arrivals.file"
    lines = read_input_text(path, what, ARRIVALS_MAX_BYTES).removeprefix("\ufeff").splitlines()  # (a BOM: Excel's CSV)
    if not lines or tuple(c.strip() for c in lines[0].split(",")) != FILE_HEADER:
        raise InputError(f"{what} {path}: line 1 must be the header {','.join(FILE_HEADER)}")
    rows = [(i + 2, line) for i, line in enumerate(lines[1:]) if line.strip()]
    if len(rows) < n:
        raise InputError(f"{what} {path}: holds {len(rows)} requests; workload.requests asks for {n}")
    arrival = np.zeros(n, dtype=np.int64)
    prompt = np.zeros(n, dtype=np.int64)
    output = np.zeros(n, dtype=np.int64)
    last_ms = 0.0
    for i, (number, line) in enumerate(rows[:n]):
        fields = [c.strip() for c in line.split(",")]
        where = f"{what} {path} line {number}"
        if len(fields) != 3:
            raise InputError(f"{where}: expected 3 values ({','.join(FILE_HEADER)}), got {len(fields)}")
        try:
            ms = float(fields[0])
            if not (fields[1].isdigit() and fields[2].isdigit()):
                raise ValueError
            p, o = int(fields[1]), int(fields[2])
        except ValueError:
            raise InputError(f"{where}: {line.strip()!r} is not a time in ms and two whole token counts") from None
        if not math.isfinite(ms) or ms < 0:
            raise InputError(f"{where}: arrival {fields[0]} ms is not a time at or after 0")
        if ms < last_ms:
            raise InputError(f"{where}: arrival {ms:g} ms comes before the line above's {last_ms:g} ms (the file must "
                             "be sorted by arrival)")
        if ms * PS_PER_MS >= LAST_ARRIVAL_PS:
            raise InputError(f"{where}: arrival {ms:g} ms is beyond what the simulator's picoseconds hold")
        if p < 1 or o < 1 or p > 1 << 20 or o > 1 << 20:
            raise InputError(f"{where}: prompt {p} and output {o} tokens must each be 1 .. {1 << 20}")
        last_ms = ms
        arrival[i], prompt[i], output[i] = round(ms * PS_PER_MS), p, o
    return RequestSizes(prompt, output, arrival)


class Arrivals:
    """The arrivals still to come, earliest first: a fixed list (open loop) or, in a closed loop, each user's next
    request `think` after its previous one finished (users' first requests at time 0)."""

    def __init__(self, w: WorkloadConfig, sizes: RequestSizes):
        self._count = sizes.count
        self._fixed = sizes.arrival_ps
        self._next = 0  # the next request id to arrive (open loop) or to be issued (closed)
        self._pending: list[tuple[int, int]] = []  # closed loop: (arrival ps, request id)
        self._think_ps = w.arrivals.think_ms * PS_PER_MS
        self._rng = np.random.default_rng(w.arrivals.seed)
        if self._fixed is None:
            for _ in range(min(w.arrivals.closed_users, self._count)):
                self._issue(0)

    def _issue(self, at_ps: int) -> None:
        heapq.heappush(self._pending, (at_ps, self._next))
        self._next += 1

    def next_ps(self) -> int | None:
        """When the next request arrives (None: no more will)."""
        if self._fixed is not None:
            return int(self._fixed[self._next]) if self._next < self._count else None
        return self._pending[0][0] if self._pending else None

    def pop(self) -> tuple[int, int]:
        """The next arrival: (time ps, request id)."""
        if self._fixed is not None:
            i = self._next
            self._next += 1
            return int(self._fixed[i]), i
        return heapq.heappop(self._pending)

    def finished(self, at_ps: int) -> None:
        """A request finished at `at_ps`: in a closed loop its user sends the next one after thinking."""
        if self._fixed is None and self._next < self._count:
            think = round(self._rng.exponential(self._think_ps)) if self._think_ps else 0
            self._issue(at_ps + think)
