"""A policy of your own (the write-a-policy tutorial): before a MoE layer's attention, prefetch the experts that
layer routed for the last few tokens. Routing repeats from token to token (`chipsim inspect` calls it reuse), so
this guesses with no predictor at all.

Run as a script, this file registers the policy and hands its arguments to chipsim's command line:

    python docs/examples/my_policy.py run hwconfigs/thor.yaml --policy no-prefetch --policy repeat

Copied into chipsim/policies/, it is a built-in policy: the package imports every module there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from chipsim.policies.base import LayerPlan, Policy, SimContext, param, register


@dataclass(frozen=True)
class RepeatParams:
    tokens: int = param(1, "previous tokens whose routed experts of a layer are prefetched before its attention",
                        minimum=1, maximum=8)


@register
class Repeat(Policy):
    name = "repeat"  # --policy repeat, policies.repeat.tokens in a config
    summary = "before a layer's attention, prefetch what the layer routed for the last `tokens` tokens (no predictor)"
    Params = RepeatParams
    params: RepeatParams
    # steps of several sequences would need each sequence's own previous tokens: refused in one line instead
    batch_refusal = "it reads the previous tokens of one sequence"

    def __init__(self, label: str, params: RepeatParams | None = None):
        super().__init__(label, params)
        self.routed = self.staged = 0

    def on_layer_start(self, ctx: SimContext, t: int, layer: int) -> None:
        # every token before t has been routed, so reading its routing here is allowed
        for past in range(max(0, t - self.params.tokens), t):
            for expert in ctx.trace_routed(past, layer):
                if not ctx.prefetch(layer, expert):
                    return  # the buffer is full: nothing is evicted for a prefetch

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        self.routed += len(routed)
        self.staged += sum(ctx.present(layer, expert) for expert in routed)
        # the default: run the routed experts (a missing one is fetched on demand) and stop unpicked prefetches
        return super().on_route(ctx, t, layer, routed)

    def extra_metrics(self) -> dict:
        # scalars land in --json, results.json and results.csv with no other change
        return {"repeat_staged_share": self.staged / self.routed if self.routed else 0.0}


if __name__ == "__main__":
    from chipsim.cli import main

    sys.exit(main(sys.argv[1:]))
