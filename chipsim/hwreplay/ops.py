"""The decode step's and a prefill chunk's primitive operations, as the simulator costs them (no torch).

chipsim.workload.decode builds each op group (attention, router, shared, expert, combine, head, dense)
from primitives on an ArrayModel; `primitive_ops` runs the same builders on a recording model, so the
hardware replay launches one kernel per primitive the simulator charges for. chipsim.workload.prefill builds a
prefill chunk's groups the same way (`prefill_chunk_ops`, `prefill_expert_ops`): its projections, router and
experts are GEMMs (`matmul` primitives over M > 1 tokens).

A prefill chunk's attention is one kernel on the GPU (scaled_dot_product_attention over the chunk, causal, and the
cache), where the simulator costs it as four primitives: scores and value mix (two matvecs of the same shape,
head_dim x pairs, hence the same op key) and the softmax's SFU and vector work. The replay launches the attention
kernel for the scores primitive (`Primitive.attention` says its geometry) and marks the other three fused: they
launch nothing, as the 4-bit experts' dequantisation does. The single-op probe (chipsim.hwreplay.microbench) times
that kernel alone and gives each of the two matvecs of its key half of it, the fused softmax primitives 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataclasses import replace

from chipsim.hw.compute_formula import ArrayModel, op_key, parse_op_key
from chipsim.hw.config import HardwareConfig
from chipsim.workload.batch import batch_group_builders
from chipsim.workload.decode import (MIXER_GROUP, dense_weights, op_group_builders, sequence_contexts,
                                     weight_bytes as weight_bytes_at)
from chipsim.errors import InputError
from chipsim.workload.models import model_of
from chipsim.workload.prefill import prefill_group_builders
from chipsim.workload.shape import MAMBA, SLIDING

# the kernels a matvec primitive can be launched with (chipsim.hwreplay.harness.kernel_call)
GEMV_KERNELS = ("cublas", "triton")


@dataclass(frozen=True)
class Primitive:
    kind: str  # "matvec", "sfu" or "vector"
    name: str
    reduction: int = 0  # matvec: length of each dot product
    outputs: int = 0  # matvec: dot products
    weight_bytes: int = 0  # matvec: operand bytes streamed; vector: bytes read
    elements: int = 0  # sfu: operations; vector: lane operations
    write_bytes: int = 0  # matvec: results written back to HBM (KV-cache append; the replay does not launch a kernel for it)
    groups: int = 1  # matvec: outputs sharing each operand row (GQA/MLA heads on one KV entry), as the builder says
    bits: int = 16  # matvec: bits per weight; below 16 the weights are packed with one BF16 scale per quant_group
    quant_group: int = 0  # matvec below 16 bit: weights sharing one scale
    fused: bool = False  # its work runs inside other primitives' kernels (dequantisation inside the 4-bit matvecs)
    tokens: int = 1  # matmul: rows of activations (a prefill chunk's tokens, or those routed to one expert)
    attention: "Attention | None" = None  # a prefill chunk's scores: the attention kernel it launches

    @property
    def key(self) -> str:
        """The shape's name in compute.op_times_ns."""
        return op_key(self.kind, reduction=self.reduction, outputs=self.outputs, read_bytes=self.weight_bytes,
                      elements=self.elements, tokens=self.tokens)


@dataclass(frozen=True)
class Attention:
    """A prefill chunk's causal attention as one kernel: `tokens` queries at positions offset .. offset + tokens - 1
    over every key up to each one's own (or the last `window` of them), grouped-query heads."""

    heads: int
    kv_heads: int
    head_dim: int
    offset: int
    tokens: int
    window: int = 0  # 0: full attention

    @property
    def keys(self) -> int:
        """Keys and values in the cache when the chunk's last query runs (its own included)."""
        return self.offset + self.tokens


def key_groups(key: str) -> int:
    """The outputs sharing each operand row of a BF16 matvec named only by its key (a profile's row): it reads
    1/g of reduction x outputs x 2 bytes. 1 for other kinds."""
    kind, f = parse_op_key(key)
    if kind != "matvec" or not f["read_bytes"]:
        return 1
    return max(1, round(f["reduction"] * f["outputs"] * 2 / f["read_bytes"]))


class RecordingArrayModel(ArrayModel):
    """An ArrayModel that also notes every primitive it costs.

    Sub-16-bit experts (model.expert_bits): a matvec whose bytes are the expert precision's (weights packed, one
    scale per model.quant_group_size) is noted with those bits, and the expert's dequantisation (a vector
    primitive the decode step names `<ffn>_dequant`) as fused: the replay's 4-bit kernel unpacks and scales the
    weights in registers as it streams them, which is the work the simulator charges to the vector lanes."""

    def __init__(self, hw: HardwareConfig, tagged: bool = False):
        """tagged: each OpCost is named `name#i`, i its primitive's place in the log, so that a group whose builder
        repeats an OpCost (a batch's equal contexts, costed once) names every primitive it charges (`charged`)."""
        super().__init__(hw)
        self.log: list[Primitive] = []
        self.tagged = tagged
        w = hw.model
        if w.dense_bits != 16:  # every replay kernel but the experts' is a BF16 one
            raise InputError(f"hwreplay: model.dense_bits {w.dense_bits}: the replay runs BF16 non-expert weights "
                             "(no quantised attention, router, shared-expert or LM-head kernel)")
        self._quant = (w.expert_bits, w.quant_group_size, w.quant_scale_bits) if w.expert_bits < 16 else None

    def _noted(self, p: Primitive) -> str:
        """Log `p`; the name its OpCost carries."""
        self.log.append(p)
        return f"{p.name}#{len(self.log) - 1}" if self.tagged else p.name

    def charged(self, op) -> list[Primitive]:
        """The primitives a tagged model's OpCost `op` charges, in order, repeats included."""
        return [self.log[int(part.rpartition("#")[2])] for part in op.name.split("+")]

    def matvec(self, name, reduction, outputs, weight_bytes, write_bytes=0, groups=1):
        bits, group = 16, 0
        if self._quant and groups == 1 and weight_bytes == weight_bytes_at(reduction * outputs, *self._quant):
            bits, group = self._quant[0], self._quant[1]
        name = self._noted(Primitive("matvec", name, reduction, outputs, weight_bytes, write_bytes=write_bytes,
                                     groups=groups, bits=bits, quant_group=group))
        return super().matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)

    def matmul(self, name, tokens, reduction, outputs, weight_bytes, write_bytes=0, groups=1):
        if tokens == 1:  # ArrayModel.matmul costs one token as the matvec (which notes it)
            return super().matmul(name, tokens, reduction, outputs, weight_bytes, write_bytes, groups)
        if groups != 1:
            raise InputError(f"hwreplay: {name}: a GEMM whose operand rows several outputs share is not replayed")
        name = self._noted(Primitive("matmul", name, reduction, outputs, weight_bytes, write_bytes=write_bytes,
                                     tokens=tokens))
        return super().matmul(name, tokens, reduction, outputs, weight_bytes, write_bytes, groups)

    def sfu(self, name, ops):
        return super().sfu(self._noted(Primitive("sfu", name, elements=ops)), ops)

    def vector(self, name, lane_ops, read_bytes=0):
        fused = self._quant is not None and name.endswith("_dequant")
        return super().vector(self._noted(Primitive("vector", name, weight_bytes=read_bytes, elements=lane_ops,
                                                    fused=fused)), lane_ops, read_bytes)


def profile_coverage(hw: HardwareConfig) -> tuple[int, int]:
    """(operations costed from compute.op_times_ns, operations costed by the array model) in one decode step."""
    am = ArrayModel(hw)
    for build in op_group_builders(am, model_of(hw.model), hw).values():
        if build is not None:
            build()
    return am.profiled_ops, am.modelled_ops


def primitive_ops(hw: HardwareConfig) -> dict[str, list[Primitive]]:
    """Op group name -> its primitives in order (groups the model lacks are absent)."""
    am = RecordingArrayModel(hw)
    out = {}
    model = model_of(hw.model)
    for name, build in op_group_builders(am, model, hw).items():
        if build is None:
            continue
        if name in ("attention_sliding", "mamba"):  # the harness runs one attention group in every layer
            raise InputError(f"hwreplay: {model.name} has {name.replace('_', ' ')} layers; the replay harness "
                             "replays models whose every layer is full attention")
        am.log = []
        build()
        out[name] = list(am.log)
    return out


def kernels_per_token(hw: HardwareConfig) -> dict[str, int]:
    """Each kernel shape's launches in one decode step of the replay (op key -> count): every layer's attention,
    each MoE layer's router, shared experts, top-k routed experts and combine, each dense layer's FFN, the head
    once. Fused primitives launch no kernel and are left out."""
    model = model_of(hw.model)
    moe = model.num_moe_layers
    per_group = {"attention": model.num_layers, "router": moe, "shared": moe, "expert": moe * model.top_k,
                 "combine": moe, "head": 1, "dense": model.first_dense_layers}
    counts: dict[str, int] = {}
    for name, prims in primitive_ops(hw).items():
        for p in prims:
            if not p.fused:
                counts[p.key] = counts.get(p.key, 0) + per_group[name]
    return counts


# the primitives a prefill chunk's attention kernel stands for besides the scores: they launch nothing
ATTENTION_FUSED = ("softmax_exp", "softmax_norm", "value_mix")


def replayable_prefill_model(hw: HardwareConfig, what: str = "prefill"):
    """The model shape, if the prefill (or batch: `what`) replay runs it: grouped-query attention in every layer
    (full or sliding), BF16 experts (its expert GEMMs have no 4-bit kernel)."""
    model = model_of(hw.model)
    if model.attention == "mla" or any(model.mixer(layer) == MAMBA for layer in range(model.num_layers)):
        raise InputError(f"hwreplay: {model.name}: the {what} replay runs models whose every layer is grouped-query "
                         "attention (full or sliding); not MLA or Mamba layers")
    if hw.model.expert_bits != 16:
        raise InputError(f"hwreplay: model.expert_bits {hw.model.expert_bits}: the {what} replay runs BF16 experts")
    frontend = hw.host_frontend
    if frontend.routing != "device" or frontend.expert_memory != "pinned":
        raise InputError(f"hwreplay: host_frontend: the {what} replay runs its plan known ahead from pinned memory "
                         "(routing: device, expert_memory: pinned); the decode replay (--contexts) runs the others")
    return model


def _with_attention_kernel(prims: list[Primitive], attention: Attention) -> list[Primitive]:
    """A chunk's mixer primitives with its attention as one kernel: the scores launch it, the softmax and the value
    mix run inside it (module docstring)."""
    out = []
    for p in prims:
        if p.name == "scores":
            p = replace(p, attention=attention)
        elif p.name in ATTENTION_FUSED:
            p = replace(p, fused=True)
        out.append(p)
    if sum(p.attention is not None for p in out) != 1:
        raise RuntimeError(f"hwreplay: a prefill mixer without exactly one scores primitive: {[p.name for p in prims]}")
    return out


def prefill_chunk_ops(hw: HardwareConfig, offset: int, tokens: int, last: bool) -> dict[str, list[Primitive]]:
    """A prefill chunk's op groups as primitives (groups the model lacks are absent): "attention" and
    "attention_sliding" (the layer's mixer), "router", "dense", "shared", "combine", and "head" (the chunk's
    embedding lookups; with `last`, the prompt's last chunk, its last token's LM head). The routed experts are
    prefill_expert_ops'."""
    model = replayable_prefill_model(hw)
    am = RecordingArrayModel(hw)
    out = {}
    for name, build in prefill_group_builders(am, model, hw, offset, tokens).items():
        if build is None or name in ("expert", "mamba"):
            continue
        am.log = []
        build(last) if name == "head" else build()
        out[name] = list(am.log)
    for kind in {model.mixer(layer) for layer in range(model.num_layers)}:
        window = model.sliding_window if kind == SLIDING else 0
        group = MIXER_GROUP[kind]
        out[group] = _with_attention_kernel(out[group], Attention(model.num_heads, model.num_kv_heads, model.head_dim,
                                                                  offset, tokens, window))
    return out


def prefill_expert_ops(hw: HardwareConfig, tokens: int) -> list[Primitive]:
    """One routed expert of a prefill chunk over the `tokens` tokens routed to it: its GEMMs (its matvecs for one
    token) and their elementwise work, as chipsim.workload.request costs it."""
    model = replayable_prefill_model(hw)
    am = RecordingArrayModel(hw)
    prefill_group_builders(am, model, hw, 0, 1)["expert"](tokens)
    return list(am.log)


def batch_step_ops(hw: HardwareConfig) -> dict[str, list[Primitive]]:
    """A batch decode step's op groups as primitives (chipsim.workload.batch.batch_group_builders over
    workload.batch sequences at their contexts, chipsim.workload.decode.sequence_contexts; groups the model lacks
    are absent): "attention" and "attention_sliding" (the mixer: projections as GEMMs of B rows, each sequence's
    scores, softmax and value mix as the decode step's matvecs over its own cache), "router", "dense", "shared",
    "combine", "head" (every sequence's LM head). A routed expert over n of the step's tokens is
    prefill_expert_ops(hw, n): the same builder."""
    model = replayable_prefill_model(hw, "batch")
    am = RecordingArrayModel(hw, tagged=True)  # sequences of one context share one costed attention core
    contexts = sequence_contexts(hw, hw.workload.context_length)
    return {name: am.charged(build()) for name, build in batch_group_builders(am, model, hw, contexts).items()
            if build is not None and name not in ("expert", "mamba")}


def served_step_ops(hw: HardwareConfig, parts) -> dict[str, list[Primitive]]:
    """A served run's step of `parts` (chipsim.workload.served.Part) as op groups of primitives, as
    chipsim.workload.served.ServedCosts costs it: one prompt chunk as that prefill chunk (prefill_chunk_ops), one
    decode token as a request's decode step over its cache (the decode builders at its context), several parts as a
    mixed step (mixed_mixer's projections over all the step's tokens, each part's own attention core: a decode
    token's matvecs over its cache, a chunk's one attention kernel; the router, dense FFN, shared experts and
    weighted sums over the step's tokens; the head of the parts that yield a token). A routed expert over n of the
    step's tokens is prefill_expert_ops(hw, n)."""
    from chipsim.workload.prefill import prefill_group_builders
    from chipsim.workload.served import mixed_mixer, part_core, served_head

    model = replayable_prefill_model(hw, "served")
    if len(parts) == 1 and not parts[0].decode:
        p = parts[0]
        return prefill_chunk_ops(hw, p.position, p.tokens, p.emits)
    am = RecordingArrayModel(hw, tagged=True)
    kinds = {model.mixer(layer) for layer in range(model.num_layers)}
    if len(parts) == 1:  # a decode token: the decode step's groups over its cache (its mixer's as _decode_costs')
        builders = op_group_builders(am, model, hw, context=parts[0].position + 1)
        return {name: am.charged(build()) for name, build in builders.items()
                if build is not None and name not in ("expert", "mamba")}
    n = sum(p.tokens for p in parts)
    dense = dense_weights(hw)

    def core(attention: str, p, window: int) -> list:
        first = len(am.log)
        ops = part_core(am, model, dense, attention, p, window)
        if not p.decode:  # the chunk's scores launch its attention kernel; its softmax and value mix run inside
            am.log[first:] = _with_attention_kernel(am.log[first:], Attention(
                model.num_heads, model.num_kv_heads, model.head_dim, p.position, p.tokens, window))
        return ops

    out = {MIXER_GROUP[kind]: am.charged(mixed_mixer(am, model, dense, kind, list(parts), n, core)) for kind in kinds}
    for name, build in prefill_group_builders(am, model, hw, 0, n).items():
        if name in ("router", "dense", "shared", "combine") and build is not None:
            out[name] = am.charged(build())
    out["head"] = am.charged(served_head(am, model, dense, n, sum(1 for p in parts if p.emits)))
    return out
