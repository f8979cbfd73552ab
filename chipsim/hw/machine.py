"""The part each component of a machine plays in a decode step (its roles), read from the config.

The engine, the energy ledger, the metrics and the report ask for a component by the part it plays, never by its
name: the memory the compute units stream their operands from, the link they read it over, the memory that stores
the experts, the links a fetch crosses, where fetched experts are staged, what the host CPU reads and the link its
activations cross, and which components sit inside the package. A config names its components; `roles(hw)` says
which is which.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.hw.config import HardwareConfig

SRAM = "sram"  # the staging place that is the arrays' own SRAM (expert_buffer.location: sram), not a memory


@dataclass(frozen=True)
class Roles:
    operand_memory: str  # non-expert weights, KV cache, activations: what the compute units stream operands from
    operand_link: str  # between the compute units and the operand memory
    expert_store: str  # the memory that holds every expert's weights
    fetch_links: tuple[str, ...]  # the links an expert fetch crosses from the store to where it lands, in order
    expert_link: str  # of those, the one into the package: its bytes are the off-package expert traffic
    staging: str  # where fetched experts land: the operand memory, or SRAM (the arrays' own)
    host_memory: str  # the memory the host CPU reads its copy of the experts from
    host_link: str  # what activations cross to the host CPU and results back
    in_package: frozenset  # the components inside the package (their energy is on-chip)

    @property
    def stage_in_sram(self) -> bool:
        return self.staging == SRAM

    @property
    def fetch_crosses(self) -> tuple[str, ...]:
        """The memories and links one fetched byte crosses: the store, the links, the memory it lands in (none when
        it lands in the arrays' SRAM)."""
        return (self.expert_store, *self.fetch_links) + (() if self.stage_in_sram else (self.staging,))

    def ordered(self, names) -> list[str]:
        """`names` (every memory and link of the machine) in the order results list and sum them: the host memory,
        the host link, the operand link, the operand memory, then the others as the config gives them."""
        names = list(names)
        first = [n for n in dict.fromkeys((self.host_memory, self.host_link, self.operand_link, self.operand_memory))
                 if n in names]
        return first + [n for n in names if n not in first]


def roles(hw: HardwareConfig) -> Roles:
    """The roles of the config's components: today's machine shape, an on-package HBM beside the compute die over
    UCIe, experts stored where `paths.fetch` starts and staged where `expert_buffer.location` says, the host CPU
    beside LPDDR5X over PCIe."""
    path = tuple(hw.paths.fetch)
    return Roles(operand_memory="hbm", operand_link="ucie", expert_store=path[0], fetch_links=path[1:],
                 expert_link=path[-2], staging=SRAM if hw.expert_buffer.location == SRAM else "hbm",
                 host_memory="lpddr5x", host_link="pcie", in_package=frozenset({"hbm", "ucie"}))
