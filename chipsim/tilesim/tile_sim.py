"""A cycle-level model of one operation on the compute chiplet's vector arrays: the operand path, the tile loop,
the SFU pipelines and the elementwise lanes (chipsim.hw.compute_formula uses it under `compute.timing: cycle-level`).

An operation is split over the A arrays by output rows and runs on all of them at once; the model follows one
array's share (the largest), tile by tile:

- its operands (weights, or the KV cache) stream from HBM over UCIe in read requests of `request_bytes`, at
  most `outstanding_requests_per_array` in flight; a request's data arrives `memory_latency_ns` after its issue
  and no sooner than the array's share of the stream bandwidth allows after the previous one (B / A), so the
  rate obeys Little's law: min(B / A, outstanding x request / latency);
- tiles of `tile_bytes` land in SRAM, `tile_buffers` of them (2, double-buffered: tile j's requests issue only
  once tile j-2 has been consumed; 1: once tile j-1 has);
- a tile is computed once all its bytes are in, after the previous tile: max(its MACs / the array's lanes, its
  bytes / the SRAM read width per cycle) cycles;
- the operation pays `issue_cycles` (issue, pipeline fill and drain) before and `sync_cycles` (the arrays
  meeting, results written back) after;
- special functions (exp, rsqrt, SiLU) run on each array's SFUs, their inputs read from SRAM and results written
  back, then drain a pipeline of `sfu_pipeline_cycles`; elementwise work (residual add, scaling, dequantisation)
  runs on the lanes at the pace of the lanes or the SRAM read width, or, with operands in HBM (an embedding row),
  through the tile loop.

A GPU's SMs get a matrix-vector operation as programs (CTAs) of `rows_per_program` weight rows each, not as an
even split (rows_per_program 0, an accelerator's arrays): the busiest array runs ceil(programs / arrays) of
them, at most `programs_per_array` at once (occupancy), a new one starting as one ends, each with its own
tiles, so the bytes in flight follow from how many programs an array holds.

Times are integer picoseconds of the array clock; the result carries the action counts the energy ledger prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ChipletParams:
    arrays: int
    units_per_array: int  # vector units (rows x columns)
    vector_length: int  # MAC lanes per unit
    clock_mhz: float
    sfus_per_array: int
    sfu_ops_per_cycle: int
    sram_read_bytes_per_cycle: int  # per array: banks x bank width
    tile_bytes: int  # one operand tile (tile_buffers of them fit in SRAM)
    request_bytes: int  # one read request over UCIe to HBM
    outstanding_requests_per_array: int
    memory_gbps: float  # operand stream bandwidth shared by all arrays (min of HBM's and UCIe's)
    memory_latency_ns: float  # one request, issue to data (HBM read latency + UCIe both ways)
    issue_cycles: int = 0
    sync_cycles: int = 0
    sfu_pipeline_cycles: int = 0
    tile_buffers: int = 2  # operand tiles an array (or program) holds: 2 double-buffered, 1 load-then-compute
    rows_per_program: int = 0  # GPU mapping: weight rows per program (CTA); 0: rows split evenly over the arrays
    programs_per_array: int = 0  # GPU mapping: programs resident on one array at once (0: no limit)

    @property
    def cycle_ps(self) -> float:
        return 1e6 / self.clock_mhz

    @property
    def lanes_per_array(self) -> int:
        return self.units_per_array * self.vector_length


@dataclass(frozen=True)
class OpResult:
    ps: int  # the operation's time
    stream_ps: int  # of it, the tile loop (first request to last tile computed)
    macs: int
    sfu_ops: int
    hbm_bytes: int
    sram_write_bytes: int
    sram_read_bytes: int
    compute_cycles: int  # one array's cycles doing MACs (the rest of its time it waits or is gated)
    tiles: int
    requests: int


def _tile_loop(p: ChipletParams, nbytes: int, macs_per_byte: float, buffers: int = 0,
               sharing_arrays: int = 0) -> tuple[float, int, int, int]:
    """One array streaming `nbytes` of operands tile by tile: (ps from the first request to the last tile's end,
    compute cycles, tiles, requests). buffers (default p.tile_buffers): tiles in SRAM at once; sharing_arrays
    (default all): the arrays streaming at once, which share the memory's bandwidth."""
    if nbytes <= 0:
        return 0.0, 0, 0, 0
    buffers = buffers or p.tile_buffers
    cycle = p.cycle_ps
    per_request_ps = p.request_bytes / (p.memory_gbps / (sharing_arrays or p.arrays)) * 1e3  # at the array's share
    latency = p.memory_latency_ns * 1e3
    tiles = math.ceil(nbytes / p.tile_bytes)
    reqs_per_tile = math.ceil(p.tile_bytes / p.request_bytes)
    arrivals: list[float] = []  # every request's data arrival
    tile_end: list[float] = []
    last_arrival = 0.0
    compute_cycles = 0
    for j in range(tiles):
        size = min(p.tile_bytes, nbytes - j * p.tile_bytes)
        n_req = min(reqs_per_tile, math.ceil(size / p.request_bytes))
        buffer_free = tile_end[j - buffers] if j >= buffers else 0.0
        for _ in range(n_req):
            k = len(arrivals)
            tag_free = arrivals[k - p.outstanding_requests_per_array] if k >= p.outstanding_requests_per_array else 0.0
            issue = max(buffer_free, tag_free)
            last_arrival = max(issue + latency, last_arrival + per_request_ps)
            arrivals.append(last_arrival)
        cycles = max(math.ceil(size * macs_per_byte / p.lanes_per_array), math.ceil(size / p.sram_read_bytes_per_cycle))
        compute_cycles += cycles
        start = max(last_arrival, tile_end[j - 1] if j else 0.0)
        tile_end.append(start + cycles * cycle)
    return tile_end[-1], compute_cycles, tiles, len(arrivals)


def matvec(p: ChipletParams, reduction: int, outputs: int, bytes_per_weight: float, groups: int = 1,
           tokens: int = 1) -> OpResult:
    """outputs dot products of length `reduction` against a weight matrix streamed from HBM, split over the
    arrays by output rows; `groups` outputs share each weight row (GQA heads on one KV entry), so the matrix has
    outputs / groups rows. With `tokens` > 1 a matrix-matrix product (prefill): each weight tile, streamed once,
    is used by every token while it sits in SRAM, so a tile costs `tokens` times the MACs (a weight read from SRAM
    feeds the lanes of all tokens: weight-stationary within a tile) and the loop turns compute-bound as tokens
    grow. tokens 1 is the batch-1 GEMV of decode, unchanged."""
    total_bytes = math.ceil(outputs * reduction * bytes_per_weight)
    macs_per_byte = tokens / bytes_per_weight
    if p.rows_per_program:
        loop_ps, cycles, tiles, requests = _programs(p, math.ceil(outputs / groups), total_bytes, macs_per_byte)
    else:
        per_array_outputs = math.ceil(outputs / p.arrays)
        nbytes = math.ceil(per_array_outputs * reduction * bytes_per_weight)
        loop_ps, cycles, tiles, requests = _tile_loop(p, nbytes, macs_per_byte)
    fixed = (p.issue_cycles + p.sync_cycles) * p.cycle_ps
    return OpResult(ps=math.ceil(loop_ps + fixed), stream_ps=math.ceil(loop_ps), macs=tokens * outputs * reduction,
                    sfu_ops=0, hbm_bytes=total_bytes, sram_write_bytes=total_bytes, sram_read_bytes=total_bytes,
                    compute_cycles=cycles, tiles=tiles, requests=requests)


def _programs(p: ChipletParams, rows: int, total_bytes: int, macs_per_byte: float) -> tuple[float, int, int, int]:
    """The busiest array's programs as one stream: `programs_per_array` of them resident at once, each with its
    own tiles, a new one starting as one ends; resident programs run out of step, so each one's tiles are
    buffers of the array's stream (tile j loads once tile j - resident x tile_buffers is consumed). As
    _tile_loop returns."""
    programs = math.ceil(rows / p.rows_per_program)
    program_bytes = math.ceil(total_bytes * min(p.rows_per_program, rows) / rows)
    on_array = math.ceil(programs / p.arrays)
    resident = min(on_array, p.programs_per_array or on_array)
    return _tile_loop(p, on_array * program_bytes, macs_per_byte, buffers=resident * p.tile_buffers,
                      sharing_arrays=min(p.arrays, programs))


def sfu(p: ChipletParams, ops: int, operand_bytes: int = 2) -> OpResult:
    """`ops` special-function operations (exp, rsqrt, SiLU, sigmoid) split over the arrays: each array's SFUs
    take its share at `sfu_ops_per_cycle` each, reading one `operand_bytes` input from SRAM and writing one
    result back per operation (no faster than the SRAM read width), then drain their pipeline of
    `sfu_pipeline_cycles`."""
    if ops <= 0:
        return OpResult(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    per_array = math.ceil(ops / p.arrays)
    cycles = max(math.ceil(per_array / (p.sfus_per_array * p.sfu_ops_per_cycle)),
                 math.ceil(per_array * operand_bytes / p.sram_read_bytes_per_cycle)) + p.sfu_pipeline_cycles
    ps = math.ceil((cycles + p.issue_cycles + p.sync_cycles) * p.cycle_ps)
    return OpResult(ps=ps, stream_ps=0, macs=0, sfu_ops=ops, hbm_bytes=0, sram_write_bytes=ops * operand_bytes,
                    sram_read_bytes=ops * operand_bytes, compute_cycles=cycles, tiles=0, requests=0)


def elementwise(p: ChipletParams, lane_ops: int, read_bytes: int = 0, operand_bytes: int = 2) -> OpResult:
    """`lane_ops` elementwise operations on the vector lanes (residual add, scaling, dequantisation), split over
    the arrays. Operands already in SRAM (read_bytes 0) are read at the SRAM width, `operand_bytes` per
    operation; operands streamed from HBM (an embedding row) go through the tile loop like a matrix-vector
    operation's weights."""
    if lane_ops <= 0 and read_bytes <= 0:
        return OpResult(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    fixed_ps = (p.issue_cycles + p.sync_cycles) * p.cycle_ps
    if read_bytes:
        loop_ps, cycles, tiles, requests = _tile_loop(p, math.ceil(read_bytes / p.arrays), lane_ops / read_bytes)
        return OpResult(ps=math.ceil(loop_ps + fixed_ps), stream_ps=math.ceil(loop_ps), macs=0, sfu_ops=0,
                        hbm_bytes=read_bytes, sram_write_bytes=read_bytes, sram_read_bytes=read_bytes,
                        compute_cycles=cycles, tiles=tiles, requests=requests)
    per_array = math.ceil(lane_ops / p.arrays)
    cycles = max(math.ceil(per_array / p.lanes_per_array), math.ceil(per_array * operand_bytes / p.sram_read_bytes_per_cycle))
    return OpResult(ps=math.ceil(cycles * p.cycle_ps + fixed_ps), stream_ps=0, macs=0, sfu_ops=0, hbm_bytes=0,
                    sram_write_bytes=lane_ops * operand_bytes, sram_read_bytes=lane_ops * operand_bytes,
                    compute_cycles=cycles, tiles=0, requests=0)
