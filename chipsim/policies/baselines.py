"""The reference policies: no prefetch, oracle prefetch, and static top-(k+N) prefetch."""

from __future__ import annotations

import re

from chipsim.policies.base import SHORTHANDS, Param, Policy, register


@register
class NoPrefetch(Policy):
    name = "no-prefetch"
    summary = "on demand: route, then fetch the routed experts, then compute (per-layer staging)"
    params = {}


@register
class Oracle(Policy):
    name = "oracle"
    summary = "knows layer l's routed set before its attention and prefetches exactly it (lower bound)"
    params = {}

    def on_layer_start(self, ctx, t, layer):
        for expert in ctx.trace_routed(t, layer):
            ctx.prefetch(layer, expert)


@register
class StaticTopKPlusN(Policy):
    name = "static"
    summary = "before attention, prefetch the top-(k+N) of the APEX prefetch router's ranking (fixed N)"
    params = {"extra": Param(int, 4, "N: experts prefetched beyond top-k", minimum=0)}

    def on_layer_start(self, ctx, t, layer):
        budget = ctx.top_k + self.extra
        for expert in ctx.trace_array("apex_rank")[t, layer, :budget]:
            if not ctx.prefetch(layer, int(expert)):
                break  # buffer full: the rest of the ranking cannot be staged


def _static_shorthand(text: str):
    match = re.fullmatch(r"static-(\d+)", text)
    return ("static", {"extra": int(match.group(1))}) if match else None


SHORTHANDS.append(_static_shorthand)
