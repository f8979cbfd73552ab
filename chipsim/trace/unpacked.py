"""A checked, unpacked copy of a trace in chipsim's cache ($CHIPSIM_CACHE_DIR/trace): reading a trace's .npz
inflates its arrays (thor's: 22 MB of zlib, ~0.16 s) and validates them (~0.05 s); every run after the first reads
the arrays as they were unpacked and validated, once they pass their checks.

An entry is two files named by its key, the sha256 of the trace file's bytes and of this reader's code (format.py,
predictor_arrays.py, spec.py, this module; so a copy is never used by code that would validate differently):

- `<key>.json`, in chipsim.cache's checked format: the trace's meta record (its text), per array its name, dtype,
  shape, memory order, offset and the sha256 of its bytes, and the names of the predictor outputs
  (chipsim.trace.predictor_arrays) whose checks the arrays passed when they were stored;
- `<key>.arrays`: the arrays' bytes one after another, each at an offset rounded up to ALIGN.

Reading checks the entry as chipsim.cache checks every entry and that the arrays file is a regular file of exactly
the size the entry gives. An array is read, and its sha256 checked, when it is first asked for (`CheckedArrays`): a
run reads the arrays it uses (thor with apex: 12 of 22 MB), the loader checks those before it hands the trace out
(`CheckedArrays.verify`), and any failure there is one `chipsim: note: trace cache <path>: <why>; recomputing`
line, and the trace is unpacked, validated and stored again. An array first asked for later that fails its check
is an InputError naming the cache file.
"""

from __future__ import annotations

import contextlib
import functools
import stat
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from chipsim import cache
from chipsim.errors import InputError
from chipsim.files import GIB, cache_dir, file_kind, write_atomic

KIND = "trace"
MAX_BYTES = 8 * GIB  # the most a trace's arrays may unpack to (trace.format's TRACE_MAX_UNPACKED_BYTES)
ALIGN = 64  # each array starts at a multiple of this: aligned for every dtype
_DTYPE = re.compile(r"^[<>|][biuf][1248]$")  # numeric, as validate() requires of every array
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CODE_FILES = ("format.py", "predictor_arrays.py", "spec.py", "unpacked.py")
_FIELDS = ("meta", "bytes", "arrays", "checked")
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
    checked = payload["checked"]
    if not isinstance(checked, list) or not all(isinstance(name, str) and name in names for name in checked):
        raise cache.BadEntry("checked: not a list of the entry's array names")


class CheckedArrays(Mapping):
    """A cache entry's arrays by name, each read from the arrays file and checked against its sha256 when first
    asked for (then kept, read-only). `verify` checks named ones up front; an array that fails a later first read
    is an InputError naming the cache file."""

    def __init__(self, path: str, total_bytes: int, specs: list[dict]):
        self.path, self._total = path, total_bytes
        self._specs = {spec["name"]: spec for spec in specs}
        self._read: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self):
        return iter(self._specs)

    def __contains__(self, name) -> bool:  # Mapping's would read the array
        return name in self._specs

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._read.get(name)
        if array is None:
            try:
                array = self._load(name)
            except cache.BadEntry as exc:
                raise InputError(f"trace cache {self.path}: {exc} (`chipsim cache clear trace` removes it)") from None
        return array

    def verify(self, names=None) -> bool:
        """Read and check the arrays `names` (every one where None; names the entry lacks are skipped): False,
        with the note, at the first that fails."""
        try:
            for name in self._specs if names is None else [n for n in names if n in self._specs]:
                if name not in self._read:
                    self._load(name)
        except cache.BadEntry as exc:
            cache.note(KIND, self.path, str(exc))
            return False
        return True

    @property
    def verified(self) -> frozenset:
        """The names of the arrays read and checked so far."""
        return frozenset(self._read)

    def _load(self, name: str) -> np.ndarray:
        spec = self._specs[name]
        dtype = np.dtype(spec["dtype"])
        raw = _read_range(self.path, self._total, spec["offset"], math.prod(spec["shape"]) * dtype.itemsize)
        if hashlib.sha256(raw).hexdigest() != spec["sha256"]:
            raise cache.BadEntry(f"array {name}: checksum mismatch (changed since it was written)")
        array = np.frombuffer(raw, dtype=dtype).reshape(spec["shape"], order=spec["order"])  # read-only: bytes are
        self._read[name] = array
        return array


def _read_range(path: str, total: int, offset: int, count: int) -> bytes:
    """`count` bytes at `offset` of the arrays file, which must still be a regular file of `total` bytes."""
    try:
        # O_NOFOLLOW | O_NONBLOCK: a file swapped for a link or a FIFO is refused, not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise cache.BadEntry("its arrays file is missing") from None
    except OSError as exc:
        raise cache.BadEntry(f"cannot open ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise cache.BadEntry(f"is {file_kind(st.st_mode)}")
        if st.st_size != total:
            raise cache.BadEntry(f"{st.st_size} bytes, expected {total}")
        parts, done = [], 0
        while done < count:
            part = os.pread(fd, count - done, offset + done)
            if not part:
                raise cache.BadEntry("changed while it was read")
            parts.append(part)
            done += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except OSError as exc:
        raise cache.BadEntry(f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Entry:
    """What a trace cache entry gives: the arrays (checked as they are read), the meta record's text, and the
    names of the predictor outputs whose checks they passed when stored."""

    arrays: CheckedArrays
    meta_text: str
    checked: frozenset


def read(trace_sha256: str) -> Entry | None:
    """The entry for the trace whose file has this sha256, or None: no entry, or one that fails a check
    (noted). Its arrays are read and checked as they are asked for (CheckedArrays)."""
    folder = cache_dir(KIND)
    key = entry_key(trace_sha256)
    entry = cache.entry_path(folder, key)
    payload = cache.read(entry, KIND, key, check_entry)
    if payload is None:
        return None
    path = os.path.join(folder, f"{key}.arrays")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        cache.note(KIND, path, "its arrays file is missing")
        return None
    except OSError as exc:
        cache.note(KIND, path, f"cannot inspect ({exc.strerror})")
        return None
    if not stat.S_ISREG(mode):
        cache.note(KIND, path, f"is {file_kind(mode)}")
        return None
    return Entry(CheckedArrays(path, payload["bytes"], payload["arrays"]), payload["meta"],
                 frozenset(payload["checked"]))


def write(trace_sha256: str, arrays: dict[str, np.ndarray], meta_text: str, checked=()) -> None:
    """Store a validated trace's arrays and meta text, and the names of the predictor outputs whose checks they
    passed, for the next run; silently nothing where the cache cannot be written (a read-only folder: unpacked
    again next time)."""
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
            cache.write(cache.entry_path(folder, key), KIND, key, {"meta": meta_text, "bytes": end, "arrays": specs,
                                                                   "checked": sorted(checked)})
