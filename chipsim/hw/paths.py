"""The expert-fetch path of a config: LPDDR5X → PCIe → UCIe → HBM, its bottleneck and summed latency.

An expert fetch reads LPDDR5X, crosses PCIe and the I/O→HBM UCIe link and is written into HBM; every byte
of it crosses all four, so the transfer moves at the slowest one's bandwidth and lands after the sum of
their latencies."""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig
from chipsim.hw.dram import dram_timing

# the components an expert fetch crosses, in order (staged in SRAM: the last is the arrays' SRAM, whose
# bandwidth and energy belong to the compute chiplet)
FETCH_PATH = ("lpddr5x", "pcie", "ucie", "hbm")


def fetch_components(hw: HardwareConfig) -> tuple[str, ...]:
    """The memories and links one fetched byte crosses under the config's staging location."""
    return FETCH_PATH if hw.expert_buffer.location == "hbm" else FETCH_PATH[:3]


@dataclass(frozen=True)
class FetchPathTiming:
    bandwidth_gbps: float  # bottleneck of the path, per direction
    latency_ns: float  # summed latency of the path
    bottleneck: str
    per_component_gbps: dict


def fetch_path_timing(hw: HardwareConfig) -> FetchPathTiming:
    lp, hbm = dram_timing(hw.memory.lpddr5x), dram_timing(hw.memory.hbm)
    bws = {
        "lpddr5x": lp.effective_gbps,
        "pcie": hw.links.pcie.data_gbps,
        "ucie": hw.links.ucie.bandwidth_gbps,
        "hbm": hbm.effective_gbps,
    }
    crossed = fetch_components(hw)
    bottleneck = min(crossed, key=lambda k: (bws[k], k))
    landing_ns = hbm.access_latency_ns if "hbm" in crossed else hw.compute.sram_access_ns
    latency = lp.access_latency_ns + hw.links.pcie.latency_ns + hw.links.ucie.latency_ns + landing_ns
    return FetchPathTiming(bws[bottleneck], latency, bottleneck, bws)
