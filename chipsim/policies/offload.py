"""Fiddler: hot experts placed statically on the accelerator, every other expert computed on the host CPU.

Fiddler (Kamahori et al., 2024) keeps the most popular experts in accelerator memory and, at
batch-1 decode, runs every other routed expert on the CPU next to its weights: the activations cross the
host link, the weights never do.

Placement (on_run_start): the (layer, expert) pairs of all MoE layers are ranked by the trace's
training-split routing counts (`train_expert_counts`, most used first; ties by layer, then expert id) and
prefetched in that order until the cache holds `slots` experts (0 = the whole expert buffer). They are never
evicted. Their transfers are issued before the first token and land during it: the `warmup` leading tokens
are reported separately (default 4, which covers the placement on the bundled configs). After that, only
activations cross PCIe.

Routing: a routed expert in the buffer (landed, or still on its way during the warm-up) runs on the arrays;
every other one runs on the host CPU (LayerPlan.on_host), one expert at a time, and the layer's weighted
sum waits for the results. Nothing is prefetched, fetched on demand or evicted.

Metrics: fiddler_placed_experts. The share of routed experts found in the placed set is the engine's
`recall`, the experts run on the CPU per token its `host_experts_per_token`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chipsim.policies.base import LayerPlan, Policy, SimContext, param, register
from chipsim.trace import predictor_arrays as pa


@dataclass(frozen=True)
class FiddlerParams:
    slots: int = param(0, "experts placed on the accelerator (0 = the whole expert buffer; never more than it holds)",
                       minimum=0, maximum=1 << 24)
    warmup: int = param(4, "leading tokens reported separately while the static placement lands", minimum=0,
                        maximum=1 << 31)


@register
class Fiddler(Policy):
    name = "fiddler"
    batch_support = ("the union's placed experts run on the arrays, the others on the host CPU, each over the step's "
                     "tokens routed to it")
    in_place = ("its placement is every expert by default (slots: 0), so none runs on the host CPU; with slots "
                "set it runs the experts it did not place on the host CPU, a deliberate CPU/GPU split")
    summary = "hot experts placed statically from training-split counts (never evicted); misses run on the host CPU"
    caches_across_tokens = True
    adopts_buffer = False  # its placement is its own record
    trace_arrays = (pa.TRAIN_EXPERT_COUNTS,)
    Params = FiddlerParams
    params: FiddlerParams

    def warmup_tokens(self) -> int:
        return self.params.warmup

    def on_run_start(self, ctx: SimContext) -> None:
        L, N = ctx.num_moe_layers, ctx.num_experts
        slots = self.params.slots
        capacity = min(slots, ctx.slots) if slots else ctx.slots
        counts = np.asarray(ctx.trace_array("train_expert_counts"), dtype=np.int64)
        order = sorted(((layer, e) for layer in range(L) for e in range(N)),
                       key=lambda key: (-int(counts[key]), key))
        self.placed: set[tuple[int, int]] = set()
        for layer, e in order[:capacity]:
            if not ctx.prefetch(layer, e):
                break
            self.placed.add((layer, e))

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        placed = self.placed
        execute = [e for e in routed if (layer, e) in placed]
        on_host = [e for e in routed if (layer, e) not in placed]
        return LayerPlan(execute=execute, on_host=on_host)

    def on_layer_end(self, ctx: SimContext, t: int, layer: int) -> None:
        pass  # the placement is static

    def extra_metrics(self) -> dict:
        return {"fiddler_placed_experts": len(self.placed)}
