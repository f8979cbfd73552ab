"""Energy ledger (Accelergy-style): energy = Σ energy-per-action × action count, kept apart from timing.

Actions counted: bytes crossing each memory and link (charged per bit), and array time in each power
state (active while an operation runs, leakage while clock-gated idle). The arrays' SRAM and SFUs are
inside their power figures, so their accesses are not charged again per bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chipsim.hw.config import HardwareConfig
from chipsim.units import PS_PER_S

MOVE_COMPONENTS = ("lpddr5x", "pcie", "ucie", "hbm")
CATEGORY_OF = {
    "lpddr5x": "offchip_io",
    "pcie": "offchip_io",
    "ucie": "onchip_active",
    "hbm": "onchip_active",
    "arrays_active": "onchip_active",
    "arrays_leakage": "idle_leakage",
}
CATEGORIES = ("onchip_active", "offchip_io", "idle_leakage")


@dataclass
class EnergyTable:
    pj_per_bit: dict[str, float]
    active_w: float  # all arrays together
    leakage_w: float

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
        )


@dataclass
class Ledger:
    """Action counts of one token (or any span): bytes per component and array time per power state."""

    bytes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in MOVE_COMPONENTS})
    busy_ps: int = 0
    idle_ps: int = 0

    def move(self, path: tuple[str, ...], nbytes: int) -> None:
        for component in path:
            self.bytes[component] += nbytes

    def energy_pj(self, table: EnergyTable) -> dict[str, float]:
        """Energy per component, pJ."""
        out = {c: self.bytes[c] * 8 * table.pj_per_bit[c] for c in MOVE_COMPONENTS}
        out["arrays_active"] = table.active_w * self.busy_ps / PS_PER_S * 1e12
        out["arrays_leakage"] = table.leakage_w * self.idle_ps / PS_PER_S * 1e12
        return out


def by_category(per_component_pj: dict[str, float]) -> dict[str, float]:
    out = {c: 0.0 for c in CATEGORIES}
    for component, value in per_component_pj.items():
        out[CATEGORY_OF[component]] += value
    return out
