"""Expert caches that keep experts across tokens: LRU and LFU (Mixtral-offloading / MoE-Infinity style) and
AdapMoE (adaptive gating + next-layer prefetch + per-layer cache sizes).

The cache is the on-package expert buffer, keyed by (MoE layer, expert). A policy here holds at most
`capacity` experts in it at any moment (its `slots` parameter, 0 = the whole buffer, never more than the
buffer holds), counting experts on their way in. Room is made *before* a fetch is issued: when a layer's
routed experts miss, its victims are evicted in `on_route`, before the engine's demand fetches start, so the
occupancy never exceeds `capacity`, not even inside a layer. The engine's own `choose_victims` call (buffer
full) gets the same victims. The routed experts of the running layer are never victims.

`resident_rate`: the share of executed experts whose bytes had all landed in the buffer when routing decided (a
"hit", in chipsim's one meaning, is an expert present then, landed or on its way: the engine's per-layer `hits`,
`overlap` and `recall`; the resident rate is the stricter count a cache's own bookkeeping sees). Results are means over
the tokens after the warm-up (`warmup` parameter, default 16, or the config's `workload.warmup_tokens` if larger), as
for the engine's own metrics; the warm-up's resident rate is reported beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from chipsim.errors import InputError
from chipsim.policies.base import (LayerPlan, Policy, SimContext, measured_from, measured_rows, param, quality_fields,
                                   register, per_token_plan, step_union)
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import NO_EXPERT, TokenRows

SLOTS_DOC = "experts the cache holds (0 = the whole expert buffer; never more than the buffer holds)"
WARMUP_DOC = "leading tokens reported separately while the cache fills"


def _mean_or_none(values: np.ndarray, counts: np.ndarray):
    total = counts.sum()
    return float(values.sum() / total) if total else None


def _per_layer(values: np.ndarray, counts: np.ndarray) -> list:
    """values / counts summed over tokens, per layer; None where a layer had nothing to count."""
    v, c = values.sum(axis=0), counts.sum(axis=0)
    return [float(a / b) if b else None for a, b in zip(v, c)]


@dataclass(frozen=True)
class CacheParams:
    slots: int = param(0, SLOTS_DOC, minimum=0, maximum=1 << 24)
    warmup: int = param(16, WARMUP_DOC, minimum=0, maximum=1 << 31)


class CacheSizing(Protocol):
    """The parameters ExpertCache reads, which every cache policy's dataclass has (ProMoE's is not a CacheParams:
    its fields come in another order)."""

    @property
    def slots(self) -> int: ...

    @property
    def warmup(self) -> int: ...


class ExpertCache(Policy):
    """Shared machinery: a capacity-bounded expert cache across tokens, with room made before fetches.

    Subclasses choose the victim order (`_order`), which experts a layer executes (`_select`) and may
    prefetch through `_prefetch`; predictions issued for a layer that has not routed yet are protected from
    eviction until it does (`_pending`).
    """

    caches_across_tokens = True
    batch_support = "caches the union of the step's routed experts; an expert's use is the step's, once"
    Params: ClassVar[type] = CacheParams  # ProMoE sets its own, not a CacheParams
    params: CacheSizing

    def __init__(self, label: str, params: CacheSizing | None = None):
        super().__init__(label, params)
        self._resident = None
        self.capacity = 0
        self._reserved = 0
        self._running = (-1, frozenset())
        self._issued_next: set[int] = set()
        # True: a prefetch may evict cached experts to make room; False: it takes free room only
        self.prefetch_evicts = True

    # ---------------------------------------------------------------- set-up
    def warmup_tokens(self) -> int:
        return self.params.warmup

    def _resolve_capacity(self, ctx: SimContext) -> int:
        slots = self.params.slots
        if slots == 0:
            return ctx.slots
        if slots < ctx.top_k:
            raise InputError(f"policies.{self.name}.slots: {slots} cannot hold one layer's top-{ctx.top_k} experts")
        return min(slots, ctx.slots)

    def on_run_start(self, ctx: SimContext) -> None:
        T, L = ctx.num_tokens, ctx.num_moe_layers
        self.capacity = self._resolve_capacity(ctx)
        self._warm_from = ctx.first_token
        self._warm = measured_from(ctx, max(int(ctx.hw.workload.warmup_tokens), self.warmup_tokens()))
        self._rows = measured_rows(ctx, max(int(ctx.hw.workload.warmup_tokens), self.warmup_tokens()))
        self._resident = np.zeros((T, L), dtype=np.int64)  # executed experts landed when routing decided
        self._executed = np.zeros((T, L), dtype=np.int64)
        self._pending: dict[int, set[int]] = {}  # layer -> experts predicted (and protected) until it routes
        self._prefetch_refused = 0
        self._reserved = 0
        self._running = (-1, frozenset())  # the routed layer and the experts it executes, until its end

    # ---------------------------------------------------------------- occupancy and victims
    def _room(self, ctx: SimContext) -> int:
        """Slots this cache may still fill (experts on their way and stopping ones count as held, and so do
        the running layer's misses that the engine fetches once `on_route` returns)."""
        return self.capacity - (ctx.slots - ctx.free_slots()) - self._reserved

    def _order(self, ctx: SimContext, key):
        """Sort key of a candidate victim: lowest goes first. LRU: oldest use (never used = -1), then id."""
        return (ctx.last_use(key), key)

    def _victims(self, ctx: SimContext, layer, needed, count: int) -> list[tuple[int, int]]:
        if count <= 0:
            return []
        # never victims: the layer's needed experts, the running layer's, the predictions still pending
        protect = [(layer, needed), self._running, *self._pending.items()]
        if type(self)._order is ExpertCache._order:  # LRU: the engine ranks and filters in one call
            return ctx.least_recently_used(count, protect)
        # _order is a total order (ties broken by key), so the smallest of (order, key) equal a full sort's first
        ranked = [(self._order(ctx, key), key) for key in ctx.resident_keys()
                  if not any(key[0] == lay and key[1] in experts for lay, experts in protect)]
        if count == 1:
            return [min(ranked)[1]] if ranked else []
        return [key for _, key in sorted(ranked)[:count]]

    def choose_victims(self, ctx: SimContext, layer, needed, count):
        return self._victims(ctx, layer, needed, count)

    def _make_room(self, ctx: SimContext, layer, needed, count: int) -> bool:
        """Evict victims until `count` more experts fit; False if the protected experts leave too little."""
        short = count - self._room(ctx)
        if short > 0:
            for key in self._victims(ctx, layer, needed, short):
                ctx.evict(*key)
        return self._room(ctx) >= count

    def _prefetch(self, ctx: SimContext, layer: int, expert: int) -> bool:
        if ctx.present(layer, expert):
            return True
        room = self._make_room(ctx, -1, (), 1) if self.prefetch_evicts else self._room(ctx) >= 1
        if not room or not ctx.prefetch(layer, expert):
            self._prefetch_refused += 1
            return False
        return True

    # ---------------------------------------------------------------- hooks
    def _select(self, ctx: SimContext, t, layer, routed) -> tuple[list[int], int, dict[int, int] | None]:
        """Experts the layer executes, how many routed ones it drops and, where that changes what runs in a step of
        several tokens, how many tokens each runs for (LayerPlan.tokens; default: all routed, none, None)."""
        return list(routed), 0, None

    def _note_use(self, ctx: SimContext, layer, execute) -> None:
        pass

    def _next_layer_prediction(self, ctx: SimContext, t, layer) -> list[int]:
        """Experts to prefetch for MoE layer `layer` + 1, known at layer `layer`'s routing (default: none)."""
        return []

    def _prefetch_next(self, ctx: SimContext, t, layer) -> set[int]:
        """Prefetch the next layer's predicted experts (protected until it routes); returns those issued."""
        nxt = layer + 1
        issued = set()
        if nxt >= ctx.num_moe_layers:
            return issued
        pred = [e for e in self._next_layer_prediction(ctx, t, layer) if e != NO_EXPERT]
        if not pred:
            return issued
        self._pending[nxt] = set(pred)
        missing = [e for e in pred if not ctx.present(nxt, e)]
        if missing and self.prefetch_evicts:
            # one victim search for all of them: the same victims as one search per expert, since the
            # candidates (resident, unprotected) do not change while the prefetches are issued
            self._make_room(ctx, -1, (), len(missing))
        room = self._room(ctx)  # (read once: each prefetch issued takes one slot, nothing else changes it here)
        for expert in missing:
            if room < 1:
                self._prefetch_refused += 1
                break  # no room that is not protected: the rest are fetched on demand
            if expert in issued:  # (a repeated prediction: already on its way)
                continue
            if not ctx.prefetch(nxt, expert):
                self._prefetch_refused += 1
                break
            issued.add(expert)
            room -= 1
        return issued

    def on_route(self, ctx: SimContext, t, layer, routed):
        self._pending.pop(layer, None)
        execute, dropped, tokens = self._select(ctx, t, layer, routed)
        resident = 0
        for e in execute:
            if ctx.resident(layer, e):
                resident += 1
        # (added: two speculative steps may end on the same token)
        self._resident[t, layer] += resident
        self._executed[t, layer] += len(execute)
        self._note_use(ctx, layer, execute)
        ctx.cancel_unneeded(layer, execute)  # mispredicted prefetches still on their way stop
        misses = 0
        for e in execute:
            if not ctx.present(layer, e):
                misses += 1
        self._running = (layer, frozenset(execute))  # no victim, not even for a prefetch, until the layer ends
        self._make_room(ctx, layer, self._running[1], misses)
        self._reserved = misses  # the engine issues these demand fetches once this hook returns
        try:
            self._issued_next = self._prefetch_next(ctx, t, layer)
        finally:
            self._reserved = 0
        return LayerPlan(execute=execute, dropped=dropped, tokens=tokens)

    def on_layer_end(self, ctx: SimContext, t, layer) -> None:
        self._running = (-1, frozenset())  # experts stay cached across tokens

    # ---------------------------------------------------------------- results
    def extra_metrics(self) -> dict:
        if self._resident is None:
            return {}
        sl, wu = self._rows, slice(self._warm_from, self._warm)
        out = {
            "cache_slots": self.capacity,
            "resident_rate": _mean_or_none(self._resident[sl], self._executed[sl]),
            "resident_rate_per_layer": _per_layer(self._resident[sl], self._executed[sl]),
        }
        if self._warm > self._warm_from:
            out["warmup_resident_rate"] = _mean_or_none(self._resident[wu], self._executed[wu])
        return out


@register
class LRU(ExpertCache):
    name = "lru"
    summary = "expert cache of S slots across tokens, least recently used evicted; misses fetched on demand"
    Params = CacheParams
    params: CacheParams


@register
class LFU(ExpertCache):
    name = "lfu"
    summary = "expert cache of S slots across tokens, least frequently used evicted (ties: least recent)"
    Params = CacheParams
    params: CacheParams

    # Use counts are kept for every (layer, expert) over the whole run, also while it is not cached
    # (MoE-Infinity's activation-frequency view): an expert that comes back is judged on its history.
    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        self._uses: dict[tuple[int, int], int] = {}

    def _note_use(self, ctx: SimContext, layer, execute) -> None:
        uses = self._uses
        for e in execute:
            uses[(layer, e)] = uses.get((layer, e), 0) + 1

    def _order(self, ctx: SimContext, key):
        return (self._uses.get(key, 0), ctx.last_use(key), key)


@dataclass(frozen=True)
class AdapMoEParams(CacheParams):
    gate_threshold: float = param(0.9, "keep routed experts until their normalised cumulative weight reaches this",
                                  minimum=0.0, maximum=1.0)


@register
class AdapMoE(ExpertCache):
    """AdapMoE (Zhong et al., ICCAD 2024), on this chip.

    - Adaptive gating (top-k > 2 only): the routed experts, by descending router weight normalised to sum 1,
      are kept until their cumulative weight reaches `gate_threshold`; the rest are dropped (a routing
      deviation, `LayerPlan.dropped`). At least one expert always runs. Top-1/top-2 models drop nothing.
    - Next-layer prefetch: the first k of `pregate_rank[t, l+1]` (layer l+1's gate applied to layer l's FFN
      input, the current hidden state) are prefetched at layer l's routing, the first moment that hidden state
      exists; they overlap layer l's experts and layer l+1's attention. MoE layer 0 has no such prediction and
      is fetched on demand.
    - Per-layer cache sizes: of the `slots` the policy holds, 2k are kept for staging (the running layer's
      fetches and the next layer's prefetches); the rest, C, is split into per-layer quotas q_l. At a layer's
      end its experts beyond q_l are evicted (least recently used first); when room is needed mid-layer,
      experts beyond their layer's quota go before experts within it, least recently used first.

    The quotas: AdapMoE sizes each layer's cache with a dynamic program over layers that minimises the
    expected loading cost. Here the per-layer hit curve is estimated from the trace's training-split expert
    counts (`train_expert_counts`, never the replayed split): under an independent-reference model a layer
    with c slots holding its c most popular experts hits with expected Σ_{r<c} p_l(r) experts per token, where
    p_l(r) is the r-th largest share of tokens routed to an expert. That objective is separable and concave,
    so the dynamic program's optimum is the greedy one: give the C slots, one by one, to the largest
    p_l(r) over all layers (ties: lower rank r, then lower layer). Layers whose routing concentrates on a few
    experts get more slots than layers that spread evenly, because a slot there saves more fetches; an
    entropy-proportional split would do the opposite and lose hits. Uniform counts give an even split.
    """

    name = "adapmoe"
    batch_support = ("each token keeps its own experts up to the gate threshold; the step executes the union of what "
                     "its tokens keep and prefetches the union of their next-layer predictions; rates per token")
    summary = ("AdapMoE: adaptive gating drops trailing experts past a cumulative router-weight threshold (top-k > 2), "
               "next-layer gate prefetch, LRU cache with per-layer sizes")
    trace_arrays = (pa.PREGATE_RANK, pa.TRAIN_EXPERT_COUNTS)
    Params = AdapMoEParams
    params: AdapMoEParams

    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        T, L, k = ctx.num_tokens, ctx.num_moe_layers, ctx.top_k
        self._k = k
        self._L = L
        self._pred = TokenRows(ctx.trace_array("pregate_rank")[:T, :, :k], keep=ctx.row_keep)
        self.quota = self.layer_quotas(ctx.trace_array("train_expert_counts"), k, max(0, self.capacity - 2 * k))
        self._dropped = np.zeros((T, L), dtype=np.int64)
        self._pred_correct = np.zeros((T, L), dtype=np.int64)  # |predicted ∩ routed|
        # adaptive gating changes the computation only above top-2 (see the class docstring)
        self._quality = quality_fields(f"gate threshold {self.params.gate_threshold:g}" if k > 2 else None,
                                       ctx.trace_meta, ("adapmoe", self.params.gate_threshold))
        self._pred_exec = np.zeros((T, L), dtype=np.int64)  # |predicted ∩ executed|
        self._token_executed = np.zeros((T, L), dtype=np.int64)  # each token's own executed experts
        self._predicted = np.zeros((T, L), dtype=bool)
        self._over_quota: set = set()

    @staticmethod
    def layer_quotas(counts: np.ndarray, k: int, budget: int) -> list[int]:
        """Greedy (= DP-optimal for concave hit curves) split of `budget` slots over layers; see the class doc."""
        counts = np.asarray(counts, dtype=np.float64)
        L, n = counts.shape
        ranked = -np.sort(-counts, axis=1)
        tokens = counts.sum(axis=1) / k
        share = np.divide(ranked, tokens[:, None], out=np.zeros_like(ranked), where=tokens[:, None] > 0)
        order = sorted(((-share[layer, r], r, layer) for layer in range(L) for r in range(n)))
        quota = [0] * L
        for _, _, layer in order[:budget]:
            quota[layer] += 1
        return quota

    def _keep_count(self, weights: np.ndarray) -> int:
        """How many of the routed experts (descending weight) run under the cumulative threshold."""
        k = len(weights)
        if k <= 2:
            return k
        w = np.sort(weights)[::-1]
        total = w.sum()
        if total <= 0:
            return k
        cum = np.cumsum(w / total)
        reached = np.nonzero(cum >= self.params.gate_threshold - 1e-9)[0]
        keep = int(reached[0]) + 1 if reached.size else k
        return max(1, keep)

    def _select(self, ctx: SimContext, t, layer, routed):
        # each token gates its own experts; a step of several runs the union of what they keep, each for its tokens
        execute, tokens, (dropped,) = per_token_plan(ctx, t, layer, routed,
                                                     lambda token, own: self._token_select(ctx, token, layer, own))
        return execute, dropped, tokens

    def _token_select(self, ctx: SimContext, t, layer, routed):
        weights = np.asarray(ctx.trace_row("routed_weights", t, layer), dtype=np.float64)  # known at routing
        keep = self._keep_count(weights)
        order = sorted(range(len(routed)), key=lambda i: (-weights[i], i))  # stable: descending weight
        execute = [routed[i] for i in order[:keep]]
        dropped = len(routed) - keep
        self._dropped[t, layer] = dropped
        self._token_executed[t, layer] = len(execute)
        pred = self._pred[t][layer]
        if NO_EXPERT not in pred:
            ps = set(pred)
            self._predicted[t, layer] = True
            self._pred_correct[t, layer] = len(ps & set(routed))
            self._pred_exec[t, layer] = len(ps & set(execute))
        return execute, dropped

    def _next_layer_prediction(self, ctx: SimContext, t, layer):
        pred = self._pred
        return step_union(ctx, lambda token: pred[token][layer + 1])

    def _order(self, ctx: SimContext, key):
        return (0 if key in self._over_quota else 1, ctx.last_use(key), key)

    def _victims(self, ctx: SimContext, layer, needed, count):
        if count <= 0:
            return []
        # experts beyond their layer's quota (by recency within the layer) are evicted first
        by_layer: dict[int, list] = {}
        for key in ctx.resident_keys():
            by_layer.setdefault(key[0], []).append(key)
        over = set()
        for lay, keys in by_layer.items():
            if len(keys) > self.quota[lay]:
                keys.sort(key=lambda key: (ctx.last_use(key), key), reverse=True)
                over.update(keys[self.quota[lay]:])
        self._over_quota = over
        return super()._victims(ctx, layer, needed, count)

    def on_layer_end(self, ctx: SimContext, t, layer) -> None:
        super().on_layer_end(ctx, t, layer)
        keys = [key for key in ctx.keys_of_layer(layer) if ctx.resident(*key)]
        q = self.quota[layer]
        if len(keys) > q:
            keys.sort(key=lambda key: (ctx.last_use(key), key), reverse=True)
            for key in keys[q:]:
                ctx.evict(*key)

    def extra_metrics(self) -> dict:
        out = super().extra_metrics()
        if not out:
            return out
        sl = self._rows
        dropped = self._dropped[sl]
        routed = np.full(dropped.shape, self._k, dtype=np.int64)
        predicted = self._predicted[sl].astype(np.int64)
        executed = self._token_executed[sl]
        out.update({
            "gate_threshold": self.params.gate_threshold,
            "deviation_rate": float(dropped.sum() / routed.sum()),  # routed experts not computed
            "deviation_rate_per_layer": _per_layer(dropped, routed),
            "dropped_experts_per_token_per_layer": [float(x) for x in dropped.mean(axis=0)],
            "prefetch_accuracy": _mean_or_none(self._pred_correct[sl], predicted * self._k),  # |pred ∩ routed| / k
            "prefetch_accuracy_per_layer": _per_layer(self._pred_correct[sl], predicted * self._k),
            "prefetch_coverage": _mean_or_none(self._pred_exec[sl], predicted * executed),  # of executed ones
            "prefetches_refused": self._prefetch_refused,
            "cache_quota_per_layer": list(self.quota),
            **self._quality,
        })
        return out
