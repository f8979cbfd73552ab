"""A DRAM standard as data (Ramulator 2.1's idea, chipsim's format): address levels, commands, and timing
constraints "after command P at a node of level L, command F at that node (or, `sibling`, at its siblings) waits
`latency` cycles" (or, with `window: n`, the n-th previous P). Files live in chipsim/dramsim/standards/; an
organisation preset gives the level counts and row size, a timing preset the parameters in clock cycles.

Commands: ACT (open a row), PRE (close one bank), PREA (close every bank of the refresh level's node), RD and WR
(one burst from the open row), REFA (all-bank refresh of that node) and REFB (refresh of one bank).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass

from chipsim.errors import InputError
from chipsim.files import YAML_MAX_BYTES, read_input, read_input_text
from chipsim.values import YamlLimitError, yaml_load

COMMANDS = ("ACT", "PRE", "PREA", "RD", "WR", "REFA", "REFB")
ACT, PRE, PREA, RD, WR, REFA, REFB = range(len(COMMANDS))
COLUMN_COMMANDS = (RD, WR)
STANDARDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standards")

_TOP_KEYS = {"name", "levels", "refresh_level", "per_bank_refresh_level", "data_level", "dual_command_bus",
             "command_cycles", "read_latency", "write_latency", "constraints", "organizations", "timings", "config_keys",
             "ns_params", "second_activate_window"}
_CONSTRAINT_KEYS = {"level", "from", "to", "latency", "window", "sibling"}
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|([+-]))")


def evaluate(expr, params: dict, where: str) -> int:
    """An integer latency expression: numbers and parameter names joined by + and -."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    if not isinstance(expr, str) or not expr.strip():
        raise InputError(f"{where}: expected a latency expression, got {expr!r}")
    total, sign, pos, expect_term = 0, 1, 0, True
    text = expr.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise InputError(f"{where}: cannot read '{text[pos:]}' in '{expr}'")
        pos = m.end()
        number, name, op = m.groups()
        if op:
            if expect_term:
                raise InputError(f"{where}: '{expr}' has an operator where a term belongs")
            sign, expect_term = (1 if op == "+" else -1), True
            continue
        if not expect_term:
            raise InputError(f"{where}: '{expr}' has two terms without an operator between them")
        if name is not None and name not in params:
            raise InputError(f"{where}: '{name}' is not a timing parameter of this preset")
        total += sign * (int(number) if number is not None else params[name])
        expect_term = False
    if expect_term:
        raise InputError(f"{where}: '{expr}' ends with an operator")
    return total


@dataclass(frozen=True)
class Constraint:
    level: int
    before: int  # command index
    after: int
    latency: int  # cycles
    window: int = 1
    sibling: bool = False


@dataclass(frozen=True)
class Organization:
    counts: tuple[int, ...]  # nodes per parent at each level
    rows: int
    columns: int  # bursts per row
    channel_width_bits: int  # of the data level's bus
    burst_length: int
    timings_ns: tuple = ()  # (parameter, ns) the die density sets (refresh times), over the timing preset's

    @property
    def burst_bytes(self) -> int:
        return self.channel_width_bits * self.burst_length // 8


@dataclass(frozen=True)
class Standard:
    """A standard with one organisation and one timing preset resolved: everything the controller needs."""

    name: str
    levels: tuple[str, ...]
    refresh_level: int
    data_level: int
    dual_command_bus: bool
    command_cycles: tuple[int, ...]  # command-bus cycles per command
    read_latency: int  # RD issue to last data beat, cycles
    write_latency: int
    constraints: tuple[Constraint, ...]
    org: Organization
    params: dict  # the timing preset (cycles), with rate_mtps and tck_ps
    org_name: str
    timing_name: str
    config_keys: dict = None  # memory.<name> key (ns) -> the parameter it sets
    ns_params: tuple = ()  # parameters defined in ns (they scale with the clock)
    path: str = ""
    second_activate_window: int = 0  # LPDDR5's two-part activate: ACT-2 takes a command slot within this many
    # cycles of ACT-1, and no other ACT-1 goes before it (0: a one-part activate)
    per_bank_refresh_level: int = -1  # per-bank refresh: one REFB per node of this level every nREFIpb, in rotation
    # over its banks (-1: the refresh level)

    @property
    def tck_ps(self) -> int:
        return self.params["tck_ps"]

    def peak_gbps(self, channels: int | None = None) -> float:
        """Data-bus peak: every data-level node moves one burst per nBL cycles."""
        nodes = 1
        for count in self.org.counts[: self.data_level + 1]:
            nodes *= count
        if channels is not None:
            nodes = nodes // self.org.counts[0] * channels
        return nodes * self.org.burst_bytes / (self.params["nBL"] * self.tck_ps * 1e-3)


def _need(data: dict, key: str, where: str):
    if key not in data:
        raise InputError(f"{where}.{key}: missing key")
    return data[key]


# parameters the model divides by or paces every command with: zero is no DRAM
_POSITIVE_PARAMS = {"tck_ps": "the clock period tCK", "rate_mtps": "the data rate", "nBL": "the burst's clock cycles"}


def _check_timing_physics(params: dict, where: str) -> None:
    """A timing preset's values against physics, beyond each being a whole number >= 0: a clock period, data
    rate and burst that are not zero, and a refresh that ends before the next one is due (nRFC < nREFI)."""
    for name, what in _POSITIVE_PARAMS.items():
        if name in params and params[name] < 1:
            raise InputError(f"{where}.{name}: {what} must be at least 1, got {params[name]}")
    if "nRFC" in params and "nREFI" in params and params["nRFC"] >= params["nREFI"]:
        raise InputError(f"{where}.nRFC: the refresh time ({params['nRFC']} cycles) must be shorter than the "
                         f"refresh interval nREFI ({params['nREFI']})")


def _non_negative(cycles: int, expr, where: str) -> int:
    """A latency that comes to a negative number of cycles would let a command go before its cause."""
    if cycles < 0:
        raise InputError(f"{where}: '{expr}' comes to {cycles} cycles with this preset; a latency must be >= 0")
    return cycles


def _latency(data: dict, key: str, params: dict, where: str) -> int:
    expr = _need(data, key, where)
    return _non_negative(evaluate(expr, params, f"{where}.{key}"), expr, f"{where}.{key}")


def is_standard_path(value: str) -> bool:
    """Whether a standard as written names a file (it has a folder separator or ends .yaml / .yml) or a built-in
    standard (builtin_standards()): decided by how it is written, never by what files the current folder holds."""
    return "/" in value or os.sep in value or value.lower().endswith((".yaml", ".yml"))


def builtin_standards() -> list[str]:
    """The names of the standards chipsim ships (chipsim/dramsim/standards/<name>.yaml)."""
    return sorted(f[:-5] for f in os.listdir(STANDARDS_DIR) if f.endswith(".yaml"))


def standard_path(name_or_path: str) -> str:
    """The file a standard stands for: a path as written (is_standard_path), or a built-in name's
    chipsim/dramsim/standards/<name>.yaml."""
    if is_standard_path(name_or_path):
        return name_or_path
    known = builtin_standards()
    if name_or_path.lower() not in known:
        raise InputError(f"DRAM standard {name_or_path}: not found (built in: {', '.join(known)}); a file is "
                         "named by a path with a / or ending .yaml")
    return os.path.join(STANDARDS_DIR, f"{name_or_path.lower()}.yaml")


def standard_file_sha256(name_or_path: str) -> tuple[str, str]:
    """The file a standard stands for (standard_path, absolute) and the sha256 of its bytes, read safely: what the
    calibration cache key, the in-process memo and a run's provenance record of it."""
    path = os.path.abspath(standard_path(name_or_path))
    return path, hashlib.sha256(read_input(path, "DRAM standard", YAML_MAX_BYTES)).hexdigest()


def load_standard(name_or_path: str, org: str | None = None, timing: str | None = None,
                  timing_overrides: dict | None = None) -> Standard:
    """Read a standard (a name in chipsim/dramsim/standards/ or a path, is_standard_path) and resolve one
    organisation and one timing preset (the first of each unless named); `timing_overrides` replace preset
    parameters (cycles)."""
    path = standard_path(name_or_path)
    text = read_input_text(path, "DRAM standard", YAML_MAX_BYTES)
    try:
        data = yaml_load(text)
    except YamlLimitError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError(f"DRAM standard {path}: {exc.problem}{where}") from None
    except Exception as exc:  # malformed YAML: one line
        raise InputError(f"DRAM standard {path}: cannot read ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise InputError(f"DRAM standard {path}: top level must be a mapping")
    try:
        return _parse(data, path, org, timing, timing_overrides)
    except (TypeError, ValueError, KeyError, AttributeError, StopIteration) as exc:
        # a shape the checks above did not name (a list where a mapping belongs, ...): still one line
        raise InputError(f"DRAM standard {path}: malformed ({exc.__class__.__name__}: {exc})") from None


def _parse(data: dict, path: str, org, timing, timing_overrides) -> Standard:
    where = os.path.basename(path)
    for key in data:
        if key not in _TOP_KEYS:
            raise InputError(f"{where}.{key}: unknown key (expected one of: {', '.join(sorted(_TOP_KEYS))})")
    levels = tuple(_need(data, "levels", where))
    level_of = {name: i for i, name in enumerate(levels)}

    def level(key):
        name = _need(data, key, where)
        if name not in level_of:
            raise InputError(f"{where}.{key}: '{name}' is not one of the levels {list(levels)}")
        return level_of[name]

    orgs, timings = _need(data, "organizations", where), _need(data, "timings", where)
    org_name = org or next(iter(orgs))
    timing_name = timing or next(iter(timings))
    if org_name not in orgs:
        raise InputError(f"{where}.organizations: no preset '{org_name}' (has: {', '.join(orgs)})")
    if timing_name not in timings:
        raise InputError(f"{where}.timings: no preset '{timing_name}' (has: {', '.join(timings)})")
    org_timings = _org_timings_ns(orgs[org_name], timings[timing_name], f"{where}.organizations.{org_name}")
    params = _timing_params(timings[timing_name], org_timings, timing_overrides, f"{where}.timings.{timing_name}")
    o = orgs[org_name]
    ow = f"{where}.organizations.{org_name}"
    if not isinstance(o, dict):
        raise InputError(f"{ow}: expected a section of keys")
    counts = _need(o, "counts", ow)
    if not isinstance(counts, dict) or list(counts) != list(levels):
        raise InputError(f"{ow}.counts: must give every level in order {list(levels)}")
    numbers = [counts[name] for name in levels] + [_need(o, k, ow) for k in ("rows", "columns", "channel_width_bits",
                                                                             "burst_length")]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in numbers):
        raise InputError(f"{ow}: counts, rows, columns, channel_width_bits and burst_length must be positive integers")
    organization = Organization(tuple(numbers[: len(levels)]), *numbers[len(levels):], timings_ns=org_timings)
    constraints = []
    for i, c in enumerate(_need(data, "constraints", where)):
        cw = f"{where}.constraints[{i}]"
        if not isinstance(c, dict):
            raise InputError(f"{cw}: expected {{level, from, to, latency}}")
        for key in ("level", "from", "to", "latency"):
            _need(c, key, cw)
        if not isinstance(c["from"], list) or not isinstance(c["to"], list):
            raise InputError(f"{cw}: from and to are lists of commands")
        for key in c:
            if key not in _CONSTRAINT_KEYS:
                raise InputError(f"{cw}.{key}: unknown key")
        if c["level"] not in level_of:
            raise InputError(f"{cw}.level: '{c['level']}' is not one of the levels {list(levels)}")
        latency = _non_negative(evaluate(c["latency"], params, f"{cw}.latency"), c["latency"], f"{cw}.latency")
        for before in c["from"]:
            for after in c["to"]:
                for cmd in (before, after):
                    if cmd not in COMMANDS:
                        raise InputError(f"{cw}: unknown command '{cmd}' (commands: {', '.join(COMMANDS)})")
                constraints.append(Constraint(level_of[c["level"]], COMMANDS.index(before), COMMANDS.index(after),
                                              latency, int(c.get("window", 1)), bool(c.get("sibling", False))))
    cycles = [1] * len(COMMANDS)
    for name, n in (data.get("command_cycles") or {}).items():
        cycles[COMMANDS.index(name)] = int(n)
    return Standard(
        name=data.get("name", where), levels=levels, refresh_level=level("refresh_level"),
        data_level=level("data_level"), dual_command_bus=bool(data.get("dual_command_bus", False)),
        command_cycles=tuple(cycles), read_latency=_latency(data, "read_latency", params, where),
        write_latency=_latency(data, "write_latency", params, where),
        constraints=tuple(constraints), org=organization, params=params, org_name=org_name, timing_name=timing_name,
        config_keys=dict(data.get("config_keys") or {}), ns_params=tuple(data.get("ns_params") or ()), path=path,
        second_activate_window=_second_activate_window(data, params, where),
        per_bank_refresh_level=level("per_bank_refresh_level") if "per_bank_refresh_level" in data else -1)


def _timing_params(preset, org_timings: tuple, timing_overrides: dict | None, where: str) -> dict:
    """A timing preset's parameters (cycles), the organisation's density timings (ns, at the preset's clock) and
    then `timing_overrides` over them; each a whole number >= 0 that physics allows."""
    if not isinstance(preset, dict):
        raise InputError(f"{where}: expected a section of parameters")
    params = dict(preset)
    for key, ns in org_timings:  # the die density's refresh times, at the preset's clock
        params[key] = math.ceil(ns * 1000 / params["tck_ps"] - 1e-9)
    for key, value in (timing_overrides or {}).items():
        if key not in params:
            raise InputError(f"{where}.{key}: not a parameter of this preset")
        params[key] = value
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
    _check_timing_physics(params, where)
    return params


def _org_timings_ns(o, params, where: str) -> tuple:
    """An organisation's `timings_ns` (parameter: ns): what its die density sets, e.g. tRFC (JEDEC gives refresh
    times per density); each must be a parameter of the timing preset, a positive number of ns."""
    if not isinstance(o, dict) or "timings_ns" not in o or not isinstance(params, dict):
        return ()
    ts = o["timings_ns"]
    if not isinstance(ts, dict):
        raise InputError(f"{where}.timings_ns: expected a mapping of parameter: ns")
    tck = params.get("tck_ps")
    if isinstance(tck, bool) or not isinstance(tck, int) or tck < 1:
        return ()  # no clock to convert with: the preset's own check names tck_ps
    out = []
    for key, ns in ts.items():
        if key not in params:
            raise InputError(f"{where}.timings_ns.{key}: not a parameter of the timing preset")
        if isinstance(ns, bool) or not isinstance(ns, (int, float)) or not 0 < ns <= 1e7:
            raise InputError(f"{where}.timings_ns.{key}: expected a positive number of ns (at most 1e7), got {ns!r}")
        out.append((key, float(ns)))
    return tuple(out)


def _second_activate_window(data: dict, params: dict, where: str) -> int:
    """A two-part activate's window (cycles from ACT-1 by which ACT-2 must issue): at least one cycle."""
    if "second_activate_window" not in data:
        return 0
    cycles = _latency(data, "second_activate_window", params, where)
    if cycles < 1:
        raise InputError(f"{where}.second_activate_window: ACT-2 needs at least one cycle after ACT-1, got {cycles}")
    if data.get("dual_command_bus"):
        raise InputError(f"{where}.second_activate_window: a two-part activate is a single command bus's "
                         "(dual_command_bus: false)")
    return cycles
