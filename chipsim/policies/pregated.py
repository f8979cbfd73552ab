"""Pre-gated MoE (Hwang et al., ISCA 2024): layer l's experts are chosen by a pre-gate at layer l−1, and
those are the experts layer l executes.

The trace's `pregate_rank[t, l]` is layer l's router applied to the FFN (gate) input of layer l−1, so the
prediction for layer l exists from layer l−1's routing point onward. The policy:

- executes the pre-gate's top-k for layer l instead of the router's choice (routing semantics change);
  every predicted expert that the true router did not pick is a routing deviation, counted as
  `LayerPlan.substituted`;
- prefetches that set: with `lookahead: 1` (default) as soon as it is known, i.e. at layer l−1's routing,
  so the transfer overlaps layer l−1's experts and layer l's attention; with `lookahead: 0` only at layer
  l's start (overlapping its attention alone). Experts are staged per layer: a layer's experts are evicted
  at its end, the next layer's prefetches stay;
- MoE layer 0 has no pre-gate (no earlier MoE layer: the trace holds NO_EXPERT there). It runs its own
  router's choice, fetched on demand after routing, as the first block of Pre-gated MoE does.

Only recorded predictor outputs are read before routing; the true routed set is read at routing, for the
fallback of layer 0 and to count deviations.

Executing the pre-gate's choice changes what the model computes; the results carry the held-out perplexity
cost measured on the trace's model (meta['quality']['pregated'], chipsim.tracegen.quality: `quality_cost`,
`quality_source`), or say why there is none. `lookahead` changes only timing, not the computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chipsim.policies.base import (LayerPlan, Policy, SimContext, measured_rows, param, quality_fields, register,
                                   per_token_plan, step_union)
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import NO_EXPERT, TokenRows


@dataclass(frozen=True)
class PreGatedParams:
    lookahead: int = param(1, "1: fetch layer l+1's pre-gated set at layer l's routing, when the pre-gate has chosen "
                              "it; 0: only at layer l+1's start", minimum=0, maximum=1)


@register
class PreGated(Policy):
    name = "pregated"
    batch_support = ("each token runs its pre-gate's set (its routed set where it has none): the step prefetches and "
                     "executes their union; deviations per token")
    summary = ("Pre-gated MoE: layer l−1's pre-gate picks layer l's top-k, which are prefetched and executed "
               "instead of the router's choice (routing deviations counted)")
    trace_arrays = (pa.PREGATE_RANK,)
    Params = PreGatedParams
    params: PreGatedParams

    def __init__(self, label: str, params: PreGatedParams | None = None):
        super().__init__(label, params)
        self._pred = None
        self._meta = {}

    def on_run_start(self, ctx: SimContext) -> None:
        T, L, k = ctx.num_tokens, ctx.num_moe_layers, ctx.top_k
        self._meta = ctx.trace_meta
        def usable(rows: list) -> list:
            # a usable prediction names k distinct experts; anything else (NO_EXPERT at MoE layer 0) has none
            return [None if NO_EXPERT in ids or len(set(ids)) != k else ids for ids in rows]

        self._pred = TokenRows(ctx.trace_array("pregate_rank")[:T, :, :k], convert=usable, keep=ctx.row_keep)
        self._deviations = np.zeros((T, L), dtype=np.int64)
        self._no_pregate = np.zeros((T, L), dtype=bool)
        self._k = k
        self._L = L
        self._rows = measured_rows(ctx, int(ctx.hw.workload.warmup_tokens))

    def _prefetch(self, ctx: SimContext, t, layer):
        pred = self._pred
        experts = step_union(ctx, lambda token: pred[token][layer] or ())
        for expert in experts:
            if not ctx.prefetch(layer, expert):
                break  # buffer full: the rest are fetched on demand

    def on_layer_start(self, ctx: SimContext, t, layer):
        self._prefetch(ctx, t, layer)  # already staged at layer−1's routing when lookahead is on

    def on_route(self, ctx: SimContext, t, layer, routed):
        # each token its own set; a step of several, their union, each expert run for the tokens whose set holds it
        execute, tokens, (deviations,) = per_token_plan(ctx, t, layer, routed,
                                                        lambda token, own: self._token_set(token, layer, own))
        ctx.cancel_unneeded(layer, execute)
        if self.params.lookahead and layer + 1 < self._L:
            # layer l's pre-gate runs beside its router on the same FFN input: layer l+1's set is known now
            self._prefetch(ctx, t, layer + 1)
        return LayerPlan(execute=execute, substituted=deviations, tokens=tokens)

    def _token_set(self, t, layer, routed) -> tuple[list[int], int]:
        """Token t's executed experts at `layer` (its pre-gate's set, else its routed set) and its deviations from
        its routed set, noted per token."""
        predicted = self._pred[t][layer]
        if predicted is None:
            execute = list(routed)
            self._no_pregate[t, layer] = True
            deviations = 0
        else:
            execute = list(predicted)
            routed_set = set(routed)
            deviations = sum(1 for e in execute if e not in routed_set)
        self._deviations[t, layer] = deviations
        return execute, deviations

    def on_layer_end(self, ctx: SimContext, t, layer):
        ctx.evict_layer(layer)  # only this layer: layer+1's prefetches stay staged

    def extra_metrics(self) -> dict:
        if self._pred is None:
            return {}
        sl = self._rows
        dev = self._deviations[sl]
        routed_experts = dev.size * self._k
        return {
            "deviation_rate": float(dev.sum() / routed_experts),
            "deviation_rate_per_layer": [float(x) for x in dev.mean(axis=0) / self._k],
            "layers_without_pregate_per_token": float(self._no_pregate[sl].sum(axis=1).mean()),
            **quality_fields("pre-gated routing", self._meta, ("pregated",)),
        }
