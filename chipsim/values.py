"""The one value checker: config keys (chipsim.hw.config) and policy parameters (chipsim.policies.base.Param)
are read and bounded by the same rules, and a bad value is one `InputError` naming the dotted key."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

import yaml

from chipsim.errors import InputError


# Bounds on one YAML document, far above any shipped one (the largest, hwconfigs/h200-pcie5.yaml: depth 4, 652
# nodes) and low enough that a hostile one is refused in well under a second: PyYAML composes recursively (Python's
# stack ends near depth 300), and aliases let a few lines stand for billions of nodes ("billion laughs") that
# every later walk over the data would expand.
YAML_MAX_DEPTH = 64
YAML_MAX_NODES = 200_000  # counted as the data is used: an alias counts every node it stands for
YAML_MAX_CHARS = 8 << 20


class YamlLimitError(yaml.MarkedYAMLError):
    """A YAML document chipsim refuses although YAML allows it: a duplicate key, too deep, too many nodes. A
    YAMLError, so every reader words it as it words malformed YAML (with the line)."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem=problem, problem_mark=mark)


class _DepthLimit:
    """Refuses documents nested deeper than YAML_MAX_DEPTH while composing them (before Python's stack runs out)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                raise YamlLimitError(f"nested deeper than {YAML_MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Loader(_DepthLimit, yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e9` and `2E-3` as numbers too: PyYAML follows YAML 1.1, whose floats
    need a dot (`1.0e+9`), while YAML 1.2, JSON and every user write 1e9."""


_FAST_LOADER = None  # libyaml's parser with the same composer and checks, where PyYAML was built with it
if yaml.__with_libyaml__:
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.cyaml import CParser
    from yaml.resolver import Resolver

    class _FastLoader(_DepthLimit, Composer, CParser, SafeConstructor, Resolver):
        """_Loader with libyaml's C parser feeding the same Python composer, checks and constructor: the same data
        ~10x faster. Its words for malformed YAML differ, so a text it refuses is parsed again by _Loader, which
        words the problem as chipsim always has."""

        def __init__(self, stream):
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _FAST_LOADER = _FastLoader
for _loader in (_Loader, _FAST_LOADER):
    if _loader is None:
        continue
    _loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                  re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                  list("-+0123456789"))


def _key_text(node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else f"<{node.id}>"


def _check_tree(root) -> None:
    """Duplicate keys (PyYAML keeps the last silently: a typo'd override would vanish), and the depth and the
    number of nodes as the data will be walked, aliases expanded. Iterative: the expansion may be deep."""
    seen_nodes = 0
    stack = [(root, (), 1)]
    while stack:
        node, where, depth = stack.pop()
        seen_nodes += 1
        if seen_nodes > YAML_MAX_NODES:
            raise YamlLimitError(f"more than {YAML_MAX_NODES} values (aliases counted as what they stand for)",
                                 node.start_mark)
        if depth > YAML_MAX_DEPTH:
            raise YamlLimitError(f"nested deeper than {YAML_MAX_DEPTH} levels (aliases expanded)", node.start_mark)
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                stack.append((item, where + (f"[{i}]",), depth + 1))
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[tuple, int] = {}
            for key_node, value_node in node.value:
                name = _key_text(key_node)
                dotted = ".".join(where + (name,)).replace(".[", "[")
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    ident = (key_node.tag, key_node.value)
                    if ident in first_line:
                        raise YamlLimitError(f"duplicate key '{dotted}' (first at line {first_line[ident]})",
                                             key_node.start_mark)
                    first_line[ident] = key_node.start_mark.line + 1
                stack.append((key_node, where, depth + 1))
                stack.append((value_node, where + (name,), depth + 1))


_PARSED: dict[str, object] = {}  # text -> what it parses to: a sweep reads the same config file at every point
_PARSED_MAX = 256


def _parse(text: str):
    if len(text) > YAML_MAX_CHARS:
        raise YamlLimitError(f"{len(text)} characters, over the {YAML_MAX_CHARS} a YAML text may have")
    if _FAST_LOADER is not None and _fast_ok(text):
        try:
            return _parse_with(_FAST_LOADER, text)
        except Exception:  # noqa: BLE001 -- any refusal is worded by the Python parser below, as it always was
            pass
    return _parse_with(_Loader, text)


# libyaml accepts some texts PyYAML refuses (a tab between tokens, `?` inside a flow scalar, a comment right after
# a block scalar's `|`) and reads an empty `!` node as '' (PyYAML: None): the C parser reads only printable ASCII
# without `\t`, `?`, `!` or `|#`, where a differential fuzz of the shipped YAML files and of short token soups
# found the two parsers agreeing; any other text (all of them valid to chipsim as before) goes to the Python parser.
_NOT_FOR_LIBYAML = re.compile(r"[^\n\x20\x22-\x3e\x40-\x7e]|[|>][-+0-9]*#")


def _fast_ok(text: str) -> bool:
    return text.isascii() and _NOT_FOR_LIBYAML.search(text) is None


def _parse_with(loader_class, text: str):
    loader = loader_class(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_tree(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def yaml_load(text: str):
    """Parse YAML text as chipsim reads every config, `--set` value, policy parameter and experiment: a
    duplicate key, nesting deeper than YAML_MAX_DEPTH or more than YAML_MAX_NODES values is a YamlLimitError.

    PyYAML's pure-Python parser takes ~30 ms for a config (libyaml's, where PyYAML has it, ~3 ms); the same text
    is parsed once per process and handed out as a fresh copy (callers change what they get)."""
    parsed = _PARSED.get(text, _PARSED)
    if parsed is _PARSED:
        parsed = _parse(text)
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
