"""FloE: compressed experts, prefetched one layer ahead by the inter-expert predictor, staged per layer.

FloE (arXiv 2505.05950) shrinks every expert ~9.3× (gate and down
projections contextually sparse: only the channels the intra-expert predictor keeps are stored and moved;
up projection INT2) and prefetches the next layer's experts with a learned inter-expert predictor.

Expert format (`expert_format`). One expert moves and is stored as ⌈W / compression⌉ bytes, W being the
expert's BF16 size (FloE's factor is relative to FP16 weights, so the compressed format replaces
`model.expert_bits`). It moves as one DMA transfer (FloE packs gate and down columns contiguously for one
compact asynchronous copy; the engine already overlaps computing landed experts with the transfers of
the others, so per-matrix transfers would only add descriptor set-ups). Its arrays time is built with
chipsim.hw.compute_formula.ArrayModel from the compressed operand bytes:
- up projection: d → I outputs (dense: its output magnitudes choose the kept channels), INT2 weights,
  dequantised to BF16 on the vector lanes (`compute.dequant_ops_per_weight` lane operations per weight);
- channel mask: one vector pass over the I up outputs;
- gate projection: d → (1−s)·I kept outputs; SiLU and product on those channels;
- down projection: (1−s)·I kept inputs → d.
The sparse matvecs stream only the kept weights, so the arrays read exactly the compressed bytes. Those
bytes are split between the three matrices in proportion to what each holds at sparsity s: BF16 for the
kept gate and down columns, 2.5 bits per up weight (INT2 plus an FP16 scale and zero per group of 64, HQQ
style); the total is fixed by `compression`. The intra-expert predictor's own cost is not modelled.

Prefetch: at on_layer_start(l) the first k entries of the trace's `floe_rank[t, l+1]` (the predictor's
ranking for layer l+1, made from layer l) are prefetched; layer 0 of each token has no prediction and is
fetched on demand. Per-layer staging: a layer's unrouted prefetches still in flight are cancelled when it
routes, and only layer l is evicted at its end (layer l+1's prefetches stay).

Quality: compressed experts change the model's numerics. The simulator does not model that cost; it is
reported from the trace at the run's sparsity (`meta["quality"]["floe"][str(sparsity)]`: held-out perplexity of the
trained model with every routed expert computed as FloE's, INT2 up and gate/down sparse at s,
chipsim.tracegen.quality_floe) when the trace carries it, else `quality_source` says why not. The record is
of the format, not of `compression` (a byte count the run may set apart from it). Two results.csv columns carry
it as numbers: floe_quality_delta_ppl_pct (FloE's format) and floe_sparse_only_delta_ppl_pct (the same sparsity
with the up projection left BF16), empty (null) where the trace has no record.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.compute_formula import ArrayModel, ceil_div
from chipsim.hw.machine import roles
from chipsim.policies.base import Policy, SimContext, param, quality_fields, quality_record, register
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import NO_EXPERT
from chipsim.workload.decode import BF16_BYTES, ExpertFormat, _ffn

UP_HALF_BITS_PER_WEIGHT = 5  # 2.5 bits: INT2 + FP16 scale and zero per 64 weights (HQQ-style); byte split only


def floe_expert_format(model, hw, compression: float, sparsity: float) -> ExpertFormat:
    d, inter = model.hidden_size, model.expert_ffn
    bf16_bytes = model.expert_params * BF16_BYTES
    total = -(-bf16_bytes * 1000 // int(round(compression * 1000)))  # ⌈W / compression⌉, exact to 1e-3
    keep = max(1, ceil_div(int(round((1.0 - sparsity) * 10**6)) * inter, 10**6))
    # byte split gate : up : down by what each matrix holds (half-bits per weight × kept weights)
    gate_w = keep * d * 32
    up_w = d * inter * UP_HALF_BITS_PER_WEIGHT
    down_w = keep * d * 32
    share = gate_w + up_w + down_w
    gate_b = total * gate_w // share
    up_b = total * up_w // share
    down_b = total - gate_b - up_b
    am, in_sram = expert_arrays(hw)
    op = am.matvec("floe_up", d, inter, up_b)
    op = op + am.vector("floe_dequant_up", d * inter * hw.compute.dequant_ops_per_weight)
    op = op + am.vector("floe_channel_mask", inter)
    op = op + am.matvec("floe_gate_sparse", d, keep, gate_b)
    op = op + am.sfu("floe_silu", keep) + am.vector("floe_mul", keep)
    op = op + am.matvec("floe_down_sparse", keep, d, down_b)
    return one_transfer_format(total, op, in_sram)


def expert_arrays(hw) -> tuple[ArrayModel, bool]:
    """The arrays a fetched expert is computed on (reading its operands from SRAM where experts are staged there), and
    whether they are."""
    in_sram = roles(hw).stage_in_sram
    return (ArrayModel(hw, operands_from="sram") if in_sram else ArrayModel(hw)), in_sram


def one_transfer_format(nbytes: int, op, in_sram: bool) -> ExpertFormat:
    """An expert of `nbytes` moved as one transfer and stored as such, computed as OpCost `op`."""
    return ExpertFormat(part_bytes=(nbytes,), slot_bytes=nbytes, compute_ps=op.duration_ps,
                        hbm_bytes=op.hbm_read_bytes + op.hbm_write_bytes, fixed_ps=op.fixed_ps,
                        macs=op.macs, sfu_ops=op.sfu_ops, vector_ops=op.vector_ops, operands_in_sram=in_sram,
                        occupied_ps=op.occupied_ps, profiled_pj=op.profiled_pj, unpriced_bytes=op.unpriced_bytes)


def sparse_expert_speedup(model, hw, sparsity: float) -> float:
    """FloE's single-expert kernel comparison on the arrays: one expert's time dense (gate, up and down, BF16) over
    its time with the gate and down projections over only the (1 - sparsity) share of channels kept (the up
    projection dense, from which the mask comes; everything BF16: the kernel, not the compression). The sparse
    matvecs are costed at the bytes of the kept channels, as a kernel that loads only those columns."""
    d, inter = model.hidden_size, model.expert_ffn
    keep = max(1, ceil_div(int(round((1.0 - sparsity) * 10**6)) * inter, 10**6))
    am = ArrayModel(hw)
    dense = _ffn(am, "dense_expert", d, inter, 16, 1, 0, 0, model.expert_activation, model.expert_bias)
    sparse = am.matvec("up", d, inter, d * inter * BF16_BYTES) + am.vector("channel_mask", inter)
    sparse = sparse + am.matvec("gate_sparse", d, keep, d * keep * BF16_BYTES)
    sparse = sparse + am.sfu("silu", keep) + am.vector("mul", keep)
    sparse = sparse + am.matvec("down_sparse", keep, d, keep * d * BF16_BYTES)
    return dense.duration_ps / sparse.duration_ps


def _delta_pct(entry) -> float | None:
    """A quality record's held-out perplexity change (%), None where none was measured (a results.csv column)."""
    return float(entry["delta_ppl_pct"]) if isinstance(entry, dict) and "delta_ppl_pct" in entry else None


@dataclass(frozen=True)
class FloEParams:
    compression: float = param(9.3, "per-expert compression factor vs BF16 (FloE: 9.3)", minimum=1.0, maximum=1e4)
    sparsity: float = param(0.9, "share of gate/down channels skipped (FloE: up to 90 %); sets the compute shape and "
                                 "the byte split", minimum=0.0, maximum=0.99)


@register
class FloE(Policy):
    name = "floe"
    summary = ("experts compressed ~9.3× (sparse gate/down + INT2 up), next-layer inter-expert predictor "
               "prefetch, per-layer staging")
    trace_arrays = (pa.FLOE_RANK,)
    result_columns = ("floe_expert_bytes", "floe_compression", "floe_sparse_expert_speedup", "floe_quality_delta_ppl_pct",
                      "floe_sparse_only_delta_ppl_pct")
    batch_refusal = ("it moves only the gate and down channels one token's intra-expert predictor keeps; several "
                     "tokens need the union of their channels, which the paper does not measure nor chipsim cost")
    Params = FloEParams
    params: FloEParams

    def expert_format(self, workload, hw):
        return floe_expert_format(workload.model, hw, self.params.compression, self.params.sparsity)

    def on_run_start(self, ctx: SimContext) -> None:
        self._rank = ctx.trace_array("floe_rank")
        self._ctx = ctx
        p = self.params
        self._quality = quality_fields(f"sparsity {p.sparsity:g}, INT2 up, compression {p.compression:g}", ctx.trace_meta,
                                       ("floe", float(p.sparsity)))
        sparse_only, _ = quality_record(ctx.trace_meta or {}, ("floe", "sparse_bf16_up", float(p.sparsity)))
        self._delta_ppl_pct = {"floe_quality_delta_ppl_pct": _delta_pct(self._quality["quality_cost"]),
                               "floe_sparse_only_delta_ppl_pct": _delta_pct(sparse_only)}

    def on_layer_start(self, ctx: SimContext, t: int, layer: int) -> None:
        if layer + 1 >= ctx.num_moe_layers:
            return
        for e in self._rank[t, layer + 1, :ctx.top_k].tolist():
            if e != NO_EXPERT:
                ctx.prefetch(layer + 1, e)

    def extra_metrics(self) -> dict:
        ctx = self._ctx
        fmt = ctx.expert_format
        out = {
            "floe_expert_bytes": int(fmt.fetch_bytes),
            "floe_compression": float(self.params.compression),
            "floe_sparse_expert_speedup": sparse_expert_speedup(ctx.workload.model, ctx.hw, self.params.sparsity),
            **self._delta_ppl_pct,
            **self._quality,
        }
        if ctx.workload.expert_bits != 16:
            out["floe_note"] = (f"FloE's format (BF16 / {self.params.compression:g}) replaces model.expert_bits = "
                                f"{ctx.workload.expert_bits}")
        return out
