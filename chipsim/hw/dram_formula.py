"""Effective streaming bandwidth and access latency of a DRAM, derived from its JEDEC-style timing.

A long transfer is laid out row by row across the channels and, within a channel, across the banks in
rotation, so one bank's row switch (tRP + tRCD) overlaps other banks' data bursts. Per row of a channel:

    t_data = page_bytes / channel_peak
    t_row  = max(t_data,                           # the data bus is the limit
                 (tRCD + t_data + tRP) / banks,    # row switches not hidden by interleaving
                 tRAS_or_row_cycle / banks,        # a bank cannot reopen before tRAS + tRP
                 tFAW / 4)                          # at most four activates per tFAW window
    efficiency = (t_data / t_row) × (1 − tRFC / tREFI)   # all-bank refresh blocks the channel

The first byte of a fresh (closed-row) access arrives after tRCD + CL + one burst.

Reads and writes at once: the controller serves reads and drains writes in batches of `write_drain_bursts`
(its write-queue watermarks); every batch costs a read-to-write and a write-to-read turnaround on the bus.
So while both directions are busy, every written byte costs 1 + turnaround bytes of the memory's capacity:

    turnaround = (tRTW + tWTR) / (write_drain_bursts × t_burst)
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import DramConfig


@dataclass(frozen=True)
class DramTiming:
    peak_gbps: float
    row_efficiency: float
    refresh_efficiency: float
    effective_gbps: float
    access_latency_ns: float
    turnaround: float  # extra capacity per written byte while reads run too (see the module docstring)
    source: str = "closed-form"  # or "command-level <standard> <presets>" (chipsim.dramsim.calibrate)
    shared_gbps: float = 0.0  # bandwidth while two or more sequential readers share it (0: effective_gbps)


def dram_timing(cfg: DramConfig) -> DramTiming:
    channel_peak_gbps = cfg.channel_width_bits / 8 * cfg.data_rate_mtps / 1e3  # GB/s = bytes per ns
    peak_gbps = channel_peak_gbps * cfg.channels
    t_data = cfg.page_bytes / channel_peak_gbps  # ns to stream one row of a channel
    t_row = max(
        t_data,
        (cfg.trcd_ns + t_data + cfg.trp_ns) / cfg.banks_per_channel,
        (max(cfg.tras_ns, cfg.trcd_ns + t_data) + cfg.trp_ns) / cfg.banks_per_channel,
        cfg.tfaw_ns / 4,
    )
    row_eff = t_data / t_row
    refresh_eff = 1.0 - cfg.trfc_ns / cfg.trefi_ns
    burst_ns = cfg.burst_length / cfg.data_rate_mtps * 1e3
    return DramTiming(
        peak_gbps=peak_gbps,
        row_efficiency=row_eff,
        refresh_efficiency=refresh_eff,
        effective_gbps=peak_gbps * row_eff * refresh_eff,
        access_latency_ns=cfg.trcd_ns + cfg.tcl_ns + burst_ns,
        turnaround=(cfg.trtw_ns + cfg.twtr_ns) / (cfg.write_drain_bursts * burst_ns),
    )


def command_level_timing(cfg: DramConfig, key: str, write_share: float, closed: DramTiming,
                         second_read_share: float = 0.0) -> DramTiming:
    """The memory's figures from its standard's command-level model (chipsim.dramsim.calibrate): efficiency times
    this config's peak (`closed`: its closed-form timing), the turnaround at `write_share`, a lone read's latency,
    and, with a second reader taking `second_read_share` of the reads, the bandwidth the two streams reach."""
    from chipsim.dramsim.calibrate import calibrate

    cal = calibrate(cfg, key, write_share, second_read_share)
    return DramTiming(
        peak_gbps=closed.peak_gbps, row_efficiency=cal.efficiency, refresh_efficiency=1.0,
        effective_gbps=closed.peak_gbps * cal.efficiency, access_latency_ns=cal.access_latency_ns,
        turnaround=cal.turnaround, source=f"command-level {cfg.standard}",
        shared_gbps=closed.peak_gbps * cal.shared_efficiency if second_read_share else 0.0)
