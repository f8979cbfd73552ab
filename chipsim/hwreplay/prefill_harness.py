"""Replay a request's prefill chunks on a CUDA GPU (or, as a dry run, on the CPU): chipsim.hwreplay.harness.replay
with a prefill step in place of the decode step.

Each chunk runs every layer over its tokens at once, one kernel per primitive the simulator costs
(chipsim.hwreplay.ops.prefill_chunk_ops): every matmul a cuBLAS GEMM (torch.mm, BF16) of exactly its shape, tokens x
reduction activations times its weight, each layer's weights its own allocation; each routed expert its GEMMs over
the tokens routed to it, reading its weights from the GPU slot its copy landed in (prefill_expert_ops); the attention
one scaled_dot_product_attention kernel (`attention_call`); SFU work an exp, vector work an add, as at decode. The
copies and their order are the decode replay's (experts in pinned host memory, one FIFO copy stream, a copy waiting
for the compute stream to reach its issue point, an expert for its copy). The event after each chunk's head is its
end: the last chunk's, after its LM head, is the first output token (TTFT).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from chipsim.hwreplay.harness import GpuDecodeStep, _nothing, _ProgramCompiler, kernel_call, weight_shape, weight_views
from chipsim.hwreplay.ops import Attention, Primitive, prefill_chunk_ops, prefill_expert_ops
from chipsim.workload.decode import MIXER_GROUP
from chipsim.workload.models import model_of

BF16 = torch.bfloat16


def attention_tensors(att: Attention, device) -> tuple:
    """(q, k, v, mask) of a chunk's attention kernel (attention_call), filled with normal numbers.

    Full attention from position 0: q (1, heads, tokens, head_dim), k and v (1, kv_heads, tokens, head_dim), causal,
    the query heads sharing each key head (FlashAttention's kernel). Otherwise a boolean mask says which keys each
    query sees, and each key head's query heads are folded into its query rows (exact grouped-query work without
    copying keys per query head): after the cache (offset > 0) q (1, kv_heads, g x tokens, head_dim) over all
    offset + tokens keys; with a sliding window w, the queries in blocks of w, each over the 2w keys from w before
    its first query: q (blocks, kv_heads, g x w, head_dim), k and v (blocks, kv_heads, 2w, head_dim)."""
    g, hd, t = att.heads // att.kv_heads, att.head_dim, att.tokens

    def normal(*shape):
        return torch.randn(*shape, dtype=BF16, device=device)

    if att.window == 0 and att.offset == 0:
        return normal(1, att.heads, t, hd), normal(1, att.kv_heads, t, hd), normal(1, att.kv_heads, t, hd), None
    if att.window == 0:
        keys = att.offset + t
        row = torch.arange(g * t, device=device) % t  # each folded row's query
        mask = torch.arange(keys, device=device)[None, :] <= (att.offset + row)[:, None]
        return (normal(1, att.kv_heads, g * t, hd), normal(1, att.kv_heads, keys, hd), normal(1, att.kv_heads, keys, hd),
                mask)
    w = att.window
    blocks = -(-t // w)
    row = torch.arange(g * w, device=device) % w
    key = torch.arange(2 * w, device=device)
    # query i of a block sits at w + i among its keys: it sees keys i + 1 .. i + w (the last w, its own included)
    mask = (key[None, :] > row[:, None]) & (key[None, :] <= row[:, None] + w)
    return (normal(blocks, att.kv_heads, g * w, hd), normal(blocks, att.kv_heads, 2 * w, hd),
            normal(blocks, att.kv_heads, 2 * w, hd), mask)


def attention_call(q, k, v, mask) -> tuple:
    """The attention kernel over attention_tensors' (q, k, v, mask), as (function, args, kwargs)."""
    if mask is None:
        return F.scaled_dot_product_attention, (q, k, v), {"is_causal": True, "enable_gqa": True}
    return F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask}


def launches(p: Primitive) -> bool:
    """Whether a primitive launches a kernel of its own (a fused one runs inside another's)."""
    return not p.fused


def operand_sizes(prims) -> tuple[int, int]:
    """(activation elements, result elements) the kernels of `prims` need: every GEMM's tokens x reduction input
    and tokens x outputs result, every matvec's, every elementwise op's elements (the attention kernel and what
    is fused into it have operands of their own)."""
    prims = [p for p in prims if launches(p) and p.attention is None]
    inputs = max([p.tokens * p.reduction * p.groups for p in prims] + [1])
    results = max([p.tokens * p.outputs for p in prims] + [p.elements for p in prims] + [1])
    return inputs, results


def _weighted(p: Primitive) -> bool:
    """A primitive whose kernel reads a weight matrix (not the attention: its operands are the KV cache)."""
    return p.kind in ("matvec", "matmul") and p.attention is None and not p.fused


class GpuPrefill:
    """A request's prefill on the GPU: every layer's weights and, per chunk, its attention's tensors; scratch
    activations; the calls of each chunk's op groups and of each routed expert over its tokens."""

    def __init__(self, hw, chunks: list, prompt: int, expert_tokens, device, gemv: str = "cublas"):
        m = model_of(hw.model)
        self.device, self.gemv = device, gemv
        self.num_layers, self.first_dense = m.num_layers, m.first_dense_layers
        self.mixer_of = [MIXER_GROUP[m.mixer(layer)] for layer in range(m.num_layers)]
        self.chunk_groups = [prefill_chunk_ops(hw, offset, tokens, offset + tokens == prompt) for offset, tokens in chunks]
        self.expert_ops = {n: prefill_expert_ops(hw, n) for n in sorted(set(expert_tokens))}
        every = [p for g in self.chunk_groups for ps in g.values() for p in ps]
        every += [p for ps in self.expert_ops.values() for p in ps]
        self._scratch(every, device)
        self.weights: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        for layer in range(m.num_layers):
            names = [self.mixer_of[layer]] + (["dense"] if layer < m.first_dense_layers else ["router", "shared"])
            self._alloc([n for n in names if n in self.chunk_groups[0]], layer)
        self._alloc(["head"], -1)
        # each chunk's attention operands, per layer: its own keys and values (nothing stays in L2 between layers)
        self.attention = [{layer: attention_tensors(self._attention_of(k, layer), device) for layer in range(m.num_layers)}
                          for k in range(len(chunks))]
        any_expert = next(iter(self.expert_ops.values()), prefill_expert_ops(hw, 1))
        self.expert_bytes = sum(2 * weight_shape(p)[0] * p.reduction for p in any_expert if _weighted(p))
        self.groups = self.chunk_groups[0]
        self.kernels_per_group = {g: sum(map(launches, ps)) for g, ps in self.chunk_groups[-1].items()}
        self.kernels_per_group["expert"] = sum(map(launches, any_expert))

    def _scratch(self, prims, device) -> None:
        """The activations, the two scratch operands and the output every kernel of `prims` reads and writes
        (operand_sizes)."""
        inputs, results = operand_sizes(prims)
        self.x = torch.randn(inputs, device=device, dtype=BF16)
        self.scratch_a = torch.randn(results, device=device, dtype=BF16)
        self.scratch_b = torch.randn(results, device=device, dtype=BF16)
        self.scratch_out = torch.empty(results + inputs, device=device, dtype=BF16)

    def _attention_of(self, chunk: int, layer: int) -> Attention:
        return next(p.attention for p in self.chunk_groups[chunk][self.mixer_of[layer]] if p.attention is not None)

    def _alloc(self, names: list[str], layer: int) -> None:
        """One flat weight buffer for these groups of `layer` (the last chunk's: it has the LM head), a view per
        weight-reading primitive by its name."""
        prims = [(name, p) for name in names for p in self.chunk_groups[-1][name] if _weighted(p)]
        shapes = [weight_shape(p) for _, p in prims]
        flat = torch.empty(max(sum(r * c for r, c in shapes), 1), device=self.device, dtype=BF16).normal_()
        off = 0
        for (name, p), (r, c) in zip(prims, shapes):
            self.weights.setdefault((name, layer), {})[p.name] = flat[off:off + r * c].view(r, c)
            off += r * c

    def _call(self, p: Primitive, weight, attention=None) -> tuple:
        if p.fused:  # the softmax and value mix, inside the attention kernel
            return _nothing, (), {}
        if p.attention is not None:
            return attention_call(*attention)
        return kernel_call(p, weight, self.x, self.scratch_a, self.scratch_b, self.scratch_out, self.gemv)

    def group_calls(self, chunk: int, name: str, layer: int) -> list:
        weights = self.weights.get((name, layer), {})
        attention = self.attention[chunk].get(layer) if name in MIXER_GROUP.values() else None
        return [self._call(p, weights.get(p.name), attention) for p in self.chunk_groups[chunk][name]]

    def expert_calls(self, slot: torch.Tensor, tokens: int) -> list:
        """One routed expert over `tokens` tokens, its GEMMs reading its matrices from `slot` (one expert's bytes,
        uint8), one after another in the order of its weight-reading primitives, as the decode step lays them out."""
        calls, off = [], 0
        for p in self.expert_ops[tokens]:
            weight = None
            if _weighted(p):
                weight = weight_views(slot[off:], p)
                off += 2 * weight_shape(p)[0] * p.reduction
            calls.append(self._call(p, weight))
        return calls

    def calls_for(self, key: tuple, gpu_slots: torch.Tensor) -> list:
        """The calls of a compiled program's compute key: ("chunk", k, name, layer) or ("expert", slot, tokens)."""
        if key[0] == "chunk":
            return self.group_calls(key[1], key[2], key[3])
        return self.expert_calls(gpu_slots[key[1]], key[2])

    as_graph = GpuDecodeStep.as_graph  # (--graphs) each op group captured once as a CUDA graph, as at decode


class _PrefillCompiler(_ProgramCompiler):
    """A request plan's prefill chunks compiled into the decode replay's program form: each chunk's op groups by
    chunk, each expert with its tokens, a timing event at each chunk's end (chipsim.hwreplay.plan's prefill
    actions)."""

    chunk = 0

    def group(self, name: str, layer: int) -> tuple:
        return ("chunk", self.chunk, name, layer)

    def mixer(self, layer: int) -> str:
        return self.step.mixer_of[layer]

    def expert_key(self, a: tuple, i: int, slot: int) -> tuple:
        return ("expert", slot, a[4][i])

    def step_done(self) -> None:
        pass  # a chunk ends at "prefill_end", after its head

    def add_other(self, a: tuple) -> None:
        if a[0] == "prefill":
            self.chunk = a[1]
        elif a[0] == "prefill_end":
            super().step_done()
        else:
            super().add_other(a)


GpuPrefill.program_compiler = _PrefillCompiler
