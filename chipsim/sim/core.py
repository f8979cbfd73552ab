"""The event core: what the decode engine (chipsim.sim.engine) schedules its events on, behind one small interface.

An `EventCore` is a table of constructors, each taking the core's environment (its clock and event queue) first:

    environment()                  a new clock at 0 with an empty queue (`.now`: ps; `.run()`: until none is left)
    timeout(env, delay_ps)         an event that fires `delay_ps` from now
    event(env)                     a pending event; succeed(event) fires it now
    process(env, generator)        a process: the generator resumed with each event it yields, itself an event
    all_of(env, events)            an event that fires once every one of `events` has
    resource(env, capacity)        a resource of `capacity` users (`.request()` as a context manager)
    flow_network, dma_path         the core's shared-bandwidth network and DMA queue classes (their interface is
                                   chipsim.sim.flows.FlowNetwork's and chipsim.sim.dma.DmaPath's)
    operation                      None, or an arrays operation as one event (the engine's generic fixed wait and
                                   operand streams, run by the core; it fires with the time the operation took)

Two cores exist:
- SimPy's (`simpy_core()`), the engine of record: SimPy's own Environment and events, chipsim.sim.flows and
  chipsim.sim.dma (compiled by mypyc at install, run as Python otherwise);
- the native core (`native_core()`), chipsim.sim.native: the same events in the same order, in C (Cython), built at
  install where Cython and a C compiler were there. Every event it schedules sits where SimPy would schedule the
  reference's (same time, priority and sequence number), so the two give the same results to the picosecond;
  tests/test_fast_engine.py checks that for every policy on six configs, and tests/test_flows.py and
  tests/test_dma.py run every hand check on both networks and both DMA queues.

`run.engine: fast` (the default) runs on the native core where it was built and may run (`fast_core()`), else on
SimPy: a pure-Python install (no compiler) gives the same results, more slowly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from chipsim.sim.dma import DmaPath
from chipsim.sim.flows import FlowNetwork


@dataclass(frozen=True)
class EventCore:
    """The constructors the engine schedules its events with (module docstring)."""

    name: str
    environment: Callable[[], Any]
    timeout: Callable[[Any, int], Any]
    event: Callable[[Any], Any]
    succeed: Callable[[Any], Any]
    process: Callable[[Any, Any], Any]
    all_of: Callable[[Any, list], Any]
    resource: Callable[[Any, int], Any]
    flow_network: Callable[..., Any]
    dma_path: Callable[..., Any]
    operation: Callable[..., Any] | None = None


@functools.cache
def simpy_core() -> EventCore:
    """SimPy's own classes (imported on first use: a run on the native core never loads SimPy, ~20 ms of start-up):
    `env.timeout(d)` is `simpy.Timeout(env, d)`, `env.event()` is `simpy.Event(env)` (SimPy binds them to the
    environment), so the events and their order are the reference's own."""
    import simpy

    return EventCore(name="simpy", environment=simpy.Environment, timeout=simpy.Timeout, event=simpy.Event,
                     succeed=simpy.Event.succeed, process=simpy.Process, all_of=simpy.AllOf, resource=simpy.Resource,
                     flow_network=FlowNetwork, dma_path=DmaPath)


@functools.cache
def native_core() -> EventCore:
    """The C event core (chipsim.sim.native); ImportError where it was not built."""
    import chipsim.sim.native as native

    return EventCore(name="native", environment=native.Loop, timeout=native.wake_in, event=native.pending,
                     succeed=native.trigger, process=native.Process, all_of=native.AllOf, resource=native.Resource,
                     flow_network=native.FlowNetwork, dma_path=native.DmaPath, operation=native.operation)


def native_available() -> bool:
    """Whether chipsim.sim.native was built and may run: not when the engine runs as Python (CHIPSIM_PURE_PYTHON, a
    stale build; chipsim.sim.BUILD)."""
    import chipsim.sim
    if not chipsim.sim.NATIVE:
        return False
    try:
        native_core()
    except ImportError:
        return False
    return True


def fast_core() -> EventCore:
    """`run.engine: fast`'s core: the native one where it may run, else SimPy (the same results)."""
    return native_core() if native_available() else simpy_core()


def core_for(engine: str) -> EventCore:
    """The core of a config's `run.engine` ("fast" or "reference", checked when the config is read)."""
    return fast_core() if engine == "fast" else simpy_core()
