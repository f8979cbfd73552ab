"""Replay a served run's steps (workload.requests, chipsim.serve) on a CUDA GPU (or, as a dry run, on the CPU):
chipsim.hwreplay.harness.replay with each step's own shape in place of the decode step.

Each step runs every layer over its tokens, one kernel per primitive the simulator costs
(chipsim.hwreplay.ops.served_step_ops): a lone prompt chunk as a request's prefill chunk, a lone decode token as a
decode step over its cache, several parts as a mixed step (the projections, router, shared experts and LM head cuBLAS
GEMMs over the step's tokens; each decode token's scores and value mix matvecs over its own KV cache; each prompt
chunk's attention one scaled_dot_product_attention kernel). Each routed expert runs its GEMMs over the step's tokens
routed to it, from the GPU slot its copy landed in. Each layer's weights are one allocation, used by every step; the
KV caches a step reads are views into a per-layer pool, each part its own, so no part reads another's from L2.

Where the simulated chip waited for arrivals between two steps (the plan's gap), the compute stream sleeps as long
(torch.cuda._sleep for the cycles the GPU's clock runs in that time, measured before the replay; time.sleep on a
CPU dry run): copies issued before the gap go on during it, as in the simulator. A timing event after the sleep
starts the next step, so a step's latency is never the gap's. The copies and their order are the decode replay's.
"""

from __future__ import annotations

import time

import torch

from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms
from chipsim.hwreplay.harness import (GpuDecodeStep, _nothing, _ProgramCompiler, kernel_call, weight_bytes, weight_shape,
                                      weight_views)
from chipsim.hwreplay.ops import prefill_expert_ops, replayable_prefill_model, served_step_ops
from chipsim.hwreplay.prefill_harness import (BF16, GpuPrefill, _PrefillCompiler, _weighted, attention_call,
                                              attention_tensors, launches)
from chipsim.workload.decode import MIXER_GROUP
from chipsim.workload.served import Part

# the matvecs that read a KV cache (a decode token's attention core), not a weight
KV_READS = ("scores", "value_mix")


def step_parts(plan) -> list[list[Part]]:
    """Each step's parts, from a served plan's "step" actions (chipsim.hwreplay.plan)."""
    return [[Part(-1, first, position, tokens, bool(decode), bool(emits))
             for first, position, tokens, decode, emits in a[3]] for a in plan.actions if a[0] == "step"]


def step_gaps_ps(plan) -> list[int]:
    """Each step's gap before it (ps): the simulated chip idle, waiting for arrivals."""
    return [a[2] for a in plan.actions if a[0] == "step"]


def split_gaps(plan, latency_ms: list[float]) -> tuple[list[float], list[float]]:
    """A served replay's timed intervals (replay()'s latency_ms, in event order: a gap's sleep where the plan has
    one, then its step) as (each step's latency, each gap's measured length; 0 where there was none)."""
    steps, gaps, it = [], [], iter(latency_ms)
    for gap in step_gaps_ps(plan):
        gaps.append(round(next(it), 5) if gap > 0 else 0.0)
        steps.append(next(it))
    if next(it, None) is not None:
        raise RuntimeError("hwreplay: more timed intervals than the served plan's steps and gaps")
    return steps, gaps


class GpuServed(GpuPrefill):
    """A served run's steps on the GPU: every layer's weights once, a per-layer pool of KV caches, each prompt
    chunk's attention tensors; the calls of each step's op groups, of each routed expert over its tokens, of each
    gap's sleep."""

    def __init__(self, hw, steps: list[list[Part]], gaps_ps: list[int], expert_tokens, device, gemv: str = "cublas"):
        m = replayable_prefill_model(hw, "served")
        self.device, self.gemv = device, gemv
        self.num_layers, self.first_dense = m.num_layers, m.first_dense_layers
        self.mixer_of = [MIXER_GROUP[m.mixer(layer)] for layer in range(m.num_layers)]
        shapes: dict[tuple, dict] = {}  # a step's groups, made once per shape of parts
        self.chunk_groups = []
        for parts in steps:
            key = _shape(parts)
            if key not in shapes:
                shapes[key] = served_step_ops(hw, parts)
            self.chunk_groups.append(shapes[key])
        self.gaps_ps = gaps_ps
        self.expert_ops = {n: prefill_expert_ops(hw, n) for n in sorted(set(expert_tokens) | {1})}
        every = [p for g in shapes.values() for ps in g.values() for p in ps]
        every += [p for ps in self.expert_ops.values() for p in ps]
        self._scratch(every, device)
        self._alloc_weights(m, list(shapes.values()))
        self.attention = [{layer: [attention_tensors(p.attention, device) for p in groups[self.mixer_of[layer]]
                                   if p.attention is not None] for layer in range(m.num_layers)}
                          for groups in self.chunk_groups]
        self.expert_bytes = sum(2 * weight_shape(p)[0] * p.reduction for p in self.expert_ops[1] if _weighted(p))
        self.groups = self.chunk_groups[0]
        self.kernels_per_group = {g: sum(map(launches, ps)) for g, ps in self.chunk_groups[-1].items()}
        self.kernels_per_group["expert"] = sum(map(launches, self.expert_ops[1]))
        self.sleep_rate = sleep_cycles_per_ms(device) if device.type == "cuda" else 0.0

    def _alloc_weights(self, m, shapes: list[dict]) -> None:
        """Each (group, layer) one flat BF16 buffer, a view per weight name at the largest shape any step reads it
        with; each layer a KV pool (uint8) as large as the most cache any step's mixer reads there."""
        rows: dict[tuple[str, str], tuple[int, int]] = {}
        kv = {name: 0 for name in set(self.mixer_of)}
        for groups in shapes:
            for name, prims in groups.items():
                for p in prims:
                    if _weighted(p) and p.name in KV_READS:
                        continue
                    if _weighted(p):
                        r, c = weight_shape(p)
                        old = rows.get((name, p.name), (0, 0))
                        rows[(name, p.name)] = (max(r, old[0]), max(c, old[1]))
            for name in kv:
                kv[name] = max(kv[name], sum(weight_bytes(p) for p in groups.get(name, [])
                                             if _weighted(p) and p.name in KV_READS))
        self.weights: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.kv: dict[int, torch.Tensor] = {}
        for layer in range(m.num_layers):
            names = [self.mixer_of[layer]] + (["dense"] if layer < m.first_dense_layers else ["router", "shared"])
            self._alloc_named(rows, names, layer)
            size = kv[self.mixer_of[layer]]
            self.kv[layer] = torch.empty(max(size // 2, 1), device=self.device, dtype=BF16).normal_().view(torch.uint8)
        self._alloc_named(rows, ["head"], -1)

    def _alloc_named(self, rows: dict, names: list[str], layer: int) -> None:
        for name in names:
            mine = [(w, rc) for (g, w), rc in sorted(rows.items()) if g == name]
            flat = torch.empty(max(sum(r * c for _, (r, c) in mine), 1), device=self.device, dtype=BF16).normal_()
            off = 0
            for w, (r, c) in mine:
                self.weights.setdefault((name, layer), {})[w] = flat[off:off + r * c]
                off += r * c

    def group_calls(self, step: int, name: str, layer: int) -> list:
        weights = self.weights.get((name, layer), {})
        attention = iter(self.attention[step].get(layer, []) if name in MIXER_GROUP.values() else [])
        calls, kv_off = [], 0
        for p in self.chunk_groups[step][name]:
            if p.fused:  # a chunk's softmax and value mix, inside its attention kernel
                calls.append((_nothing, (), {}))
            elif p.attention is not None:
                calls.append(attention_call(*next(attention)))
            elif _weighted(p) and p.name in KV_READS:  # a decode token's attention over its own cache
                calls.append(self._kernel(p, weight_views(self.kv[layer][kv_off:], p)))
                kv_off += weight_bytes(p)
            elif _weighted(p):
                r, c = weight_shape(p)
                calls.append(self._kernel(p, weights[p.name][:r * c].view(r, c)))
            else:
                calls.append(self._kernel(p, None))
        return calls

    def _kernel(self, p, weight) -> tuple:
        return kernel_call(p, weight, self.x, self.scratch_a, self.scratch_b, self.scratch_out, self.gemv)

    def gap_calls(self, step: int) -> list:
        """The compute stream idle for the gap before `step`: a sleep of as many GPU cycles (CPU: time.sleep)."""
        ms = self.gaps_ps[step] / 1e9
        if self.device.type != "cuda":
            return [(time.sleep, (ms / 1e3,), {})]
        return [(torch.cuda._sleep, (int(ms * self.sleep_rate),), {})]

    def calls_for(self, key: tuple, gpu_slots: torch.Tensor) -> list:
        """The calls of a compiled program's compute key: ("chunk", step, name, layer), ("gap", step) or
        ("expert", slot, tokens)."""
        if key[0] == "gap":
            return self.gap_calls(key[1])
        return super().calls_for(key, gpu_slots)

    as_graph = GpuDecodeStep.as_graph


def _shape(parts: list[Part]) -> tuple:
    """What a step's kernels depend on: each part's position, tokens, kind and whether it yields a token."""
    return tuple((p.position, p.tokens, p.decode, p.emits) for p in parts)


class _ServedCompiler(_PrefillCompiler):
    """A served plan's steps compiled into the decode replay's program form: each step's op groups by step, each
    expert with its tokens, before a step the plan's gap (a sleep, then a timing event), a timing event at each
    step's end."""

    def add_other(self, a: tuple) -> None:
        if a[0] == "step":
            self.chunk = a[1]
            if a[2] > 0:
                self.prog.append(("c", [("gap", a[1])]))
                _ProgramCompiler.step_done(self)  # the gap's end: the step's start
        elif a[0] == "step_end":
            _ProgramCompiler.step_done(self)
        else:
            super().add_other(a)


GpuServed.program_compiler = _ServedCompiler
