"""The GPU's sleeping kernel (torch.cuda._sleep spins a number of clock cycles) in time: what the replays and probes
that hold a stream busy on purpose need (a served run's gaps, a host kept ahead of the GPU)."""

from __future__ import annotations

import statistics

import torch


def sleep_cycles_per_ms(device, cycles: int = 20_000_000, reps: int = 3) -> float:
    """The GPU's clock cycles per millisecond as torch.cuda._sleep counts them (median of `reps` timed sleeps on the
    current stream of `device`)."""
    rates = []
    with torch.cuda.device(device):
        for _ in range(reps + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            rates.append(cycles / a.elapsed_time(b))
    return statistics.median(rates[1:])  # the first wakes the clocks
