"""SimPy's events with less Python: what `env.timeout(d)`, a triggered `env.event()`, `env.process(g)`,
`env.all_of(...)` and a `simpy.Resource` request are to SimPy's `step()` (callbacks, ok, value), scheduled on
`Loop`, SimPy's queue without SimPy, exactly where SimPy schedules them (same time, same priority, the next
sequence number), so they are ordered as SimPy orders the reference engine's. Used by the fast path
(chipsim.sim.fast).

Each class follows the SimPy 4 code it stands for step by step (simpy/events.py: Process, Initialize,
Condition; simpy/resources/base.py and resource.py: Put, Get, Request, Release); only checks and bookkeeping
that change no order are left out (events here never fail)."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Callable, Final, Generator, Iterable

_URGENT: Final = 0  # simpy.events.URGENT: a process's start
_NORMAL: Final = 1  # simpy.events.NORMAL: the priority of a Timeout and of a triggered Event
_PENDING: Final = object()


class Wake:
    """The smallest object SimPy's `step()` processes: what `env.timeout(d)` or a triggered `env.event()` is to
    it (callbacks, ok, value), without their checks and bookkeeping."""

    __slots__ = ("callbacks", "_ok", "_value", "_defused", "env")

    def __init__(self, env: "Loop", callback: Callable[[Any], None] | None = None, value: object = None) -> None:
        self.env = env
        self.callbacks: list[Callable[[Any], None]] | None = [] if callback is None else [callback]
        self._ok = True
        self._value = value

    @property
    def triggered(self) -> bool:
        return self._value is not _PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def value(self) -> object:
        return self._value

    @property
    def ok(self) -> bool:
        return self._ok


class Loop:
    """SimPy's `Environment` as the fast path runs it: the same queue of (time, priority, sequence number, event), each
    event's callbacks called once it is popped (`Environment.step`), until none is left (`run()`); events here never
    fail, so SimPy's check for an unhandled failure has nothing to do. `now` is a plain attribute and the sequence
    number an int, so that compiled code reads and counts them natively. `timeout`, `event` and `process` are
    SimPy's, for code written against SimPy (tests/test_dma.py and tests/test_flows.py drive the fast classes with
    it)."""

    def __init__(self) -> None:
        self.now = 0
        self._queue: list[tuple[int, int, int, Wake]] = []
        self._eid = 0  # the next event's sequence number

    def run(self, until: int | None = None) -> None:
        """Process events until none is left or, with `until`, every event before that time (SimPy's run(until): its
        stop event, urgent, comes before the normal events of that instant), then stand at `until`."""
        queue = self._queue
        end = -1 if until is None else until
        while queue and (end < 0 or queue[0][0] < end):
            self.now, _, _, wake = heappop(queue)
            callbacks = wake.callbacks
            wake.callbacks = None
            if callbacks is not None:
                for callback in callbacks:
                    callback(wake)
        if end >= 0:
            self.now = end

    def _push(self, at: int, priority: int, wake: Wake) -> None:
        eid = self._eid
        self._eid = eid + 1
        heappush(self._queue, (at, priority, eid, wake))

    def timeout(self, delay: int, value: object = None) -> Wake:
        return wake_in(self, delay, None, value)

    def event(self) -> Wake:
        return pending(self)

    def process(self, generator: Generator[Any, Any, Any]) -> "Process":
        return Process(self, generator)


def wake_in(env: Loop, delay: int, callback: Callable[[Any], None] | None = None, value: object = None) -> Wake:
    """`env.timeout(delay, value)` with `callback` appended: scheduled now, as a Timeout is at its creation."""
    wake = Wake(env, callback, value)
    env._push(env.now + delay, _NORMAL, wake)
    return wake


def pending(env: Loop) -> Wake:
    """`env.event()`: waits until `trigger` schedules it."""
    wake = Wake(env)
    wake._value = _PENDING
    return wake


def trigger(wake: Wake, value: object = None) -> None:
    """`event.succeed(value)`: processed after everything already scheduled for now."""
    wake._value = value
    env = wake.env
    env._push(env.now, _NORMAL, wake)


class Process(Wake):
    """`env.process(generator)`: started by an urgent event now; resumed by each event it yields once that is
    processed; when the generator returns, scheduled itself (its value the return value)."""

    __slots__ = ("_generator", "_resume_callback")

    def __init__(self, env: Loop, generator: Generator[Any, Any, Any]) -> None:
        super().__init__(env)
        self._value = _PENDING
        self._generator: Any = generator
        self._resume_callback: Any = self._resume  # made once, not at every yield
        env._push(env.now, _URGENT, Wake(env, self._resume_callback))

    def _resume(self, event: Any) -> None:
        generator = self._generator
        while True:
            try:
                event = generator.send(event._value)
            except StopIteration as stop:
                self._value = stop.value
                # let go of the bound method (a cycle through self) and the generator, so that a finished process
                # goes by reference counting, not by the cyclic garbage collector
                self._resume_callback = self._generator = None
                env = self.env
                env._push(env.now, _NORMAL, self)
                return
            if event.callbacks is not None:  # not yet processed: resume when it is
                event.callbacks.append(self._resume_callback)
                return


class AllOf(Wake):
    """`env.all_of(events)`: triggered once every one of them has been processed."""

    __slots__ = ("_events", "_count")

    def __init__(self, env: Loop, events: Iterable[Any]) -> None:
        super().__init__(env)
        self._value = _PENDING
        self._events = tuple(events)
        self._count = 0
        if not self._events:
            trigger(self)
            return
        for event in self._events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)

    def _check(self, _event: Any) -> None:
        if self._value is not _PENDING:
            return
        self._count += 1
        if self._count == len(self._events):
            trigger(self)


class Resource:
    """`simpy.Resource(env, capacity)`: requests granted in arrival order while fewer than `capacity` hold it.
    As in SimPy, only the head of the queue is tried, when a request is made and when a release is processed;
    a release frees its slot when it is made."""

    def __init__(self, env: Loop, capacity: int) -> None:
        self.env = env
        self.capacity = capacity
        self.users: list[Request] = []
        self.queue: list[Request] = []  # waiting requests (SimPy's put_queue)

    @property
    def count(self) -> int:
        return len(self.users)

    def request(self) -> "Request":
        return Request(self)

    def release(self, request: "Request") -> None:
        release = Wake(self.env, self._grant_head)
        try:
            self.users.remove(request)
        except ValueError:
            pass
        trigger(release)

    def _grant_head(self, _event: Any = None) -> None:
        queue = self.queue
        if queue and len(self.users) < self.capacity:
            head = queue.pop(0)
            self.users.append(head)
            trigger(head)


class Request(Wake):
    """`resource.request()`, used as `with resource.request() as req: yield req` (released on leaving)."""

    __slots__ = ("resource",)

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.env)
        self._value = _PENDING
        self.resource = resource
        resource.queue.append(self)
        resource._grant_head()

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if self._value is _PENDING:  # never granted: it leaves the queue
            self.resource.queue.remove(self)
        if exc_type is not GeneratorExit:
            self.resource.release(self)
