"""Experts computed on the host CPU during a replay, for real: the host's round trip the simulator charges per expert
(chipsim.sim.engine._host_job; how a plan's host actions become program steps: chipsim.hwreplay.harness).

For each host expert of a layer, one after another, as the simulator's host resource runs them: the token's
activation copied down to pinned host memory on the host stream (the first behind the routing point's event, the
others behind the previous result), the host waiting for it; the expert's primitives computed by PyTorch on
`torch.get_num_threads()` threads over its BF16 weights where they are, in the pinned memory the GPU's copies read;
the result copied up, and the compute stream waiting for the last before the layer's weighted sum.
"""

from __future__ import annotations

import statistics
import time

import torch

from chipsim.hwreplay.kernels import kernel_call, operand_sizes, weight_bytes, weight_views
from chipsim.hwreplay.ops import Primitive


def expert_width(prims: list[Primitive]) -> tuple[int, int]:
    """(activation elements in, result elements out) of one expert: its first matvec's reduction, its last's rows."""
    mv = [p for p in prims if p.kind == "matvec"]
    return mv[0].reduction, mv[-1].outputs


def host_expert_prims(prims: list[Primitive]) -> list[Primitive]:
    """The expert's primitives, if the host CPU can run them as the replay does: BF16 matvecs (a 4-bit or 8-bit
    operand would need a CPU kernel for its format: none is measured)."""
    bits = sorted({p.bits for p in prims if p.kind == "matvec"})
    if bits != [16]:
        raise ValueError(f"hwreplay: host-CPU experts run BF16 weights; this expert's matvecs are {bits}-bit")
    return prims


class HostExperts:
    """The host CPU's side of a replay: pinned buffers, the host stream, each host expert's calls bound once.
    api: chipsim.hwreplay.harness._sync_api's (Stream, Event, use, make_current, synchronize) for the device."""

    def __init__(self, prims: list[Primitive], host_experts: torch.Tensor, device, api) -> None:
        self.prims = host_expert_prims(prims)
        self.host_experts = host_experts
        Stream, Event, _, self.make_current, _ = api
        pin = device.type == "cuda"
        n_in, n_out = expert_width(prims)
        n_scratch, n_x = operand_sizes(prims)
        bf16 = torch.bfloat16
        self.x = torch.zeros(n_x, dtype=bf16, pin_memory=pin)  # the activation, copied down
        self.scratch_a = torch.randn(n_scratch, dtype=bf16)
        self.scratch_b = torch.randn(n_scratch, dtype=bf16)
        self.out = torch.zeros(n_scratch + n_x, dtype=bf16, pin_memory=pin)  # the result: its first n_out values
        self.activation = torch.randn(n_in, dtype=bf16, device=device)  # the token's activation on the GPU
        self.result = torch.zeros(n_out, dtype=bf16, device=device)  # where the result lands on the GPU
        self.n_in, self.n_out = n_in, n_out
        self.stream = Stream()
        self.down, self.up = Event(), Event()  # recorded again for every expert (made once: not in the timing)
        self._calls: dict[tuple[int, int], list] = {}
        self.compute_us: list[float] = []  # each host expert's CPU time since the last reset
        self.roundtrip_us: list[float] = []  # each host expert's time on the host, its wait for the activation included

    def calls(self, key: tuple[int, int] | None) -> list:
        """Expert `key`'s (MoE layer, expert) calls over its weights in host memory (None: nothing, an empty job)."""
        if key is None:
            return []
        if key not in self._calls:
            row, views, off = self.host_experts[key[0], key[1]], [], 0
            for p in self.prims:
                if p.kind == "matvec":
                    views.append(weight_views(row[off:], p))
                    off += weight_bytes(p)
            calls, wi = [], 0
            for p in self.prims:
                w = None
                if p.kind == "matvec":
                    w, wi = views[wi], wi + 1
                calls.append(kernel_call(p, w, self.x, self.scratch_a, self.scratch_b, self.out))
            self._calls[key] = calls
        return self._calls[key]

    def bind(self, keys: list) -> None:
        """Every view of these experts made now, before any timing."""
        for key in keys:
            self.calls(key)

    def run(self, routed_event, keys: list, compute_stream) -> None:
        """The host experts `keys` one after another, each a round trip (module docstring); then the compute stream
        waits for the last result. routed_event: recorded on the compute stream where the activation is ready."""
        s, down, up = self.stream, self.down, self.up
        s.wait_event(routed_event)
        for key in keys:
            t0 = time.perf_counter()
            self.make_current(s)
            self.x[:self.n_in].copy_(self.activation, non_blocking=True)  # behind the previous result, in stream order
            down.record(s)
            self.make_current(compute_stream)
            down.synchronize()
            t1 = time.perf_counter()
            for fn, args, kwargs in self.calls(key):
                fn(*args, **kwargs)
            t2 = time.perf_counter()
            self.make_current(s)
            self.result.copy_(self.out[:self.n_out], non_blocking=True)
            up.record(s)
            self.make_current(compute_stream)
            self.compute_us.append((t2 - t1) * 1e6)
            self.roundtrip_us.append((t2 - t0) * 1e6)
        if keys:
            compute_stream.wait_event(up)

    def reset(self) -> None:
        self.compute_us, self.roundtrip_us = [], []


def summary(runner: HostExperts | None) -> dict:
    """The last run's host experts: how many, and their CPU and round-trip times (µs, median and mean)."""
    if runner is None or not runner.compute_us:
        return {}
    c, r = runner.compute_us, runner.roundtrip_us
    return {"host_experts": len(c), "host_compute_us_median": round(statistics.median(c), 2),
            "host_compute_us_mean": round(sum(c) / len(c), 2), "host_roundtrip_us_median": round(statistics.median(r), 2),
            "host_roundtrip_us_mean": round(sum(r) / len(r), 2)}
