"""The GPU's own energy and power counters, through NVML (the `pynvml` module of NVIDIA's nvidia-ml-py package, on
the device machine): `nvmlDeviceGetTotalEnergyConsumption` is the board's energy since the driver loaded, in mJ.

An energy over a window is the difference of two readings; a window of a second or more keeps the counter's
update interval (milliseconds) a small part of it. Where NVML is missing (this CPU machine, a dry run) `open_gpu`
returns None and callers record no energy.
"""

from __future__ import annotations

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
