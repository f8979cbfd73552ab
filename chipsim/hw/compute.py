"""Timing of one operation on the compute chiplet: tiling over the vector arrays and operand streaming.

The chiplet has A arrays of R×C vector units, each reducing V elements per cycle (one MAC per lane).
An operation runs on all arrays together. Its time is

    max(compute cycles from tiling, operand bytes / HBM-stream bandwidth) + fixed latency

- Matrix-vector work (every batch-1 decode matmul): the output elements are cut into V-long reduction
  chunks, one (output, chunk) pair per vector unit per cycle:
      cycles = ceil(outputs × ceil(reduction / V) / (A·R·C))
  A batch-1 GEMV has no weight reuse, so a short reduction or few outputs leave lanes or units idle.
- SFU work (exp, rsqrt, SiLU): ceil(ops / (A × SFUs × ops per cycle)) cycles.
- Elementwise vector work (residual add, scaling, dequantisation): ceil(lane ops / (A·R·C·V)) cycles.
- Operands stream from HBM through the UCIe link into SRAM: bandwidth = min(HBM effective, UCIe).
- Fixed latency per operation: issue/pipeline overhead cycles + first operand (HBM access + UCIe + SRAM).
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig
from chipsim.hw.dram import dram_timing
from chipsim.units import cycles_to_ps, gbps_to_bytes_per_s, ns_to_ps, transfer_ps


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class OpCost:
    """Cost of one operation (or a fused sequence of them) on the arrays."""

    name: str
    duration_ps: int  # arrays busy for this long
    compute_ps: int  # sum of the compute-bound parts
    memory_ps: int  # sum of the operand-streaming parts
    hbm_read_bytes: int  # operands read from HBM over UCIe
    hbm_write_bytes: int  # results written to HBM over UCIe (KV-cache append)
    macs: int
    sfu_ops: int

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(
            name=f"{self.name}+{other.name}",
            duration_ps=self.duration_ps + other.duration_ps,
            compute_ps=self.compute_ps + other.compute_ps,
            memory_ps=self.memory_ps + other.memory_ps,
            hbm_read_bytes=self.hbm_read_bytes + other.hbm_read_bytes,
            hbm_write_bytes=self.hbm_write_bytes + other.hbm_write_bytes,
            macs=self.macs + other.macs,
            sfu_ops=self.sfu_ops + other.sfu_ops,
        )


class ArrayModel:
    """Turns operation shapes into OpCosts for one hardware config."""

    def __init__(self, hw: HardwareConfig):
        c = hw.compute
        self.clock_mhz = c.clock_mhz
        self.units = c.arrays * c.unit_rows * c.unit_cols
        self.lanes = self.units * c.vector_length
        self.vector_length = c.vector_length
        self.sfu_per_cycle = c.arrays * c.sfus_per_array * c.sfu_ops_per_cycle
        hbm = dram_timing(hw.memory.hbm)
        self.stream_gbps = min(hbm.effective_gbps, hw.links.ucie.bandwidth_gbps)
        self.stream_bytes_per_s = gbps_to_bytes_per_s(self.stream_gbps)
        self.first_operand_ps = ns_to_ps(hbm.access_latency_ns + hw.links.ucie.latency_ns + c.sram_access_ns)
        self.overhead_ps = cycles_to_ps(c.op_overhead_cycles, c.clock_mhz)

    def _op(self, name: str, cycles: int, read_bytes: int, write_bytes: int, macs: int, sfu_ops: int) -> OpCost:
        compute_ps = cycles_to_ps(cycles, self.clock_mhz)
        memory_ps = transfer_ps(read_bytes + write_bytes, self.stream_bytes_per_s) if (read_bytes + write_bytes) else 0
        fixed = self.overhead_ps + (self.first_operand_ps if read_bytes else 0)
        return OpCost(name, max(compute_ps, memory_ps) + fixed, compute_ps, memory_ps, read_bytes, write_bytes, macs, sfu_ops)

    def matvec(self, name: str, reduction: int, outputs: int, weight_bytes: int, write_bytes: int = 0) -> OpCost:
        """outputs dot-products of length `reduction`, streaming `weight_bytes` of operands from HBM."""
        cycles = ceil_div(outputs * ceil_div(reduction, self.vector_length), self.units)
        return self._op(name, cycles, weight_bytes, write_bytes, outputs * reduction, 0)

    def sfu(self, name: str, ops: int) -> OpCost:
        return self._op(name, ceil_div(ops, self.sfu_per_cycle), 0, 0, 0, ops)

    def vector(self, name: str, lane_ops: int, read_bytes: int = 0) -> OpCost:
        return self._op(name, ceil_div(lane_ops, self.lanes), read_bytes, 0, 0, 0)
