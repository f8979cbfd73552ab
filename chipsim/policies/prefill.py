"""Prefill policies: how a request's prompt gets the experts its chunks route to (chipsim.workload.request).

A prefill chunk of C tokens runs every layer over all of them at once; a MoE layer's experts are the union of its
tokens' routed sets (`routed` in on_route, in order of first appearance), each run as one GEMM over the tokens routed
to it. The hooks are a decode policy's, called once per chunk and layer with t the chunk's last token;
`ctx.step_tokens` names the chunk's tokens, and `ctx.trace_routed(t, layer)` of any of them is known from the
layer's on_route on. After the last chunk, `on_prefill_end` leaves in the buffer what the decode policy starts with
(its own on_run_start then runs).

- on-demand: a layer's experts are fetched when its routing is known, then computed as they land (the baseline of
  every offloading system).
- layer-ahead: while layer l computes, layer l + 1's experts are fetched (every expert of it, or the union of the
  chunk's predicted sets: `experts: predicted`, ProMoE's next-layer predictor in the trace) into the slots layer
  l's own missing experts leave free (at its routing), then into those it gives back (at its end); what layer
  l + 1's router did not pick is abandoned at its routing. A buffer of one layer leaves it little room.
- fiddler-prefill: Fiddler's execution choice (Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference
  of Mixture-of-Experts Models", ICLR 2025, arXiv:2402.07033): per expert not in the buffer, compute it on the host
  CPU next to its weights when that is faster for the tokens routed to it than moving its weights (Fiddler's
  latency model weighs the tokens per expert against CPU and transfer latency); otherwise fetch it.

Every one keeps, with `keep` > 0, that share of the buffer's slots for decode, evenly per MoE layer, holding each
layer's experts the prompt routed the most tokens to (a cache warmed by the prompt); the rest are evicted at each
layer's end, as per-layer staging does.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.policies.base import LayerPlan, Policy, SimContext, param, register
from chipsim.trace import predictor_arrays as pa
from chipsim.workload.host import host_timing
from chipsim.units import transfer_ps


KEEP_DOC = "share of the expert buffer kept for decode with the prompt's most used experts of each layer (0: none)"


@dataclass(frozen=True)
class KeepParams:
    keep: float = param(0.0, KEEP_DOC, minimum=0.0, maximum=1.0)


class PrefillPolicy(Policy):
    """A policy for a request's prefill chunks: per-layer staging, keeping `keep` of the buffer for decode."""

    phase = "prefill"
    in_place = "every expert is already where the arrays read it: the prompt's experts need no fetch"
    Params = KeepParams
    params: KeepParams

    def on_run_start(self, ctx: SimContext) -> None:
        self.prompt_counts = [dict[int, int]() for _ in range(ctx.num_moe_layers)]
        self.kept = 0

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        self._count(ctx, layer)
        ctx.cancel_unneeded(layer, routed)
        return LayerPlan(execute=list(routed))

    def _count(self, ctx: SimContext, layer: int) -> None:
        """Add the chunk's tokens routed to each expert of `layer` to the prompt's counts."""
        counts = self.prompt_counts[layer]
        for token in ctx.step_tokens:
            for e in ctx.trace_routed(token, layer):
                counts[e] = counts.get(e, 0) + 1

    def on_layer_end(self, ctx: SimContext, t: int, layer: int) -> None:
        keep = int(self.params.keep * ctx.slots) // ctx.num_moe_layers
        if not keep:
            ctx.evict_layer(layer)
            return
        counts = self.prompt_counts[layer]
        kept = set(sorted(counts, key=lambda e: (-counts[e], e))[:keep])
        for key in ctx.keys_of_layer(layer):
            if key[1] not in kept:
                ctx.evict(*key)

    def on_prefill_end(self, ctx: SimContext) -> None:
        """The prompt is read: what stays in the buffer is what decode starts with."""
        self.kept = len(ctx.resident_keys())

    def extra_metrics(self) -> dict:
        return {"kept_experts": self.kept}


@register
class OnDemand(PrefillPolicy):
    name = "on-demand"
    summary = "prefill: each layer's experts fetched once its routing is known, computed as they land"


@dataclass(frozen=True)
class LayerAheadParams:
    keep: float = param(0.0, KEEP_DOC, minimum=0.0, maximum=1.0)
    experts: str = param("all", "layer l + 1's experts fetched while layer l computes: all of them, or the union of "
                         "the chunk's tokens' predicted sets (ProMoE's next-layer predictor, top-k each)",
                         choices=("all", "predicted"))


@register
class LayerAhead(PrefillPolicy):
    name = "layer-ahead"
    summary = "prefill: layer l + 1's experts fetched while layer l computes (all, or the chunk's predicted union)"
    Params = LayerAheadParams
    params: LayerAheadParams  # type: ignore[assignment]
    trace_arrays = (pa.PROMOE_RANK,)

    def on_token_start(self, ctx: SimContext, t: int) -> None:
        self._fetch(ctx, 0, ctx.free_slots())

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        """Layer l's experts first: the next layer's take only the slots its missing ones leave free."""
        plan = super().on_route(ctx, t, layer, routed)
        if layer + 1 < ctx.num_moe_layers:
            missing = sum(not ctx.present(layer, e) for e in plan.execute)
            self._fetch(ctx, layer + 1, ctx.free_slots() - missing)
        return plan

    def on_layer_end(self, ctx: SimContext, t: int, layer: int) -> None:
        super().on_layer_end(ctx, t, layer)
        if layer + 1 < ctx.num_moe_layers:  # the slots layer l gave back
            self._fetch(ctx, layer + 1, ctx.free_slots())

    def _fetch(self, ctx: SimContext, layer: int, room: int) -> None:
        """Prefetch up to `room` of `layer`'s wanted experts not yet present."""
        if self.params.experts == "all":
            wanted = range(ctx.num_experts)
        else:
            top_k, picked = ctx.top_k, dict[int, None]()
            for token in ctx.step_tokens:
                for e in ctx.trace_row("promoe_rank", token, layer)[:top_k]:
                    if e < ctx.num_experts:  # (NO_EXPERT: no prediction made)
                        picked[int(e)] = None
            wanted = list(picked)
        for e in wanted:
            if room <= 0:
                return  # the rest come on demand
            if not ctx.present(layer, e):
                if not ctx.prefetch(layer, e):
                    return
                room -= 1


@register
class FiddlerPrefill(PrefillPolicy):
    name = "fiddler-prefill"
    summary = "prefill: each missing expert on the host CPU or fetched, whichever is faster for its tokens (Fiddler)"

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        self._count(ctx, layer)
        counts = {e: 0 for e in routed}
        for token in ctx.step_tokens:
            for e in ctx.trace_routed(token, layer):
                counts[e] += 1
        fmt = ctx.expert_format
        per_fetch = transfer_ps(fmt.fetch_bytes, ctx.fetch_bytes_per_s) + ctx.fetch_setup_ps * len(fmt.part_bytes)
        link_ps, host_ps = ctx.fetch_estimate_ps(), ctx.host_estimate_ps() - ctx.host_timing.total_ps
        execute, on_host = [], []
        for e in routed:
            if ctx.present(layer, e):
                execute.append(e)
                continue
            cpu = host_timing(ctx.hw, ctx.workload, counts[e]).total_ps
            if host_ps + cpu < link_ps + fmt.compute_ps:
                on_host.append(e)
                host_ps += cpu
            else:
                execute.append(e)
                link_ps += per_fetch
        self.host_experts += len(on_host)
        return LayerPlan(execute=execute, on_host=on_host)

    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        self.host_experts = 0

    def extra_metrics(self) -> dict:
        return {**super().extra_metrics(), "host_experts": self.host_experts}

