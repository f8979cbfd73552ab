"""SimPy's events with less Python: what `env.timeout(d)` and a triggered `env.event()` are to SimPy's `step()`
(callbacks, ok, value), scheduled on SimPy's own queue exactly where the reference engine creates them (same time,
same priority, the next sequence number), so SimPy orders them as it orders the reference's. Used by the fast
path (chipsim.sim.fast)."""

from __future__ import annotations

import heapq

_NORMAL = 1  # simpy.events.NORMAL: the priority of a Timeout and of a triggered Event
_PENDING = object()


class Wake:
    """The smallest object SimPy's `step()` processes: what `env.timeout(d)` or a triggered `env.event()` is to
    it (callbacks, ok, value), without their checks and bookkeeping."""

    __slots__ = ("callbacks", "_ok", "_value", "_defused", "env")

    def __init__(self, env, callback=None, value=None):
        self.env = env
        self.callbacks = [] if callback is None else [callback]
        self._ok = True
        self._value = value

    @property
    def triggered(self) -> bool:
        return self._value is not _PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def value(self):
        return self._value

    @property
    def ok(self) -> bool:
        return self._ok


def wake_in(env, delay: int, callback=None, value=None) -> Wake:
    """`env.timeout(delay, value)` with `callback` appended: scheduled now, as a Timeout is at its creation."""
    wake = Wake(env, callback, value)
    heapq.heappush(env._queue, (env._now + delay, _NORMAL, next(env._eid), wake))
    return wake


def pending(env) -> Wake:
    """`env.event()`: waits until `trigger` schedules it."""
    wake = Wake(env)
    wake._value = _PENDING
    return wake


def trigger(wake: Wake, value=None) -> None:
    """`event.succeed(value)`: processed after everything already scheduled for now."""
    wake._value = value
    env = wake.env
    heapq.heappush(env._queue, (env._now, _NORMAL, next(env._eid), wake))
