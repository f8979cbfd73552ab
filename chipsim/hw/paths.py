"""The chip's memories and links as data, and the expert-fetch path through them.

Every memory (`memory.<name>`) and link (`links.<name>`) of a config becomes a `Component`: its usable bandwidth,
latency, energy per bit, static power, whether it sits inside the package and, for a DRAM, its read/write
turnaround. A flash device is one too (chipsim/hw/flash.py: a long read's rate, its first byte; its idle power as
static power; no turnaround: it is only read). The engine makes each a shared resource, the energy ledger charges
each per bit and over time, so a new tier is a YAML change only; which component plays which part is
chipsim.hw.machine's `roles`.

An expert fetch crosses the expert store and the fetch links (thor: LPDDR5X → PCIe → UCIe) and lands where it is
staged: written into the operand memory, or into the arrays' SRAM (then the last link's hop goes from the I/O die
to the compute die, and the SRAM's bandwidth belongs to the compute chiplet). Every byte crosses every component,
so the transfer moves at the slowest one's bandwidth and lands after the sum of their latencies.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig, flash_memories, memories, memory_tiers
from chipsim.hw.dram_formula import DramTiming, command_level_timing, dram_timing
from chipsim.hw.flash import flash_timing
from chipsim.hw.machine import roles


@dataclass(frozen=True)
class Component:
    name: str
    gbps: float  # usable bandwidth (a memory's effective streaming rate; a link's data rate per direction)
    latency_ns: float  # a memory's first-byte latency; a link's crossing
    pj_per_bit: float
    static_w: float
    turnaround: float = 0.0  # a DRAM's extra capacity per written byte while it is also read
    shared_gbps: float = 0.0  # a DRAM's bandwidth while two or more sequential readers share it (0: gbps)
    in_package: bool = False  # its energy is the paper's "on-chip active" category, else "off-chip I/O"


def memory_timing(hw: HardwareConfig, name: str) -> DramTiming:
    """A memory's bandwidth, turnaround and latency: the closed form, or, with timing_model: command-level, its
    standard's command-level model at the write share the run produces (fetches landing at the fetch path's link
    rate beside reads at the memory's full rate)."""
    key, d = memory_tiers(hw)[name]
    closed = dram_timing(d)
    if d.timing_model == "closed-form":
        return closed
    r = roles(hw)
    if r.in_place:  # no fetch writes; the host CPU's reads share the memory with the arrays' operand stream
        second = 0.0
        if name == r.host_memory == r.operand_memory:
            arrays_gbps = link_data_gbps(hw, r.operand_link) if r.operand_link else closed.effective_gbps
            cpu_gbps = hw.host_cpu.memory_bandwidth_gbps
            second = cpu_gbps / (cpu_gbps + min(arrays_gbps, closed.effective_gbps))
        return command_level_timing(d, key, 0.0, closed, second)
    # the rate fetches land at: the path's links, and the store's own bandwidth
    fetch_gbps = min(link_data_gbps(hw, link) for link in r.fetch_links)
    link_gbps = fetch_gbps
    if name != r.expert_store:
        fetch_gbps = min(link_gbps, store_gbps(hw, r.expert_store))
    second = 0.0
    if name == r.host_memory and r.expert_store == r.host_memory:  # the host CPU reads experts beside the fetches
        second = hw.host_cpu.memory_bandwidth_gbps / (hw.host_cpu.memory_bandwidth_gbps + link_gbps)
    return command_level_timing(d, key, fetch_gbps / closed.effective_gbps, closed, second)


def store_gbps(hw: HardwareConfig, name: str) -> float:
    """A memory's usable rate, GB/s: a flash device's long read, or a DRAM's effective bandwidth."""
    flash = flash_memories(hw).get(name)
    return flash_timing(flash[1]).effective_gbps if flash else memory_timing(hw, name).effective_gbps


def link_config(hw: HardwareConfig, name: str):
    """The config section of the link `name`: a serial (PCIe-like) link's or a die-to-die link's."""
    return hw.links[name]


def link_data_gbps(hw: HardwareConfig, name: str) -> float:
    return link_config(hw, name).data_gbps


def components(hw: HardwareConfig) -> dict[str, Component]:
    """Every memory and link of the config by name, in the order of Roles.ordered (the order in which energy is
    summed, so results stay identical)."""
    r = roles(hw)
    out = {}
    drams = memory_tiers(hw)
    for name, (_key, d) in memories(hw).items():
        if name not in drams:  # a flash device: read only, its idle power drawn throughout
            f = flash_timing(d)
            out[name] = Component(name, f.effective_gbps, f.access_latency_ns, d.read_energy_pj_per_bit,
                                  d.idle_power_w, in_package=name in r.in_package)
            continue
        t = memory_timing(hw, name)
        out[name] = Component(name, t.effective_gbps, t.access_latency_ns, d.energy_pj_per_bit, d.background_power_w,
                              t.turnaround, t.shared_gbps, name in r.in_package)
    for name, link in hw.links.items():
        # a link's energy is per wire bit: a data bit carries its share of encoding, headers and framing
        out[name] = Component(name, link.data_gbps, link.latency_ns,
                              link.energy_pj_per_bit * link.wire_bytes_per_data_byte, link.static_power_w,
                              in_package=name in r.in_package)
    return {n: out[n] for n in r.ordered(out)}


def fetch_components(hw: HardwareConfig) -> tuple[str, ...]:
    """The memories and links one fetched byte crosses under the config's staging location."""
    return roles(hw).fetch_crosses


def expert_store(hw: HardwareConfig) -> str:
    """The memory the experts are fetched from (it must hold all of them)."""
    return roles(hw).expert_store


def package_link(hw: HardwareConfig) -> str:
    """The link that brings fetched experts into the package (PCIe by default): its bytes are the off-chip
    traffic of the results."""
    return roles(hw).expert_link


@dataclass(frozen=True)
class FetchPathTiming:
    bandwidth_gbps: float  # bottleneck of the path, per direction
    latency_ns: float  # summed latency of the path
    bottleneck: str


@dataclass(frozen=True)
class CopyTiming:
    """What one expert copy pays on its path: a fixed cost per part (descriptor), the latency after its last byte, a
    rate of its own no flow exceeds (0: none) and the rate it moves at alone."""

    setup_ns: float
    latency_ns: float
    cap_gbps: float
    bandwidth_gbps: float


def copy_timing(hw: HardwareConfig, path: FetchPathTiming) -> CopyTiming:
    """dma.setup_ns and the path's latency and bottleneck; with host_frontend.expert_memory: pageable the driver's
    staging copy instead: its fit's intercept per part (the link's latency inside it) and its rate as a cap."""
    f = hw.host_frontend
    if f.expert_memory != "pageable":
        return CopyTiming(hw.dma.setup_ns, path.latency_ns, 0.0, path.bandwidth_gbps)
    return CopyTiming(f.pageable_setup_ns, 0.0, f.pageable_bandwidth_gbps,
                      min(path.bandwidth_gbps, f.pageable_bandwidth_gbps))


def fetch_path_timing(hw: HardwareConfig, comps: dict[str, Component] | None = None) -> FetchPathTiming:
    """The fetch path's bottleneck and summed latency (`comps`: components(hw), if already at hand)."""
    comps = comps or components(hw)
    crossed = fetch_components(hw)
    if not crossed:  # read in place: an expert's "fetch" is its read from the store
        store = comps[roles(hw).expert_store]
        return FetchPathTiming(store.gbps, store.latency_ns, store.name)
    bottleneck = min(crossed, key=lambda k: (comps[k].gbps, k))
    latency = sum(comps[c].latency_ns for c in crossed)
    if roles(hw).stage_in_sram:
        latency += hw.compute.sram_access_ns
    return FetchPathTiming(comps[bottleneck].gbps, latency, bottleneck)
