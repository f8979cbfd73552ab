"""The decode step's primitive operations, as the simulator costs them (no torch).

chipsim.workload.decode builds each op group (attention, router, shared, expert, combine, head, dense)
from primitives on an ArrayModel; `primitive_ops` runs the same builders on a recording model, so the
hardware replay launches one kernel per primitive the simulator charges for.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.compute import ArrayModel, op_key, parse_op_key
from chipsim.hw.config import HardwareConfig
from chipsim.workload.decode import op_group_builders
from chipsim.workload.models import get_model

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
    """An ArrayModel that also notes every primitive it costs."""

    def __init__(self, hw: HardwareConfig):
        super().__init__(hw)
        self.log: list[Primitive] = []

    def matvec(self, name, reduction, outputs, weight_bytes, write_bytes=0, groups=1):
        self.log.append(Primitive("matvec", name, reduction, outputs, weight_bytes, write_bytes=write_bytes, groups=groups))
        return super().matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)

    def sfu(self, name, ops):
        self.log.append(Primitive("sfu", name, elements=ops))
        return super().sfu(name, ops)

    def vector(self, name, lane_ops, read_bytes=0):
        self.log.append(Primitive("vector", name, weight_bytes=read_bytes, elements=lane_ops))
        return super().vector(name, lane_ops, read_bytes)


def profile_coverage(hw: HardwareConfig) -> tuple[int, int]:
    """(operations costed from compute.op_times_ns, operations costed by the array model) in one decode step."""
    am = ArrayModel(hw)
    for build in op_group_builders(am, get_model(hw.model.name), hw).values():
        if build is not None:
            build()
    return am.profiled_ops, am.modelled_ops


def primitive_ops(hw: HardwareConfig) -> dict[str, list[Primitive]]:
    """Op group name -> its primitives in order (groups the model lacks are absent)."""
    am = RecordingArrayModel(hw)
    out = {}
    for name, build in op_group_builders(am, get_model(hw.model.name), hw).items():
        if build is None:
            continue
        am.log = []
        build()
        out[name] = list(am.log)
    return out
