"""ProMoE (Song et al., 2024): a learned predictor on the previous layer's activations, fixed top-k prefetch
one layer ahead, an LRU expert cache, experts moved in gate/up/down chunks.

- The first k of `promoe_rank[t, l+1]` (the prediction for layer l+1, made from layer l's FFN input, i.e.
  its gate's input) are prefetched at layer l's routing: that hidden state exists only once layer l's
  attention has run, so this is the earliest causal point (not layer l's start). The transfers overlap
  layer l's experts and layer l+1's attention. MoE layer 0 has no earlier layer to predict from (the trace
  holds NO_EXPERT there): its experts are fetched on demand after routing.
- Cache (default): an LRU cache of `slots` experts (0 = the whole buffer) kept across tokens; prefetched
  experts enter it, evicting the least recently used expert that is neither routed by the running layer nor
  predicted for the next one (a prefetch that never got used counts as least recent). A mispredicted
  prefetch still on its way when the layer routes is stopped. Warm-up tokens (`warmup`) are reported apart.
- No cache (`cache: false`, or `slots: -1`): per-layer staging: a layer's experts are evicted once it has run,
  its mispredicted prefetches stop at routing; nothing is kept across tokens, so there is no warm-up.
- Every expert moves as three DMA transfers (gate, up, down: `transfer_per_matrix`); demand fetches go ahead
  of queued prefetches and pause moving ones at their next chunk boundary (the DMA model does this).

Metrics: `prediction_recall` = mean |predicted ∩ routed| / k over the layers that have a prediction (and per
layer, None for layer 0); `cache_resident_rate` = routed experts already landed in the buffer when routing decided /
routed experts, whether they came from the cache or from this token's prefetch; and `resident_from_cache_rate`, the
part of it that no prefetch of this token brought in (chipsim.policies.caching: "resident", not "hit", which in
chipsim means present, landed or on its way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chipsim.policies.base import SimContext, param, register, step_union
from chipsim.trace import predictor_arrays as pa
from chipsim.policies.caching import WARMUP_DOC, ExpertCache, _mean_or_none, _per_layer
from chipsim.trace.format import NO_EXPERT, TokenRows


@dataclass(frozen=True)
class ProMoEParams:
    slots: int = param(0, "experts the LRU cache holds (0 = the whole expert buffer, -1 = no cache)", minimum=-1,
                       maximum=1 << 24)
    cache: bool = param(True, "false: no cache across tokens, experts staged per layer (as slots=-1)")
    warmup: int = param(16, WARMUP_DOC + " (no cache: none)", minimum=0, maximum=1 << 31)


@register
class ProMoE(ExpertCache):
    name = "promoe"
    batch_support = ("prefetches the union of each token's next-layer prediction; caches the union of the routed "
                     "experts; prediction recall per token")
    summary = ("ProMoE: previous-layer predictor, top-k prefetched one layer ahead in gate/up/down chunks, "
               "LRU expert cache (cache=false: per-layer staging)")
    trace_arrays = (pa.PROMOE_RANK,)
    Params = ProMoEParams
    params: ProMoEParams
    transfer_per_matrix = True

    def __init__(self, label: str, params: ProMoEParams | None = None):
        super().__init__(label, params)
        self.cached = self.params.cache and self.params.slots != -1
        # instance attributes: anyone reading them sees the per-layer staging
        self.caches_across_tokens = self.cached
        self.prefetch_evicts = self.cached  # staging: a prefetch takes free room, never evicts

    def warmup_tokens(self) -> int:
        return self.params.warmup if self.cached else 0

    def _resolve_capacity(self, ctx: SimContext) -> int:
        return super()._resolve_capacity(ctx) if self.cached else ctx.slots

    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        T, L, k = ctx.num_tokens, ctx.num_moe_layers, ctx.top_k
        self._k, self._L = k, L
        self._pred = TokenRows(ctx.trace_array("promoe_rank")[:T, :, :k], keep=ctx.row_keep)
        self._pred_correct = np.zeros((T, L), dtype=np.int64)
        self._has_pred = np.zeros((T, L), dtype=bool)
        self._from_cache = np.zeros((T, L), dtype=np.int64)  # landed, and no prefetch of this token brought it
        self._issued: dict[int, set[int]] = {}  # layer -> experts this token's prefetch issued

    def _next_layer_prediction(self, ctx: SimContext, t, layer):
        pred = self._pred
        return step_union(ctx, lambda token: pred[token][layer + 1])

    def on_route(self, ctx: SimContext, t, layer, routed):
        for token in ctx.step_tokens:  # each token's own prediction against its own routing
            pred = self._pred[token][layer]
            if NO_EXPERT not in pred:
                own = routed if len(ctx.step_tokens) == 1 else ctx.trace_routed(token, layer)
                self._has_pred[token, layer] = True
                self._pred_correct[token, layer] = len(set(pred) & set(own))
        issued = self._issued.pop(layer, set())
        from_cache = 0
        for e in routed:
            if e not in issued and ctx.resident(layer, e):
                from_cache += 1
        self._from_cache[t, layer] = from_cache
        plan = super().on_route(ctx, t, layer, routed)  # also prefetches layer + 1
        self._issued[layer + 1] = self._issued_next
        return plan

    def on_layer_end(self, ctx: SimContext, t, layer) -> None:
        super().on_layer_end(ctx, t, layer)
        if not self.cached:
            ctx.evict_layer(layer)

    def extra_metrics(self) -> dict:
        out = super().extra_metrics()
        if not out:
            return out
        sl = self._rows
        k_counts = self._has_pred[sl].astype(np.int64) * self._k
        out["cache_slots"] = self.capacity if self.cached else 0
        out["cache_resident_rate"] = out.pop("resident_rate")
        out["cache_resident_rate_per_layer"] = out.pop("resident_rate_per_layer")
        if "warmup_resident_rate" in out:
            out["warmup_cache_resident_rate"] = out.pop("warmup_resident_rate")
        out["resident_from_cache_rate"] = _mean_or_none(self._from_cache[sl], self._executed[sl])
        out["prediction_recall"] = _mean_or_none(self._pred_correct[sl], k_counts)
        out["prediction_recall_per_layer"] = _per_layer(self._pred_correct[sl], k_counts)
        out["prefetches_refused"] = self._prefetch_refused
        return out
