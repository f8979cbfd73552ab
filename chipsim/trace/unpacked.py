"""A checked, unpacked copy of a trace in chipsim's cache ($CHIPSIM_CACHE_DIR/trace): reading a trace's .npz
inflates its arrays (thor's: 22 MB of zlib, ~0.16 s) and validates them (~0.05 s); every run after the first reads
the arrays as they were unpacked and validated, once they pass their checks.

An entry is two files named by its key, the sha256 of the trace file's bytes and of this reader's code (format.py,
this module; so a copy is never used by code that would validate differently):

- `<key>.json`, in chipsim.cache's checked format: the trace's meta record (its text) and, per array, its name,
  dtype, shape, memory order, offset and the sha256 of its bytes;
- `<key>.arrays`: the arrays' bytes one after another, each at an offset rounded up to ALIGN.

Reading checks the entry as chipsim.cache checks every entry, then that the arrays file is a regular file of exactly
the size the entry gives, then each array's sha256 (thor's 22 MB: ~25 ms). Any failure is one
`chipsim: note: trace cache <path>: <why>; recomputing` line, and the trace is unpacked, validated and stored again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re

import numpy as np

from chipsim import cache
from chipsim.errors import InputError
from chipsim.files import GIB, cache_dir, write_atomic

KIND = "trace"
MAX_BYTES = 8 * GIB  # the most a trace's arrays may unpack to (trace.format's TRACE_MAX_UNPACKED_BYTES)
ALIGN = 64  # each array starts at a multiple of this: aligned for every dtype
_DTYPE = re.compile(r"^[<>|][biuf][1248]$")  # numeric, as validate() requires of every array
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CODE_FILES = ("format.py", "unpacked.py")
_FIELDS = ("meta", "bytes", "arrays")
_ARRAY_FIELDS = ("name", "dtype", "shape", "order", "offset", "sha256")


@functools.lru_cache(maxsize=1)
def _code_sha256() -> str:
    return cache.sources_sha256(__file__, _CODE_FILES)


def entry_key(trace_sha256: str) -> str:
    return hashlib.sha256(json.dumps({"trace": trace_sha256, "code": _code_sha256()}).encode()).hexdigest()


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def check_entry(payload) -> None:
    """Raise cache.BadEntry unless `payload` describes arrays laid out as `write` lays them out."""
    cache.mapping(payload, "entry", _FIELDS)
    if not isinstance(payload["meta"], str):
        raise cache.BadEntry("meta: not a string")
    if not isinstance(payload["arrays"], list):
        raise cache.BadEntry("arrays: not a list")
    end, names = 0, set()
    for i, spec in enumerate(payload["arrays"]):
        where = f"arrays[{i}]"
        cache.mapping(spec, where, _ARRAY_FIELDS)
        if not isinstance(spec["name"], str) or not spec["name"] or spec["name"] in names | {"meta"}:
            raise cache.BadEntry(f"{where}.name: {str(spec['name'])[:40]!r} is not a new array name")
        names.add(spec["name"])
        if not isinstance(spec["dtype"], str) or not _DTYPE.match(spec["dtype"]):
            raise cache.BadEntry(f"{where}.dtype: {str(spec['dtype'])[:40]!r} is not a numeric dtype")
        if not isinstance(spec["shape"], list) or len(spec["shape"]) > 8:
            raise cache.BadEntry(f"{where}.shape: not a list of at most 8 sizes")
        for size in spec["shape"]:
            cache.number(size, f"{where}.shape", low=0, high=MAX_BYTES, integer=True)
        if spec["order"] not in ("C", "F"):
            raise cache.BadEntry(f"{where}.order: not C or F")
        if spec["offset"] != _aligned(end):
            raise cache.BadEntry(f"{where}.offset: {str(spec['offset'])[:40]!r}, expected {_aligned(end)}")
        if not isinstance(spec["sha256"], str) or not _SHA256.match(spec["sha256"]):
            raise cache.BadEntry(f"{where}.sha256: not a sha256")
        end = spec["offset"] + math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize
        if end > MAX_BYTES:
            raise cache.BadEntry(f"{where}: ends past {MAX_BYTES} bytes")
    if payload["bytes"] != end:
        raise cache.BadEntry(f"bytes: {str(payload['bytes'])[:40]!r}, the arrays end at {end}")


def _arrays(data: np.ndarray, specs: list[dict]) -> dict[str, np.ndarray]:
    """The arrays `specs` describe, as read-only views of `data`; raises cache.BadEntry at a changed one."""
    out = {}
    for spec in specs:
        dtype = np.dtype(spec["dtype"])
        count = math.prod(spec["shape"])
        raw = data[spec["offset"]:spec["offset"] + count * dtype.itemsize]
        if hashlib.sha256(raw).hexdigest() != spec["sha256"]:
            raise cache.BadEntry(f"array {spec['name']}: checksum mismatch (changed since it was written)")
        out[spec["name"]] = raw.view(dtype).reshape(spec["shape"], order=spec["order"])
    return out


def read(trace_sha256: str) -> tuple[dict[str, np.ndarray], str] | None:
    """The arrays and meta text of the trace whose file has this sha256, as validated when they were stored (the
    arrays read-only), or None: no entry, or one that fails a check (noted)."""
    folder = cache_dir(KIND)
    key = entry_key(trace_sha256)
    entry = cache.entry_path(folder, key)
    payload = cache.read(entry, KIND, key, check_entry)
    if payload is None:
        return None
    path = os.path.join(folder, f"{key}.arrays")
    try:
        raw = cache.read_bytes(path, payload["bytes"])
        if raw is None:
            raise cache.BadEntry("its arrays file is missing")
        if len(raw) != payload["bytes"]:
            raise cache.BadEntry(f"{len(raw)} bytes, expected {payload['bytes']}")
        data = np.frombuffer(raw, dtype=np.uint8)  # read-only: bytes are
        return _arrays(data, payload["arrays"]), payload["meta"]
    except cache.BadEntry as exc:
        cache.note(KIND, path, str(exc))
        return None


def write(trace_sha256: str, arrays: dict[str, np.ndarray], meta_text: str) -> None:
    """Store a validated trace's arrays and meta text for the next run; silently nothing where the cache cannot be
    written (a read-only folder: unpacked again next time)."""
    folder = cache_dir(KIND)
    key = entry_key(trace_sha256)
    specs, end = [], 0
    for name, array in arrays.items():
        order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
        specs.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "order": order,
                      "offset": _aligned(end), "sha256": hashlib.sha256(array.tobytes(order=order)).hexdigest()})
        end = specs[-1]["offset"] + array.nbytes

    def write_arrays(fh) -> None:
        for spec, array in zip(specs, arrays.values()):
            fh.write(b"\0" * (spec["offset"] - fh.tell()))
            fh.write(array.tobytes(order=spec["order"]))

    path = os.path.join(folder, f"{key}.arrays")
    with contextlib.suppress(OSError, InputError):
        if cache.clear_place(path):
            write_atomic(path, write_arrays)
            cache.write(cache.entry_path(folder, key), KIND, key, {"meta": meta_text, "bytes": end, "arrays": specs})
