"""Replay a batch's decode steps (workload.batch B > 1) on a CUDA GPU (or, as a dry run, on the CPU):
chipsim.hwreplay.harness.replay with a batch step in place of the decode step.

Each step runs every layer over its B tokens, one of every sequence, one kernel per primitive the simulator costs
(chipsim.hwreplay.ops.batch_step_ops): the projections, router, shared experts and LM head cuBLAS GEMMs (torch.mm,
BF16) of B rows, each layer's weights its own allocation; each sequence's scores and value mix the decode step's
matvecs over its own KV cache (an allocation per sequence and layer: no sequence reads another's cache from L2);
each routed expert its GEMMs over the step's tokens routed to it, reading its weights from the GPU slot its copy
landed in (prefill_expert_ops: the same builder as a prefill chunk's); SFU work an exp, vector work an add. The copies
and their order are the decode replay's (experts in pinned host memory, a copy waiting for the compute stream to
reach its issue point, an expert for its copy; a copy schedule where the DMA is not one FIFO stream). The event
after each step's LM heads is its end: a step's latency is the time between two.
"""

from __future__ import annotations

import torch

from chipsim.hwreplay.harness import GpuDecodeStep, _ProgramCompiler, weight_shape
from chipsim.hwreplay.ops import batch_step_ops, prefill_expert_ops, replayable_prefill_model
from chipsim.hwreplay.prefill_harness import BF16, GpuPrefill, _weighted, launches
from chipsim.workload.decode import MIXER_GROUP


class GpuBatch(GpuPrefill):
    """A batch's decode step on the GPU: every layer's weights and every sequence's KV cache, scratch activations;
    the calls of each op group and of each routed expert over its tokens (GpuPrefill's kernels and expert calls)."""

    def __init__(self, hw, expert_tokens, device, gemv: str = "cublas"):
        m = replayable_prefill_model(hw, "batch")
        self.device, self.gemv = device, gemv
        self.num_layers, self.first_dense = m.num_layers, m.first_dense_layers
        self.mixer_of = [MIXER_GROUP[m.mixer(layer)] for layer in range(m.num_layers)]
        self.groups = batch_step_ops(hw)
        self.expert_ops = {n: prefill_expert_ops(hw, n) for n in sorted(set(expert_tokens) | {1})}
        every = [p for ps in [*self.groups.values(), *self.expert_ops.values()] for p in ps]
        self._scratch(every, device)
        self.weights: dict[tuple[str, int], list[torch.Tensor]] = {}
        for layer in range(m.num_layers):
            names = [self.mixer_of[layer]] + (["dense"] if layer < m.first_dense_layers else ["router", "shared"])
            self._alloc_each([n for n in names if n in self.groups], layer)
        self._alloc_each(["head"], -1)
        self.expert_bytes = sum(2 * weight_shape(p)[0] * p.reduction for p in self.expert_ops[1] if _weighted(p))
        self.kernels_per_group = {g: sum(map(launches, ps)) for g, ps in self.groups.items()}
        self.kernels_per_group["expert"] = sum(map(launches, self.expert_ops[1]))

    def _alloc_each(self, names: list[str], layer: int) -> None:
        """One flat weight buffer for these groups of `layer`, a view per weight-reading primitive in order: two
        primitives of one name (each sequence's scores) read operands of their own."""
        for name in names:
            shapes = [weight_shape(p) for p in self.groups[name] if _weighted(p)]
            flat = torch.empty(max(sum(r * c for r, c in shapes), 1), device=self.device, dtype=BF16).normal_()
            views, off = [], 0
            for r, c in shapes:
                views.append(flat[off:off + r * c].view(r, c))
                off += r * c
            self.weights[(name, layer)] = views

    def group_calls(self, name: str, layer: int) -> list:
        weights = iter(self.weights.get((name, layer), []))
        return [self._call(p, next(weights) if _weighted(p) else None) for p in self.groups[name]]

    def calls_for(self, key: tuple, gpu_slots: torch.Tensor) -> list:
        """The calls of a compiled program's compute key: ("group", name, layer) or ("expert", slot, tokens)."""
        if key[0] == "group":
            return self.group_calls(key[1], key[2])
        return self.expert_calls(gpu_slots[key[1]], key[2])

    as_graph = GpuDecodeStep.as_graph


class _BatchCompiler(_ProgramCompiler):
    """A batch plan's steps compiled into the decode replay's program form: each layer's own mixer group, each
    expert with the step's tokens routed to it (chipsim.hwreplay.plan's batch actions)."""

    def mixer(self, layer: int) -> str:
        return self.step.mixer_of[layer]

    def expert_key(self, a: tuple, i: int, slot: int) -> tuple:
        return ("expert", slot, a[4][i])


GpuBatch.program_compiler = _BatchCompiler


def expert_tokens_of(plans) -> set[int]:
    """Every count of a step's tokens one expert runs over, in these plans' compute actions."""
    return {n for plan in plans for a in plan.actions if a[0] == "compute" for n in a[4]}
