"""A flash device (UFS, NVMe) as an expert store: the rate of a long read and its first byte, from a FlashConfig.

A fetch reads one long extent (an expert) as read commands of `io_bytes`, `queue_depth` of them in flight. Alone,
one command takes

    t_cmd = command_overhead + page_read (tR) + io_bytes / internal rate

(the host's and the controller's cost, the first page read from the NAND array into the page buffer, then the
command's data at the NAND side's rate). The host keeps queue_depth commands outstanding and issues the next as one
completes: a closed system of N = queue_depth customers with no think time, whose throughput has the asymptotic
bound X(N) <= min(N / D, 1 / D_max) (Lazowska, Zahorjan, Graham and Sevcik, Quantitative System Performance, 1984,
ch. 5, "Bounds on performance"; N / D is Little's law, L = lambda W, with every command at its unloaded time D =
t_cmd), 1 / D_max the slowest centre's rate: the host interface or the NAND channels. In bytes:

    rate = min(interface_gbps, internal_gbps, queue_depth x io_bytes / t_cmd)
    first byte = command_overhead + page_read + page_bytes / interface_gbps

(the first command's cost and tR, then its first page over the interface). GB/s are 1e9 B/s, so bytes / GB/s is ns.

Approximate: every command waits a whole tR before its data flows (a device spreads a command's pages over dies and
planes, reading them in parallel); the bound takes the smaller of the queue's rate and the slowest centre's, where a
real device bends between them; on an idle path a fetch of N bytes lands after first byte + N / rate, so at a queue
depth of 1 one command's overhead and tR are counted twice. The rate is the device's, shared by every fetch reading
it at once (chipsim.sim.flows), not queue_depth commands for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chipsim.hw.config import FlashConfig

NS_PER_US = 1000.0


@dataclass(frozen=True)
class FlashTiming:
    command_ns: float  # one read command alone: overhead + tR + io_bytes at the internal rate
    queue_gbps: float  # queue_depth commands in flight: queue_depth x io_bytes / command_ns
    effective_gbps: float  # a long read's rate: min(interface, internal, queue)
    limit: str  # which term sets it: interface, internal or queue
    access_latency_ns: float  # the first byte: overhead + tR + one page over the interface


def command_ns(f: FlashConfig) -> float:
    """One read command alone, ns: command_overhead + tR + io_bytes / internal_gbps."""
    return (f.command_overhead_us + f.page_read_us) * NS_PER_US + f.io_bytes / f.internal_gbps


def first_byte_ns(f: FlashConfig) -> float:
    """From a read's issue to its first byte on the host side, ns: command_overhead + tR + one page over the
    interface."""
    return (f.command_overhead_us + f.page_read_us) * NS_PER_US + f.page_bytes / f.interface_gbps


def flash_timing(f: FlashConfig) -> FlashTiming:
    """A long read's rate (the closed-loop bound of the module docstring) and its first byte."""
    t_cmd = command_ns(f)
    queue = f.queue_depth * f.io_bytes / t_cmd
    limits = {"interface": f.interface_gbps, "internal": f.internal_gbps, "queue": queue}
    limit = min(limits, key=lambda k: limits[k])  # the first of equal terms, in this order
    return FlashTiming(command_ns=t_cmd, queue_gbps=queue, effective_gbps=limits[limit], limit=limit,
                       access_latency_ns=first_byte_ns(f))


def flash_text(f: FlashConfig) -> str:
    """Where a flash device's figures come from, for the run header's memory: line."""
    t = flash_timing(f)
    io = f"{f.io_bytes // 1024} KiB" if f.io_bytes % 1024 == 0 else f"{f.io_bytes} B"
    return (f"long reads {t.effective_gbps:.2f} GB/s = min(interface {f.interface_gbps:g}, NAND {f.internal_gbps:g}, "
            f"{f.queue_depth} reads of {io} in flight / {t.command_ns / NS_PER_US:.1f} us each = {t.queue_gbps:.3g}): "
            f"{t.limit}-bound, first byte {t.access_latency_ns / NS_PER_US:.1f} us")
