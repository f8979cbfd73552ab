"""FloE's baselines (arXiv 2505.05950, its end-to-end table on the RTX 3090): DeepSpeed-MII and Mixtral-Offloading.
Fiddler, the third, is chipsim.policies.offload. Neither system's offloading loop is described in FloE beyond its
name; each class below says what it takes from the system's own description and marks the rest ASSUMPTION.

deepspeed-mii: DeepSpeed-MII serving a model larger than the GPU offloads its weights to host memory at 16 bit and
streams them back layer by layer (DeepSpeed ZeRO-Inference's weight offloading: a layer's weights are fetched while
the layer before it computes; nothing stays). Here: every expert of MoE layer l + 1 is prefetched when layer l starts
(layer 0's at the token's start), routed or not, and every one moves all its bytes (the whole layer is streamed);
each layer's experts leave at its end. ASSUMPTION: only the experts are streamed (the non-expert weights, 3.2 GB for
Mixtral-8x7B at BF16, stay on the GPU); the experts move at the model's expert precision (BF16).

mixtral-offloading: Mixtral-Offloading (Eliseev & Mazur 2023, arXiv 2312.17238) keeps an LRU cache of experts on the
GPU, quantises them (HQQ), and loads speculatively: the next layer's gate applied to the current hidden state guesses
its experts, which are fetched ahead. Here: an LRU expert cache across tokens of `slots` experts (as `lru`), at each
layer's routing the first k of the trace's `pregate_rank[t, l + 1]` (that guess) prefetched; experts stored and moved
at `bits` bits per weight with one `group`-weight group's scale and zero point (`scale_bits`, both FP16: 32) and
dequantised on the arrays (compute.dequant_ops_per_weight lane operations per weight). ASSUMPTION: 3-bit experts in
groups of 64 (the paper's mixed setting quantises experts to 2 or 3 bits with HQQ; its attention layers, 4-bit there,
are BF16 here as for every policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.policies.base import NoParams, Policy, SimContext, param, register
from chipsim.policies.caching import CacheParams, ExpertCache
from chipsim.policies.floe import expert_arrays, one_transfer_format
from chipsim.trace import predictor_arrays as pa
from chipsim.trace.format import NO_EXPERT
from chipsim.workload.decode import ExpertFormat, _ffn, weight_bytes


@register
class DeepSpeedMII(Policy):
    name = "deepspeed-mii"
    summary = ("every expert of every MoE layer streamed at 16 bit each token, layer l+1's while layer l runs; "
               "no cache (FloE's DeepSpeed-MII baseline; ASSUMPTION)")
    batch_support = "streams every expert of every layer whatever the step's tokens route to"
    complete_unpicked = True  # the whole layer is streamed: an expert not routed still moves all its bytes
    Params = NoParams
    params: NoParams

    def on_token_start(self, ctx: SimContext, t: int) -> None:
        self._stream(ctx, 0)

    def on_layer_start(self, ctx: SimContext, t: int, layer: int) -> None:
        if layer + 1 < ctx.num_moe_layers:
            self._stream(ctx, layer + 1)

    @staticmethod
    def _stream(ctx: SimContext, layer: int) -> None:
        for e in range(ctx.num_experts):
            if not ctx.prefetch(layer, e):
                break  # the buffer holds no more: the rest of the layer comes on demand


@dataclass(frozen=True)
class MixtralOffloadingParams(CacheParams):
    bits: int = param(3, "bits per expert weight (HQQ; the paper's experts: 2 or 3)", minimum=1, maximum=8)
    group: int = param(64, "weights sharing one scale and zero point", minimum=1, maximum=1 << 20)
    scale_bits: int = param(32, "bits of a group's scale and zero point (FP16 each)", minimum=0, maximum=64)


def quantised_expert_format(model, hw, bits: int, group: int, scale_bits: int) -> ExpertFormat:
    """One routed expert at `bits` per weight with `scale_bits` per `group` weights, dequantised on the arrays."""
    d, inter = model.hidden_size, model.expert_ffn
    am, in_sram = expert_arrays(hw)
    op = _ffn(am, "expert", d, inter, bits, group, scale_bits, hw.compute.dequant_ops_per_weight,
              model.expert_activation, model.expert_bias)
    total = weight_bytes(2 * d * inter, bits, group, scale_bits) + weight_bytes(inter * d, bits, group, scale_bits)
    return one_transfer_format(total, op, in_sram)


@register
class MixtralOffloading(ExpertCache):
    name = "mixtral-offloading"
    summary = ("LRU expert cache, experts HQQ-quantised (3 bit), the next layer's experts guessed by its gate on the "
               "current hidden state and fetched ahead (FloE's Mixtral-Offloading baseline)")
    trace_arrays = (pa.PREGATE_RANK,)
    batch_support = ""  # one sequence: its guess is one token's
    batch_refusal = "its speculative guess is one token's hidden state"
    Params = MixtralOffloadingParams
    params: MixtralOffloadingParams

    def expert_format(self, workload, hw):
        p = self.params
        return quantised_expert_format(workload.model, hw, p.bits, p.group, p.scale_bits)

    def on_run_start(self, ctx: SimContext) -> None:
        super().on_run_start(ctx)
        self._rank = ctx.trace_array("pregate_rank")
        self._fetch_bytes = ctx.expert_format.fetch_bytes

    def _next_layer_prediction(self, ctx: SimContext, t, layer) -> list[int]:
        return [int(e) for e in self._rank[t, layer + 1, :ctx.top_k] if e != NO_EXPERT]

    def extra_metrics(self) -> dict:
        p = self.params
        return {**super().extra_metrics(), "mixtral_offloading_expert_bytes": int(self._fetch_bytes),
                "mixtral_offloading_bits": p.bits}
