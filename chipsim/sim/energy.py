"""Energy ledger (Accelergy style): energy = Σ action count × energy per action + Σ static power × time, kept apart
from timing.

Actions counted per token (chipsim.sim.record): bytes crossing each memory and link (charged per bit), the
arrays' multiply-accumulates, special-function and elementwise lane operations, bits written into and read from
the arrays' SRAM (every operand streamed from HBM is written into SRAM once and read from it once; activations,
a few kB per layer, are not counted), the arrays' running time (clock power; also while waiting unless the
clocks are gated; with clock_power_by_occupancy, each operation's time weighted by the share of the arrays it
occupies) and the host CPU's computing time (its active power, for policies that run experts there).
Static power of every component (arrays with their SRAM, HBM and LPDDR5X background and refresh, the PCIe and
UCIe PHYs) is drawn for the whole decode time. The table is the config's: every figure sourced or an ASSUMPTION.

Categories (the APEX paper's, so its Table V reads side by side): on-chip active = the arrays' actions + HBM +
UCIe; off-chip I/O = every memory and link outside the package (LPDDR5X, PCIe and any `memory.extra` /
`links.extra`); idle/leakage = the static power of every component; host CPU apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chipsim.hw.config import HardwareConfig
from chipsim.hw.machine import roles
from chipsim.hw.paths import components

ACTIONS = ("mac", "sfu_op", "vector_op", "sram_read_bit", "sram_write_bit")
ARRAYS_COMPONENTS = ("arrays_mac", "arrays_sfu", "arrays_vector", "arrays_sram", "arrays_clock")
# host_cpu is non-zero only for policies that compute experts on the host CPU (SPICE, Fiddler)
CATEGORIES = ("onchip_active", "offchip_io", "idle_leakage", "host_cpu")


@dataclass
class EnergyTable:
    """The config's energy reference table. `moves` are its memories and links (chipsim.hw.paths.components),
    charged per bit; `static` the components drawing static power (the arrays with their SRAM, then each memory
    and link), charged over the decode time."""

    pj_per_bit: dict[str, float]  # each memory and link
    pj_per_action: dict[str, float]  # each of ACTIONS
    clock_w: float  # all arrays together, while running
    clock_gated: bool  # no clock power while the arrays wait
    clock_by_occupancy: bool  # clock power only on the arrays an operation occupies (with clock_gated)
    static_w: dict[str, float]  # the arrays and each memory and link, for the whole decode time
    host_active_w: float
    category_of: dict[str, str]  # every entry of the energy breakdown -> one of CATEGORIES
    profiled: bool = False  # compute.op_energy_pj lists operations: the breakdown has an arrays_profiled entry
    operand_components: tuple[str, ...] = ()  # the operand memory and link (chipsim.hw.machine.Roles)
    host_link: str = ""  # the link to the host CPU (the results' energy_pcie_mj)

    @property
    def moves(self) -> tuple[str, ...]:
        return tuple(self.pj_per_bit)

    @classmethod
    def from_config(cls, hw: HardwareConfig) -> "EnergyTable":
        c = hw.compute
        comps = components(hw)
        r = roles(hw)
        # static power in a fixed order (arrays, the operand memory, the host's memory and link, the operand link,
        # then the other memories and links)
        first = [n for n in dict.fromkeys((r.operand_memory, r.host_memory, r.host_link, r.operand_link)) if n in comps]
        static_order = first + [n for n in comps if n not in first]
        static_w = {"arrays": c.leakage_power_w_per_array * c.arrays}
        static_w.update({n: comps[n].static_w for n in static_order})
        category_of = {n: "onchip_active" if comp.in_package else "offchip_io" for n, comp in comps.items()}
        category_of.update({n: "onchip_active" for n in ARRAYS_COMPONENTS})
        category_of.update({f"static_{n}": "idle_leakage" for n in static_w})
        category_of["host_cpu"] = "host_cpu"
        category_of["arrays_profiled"] = "onchip_active"
        return cls(
            pj_per_bit={n: comp.pj_per_bit for n, comp in comps.items()},
            pj_per_action={
                "mac": c.mac_energy_pj,
                "sfu_op": c.sfu_op_energy_pj,
                "vector_op": c.vector_op_energy_pj,
                "sram_read_bit": c.sram_read_pj_per_bit,
                "sram_write_bit": c.sram_write_pj_per_bit,
            },
            clock_w=c.clock_power_w_per_array * c.arrays,
            clock_gated=c.clock_gated_when_idle,
            clock_by_occupancy=c.clock_power_by_occupancy,
            static_w=static_w,
            host_active_w=hw.host_cpu.active_power_w,
            category_of=category_of,
            profiled=bool(c.op_energy_pj),
            operand_components=tuple(n for n in (r.operand_memory, r.operand_link) if n),
            host_link=r.host_link,
        )


@dataclass
class Ledger:
    """Action counts of one token (or any span): bytes per component, arrays actions, array and host time."""

    bytes: dict[str, int]
    actions: dict[str, int] = field(default_factory=lambda: {a: 0 for a in ACTIONS})
    busy_ps: int = 0
    occupied_ps: int = 0  # busy_ps weighted by the share of the arrays each operation occupies
    idle_ps: int = 0
    host_busy_ps: int = 0
    profiled_pj: int = 0  # compute.op_energy_pj: measured energy of the operations listed there
    unpriced_operand_bytes: int = 0  # of the operand memory and link bytes, those whose energy profiled_pj holds

    @classmethod
    def empty(cls, components: tuple[str, ...]) -> "Ledger":
        return cls(bytes={c: 0 for c in components})
