"""APEX: adaptive pre-attention expert prefetch, in its correctness-preserving and stall-free modes.

Before a MoE layer's attention, APEX's prefetch router ranks the experts (trace: `apex_rank`) and its
ordinal logistic CDF p_δ(x) = σ(θ_δ − wᵀx) (trace: `apex_theta` per layer, `apex_score` per token-layer)
gives the extra budget δ̂(x) = min{δ : p_δ(x) ≥ τ}; the top-(k+δ̂) of the ranking are prefetched into the
per-layer buffer (loaded, used, evicted at the layer's end).

- `apex` (correctness-preserving): the router's experts run as routed; those not prefetched are fetched
  on demand by the engine while the available ones are computed.
- `apex-sf` (stall-free, the paper's Algorithm 1): each routed expert not in the buffer at routing is
  replaced by the prefetched, non-routed expert of this layer that the original router ranks highest
  (each substitute used once); if none is left the expert is dropped. Nothing is fetched on demand; the
  layer can still wait for a prefetch that is on its way, never for a miss.

Both read only predictor outputs the trace recorded before routing (and, for apex-sf, the original
router's ranking at routing time). δ* (`predictor_arrays.delta_star`) is only reported (coverage), from the
routed sets as each layer routes.

apex-sf changes what the model computes; its results carry the held-out perplexity cost measured on the
trace's model at its τ (meta['quality']['apex_sf'][τ], chipsim.tracegen.quality: `quality_cost`,
`quality_source`), or say why there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chipsim.policies.base import (LayerPlan, Policy, SimContext, measured_from, measured_rows, param, quality_fields,
                                   register, per_token_plan, step_union)
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import TokenRows


@dataclass(frozen=True)
class ApexParams:
    tau: float = param(0.90, "confidence τ of the CDF: δ̂ = min{δ : p_δ ≥ τ} (0 < τ < 1)",
                       minimum=0.0, maximum=1.0, min_exclusive=True, max_exclusive=True)
    max_extra: int = param(-1, "cap on δ̂ (experts beyond top-k); -1 = no cap (N−k)", minimum=-1, maximum=255)
    complete_unpicked: bool = param(False, "true: prefetches the router did not pick still move all their bytes "
                                           "(the APEX paper's accounting); false: they stop at routing")


@register
class Apex(Policy):
    name = "apex"
    summary = ("before attention, prefetch the top-(k+δ̂) of the APEX prefetch router's ranking, δ̂ from its CDF at τ; "
               "missing routed experts are fetched on demand (correctness-preserving)")
    Params = ApexParams
    params: ApexParams
    stall_free = False
    trace_arrays = (pa.APEX_RANK, pa.APEX_SCORE, pa.APEX_THETA)
    batch_support = ("prefetches the union of each token's top-(k+δ̂), token by token, until the buffer is full; δ* "
                     "and coverage are per token")

    def __init__(self, label: str, params: ApexParams | None = None):
        super().__init__(label, params)
        self.complete_unpicked = self.params.complete_unpicked
        self._reset()

    def _reset(self):
        self._delta_hat = None  # (T, L) budget used, after the cap
        self._budget = None
        self._apex_rank = None  # (T, L, N) the prefetch router's rankings, for δ* at the end
        self._layers = 0
        self._routed_seen = None  # each (token, layer)'s routed set at t * L + layer, noted as it routes: δ*, reported
        self._rank = None
        self._warmup = 0
        self._first = 0
        self._meta = {}
        self._capped = False
        self._layer_substituted = None
        self._layer_dropped = None

    # ------------------------------------------------------------------ hooks
    def on_run_start(self, ctx: SimContext) -> None:
        T = ctx.num_tokens
        max_extra = self.params.max_extra
        delta = pa.delta_hat(ctx.trace_array("apex_score")[:T], ctx.trace_array("apex_theta"), self.params.tau)
        self._capped = bool(max_extra >= 0 and (delta > max_extra).any())
        if max_extra >= 0:
            delta = np.minimum(delta, max_extra)
        self._delta_hat = delta
        self._budget = (delta + ctx.top_k).tolist()
        self._apex_rank = ctx.trace_array("apex_rank")[:T]
        self._rank = TokenRows(self._apex_rank, keep=ctx.row_keep)
        self._layers = ctx.num_moe_layers
        self._routed_seen = [None] * (T * self._layers)
        self._first = ctx.first_token
        self._warmup = measured_from(ctx, int(ctx.hw.workload.warmup_tokens))
        self._rows = measured_rows(ctx, int(ctx.hw.workload.warmup_tokens))
        self._meta = ctx.trace_meta
        if self.stall_free:
            L = ctx.num_moe_layers
            self._layer_substituted = np.zeros((T, L), dtype=np.int64)
            self._layer_dropped = np.zeros((T, L), dtype=np.int64)
        self._routed_count = ctx.top_k

    def on_layer_start(self, ctx: SimContext, t, layer):
        rank, budget = self._rank, self._budget
        for expert in step_union(ctx, lambda token: rank[token][layer][:budget[token][layer]]):
            if not ctx.prefetch(layer, expert):
                break  # buffer full: the rest of the ranking cannot be staged

    def on_route(self, ctx: SimContext, t, layer, routed):
        """The base class's correctness-preserving default (cancel unpicked in-flight prefetches, execute the routed
        set, the engine demand-fetches what is missing); each token's routed set is noted for δ*."""
        self._note_routed(ctx, t, layer, routed)
        return super().on_route(ctx, t, layer, routed)

    def _note_routed(self, ctx: SimContext, t, layer, routed):
        if len(ctx.step_tokens) == 1:
            self._routed_seen[t * self._layers + layer] = routed
            return
        for token in ctx.step_tokens:
            self._routed_seen[token * self._layers + layer] = ctx.trace_routed(token, layer)

    # on_layer_end: the base class's, evict the layer.

    # ------------------------------------------------------------------ results
    def extra_metrics(self) -> dict:
        if self._delta_hat is None:
            return {}
        first = self._first  # the tokens this policy ran (a request's decode steps)
        if isinstance(self._rows, slice):
            dh = self._delta_hat[self._rows]
            ranks = self._apex_rank[first:]
            routed = np.array(self._routed_seen[first * self._layers:], dtype=np.int64).reshape(ranks.shape[:2] + (-1,))
            ds = pa.delta_star(ranks, routed)[self._warmup - first:]
        else:  # a served run: the trace tokens its requests read
            L, read = self._layers, np.flatnonzero(self._rows)
            dh, ranks = self._delta_hat[read], self._apex_rank[read]
            routed = np.array([self._routed_seen[t * L + layer] for t in read for layer in range(L)],
                              dtype=np.int64).reshape(ranks.shape[:2] + (-1,))
            ds = pa.delta_star(ranks, routed)
        out = {
            "tau": self.params.tau,
            "mean_delta_hat": float(dh.mean()),
            "mean_delta_star": float(ds.mean()),
            "coverage": float((ds <= dh).mean()),
            "delta_hat_per_layer": [float(x) for x in dh.mean(axis=0)],
            "delta_star_per_layer": [float(x) for x in ds.mean(axis=0)],
        }
        return out


@register
class ApexStallFree(Apex):
    name = "apex-sf"
    param_family = "apex"
    summary = ("APEX prefetch; a routed expert missing at routing is replaced by the prefetched non-routed expert "
               "the router ranks highest, or dropped: never fetched on demand (stall-free, changes routing)")
    # Params: apex's (ApexParams); param_family lets one policies.apex section set both
    stall_free = True
    batch_support = ("each token's missing routed experts are replaced by its own highest-ranked prefetched ones (or "
                     "dropped); the step executes the union of what its tokens keep and substitute")

    def on_route(self, ctx: SimContext, t, layer, routed):
        self._note_routed(ctx, t, layer, routed)
        # each token keeps and substitutes on its own; a step of several runs the union, each for its tokens
        execute, tokens, (substituted, dropped) = per_token_plan(
            ctx, t, layer, routed, lambda token, own: self._token_plan(ctx, token, layer, own))
        if not self.complete_unpicked:
            ctx.cancel_unneeded(layer, execute)  # keep the substitutes' prefetches, drop the rest
        return LayerPlan(execute=execute, substituted=substituted, dropped=dropped, tokens=tokens)

    def _token_plan(self, ctx: SimContext, t, layer, routed) -> tuple[list[int], int, int]:
        """Token t's routed experts that are present, then its substitutes for the missing ones (the router's
        highest-ranked present experts it did not route to), and how many it drops; noted per token."""
        kept = [e for e in routed if ctx.present(layer, e)]
        missing = len(routed) - len(kept)
        substitutes = []
        if missing:
            routed_set = set(routed)
            for expert in ctx.trace_row("router_rank", t, layer):  # descending original-router probability
                if expert not in routed_set and ctx.present(layer, expert):
                    substitutes.append(expert)
                    if len(substitutes) == missing:
                        break
        dropped = missing - len(substitutes)
        self._layer_substituted[t, layer] = len(substitutes)
        self._layer_dropped[t, layer] = dropped
        return kept + substitutes, len(substitutes), dropped

    def extra_metrics(self) -> dict:
        out = super().extra_metrics()
        if not out:
            return out
        sl = self._rows
        subs, drops = self._layer_substituted[sl], self._layer_dropped[sl]
        routed = subs.size * self._routed_count
        out["substitution_rate"] = float(subs.sum() / routed)  # share of routed experts replaced
        out["drop_rate"] = float(drops.sum() / routed)
        # the measured record prefetches the uncapped top-(k+δ̂); a binding max_extra is another operating point
        tau = self.params.tau
        reason = (f"not measured: max_extra = {self.params.max_extra} caps δ̂ on this run, and "
                  "meta['quality']['apex_sf'] was measured with the uncapped δ̂") if self._capped else None
        out.update(quality_fields(f"tau {tau:g}", self._meta, ("apex_sf", float(tau)), reason))
        return out
