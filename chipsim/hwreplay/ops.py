"""The decode step's primitive operations, as the simulator costs them (no torch).

chipsim.workload.decode builds each op group (attention, router, shared, expert, combine, head, dense)
from primitives on an ArrayModel; `primitive_ops` runs the same builders on a recording model, so the
hardware replay launches one kernel per primitive the simulator charges for.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.compute_formula import ArrayModel, op_key, parse_op_key
from chipsim.hw.config import HardwareConfig
from chipsim.workload.decode import op_group_builders, weight_bytes as weight_bytes_at
from chipsim.errors import InputError
from chipsim.workload.models import model_of

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

    @property
    def key(self) -> str:
        """The shape's name in compute.op_times_ns."""
        return op_key(self.kind, reduction=self.reduction, outputs=self.outputs, read_bytes=self.weight_bytes,
                      elements=self.elements)


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

    def __init__(self, hw: HardwareConfig):
        super().__init__(hw)
        self.log: list[Primitive] = []
        w = hw.model
        self._quant = (w.expert_bits, w.quant_group_size, w.quant_scale_bits) if w.expert_bits < 16 else None

    def matvec(self, name, reduction, outputs, weight_bytes, write_bytes=0, groups=1):
        bits, group = 16, 0
        if self._quant and groups == 1 and weight_bytes == weight_bytes_at(reduction * outputs, *self._quant):
            bits, group = self._quant[0], self._quant[1]
        self.log.append(Primitive("matvec", name, reduction, outputs, weight_bytes, write_bytes=write_bytes, groups=groups,
                                  bits=bits, quant_group=group))
        return super().matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)

    def sfu(self, name, ops):
        self.log.append(Primitive("sfu", name, elements=ops))
        return super().sfu(name, ops)

    def vector(self, name, lane_ops, read_bytes=0):
        fused = self._quant is not None and name.endswith("_dequant")
        self.log.append(Primitive("vector", name, weight_bytes=read_bytes, elements=lane_ops, fused=fused))
        return super().vector(name, lane_ops, read_bytes)


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
