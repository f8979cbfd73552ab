"""A prefill chunk as costed operations: C prompt tokens at positions offset .. offset + C - 1 through every layer
at once, as matrix-matrix work on the arrays (ArrayModel.matmul: the weights stream once for the chunk). This module
costs a chunk; chipsim.workload.request lays a prompt out in chunks and the engine runs them.

Per layer: the chunk's input norms; its token mixer (attention: q, k, v for all C tokens, causal scores and value
mix against the cached keys and values and the chunk's own, the output projection; a Mamba2 layer: the same step
as decode, C times, its weights streamed once); the router over all C tokens; the shared experts or the dense FFN
for all C; and each routed expert as a GEMM over the tokens routed to it (`expert(n)`, built per n). Only the
chunk's last token needs logits, so the head runs the LM head once and the embedding lookup for C.

The chunk's own keys and values are in SRAM as they are computed (written to the cache once); the cached ones
are read from HBM once per chunk. Norm weights and biases are read as at decode.
"""

from __future__ import annotations

from typing import Callable

from chipsim.hw.compute_formula import ArrayModel, OpCost
from chipsim.hw.config import HardwareConfig
from chipsim.workload.decode import (BF16_BYTES, DecodeWorkload, DenseWeights, _ffn, _mamba2, dense_ffn, dense_weights,
                                     embedding_op, weight_op)
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape


def launch_grouped(am: ArrayModel) -> Callable[[str, OpCost | None], OpCost | None]:
    """An op group's cost with its own launch where the arrays launch one per group (compute.launch_per: op_group)."""
    def grouped(name: str, op: OpCost | None) -> OpCost | None:
        return op + am.group_launch(name) if op is not None and am.launch_per_group else op
    return grouped


class ExpertGemms:
    """A routed expert as a GEMM over the n tokens of a step routed to it (a prefill chunk, a batch step, a verify
    step), made once per n on the arrays that read experts (from SRAM where they are staged there). Built during a
    run: shapes new to the cycle-level table are not written back from inside it."""

    def __init__(self, hw: HardwareConfig, decode: DecodeWorkload, am: ArrayModel):
        expert_am = ArrayModel(hw, operands_from="sram") if decode.experts_in_sram else am
        self._build = prefill_group_builders(expert_am, decode.model, hw, 0, 1)["expert"]
        self._grouped = launch_grouped(am)
        self._made: dict[int, OpCost] = {}

    def __call__(self, tokens: int) -> OpCost:
        op = self._made.get(tokens)
        if op is None:
            op = self._grouped("expert", self._build(tokens))
            assert op is not None
            self._made[tokens] = op
        return op


def attended_pairs(offset: int, tokens: int, window: int = 0) -> tuple[int, int, int]:
    """(cached keys read, query-key pairs against the cache, pairs within the chunk) of a causal chunk of `tokens`
    queries at positions offset .. offset + tokens - 1; query i sees every key up to its own position, or with a
    sliding `window` the last `window` of them (itself included)."""
    if not window:
        return offset, tokens * offset, tokens * (tokens + 1) // 2
    cached = min(offset, window - 1)
    cache_pairs = chunk_pairs = 0
    for i in range(tokens):
        seen = min(offset + i + 1, window)  # keys query i attends to
        own = min(i + 1, seen)  # of them, the chunk's own
        chunk_pairs += own
        cache_pairs += seen - own
    return cached, cache_pairs, chunk_pairs


def _norm(am: ArrayModel, name: str, tokens: int, width: int) -> OpCost:
    return am.sfu(f"{name}_rsqrt", tokens) + am.vector(f"{name}_scale", 2 * width * tokens)


def gqa_projections(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int) -> list[OpCost]:
    """q, k and v of `tokens` tokens as one GEMM (their keys and values appended to the cache), with the biases,
    q/k norms and RoPE a model has: the part of attention whose weights stream once for all of them."""
    d, nq, nkv, hd = m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim
    ops = [weight_op(am, dense, "qkv_proj", tokens, d, (nq + 2 * nkv) * hd,
                     write_bytes=tokens * 2 * nkv * hd * BF16_BYTES)]
    if m.attention_bias:
        ops.append(am.vector("qkv_bias", tokens * (nq + 2 * nkv) * hd, read_bytes=(nq + 2 * nkv) * hd * BF16_BYTES))
    if m.qk_norm:
        ops.append(am.sfu("qk_norm_rsqrt", tokens * (nq + nkv)) + am.vector("qk_norm_scale", tokens * 2 * (nq + nkv) * hd))
    if m.rope:
        ops.append(am.vector("rope", tokens * 2 * (nq + nkv) * hd))
    return ops


def mla_projections(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int) -> list[OpCost]:
    """MLA's query (through its LoRA where the model has one) and compressed latent of `tokens` tokens as GEMMs
    (the latents appended to the cache), the latents' norm and RoPE."""
    d = m.hidden_size
    h, nope, rope, lora = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
    b = tokens
    if m.q_lora_rank:
        r = m.q_lora_rank
        q = (weight_op(am, dense, "q_a_proj", b, d, r) + am.sfu("q_norm_rsqrt", b)
             + am.vector("q_norm_scale", b * 2 * r)
             + weight_op(am, dense, "q_b_proj", b, r, h * (nope + rope)))
    else:
        q = weight_op(am, dense, "q_proj", b, d, h * (nope + rope))
    return [q,
            weight_op(am, dense, "kv_a_proj", b, d, lora + rope, write_bytes=b * (lora + rope) * BF16_BYTES),
            am.sfu("kv_norm_rsqrt", b) + am.vector("kv_norm_scale", b * 2 * lora),
            am.vector("rope", b * (2 * h * rope + 2 * rope))]


def _gqa_chunk(am: ArrayModel, m: ModelShape, dense: DenseWeights, offset: int, tokens: int, window: int
               ) -> list[OpCost]:
    """Grouped-query attention for a chunk: the projections as GEMMs over the chunk (K and V of its tokens
    appended: tokens x 2 x kv_heads x head_dim x 2 bytes written); scores: one dot product of head_dim per head
    and attended pair, the cached keys read once (kv_heads x head_dim x 2 bytes each); softmax over every pair
    (+ one sink logit per head and query with sinks); the value mix the same pairs; the output projection."""
    d, nq, hd = m.hidden_size, m.num_heads, m.head_dim
    ops = gqa_projections(am, m, dense, tokens) + gqa_chunk_core(am, m, offset, tokens, window)
    ops.append(weight_op(am, dense, "o_proj", tokens, nq * hd, d))
    if m.attention_bias:
        ops.append(am.vector("o_bias", tokens * d, read_bytes=d * BF16_BYTES))
    return ops


def gqa_chunk_core(am: ArrayModel, m: ModelShape, offset: int, tokens: int, window: int) -> list[OpCost]:
    """A chunk's causal scores, softmax and value mix (cached keys and values read once)."""
    nq, nkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    cached, cache_pairs, chunk_pairs = attended_pairs(offset, tokens, window)
    pairs = cache_pairs + chunk_pairs
    kv_bytes = nkv * cached * hd * BF16_BYTES
    logits = nq * pairs + (nq * tokens if m.attention_sinks else 0)
    return [am.matvec("scores", hd, nq * pairs, kv_bytes, groups=nq // nkv),
            am.sfu("softmax_exp", logits) + am.vector("softmax_norm", 3 * logits),
            am.matvec("value_mix", hd, nq * pairs, kv_bytes, groups=nq // nkv)]


def _mla_chunk(am: ArrayModel, m: ModelShape, dense: DenseWeights, offset: int, tokens: int) -> list[OpCost]:
    """DeepSeek's MLA at prefill, not absorbed (as its prefill kernels run it): queries and the compressed latents
    of the chunk as GEMMs; every attended latent (cached ones read once: kv_lora_rank + rope x 2 bytes) lifted
    to per-head keys and values by kv_b_proj; scores of (nope + rope) and a value mix of v_head_dim per pair."""
    h, v = m.num_heads, m.v_head_dim
    return mla_projections(am, m, dense, tokens) + mla_chunk_core(am, m, dense, offset, tokens) + [
        weight_op(am, dense, "o_proj", tokens, h * v, m.hidden_size)]


def mla_chunk_core(am: ArrayModel, m: ModelShape, dense: DenseWeights, offset: int, tokens: int) -> list[OpCost]:
    """A chunk's attention on MLA's latents, not absorbed: the cached latents read once, every attended latent
    lifted to keys and values (kv_b_proj), the causal scores, softmax and value mix."""
    h, nope, rope, lora, v = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim
    cached, cache_pairs, chunk_pairs = attended_pairs(offset, tokens)
    pairs = cache_pairs + chunk_pairs
    ops = []
    if cached:  # the cached latents, read once
        ops.append(am.vector("cached_latents", 0, read_bytes=cached * (lora + rope) * BF16_BYTES))
    return ops + [
        weight_op(am, dense, "kv_b_proj", cached + tokens, lora, h * (nope + v)),
        am.matvec("scores", nope + rope, h * pairs, 0),
        am.sfu("softmax_exp", h * pairs) + am.vector("softmax_norm", 3 * h * pairs),
        am.matvec("value_mix", v, h * pairs, 0),
    ]


def _mixer_chunk(am: ArrayModel, m: ModelShape, dense: DenseWeights, kind: str, offset: int, tokens: int) -> OpCost:
    d = m.hidden_size
    if kind == MAMBA:
        ops = _mamba2(am, m, dense, tokens)
    elif m.attention == "mla":
        ops = _mla_chunk(am, m, dense, offset, tokens)
    else:
        ops = _gqa_chunk(am, m, dense, offset, tokens, m.sliding_window if kind == SLIDING else 0)
    total = _norm(am, "attn_norm", tokens, d)
    for op in ops:
        total = total + op
    return total + am.vector("attn_residual", tokens * d)


def prefill_group_builders(am: ArrayModel, m: ModelShape, hw: HardwareConfig, offset: int, tokens: int) -> dict:
    """Group name -> a function building that group's OpCost for a chunk of `tokens` at `offset` (None: the model
    has no such group); "expert" takes the number of the chunk's tokens routed to that expert."""
    bits, group, sbits = hw.model.expert_bits, hw.model.quant_group_size, hw.model.quant_scale_bits
    dense_w = dense_weights(hw)
    d = m.hidden_size
    kinds = {m.mixer(layer) for layer in range(m.num_layers)}

    def mixer(kind):
        return (lambda: _mixer_chunk(am, m, dense_w, kind, offset, tokens)) if kind in kinds else None

    def router():
        op = _norm(am, "ffn_norm", tokens, d) + weight_op(am, dense_w, "router", tokens, d, m.num_experts)
        if m.router_bias:
            op = op + am.vector("router_bias", tokens * m.num_experts, read_bytes=m.num_experts * BF16_BYTES)
        return op + am.sfu("router_softmax", tokens * m.num_experts) + am.vector(
            "router_topk", tokens * m.num_experts * m.top_k)

    def dense():
        return (_norm(am, "ffn_norm", tokens, d) + dense_ffn(am, dense_w, "dense", d, m.dense_ffn, tokens)
                + am.vector("ffn_residual", tokens * d))

    def shared():
        op = dense_ffn(am, dense_w, "shared", d, m.shared_expert_ffn * m.num_shared_experts, tokens)
        if m.shared_expert_gate:
            op = op + weight_op(am, dense_w, "shared_gate", tokens, d, 1) + am.sfu("shared_sigmoid", tokens)
        return op

    def expert(routed_tokens: int) -> OpCost:
        return _ffn(am, "expert", d, m.expert_ffn, bits, group, sbits, hw.compute.dequant_ops_per_weight,
                    m.expert_activation, m.expert_bias, tokens=routed_tokens)

    def head(logits: bool = True):
        """The chunk's embedding lookups; with `logits` (the prompt's last chunk), its last token's LM head."""
        op = embedding_op(am, dense_w, tokens, d)
        if not logits:
            return op
        op = op + _norm(am, "final_norm", 1, d) + weight_op(am, dense_w, "lm_head", 1, d, m.vocab_size)
        if m.lm_head_bias:
            op = op + am.vector("lm_head_bias", m.vocab_size, read_bytes=m.vocab_size * BF16_BYTES)
        return op + am.vector("argmax", m.vocab_size)

    return {
        "attention": mixer(FULL), "attention_sliding": mixer(SLIDING), "mamba": mixer(MAMBA),
        "dense": dense if m.first_dense_layers else None, "router": router,
        "shared": shared if m.num_shared_experts else None, "expert": expert,
        "combine": lambda: am.vector("combine", tokens * (m.top_k + m.num_shared_experts + 1) * d),
        "head": head,
    }
