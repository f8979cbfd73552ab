"""The one place where units are converted. Simulated time is kept in integer picoseconds."""

import math
from typing import Final

# Final: the compiled event engine (chipsim.sim) inlines them instead of looking them up at every use
PS_PER_NS: Final = 1_000
PS_PER_MS: Final = 1_000_000_000
PS_PER_S: Final = 1_000_000_000_000

BYTES_PER_GB = 1_000_000_000  # `_gbps` always means 1e9 bytes per second, never gigabits
BYTES_PER_MIB = 1 << 20
BYTES_PER_GIB = 1 << 30


def ns_to_ps(ns: float) -> int:
    """Round a duration in nanoseconds up to whole picoseconds."""
    return int(math.ceil(round(ns * PS_PER_NS, 6)))


def gbps_to_bytes_per_s(gbps: float) -> int:
    """GB/s (1e9 B/s) to whole bytes per second."""
    return int(round(gbps * BYTES_PER_GB))


def transfer_ps(n_bytes: int, bytes_per_s: int) -> int:
    """Time to move n_bytes at bytes_per_s, rounded up to whole picoseconds (exact integer arithmetic)."""
    return -(-n_bytes * PS_PER_S // bytes_per_s)


def cycles_to_ps(cycles: int, clock_mhz: float) -> int:
    """Duration of whole clock cycles, rounded up to whole picoseconds."""
    return int(math.ceil(round(cycles * 1e6 / clock_mhz, 6)))
