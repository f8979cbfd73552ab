"""Arrays work as the engine runs it: an operation's (or an op group's) time alone, the operand bytes it streams and
its actions for the energy ledger (`Work`), and one layer's op groups priced once per run (`LayerCost`)."""

from __future__ import annotations

from typing import Final, NamedTuple

from chipsim.hw.compute_formula import OpCost


class Work:
    """Arrays work run as one step: its time alone, the HBM operand bytes it streams, the part of the time
    that streams nothing (issue overhead, first-operand latency), and its actions for the energy ledger.
    Never changed once made."""

    __slots__ = ("ps", "bytes", "fixed", "macs", "sfu_ops", "vector_ops", "sram_bytes", "sram_ps", "occupied",
                 "profiled_pj", "unpriced_bytes", "unpriced_sram_bytes")

    def __init__(self, ps: int, nbytes: int, fixed: int, macs: int = 0, sfu_ops: int = 0, vector_ops: int = 0,
                 sram_bytes: int = 0, sram_ps: int = 0, occupied: int = 0, profiled_pj: int = 0,
                 unpriced_bytes: int = 0, unpriced_sram_bytes: int = 0) -> None:
        self.ps = ps
        self.bytes = nbytes
        self.fixed = fixed
        self.macs = macs
        self.sfu_ops = sfu_ops
        self.vector_ops = vector_ops
        self.sram_bytes = sram_bytes  # operands already in SRAM (experts staged there): read from it, not streamed
        self.sram_ps = sram_ps  # the part of ps that reads sram_bytes
        self.occupied = occupied  # ps weighted by the share of the arrays it occupies (clock energy by occupancy)
        self.profiled_pj = profiled_pj  # compute.op_energy_pj: measured energy of its listed operations
        self.unpriced_bytes = unpriced_bytes  # of bytes, those whose energy profiled_pj holds
        self.unpriced_sram_bytes = unpriced_sram_bytes  # of sram_bytes, the same

    # spelled out: these run a few times per layer of every token
    def __add__(self, o: "Work") -> "Work":
        return Work(self.ps + o.ps, self.bytes + o.bytes, self.fixed + o.fixed, self.macs + o.macs,
                    self.sfu_ops + o.sfu_ops, self.vector_ops + o.vector_ops, self.sram_bytes + o.sram_bytes,
                    self.sram_ps + o.sram_ps, self.occupied + o.occupied, self.profiled_pj + o.profiled_pj,
                    self.unpriced_bytes + o.unpriced_bytes, self.unpriced_sram_bytes + o.unpriced_sram_bytes)

    def times(self, n: int) -> "Work":
        return Work(self.ps * n, self.bytes * n, self.fixed * n, self.macs * n, self.sfu_ops * n,
                    self.vector_ops * n, self.sram_bytes * n, self.sram_ps * n, self.occupied * n,
                    self.profiled_pj * n, self.unpriced_bytes * n, self.unpriced_sram_bytes * n)


NO_WORK: Final = Work(0, 0, 0)


def cost_of(op: OpCost | None) -> Work:
    """An operation's cost as arrays work (NO_WORK for none)."""
    if op is None:
        return NO_WORK
    return Work(op.duration_ps, op.hbm_read_bytes + op.hbm_write_bytes, op.fixed_ps, op.macs, op.sfu_ops,
                op.vector_ops, occupied=op.occupied_ps, profiled_pj=op.profiled_pj, unpriced_bytes=op.unpriced_bytes)


class LayerCost(NamedTuple):
    """One layer's operations, priced once per run."""

    pre: Work  # attention + router
    dense: Work  # shared experts (MoE layer) or the dense FFN (dense layer)
    expert: Work  # one routed expert in the policy's format
    combine: Work  # weighted sum of the experts' outputs
