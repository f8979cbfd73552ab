"""The cycle-level model's operation table, cached by content hash: one JSON file per chiplet description
(ChipletParams) and model code, holding every operation shape costed so far. A run or a sweep point on a config
that was calibrated before (`chipsim calibrate CONFIG`, or an earlier run) reads its operations back instead of
running the tile loop again; a new shape is computed and added. The file lives in $CHIPSIM_CACHE_DIR/compute/
(default ~/.cache/chipsim/compute/); a read-only home only means calibrating again next time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from functools import lru_cache

from chipsim.compute import tile_sim
from chipsim.compute.tile_sim import ChipletParams, OpResult
from chipsim.errors import InputError
from chipsim.files import cache_dir, write_atomic

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
        self.path = os.path.join(cache_dir("compute"), f"{digest}.json")
        self.results: dict[str, OpResult] = {}
        self._dirty = False
        try:
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            self.results = {k: OpResult(**v) for k, v in saved["ops"].items()}
        except (OSError, ValueError, TypeError, KeyError):
            self.results = {}  # none yet, or unreadable: computed again

    @classmethod
    def of(cls, p: ChipletParams) -> "OpCache":
        """The table of `p`, shared within the process (read from the cache directory in force the first time)."""
        digest = table_digest(p)
        table = _TABLES.get(digest)
        if table is None or table.path != os.path.join(cache_dir("compute"), f"{digest}.json"):
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
        try:
            write_atomic(self.path, json.dumps({"params": dataclasses.asdict(self.params), "ops": ops}) + "\n")
        except (OSError, InputError):  # a read-only cache directory: the table is computed again next time
            return
        self._dirty = False
