"""Energy ledger (Accelergy-style): energy = Σ energy-per-action × action count, kept apart from timing.

Actions counted: bytes crossing each memory and link (charged per bit), array time in each power
state (active while an operation runs, leakage while clock-gated idle), and host-CPU time spent computing
offloaded experts (its idle power is outside the accelerator's energy boundary, as for every policy). The arrays' SRAM and SFUs are
inside their power figures, so their accesses are not charged again per bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chipsim.hw.config import HardwareConfig

MOVE_COMPONENTS = ("lpddr5x", "pcie", "ucie", "hbm")
CATEGORY_OF = {
    "lpddr5x": "offchip_io",
    "pcie": "offchip_io",
    "ucie": "onchip_active",
    "hbm": "onchip_active",
    "arrays_active": "onchip_active",
    "arrays_leakage": "idle_leakage",
    "host_cpu": "host_cpu",
}
# host_cpu is non-zero only for policies that compute experts on the host CPU (SPICE, Fiddler)
CATEGORIES = ("onchip_active", "offchip_io", "idle_leakage", "host_cpu")


@dataclass
class EnergyTable:
    pj_per_bit: dict[str, float]
    active_w: float  # all arrays together
    leakage_w: float
    host_active_w: float

    @classmethod
    def from_config(cls, hw: HardwareConfig) -> "EnergyTable":
        return cls(
            pj_per_bit={
                "lpddr5x": hw.memory.lpddr5x.energy_pj_per_bit,
                "pcie": hw.links.pcie.energy_pj_per_bit,
                "ucie": hw.links.ucie.energy_pj_per_bit,
                "hbm": hw.memory.hbm.energy_pj_per_bit,
            },
            active_w=hw.compute.active_power_w_per_array * hw.compute.arrays,
            leakage_w=hw.compute.leakage_power_w_per_array * hw.compute.arrays,
            host_active_w=hw.host_cpu.active_power_w,
        )


@dataclass
class Ledger:
    """Action counts of one token (or any span): bytes per component and array time per power state."""

    bytes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in MOVE_COMPONENTS})
    busy_ps: int = 0
    idle_ps: int = 0
    host_busy_ps: int = 0
