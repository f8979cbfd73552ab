"""CG-MoE: an expert cache whose misses each go to the cheaper of a fetch and the host CPU (CPU-GPU joint scheduling).

SPICE (its Fig. 7, Table 2, Fig. 8) compares itself against "CG-MoE (CPU-GPU joint scheduling)" and says nothing
more of it in what we have read; no public description of a system by that name was found. ASSUMPTION: CG-MoE is
what the name and SPICE's own cost model suggest, without SPICE's drafts and surrogates:

- an LRU expert cache across tokens of `slots` experts (as `lru`; nothing is prefetched);
- at routing, each routed expert not in the buffer (nor on its way) goes where it would be done first, with SPICE's
  per-miss estimates: a demand fetch lands at ctx.fetch_estimate_ps() (behind every byte already queued on the link,
  and behind the misses fetched before it in this layer) and then runs on the arrays (the expert format's compute
  time); on the host CPU it is done at ctx.host_estimate_ps() (dispatch, the activation's round trip and the CPU's
  time, behind the host's queue and the misses sent there before it). Ties go to the fetch.

Fetched misses enter the cache (the least recently used unprotected expert leaves when it is full); experts run on the
host CPU do not. One sequence only: a step of several tokens would need the host's time per token count.

Metrics: cgmoe_host_share (the share of misses sent to the host CPU, measured tokens); the engine's fallback_rate
counts every miss, wherever it ran.
"""

from __future__ import annotations

from chipsim.policies.base import LayerPlan, SimContext, register
from chipsim.policies.caching import LRU, CacheParams
from chipsim.units import transfer_ps


@register
class CgMoE(LRU):
    name = "cg-moe"
    summary = ("LRU expert cache; each miss to the cheaper of a demand fetch and the host CPU (SPICE's per-miss cost "
               "model, no prefetch): SPICE's CG-MoE baseline, an ASSUMPTION")
    result_columns = ("cgmoe_host_share",)
    batch_support = ""  # one sequence only
    batch_refusal = "its per-miss host estimate is one token's"
    Params = CacheParams
    params: CacheParams

    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        fmt = ctx.expert_format
        self._t_acc = fmt.compute_ps  # the arrays' time for a fetched expert
        self._fetch_one_ps = transfer_ps(fmt.fetch_bytes, ctx.fetch_bytes_per_s)
        self._on_host: list[int] = []
        self._misses = self._to_host = 0

    def _select(self, ctx: SimContext, t, layer, routed):
        """The experts the arrays run: those present and the misses cheaper to fetch; the others go to the host."""
        fetch_base = ctx.fetch_estimate_ps() + self._t_acc
        host_base, host_one = ctx.host_estimate_ps(), ctx.host_timing.total_ps
        fetch_one = self._fetch_one_ps
        execute, on_host = [], []
        fetched = 0
        for e in routed:
            if ctx.present(layer, e):
                execute.append(e)
                continue
            if host_base + len(on_host) * host_one < fetch_base + fetched * fetch_one:
                on_host.append(e)
            else:
                execute.append(e)
                fetched += 1
        if t >= self._warm:
            self._misses += fetched + len(on_host)
            self._to_host += len(on_host)
        self._on_host = on_host
        return execute, 0, None

    def on_route(self, ctx: SimContext, t, layer, routed) -> LayerPlan:
        plan = super().on_route(ctx, t, layer, routed)
        plan.on_host = self._on_host
        return plan

    def extra_metrics(self) -> dict:
        return {**super().extra_metrics(), "cgmoe_host_share": self._to_host / self._misses if self._misses else 0.0}
