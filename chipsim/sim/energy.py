"""Energy ledger (Accelergy style): energy = Σ action count × energy per action + Σ static power × time, kept apart
from timing.

Actions counted per token (chipsim.sim.record): bytes crossing each memory and link (charged per bit), the
arrays' multiply-accumulates, special-function and elementwise lane operations, bits written into and read from
the arrays' SRAM (every operand streamed from HBM is written into SRAM once and read from it once; activations,
a few kB per layer, are not counted), the arrays' running time (clock power; also while waiting unless the
clocks are gated) and the host CPU's computing time (its active power, for policies that run experts there).
Static power of every component (arrays with their SRAM, HBM and LPDDR5X background and refresh, the PCIe and
UCIe PHYs) is drawn for the whole decode time. The table is the config's: every figure sourced or an ASSUMPTION.

Categories (the APEX paper's, so its Table V reads side by side): on-chip active = the arrays' actions + HBM +
UCIe; off-chip I/O = LPDDR5X + PCIe; idle/leakage = the static power of every component; host CPU apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chipsim.hw.config import HardwareConfig

MOVE_COMPONENTS = ("lpddr5x", "pcie", "ucie", "hbm")
ACTIONS = ("mac", "sfu_op", "vector_op", "sram_read_bit", "sram_write_bit")
STATIC_COMPONENTS = ("arrays", "hbm", "lpddr5x", "pcie", "ucie")
CATEGORY_OF = {
    "lpddr5x": "offchip_io",
    "pcie": "offchip_io",
    "ucie": "onchip_active",
    "hbm": "onchip_active",
    "arrays_mac": "onchip_active",
    "arrays_sfu": "onchip_active",
    "arrays_vector": "onchip_active",
    "arrays_sram": "onchip_active",
    "arrays_clock": "onchip_active",
    **{f"static_{c}": "idle_leakage" for c in STATIC_COMPONENTS},
    "host_cpu": "host_cpu",
}
# host_cpu is non-zero only for policies that compute experts on the host CPU (SPICE, Fiddler)
CATEGORIES = ("onchip_active", "offchip_io", "idle_leakage", "host_cpu")


@dataclass
class EnergyTable:
    pj_per_bit: dict[str, float]  # each memory and link
    pj_per_action: dict[str, float]  # each of ACTIONS
    clock_w: float  # all arrays together, while running
    clock_gated: bool  # no clock power while the arrays wait
    static_w: dict[str, float]  # each of STATIC_COMPONENTS, for the whole decode time
    host_active_w: float

    @classmethod
    def from_config(cls, hw: HardwareConfig) -> "EnergyTable":
        c = hw.compute
        return cls(
            pj_per_bit={
                "lpddr5x": hw.memory.lpddr5x.energy_pj_per_bit,
                "pcie": hw.links.pcie.energy_pj_per_bit,
                "ucie": hw.links.ucie.energy_pj_per_bit,
                "hbm": hw.memory.hbm.energy_pj_per_bit,
            },
            pj_per_action={
                "mac": c.mac_energy_pj,
                "sfu_op": c.sfu_op_energy_pj,
                "vector_op": c.vector_op_energy_pj,
                "sram_read_bit": c.sram_read_pj_per_bit,
                "sram_write_bit": c.sram_write_pj_per_bit,
            },
            clock_w=c.clock_power_w_per_array * c.arrays,
            clock_gated=c.clock_gated_when_idle,
            static_w={
                "arrays": c.leakage_power_w_per_array * c.arrays,
                "hbm": hw.memory.hbm.background_power_w,
                "lpddr5x": hw.memory.lpddr5x.background_power_w,
                "pcie": hw.links.pcie.static_power_w,
                "ucie": hw.links.ucie.static_power_w,
            },
            host_active_w=hw.host_cpu.active_power_w,
        )


@dataclass
class Ledger:
    """Action counts of one token (or any span): bytes per component, arrays actions, array and host time."""

    bytes: dict[str, int] = field(default_factory=lambda: {c: 0 for c in MOVE_COMPONENTS})
    actions: dict[str, int] = field(default_factory=lambda: {a: 0 for a in ACTIONS})
    busy_ps: int = 0
    idle_ps: int = 0
    host_busy_ps: int = 0
