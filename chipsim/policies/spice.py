"""SPICE: speculative deep prefetch with a draft predictor, LoRE surrogates and a CPU/fetch cost model.

SPICE (arXiv 2608.21240) replays the trace's draft predictions:
`draft_ids[t, l, d-1]` is the draft's top-k for MoE layer l made d layers earlier, with confidence
`draft_conf[t, l, d-1]` (its probability mass on those k experts).

Prefetch (on_layer_start(l), before layer l's attention). For d = 1, 2, … the policy looks at the draft
made at layer l for layer l+d and prefetches its k experts. The depth grows while the confidence stays
≥ `confidence`; it stops at the first depth below it, but never before

    D_min = ⌈W_e / (B · T_layer)⌉

layers (W_e: bytes of one expert as fetched, B: bandwidth of the fetch path's bottleneck, T_layer: the
arrays' time for one MoE layer = attention + router + shared experts + k routed experts + weighted sum,
from the workload; computed once in on_run_start), and never past `max_depth` or the last layer. The
depth reached at every token-layer is recorded (`mean_prefetch_depth`).

Expert cache. Experts stay in the buffer across tokens (`slots` of them, 0 = the whole buffer). Victims
are least recently used: every expert carries a stamp, the position (token·L + layer) at which it was
last executed or, for a prefetch, the position at which its predicted layer will run. An expert whose
stamp lies ahead of the running layer is a pending prediction and is evicted only when nothing else can
go (then the farthest-ahead first); the running layer's routed experts are never victims. Room is made
before a prefetch or a demand fetch is issued, so the cache holds at most `slots` experts (plus, for a
moment, experts whose cancelled transfers are still stopping). Layers are not evicted at their end.

Misses (a routed expert neither resident nor on its way when routing decides):
- low-confidence miss (the depth-1 draft's confidence for this layer, draft_conf[t, l, 0], is below
  `confidence`) on a model with shared experts: replaced by the resident shared expert plus the
  expert's LoRE low-rank residual (LayerPlan.surrogate). Its arrays cost is `surrogate_op`: the
  paper's residual B_e·A_e·h (d→r→d, `lore_form: residual`, 2·d·r BF16 weights per expert), or
  rank-r factors of all three expert matrices (`lore_form: factored`: gate and up d→r→I, down I→r→d,
  3·r·(d+I) weights). The LoRE weights of every expert must fit the HBM left over after weights, KV
  cache, activations and the expert buffer, else the run is rejected (policies.spice.lore_rank). A
  model without shared experts has no surrogate: its low-confidence misses go to the cost model below,
  and the results say so (`spice_surrogate`).
- high-confidence miss, or a layer no draft predicted (MoE layer 0: nothing runs before it, so there
  is no confidence to judge it by; it is treated as high-confidence, i.e. computed exactly): a per-miss
  cost model picks the cheaper of
      fetch: ctx.fetch_estimate_ps() (setup + path latency + (link queue + W_e)/B) + the arrays' time
             for the expert (T_acc), plus W_e/B for each miss of this layer already sent to the link;
      host CPU: ctx.host_estimate_ps() (dispatch + 2·H/B + T_cpu, behind the host's queue), plus one
             host job for each miss of this layer already sent to the CPU.
  Fetch keeps the expert in `execute` (the engine demand-fetches it); CPU puts it in `on_host`. The
  link queue counts queued prefetches too: a demand fetch pre-empts them, but every prefetch it delays
  is one the next layers wait for, so the queue is the cost SPICE's "current PCIe pressure" stands for.

Transfer scheduling (`schedule`): when routing decides, this layer's prefetches still on their way that
the router did not pick are cancelled, so their bytes stop competing with demand fetches and deeper
prefetches. (Nearest-layer-first issue order and demand-over-prefetch priority hold in every variant:
the first is the depth loop's order, the second the DMA model's `dma.demand_preempts_prefetch`.)

The paper's ablation (Fig. 9, "exact residual" setting, i.e. no surrogates) maps onto the parameters:

| variant | deep | cpu_fallback | surrogate | schedule |
| --- | --- | --- | --- | --- |
| full SPICE | true | true | true | true |
| (a) deep prediction + full prefetch (every miss fetched) | true | false | false | false |
| (b) deep prediction + CPU fallback | true | true | false | false |
| (c) shallow (next layer only) + CPU fallback | false | true | false | false |
| (d) shallow + transfer scheduling | false | false | false | true |

`deep: false` prefetches exactly the depth-1 draft (the next layer), whatever its confidence and D_min.

Metrics (extra_metrics, means over the tokens after the warm-up, like the engine's; the miss share itself is
the engine's fallback_rate): spice_fetched_misses_per_token, spice_low_confidence_misses_per_token,
mean_prefetch_depth,
spice_d_min, spice_cache_slots, spice_surrogate (what replaces low-confidence misses), spice_lore_hbm_bytes;
and the quality cost of the surrogates (quality_mode, quality_cost, quality_source): with surrogates on, the
held-out perplexity measured on the trace's model for this run's variant (residual LoRE of rank `lore_rank`
at `confidence`: meta['quality']['spice_lore']['variants'][str(lore_rank)], chipsim.tracegen.quality), an upper
bound since that measurement surrogates every low-confidence draft miss whatever the cache holds; with
surrogates off or no shared experts every routed expert is computed exactly (quality_mode None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappop, heappush, heapreplace

import numpy as np

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel
from chipsim.policies.base import (LayerPlan, Policy, SimContext, measured_rows, param, quality_fields,
                                   quality_record, register)
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import DRAFT_DEPTH, NO_EXPERT
from chipsim.units import PS_PER_S, transfer_ps
from chipsim.workload.decode import BF16_BYTES
from chipsim.workload.host import host_timing

LORE_FORMS = ("residual", "factored")


def lore_weights_per_expert(d: int, inter: int, rank: int, form: str) -> int:
    """LoRE parameters of one expert: residual B·A (d×r + r×d) or rank-r factors of gate, up and down."""
    if form == "residual":
        return 2 * d * rank
    return 2 * (d * rank + rank * inter) + (inter * rank + rank * d)


def lore_op(am: ArrayModel, d: int, inter: int, rank: int, form: str):
    """Arrays cost of one surrogate expert on top of the (already computed) shared expert, BF16 weights."""
    if form == "residual":
        op = am.matvec("lore_a", d, rank, d * rank * BF16_BYTES)
        op = op + am.matvec("lore_b", rank, d, rank * d * BF16_BYTES)
        return op + am.vector("lore_add_shared", d)
    op = am.matvec("lore_gate_up_a", d, 2 * rank, 2 * d * rank * BF16_BYTES)
    op = op + am.matvec("lore_gate_up_b", rank, 2 * inter, 2 * rank * inter * BF16_BYTES)
    op = op + am.sfu("lore_silu", inter) + am.vector("lore_mul", inter)
    op = op + am.matvec("lore_down_a", inter, rank, inter * rank * BF16_BYTES)
    op = op + am.matvec("lore_down_b", rank, d, rank * d * BF16_BYTES)
    return op + am.vector("lore_add_shared", d)


@dataclass(frozen=True)
class SpiceParams:
    confidence: float = param(0.7, "draft confidence (probability mass on its top-k) needed to look one layer deeper, "
                                   "and below which a miss is low-confidence", minimum=0.0, maximum=1.0)
    max_depth: int = param(8, "deepest prefetch, in layers ahead (the trace's draft depth is 8)", minimum=1,
                           maximum=DRAFT_DEPTH)
    slots: int = param(0, "experts the cache holds (0 = the whole expert buffer; never more than it holds)", minimum=0,
                       maximum=1 << 24)
    lore_rank: int = param(16, "rank r of the LoRE residual (the paper uses 16 or 32)", minimum=1, maximum=1 << 16)
    lore_form: str = param("residual", "LoRE shape: 'residual' (paper: y_shared + B·A·h, d→r→d) or 'factored' "
                                       "(rank-r factors of gate, up and down)", choices=LORE_FORMS)
    deep: bool = param(True, "true: confidence-adaptive depth (≥ D_min); false: next layer only (depth 1)")
    cpu_fallback: bool = param(True, "true: high-confidence misses go to the cheaper of fetch and host CPU; false: "
                                     "always fetched")
    surrogate: bool = param(True, "true: low-confidence misses use shared expert + LoRE (models with shared experts "
                                  "only); false: exact (cost model)")
    schedule: bool = param(True, "true: cancel this layer's unrouted prefetches still on the link when routing decides")
    warmup: int = param(4, "leading tokens reported separately while the cache fills", minimum=0, maximum=1 << 31)


@register
class Spice(Policy):
    name = "spice"
    adopts_buffer = False  # its cache is its own stamps
    in_place = ("every expert is already where the arrays read it: no miss goes to the host CPU or a surrogate, "
                "and it runs as no-prefetch does")
    summary = ("draft predictions several layers deep (depth grows with confidence, ≥ D_min), expert cache; "
               "misses: LoRE surrogate (low confidence) or the cheaper of fetch / host CPU")
    caches_across_tokens = True
    batch_support = ("prefetches each token's drafts (its own depth; every prefetch stamped for the step); a miss is "
                     "low-confidence when every token routed to it is, else the cost model weighs fetching it against "
                     "the host CPU computing it for all its tokens")
    trace_arrays = (pa.DRAFT_IDS, pa.DRAFT_CONF)
    Params = SpiceParams
    params: SpiceParams

    def __init__(self, label: str, params: SpiceParams | None = None):
        super().__init__(label, params)
        self.surrogate_op = None
        self._in_place = False  # the machine reads experts in place (set at on_run_start)

    def warmup_tokens(self) -> int:
        return self.params.warmup

    # ------------------------------------------------------------------------------ set-up
    def on_run_start(self, ctx: SimContext) -> None:
        m = ctx.workload.model
        T, L = ctx.num_tokens, ctx.num_moe_layers
        self._L = L
        self._in_place = ctx.in_place
        self._E = ctx.num_experts
        self._cells = L * ctx.num_experts  # (MoE layer, expert) pairs: a stamp's heap entry is stamp * cells + index
        self._rows = measured_rows(ctx, max(int(ctx.hw.workload.warmup_tokens), self.warmup_tokens()))
        slots, rank, form = self.params.slots, self.params.lore_rank, self.params.lore_form
        if slots == 0:
            self.capacity = ctx.slots
        elif slots < ctx.top_k:
            raise InputError(f"policies.spice.slots: {slots} cannot hold one layer's top-{ctx.top_k} experts")
        else:
            self.capacity = min(slots, ctx.slots)

        # D_min = ⌈W_e / (B · T_layer)⌉, capped at max_depth
        fmt = ctx.expert_format
        self._bandwidth = ctx.fetch_bytes_per_s
        # T_layer: the mean MoE layer (a hybrid model's Mamba2 and attention layers differ; equal layers give one's)
        layers = [ctx.workload.moe_layer(i) for i in range(ctx.workload.model.num_moe_layers)]
        t_layer = sum(op.duration_ps for costs in layers
                      for op in (costs.attention, costs.router, costs.dense, costs.combine) if op) // len(layers)
        t_layer += ctx.top_k * fmt.compute_ps
        d_min = -(-fmt.fetch_bytes * PS_PER_S // (self._bandwidth * t_layer))
        self.d_min = max(1, min(d_min, self.params.max_depth))
        self._fetch_one_ps = transfer_ps(fmt.fetch_bytes, self._bandwidth)
        self._t_acc = fmt.compute_ps

        # surrogates: only where a shared expert exists, with LoRE weights that fit the spare HBM
        self.surrogate_op = None
        self.lore_bytes = 0
        self._use_surrogate = bool(self.params.surrogate and m.num_shared_experts > 0)
        if self._use_surrogate:
            per_expert = lore_weights_per_expert(m.hidden_size, m.expert_ffn, rank, form)
            self.lore_bytes = per_expert * BF16_BYTES * m.num_moe_layers * m.num_experts
            spare = ctx.workload.hbm_spare_bytes
            if self.lore_bytes > spare:
                raise InputError(
                    f"policies.spice.lore_rank: LoRE weights of rank {rank} for all "
                    f"{m.num_moe_layers * m.num_experts} experts take {self.lore_bytes / 2**20:.1f} MiB, more than "
                    f"the {max(spare, 0) / 2**20:.1f} MiB of HBM left after weights, KV cache, activations and "
                    f"the expert buffer")
            self.surrogate_op = lore_op(ArrayModel(ctx.hw), m.hidden_size, m.expert_ffn, rank, form)
        self._quality = self._quality_fields(ctx.trace_meta)
        if self._use_surrogate:
            cost = self._quality["quality_source"]
            if self._quality["quality_cost"] is not None:
                cost = f"measured, {cost}"
            self.surrogate_note = f"shared expert + LoRE rank {rank} ({form}); quality cost {cost}"
        elif m.num_shared_experts == 0:
            self.surrogate_note = ("none: the model has no shared experts, so low-confidence misses go to the "
                                   "fetch / host-CPU cost model")
        else:
            self.surrogate_note = "none: surrogate disabled (policies.spice.surrogate = false)"

        self._ids = ctx.trace_array("draft_ids")  # uint8 (T, L, D, k), as the trace format checks on loading
        _, _, depths, k = self._ids.shape
        self._draft_row = k  # one draft's k ids, a row of a token's bytes
        self._draft_layer = depths * k  # one layer's drafts
        self._conf = ctx.trace_array("draft_conf")
        # every expert in the buffer -> LRU stamp (see module doc), by index: layer * experts + expert (an int hashes and
        # compares faster than a (layer, expert) tuple)
        self._stamp: dict[int, int] = {}
        self._room_base = self.capacity - ctx.slots  # room = this + the engine's free slots
        # the cached experts by stamp, as stamp * cells + layer * experts + expert (plain ints, compared as fast as ints
        # are; the same order as (stamp, key)), smallest first. An expert's entry is pushed when it comes in and moved
        # lazily: a stamp only grows, so an entry at or below its expert's stamp keeps the smallest live one on top once
        # entries found behind their stamps move up to them (_evict_past); one whose expert has gone is dropped
        self._by_stamp: list[int] = []
        self._pos, self._token_ids, self._token_conf = 0, b"", []
        self._step_drafts: list[tuple[int, bytes, list[list[float]]]] = []  # a batch step's (token, ids, conf)
        self._host_by_tokens: dict[int, int] = {}
        # per token-layer counters
        self.depth = np.zeros((T, L), dtype=np.int16)
        self.misses = np.zeros((T, L), dtype=np.int16)
        self.low_conf = np.zeros((T, L), dtype=np.int16)
        self.fetched = np.zeros((T, L), dtype=np.int16)
        self.depth_cut_by_buffer = 0
        self.miss_log: list[tuple] = []  # (t, layer, expert, fetch_ps, host_ps, choice) for high-confidence misses

    def _quality_fields(self, meta: dict) -> dict:
        """The measured quality cost of what this run computes: the LoRE variant of its rank (residual form, at
        its confidence) when surrogates are on; none when every routed expert is computed exactly."""
        if not self._use_surrogate:
            why = ("surrogates are off (policies.spice.surrogate = false)" if not self.params.surrogate
                   else "the model has no shared experts, so there are no surrogates")
            return quality_fields(None, reason=f"exact: {why}; every routed expert is computed as routed "
                                               "(fetched or on the host CPU)")
        rank, form, confidence = self.params.lore_rank, self.params.lore_form, self.params.confidence
        mode = f"shared expert + LoRE rank {rank} surrogates"
        if form != "residual":
            mode += f", {form} form"
        reason = None
        record, _ = quality_record(meta, ("spice_lore",))
        if form != "residual":
            reason = (f"not measured: meta['quality']['spice_lore'] holds the residual LoRE form (y_shared + B·A·h) "
                      f"only, this run uses lore_form {form}")
        elif record is not None and isinstance(record.get("confidence"), (int, float)) and not math.isclose(
                record["confidence"], confidence, rel_tol=0.0, abs_tol=1e-9):
            reason = (f"not measured: meta['quality']['spice_lore'] was measured at confidence "
                      f"{record['confidence']:g}, this run uses {confidence:g}")
        return quality_fields(mode, meta, ("spice_lore", "variants", str(rank)), reason)

    # ------------------------------------------------------------------------------ cache
    def _room(self, ctx: SimContext) -> int:
        """Experts the cache may still take: its capacity less the slots held (arrived, on their way, stopping)."""
        return self._room_base + ctx.free_slots()

    def _victim_keys(self, indices) -> list[tuple[int, int, int]]:
        """Each index's place in the victim order, the index last: LRU first (stamps at or before the running
        layer), then pending predictions, farthest ahead first."""
        pos = self._pos
        stamp = self._stamp
        return [(0, stamp[i], i) if stamp[i] <= pos else (1, -stamp[i], i) for i in indices]

    def _victim_order(self, indices) -> list[int]:
        return [key[2] for key in sorted(self._victim_keys(indices))]

    def _evict(self, ctx: SimContext, victims) -> None:
        n = self._E
        for index in victims:
            del self._stamp[index]
            ctx.evict(index // n, index % n)

    def _evict_past(self, ctx: SimContext, short: int) -> int:
        """A prefetch's room: evict up to `short` experts stamped behind the running layer, oldest first (the
        smallest (stamp, index) of _by_stamp). The room after; 0 if none could go."""
        stamp = self._stamp
        heap = self._by_stamp
        cells = self._cells
        n = self._E
        behind = self._pos * cells  # an entry below it was stamped before the running layer
        evicted = 0
        while heap and evicted < short:
            top = heap[0]
            s = top // cells
            index = top - s * cells
            now = stamp.get(index)
            if now is None:  # evicted since
                heappop(heap)
            elif now != s:  # stamped again since (stamps only grow): the entry moves to where its stamp is now
                heapreplace(heap, now * cells + index)
            elif top >= behind:
                break
            else:
                heappop(heap)  # (a repeat of this entry is stale once its stamp is gone)
                del stamp[index]
                ctx.evict(index // n, index % n)
                evicted += 1
        return self._room(ctx) if evicted else 0

    def _make_room(self, ctx: SimContext, count: int, protect) -> None:
        """A demand fetch's room: evict until `count` more experts fit, any but those in `protect` (indices)."""
        short = count - self._room(ctx)
        if short <= 0:
            return
        indices = [i for i in self._stamp if i not in protect]
        if not indices:
            return
        if short == 1:  # the common case (one miss): no need to sort
            victims = [min(self._victim_keys(indices))[2]]
        else:
            victims = self._victim_order(indices)[:short]
        self._evict(ctx, victims)

    def choose_victims(self, ctx: SimContext, layer, needed, count):
        n = self._E
        base = layer * n
        indices = [i for i in self._stamp if not (base <= i < base + n and i - base in needed)]
        victims = self._victim_order(indices)[:count]
        for index in victims:
            del self._stamp[index]
        return [(index // n, index % n) for index in victims]

    def _set_stamp(self, index: int, stamp: int) -> None:
        self._stamp[index] = stamp
        heappush(self._by_stamp, stamp * self._cells + index)

    # ------------------------------------------------------------------------------ hooks
    def on_token_start(self, ctx: SimContext, t: int) -> None:
        # (L, D, k) as bytes: iterating bytes gives ints, with no list made per draft (a token's tolist() is ~30 us)
        self._token_ids = self._ids[t].tobytes()
        self._token_conf = self._conf[t].astype(np.float64).tolist()  # (L, D)
        if len(ctx.step_tokens) > 1:
            self._step_drafts = [(token, self._ids[token].tobytes(), self._conf[token].astype(np.float64).tolist())
                                 for token in ctx.step_tokens]

    def on_layer_start(self, ctx: SimContext, t: int, layer: int) -> None:
        L = self._L
        clock = self._clock(ctx, t)
        self._pos = clock * L + layer
        remaining = L - 1 - layer
        if remaining <= 0:
            return
        if self.params.deep:
            limit, floor = min(self.params.max_depth, remaining), self.d_min
        else:
            limit, floor = 1, 1
        if len(ctx.step_tokens) == 1:
            self._prefetch_drafts(ctx, clock, t, layer, limit, floor, self._token_ids, self._token_conf)
            return
        for token, ids, conf in self._step_drafts:  # each token's drafts, stamped for the step's position
            self._prefetch_drafts(ctx, clock, token, layer, limit, floor, ids, conf)

    @staticmethod
    def _clock(ctx: SimContext, t: int) -> int:
        """The step's place in time: its token, or a served run's step index (its tokens are trace windows)."""
        clock = ctx.step_clock
        return t if clock < 0 else clock

    def _prefetch_drafts(self, ctx: SimContext, t: int, token: int, layer: int, limit: int, floor: int, ids: bytes,
                         conf: list[list[float]]) -> None:
        """Prefetch one token's drafts made at `layer`, deeper while confident (at least `floor`, at most `limit`
        layers), each stamped at step clock t's position of the layer it is for; the depth reached noted for `token`."""
        L = self._L
        row, per_layer = self._draft_row, self._draft_layer
        stamps, n = self._stamp, self._E
        heap, cells = self._by_stamp, self._cells
        # the experts the cache may still take, counted down as each prefetch takes a slot (nothing else moves
        # while this hook runs) and read again after evictions, which may free fewer slots (transfers stopping) or
        # let a waiting demand fetch take one
        room = self._room(ctx)
        confidence, no_expert = self.params.confidence, NO_EXPERT
        reached = 0
        for d in range(1, limit + 1):
            target = layer + d
            if d > floor and conf[target][d - 1] < confidence:
                break
            stamp = t * L + target
            base = target * n
            ok = True
            start = target * per_layer + (d - 1) * row
            for e in ids[start:start + row]:
                if e == no_expert:
                    continue
                index = base + e
                old = stamps.get(index)
                if old is None:  # not cached: prefetch it, pushing out only experts whose use is behind us
                    if room <= 0:
                        room = self._evict_past(ctx, 1 - room)
                    if room <= 0 or not ctx.prefetch(target, e):
                        ok = False
                        break
                    room -= 1
                    stamps[index] = stamp
                    heappush(heap, stamp * cells + index)
                elif stamp > old:  # cached (most are): only its stamp may move ahead (its heap entry moves lazily)
                    stamps[index] = stamp
            reached = d
            if not ok:
                self.depth_cut_by_buffer += 1
                break
        self.depth[token, layer] = reached

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        if self._in_place:  # every expert is where the arrays read it: no miss to send anywhere
            return LayerPlan(execute=list(routed))
        pos = self._clock(ctx, t) * self._L + layer
        self._pos = pos
        stamp = self._stamp
        base = layer * self._E
        execute, misses = [], []
        for e in routed:
            index = base + e
            if index in stamp:
                stamp[index] = pos  # never behind its stamp: a prefetch stamped it for this position at most
                execute.append(e)
            else:
                misses.append(e)
        if self.params.schedule:  # this layer's prefetches still on their way that the router did not pick stop
            for e in ctx.cancel_unneeded(layer, routed):
                stamp.pop(base + e, None)
        plan = LayerPlan(execute=execute)
        if not misses:
            return plan
        self.misses[t, layer] += len(misses)
        low, tokens_of = self._low_confidence(ctx, layer, misses)
        if low:
            self.low_conf[t, layer] += len(low)
        if low and self._use_surrogate:
            plan.surrogate = low
            misses = [e for e in misses if e not in set(low)]
            if not misses:
                return plan
        fetch_base = ctx.fetch_estimate_ps() + self._t_acc
        host_base = ctx.host_estimate_ps()
        host_one = ctx.host_timing.total_ps
        to_fetch: list[int] = []
        for e in misses:
            fetch_ps = fetch_base + len(to_fetch) * self._fetch_one_ps
            host_ps = host_base + len(plan.on_host) * host_one
            if tokens_of.get(e, 1) > 1:  # the host computes it for every token of the step routed to it
                host_ps += self._host_ps(ctx, tokens_of[e]) - host_one
            if self.params.cpu_fallback and host_ps < fetch_ps:
                plan.on_host.append(e)
                choice = "cpu"
            else:
                to_fetch.append(e)
                choice = "fetch"
            self.miss_log.append((t, layer, e, fetch_ps, host_ps, choice))
        if to_fetch:
            protect = {base + e for e in routed}
            self._make_room(ctx, len(to_fetch), protect=protect)
            for e in to_fetch:
                self._set_stamp(base + e, pos)
            execute.extend(to_fetch)
        self.fetched[t, layer] += len(to_fetch)
        return plan

    def _host_ps(self, ctx: SimContext, tokens: int) -> int:
        """A host-CPU expert's time over `tokens` tokens (made once per count)."""
        ps = self._host_by_tokens.get(tokens)
        if ps is None:
            ps = self._host_by_tokens[tokens] = host_timing(ctx.hw, ctx.workload, tokens).total_ps
        return ps

    def _low_confidence(self, ctx: SimContext, layer: int, misses: list[int]) -> tuple[list[int], dict[int, int]]:
        """The misses to judge low-confidence (the depth-1 draft's confidence for this layer below `confidence`;
        a layer no draft predicted is high): one token's all or none; in a batch step, those every token routed to
        them is low for. Also, in a batch, each miss's tokens."""
        confidence, at = self.params.confidence, layer * self._draft_layer
        if len(ctx.step_tokens) == 1:
            predicted = self._token_ids[at] != NO_EXPERT  # the depth-1 draft's first id
            return (list(misses) if predicted and self._token_conf[layer][0] < confidence else []), {}
        tokens_of: dict[int, int] = {}
        high: set[int] = set()
        for token, ids, conf in self._step_drafts:
            low = ids[at] != NO_EXPERT and conf[layer][0] < confidence
            for e in ctx.trace_routed(token, layer):
                tokens_of[e] = tokens_of.get(e, 0) + 1
                if not low:
                    high.add(e)
        return [e for e in misses if e not in high], tokens_of

    def on_layer_end(self, ctx: SimContext, t: int, layer: int) -> None:
        """Nothing is staged out per layer; only the slot budget is honoured (after cancelled transfers)."""
        over = len(self._stamp) - self.capacity
        if over > 0:
            self._evict(ctx, self._victim_order(list(self._stamp))[:over])

    # ------------------------------------------------------------------------------ results
    def extra_metrics(self) -> dict:
        sl = self._rows
        looked = self.depth[sl][:, :-1] if self._L > 1 else self.depth[sl]
        return {
            "spice_fetched_misses_per_token": float(self.fetched[sl].sum(axis=1).mean()),
            "spice_low_confidence_misses_per_token": float(self.low_conf[sl].sum(axis=1).mean()),
            "mean_prefetch_depth": float(looked.mean()),
            "spice_d_min": int(self.d_min),
            "spice_depth_cut_by_buffer": int(self.depth_cut_by_buffer),
            "spice_cache_slots": int(self.capacity),
            "spice_surrogate": self.surrogate_note,
            "spice_lore_hbm_bytes": int(self.lore_bytes),
            **self._quality,
        }
