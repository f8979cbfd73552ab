"""The reference policies: no prefetch, oracle prefetch, and static top-(k+N) prefetch."""

from __future__ import annotations

import re
from dataclasses import dataclass

from chipsim.policies.base import SHORTHANDS, NoParams, Policy, SimContext, param, register, step_union
from chipsim.trace import predictor_arrays as pa


@register
class NoPrefetch(Policy):
    name = "no-prefetch"
    summary = "on demand: route, then fetch the routed experts, then compute (per-layer staging)"
    batch_support = "the union of the step's routed experts, fetched on demand"
    Params = NoParams
    params: NoParams


@dataclass(frozen=True)
class OracleParams:
    lookahead: int = param(1, "0: prefetch layer l's set before its attention (APEX's timing); 1: also layer l+1's "
                              "set at layer l's routing (as early as ProMoE and Pre-gated fetch)", minimum=0, maximum=1)


@register
class Oracle(Policy):
    name = "oracle"
    summary = ("knows the routed sets in advance and prefetches exactly them: layer l's before its attention, "
               "and with lookahead=1 also layer l+1's as soon as layer l has routed (lower bound)")
    Params = OracleParams
    params: OracleParams
    sees_future_routing = True  # the one policy that reads routing before the run reaches it (an upper bound)
    batch_support = "prefetches the union of the step's routed sets"

    def on_layer_start(self, ctx: SimContext, t, layer):
        for expert in step_union(ctx, lambda token: ctx.trace_routed(token, layer)):
            ctx.prefetch(layer, expert)

    def on_route(self, ctx: SimContext, t, layer, routed):
        plan = super().on_route(ctx, t, layer, routed)
        if self.params.lookahead and layer + 1 < ctx.num_moe_layers:
            for expert in step_union(ctx, lambda token: ctx.trace_routed(token, layer + 1)):
                ctx.prefetch(layer + 1, expert)
        return plan

    def on_layer_end(self, ctx: SimContext, t, layer):
        ctx.evict_layer(layer)  # only this layer: the next layer's prefetches stay staged


@dataclass(frozen=True)
class StaticParams:
    extra: int = param(4, "N: experts prefetched beyond top-k", minimum=0, maximum=255)
    complete_unpicked: bool = param(False, "true: prefetches the router did not pick still move all their bytes "
                                           "(the APEX paper's accounting); false: they stop at routing")


@register
class StaticTopKPlusN(Policy):
    name = "static"
    summary = "before attention, prefetch the top-(k+N) of the APEX prefetch router's ranking (fixed N)"
    batch_support = "prefetches the union of each token's top-(k+N), token by token, until the buffer is full"
    trace_arrays = (pa.APEX_RANK,)
    Params = StaticParams
    params: StaticParams

    def __init__(self, label: str, params: StaticParams | None = None):
        super().__init__(label, params)
        self.complete_unpicked = self.params.complete_unpicked

    def on_layer_start(self, ctx: SimContext, t, layer):
        budget = ctx.top_k + self.params.extra
        ranks = ctx.trace_array("apex_rank")
        for expert in step_union(ctx, lambda token: ranks[token, layer, :budget]):
            if not ctx.prefetch(layer, int(expert)):
                break  # buffer full: the rest of the ranking cannot be staged


def _static_shorthand(text: str):
    match = re.fullmatch(r"static-(\d+)", text)
    return ("static", {"extra": int(match.group(1))}) if match else None


SHORTHANDS.append(_static_shorthand)
