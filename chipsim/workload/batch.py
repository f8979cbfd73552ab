"""B sequences decoded together (workload.batch): each decode step runs one token of every sequence through every
layer at once. Sequence b reads its own window of the trace (tokens b·n .. b·n + n − 1, n the tokens each sequence
decodes) and attends over its own KV cache; this module costs such a step, lays the trace out for it, and says
what the memory plan must hold.

A step's work, per layer: the B tokens' input norms; the mixer's weights streamed once for all B (q, k, v and o
projections, MLA's absorbed projections, a Mamba2 layer's in/out projections: GEMMs of B rows, ArrayModel.matmul)
while each sequence's scores and value mix read its own cache (B decode attentions, each over its own context);
the router over the B tokens; the dense FFN or shared experts for B; each routed expert as a GEMM over the step's
tokens routed to it (the union of the B tokens' sets is what must be in the buffer); the weighted sums; the
embedding lookups and the LM head for every sequence (each needs its next token).

The engine runs a step as it runs a prefill chunk (chipsim.sim.engine: one routing per layer for the union, the
experts as GEMMs over their token counts), over B consecutive tokens of a re-ordered trace
(chipsim.trace.interleave): step i's
tokens are i·B .. i·B + B − 1, token i·B + b being sequence b's i-th. A policy's hooks receive the step's last
token as t and all B as `ctx.step_tokens`; `ctx.batch` is B, so a token's predecessor in its own sequence is
t − B. B = 1 is not built here: the decode step of chipsim.workload.decode runs, unchanged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from chipsim.hw.compute_formula import ArrayModel, OpCost
from chipsim.hw.config import HardwareConfig
from chipsim.workload.decode import (BF16_BYTES, MIXER_GROUP, DecodeWorkload, DenseWeights, _mamba2, dense_weights,
                                     embedding_op, sequence_contexts, weight_op)
from chipsim.workload.prefill import (ExpertGemms, _norm, gqa_projections, launch_grouped, mla_projections,
                                      prefill_group_builders)
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape


def is_batch(hw: HardwareConfig) -> bool:
    return hw.workload.batch > 1


def tokens_per_sequence(hw: HardwareConfig, trace_tokens: int) -> int:
    """Decode steps of a batch run: workload.max_tokens, or as many as the trace gives every sequence a window of."""
    w = hw.workload
    return w.max_tokens or trace_tokens // w.batch


@dataclass(frozen=True)
class BatchLayer:
    """One layer of a batch step: its mixer and router (a MoE layer) over the B tokens, its dense FFN or shared
    experts, and the weighted sums."""

    pre: OpCost
    dense: OpCost | None
    combine: OpCost | None


@dataclass
class BatchWorkload:
    """A decode step of `batch` sequences, each at its context (workload.context_length, or staggered up to it:
    workload.batch_contexts), costed on the decode workload's arrays; `steps` steps."""

    batch: int
    steps: int
    context: int
    layers: tuple[BatchLayer, ...]
    head: OpCost
    expert: ExpertGemms  # expert(n): one routed expert as a GEMM over the step's n tokens routed to it

    @property
    def window_starts(self) -> tuple[int, ...]:
        """The first trace token of each sequence's window."""
        return tuple(b * self.steps for b in range(self.batch))


# ---------------------------------------------------------------------------------------------- the step's costs
def _attention_cores(am: ArrayModel, m: ModelShape, contexts: list[int], core: Callable[[int], list[OpCost]]
                     ) -> list[OpCost]:
    """Each sequence's own cache reads: `core(context)` once per sequence (equal contexts costed once, repeated)."""
    ops: list[OpCost] = []
    for context, n in sorted(Counter(contexts).items()):
        once = core(context)
        for _ in range(n):
            ops += once
    return ops


def _gqa_batch(am: ArrayModel, m: ModelShape, dense: DenseWeights, kv_lens: list[int]) -> list[OpCost]:
    """Grouped-query attention for B tokens, each over its own sequence's `kv_len` cached tokens: the projections as
    GEMMs of B rows (each token's K and V appended), per sequence the scores, softmax and value mix of
    chipsim.workload.decode._gqa over its cache."""
    b = len(kv_lens)
    return gqa_projections(am, m, dense, b) + _attention_cores(am, m, kv_lens, lambda c: gqa_decode_core(am, m, c)) \
        + gqa_output(am, m, dense, b)


def gqa_decode_core(am: ArrayModel, m: ModelShape, kv_len: int) -> list[OpCost]:
    """One decoding token's scores, softmax and value mix over its sequence's `kv_len` cached tokens (its own
    included), as chipsim.workload.decode._gqa computes them."""
    nq, nkv, hd = m.num_heads, m.num_kv_heads, m.head_dim
    logits = kv_len + (1 if m.attention_sinks else 0)
    kv_bytes = nkv * kv_len * hd * BF16_BYTES
    return [am.matvec("scores", hd, nq * kv_len, kv_bytes, groups=nq // nkv),
            am.sfu("softmax_exp", nq * logits) + am.vector("softmax_norm", 3 * nq * logits),
            am.matvec("value_mix", kv_len, nq * hd, kv_bytes, groups=nq // nkv)]


def gqa_output(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int) -> list[OpCost]:
    """The output projection of `tokens` tokens' attention (and its bias), weights streamed once."""
    d, nq, hd = m.hidden_size, m.num_heads, m.head_dim
    ops = [weight_op(am, dense, "o_proj", tokens, nq * hd, d)]
    if m.attention_bias:
        ops.append(am.vector("o_bias", tokens * d, read_bytes=d * BF16_BYTES))
    return ops


def _mla_batch(am: ArrayModel, m: ModelShape, dense: DenseWeights, contexts: list[int]) -> list[OpCost]:
    """DeepSeek's MLA, absorbed as at decode (chipsim.workload.decode._mla), for B tokens: every weight (q, kv_a,
    the absorbed uk and uv, o) a GEMM of B rows; per sequence the scores against its cached latents and their mix."""
    d = m.hidden_size
    h, nope, lora, v = m.num_heads, m.qk_nope_head_dim, m.kv_lora_rank, m.v_head_dim
    b = len(contexts)
    ops = mla_projections(am, m, dense, b)
    ops.append(weight_op(am, dense, "q_absorb_uk", b, nope, h * lora))
    ops += _attention_cores(am, m, contexts, lambda c: mla_decode_core(am, m, c))
    ops += [weight_op(am, dense, "v_up_uv", b, lora, h * v), weight_op(am, dense, "o_proj", b, h * v, d)]
    return ops


def mla_decode_core(am: ArrayModel, m: ModelShape, ctx: int) -> list[OpCost]:
    """One decoding token's scores against its sequence's `ctx` cached latents and their mix (absorbed MLA)."""
    h, rope, lora = m.num_heads, m.qk_rope_head_dim, m.kv_lora_rank
    return [am.matvec("scores", lora + rope, h * ctx, ctx * (lora + rope) * BF16_BYTES, groups=h),
            am.sfu("softmax_exp", h * ctx) + am.vector("softmax_norm", 3 * h * ctx),
            am.matvec("latent_mix", ctx, h * lora, ctx * lora * BF16_BYTES, groups=h)]


def _mixer_batch(am: ArrayModel, m: ModelShape, dense: DenseWeights, kind: str, contexts: list[int]) -> OpCost:
    """A layer's token mixer for the step's B tokens, with their input norms and residuals; a sliding layer's
    sequences each attend over at most its window; a Mamba2 layer steps each sequence's own state."""
    b = len(contexts)
    if kind == MAMBA:
        ops = _mamba2(am, m, dense, tokens=b, states=b)
    elif m.attention == "mla":
        ops = _mla_batch(am, m, dense, contexts)
    else:
        window = m.sliding_window if kind == SLIDING else 0
        ops = _gqa_batch(am, m, dense, [min(c, window) if window else c for c in contexts])
    total = _norm(am, "attn_norm", b, m.hidden_size)
    for op in ops:
        total = total + op
    return total + am.vector("attn_residual", b * m.hidden_size)


def batch_group_builders(am: ArrayModel, m: ModelShape, hw: HardwareConfig, contexts: list[int]) -> dict:
    """Group name -> a function building that group's OpCost for a step of len(contexts) tokens, sequence b's
    attending over contexts[b] tokens (None: the model has no such group); "expert" takes the number of the step's
    tokens routed to that expert. The prefill builders (chipsim.workload.prefill) cost everything but the mixer
    and the head the same way for B tokens at once."""
    b = len(contexts)
    groups = prefill_group_builders(am, m, hw, 0, b)
    kinds = {m.mixer(layer) for layer in range(m.num_layers)}
    dense = dense_weights(hw)

    def mixer(kind):
        return (lambda: _mixer_batch(am, m, dense, kind, contexts)) if kind in kinds else None

    return dict(groups, attention=mixer(FULL), attention_sliding=mixer(SLIDING), mamba=mixer(MAMBA),
                head=lambda: every_token_head(am, m, dense, b))


def every_token_head(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int) -> OpCost:
    """The embedding lookup and the LM head of each of `tokens` tokens: every sequence of a batch samples its next
    token, every position of a verify step checks its prediction."""
    d = m.hidden_size
    op = embedding_op(am, dense, tokens, d) + _norm(am, "final_norm", tokens, d)
    op = op + weight_op(am, dense, "lm_head", tokens, d, m.vocab_size)
    if m.lm_head_bias:
        op = op + am.vector("lm_head_bias", tokens * m.vocab_size, read_bytes=m.vocab_size * BF16_BYTES)
    return op + am.vector("argmax", tokens * m.vocab_size)


def build_batch(hw: HardwareConfig, decode: DecodeWorkload, trace_tokens: int) -> BatchWorkload:
    """The batch step of hw.workload costed on hw's arrays (the decode workload's memory plan holds the B caches)."""
    w, m = hw.workload, decode.model
    steps = tokens_per_sequence(hw, trace_tokens)
    am = ArrayModel(hw)
    grouped = launch_grouped(am)
    builders = batch_group_builders(am, m, hw, sequence_contexts(hw, w.context_length))
    built = {name: grouped(name, fn()) for name, fn in builders.items() if fn is not None and name != "expert"}
    experts = ExpertGemms(hw, decode, am)
    am.save_table()
    head = built["head"]  # (its launch added with the other groups')
    assert head is not None
    return BatchWorkload(w.batch, steps, w.context_length, step_layers(m, built), head, experts)


def step_layers(m: ModelShape, built: dict) -> tuple[BatchLayer, ...]:
    """Each layer of a several-token step from its built op groups: the mixer (with the router, in a MoE layer),
    the dense FFN or shared experts, the weighted sums."""
    layers = []
    for layer in range(m.num_layers):
        mixer = built[MIXER_GROUP[m.mixer(layer)]]
        assert mixer is not None
        if layer < m.first_dense_layers:
            layers.append(BatchLayer(mixer, built["dense"], None))
        else:
            router = built["router"]
            assert router is not None
            layers.append(BatchLayer(mixer + router, built.get("shared"), built["combine"]))
    return tuple(layers)
