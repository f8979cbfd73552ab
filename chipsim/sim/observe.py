"""What the decode engine publishes as it runs, for whoever watches it: the timeline (chipsim.sim.timeline_recorder),
the GPU replay's plan recorder (chipsim.hwreplay.plan), the profile's counts (chipsim.analysis.profile). An observer
subclasses `Observer`, overrides the calls it needs (each does nothing here) and is handed to the engine:
`Simulation(..., observers=[mine])`, or `chipsim.runner.simulate(prep, policy, observers=[mine])`. Observers see; they
never change the run (a run observed gives the same results as one not), and an engine without observers pays one
`is None` test per publishing point.

The calls, in the order the engine makes them within a decode step (t: the token's index; layer: the MoE layer's
index, 0 for the first MoE layer; times in ps; `demand`: a demand fetch, else a prefetch):

    attach(sim)                              once, before the run: the Simulation (its hw, workload, slots, dma, ...)
    token_start(t, now)                      a decode step begins (before the policy's on_token_start)
    ops(kind, index, experts, start, end)    an op group ran on the arrays, `kind` one of OP_KINDS: "dense" (index: the
                                             dense layer), "attention" (attention + router), "shared", "experts" (the
                                             routed experts that ran, in order), "combine" (index: the MoE layer),
                                             "head" (index -1)
    layer_start(t, layer)                    a MoE layer begins (before the policy's on_layer_start)
    route(t, layer)                          its routing is known (before the policy's on_route)
    plan(t, layer, plan)                     the policy's LayerPlan for it, checked
    issued(layer, expert, demand, transfer)  a fetch was issued (`transfer`: the DMA queue's, with .tid and .nbytes;
                                             an expert in several parts is one transfer chain)
    landed(layer, expert, demand, issue_ps, end_ps)  a fetch's bytes landed (`demand`: its priority when it landed)
    evicted(layer, expert)                   an expert left the buffer (the policy's eviction, or a victim it chose)
    stall(layer, start, end)                 the arrays waited for expert bytes (or the host issuing them; layer -1:
                                             outside MoE layers)
    host_job(layer, expert, start, end)      an expert ran on the host CPU
    host_wait(layer, start, end)             the arrays waited for the host CPU's experts
    launches(n)                              n kernel launches were charged (compute.launch_per: segment)
    layer_end(t, layer)                      a MoE layer's experts are done (before the policy's on_layer_end)
    token_end(t, start, end)                 a decode step ended

A request's prefill chunks (chipsim.workload.request) come before its decode steps; within each, the calls above
from layer_start to layer_end run as in a decode step (t: the chunk's last token), between

    prefill_start(chunk, first, last, now)   prefill chunk `chunk` of prompt tokens first .. last begins
    prefill_end(chunk, first, last, start, end)  it ended (its LM head, on the prompt's last chunk, included)

A served run's steps (workload.requests, chipsim.serve) each begin with

    served_step(row, parts, now)             step `row` runs these parts (chipsim.workload.served.Part) from `now`

then run as a decode step (one decode token), a prefill chunk (one prompt chunk) or a batch step (several parts:
token_start .. token_end, t its last token).

Fetches, landings, evictions and host jobs happen whenever the DMA queue and the policy make them, between the
calls above. The DMA queue has its own, finer observer (chipsim.sim.dma.DmaRecorder: each transfer's phases on each
engine), handed to it by an observer's attach with `record_dma(sim, recorder)` when it needs them; one per run.
"""

from __future__ import annotations

from typing import Any

OP_KINDS = ("dense", "attention", "shared", "experts", "combine", "head")


class Observer:
    """Does nothing on every call; subclasses override what they watch (module docstring)."""

    def attach(self, sim: Any) -> None:
        pass

    def token_start(self, t: int, now: int) -> None:
        pass

    def ops(self, kind: str, index: int, experts: list[int] | None, start: int, end: int) -> None:
        pass

    def layer_start(self, t: int, layer: int) -> None:
        pass

    def route(self, t: int, layer: int) -> None:
        pass

    def plan(self, t: int, layer: int, plan: Any) -> None:
        pass

    def issued(self, layer: int, expert: int, demand: bool, transfer: Any) -> None:
        pass

    def landed(self, layer: int, expert: int, demand: bool, issue_ps: int, end_ps: int) -> None:
        pass

    def evicted(self, layer: int, expert: int) -> None:
        pass

    def stall(self, layer: int, start: int, end: int) -> None:
        pass

    def host_job(self, layer: int, expert: int, start: int, end: int) -> None:
        pass

    def host_wait(self, layer: int, start: int, end: int) -> None:
        pass

    def launches(self, n: int) -> None:
        pass

    def layer_end(self, t: int, layer: int) -> None:
        pass

    def token_end(self, t: int, start: int, end: int) -> None:
        pass

    def prefill_start(self, chunk: int, first: int, last: int, now: int) -> None:
        pass

    def prefill_end(self, chunk: int, first: int, last: int, start: int, end: int) -> None:
        pass

    def served_step(self, row: int, parts: list[Any], now: int) -> None:
        pass


class Observers(Observer):
    """Several observers as one: each call to each, in the order given."""

    def __init__(self, observers: list[Observer]) -> None:
        self.observers = list(observers)

    def attach(self, sim: Any) -> None:
        for o in self.observers:
            o.attach(sim)

    def token_start(self, t: int, now: int) -> None:
        for o in self.observers:
            o.token_start(t, now)

    def ops(self, kind: str, index: int, experts: list[int] | None, start: int, end: int) -> None:
        for o in self.observers:
            o.ops(kind, index, experts, start, end)

    def layer_start(self, t: int, layer: int) -> None:
        for o in self.observers:
            o.layer_start(t, layer)

    def route(self, t: int, layer: int) -> None:
        for o in self.observers:
            o.route(t, layer)

    def plan(self, t: int, layer: int, plan: Any) -> None:
        for o in self.observers:
            o.plan(t, layer, plan)

    def issued(self, layer: int, expert: int, demand: bool, transfer: Any) -> None:
        for o in self.observers:
            o.issued(layer, expert, demand, transfer)

    def landed(self, layer: int, expert: int, demand: bool, issue_ps: int, end_ps: int) -> None:
        for o in self.observers:
            o.landed(layer, expert, demand, issue_ps, end_ps)

    def evicted(self, layer: int, expert: int) -> None:
        for o in self.observers:
            o.evicted(layer, expert)

    def stall(self, layer: int, start: int, end: int) -> None:
        for o in self.observers:
            o.stall(layer, start, end)

    def host_job(self, layer: int, expert: int, start: int, end: int) -> None:
        for o in self.observers:
            o.host_job(layer, expert, start, end)

    def host_wait(self, layer: int, start: int, end: int) -> None:
        for o in self.observers:
            o.host_wait(layer, start, end)

    def launches(self, n: int) -> None:
        for o in self.observers:
            o.launches(n)

    def layer_end(self, t: int, layer: int) -> None:
        for o in self.observers:
            o.layer_end(t, layer)

    def token_end(self, t: int, start: int, end: int) -> None:
        for o in self.observers:
            o.token_end(t, start, end)

    def prefill_start(self, chunk: int, first: int, last: int, now: int) -> None:
        for o in self.observers:
            o.prefill_start(chunk, first, last, now)

    def prefill_end(self, chunk: int, first: int, last: int, start: int, end: int) -> None:
        for o in self.observers:
            o.prefill_end(chunk, first, last, start, end)

    def served_step(self, row: int, parts: list[Any], now: int) -> None:
        for o in self.observers:
            o.served_step(row, parts, now)


def record_dma(sim: Any, recorder: Any) -> Any:
    """Set `recorder` (a chipsim.sim.dma.DmaRecorder) as the run's DMA recorder, from an observer's attach: one per
    run, so a second is refused. Returns it."""
    if sim.dma.recorder is not None:
        raise ValueError("the DMA queue is recorded by another observer already (one DMA recorder per run)")
    sim.dma.recorder = recorder
    return recorder


def combined(observers: list[Observer]) -> Observer | None:
    """What the engine calls: None for no observer (it then publishes nothing), the one, or a fan-out."""
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else Observers(observers)
