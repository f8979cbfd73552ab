"""A policy of one's own, registered and run from a script (docs/concepts/policies.md runs it).

`repeat-last` bets on token-to-token reuse: before each MoE layer's attention it prefetches the experts the previous
token routed at that layer, and otherwise stages experts per layer as the base class does (what the router did not
pick is abandoned at routing, the layer's experts are evicted at its end, anything missing is fetched on demand).
"""

import sys

from chipsim.cli import main
from chipsim.policies import Policy, register


@register
class RepeatLast(Policy):
    name = "repeat-last"
    summary = "before each layer's attention, prefetch the experts the previous token routed there"

    def on_layer_start(self, ctx, t, layer):
        if t > ctx.first_token:  # the previous token's routing is known before this token starts
            for expert in ctx.trace_routed(t - 1, layer):
                ctx.prefetch(layer, expert)


if __name__ == "__main__":
    # `chipsim run` in this process, where the policy is registered (its worker processes are forked from it)
    sys.exit(main(["run", "hwconfigs/thor.yaml", "--set", "workload.max_tokens=16",
                   "--policy", "no-prefetch", "--policy", "repeat-last", "--policy", "apex"]))
