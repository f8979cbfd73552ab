"""One routed expert computed on the host CPU from its own copy of the weights (SPICE, Fiddler)."""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig
from chipsim.hw.machine import roles
from chipsim.hw.paths import link_config
from chipsim.units import PS_PER_S, gbps_to_bytes_per_s, ns_to_ps, transfer_ps
from chipsim.workload.decode import DecodeWorkload


@dataclass(frozen=True)
class HostTiming:
    """One expert computed on the host CPU from its own copy (weights read from LPDDR5X)."""

    compute_ps: int  # max(FLOPs / peak, weight bytes / memory bandwidth)
    transit_ps: int  # activations to the host and results back over PCIe
    total_ps: int  # dispatch overhead + transit + compute
    activation_bytes: int  # bytes crossing PCIe per expert (both ways)


def host_timing(hw: HardwareConfig, workload: DecodeWorkload, tokens: int = 1) -> HostTiming:
    """One expert on the host CPU for `tokens` tokens (a prefill chunk's routed to it): its weights read once,
    every token's FLOPs, every token's activation across the host link each way."""
    cpu = hw.host_cpu
    m = workload.model
    flops = 2 * m.expert_params * tokens
    peak = cpu.cores * cpu.clock_ghz * 1e9 * cpu.flops_per_cycle_per_core
    compute_ps = max(-(-flops * PS_PER_S // int(peak)),
                     transfer_ps(workload.expert_bytes, gbps_to_bytes_per_s(cpu.memory_bandwidth_gbps)))
    act = m.hidden_size * 2 * tokens  # BF16 hidden vectors
    host_link = roles(hw).host_link
    transit_ps = 0  # no link: the host CPU reads the activations where the compute units left them
    if host_link:
        link = link_config(hw, host_link)
        transit_ps = 2 * (ns_to_ps(link.latency_ns) + transfer_ps(act, gbps_to_bytes_per_s(link.data_gbps)))
    total = ns_to_ps(cpu.dispatch_overhead_ns) + transit_ps + compute_ps
    return HostTiming(compute_ps, transit_ps, total, 2 * act)
