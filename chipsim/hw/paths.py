"""The expert-fetch path of a config: LPDDR5X → PCIe → UCIe → HBM, its bottleneck and summed latency.

An expert fetch reads LPDDR5X, crosses PCIe and the I/O→HBM UCIe link and is written into HBM; every byte
of it crosses all four, so the transfer moves at the slowest one's bandwidth and lands after the sum of
their latencies."""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig
from chipsim.hw.dram import dram_timing

# the components an expert fetch crosses, in order
FETCH_PATH = ("lpddr5x", "pcie", "ucie", "hbm")


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
    bottleneck = min(bws, key=lambda k: (bws[k], k))
    latency = lp.access_latency_ns + hw.links.pcie.latency_ns + hw.links.ucie.latency_ns + hbm.access_latency_ns
    return FetchPathTiming(bws[bottleneck], latency, bottleneck, bws)
