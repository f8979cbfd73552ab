"""Typed configuration: the dataclasses below *are* the schema of a hardware/run YAML file.

Every field carries its unit in its name and a one-line description; `load_config` checks a YAML file
against them (unknown key, missing key, wrong type, non-positive size or bandwidth), resolves `base:`
inheritance, applies `--set dotted.key=value` overrides with the same checks, and returns a `Config`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import typing
from dataclasses import dataclass, field

import yaml

from chipsim.errors import InputError
from chipsim.files import YAML_MAX_BYTES, check_input, read_input_text
from chipsim.hw.expert_formats import FORMATS, resolve_format
from chipsim.hw.machine import check_roles, roles
from chipsim.values import Bounds, YamlLimitError, check_value, key_doc, yaml_load


def spec(doc: str, *, minimum: float | None = None, maximum: float | None = None, positive: bool = False,
         choices: tuple | None = None):
    """Field metadata: what the key means and which values are allowed (checked by chipsim.values). Every
    number has a physical upper bound (and a lower one where zero or a tiny value is meaningless), far
    beyond any real chip, so that what the simulator derives from it (integer picoseconds, bytes per
    second) always fits."""
    if positive and minimum is None:
        bounds = Bounds(minimum=0, maximum=maximum, min_exclusive=True, choices=choices)
    else:
        bounds = Bounds(minimum=minimum, maximum=maximum, choices=choices)
    return {"doc": doc, "bounds": bounds}


def _f(doc: str, **kw):
    return field(metadata=spec(doc, **kw))


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _components(doc: str, kind: str):
    """A section of named components (`memory.<name>` or `links.<name>`), any names the config chooses."""
    return field(metadata={**spec(doc), "components": kind})


# names of memories and links: they name resources, ledger entries and result columns
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _optional(doc: str, default, **kw):
    """A key that may be left out of a config (older configs and platforms that have no use for it)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=spec(doc, **kw))
    return field(default=default, metadata=spec(doc, **kw))


# ---------------------------------------------------------------------------------------------- compute
# a decode step's op groups (chipsim.workload.decode.op_group_builders), as compute.in_sequence_ns names them
OP_GROUPS = ("attention", "attention_sliding", "mamba", "dense", "router", "shared", "expert", "combine", "head")


@dataclass(frozen=True)
class ComputeConfig:
    arrays: int = _f("number of vector processing arrays", positive=True, maximum=4096)
    unit_rows: int = _f("vector units per array, rows of the grid", positive=True, maximum=4096)
    unit_cols: int = _f("vector units per array, columns of the grid", positive=True, maximum=4096)
    vector_length: int = _f("MAC lanes per vector unit (elements reduced per cycle)", positive=True, maximum=65536)
    clock_mhz: float = _f("array clock, MHz", positive=True, minimum=1.0, maximum=1e5)
    sfus_per_array: int = _f("special-function units per array (exp, rsqrt, SiLU, ...)", positive=True, maximum=65536)
    sfu_ops_per_cycle: int = _f("operations one SFU finishes per cycle", positive=True, maximum=65536)
    op_overhead_cycles: int = _f("fixed cycles per operation: issue, pipeline fill and drain", minimum=0, maximum=1e9)
    sram_mib_per_array: float = _f("SRAM per array, MiB", positive=True, maximum=1e6)
    sram_access_ns: float = _f("SRAM access latency, ns (first operand of an op)", minimum=0, maximum=1e6)
    mac_energy_pj: float = _f("energy of one multiply-accumulate at the compute precision (BF16 x BF16 + FP32), pJ",
                              minimum=0, maximum=1e6)
    sram_read_pj_per_bit: float = _f("energy per bit read from an array's SRAM, pJ", minimum=0, maximum=1e6)
    sram_write_pj_per_bit: float = _f("energy per bit written into an array's SRAM, pJ", minimum=0, maximum=1e6)
    sfu_op_energy_pj: float = _f("energy of one special-function operation (exp, rsqrt, SiLU), pJ", minimum=0,
                                 maximum=1e6)
    vector_op_energy_pj: float = _f("energy of one elementwise lane operation (add, scale, dequantise), pJ",
                                    minimum=0, maximum=1e6)
    clock_power_w_per_array: float = _f("clock tree and control power of one array while it runs, W", minimum=0,
                                        maximum=1e6)
    clock_gated_when_idle: bool = _f("true: the arrays' clocks stop while they wait (no clock power then)")
    leakage_power_w_per_array: float = _f("static (leakage) power of one array with its SRAM, drawn for the whole "
                                          "decode time, W", minimum=0, maximum=1e5)
    dequant_ops_per_weight: int = _f("vector-lane operations to dequantise one sub-16-bit weight to BF16",
                                     positive=True, maximum=1e4)
    op_group_launch_ns: float = _optional(
        "fixed time to start one op group (attention, router, one expert, ...): a CUDA-graph launch on a GPU; "
        "0 for an accelerator that sequences its own groups", 0.0, minimum=0, maximum=1e9)
    launch_per: str = _optional(
        "what pays one op_group_launch_ns: op_group (every op group is launched on its own: a CUDA graph per group) "
        "or segment (each run of op groups between two synchronisations with the DMA engines is one launch: a "
        "transfer issued, the first use of a fetched expert, a token's end)", "op_group", choices=("op_group", "segment"))
    copy_wait_ns: float = _optional(
        "time the arrays take to resume after they stalled for a fetch, from its last byte landing to the next "
        "operation starting: the hand-off from a copy engine to compute (a cross-stream event wait on a GPU, "
        "validation/compute/probe_handoff.py); 0 where compute starts the moment the bytes land", 0.0, minimum=0,
        maximum=1e9)
    launch_beside_copy_ns: float = _optional(
        "what one launch (where op_group_launch_ns is charged: an op group, or a segment) adds while a copy is in "
        "flight on the expert path: a GPU's front end serving the copy stream beside the compute stream "
        "(validation/compute/probe_step_costs.py); 0 where launches cost the same beside copies", 0.0, minimum=0,
        maximum=1e9)
    in_sequence_ns: dict = _optional(
        "measured time a decode step's op group adds run back to back after other groups' kernels, over its kernels "
        "each timed alone (op_times_ns: a kernel repeated on its own), ns, keyed by op group (" + ", ".join(OP_GROUPS)
        + "; validation/compute/probe_step_costs.py: a step kind's chain less its kernels alone); charged with each "
        "group of a batch-1 decode step as a launch is (time, no operation or byte); empty: none", {})
    op_times_ns: dict = _optional(
        "measured duration of individual operations, ns, keyed as chipsim.hw.compute_formula.op_key names them "
        "(e.g. 'matvec r2048 o1024 b4194304'); an operation listed here takes that time instead of the "
        "array model's estimate (profiled-operator mode, as in Vidur), 0 where it runs inside another's kernel "
        "(a dequantisation fused into its matvecs); empty: the array model throughout", {})
    op_energy_pj: dict = _optional(
        "measured dynamic energy of one launch of an operation alone (above the board's idle power), pJ, keyed as "
        "op_times_ns (validation/energy/probe_op_energy.py); an operation listed here is charged this instead of "
        "its MACs, SFU and lane operations, operand bits and clock power (ledger entry arrays_profiled); empty: the "
        "energy table's per-action prices throughout", {})
    clock_power_by_occupancy: bool = _optional(
        "true: an operation draws clock power only on the share of the arrays it occupies (one smaller than a pass "
        "of the whole chip leaves some idle); false: every array while any runs. Needs clock_gated_when_idle",
        False)
    sram_read_gbps_per_array: float = _optional("operand bandwidth of one array's SRAM, GB/s (read by experts "
                                                "staged in SRAM; 0: not given)", 0.0, minimum=0, maximum=1e7)

    @property
    def sram_read_gbps(self) -> float:
        """All arrays' SRAM read bandwidth, GB/s: what experts staged there are read at (and share with fetches)."""
        return self.sram_read_gbps_per_array * self.arrays
    timing: str = _optional("how an operation's time is found: analytic (max of tiling cycles and bytes over the "
                            "stream bandwidth, plus fixed latency) or cycle-level (chipsim/tilesim/tile_sim.py: "
                            "matrix-vector operations by the tile loop with requests in flight and double-buffered "
                            "SRAM tiles, special functions by the SFU pipelines, elementwise work by the lanes)", "analytic", choices=("analytic", "cycle-level"))
    sram_read_bytes_per_cycle_per_array: int = _optional("cycle-level: bytes one array reads from its SRAM per "
                                                         "cycle (banks x bank width)", 0, minimum=0, maximum=1 << 30)
    operand_tile_kib: float = _optional("cycle-level: one operand tile in SRAM, KiB (two per array: double-buffered)",
                                        0.0, minimum=0, maximum=1 << 20)
    hbm_request_bytes: int = _optional("cycle-level: bytes of one operand read request to HBM over UCIe", 0,
                                       minimum=0, maximum=1 << 20)
    outstanding_requests_per_array: int = _optional("cycle-level: operand read requests one array keeps in flight",
                                                    0, minimum=0, maximum=1 << 24)
    array_sync_cycles: int = _optional("cycle-level: cycles the arrays take to meet at the end of an operation", 0,
                                       minimum=0, maximum=1e9)
    sfu_pipeline_cycles: int = _optional("cycle-level: depth of an SFU pipeline, drained at the end of every "
                                         "special-function operation", 0, minimum=0, maximum=1e9)
    operand_tile_buffers: int = _optional("cycle-level: operand tiles an array holds (2: double-buffered, the next "
                                          "tile loads while this one computes; 1: it loads after)", 2,
                                          choices=(1, 2))
    rows_per_program: int = _optional("cycle-level, GPU mapping: weight rows one program (CTA) of a "
                                      "matrix-vector kernel computes; 0: an operation's rows split evenly over "
                                      "the arrays (an accelerator)", 0, minimum=0, maximum=1 << 24)
    programs_per_array: int = _optional("cycle-level, GPU mapping: programs resident on one array at once "
                                        "(occupancy: registers, threads); 0: no limit", 0, minimum=0,
                                        maximum=1 << 16)


# ---------------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class DramConfig:
    kind = "dram"  # not a field (FlashConfig.kind)

    capacity_gib: float = _f("capacity, GiB (1 GiB = 2^30 B)", positive=True, maximum=1e6)
    channels: int = _f("independent channels", positive=True, maximum=4096)
    channel_width_bits: int = _f("data bits per channel", positive=True, maximum=65536)
    data_rate_mtps: float = _f("data rate per pin, MT/s", positive=True, minimum=1.0, maximum=1e6)
    banks_per_channel: int = _f("banks per channel that can be interleaved", positive=True, maximum=65536)
    page_bytes: int = _f("row (page) size per channel, bytes", positive=True, maximum=1 << 30)
    burst_length: int = _f("burst length, beats", positive=True, maximum=4096)
    tcl_ns: float = _f("read latency CL / RL, ns", positive=True, maximum=1e6)
    trcd_ns: float = _f("activate-to-read delay tRCD, ns", positive=True, maximum=1e6)
    trp_ns: float = _f("precharge time tRP, ns", positive=True, maximum=1e6)
    tras_ns: float = _f("minimum row-open time tRAS, ns", positive=True, maximum=1e6)
    tfaw_ns: float = _f("four-activate window tFAW, ns", positive=True, maximum=1e6)
    trfc_ns: float = _f("refresh cycle time tRFC (all-bank), ns", positive=True, maximum=1e6)
    trefi_ns: float = _f("refresh interval tREFI, ns", positive=True, maximum=1e9)
    trtw_ns: float = _f("read-to-write turnaround on a channel (last read command to first write), ns",
                        minimum=0, maximum=1e6)
    twtr_ns: float = _f("write-to-read turnaround on a channel (write latency + burst + tWTR), ns",
                        minimum=0, maximum=1e6)
    write_drain_bursts: int = _f("writes the controller drains per switch from reads to writes "
                                 "(its write-queue watermarks)", positive=True, maximum=1 << 20)
    energy_pj_per_bit: float = _f("access energy, pJ per bit read or written", minimum=0, maximum=1e6)
    background_power_w: float = _f("static power (background, refresh) drawn for the whole decode time, W",
                                   minimum=0, maximum=1e6)
    standard: str = _optional("DRAM standard of the command-level model: a built-in one (ddr4, ddr5, gddr6, gddr7, hbm2, hbm3, lpddr5; "
                              "chipsim/dramsim/standards/) or a standard YAML file (a value with a / or ending .yaml), "
                              "relative to the config file that names it (with --set: to the current folder); "
                              "empty: none", "")
    organization: str = _optional("organisation preset of the standard (empty: its first)", "")
    timing_preset: str = _optional("timing preset of the standard (empty: its first); re-timed to data_rate_mtps "
                                   "and the ns keys above", "")
    timing_model: str = _optional("where efficiency, read/write turnaround and access latency come from: "
                                  "closed-form (chipsim/hw/dram_formula.py, from the keys above) or command-level (the "
                                  "standard's command-level model, computed once and cached)", "closed-form",
                                  choices=("closed-form", "command-level"))
    read_queue_entries: int = _optional("command-level: entries of each channel controller's read queue (how far "
                                        "ahead it sees the rows to open; default 64, a production controller's: the "
                                        "64-entry read CAM of Synopsys uMCTL2-family controllers, AMD UG1087 SCHED)",
                                        64, positive=True, maximum=4096)
    write_queue_entries: int = _optional("command-level: entries of each channel controller's write queue (default "
                                         "64: uMCTL2-family controllers, up to 64 reads plus 64 writes, Microchip "
                                         "IGLOO2 DDR controller)", 64, positive=True, maximum=4096)
    write_high_watermark: float = _optional("command-level: the controller turns to draining writes once its write "
                                            "queue is fuller than this share (Ramulator 2.1's default: 0.8)", 0.8,
                                            minimum=0.0, maximum=1.0)
    write_low_watermark: float = _optional("command-level: and back to reads (if any wait) once it is emptier than "
                                           "this share (Ramulator 2.1's default: 0.2)", 0.2, minimum=0.0, maximum=1.0)
    address_mapping: str = _optional("command-level: how the controller splits an address into channel, levels, row "
                                     "and column: a preset (interleaved, RoBaRaCoCh, MOP4CL: "
                                     "chipsim/dramsim/mapping.py) or a comma-separated field order from the least "
                                     "significant", "interleaved")
    address_xor: str = _optional("command-level: levels (comma-separated, e.g. bankgroup,bank; banks: every level "
                                 "below the data level; none) whose index the controller XORs with the row's bits: "
                                 "production controllers hash the bank bits (Intel: Pessl et al., DRAMA, 2016; NVIDIA "
                                 "GPUs: Jain et al., Fractional GPUs, 2019)", "banks")


@dataclass(frozen=True)
class FlashConfig:
    """A flash device (UFS, NVMe) that stores experts; its long-read rate and first byte are chipsim/hw/flash.py's.
    Told from a DRAM by its keys (memory_class); it may only be the expert store (chipsim.hw.machine)."""

    kind = "flash"  # not a field: what roles read to keep a flash device out of every role but the expert store

    capacity_gib: float = _f("capacity, GiB (1 GiB = 2^30 B)", positive=True, maximum=1e6)
    interface_gbps: float = _f("the host interface's data rate after line encoding, GB/s (1e9 B/s; UFS: lanes x "
                               "gear rate x 8/10 / 8)", positive=True, minimum=1e-3, maximum=1e6)
    internal_gbps: float = _f("what the NAND side delivers to the controller, GB/s: channels x each channel's rate",
                              positive=True, minimum=1e-3, maximum=1e6)
    page_read_us: float = _f("page read time tR (NAND array to the page buffer), us", positive=True, maximum=1e5)
    page_bytes: int = _f("NAND page size, bytes", minimum=512, maximum=1 << 20)
    io_bytes: int = _f("size of each read command the host issues for a fetch, bytes (a whole number of pages)",
                       positive=True, maximum=1 << 30)
    queue_depth: int = _f("read commands the host keeps in flight during a fetch", positive=True, maximum=1 << 16)
    command_overhead_us: float = _f("host driver + device controller time per command, us", minimum=0,
                                    maximum=1e6)
    read_energy_pj_per_bit: float = _f("energy per bit read (the device's active read power / its read rate), pJ",
                                       minimum=0, maximum=1e6)
    idle_power_w: float = _f("the device's power while it is not reading, drawn for the whole decode time, W",
                             minimum=0, maximum=1e6)


# ---------------------------------------------------------------------------------------------- links
@dataclass(frozen=True)
class PcieConfig:
    bandwidth_gbps: float = _f("link bandwidth per direction after encoding / FLIT overhead, GB/s (1e9 B/s); "
                               "both directions = 2x", positive=True, minimum=1e-3, maximum=1e6)
    max_payload_bytes: int = _f("data bytes per TLP (max payload / read completion size)", positive=True,
                                maximum=4096)
    tlp_overhead_bytes: int = _f("bytes each TLP adds to its payload on the link (header, digest, framing)",
                                 minimum=0, maximum=4096)
    latency_ns: float = _f("one-way DMA read latency through the link, ns", minimum=0, maximum=1e9)
    energy_pj_per_bit: float = _f("energy per bit on the link's wire (a PHY's figure: encoding, headers and "
                                  "framing included; a data bit costs this x the wire bytes per data byte), pJ",
                                  minimum=0, maximum=1e6)
    static_power_w: float = _f("static power of the link's PHYs (both ends, link up), W", minimum=0, maximum=1e6)
    timing_model: str = _optional("where the data rate comes from: fixed (bandwidth_gbps x payload / (payload + "
                                  "TLP overhead)) or link-layer (chipsim/hw/pcie_link: completions, framing, Acks, "
                                  "SKP or FLIT packing, and reads in flight: read_tags x max_read_request_bytes "
                                  "over latency_ns)", "fixed", choices=("fixed", "link-layer"))
    encoding: str = _optional("link-layer: the physical encoding, 128b/130b (PCIe 3.0-5.0) or flit (PCIe 6.0 "
                              "FLIT mode: 236 TLP bytes per 256)", "", choices=("", "128b/130b", "flit"))
    max_read_request_bytes: int = _optional("link-layer: largest read request (MRRS), bytes", 0, minimum=0,
                                            maximum=4096)
    read_tags: int = _optional("link-layer: reads the requester keeps in flight (its tags, or the completer's "
                               "non-posted credits if fewer)", 0, minimum=0, maximum=1 << 16)
    read_completion_bytes: int = _optional("link-layer: the size the completer returns a read's data in (a multiple of "
                                           "its 64 or 128 B read completion boundary, at most max_payload_bytes; "
                                           "0: max_payload_bytes)", 0, minimum=0, maximum=4096)
    requests_per_fc_update: int = _optional("link-layer, 128b/130b: read requests per UpdateFC DLLP the completer "
                                            "sends back in the data direction (returning their non-posted "
                                            "credits; 1: one each)", 1, positive=True, maximum=1 << 16)

    @property
    def data_gbps(self) -> float:
        """Data bandwidth per direction: bandwidth_gbps × payload / (payload + TLP overhead), or the link layer's
        sustained read rate."""
        if self.timing_model == "link-layer":
            from chipsim.hw.pcie_link import params_from_config, usable_gbps
            return usable_gbps(params_from_config(self))
        return self.bandwidth_gbps * self.max_payload_bytes / (self.max_payload_bytes + self.tlp_overhead_bytes)

    @property
    def wire_bytes_per_data_byte(self) -> float:
        """What crosses the wire per data byte, which energy_pj_per_bit is charged on: the link layer's every byte
        (encoding, FLITs or framing, headers, DLLPs), or fixed: payload + TLP overhead (bandwidth_gbps is after
        encoding)."""
        if self.timing_model == "link-layer":
            from chipsim.hw.pcie_link import params_from_config, wire_bytes_per_data_byte
            return wire_bytes_per_data_byte(params_from_config(self))
        return (self.max_payload_bytes + self.tlp_overhead_bytes) / self.max_payload_bytes


UCIE_FLIT_EFFICIENCY = {"raw": 1.0, "68B": 64 / 68, "256B": 236 / 256}  # UCIe 1.1 sections 3.3.1-3.3.3


@dataclass(frozen=True)
class UcieConfig:
    modules: int = _f("UCIe modules between the chiplets on each path", positive=True, maximum=4096)
    lanes_per_module: int = _f("data lanes per module", positive=True, maximum=4096)
    gtps: float = _f("transfer rate per lane, GT/s", positive=True, minimum=1e-3, maximum=1e4)
    latency_ns: float = _f("crossing latency, ns", minimum=0, maximum=1e9)
    energy_pj_per_bit: float = _f("energy per bit crossing the wire (flit headers and CRC included), pJ", minimum=0,
                                  maximum=1e6)
    static_power_w: float = _f("static power of all the package's UCIe modules, W", minimum=0, maximum=1e6)
    flit_format: str = _optional("what the die-to-die adapter wraps the data in (UCIe 1.1 ch. 3): raw (every byte "
                                 "the protocol's), 68B (2 B flit header + 64 B + 2 B CRC) or 256B (the standard "
                                 "256 B flit of PCIe/CXL flit mode: 236 TLP bytes)", "raw",
                                 choices=tuple(UCIE_FLIT_EFFICIENCY))

    @property
    def bandwidth_gbps(self) -> float:
        """Per direction on the wire: modules × lanes × GT/s / 8 bits."""
        return self.modules * self.lanes_per_module * self.gtps / 8.0

    @property
    def data_gbps(self) -> float:
        """Per direction, of data: the wire rate × the flit format's data bytes per flit byte."""
        return self.bandwidth_gbps * UCIE_FLIT_EFFICIENCY[self.flit_format]

    @property
    def wire_bytes_per_data_byte(self) -> float:
        """Flit bytes per data byte, which energy_pj_per_bit is charged on."""
        return 1 / UCIE_FLIT_EFFICIENCY[self.flit_format]


@dataclass(frozen=True)
class DmaConfig:
    engines: int = _f("DMA engines (transfers in flight at once)", positive=True, maximum=64)
    setup_ns: float = _f("fixed per-descriptor cost (driver, IOMMU) before data moves, ns", minimum=0, maximum=1e9)
    chunk_kib: float = _f("transfer chunk: an in-flight prefetch yields to a demand fetch at chunk boundaries, KiB",
                          positive=True, minimum=1 / 1024, maximum=1 << 20)
    demand_preempts_prefetch: bool = _f("true: moving prefetches pause at their next chunk boundary while a demand "
                                        "fetch waits or moves; false: demand only goes ahead of queued prefetches")
    demand_first: bool = _f("true: a demand fetch goes ahead of queued prefetches; false: one FIFO queue in issue "
                            "order (a CUDA copy stream)")
    cancel_in_flight: bool = _f("true: an evicted expert's transfer stops at its next chunk boundary (a queued one never "
                                "starts); false: every issued transfer moves all its bytes (an enqueued CUDA copy)")


@dataclass(frozen=True)
class HostCpuConfig:
    cores: int = _f("host CPU cores that run offloaded experts together", positive=True, maximum=1e5)
    clock_ghz: float = _f("core clock, GHz", positive=True, minimum=1e-3, maximum=100.0)
    flops_per_cycle_per_core: int = _f("peak FP32 FLOP per cycle per core (FMA = 2)", positive=True, maximum=1e5)
    memory_bandwidth_gbps: float = _f("bandwidth the CPU cluster reaches reading expert weights from LPDDR5X, GB/s",
                                      positive=True, minimum=1e-3, maximum=1e6)
    dispatch_overhead_ns: float = _f("fixed cost to hand one expert to the CPU and collect its result, ns",
                                     minimum=0, maximum=1e9)
    active_power_w: float = _f("CPU cluster power while computing an expert, W", minimum=0, maximum=1e5)


@dataclass(frozen=True)
class HostFrontendConfig:
    """What the software driving the machine from one host thread pays beside the hardware's own work (issue #44),
    each cost measured alone by python -m chipsim.hwreplay.host_frontend. Left out, the host is always ahead: it
    knows each layer's routing as the router ends and copies experts from pinned memory (the replays' programs)."""

    routing: str = _optional("where the fetches and host jobs a layer's routing needs are decided: device (as the "
                             "router ends: a plan known ahead, or a decision on the device) or host (the host reads "
                             "the routing back, then enqueues them and the layer's remaining work: PyTorch "
                             "offloading code's .tolist())", "device", choices=("device", "host"))
    routing_readback_ns: float = _optional("routing: host: the machine idle from a layer's routing being ready to the "
                                           "first work the host enqueues after reading it back, ns", 0.0,
                                           minimum=0, maximum=1e9)
    expert_memory: str = _optional("the host memory experts are copied from: pinned (page-locked: the copy engine "
                                   "reads it at the link's rate while the host goes on) or pageable (the driver "
                                   "stages each copy through a pinned buffer while the calling host thread waits: "
                                   "work the program enqueues after the copy starts no earlier than its end)",
                                   "pinned", choices=("pinned", "pageable"))
    pageable_bandwidth_gbps: float = _optional("expert_memory: pageable: a pageable host-to-device copy's rate (t = a "
                                               "+ N/B fitted over copy sizes), GB/s", 0.0, minimum=0, maximum=1e6)
    pageable_setup_ns: float = _optional("expert_memory: pageable: the fixed cost of each such copy (the fit's "
                                         "intercept, in place of dma.setup_ns), ns", 0.0, minimum=0, maximum=1e9)
    # the host's pace (chipsim.sim.host_pace): all three 0, the host enqueues faster than anything it enqueues runs
    launch_issue_ns: float = _optional("the host thread's time to enqueue one launch of compute (a CUDA graph: one op "
                                       "group, or one run of them between synchronisations with compute.launch_per: "
                                       "segment), ns; the machine starts no work before the host has enqueued it",
                                       0.0, minimum=0, maximum=1e9)
    copy_issue_ns: float = _optional("the host's time to enqueue one copy (each part of a transfer is one; a pageable "
                                     "copy's is inside pageable_setup_ns), ns", 0.0, minimum=0, maximum=1e9)
    event_issue_ns: float = _optional("the host's time per event it records or has a stream wait for (a transfer's "
                                      "issue point, the copy's wait for it and its end, the arrays' wait for a "
                                      "fetched expert, a token's end), ns", 0.0, minimum=0, maximum=1e9)
    launch_queue_depth: int = _optional("program steps (launches, copies, event records and waits) the host may "
                                        "enqueue ahead of the machine before its next call blocks: the launch "
                                        "queue's run-ahead; 0: no bound", 0, minimum=0, maximum=1 << 30)

    @property
    def paced(self) -> bool:
        """Whether the host's issue costs are modelled (any of them above 0)."""
        return self.launch_issue_ns > 0 or self.copy_issue_ns > 0 or self.event_issue_ns > 0


@dataclass(frozen=True)
class ExpertBufferConfig:
    capacity_mib: float = _f("space for staged expert weights, MiB", positive=True, maximum=1e9)
    location: str = _optional("where fetched experts are staged: hbm (written into HBM, read by the arrays over UCIe) "
                              "or sram (written over UCIe straight into the arrays' SRAM, read from there)", "hbm",
                              choices=("hbm", "sram"))


@dataclass(frozen=True)
class PathsConfig:
    fetch: list = _optional("what an expert fetch crosses, in order: the memory that stores the experts, then the "
                            "links to the package, ending with the operand link (the I/O die's link to where "
                            "expert_buffer.location stages them); default [lpddr5x, pcie, ucie]; the same as "
                            "roles.expert_store and roles.fetch_links, which a config gives instead", [])


@dataclass(frozen=True)
class RolesConfig:
    """Which component plays which part (chipsim.hw.machine); each key left out takes today's machine's name."""

    operand_memory: str = _optional("the memory holding the non-expert weights, KV cache and activations, which the "
                                    "compute units stream their operands from (default: hbm)", "")
    operand_link: str = _optional("the link the compute units read the operand memory over (default: ucie; none: "
                                  "they sit at its controller, as a SoC's GPU does)", "")
    expert_store: str = _optional("the memory that stores every expert (default: the first of paths.fetch, lpddr5x)",
                                  "")
    fetch_links: list = _optional("the links an expert fetch crosses from the store to where it is staged, in order "
                                  "(default: the rest of paths.fetch, [pcie, ucie])", [])
    expert_staging: str = _optional("where fetched experts land: the operand memory, or sram (the arrays' own; "
                                    "default: expert_buffer.location), or in-place: nothing is fetched, the compute "
                                    "units read every expert where it is stored (the operand memory: one unified "
                                    "memory)", "")
    host_memory: str = _optional("the memory the host CPU reads its copy of the experts from (default: lpddr5x)", "")
    host_link: str = _optional("the link activations cross to the host CPU and results back (default: pcie; none: "
                               "the host CPU shares the memory)", "")
    in_package: list = _optional("the memories and links inside the package, whose energy is on-chip (default: the "
                                 "operand memory and the operand link; none: only the compute units)", [])


# ---------------------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class ModelConfig:
    expert_bits: int = _f("expert weight precision, bits", choices=(4, 5, 8, 16, 32))
    quant_group_size: int = _f("weights sharing one scale below 16 bit", positive=True, maximum=1 << 30)
    quant_scale_bits: int = _f("bits per quantisation scale (and zero point) below 16 bit", positive=True, maximum=64)
    name: str = _optional("bundled model shape used for timing (see `chipsim models`); model.config or model.shape, "
                          "when given, is read instead", "")
    config: str = _optional("a Hugging Face config.json giving the model's shape (relative to the config file that "
                            "names it; with --set: to the current folder)", "")
    shape: dict = field(default_factory=dict, metadata={
        **spec("the model's shape inline: config.json fields (model_type, hidden_size, ...), read as "
               "chipsim.workload.hf_config reads a config.json"), "any_values": True})
    expert_format: str = _optional("the routed experts' weight format (chipsim.hw.expert_formats): when given, it "
                                   "decides model.expert_bits and, where the format fixes them, model.quant_group_size "
                                   "and model.quant_scale_bits (whatever the config says of them); left out: those "
                                   "keys as given", "", choices=tuple(FORMATS))
    dense_bits: int = _optional("every non-expert weight matrix's precision, bits (attention and Mamba2 projections, "
                                "dense FFNs, shared experts and their gate, router, embedding, LM head), with "
                                "model.quant_group_size and model.quant_scale_bits below 16 bit as the experts; "
                                "biases, norms, the KV cache and activations stay BF16", 16, choices=(4, 5, 8, 16))


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding as a step shape (issue #43): a draft proposes tokens, the model verifies them and the
    token after them in one step; each step yields the accepted drafts and one token of the model's own."""

    draft_tokens: int = _optional("tokens the draft proposes per step, verified with the step's own token in one pass "
                                  "(0: no speculation)", 0, minimum=0, maximum=64)
    draft: str = _optional("prompt-lookup: the tokens that followed the longest earlier match of the last `ngram` "
                           "tokens in the trace's text (Saxena 2023; acceptance measured from the trace's own next "
                           "tokens); rate: a draft model whose tokens are each accepted with probability `acceptance`",
                           "prompt-lookup", choices=("prompt-lookup", "rate"))
    ngram: int = _optional("prompt-lookup: the longest suffix matched (then shorter ones, down to 1 token)", 3,
                           minimum=1, maximum=64)
    # ASSUMPTION: no public acceptance rate for these models' drafts; swept in experiments/speculative_decode.yaml
    acceptance: float = _optional("rate: the probability each draft token is accepted, given the ones before were",
                                  0.7, minimum=0.0, maximum=1.0)
    # ASSUMPTION: a draft model's time depends on the model chosen; 0 leaves it out (prompt lookup takes microseconds)
    draft_ms_per_step: float = _optional("time a step waits for its draft before verifying (prompt lookup runs on the "
                                         "host in microseconds: 0; a draft model: its k forward passes)", 0.0,
                                         minimum=0.0, maximum=1e6)
    seed: int = _optional("rate: the seed of the acceptance draws", 0, minimum=0, maximum=(1 << 32) - 1)


@dataclass(frozen=True)
class ArrivalsConfig:
    """When a served run's requests arrive (workload.requests > 0): exactly one of a Poisson rate, a closed loop of
    users, or a file."""

    poisson_rps: float = _optional("requests arrive as a Poisson process of this rate, requests per second (each "
                                   "workload.prompt_tokens + workload.output_tokens)", 0.0, minimum=0.0, maximum=1e6)
    closed_users: int = _optional("a closed loop: this many users, each sending its next request think_ms after its "
                                  "last one finished (the first ones at time 0)", 0, minimum=0, maximum=1 << 16)
    think_ms: float = _optional("closed loop: each user's mean think time between a response and its next request "
                                "(exponentially distributed; 0: at once)", 0.0, minimum=0.0, maximum=1e9)
    file: str = _optional("a CSV of requests, one per line: arrival_ms,prompt_tokens,output_tokens (a header line "
                          "of those names; arrival times sorted, not negative), relative to the config file", "")
    seed: int = _optional("the seed of the Poisson and think-time draws", 0, minimum=0, maximum=(1 << 32) - 1)


@dataclass(frozen=True)
class SchedulerConfig:
    """What a served run puts in each step (chipsim.serve.scheduler)."""

    kind: str = _optional("static: FCFS batches of up to max_sequences, admitted only when the last batch has "
                          "finished; continuous: requests join and leave at every step, a step either prefills "
                          "or decodes (Orca, vLLM); chunked: every step decodes every running sequence and fills "
                          "the rest of max_step_tokens with prompt chunks (Sarathi-Serve)", "continuous",
                          choices=("static", "continuous", "chunked"))
    max_sequences: int = _optional("sequences admitted at once (each holds a KV cache and a window of the trace)",
                                   8, minimum=1, maximum=4096)
    max_step_tokens: int = _optional("tokens one step runs at most (prompt tokens and decode tokens together)",
                                     2048, minimum=1, maximum=1 << 20)
    kv_capacity_mib: float = _optional("KV-cache memory requests are admitted against (0: all of the operand memory "
                                       "left beside the weights, the expert buffer and the activations)", 0.0,
                                       minimum=0.0, maximum=1 << 30)


@dataclass(frozen=True)
class WorkloadConfig:
    trace: str = _f("routing trace file (.npz), relative to the config file that names it (with --set: to the "
                    "current folder)")
    context_length: int = _f("KV-cache length at every decode step, tokens", positive=True, maximum=1 << 24)
    max_tokens: int = _f("replay at most this many trace tokens (0 = all)", minimum=0, maximum=1 << 31)
    warmup_tokens: int = _f("leading tokens simulated but reported separately, not in the means",
                            minimum=0, maximum=1 << 31)
    # a whole request (issue #42): prefill of the prompt, then decode with a KV cache that grows
    prompt_tokens: int = _optional("tokens of a request's prompt, the trace's first tokens, read by prefill "
                                   "(0: decode only, every step at workload.context_length)", 0, minimum=0,
                                   maximum=1 << 20)
    output_tokens: int = _optional("tokens a request generates: the first by the prefill, each later one by a "
                                   "decode step attending over the prompt and the tokens before it (with "
                                   "workload.prompt_tokens)", 0, minimum=0, maximum=1 << 20)
    prefill_chunk_tokens: int = _optional("prompt tokens per prefill chunk (0: the whole prompt in one)", 0,
                                          minimum=0, maximum=1 << 20)
    # several sequences decoded together (issue #43)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig, metadata=spec(
        "speculative decoding: drafts verified with each step's token in one pass (draft_tokens 0: off)"))
    batch: int = _optional("sequences decoded together, one token of each per step, each reading its own window of "
                           "the trace (workload.max_tokens tokens; 0: the trace split evenly) and attending over its "
                           "own KV cache of workload.context_length tokens", 1, minimum=1, maximum=4096)
    batch_contexts: str = _optional("the contexts a batch's sequences attend over: same (every one at "
                                    "workload.context_length) or staggered (sequence b of B at context_length x (b + 1) "
                                    "/ B, rounded up: sequences that began at evenly spaced times)", "same",
                                    choices=("same", "staggered"))
    # many requests served (issue #43 item 2)
    requests: int = _optional("requests served, arriving by workload.arrivals and scheduled by workload.scheduler "
                              "(0: one request, or decode only)", 0, minimum=0, maximum=1 << 24)
    arrivals: ArrivalsConfig = field(default_factory=ArrivalsConfig, metadata=spec(
        "when a served run's requests arrive (workload.requests > 0)"))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata=spec(
        "what a served run puts in each step (workload.requests > 0)"))


@dataclass(frozen=True)
class RunConfig:
    policies: list = _f("policies `chipsim run` compares when no --policy is given")
    prefill_policy: str = _optional("the prefill policy a request runs before each decode policy that --policy "
                                    "names without one (PREFILL+DECODE names both, e.g. layer-ahead+apex)",
                                    "on-demand")
    engine: str = _optional("event engine: fast (the same events with less Python) or reference (the engine of "
                            "record, chipsim.sim.engine); both give identical results", "fast",
                            choices=("fast", "reference"))


@dataclass(frozen=True)
class HardwareConfig:
    compute: ComputeConfig = _f("compute chiplet")
    memory: dict = _components("the memories by name (e.g. hbm, lpddr5x, a CXL expander, a UFS device), each a DRAM "
                               "or a flash device (told apart by their keys: queue_depth, page_read_us, ... make a "
                               "flash device); an older config's memory.extra.<name> is read as memory.<name>",
                               "memory")
    links: dict = _components("the links by name (e.g. pcie, ucie): a serial PCIe-like link (bandwidth_gbps, TLPs) or "
                              "a die-to-die UCIe link (modules x lanes x GT/s); an older config's links.extra.<name> "
                              "is read as links.<name>", "links")
    dma: DmaConfig = _f("DMA engines")
    host_cpu: HostCpuConfig = _f("host CPU that can compute experts from its own copy (SPICE, Fiddler)")
    expert_buffer: ExpertBufferConfig = _f("expert staging buffer")
    model: ModelConfig = _f("model shape and expert precision")
    workload: WorkloadConfig = _f("what is replayed")
    run: RunConfig = _f("run defaults")
    host_frontend: HostFrontendConfig = field(default_factory=HostFrontendConfig,
                                              metadata=spec("the software's host thread: routing read back, pageable "
                                                            "copies (issue #44)"))
    paths: PathsConfig = field(default_factory=PathsConfig, metadata=spec("the routes bytes take through the chip"))
    roles: RolesConfig = field(default_factory=RolesConfig, metadata=spec("the part each component plays"))


@dataclass
class Config:
    """A validated configuration: typed hardware/workload sections plus raw policy parameters."""

    hw: HardwareConfig
    policies: dict  # policy name -> {param: value}; checked against each policy's declared parameters
    path: str  # absolute (what results record)
    raw: dict  # the fully resolved dict (after base and --set), for hashing and output
    given_path: str = ""  # as the user wrote it (what the run header prints)

    @property
    def trace_path(self) -> str:
        return _resolve_relative(self.hw.workload.trace, self.path)

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- loading
def _resolve_relative(p: str, config_path: str) -> str:
    """A path written in a config file, relative to the folder the file really is in: a symbolic link to a config
    reads the files beside its target, as the link's target would."""
    if os.path.isabs(p):
        return p
    return os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(config_path)), p))


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict:
    """A config dataclass's field types (typing.get_type_hints re-evaluates the annotations at every call)."""
    return typing.get_type_hints(cls)


def _read_yaml(path: str) -> dict:
    text = read_input_text(path, "config", YAML_MAX_BYTES)
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"config {path}: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise InputError(f"config {path}: top level must be a mapping of keys")
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with a YAML text, and where, in words: 'malformed YAML at line 3, column 1: ...' or
    'duplicate key 'compute.arrays' (first at line 2) at line 5, column 3'."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    if isinstance(exc, YamlLimitError):
        return f"{exc.problem}{where}"
    problem = getattr(exc, "problem", None) or "invalid YAML"
    return f"malformed YAML{where}: {problem}"


def _path_keys(data: dict) -> list[tuple[dict, str]]:
    """(section, key) of every key of a config's data whose value is a file path: workload.trace, and each
    memory's standard when it names a file rather than a built-in standard."""
    from chipsim.dramsim.standard import is_standard_path

    out = []
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("trace"), str):
        out.append((workload, "trace"))
    arrivals = workload.get("arrivals") if isinstance(workload, dict) else None
    if isinstance(arrivals, dict) and isinstance(arrivals.get("file"), str) and arrivals["file"]:
        out.append((arrivals, "file"))
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("config"), str) and model["config"]:
        out.append((model, "config"))
    memory = data.get("memory")
    if isinstance(memory, dict):
        drams = [d for name, d in memory.items() if name != "extra"]
        if isinstance(memory.get("extra"), dict):
            drams += list(memory["extra"].values())
        for d in drams:
            if isinstance(d, dict) and isinstance(d.get("standard"), str) and is_standard_path(d["standard"]):
                out.append((d, "standard"))
    return out


def _set_value_paths(parts: list[str], value):
    """A --set value with its file paths made absolute against the current folder (they are typed on a command
    line, like every other path there); `--set memory.hbm={standard: s.yaml, ...}` included."""
    probe: dict = {}
    apply_set(probe, parts, value)
    for section, key in _path_keys(probe):
        section[key] = os.path.abspath(section[key])
    for part in parts:
        probe = probe[part]
    return probe


def _deep_merge(base: dict, override: dict) -> dict:
    """The override's keys over the base's, section by section; an empty mapping replaces the base's (a derived
    config says `op_times_ns: {}` to drop its base's profile)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _load_with_bases(path: str, seen: tuple = ()) -> dict:
    path = os.path.normpath(os.path.abspath(path))
    if os.path.realpath(path) in seen:
        raise InputError(f"config {path}: 'base' chain loops back to itself")
    data = _read_yaml(path)
    base = data.pop("base", None)
    # relative paths inside a file are relative to that file: rewritten before merging, so that a key a config
    # inherits from its base keeps the base's folder
    for section, key in _path_keys(data):
        section[key] = _resolve_relative(section[key], path)
    if base is None:
        return data
    if not isinstance(base, str):
        raise InputError(f"config {path}: base: must be a file path")
    return _deep_merge(_load_with_bases(_resolve_relative(base, path), seen + (os.path.realpath(path),)), data)


def parse_set(assignment: str) -> tuple[list[str], object]:
    """'links.pcie.bandwidth_gbps=64' -> (['links','pcie','bandwidth_gbps'], 64)."""
    if "=" not in assignment:
        raise InputError(f"--set {assignment}: expected dotted.key=value")
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise InputError(f"--set {assignment}: empty part in key '{key}'")
    try:
        value = yaml_load(text) if text.strip() else ""
    except YamlLimitError as exc:
        raise InputError(f"--set {key}: {exc.problem}") from None
    except yaml.YAMLError:
        value = text
    return parts, value


def yaml_text(key: str, value) -> str:
    """The `--set key=TEXT` text that `parse_set` reads back as exactly `value` (a sweep's grid values are
    passed to each point this way; PyYAML keeps 1e-05 a float only when written 1.0e-05, as safe_dump does)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True)
    text = text.removesuffix("\n").removesuffix("\n...").strip()
    back = parse_set(f"{key}={text}")[1]
    if back != value or type(back) is not type(value):
        raise InputError(f"--grid {key}={value!r}: not expressible as a YAML value")
    return text


def apply_set(data: dict, parts: list[str], value) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise InputError(f"--set {'.'.join(parts)}: '{'.'.join(parts[: i + 1])}' is not a section")
        node = nxt
    node[parts[-1]] = value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


# keys an earlier chipsim read, by the section's class: what to give instead
RENAMED_KEYS = {"DramConfig": {"controller_queue_entries": "read_queue_entries and write_queue_entries"}}


def build_dataclass(cls, data, key_prefix: str = ""):
    """Construct `cls` from a dict, naming the dotted key of the first problem found."""
    where = key_prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a section of keys, got {data!r}")
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key in RENAMED_KEYS.get(cls.__name__, {}):
            raise InputError(f"{key_prefix}{key}: renamed; give {RENAMED_KEYS[cls.__name__][key]}")
        if key not in names:
            raise InputError(f"{key_prefix}{key}: unknown key (expected one of: {', '.join(names)})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{key_prefix}{f.name}"
        if f.name not in data:
            if _has_default(f):
                continue  # optional key: the dataclass default
            raise InputError(f"{key}: missing key ({f.metadata.get('doc', '')})")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = build_dataclass(tp, data[f.name], key + ".")
        elif "components" in f.metadata:
            kwargs[f.name] = _build_components(f.metadata["components"], data[f.name], key)
        elif f.metadata.get("any_values"):  # a mapping its reader checks (model.shape: config.json fields)
            if not isinstance(data[f.name], dict):
                raise InputError(f"{key}: expected a section of keys, got {data[f.name]!r}")
            kwargs[f.name] = copy.deepcopy(data[f.name])
        else:
            kwargs[f.name] = check_value(key, data[f.name], tp, f.metadata["bounds"])
    return cls(**kwargs)


class Components(dict):
    """A config's memories or links by name, in its order, with the dotted key each was read from (`key_of`)."""

    def __init__(self, items: dict, key_of: dict):
        super().__init__(items)
        self.key_of = key_of


# names the energy breakdown and the flow network use for other things
RESERVED_NAMES = ("sram", "arrays", "host_cpu", "extra", "none")
_DIE_TO_DIE_KEYS = ("modules", "lanes_per_module", "gtps", "flit_format")


_SERIAL_KEYS = ("bandwidth_gbps", "max_payload_bytes", "tlp_overhead_bytes")


def link_class(section, where: str) -> type:
    """A link section's kind, by its keys: die-to-die (UCIe: modules x lanes x GT/s) or serial (PCIe-like); a
    section with keys of both is refused, naming them."""
    if not isinstance(section, dict):
        return PcieConfig  # build_dataclass words what is wrong with it
    d2d, serial = [k for k in _DIE_TO_DIE_KEYS if k in section], [k for k in _SERIAL_KEYS if k in section]
    if d2d and serial:
        raise InputError(f"{where}: has a serial link's keys ({', '.join(serial)}) and a die-to-die link's "
                         f"({', '.join(d2d)}); a link is one or the other")
    return UcieConfig if d2d else PcieConfig


_DRAM_ONLY = tuple(f.name for f in dataclasses.fields(DramConfig)
                   if f.name not in {g.name for g in dataclasses.fields(FlashConfig)})
_FLASH_ONLY = tuple(f.name for f in dataclasses.fields(FlashConfig)
                    if f.name not in {g.name for g in dataclasses.fields(DramConfig)})


def _listed(keys: list) -> str:
    return ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")


def memory_class(section, where: str) -> type:
    """A memory section's kind, by its keys: a flash device (queue_depth, page_read_us, ...) or a DRAM; a section
    with keys of both is refused, naming them."""
    if not isinstance(section, dict):
        return DramConfig  # build_dataclass words what is wrong with it
    dram, flash = [k for k in _DRAM_ONLY if k in section], [k for k in _FLASH_ONLY if k in section]
    if dram and flash:
        raise InputError(f"{where}: has a DRAM's keys ({_listed(dram)}) and a flash device's ({_listed(flash)}); a "
                         "memory is one or the other")
    return FlashConfig if flash else DramConfig


def _build_components(kind: str, data, key: str) -> Components:
    """`memory` or `links`: named sections, and an older config's `extra` sub-section of more, read as if they
    stood beside the others (the key each came from kept for messages)."""
    if not isinstance(data, dict):
        raise InputError(f"{key}: expected a section of named {'memories' if kind == 'memory' else 'links'}, got "
                         f"{data!r}")
    sections = [(name, section, f"{key}.{name}") for name, section in data.items() if name != "extra"]
    extra = data.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise InputError(f"{key}.extra: expected a section of named sections, got {extra!r}")
        sections += [(name, section, f"{key}.extra.{name}") for name, section in extra.items()]
    seen: dict = {}
    for name, _section, where in sections:  # a clash is named before either section is read
        if name in seen:
            raise InputError(f"{where}: the name is taken by {seen[name]}")
        seen[name] = where
    items, key_of = {}, {}
    for name, section, where in sections:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise InputError(f"{where}: a name is lower-case letters, digits and _, starting with a letter, at most 64")
        if name in RESERVED_NAMES or name.startswith(("arrays_", "static_")):
            raise InputError(f"{where}: the name is reserved ({', '.join(RESERVED_NAMES)}, arrays_*, static_*)")
        cls = memory_class(section, where) if kind == "memory" else link_class(section, where)
        items[name] = build_dataclass(cls, section, where + ".")
        key_of[name] = where
    if not items and kind == "memory":  # a machine may have no link (a SoC at its memory); never no memory
        raise InputError(f"{key}: a machine has at least one memory")
    return Components(items, key_of)


def field_bounds(cls, name: str) -> Bounds:
    """The bounds of one key of a config dataclass (e.g. WorkloadConfig, "context_length")."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["bounds"]


def iter_key_specs(cls=HardwareConfig, prefix: str = ""):
    """(dotted key, type name, doc, bounds, default, optional) of every schema key: `chipsim keys` and the
    documentation's generated reference page (chipsim/analysis/docs_gen.py) both read it, so neither can drift."""
    hints = _type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_key_specs(tp, f"{prefix}{f.name}.")
        elif "components" in f.metadata:
            yield (f"{prefix}{f.name}.<name>", "section", f.metadata["doc"], Bounds(), None, False)
            if f.metadata["components"] == "memory":
                yield from iter_key_specs(DramConfig, f"{prefix}{f.name}.<name>.")
                yield from iter_key_specs(FlashConfig, f"{prefix}{f.name}.<flash>.")
            else:
                yield from iter_key_specs(PcieConfig, f"{prefix}{f.name}.<serial link>.")
                yield from iter_key_specs(UcieConfig, f"{prefix}{f.name}.<die-to-die link>.")
        else:
            default = None
            if _has_default(f):
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            yield (f"{prefix}{f.name}", _type_name(tp), f.metadata.get("doc", ""), f.metadata["bounds"], default,
                   _has_default(f))


def iter_keys(cls=HardwareConfig, prefix: str = ""):
    """(dotted key, type name, doc) of every schema key, for documentation and `chipsim keys`."""
    for key, type_name, doc, bounds, default, optional in iter_key_specs(cls, prefix):
        yield key, type_name, key_doc(doc, bounds, default, optional=optional)


def load_config(path: str, overrides: list[str] | tuple = ()) -> Config:
    """Read, merge bases, apply overrides and validate. Raises InputError on the first problem."""
    data = _load_with_bases(path)
    for assignment in overrides:
        parts, value = parse_set(assignment)
        apply_set(data, parts, _set_value_paths(parts, value))
    policies = data.pop("policies", {}) or {}
    for extra in ("name", "description"):
        data.pop(extra, None)
    _check_names(data)
    if isinstance(data.get("model"), dict):
        resolve_format(data["model"], overrides)
    hw = build_dataclass(HardwareConfig, data)
    if not isinstance(policies, dict) or not all(isinstance(v, dict) for v in policies.values()):
        raise InputError("policies: expected a mapping of policy name -> {parameter: value}")
    raw = dict(data, policies=policies)
    config = Config(hw=hw, policies=policies, path=os.path.abspath(path), raw=raw, given_path=str(path))
    _check_consistency(config)
    return config


def _check_speculative(s: SpeculativeConfig) -> None:
    """A speculating run's keys are those its draft reads (draft_tokens 0, speculation off, reads none: a sweep over
    draft_tokens keeps the others at every point)."""
    default = SpeculativeConfig()
    unread = {"rate": ("ngram",), "prompt-lookup": ("acceptance", "seed")}[s.draft]
    for name in unread:
        if s.draft_tokens and getattr(s, name) != getattr(default, name):
            raise InputError(f"workload.speculative.{name}: not read by the {s.draft} draft")


def _check_request(w: WorkloadConfig) -> None:
    """A request's prompt, output and chunk keys agree with each other."""
    if w.prompt_tokens and w.output_tokens < 2:
        raise InputError(f"workload.output_tokens: {w.output_tokens}; a request (workload.prompt_tokens > 0) "
                         "generates at least 2 tokens (the first by its prefill, then at least one decode step)")
    if w.output_tokens and not w.prompt_tokens:
        raise InputError("workload.prompt_tokens: workload.output_tokens needs a prompt of at least 1 token")
    if w.prefill_chunk_tokens and not w.prompt_tokens and not w.requests:
        raise InputError("workload.prefill_chunk_tokens: needs a request (workload.prompt_tokens > 0)")
    _check_speculative(w.speculative)
    if w.speculative.draft_tokens and (w.prompt_tokens or w.batch > 1):
        raise InputError("workload.speculative.draft_tokens: speculation runs one decode-only sequence; with a request "
                         "(workload.prompt_tokens) or a batch (workload.batch) it is not simulated yet")
    if w.batch > 1 and w.prompt_tokens:
        raise InputError(f"workload.batch: {w.batch} sequences decode at workload.context_length; a batch of whole "
                         "requests (workload.prompt_tokens > 0) is not simulated yet: use one or the other")
    if w.prefill_chunk_tokens > w.prompt_tokens and not w.arrivals.file:  # (a file's prompts: each its own size)
        raise InputError(f"workload.prefill_chunk_tokens: {w.prefill_chunk_tokens} is larger than the prompt "
                         f"(workload.prompt_tokens {w.prompt_tokens})")


def _check_served(w: WorkloadConfig) -> None:
    """A served run (workload.requests > 0) names one way requests arrive, sizes them, and runs one request per
    sequence; its keys are not read otherwise."""
    a, s = w.arrivals, w.scheduler
    if not w.requests:
        if a != ArrivalsConfig() or s != SchedulerConfig():
            key = "arrivals" if a != ArrivalsConfig() else "scheduler"
            raise InputError(f"workload.{key}: read only by a served run (workload.requests > 0)")
        return
    kinds = [name for name, on in (("poisson_rps", a.poisson_rps > 0), ("closed_users", a.closed_users > 0),
                                   ("file", bool(a.file))) if on]
    if len(kinds) != 1:
        raise InputError(f"workload.arrivals: {w.requests} requests need exactly one of poisson_rps, closed_users or "
                         f"file (given: {', '.join(kinds) or 'none'})")
    if a.think_ms and not a.closed_users:
        raise InputError("workload.arrivals.think_ms: read only by a closed loop (workload.arrivals.closed_users)")
    if not a.file and not w.prompt_tokens:
        raise InputError("workload.prompt_tokens: the requests' size (with workload.output_tokens); 0 is no request")
    if a.file and (w.prompt_tokens or w.output_tokens):
        raise InputError("workload.prompt_tokens: the requests' sizes come from workload.arrivals.file; leave "
                         "workload.prompt_tokens and workload.output_tokens out")
    if w.batch > 1:
        raise InputError("workload.batch: a served run's scheduler decides each step's sequences (workload.scheduler)")
    if w.speculative.draft_tokens:
        raise InputError("workload.speculative.draft_tokens: speculation within served requests is not simulated yet")
    if s.kind == "chunked" and s.max_step_tokens < s.max_sequences:
        raise InputError(f"workload.scheduler.max_step_tokens: {s.max_step_tokens} tokens a step cannot hold the "
                         f"decode tokens of {s.max_sequences} sequences (workload.scheduler.max_sequences), as a "
                         "chunked step must")


def _check_consistency(config: Config) -> None:
    """Cross-key checks that no single key can make."""
    hw = config.hw
    if hw.workload.warmup_tokens and hw.workload.max_tokens and hw.workload.warmup_tokens >= hw.workload.max_tokens:
        raise InputError("workload.warmup_tokens: must be smaller than workload.max_tokens")
    _check_served(hw.workload)
    _check_request(hw.workload)
    for key, d in memory_tiers(hw).values():
        if d.trfc_ns >= d.trefi_ns:
            raise InputError(f"{key}.trfc_ns: refresh time must be shorter than {key}.trefi_ns")
        if d.timing_model == "command-level" and not d.standard:
            raise InputError(f"{key}.timing_model: command-level needs {key}.standard (a built-in standard or a YAML path)")
        if d.write_low_watermark >= d.write_high_watermark:
            raise InputError(f"{key}.write_low_watermark: must be below {key}.write_high_watermark "
                             f"({d.write_low_watermark:g} >= {d.write_high_watermark:g})")
        if d.timing_model == "command-level" and os.path.isabs(d.standard):  # a file (made absolute on loading)
            check_input(d.standard, f"{key}.standard: DRAM standard", YAML_MAX_BYTES)  # before any calibration
    for key, link in serial_links(hw).values():
        if link.timing_model == "link-layer":
            for name in ("encoding", "max_read_request_bytes", "read_tags"):
                if not getattr(link, name):
                    raise InputError(f"{key}.{name}: {key}.timing_model: link-layer needs it")
    check_roles(hw)
    c = hw.compute
    if c.timing == "cycle-level":
        for key in ("sram_read_bytes_per_cycle_per_array", "operand_tile_kib", "hbm_request_bytes",
                    "outstanding_requests_per_array"):
            if not getattr(c, key):
                raise InputError(f"compute.{key}: compute.timing: cycle-level needs it (positive)")
        _check_tiles(c)
    _check_pcie_sizes(hw)
    _check_flash(hw)
    _check_standards(hw)
    _check_host_frontend(hw)
    for name in c.in_sequence_ns:
        if name not in OP_GROUPS:
            raise InputError(f"compute.in_sequence_ns.{name}: not an op group (expected one of: {', '.join(OP_GROUPS)})")


def _check_host_frontend(hw: HardwareConfig) -> None:
    """Pageable copies need their measured rate, run one at a time in issue order as the host thread makes them, and
    cross a host link (a machine whose experts sit on the package has no host memory to page)."""
    f = hw.host_frontend
    if f.expert_memory == "pageable":
        if f.pageable_bandwidth_gbps < 1e-3:
            raise InputError("host_frontend.pageable_bandwidth_gbps: host_frontend.expert_memory: pageable needs it "
                             "(at least 0.001 GB/s)")
        d = hw.dma
        if d.engines != 1 or d.demand_first or d.demand_preempts_prefetch or d.cancel_in_flight:
            raise InputError("host_frontend.expert_memory: pageable: the host thread issues one copy at a time and "
                             "the driver's staging cannot be paused or abandoned; needs dma.engines 1, "
                             "dma.demand_first, dma.demand_preempts_prefetch and dma.cancel_in_flight false")
        if not roles(hw).host_link:
            raise InputError("host_frontend.expert_memory: pageable: this machine has no host link its experts "
                             "cross (roles.host_link)")


def _check_tiles(c: ComputeConfig) -> None:
    """Cycle-level compute: a tile is whole bytes, one request fits in a tile, and the tiles an array holds
    (double-buffered, or per resident program on a GPU) fit its SRAM."""
    tile_bytes = c.operand_tile_kib * 1024
    if tile_bytes != int(tile_bytes):
        raise InputError(f"compute.operand_tile_kib: {c.operand_tile_kib} KiB is {tile_bytes:g} bytes; a tile is a "
                         "whole number of bytes")
    if c.hbm_request_bytes > tile_bytes:
        raise InputError(f"compute.hbm_request_bytes: a request of {c.hbm_request_bytes} B does not fit in a tile of "
                         f"{int(tile_bytes)} B (compute.operand_tile_kib {c.operand_tile_kib:g})")
    tiles = c.operand_tile_buffers * (c.programs_per_array if c.rows_per_program and c.programs_per_array else 1)
    sram_bytes = c.sram_mib_per_array * (1 << 20)
    if tiles * tile_bytes > sram_bytes:
        raise InputError(f"compute.operand_tile_kib: {tiles} tiles of {c.operand_tile_kib:g} KiB (operand_tile_buffers"
                         f"{' x programs_per_array' if tiles != c.operand_tile_buffers else ''}) do not fit one "
                         f"array's SRAM of {c.sram_mib_per_array:g} MiB (compute.sram_mib_per_array)")


# PCIe: Max_Payload_Size and Max_Read_Request_Size are 128 B x 2^n, n = 0..5 (PCIe Base Specification, Device
# Control register)
PCIE_SIZES = tuple(128 << n for n in range(6))


def _check_pcie_sizes(hw: HardwareConfig) -> None:
    """The sizes of a PCIe link: links.pcie, and any link timed by the PCIe link layer (timing_model:
    link-layer); another serial link keeps its own protocol's sizes (CXL.mem moves 64 B)."""
    host_link = roles(hw).host_link
    for name, (key, link) in serial_links(hw).items():
        if name != host_link and link.timing_model != "link-layer":
            continue
        for field_name in ("max_payload_bytes", "max_read_request_bytes"):
            value = getattr(link, field_name)
            if field_name == "max_read_request_bytes" and value == 0:
                continue  # not given: only the link layer reads it, and it requires it
            if value not in PCIE_SIZES:
                raise InputError(f"{key}.{field_name}: a PCIe size is a power of two from 128 to 4096 bytes "
                                 f"({', '.join(map(str, PCIE_SIZES))}), got {value}")
        split = link.read_completion_bytes
        if split and (split not in (64, *PCIE_SIZES) or split > link.max_payload_bytes):
            raise InputError(f"{key}.read_completion_bytes: a completer splits at a multiple of its 64 or 128 B read "
                             f"completion boundary, a power of two up to max_payload_bytes ({link.max_payload_bytes}),"
                             f" got {split}")


def _check_standards(hw: HardwareConfig) -> None:
    """A command-level memory's standard is resolved and re-timed here, and its address mapping resolved, so that a
    missing file, a preset, a standard of another kind of memory, a timing that breaks physics or a mapping that
    leaves out a level is an error before anything runs."""
    from chipsim.dramsim.calibrate import retimed_standard
    from chipsim.dramsim.streams import stream_mapping

    for key, d in memory_tiers(hw).values():
        if d.timing_model == "command-level":
            stream_mapping(retimed_standard(d, key), 1, d.address_mapping, d.address_xor, key)


def memory_tiers(hw: HardwareConfig) -> dict:
    """Every DRAM of the config: name -> (dotted key, DramConfig), in the config's order."""
    return {name: (hw.memory.key_of[name], d) for name, d in hw.memory.items() if isinstance(d, DramConfig)}


def flash_memories(hw: HardwareConfig) -> dict:
    """Every flash device of the config: name -> (dotted key, FlashConfig), in the config's order."""
    return {name: (hw.memory.key_of[name], d) for name, d in hw.memory.items() if isinstance(d, FlashConfig)}


def memories(hw: HardwareConfig) -> dict:
    """Every memory of the config, DRAM or flash: name -> (dotted key, its config), in the config's order."""
    return {name: (hw.memory.key_of[name], d) for name, d in hw.memory.items()}


def _check_flash(hw: HardwareConfig) -> None:
    """A flash device reads whole pages: each read command is one page or more, a whole number of them."""
    for key, f in flash_memories(hw).values():
        if f.io_bytes < f.page_bytes:
            raise InputError(f"{key}.io_bytes: {f.io_bytes} B is smaller than one page ({key}.page_bytes "
                             f"{f.page_bytes}); a read command moves whole pages")
        if f.io_bytes % f.page_bytes:
            raise InputError(f"{key}.io_bytes: {f.io_bytes} B is not a whole number of pages of {f.page_bytes} B "
                             f"({key}.page_bytes); a read command moves whole pages")


def serial_links(hw: HardwareConfig) -> dict:
    """Every serial (PCIe-like) link of the config: name -> (dotted key, PcieConfig), in the config's order."""
    return {name: (hw.links.key_of[name], link) for name, link in hw.links.items() if isinstance(link, PcieConfig)}


def _named_keys(section) -> dict:
    """A raw memory or links section's component names -> the dotted key each is given at (extra included)."""
    if not isinstance(section, dict):
        return {}
    out = {name: name for name in section if name != "extra"}
    if isinstance(section.get("extra"), dict):
        out.update({name: f"extra.{name}" for name in section["extra"]})
    return out


def _check_names(data: dict) -> None:
    """A memory and a link never share a name (they name resources, ledger entries and result columns): checked
    before either is read, so the clash is what the message names."""
    links = _named_keys(data.get("links"))
    for name, where in _named_keys(data.get("memory")).items():
        if name in links:
            raise InputError(f"memory.{where}: the name is taken by links.{links[name]}")
