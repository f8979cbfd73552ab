"""The GPU's own energy and power counters, through NVML (the `pynvml` module of NVIDIA's nvidia-ml-py package, on
the device machine): `nvmlDeviceGetTotalEnergyConsumption` is the board's energy since the driver loaded, in mJ.

An energy over a window is the difference of two readings. The counter moves in steps and may trail the power it
integrates, so a replay's window is read by `Meter`: from a step of the counter after idle to a step after idle,
less the idle power over the idle part (validation/energy/probe_counter.py measures the steps and the delay on the
device). Where NVML is missing (this CPU machine, a dry run) `open_gpu` returns None and callers record no energy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    energy_mj: int  # the board's total energy since the driver loaded
    power_mw: int  # its power now, as NVML averages it
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int


class Gpu:
    """One GPU's NVML handle."""

    def __init__(self, nvml, handle) -> None:
        self._nvml = nvml
        self._handle = handle

    def read(self) -> Reading:
        n, h = self._nvml, self._handle
        return Reading(energy_mj=int(n.nvmlDeviceGetTotalEnergyConsumption(h)), power_mw=int(n.nvmlDeviceGetPowerUsage(h)),
                       sm_clock_mhz=int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                       mem_clock_mhz=int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                       temperature_c=int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)))

    def energy_mj(self) -> int:
        """The counter alone: one NVML call, for polling."""
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def describe(self) -> dict:
        """Name, power limit and driver, for the measurement's record."""
        n, h = self._nvml, self._handle
        name = n.nvmlDeviceGetName(h)
        driver = n.nvmlSystemGetDriverVersion()
        return {"name": name.decode() if isinstance(name, bytes) else name,
                "power_limit_w": n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                "driver": driver.decode() if isinstance(driver, bytes) else driver}


def open_gpu(index: int = 0) -> Gpu | None:
    """The GPU `index` (CUDA's order is NVML's where one GPU is visible), or None where NVML cannot be used."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        gpu = Gpu(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        gpu.read()  # a GPU without the energy counter (before Volta) fails here
    except pynvml.NVMLError:
        return None
    return gpu


def window(before: Reading, after: Reading, seconds: float) -> dict:
    """What the board drew between two readings `seconds` apart."""
    energy_j = (after.energy_mj - before.energy_mj) / 1e3
    return {"seconds": round(seconds, 4), "energy_j": round(energy_j, 3), "power_w": round(energy_j / seconds, 2),
            "sm_clock_mhz": [before.sm_clock_mhz, after.sm_clock_mhz],
            "mem_clock_mhz": [before.mem_clock_mhz, after.mem_clock_mhz],
            "temperature_c": [before.temperature_c, after.temperature_c]}


class Meter:
    """A load's energy read so that the counter's step interval and its delay drop out.

    `start()` waits `settle_s` with the GPU idle (whatever ran before has reached the counter), then takes the
    counter at its next step (a) and at its first step `settle_s` later (b): the idle power, and the window's
    start. The caller then runs the load and synchronises; `stop(load_s)` waits `settle_s` idle and takes the next
    step (c). The counter's window b..c holds the whole load and (c - b) - load_s seconds of idle, whatever the
    delay (as long as it is under `settle_s`), so the load's energy is E(c) - E(b) less the idle power over that
    idle time. Without this, a window read right before and right after a one-second load is short by the delay
    times the load's power above idle, and off by up to a step of the counter at each end.
    """

    def __init__(self, gpu: Gpu, settle_s: float = 0.5, clock=time.perf_counter, timeout_s: float = 5.0) -> None:
        self.gpu, self.settle_s, self.clock, self.timeout_s = gpu, settle_s, clock, timeout_s
        self._start = None

    def _idle_then_step(self, seconds: float) -> tuple[float, int]:
        """Poll for `seconds`, then until the counter moves: (when it moved, its value)."""
        t0 = self.clock()
        last = self.gpu.energy_mj()
        while True:
            v = self.gpu.energy_mj()
            now = self.clock()
            if v != last and now - t0 >= seconds:
                return now, v
            last = v
            if now - t0 > seconds + self.timeout_s:
                raise RuntimeError(f"the NVML energy counter did not move in {self.timeout_s} s")

    def start(self) -> None:
        self._idle_then_step(self.settle_s)
        a = self._idle_then_step(0.0)
        b = self._idle_then_step(self.settle_s)
        self._start = (a, b, self.gpu.read())

    def stop(self, load_s: float) -> dict:
        """The load's window: its energy above nothing (idle included for its own seconds), as `window` gives it."""
        after = self.gpu.read()
        c = self._idle_then_step(self.settle_s)
        (ta, ea), (tb, eb), before = self._start
        idle_w = (eb - ea) / 1e3 / (tb - ta)
        idle_s = (c[0] - tb) - load_s
        out = window(before, after, load_s)
        energy_j = (c[1] - eb) / 1e3 - idle_w * idle_s
        out.update(energy_j=round(energy_j, 3), power_w=round(energy_j / load_s, 2), idle_w=round(idle_w, 2),
                   counter_window_s=round(c[0] - tb, 4), naive_energy_j=out["energy_j"])
        return out
