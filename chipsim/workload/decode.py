"""The decode step of one token, as operations with shapes, costed on the arrays (batch 1).

Per layer: input norm → attention (projections, scores over the KV cache of `context_length`
tokens, softmax on the SFUs, value mix, output projection, KV append) → post-attention norm → router →
shared experts (or the dense FFN in dense first layers) → routed experts → weighted sum. Per token:
embedding lookup, final norm and LM head. Non-expert weights, the KV cache and activations live in HBM;
routed expert weights are staged into HBM by DMA and read from there by the arrays. Non-expert weight matrices are
at model.dense_bits (DenseWeights; BF16 by default), routed experts at model.expert_bits; the KV cache,
activations, norms and biases are BF16.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel, OpCost, ceil_div
from chipsim.hw.config import HardwareConfig, memories
from chipsim.hw.machine import roles
from chipsim.units import BYTES_PER_GIB, BYTES_PER_MIB
from chipsim.workload.models import model_of
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape

BF16_BYTES = 2


def weight_bytes(params: int, bits: int, group_size: int, scale_bits: int) -> int:
    """Bytes of `params` weights at `bits` per weight, plus one scale per group below 16 bit."""
    data = ceil_div(params * bits, 8)
    if bits < 16:
        data += ceil_div(ceil_div(params, group_size) * scale_bits, 8)
    return data


@dataclass(frozen=True)
class DenseWeights:
    """The precision of every non-expert weight matrix (model.dense_bits): attention and Mamba2 projections, dense
    FFNs, shared experts and their gate, router, embedding, LM head. Below 16 bit they share the experts' scales
    (model.quant_group_size, model.quant_scale_bits) and are widened on the lanes as the experts are; biases,
    norms, the Mamba2 convolution and state, the KV cache and activations stay BF16."""

    bits: int
    group_size: int
    scale_bits: int
    dequant_ops_per_weight: int

    def bytes(self, params: int) -> int:
        return weight_bytes(params, self.bits, self.group_size, self.scale_bits)


def dense_weights(hw) -> DenseWeights:
    """The config's non-expert weight precision (a HardwareConfig, or anything with its model and compute keys)."""
    w = hw.model
    return DenseWeights(w.dense_bits, w.quant_group_size, w.quant_scale_bits, hw.compute.dequant_ops_per_weight)


def weight_op(am: ArrayModel, dense: DenseWeights, name: str, tokens: int, reduction: int, outputs: int,
              write_bytes: int = 0, bias_bytes: int = 0) -> OpCost:
    """`tokens` rows times a non-expert weight matrix (reduction x outputs, at `dense`'s precision, its BF16 bias
    of `bias_bytes` read with it); one token is the GEMV. Below 16 bit its widening to BF16 is charged once per
    weight on the lanes, as _ffn charges an expert's, so that a lower precision is not free."""
    params = reduction * outputs
    op = am.matmul(name, tokens, reduction, outputs, dense.bytes(params) + bias_bytes, write_bytes=write_bytes)
    if dense.bits < 16:
        op = op + am.vector(f"{name}_dequant", params * dense.dequant_ops_per_weight)
    return op


def embedding_op(am: ArrayModel, dense: DenseWeights, tokens: int, d: int) -> OpCost:
    """The embedding rows of `tokens` tokens looked up (each row d weights at `dense`'s precision, widened below
    16 bit)."""
    op = am.vector("embedding", tokens * d, read_bytes=tokens * dense.bytes(d))
    if dense.bits < 16:
        op = op + am.vector("embedding_dequant", tokens * d * dense.dequant_ops_per_weight)
    return op


@dataclass(frozen=True)
class LayerCosts:
    attention: OpCost  # input norm, the token mixer (attention, or a Mamba2 step), residual
    router: OpCost | None  # post-attention norm, router GEMV, softmax, top-k (MoE layers)
    dense: OpCost | None  # post-attention norm + dense FFN (dense first layers) or shared experts
    expert: OpCost | None  # one routed expert, including dequantisation below 16 bit
    combine: OpCost | None  # weighted sum of the routed experts' outputs, residual


@dataclass(frozen=True)
class ExpertFormat:
    """How one routed expert is moved, stored and computed (a policy may change it, e.g. compression)."""

    part_bytes: tuple[int, ...]  # one DMA transfer per part (one part: the whole expert)
    slot_bytes: int  # buffer space one expert takes
    compute_ps: int  # arrays time for one expert
    hbm_bytes: int  # operand bytes the arrays read (and write) for one expert
    fixed_ps: int = 0  # of compute_ps, the time that moves no operand (issue overhead, first-operand latency)
    macs: int = 0  # actions of one expert's computation, for the energy ledger
    sfu_ops: int = 0
    vector_ops: int = 0
    operands_in_sram: bool = False  # staged in SRAM: hbm_bytes are read from SRAM, not streamed from HBM
    occupied_ps: int = 0  # compute_ps weighted by the share of the arrays each of its operations occupies
    profiled_pj: int = 0  # compute.op_energy_pj: measured energy of its listed operations (OpCost.profiled_pj)
    unpriced_bytes: int = 0  # of hbm_bytes, those whose energy profiled_pj holds

    @property
    def fetch_bytes(self) -> int:
        return sum(self.part_bytes)


@dataclass(frozen=True)
class DecodeWorkload:
    model: ModelShape
    context_length: int
    expert_bits: int
    expert_bytes: int  # one routed expert as moved by DMA and stored in the buffer
    expert_matrix_bytes: tuple[int, ...]  # gate, up, down
    layers: tuple[LayerCosts, ...]  # one per model layer (dense first layers included)
    token_head: OpCost  # embedding lookup + final norm + LM head (+ argmax)
    hbm_non_expert_bytes: int
    hbm_kv_bytes: int
    hbm_activation_bytes: int
    hbm_spare_bytes: int  # HBM left after weights, KV cache, activations and the expert buffer
    buffer_slots: int  # whole experts the expert buffer holds
    buffer_bytes: int
    experts_in_sram: bool = False  # expert_buffer.location: sram
    compute_timing: str = ""  # which timing costed the operations (the run header says it)
    segment_launch: OpCost | None = None  # compute.launch_per: segment: what the engine charges per segment

    def moe_layer(self, moe_index: int) -> LayerCosts:
        return self.layers[self.model.first_dense_layers + moe_index]

    def expert_format(self, per_matrix: bool = False) -> ExpertFormat:
        """The expert as published: one transfer, or one per matrix (gate, up, down)."""
        op = self.moe_layer(0).expert
        parts = self.expert_matrix_bytes if per_matrix else (self.expert_bytes,)
        return ExpertFormat(tuple(parts), self.expert_bytes, op.duration_ps, op.hbm_read_bytes + op.hbm_write_bytes,
                            op.fixed_ps, op.macs, op.sfu_ops, op.vector_ops, self.experts_in_sram, op.occupied_ps,
                            op.profiled_pj, op.unpriced_bytes)


def _mixer(am: ArrayModel, m: ModelShape, dense: DenseWeights, kind: str, ctx: int) -> OpCost:
    """One layer's token mixer with its input norm and residual: attention over `ctx` cached tokens (a sliding
    layer over at most its window), or a Mamba2 step."""
    d = m.hidden_size
    norm = am.sfu("attn_norm_rsqrt", 1) + am.vector("attn_norm_scale", 2 * d)
    if kind == MAMBA:
        ops = _mamba2(am, m, dense)
    elif m.attention == "mla":
        ops = _mla(am, m, dense, ctx)
    else:
        ops = _gqa(am, m, dense, min(ctx, m.sliding_window) if kind == SLIDING else ctx)
    total = norm
    for op in ops:
        total = total + op
    return total + am.vector("attn_residual", d)


def _mla(am: ArrayModel, m: ModelShape, dense: DenseWeights, ctx: int) -> list[OpCost]:
    """DeepSeek's multi-head latent attention at decode, projections absorbed: per head, the query's no-position
    part is taken into the latent space (q_absorb_uk) and scored against the cached latents directly; the mix of
    latents is lifted to values once (v_up_uv). Cache read: ctx x (kv_lora_rank + qk_rope_head_dim) x 2 bytes."""
    d = m.hidden_size
    h, nope, rope, lora, v = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim
    if m.q_lora_rank:  # DeepSeek-V3 with a query LoRA: d -> q_lora_rank (normed) -> heads
        r = m.q_lora_rank
        q = (weight_op(am, dense, "q_a_proj", 1, d, r) + am.sfu("q_norm_rsqrt", 1) + am.vector("q_norm_scale", 2 * r)
             + weight_op(am, dense, "q_b_proj", 1, r, h * (nope + rope)))
    else:
        q = weight_op(am, dense, "q_proj", 1, d, h * (nope + rope))
    kv_a = weight_op(am, dense, "kv_a_proj", 1, d, lora + rope,
                     write_bytes=(lora + rope) * BF16_BYTES)  # append the compressed latent to the cache
    kv_norm = am.sfu("kv_norm_rsqrt", 1) + am.vector("kv_norm_scale", 2 * lora)
    rope_op = am.vector("rope", 2 * h * rope + 2 * rope)
    absorb = weight_op(am, dense, "q_absorb_uk", 1, nope, h * lora)
    scores = am.matvec("scores", lora + rope, h * ctx, ctx * (lora + rope) * BF16_BYTES, groups=h)
    softmax = am.sfu("softmax_exp", h * ctx) + am.vector("softmax_norm", 3 * h * ctx)
    mix = am.matvec("latent_mix", ctx, h * lora, ctx * lora * BF16_BYTES, groups=h)
    up = weight_op(am, dense, "v_up_uv", 1, lora, h * v)
    o = weight_op(am, dense, "o_proj", 1, h * v, d)
    return [q, kv_a, kv_norm, rope_op, absorb, scores, softmax, mix, up, o]


def _gqa(am: ArrayModel, m: ModelShape, dense: DenseWeights, kv_len: int) -> list[OpCost]:
    """Grouped-query attention (MHA and MQA are its ends) over `kv_len` cached tokens: q, k, v projections (K and V
    of this token appended: 2 x kv_heads x head_dim x 2 bytes written), RoPE, scores and value mix reading the
    cache (kv_len x kv_heads x head_dim x 2 bytes each), softmax on the SFUs, output projection. With q/k norms
    (Qwen3): an RMSNorm per query and key head; with biases: q, k, v and o add theirs (read at 2 bytes); with
    sinks (gpt-oss): each head's softmax has one more logit, its learned sink."""
    d, nq, nkv, hd = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim
    qkv = weight_op(am, dense, "qkv_proj", 1, d, (nq + 2 * nkv) * hd,
                    write_bytes=2 * nkv * hd * BF16_BYTES)  # append this token's K and V
    ops = [qkv]
    if m.attention_bias:
        ops.append(am.vector("qkv_bias", (nq + 2 * nkv) * hd, read_bytes=(nq + 2 * nkv) * hd * BF16_BYTES))
    if m.qk_norm:
        ops.append(am.sfu("qk_norm_rsqrt", nq + nkv) + am.vector("qk_norm_scale", 2 * (nq + nkv) * hd))
    if m.rope:
        ops.append(am.vector("rope", 2 * (nq + nkv) * hd))
    logits = kv_len + (1 if m.attention_sinks else 0)
    scores = am.matvec("scores", hd, nq * kv_len, nkv * kv_len * hd * BF16_BYTES, groups=nq // nkv)
    softmax = am.sfu("softmax_exp", nq * logits) + am.vector("softmax_norm", 3 * nq * logits)
    mix = am.matvec("value_mix", kv_len, nq * hd, nkv * kv_len * hd * BF16_BYTES, groups=nq // nkv)
    o = weight_op(am, dense, "o_proj", 1, nq * hd, d)
    ops += [scores, softmax, mix, o]
    if m.attention_bias:
        ops.append(am.vector("o_bias", d, read_bytes=d * BF16_BYTES))
    return ops


def _mamba2(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int = 1, states: int = 1) -> list[OpCost]:
    """One Mamba2 step (a token at decode), as transformers' torch path computes it. With d the hidden size, H heads
    of P dims (inner width E = H x P), state N, G groups, kernel K, C = E + 2GN convolved channels:
      in_proj   d -> 2E + 2GN + H (z, x, B, C, dt): d(2E + 2GN + H) MACs and weights; x, B, C enter the
                convolution's state (C x 2 bytes written)
      conv1d    depthwise, K taps per channel: 2CK lane ops, reads the taps and the last K - 1 inputs
                ((CK + C(K - 1)) x 2 bytes), then SiLU on C
      dt, A     softplus(dt + bias) and exp(dt A) per head: 2H SFU ops, H lane ops, dt_bias, A, D read (3H x 2 bytes)
      state     h <- h exp(dt A) + dt B x: 3 H P N lane ops; y = C . h: H P N MACs, the state (H P N x 2 bytes,
                BF16 as ModelShape.mamba_state_bytes keeps it) read and written back
      output    y + D x (2E lane ops), gate by SiLU(z) (E SFU + E lane ops), grouped RMSNorm (G SFU, 2E lane
                ops), out_proj E -> d (E d MACs and weights)
    Biases (mamba_conv_bias, mamba_proj_bias) add their reads and adds. For `tokens` > 1 (a prefill chunk, in the
    recurrent form) the work per token is the same, the projections are GEMMs whose weights stream once, and the
    state (in SRAM meanwhile) is read at the chunk's start and written at its end; the chunked SSD scan of
    training kernels is not modelled. With `states` > 1 (B sequences decoded together, one token each) every
    sequence's convolution inputs and state are read and written, the projections' weights still stream once."""
    d, heads, p, n, g, k = (m.hidden_size, m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups,
                            m.mamba_conv_kernel)
    inner, ch, proj = m.mamba_inner(), m.mamba_conv_channels(), m.mamba_in_proj_outputs()
    proj_bias = m.mamba_proj_bias
    t = tokens
    in_proj = weight_op(am, dense, "in_proj", t, d, proj, bias_bytes=(proj if proj_bias else 0) * BF16_BYTES,
                        write_bytes=states * min(t // states, k - 1) * ch * BF16_BYTES)  # the convolution's state
    conv_bias = ch if m.mamba_conv_bias else 0
    conv = am.vector("conv1d", t * (2 * ch * k + conv_bias),
                     read_bytes=(ch * k + states * ch * (k - 1) + conv_bias) * BF16_BYTES)
    conv_act = am.sfu("conv_silu", t * ch)
    dt = am.sfu("dt_softplus_exp", t * 2 * heads) + am.vector("dt_bias", t * heads, read_bytes=3 * heads * BF16_BYTES)
    state_bytes = states * heads * p * n * BF16_BYTES
    update = am.vector("ssm_update", t * 3 * heads * p * n)
    readout = am.matvec("ssm_readout", n, t * heads * p, state_bytes, write_bytes=state_bytes)
    skip = am.vector("ssm_skip", t * 2 * inner)
    gate = am.sfu("gate_silu", t * inner) + am.vector("gate_mul", t * inner)
    norm = am.sfu("ssm_norm_rsqrt", t * g) + am.vector("ssm_norm_scale", t * 2 * inner)
    out_proj = weight_op(am, dense, "out_proj", t, inner, d, bias_bytes=(d if proj_bias else 0) * BF16_BYTES)
    return [in_proj, conv, conv_act, dt, update, readout, skip, gate, norm, out_proj]


def _ffn(am: ArrayModel, name: str, d: int, inter: int, bits: int, group: int, scale_bits: int, dequant_ops: int,
         activation: str = "silu", bias: bool = False, tokens: int = 1) -> OpCost:
    """A gated FFN (gate, up, activation, down) whose weights are at `bits` precision, for `tokens` tokens at once
    (1 at decode; a prefill chunk's, or the tokens routed to one expert: the weights stream once, the MACs and the
    elementwise work scale with the tokens, the dequantisation is once per weight). activation "silu":
    SiLU(gate) x up (I SFU ops, I lane ops a token); "swiglu_clamped" (gpt-oss): (clamp(up) + 1) x g x
    sigmoid(1.702 g) with g = clamp(gate) (I SFU ops; 7I lane ops a token: three clamps, the scale, two products,
    the + 1). With biases (gpt-oss's experts): 2I added after gate/up and d after down, read at 2 bytes."""
    gu_bytes = weight_bytes(2 * d * inter, bits, group, scale_bits)
    down_bytes = weight_bytes(inter * d, bits, group, scale_bits)
    op = am.matmul(f"{name}_gate_up", tokens, d, 2 * inter, gu_bytes)
    if bias:
        op = op + am.vector(f"{name}_gate_up_bias", tokens * 2 * inter, read_bytes=2 * inter * BF16_BYTES)
    lane_ops = 7 * inter if activation == "swiglu_clamped" else inter
    op = op + am.sfu(f"{name}_silu", tokens * inter) + am.vector(f"{name}_mul", tokens * lane_ops)
    op = op + am.matmul(f"{name}_down", tokens, inter, d, down_bytes)
    if bias:
        op = op + am.vector(f"{name}_down_bias", tokens * d, read_bytes=d * BF16_BYTES)
    if bits < 16:
        op = op + am.vector(f"{name}_dequant", 3 * d * inter * dequant_ops)
    return op


def dense_ffn(am: ArrayModel, dense: DenseWeights, name: str, d: int, inter: int, tokens: int = 1) -> OpCost:
    """A dense first layer's FFN or the shared experts: a SiLU-gated FFN at the non-expert precision."""
    return _ffn(am, name, d, inter, dense.bits, dense.group_size, dense.scale_bits, dense.dequant_ops_per_weight,
                tokens=tokens)


OP_GROUPS = ("attention", "attention_sliding", "mamba", "dense", "router", "shared", "expert", "combine", "head")
MIXER_GROUP = {FULL: "attention", SLIDING: "attention_sliding", MAMBA: "mamba"}


def op_group_builders(am: ArrayModel, m: ModelShape, hw: HardwareConfig, expert_am: ArrayModel | None = None,
                      context: int | None = None) -> dict:
    """Group name -> a function building that group's OpCost on `am` (None: the model has no such group).

    attention: input norm … residual of a full-attention layer; attention_sliding: the same over at most the
    sliding window; mamba: input norm, a Mamba2 step, residual; dense: post-attention norm + dense FFN + residual
    (dense first layers); router: post-attention norm, router GEMV, softmax, top-k; shared: the shared experts;
    expert: one routed expert; combine: weighted sum + residual; head: embedding, final norm, LM head.
    chipsim.hwreplay replays the same builders primitive by primitive, so timing and replay share one
    description of the decode step. `context`: the KV-cache length the mixers attend over (default
    workload.context_length).
    """
    ctx = hw.workload.context_length if context is None else context
    bits, group, sbits = hw.model.expert_bits, hw.model.quant_group_size, hw.model.quant_scale_bits
    dense_w = dense_weights(hw)
    d = m.hidden_size
    kinds = {m.mixer(layer) for layer in range(m.num_layers)}

    def post_norm():
        return am.sfu("ffn_norm_rsqrt", 1) + am.vector("ffn_norm_scale", 2 * d)

    def dense():
        return post_norm() + dense_ffn(am, dense_w, "dense", d, m.dense_ffn) + am.vector("ffn_residual", d)

    def router():
        op = post_norm() + weight_op(am, dense_w, "router", 1, d, m.num_experts)
        if m.router_bias:
            op = op + am.vector("router_bias", m.num_experts, read_bytes=m.num_experts * BF16_BYTES)
        return op + am.sfu("router_softmax", m.num_experts) + am.vector("router_topk", m.num_experts * m.top_k)

    def shared():
        op = dense_ffn(am, dense_w, "shared", d, m.shared_expert_ffn * m.num_shared_experts)
        if m.shared_expert_gate:
            op = op + weight_op(am, dense_w, "shared_gate", 1, d, 1) + am.sfu("shared_sigmoid", 1)
        return op

    def head():
        op = embedding_op(am, dense_w, 1, d)
        op = op + am.sfu("final_norm_rsqrt", 1) + am.vector("final_norm_scale", 2 * d)
        op = op + weight_op(am, dense_w, "lm_head", 1, d, m.vocab_size)
        if m.lm_head_bias:
            op = op + am.vector("lm_head_bias", m.vocab_size, read_bytes=m.vocab_size * BF16_BYTES)
        return op + am.vector("argmax", m.vocab_size)

    def mixer(kind):
        return (lambda: _mixer(am, m, dense_w, kind, ctx)) if kind in kinds else None

    return {
        "attention": mixer(FULL),
        "attention_sliding": mixer(SLIDING),
        "mamba": mixer(MAMBA),
        "dense": dense if m.first_dense_layers else None,
        "router": router,
        "shared": shared if m.num_shared_experts else None,
        "expert": lambda: _ffn(expert_am or am, "expert", d, m.expert_ffn, bits, group, sbits,
                               hw.compute.dequant_ops_per_weight, m.expert_activation, m.expert_bias),
        "combine": lambda: am.vector("combine", (m.top_k + m.num_shared_experts + 1) * d),
        "head": head,
    }


def expert_matrix_sizes(hw: HardwareConfig, m: ModelShape) -> list[int]:
    """Bytes of one routed expert's gate, up and down matrices at the config's precision (expert_part_bytes)."""
    w = hw.model
    return expert_part_bytes(m, w.expert_bits, w.quant_group_size, w.quant_scale_bits)


def expert_part_bytes(m: ModelShape, bits: int, group: int, scale_bits: int) -> list[int]:
    """Bytes of one routed expert's gate, up and down matrices at `bits` (scales included; an expert's biases,
    kept at 16 bit, travel with their matrix: I each with gate and up, d with down)."""
    sizes = [weight_bytes(i * o, bits, group, scale_bits) for _, i, o in m.expert_matrix_params()]
    if m.expert_bias:
        sizes = [size + out * BF16_BYTES for size, (_, _, out) in zip(sizes, m.expert_matrix_params())]
    return sizes


def non_expert_bytes(m: ModelShape, dense: DenseWeights) -> int:
    """Every non-expert weight as stored: the matrices at `dense`'s precision (their scale groups counted over all
    of them at once: at most one scale a matrix fewer than per matrix), norms and biases at BF16."""
    matrices = m.non_expert_matrix_params()
    return dense.bytes(matrices) + (m.non_expert_params() - matrices) * BF16_BYTES


@dataclass(frozen=True)
class _MemoryPlan:
    """What a run keeps where: the expert's bytes, the buffer's slots, the operand memory's share of each."""

    per_matrix: list[int]
    expert_bytes: int
    buffer_bytes: int
    slots: int
    non_expert: int
    kv: int
    activations: int
    spare: int


def build_workload(hw: HardwareConfig, context: int | None = None) -> DecodeWorkload:
    """The decode step at `context` cached tokens (default workload.context_length; a request passes its final
    context, chipsim.workload.request), its memory plan checked first."""
    m = model_of(hw.model)
    ctx = hw.workload.context_length if context is None else context
    r = roles(hw)
    in_sram = r.stage_in_sram
    if in_sram and not hw.compute.sram_read_gbps_per_array:
        key = "roles.expert_staging" if hw.roles.expert_staging else "expert_buffer.location"
        raise InputError(f"{key}: sram needs compute.sram_read_gbps_per_array (the bandwidth staged "
                         "experts are read at)")
    plan = _memory_plan(hw, m, ctx)  # before any operation is costed: a model that cannot fit is refused at once
    am = ArrayModel(hw)
    expert_am = ArrayModel(hw, operands_from="sram") if in_sram else None
    built = {name: (fn() if fn is not None else None) for name, fn in op_group_builders(am, m, hw, expert_am, ctx).items()}
    built = {name: am.step_group(name, op) for name, op in built.items()}  # launches, in-sequence costs
    am.save_table()
    layers = []
    for layer in range(m.num_layers):
        mixer = built[MIXER_GROUP[m.mixer(layer)]]
        if layer < m.first_dense_layers:
            layers.append(LayerCosts(mixer, None, built["dense"], None, None))
            continue
        layers.append(LayerCosts(mixer, built["router"], built["shared"], built["expert"], built["combine"]))
    return DecodeWorkload(
        model=m, context_length=ctx, expert_bits=hw.model.expert_bits, expert_bytes=plan.expert_bytes,
        expert_matrix_bytes=tuple(plan.per_matrix), layers=tuple(layers), token_head=built["head"],
        hbm_non_expert_bytes=plan.non_expert, hbm_kv_bytes=plan.kv, hbm_activation_bytes=plan.activations,
        hbm_spare_bytes=plan.spare,
        buffer_slots=plan.slots, buffer_bytes=plan.buffer_bytes, experts_in_sram=in_sram,
        compute_timing=am.timing_text(),
        segment_launch=am.group_launch("segment") if am.group_launch_ps and not am.launch_per_group else None,
    )


def _times(batch: int) -> str:
    return f" over {batch} sequences" if batch > 1 else ""


def sequence_contexts(hw: HardwareConfig, context: int) -> list[int]:
    """The context each sequence of workload.batch attends over (one sequence: `context`)."""
    b = hw.workload.batch
    if hw.workload.batch_contexts == "staggered":
        return [-(-context * (i + 1) // b) for i in range(b)]
    return [context] * b


def _memory_plan(hw: HardwareConfig, m: ModelShape, context: int) -> _MemoryPlan:
    """The expert buffer's slots and the operand memory's budget, each refused in one line when it cannot be."""
    r = roles(hw)
    bits = hw.model.expert_bits
    per_matrix = expert_matrix_sizes(hw, m)
    expert_bytes = sum(per_matrix)
    all_experts = m.num_moe_layers * m.num_experts * expert_bytes
    # read in place, the "buffer" is every expert where it is stored; expert_buffer.capacity_mib is not read
    buffer_bytes = all_experts if r.in_place else int(hw.expert_buffer.capacity_mib * BYTES_PER_MIB)
    if buffer_bytes < expert_bytes:
        raise InputError(
            f"expert_buffer.capacity_mib: {hw.expert_buffer.capacity_mib} MiB is smaller than one expert "
            f"of {m.name} at {bits} bit ({expert_bytes / BYTES_PER_MIB:.2f} MiB)"
        )
    slots = buffer_bytes // expert_bytes
    if slots < m.top_k:
        raise InputError(
            f"expert_buffer.capacity_mib: {hw.expert_buffer.capacity_mib} MiB holds {slots} experts of "
            f"{m.name} at {bits} bit, fewer than the {m.top_k} one layer routes to"
        )
    if r.stage_in_sram:
        sram_bytes = int(hw.compute.arrays * hw.compute.sram_mib_per_array * BYTES_PER_MIB)
        if buffer_bytes > sram_bytes:
            raise InputError(
                f"expert_buffer.capacity_mib: {hw.expert_buffer.capacity_mib} MiB staged in SRAM "
                f"(expert_buffer.location: sram) does not fit the arrays' {sram_bytes / BYTES_PER_MIB:g} MiB "
                f"(compute.arrays × compute.sram_mib_per_array)")
    non_expert = non_expert_bytes(m, dense_weights(hw))
    batch = hw.workload.batch  # sequences decoded together: a cache and activations each
    kv = sum(m.cache_bytes(c, BF16_BYTES) for c in sequence_contexts(hw, context))  # KV (sliding: window), Mamba2
    activations = batch * (64 * m.hidden_size * BF16_BYTES + m.vocab_size * 4)  # residual stream, scratch, logits
    operand_key, operand = memories(hw)[r.operand_memory]  # weights, KV cache, activations, staged experts
    hbm_capacity = int(operand.capacity_gib * BYTES_PER_GIB)
    needed = non_expert + kv + activations + (0 if r.stage_in_sram else slots * expert_bytes)
    if needed > hbm_capacity:
        held = "every expert" if r.in_place else "expert buffer"
        raise InputError(
            f"{operand_key}.capacity_gib: {operand.capacity_gib} GiB cannot hold non-expert weights "
            f"({non_expert / BYTES_PER_GIB:.2f} GiB) + KV cache of {context} tokens{_times(batch)} "
            f"({kv / BYTES_PER_GIB:.2f} GiB) + "
            f"activations + "
            f"{held} ({slots * expert_bytes / BYTES_PER_GIB:.2f} GiB) = {needed / BYTES_PER_GIB:.2f} GiB"
        )
    store_key, store = memories(hw)[r.expert_store]  # the memory the experts are fetched from
    if all_experts > int(store.capacity_gib * BYTES_PER_GIB):
        raise InputError(
            f"{store_key}.capacity_gib: {store.capacity_gib} GiB cannot hold the "
            f"{all_experts / BYTES_PER_GIB:.2f} GiB of {m.name}'s experts at {bits} bit"
        )
    return _MemoryPlan(per_matrix, expert_bytes, buffer_bytes, slots, non_expert, kv, activations,
                       hbm_capacity - needed)
