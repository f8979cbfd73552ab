"""The one value checker: config keys (chipsim.hw.config) and policy parameters (chipsim.policies.base.Param)
are read and bounded by the same rules, and a bad value is one `InputError` naming the dotted key."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

import yaml

from chipsim.errors import InputError


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e9` and `2E-3` as numbers too: PyYAML follows YAML 1.1, whose floats
    need a dot (`1.0e+9`), while YAML 1.2, JSON and every user write 1e9."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


_PARSED: dict[str, object] = {}  # text -> what it parses to: a sweep reads the same config file at every point
_PARSED_MAX = 256


def yaml_load(text: str):
    """Parse YAML text as chipsim reads every config, `--set` value, policy parameter and experiment.

    PyYAML's pure-Python parser takes ~30 ms for a config; the same text is parsed once per process and handed
    out as a fresh copy (callers change what they get)."""
    parsed = _PARSED.get(text, _PARSED)
    if parsed is _PARSED:
        parsed = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[text] = parsed
    return copy.deepcopy(parsed)


@dataclass(frozen=True)
class Bounds:
    """Which values a key allows. A bound is inclusive unless its `_exclusive` flag is set; `choices` lists
    every allowed value (then the bounds are usually left out)."""

    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    choices: tuple | None = None

    def describe(self) -> str:
        """The allowed values in words, e.g. '0 < x < 1', 'x >= 1' or 'one of a, b'; '' when any value goes."""
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        lo = None if self.minimum is None else (self.minimum, "<" if self.min_exclusive else "<=")
        hi = None if self.maximum is None else (self.maximum, "<" if self.max_exclusive else "<=")
        if lo and hi:
            return f"{lo[0]:g} {lo[1]} x {hi[1]} {hi[0]:g}"
        if lo:
            return f"x {'>' if self.min_exclusive else '>='} {lo[0]:g}"
        if hi:
            return f"x {hi[1]} {hi[0]:g}"
        return ""


def key_doc(doc: str, bounds: Bounds, default=None, optional: bool = False) -> str:
    """A key's line in `chipsim keys`: its meaning, the values it allows, and its default when optional."""
    allowed = bounds.describe()
    return doc + (f" [{allowed}]" if allowed else "") + (f" (optional; default {default!r})" if optional else "")


POSITIVE = Bounds(minimum=0, min_exclusive=True)
NON_NEGATIVE = Bounds(minimum=0)


def _number_bounds(key: str, value, b: Bounds) -> None:
    if b.minimum is not None:
        if b.min_exclusive and value <= b.minimum:
            what = "positive" if b.minimum == 0 else f"greater than {b.minimum:g}"
            raise InputError(f"{key}: must be {what}, got {value!r}")
        if value < b.minimum:
            floor = "positive (at least {:g})" if b.minimum > 0 and value <= 0 else "at least {:g}"
            raise InputError(f"{key}: must be {floor.format(b.minimum)}, got {value!r}")
    if b.maximum is not None:
        if b.max_exclusive and value >= b.maximum:
            raise InputError(f"{key}: must be less than {b.maximum:g}, got {value!r}")
        if value > b.maximum:
            raise InputError(f"{key}: must be at most {b.maximum:g}, got {value!r}")


def check_value(key: str, value, tp: type, bounds: Bounds = Bounds()):
    """`value` read as type `tp` (float, int, bool, str, dict of name -> number >= 0, list of names) and
    checked against `bounds`; returns it converted (an int for a float key becomes a float, 2.0 for an int key
    becomes 2). Raises InputError naming `key`."""
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{key}: expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise InputError(f"{key}: must be finite, got {value!r}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise InputError(f"{key}: expected an integer, got {value!r}")
    elif tp is bool:
        if not isinstance(value, bool):
            raise InputError(f"{key}: expected true or false, got {value!r}")
    elif tp is str:
        if not isinstance(value, str) or not value:
            raise InputError(f"{key}: expected a non-empty string, got {value!r}")
    elif tp is dict:
        if not isinstance(value, dict):
            raise InputError(f"{key}: expected a section of name: number entries, got {value!r}")
        out = {}
        for name, v in value.items():
            if not isinstance(name, str) or not name:
                raise InputError(f"{key}: entry names must be non-empty strings, got {name!r}")
            out[name] = check_value(f"{key}.{name}", v, float, Bounds(minimum=0, maximum=1e12))
        return out
    elif tp is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise InputError(f"{key}: expected a non-empty list of names, got {value!r}")
    else:
        raise TypeError(f"{key}: no checker for type {tp!r}")
    if tp in (int, float):
        _number_bounds(key, value, bounds)
    if bounds.choices and value not in bounds.choices:
        raise InputError(f"{key}: must be one of {', '.join(map(str, bounds.choices))}, got {value!r}")
    return value
