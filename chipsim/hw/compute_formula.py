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

Profiled operators: an operation whose key (`op_key`) is in `compute.op_times_ns` takes that measured
time instead (its bytes, MACs and SFU operations still count for energy). The validation config of a
real GPU (hwconfigs/h200-pcie5.yaml) lists every kernel shape of its decode steps, each timed alone by a
microbenchmark; `op_group_launch_ns` adds the fixed cost of starting one op group (group_launch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chipsim.hw.config import HardwareConfig
from chipsim.hw.machine import roles
from chipsim.hw.paths import link_config, memory_timing
from chipsim.units import cycles_to_ps, gbps_to_bytes_per_s, ns_to_ps, transfer_ps


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def op_key(kind: str, reduction: int = 0, outputs: int = 0, read_bytes: int = 0, elements: int = 0,
           tokens: int = 1) -> str:
    """The name of an operation's shape in `compute.op_times_ns`: what a kernel's time depends on."""
    if kind == "matvec":
        return f"matvec r{reduction} o{outputs} b{read_bytes}"
    if kind == "matmul":
        return f"matmul m{tokens} r{reduction} o{outputs} b{read_bytes}"
    if kind == "sfu":
        return f"sfu n{elements}"
    if kind == "vector":
        return f"vector n{elements} b{read_bytes}"
    raise ValueError(f"unknown operation kind {kind!r}")


_KEY_FIELDS = {"m": "tokens", "r": "reduction", "o": "outputs", "b": "read_bytes", "n": "elements"}


def parse_op_key(key: str) -> tuple[str, dict[str, int]]:
    """op_key's inverse: 'matvec r1536 o1024 b3145728' -> ('matvec', {reduction, outputs, read_bytes})."""
    kind, *parts = key.split()
    return kind, {_KEY_FIELDS[p[0]]: int(p[1:]) for p in parts}


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
    fixed_ps: int = 0  # the part of duration_ps that moves no operand: issue overhead, first-operand latency
    vector_ops: int = 0  # elementwise lane operations (residual add, scaling, dequantisation)
    occupied_ps: int = 0  # duration_ps weighted by the share of the arrays the operation occupies (energy only)
    # compute.op_energy_pj: the measured energy of the operations listed there (their MACs, SFU and lane operations
    # and occupied time are then 0 here, and their operand bytes, still streamed, are unpriced_bytes as well)
    profiled_pj: int = 0
    unpriced_bytes: int = 0

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
            fixed_ps=self.fixed_ps + other.fixed_ps,
            vector_ops=self.vector_ops + other.vector_ops,
            occupied_ps=self.occupied_ps + other.occupied_ps,
            profiled_pj=self.profiled_pj + other.profiled_pj,
            unpriced_bytes=self.unpriced_bytes + other.unpriced_bytes,
        )


class ArrayModel:
    """Turns operation shapes into OpCosts for one hardware config."""

    def __init__(self, hw: HardwareConfig, operands_from: str = "memory"):
        """operands_from: "memory" (streamed from the operand memory over the operand link into SRAM) or "sram"
        (already in the arrays' SRAM: experts staged there, expert_buffer.location: sram)."""
        c = hw.compute
        self.clock_mhz = c.clock_mhz
        self.arrays = c.arrays
        self.units = c.arrays * c.unit_rows * c.unit_cols
        self.lanes = self.units * c.vector_length
        self.vector_length = c.vector_length
        self.sfu_per_cycle = c.arrays * c.sfus_per_array * c.sfu_ops_per_cycle
        r = roles(hw)
        hbm = memory_timing(hw, r.operand_memory)
        link = link_config(hw, r.operand_link) if r.operand_link else None  # none: the arrays sit at the memory
        link_gbps, link_ns = (link.data_gbps, link.latency_ns) if link is not None else (hbm.effective_gbps, 0.0)
        if operands_from == "sram":
            self.stream_gbps = c.sram_read_gbps
            self.first_operand_ps = ns_to_ps(c.sram_access_ns)
        else:
            self.stream_gbps = min(hbm.effective_gbps, link_gbps)
            self.first_operand_ps = ns_to_ps(hbm.access_latency_ns + link_ns + c.sram_access_ns)
        self.stream_bytes_per_s = gbps_to_bytes_per_s(self.stream_gbps)
        self.overhead_ps = cycles_to_ps(c.op_overhead_cycles, c.clock_mhz)
        self.op_times_ps = {k: ns_to_ps(v) for k, v in c.op_times_ns.items()}
        self.op_energy_pj = {k: round(v) for k, v in c.op_energy_pj.items()}
        self.tiles = None  # cycle-level timing of every operation (chipsim.tilesim.tile_sim)
        self.op_cache = None  # its operation table, cached by content hash (chipsim.tilesim.op_cache)
        self._shapes: dict[str, bool] = {}  # shape key -> found in the cached table
        if c.timing == "cycle-level" and operands_from == "memory":
            from chipsim.tilesim.op_cache import OpCache  # the tile model: for cycle-level timing only
            from chipsim.tilesim.tile_sim import ChipletParams

            self.request_latency_ns = hbm.access_latency_ns + 2 * link_ns  # request out, data back
            self.tiles = ChipletParams(
                arrays=c.arrays, units_per_array=c.unit_rows * c.unit_cols, vector_length=c.vector_length,
                clock_mhz=c.clock_mhz, sfus_per_array=c.sfus_per_array, sfu_ops_per_cycle=c.sfu_ops_per_cycle,
                sram_read_bytes_per_cycle=c.sram_read_bytes_per_cycle_per_array,
                tile_bytes=int(c.operand_tile_kib * 1024), request_bytes=c.hbm_request_bytes,
                outstanding_requests_per_array=c.outstanding_requests_per_array, memory_gbps=self.stream_gbps,
                memory_latency_ns=self.request_latency_ns, issue_cycles=c.op_overhead_cycles,
                sync_cycles=c.array_sync_cycles, sfu_pipeline_cycles=c.sfu_pipeline_cycles,
                tile_buffers=c.operand_tile_buffers, rows_per_program=c.rows_per_program,
                programs_per_array=c.programs_per_array)
            self.op_cache = OpCache.of(self.tiles)
        self.group_launch_ps = ns_to_ps(c.op_group_launch_ns)
        self.in_sequence_ps = {name: ns_to_ps(ns) for name, ns in c.in_sequence_ns.items()}
        # each op group's cost includes its launch, or (launch_per: segment) the engine charges one per segment
        self.launch_per_group = bool(self.group_launch_ps) and c.launch_per == "op_group"
        self.op_log = None  # a list to record every (operation, shape key, OpCost) costed, for `chipsim calibrate`
        self.profiled_ops = 0  # operations costed from op_times_ns (for reports and tests)
        self.modelled_ops = 0  # operations costed by the array model

    def _occupied(self, duration_ps: int, work: tuple[int, int]) -> int:
        """duration_ps × the share of the arrays an operation occupies: `work` = (items, items one array takes a
        cycle); one smaller than a pass of the whole chip leaves arrays idle, a larger one occupies them all."""
        items, per_array = work
        return duration_ps * min(self.arrays, ceil_div(items, per_array)) // self.arrays

    def _priced(self, key: str, cost: OpCost) -> OpCost:
        """`cost` with its measured energy where compute.op_energy_pj lists its shape: that energy replaces the
        per-action prices of its MACs, SFU and lane operations, operand bits and clock time (timing unchanged)."""
        pj = self.op_energy_pj.get(key)
        if pj is None:
            return cost
        return replace(cost, macs=0, sfu_ops=0, vector_ops=0, occupied_ps=0, profiled_pj=pj,
                       unpriced_bytes=cost.hbm_read_bytes + cost.hbm_write_bytes)

    def _op(self, name: str, key: str, cycles: int, read_bytes: int, write_bytes: int, macs: int, sfu_ops: int,
            vector_ops: int, work: tuple[int, int]) -> OpCost:
        compute_ps = cycles_to_ps(cycles, self.clock_mhz)
        memory_ps = transfer_ps(read_bytes + write_bytes, self.stream_bytes_per_s) if (read_bytes + write_bytes) else 0
        measured = self.op_times_ps.get(key)
        if measured is not None:
            self.profiled_ops += 1
            return self._priced(key, OpCost(name, measured, compute_ps, memory_ps, read_bytes, write_bytes, macs,
                                            sfu_ops, 0, vector_ops, self._occupied(measured, work)))
        self.modelled_ops += 1
        fixed = self.overhead_ps + (self.first_operand_ps if read_bytes else 0)
        duration = max(compute_ps, memory_ps) + fixed
        cost = self._priced(key, OpCost(name, duration, compute_ps, memory_ps, read_bytes, write_bytes, macs, sfu_ops,
                                        fixed, vector_ops, self._occupied(duration, work)))
        if self.op_log is not None:
            self.op_log.append((name, key, cost))
        return cost

    def matvec(self, name: str, reduction: int, outputs: int, weight_bytes: int, write_bytes: int = 0,
               groups: int = 1) -> OpCost:
        """outputs dot-products of length `reduction`, streaming `weight_bytes` of operands from HBM; `groups`
        outputs share each operand row (GQA heads on one KV entry)."""
        cycles = ceil_div(outputs * ceil_div(reduction, self.vector_length), self.units)
        key = op_key("matvec", reduction=reduction, outputs=outputs, read_bytes=weight_bytes)
        work = (outputs * ceil_div(reduction, self.vector_length), self.units // self.arrays)  # vector-unit passes
        if self.tiles is not None and weight_bytes and key not in self.op_times_ps:
            return self._tiled_matvec(name, key, reduction, outputs, weight_bytes, write_bytes, cycles, groups, work)
        return self._op(name, key, cycles, weight_bytes, write_bytes, outputs * reduction, 0, 0, work)

    def matmul(self, name: str, tokens: int, reduction: int, outputs: int, weight_bytes: int, write_bytes: int = 0,
               groups: int = 1) -> OpCost:
        """`tokens` rows of activations times a weight matrix (prefill's GEMMs): the weights stream once
        (`weight_bytes`), every token's dot products run on the lanes: tokens x outputs x ceil(reduction /
        vector length) unit passes. tokens 1 is exactly matvec."""
        if tokens == 1:
            return self.matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)
        passes = tokens * outputs * ceil_div(reduction, self.vector_length)
        cycles = ceil_div(passes, self.units)
        key = op_key("matmul", reduction=reduction, outputs=outputs, read_bytes=weight_bytes, tokens=tokens)
        work = (passes, self.units // self.arrays)
        if self.tiles is not None and weight_bytes and key not in self.op_times_ps:
            table_key = key if groups == 1 else f"{key} g{groups}"
            r = self._table(table_key, lambda: _tile_sim().matvec(self.tiles, reduction, outputs,
                                                               weight_bytes / (reduction * outputs), groups, tokens))
            return self._cycle_level(name, key, r, cycles, weight_bytes, write_bytes, work=work)
        return self._op(name, key, cycles, weight_bytes, write_bytes, tokens * outputs * reduction, 0, 0, work)

    def _tiled_matvec(self, name, key, reduction, outputs, weight_bytes, write_bytes, cycles, groups, work) -> OpCost:
        """The cycle-level tile loop's time; the part that moves no operand bytes (issue, the first request's
        latency, the arrays meeting) is the fixed time, the rest the operand stream the system model shares."""
        table_key = key if groups == 1 else f"{key} g{groups}"
        r = self._table(table_key, lambda: _tile_sim().matvec(self.tiles, reduction, outputs,
                                                           weight_bytes / (reduction * outputs), groups))
        return self._cycle_level(name, key, r, cycles, weight_bytes, write_bytes, work=work)

    def _table(self, key: str, compute):
        """A cycle-level result from the cached operation table (computed and added if new)."""
        self._shapes.setdefault(key, key in self.op_cache.results)
        return self.op_cache.get(key, compute)

    def shapes_computed(self) -> int:
        """Operation shapes this model had to run the cycle-level model for (not in the cached table)."""
        return sum(not cached for cached in self._shapes.values())

    def _cycle_level(self, name: str, key: str, r, cycles: int, read_bytes: int, write_bytes: int = 0,
                     vector_ops: int = 0, *, work: tuple[int, int]) -> OpCost:
        """An OpCost from a tile_sim result: its time, and as fixed time the part that moves no operand (issue,
        the arrays meeting, the SFU pipeline drain, the first request's latency when it streams from HBM)."""
        self.modelled_ops += 1
        p = self.tiles
        fixed = (p.issue_cycles + p.sync_cycles) * p.cycle_ps
        if r.sfu_ops:
            fixed += p.sfu_pipeline_cycles * p.cycle_ps
        if read_bytes:
            fixed += self.request_latency_ns * 1e3
        compute_ps = cycles_to_ps(cycles, self.clock_mhz)
        moved = read_bytes + write_bytes
        memory_ps = transfer_ps(moved, self.stream_bytes_per_s) if moved else 0
        cost = self._priced(key, OpCost(name, r.ps, compute_ps, memory_ps, read_bytes, write_bytes, r.macs, r.sfu_ops,
                                        min(r.ps, round(fixed)), vector_ops, self._occupied(r.ps, work)))
        if self.op_log is not None:
            self.op_log.append((name, key, cost))
        return cost

    def sfu(self, name: str, ops: int) -> OpCost:
        key = op_key("sfu", elements=ops)
        cycles = ceil_div(ops, self.sfu_per_cycle)
        work = (ops, self.sfu_per_cycle // self.arrays)
        if self.tiles is not None and key not in self.op_times_ps:
            r = self._table(key, lambda: _tile_sim().sfu(self.tiles, ops))
            return self._cycle_level(name, key, r, cycles, 0, work=work)
        return self._op(name, key, cycles, 0, 0, 0, ops, 0, work)

    def vector(self, name: str, lane_ops: int, read_bytes: int = 0) -> OpCost:
        key = op_key("vector", read_bytes=read_bytes, elements=lane_ops)
        cycles = ceil_div(lane_ops, self.lanes)
        work = (lane_ops, self.lanes // self.arrays)
        if self.tiles is not None and key not in self.op_times_ps:
            r = self._table(key, lambda: _tile_sim().elementwise(self.tiles, lane_ops, read_bytes))
            return self._cycle_level(name, key, r, cycles, read_bytes, vector_ops=lane_ops, work=work)
        return self._op(name, key, cycles, read_bytes, 0, 0, 0, lane_ops, work)

    def timing_text(self) -> str:
        """Which timing this model used, for the run header (the same whether the table was cached or not)."""
        if self.tiles is None:
            return "analytic (max of tiling cycles and operand bytes / stream bandwidth, + fixed)"
        return (f"cycle-level (tile loop, SFU pipelines, lanes: {len(self._shapes)} operation shapes, table "
                f"{self.op_cache.digest[:12]} cached by content hash)")

    def save_table(self) -> None:
        """Write the cycle-level operation table to the cache (new shapes only)."""
        if self.op_cache is not None:
            self.op_cache.save()

    def op_for_key(self, key: str, groups: int = 1) -> OpCost:
        """The operation an op_key names, costed by this model (e.g. the array model's estimate of a shape that
        a profile measured); a matvec's `groups` (outputs per operand row) is not in the key."""
        kind, f = parse_op_key(key)
        if kind == "matvec":
            return self.matvec(key, f["reduction"], f["outputs"], f["read_bytes"], groups=groups)
        if kind == "matmul":
            return self.matmul(key, f["tokens"], f["reduction"], f["outputs"], f["read_bytes"], groups=groups)
        if kind == "sfu":
            return self.sfu(key, f["elements"])
        return self.vector(key, f["elements"], f["read_bytes"])

    def group_launch(self, name: str) -> OpCost:
        """The fixed cost of starting one op group (compute.op_group_launch_ns)."""
        return OpCost(f"{name}_launch", self.group_launch_ps, 0, 0, 0, 0, 0, 0, self.group_launch_ps)  # arrays idle

    def step_group(self, name: str, op: OpCost | None) -> OpCost | None:
        """A batch-1 decode step's op group as it runs: its operations, its own launch where the arrays launch one
        per group (compute.launch_per: op_group), and what its kernels add back to back after other groups'
        (compute.in_sequence_ns; time with no operation or byte, priced as a launch is)."""
        if op is None:
            return None
        if self.launch_per_group:
            op = op + self.group_launch(name)
        ps = self.in_sequence_ps.get(name)
        return op + OpCost(f"{name}_in_sequence", ps, 0, 0, 0, 0, 0, 0, ps) if ps is not None else op


def _tile_sim():
    from chipsim.tilesim import tile_sim  # imported by the runs that time operations cycle by cycle

    return tile_sim
