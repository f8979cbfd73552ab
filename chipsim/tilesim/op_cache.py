"""The cycle-level model's operation table, cached by content hash: one JSON file per chiplet description
(ChipletParams) and model code, holding every operation shape costed so far. A run or a sweep point on a config
that was calibrated before (`chipsim calibrate CONFIG`, or an earlier run) reads its operations back instead of
running the tile loop again; a new shape is computed and added. The file lives in $CHIPSIM_CACHE_DIR/compute/
(default ~/.cache/chipsim/compute/); a read-only home only means calibrating again next time. A table is checked
(chipsim.cache: checksum, inputs, `check_table`) before it is used; one that fails is computed again and replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from functools import lru_cache

from chipsim import cache
from chipsim.tilesim import tile_sim
from chipsim.tilesim.tile_sim import ChipletParams, OpResult
from chipsim.files import cache_dir

_TABLES: dict[str, "OpCache"] = {}  # one per chiplet description in a process


@lru_cache(maxsize=1)
def _code_digest() -> str:
    with open(tile_sim.__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def table_digest(p: ChipletParams) -> str:
    spec = {"params": dataclasses.asdict(p), "code": _code_digest()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


class OpCache:
    """Operation results of one chiplet description: key (kind and shape) -> OpResult."""

    def __init__(self, p: ChipletParams, digest: str):
        self.params = p
        self.digest = digest
        self.path = cache.entry_path(cache_dir("compute"), digest)
        self.results: dict[str, OpResult] = {}
        self._dirty = False
        saved = cache.read(self.path, "compute", digest, lambda t: check_table(t, dataclasses.asdict(p)))
        if saved is not None:
            self.results = {k: OpResult(**v) for k, v in saved["ops"].items()}

    @classmethod
    def of(cls, p: ChipletParams) -> "OpCache":
        """The table of `p`, shared within the process (read from the cache directory in force the first time)."""
        digest = table_digest(p)
        table = _TABLES.get(digest)
        if table is None or table.path != cache.entry_path(cache_dir("compute"), digest):
            table = _TABLES[digest] = cls(p, digest)
        return table

    def get(self, key: str, compute) -> OpResult:
        r = self.results.get(key)
        if r is None:
            r = self.results[key] = compute()
            self._dirty = True
        return r

    def save(self) -> None:
        if not self._dirty:
            return
        ops = {k: dataclasses.asdict(v) for k, v in sorted(self.results.items())}
        # a read-only cache directory: nothing written, the table is computed again next time
        cache.write(self.path, "compute", self.digest, {"params": dataclasses.asdict(self.params), "ops": ops})
        self._dirty = False


_OP_FIELDS = [f.name for f in dataclasses.fields(OpResult)]


def check_table(table, params: dict | None = None) -> None:
    """A cached operation table is usable: made for these chiplet parameters (when given), and every operation's
    times and counts whole numbers >= 0, its tile loop within its time; raises cache.BadEntry."""
    cache.mapping(table, "table", ["params", "ops"])
    if params is not None and table["params"] != params:
        raise cache.BadEntry("params: not this chiplet's")
    cache.mapping(table["ops"], "ops")
    for key, op in table["ops"].items():
        cache.mapping(op, f"ops[{key}]", _OP_FIELDS)
        for name in _OP_FIELDS:
            cache.number(op[name], f"ops[{key}].{name}", low=0, integer=True)
        if op["stream_ps"] > op["ps"]:
            raise cache.BadEntry(f"ops[{key}].stream_ps: {op['stream_ps']} is above its time {op['ps']}")
