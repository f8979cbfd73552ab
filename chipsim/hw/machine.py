"""The part each component of a machine plays in a decode step (its roles), read from the config.

The engine, the energy ledger, the metrics and the report ask for a component by the part it plays, never by its
name: the memory the compute units stream their operands from (the operand memory), the link they read it over,
the memory that stores the experts, the links a fetch crosses, where fetched experts are staged, what the host CPU
reads and the link its activations cross, and which components sit inside the package. A config names its
components (`memory.<name>`, `links.<name>`) and says which is which in `roles:`; a key it leaves out takes the name
today's machine (thor) gives that part, so every older config reads as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chipsim.errors import InputError

if TYPE_CHECKING:
    from chipsim.hw.config import HardwareConfig

SRAM = "sram"  # the staging place that is the arrays' own SRAM (expert_buffer.location: sram), not a memory
IN_PLACE = "in-place"  # no staging: the compute units read every expert where it is stored (one unified memory)
NONE = "none"  # roles.operand_link / roles.host_link: no link (the compute units or the host CPU sit at the memory)
# the names today's machine gives each part: what a config that does not say means
DEFAULTS = {"operand_memory": "hbm", "operand_link": "ucie", "host_memory": "lpddr5x", "host_link": "pcie"}
DEFAULT_FETCH_PATH = ("lpddr5x", "pcie", "ucie")


@dataclass(frozen=True)
class Roles:
    operand_memory: str  # non-expert weights, KV cache, activations: what the compute units stream operands from
    operand_link: str  # between the compute units and the operand memory ("": none, they sit at its controller)
    expert_store: str  # the memory that holds every expert's weights
    fetch_links: tuple[str, ...]  # the links an expert fetch crosses from the store to where it lands, in order
    expert_link: str  # of those, the first outside the package (experts leave their store over it): its bytes are
    # the off-package expert traffic
    staging: str  # where fetched experts land: the operand memory, SRAM (the arrays' own), or IN_PLACE (not fetched)
    host_memory: str  # the memory the host CPU reads its copy of the experts from
    host_link: str  # what activations cross to the host CPU and results back ("": none, it shares the memory)
    in_package: frozenset  # the components inside the package (their energy is on-chip)

    @property
    def stage_in_sram(self) -> bool:
        return self.staging == SRAM

    @property
    def in_place(self) -> bool:
        return self.staging == IN_PLACE

    @property
    def fetch_crosses(self) -> tuple[str, ...]:
        """The memories and links one fetched byte crosses: the store, the links, the memory it lands in (none when
        it lands in the arrays' SRAM); nothing when experts are read in place."""
        if self.in_place:
            return ()
        return (self.expert_store, *self.fetch_links) + (() if self.stage_in_sram else (self.staging,))

    def ordered(self, names) -> list[str]:
        """`names` (every memory and link of the machine) in the order results list and sum them: the host memory,
        the host link, the operand link, the operand memory, then the others as the config gives them."""
        names = list(names)
        first = [n for n in dict.fromkeys((self.host_memory, self.host_link, self.operand_link, self.operand_memory))
                 if n in names]
        return first + [n for n in names if n not in first]


_RESOLVED: dict[int, tuple] = {}  # id(hw) -> (hw, Roles): a run asks for the roles at every component it prices


def roles(hw: HardwareConfig) -> Roles:
    """The roles of the config's components (checked when the config was loaded: check_roles)."""
    hit = _RESOLVED.get(id(hw))
    if hit is not None and hit[0] is hw:
        return hit[1]
    resolved = _resolve(hw)
    if len(_RESOLVED) >= 64:
        _RESOLVED.clear()
    _RESOLVED[id(hw)] = (hw, resolved)
    return resolved


def _link(given: str, role: str) -> str:
    name = given or DEFAULTS[role]
    return "" if name == NONE else name


def _resolve(hw: HardwareConfig) -> Roles:
    given = hw.roles
    operand_memory = given.operand_memory or DEFAULTS["operand_memory"]
    operand_link = _link(given.operand_link, "operand_link")
    staging = given.expert_staging or (SRAM if hw.expert_buffer.location == SRAM else operand_memory)
    if staging == IN_PLACE:  # nothing is fetched: the experts live in the operand memory
        store, fetch_links = given.expert_store or operand_memory, tuple(given.fetch_links)
    else:
        path = tuple(hw.paths.fetch) or DEFAULT_FETCH_PATH
        store, fetch_links = given.expert_store or path[0], tuple(given.fetch_links) or path[1:]
    in_package = frozenset(given.in_package or [n for n in (operand_memory, operand_link) if n]) - {NONE}
    outside = [link for link in fetch_links if link not in in_package]
    return Roles(operand_memory=operand_memory, operand_link=operand_link, expert_store=store,
                 fetch_links=fetch_links, expert_link=outside[0] if outside else "", staging=staging,
                 host_memory=given.host_memory or DEFAULTS["host_memory"],
                 host_link=_link(given.host_link, "host_link"), in_package=in_package)


def check_roles(hw: HardwareConfig) -> None:
    """Every role filled by a component of the right kind, and the fetch path a path: one InputError naming the
    roles key (or paths.fetch) otherwise."""
    given = hw.roles
    if hw.paths.fetch and (given.expert_store or given.fetch_links):
        raise InputError("paths.fetch: give roles.expert_store and roles.fetch_links, or paths.fetch, not both")
    r = _resolve(hw)
    memories, links = list(hw.memory), list(hw.links)
    for role, kind, names in (("operand_memory", "memory", memories), ("operand_link", "link", links),
                              ("host_memory", "memory", memories), ("host_link", "link", links)):
        name = getattr(r, role)
        if kind == "link" and not name:
            continue  # none
        if name not in names:
            said = f"'{name}'" if getattr(given, role) else f"not given, and the default '{name}'"
            plural = "memories" if kind == "memory" else "links"
            raise InputError(f"roles.{role}: {said} is not a {kind} of this machine ({plural}: "
                             f"{', '.join(names) or 'none'})")
    _check_flash_roles(hw, r)
    if r.in_place:
        _check_in_place(hw, r)
    else:
        if hw.paths.fetch:
            _check_fetch_path(hw, r)
        else:
            _check_fetch_roles(hw, r, memories, links)
        _check_package_crossing(hw, r)
    if r.staging not in (r.operand_memory, SRAM, IN_PLACE):
        raise InputError(f"roles.expert_staging: '{r.staging}' is neither the operand memory ('{r.operand_memory}'), "
                         f"{SRAM} nor {IN_PLACE}")
    if hw.expert_buffer.location == SRAM and r.staging != SRAM:
        raise InputError(f"roles.expert_staging: '{r.staging}', but expert_buffer.location: {SRAM}")
    for name in r.in_package:
        if name not in memories and name not in links:
            raise InputError(f"roles.in_package: '{name}' is neither a memory ({', '.join(memories)}) nor a link "
                             f"({', '.join(links)})")


def _is_flash(hw: HardwareConfig, name: str) -> bool:
    return getattr(hw.memory.get(name), "kind", "") == "flash"


def _check_flash_roles(hw: HardwareConfig, r: Roles) -> None:
    """A flash device is read in commands of whole pages, each tens of microseconds (chipsim/hw/flash.py), and is
    never written by a run: it may store the experts, never be streamed by the compute units (the operand memory,
    which in-place staging reads experts from too), take fetched experts (staging) or serve the host CPU's reads
    (the host memory)."""
    for role, name in (("operand_memory", r.operand_memory), ("expert_staging", r.staging),
                       ("host_memory", r.host_memory)):
        if _is_flash(hw, name):
            raise InputError(f"roles.{role}: '{name}' is a flash memory; a flash memory can only be "
                             "roles.expert_store (experts are fetched from it into a DRAM)")


def _check_in_place(hw: HardwareConfig, r: Roles) -> None:
    """Experts read where they are stored: that is the operand memory, and no fetch crosses anything."""
    if r.expert_store != r.operand_memory:
        raise InputError(f"roles.expert_staging: {IN_PLACE} reads the experts from the operand memory "
                         f"('{r.operand_memory}'), but roles.expert_store is '{r.expert_store}'")
    if r.fetch_links or hw.paths.fetch:
        key = "roles.fetch_links" if r.fetch_links else "paths.fetch"
        raise InputError(f"{key}: experts read in place (roles.expert_staging: {IN_PLACE}) cross no link")
    if hw.expert_buffer.location == SRAM:
        raise InputError(f"expert_buffer.location: {SRAM}, but roles.expert_staging is {IN_PLACE}")


def _check_fetch_roles(hw: HardwareConfig, r: Roles, memories: list, links: list) -> None:
    given = hw.roles
    if r.expert_store not in memories:
        said = f"'{r.expert_store}'" if given.expert_store else f"not given, and the default '{r.expert_store}'"
        raise InputError(f"roles.expert_store: {said} is not a memory of this machine (memories: "
                         f"{', '.join(memories)})")
    if r.expert_store == r.operand_memory:
        raise InputError(f"roles.expert_store: '{r.expert_store}' is the operand memory; experts are fetched from "
                         "another memory")
    if not r.fetch_links:
        raise InputError("roles.fetch_links: an expert fetch crosses at least one link")
    for name in r.fetch_links:
        if name not in links:
            raise InputError(f"roles.fetch_links: '{name}' is not a link of this machine (links: {', '.join(links)})")
    if len(set(r.fetch_links)) != len(r.fetch_links):
        raise InputError(f"roles.fetch_links: {list(r.fetch_links)} crosses a link twice")


def _check_package_crossing(hw: HardwareConfig, r: Roles) -> None:
    """A fetch from a store outside the package crosses into it once: its links outside the package first, then
    those inside; and the first outside (the expert link, whose bytes are the results' off-package expert
    traffic) carries no operand stream."""
    key = "paths.fetch" if hw.paths.fetch else "roles.fetch_links"
    inside_seen = ""
    for link in r.fetch_links:
        if link in r.in_package:
            inside_seen = inside_seen or link
        elif inside_seen:
            raise InputError(f"{key}: '{link}' is outside the package (roles.in_package) but comes after "
                             f"'{inside_seen}', inside it; a fetch enters the package once")
    if r.expert_store not in r.in_package and not r.expert_link:
        raise InputError(f"{key}: the experts' store '{r.expert_store}' is outside the package, so a fetch crosses "
                         f"a link outside it (roles.in_package lists every one of {list(r.fetch_links)})")
    if r.expert_link and r.expert_link == r.operand_link:
        raise InputError(f"{key}: '{r.expert_link}', the link experts cross into the package, is also the operand "
                         "link: its bytes would count operand streams as expert traffic (list it in "
                         "roles.in_package, or name another operand link)")


def _check_fetch_path(hw: HardwareConfig, r: Roles) -> None:
    """An older config's paths.fetch: the store, then links, ending with the operand link."""
    path = list(hw.paths.fetch)
    memories, links = list(hw.memory), list(hw.links)
    for name in path:
        if name not in memories and name not in links:
            raise InputError(f"paths.fetch: '{name}' is neither a memory ({', '.join(memories)}) nor a link "
                             f"({', '.join(links)})")
    if len(set(path)) != len(path):
        raise InputError(f"paths.fetch: {path} crosses a component twice")
    if path[0] not in memories or path[0] == r.operand_memory:
        raise InputError(f"paths.fetch: must start with the memory that stores the experts (not {r.operand_memory}), "
                         f"got '{path[0]}'")
    if r.operand_link and (path[-1] != r.operand_link or len(path) < 3):
        raise InputError(f"paths.fetch: must end with a link into the package, then {r.operand_link} (into the memory "
                         f"or compute die), got {path}")
    for name in path[1:]:
        if name in memories:
            raise InputError(f"paths.fetch: '{name}' is a memory; after the experts' store the path crosses links only")
