"""Cache entries that are checked, never trusted: the one reader and writer of every computed-once file (DRAM
calibrations, the cycle-level operation tables, unpacked traces, a sweep's results).

An entry is one JSON file `<key>.json`:

    {"format": "chipsim-cache-1", "kind": "dram", "key": "<sha256 of the inputs>", "sha256": "<sha256 of the
     canonical payload>", "payload": {...}}

Reading checks, in order: the path is a regular file (lstat first: a FIFO, a device, a socket, a symbolic link or a
folder is never opened, so never a hang), at most MAX_ENTRY_BYTES, UTF-8 JSON, this format and kind, the key of
these inputs, the payload's checksum, then the kind's own check of every value (types, finite, in range). Any
failure is one `chipsim: note: <kind> cache <path>: <why>; recomputing` line on stderr (once per entry in a
process) and the caller computes the value again; `write` then replaces the entry. A cache problem is never an
error: a folder that cannot be written only means computing again next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import sys
from typing import Any, Callable

from chipsim.errors import InputError
from chipsim.files import file_kind, write_atomic

FORMAT = "chipsim-cache-1"
MAX_ENTRY_BYTES = 64 << 20  # far above any real entry (a compute table of thousands of shapes is < 1 MB)
ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.json$")  # what chipsim writes; anything else in a cache folder is not its
# an interrupted write's temporary file: write_atomic's (.<name>.<random>.tmp), the old calibrate's (<name>.<pid>.tmp)
TEMP_NAME = re.compile(r"^(\.[0-9a-f]{64}\.(json|arrays)\..+\.tmp|[0-9a-f]{64}\.json\.\d+\.tmp)$")
# an entry's data beside it (the trace cache's unpacked arrays: chipsim.trace.unpacked), checked when it is read
DATA_NAME = re.compile(r"^[0-9a-f]{64}\.arrays$")

Check = Callable[[Any], None]  # raises BadEntry(why) when a payload is not usable

_NOTED: set[tuple[str, str]] = set()  # (kind, path) already reported in this process


class BadEntry(Exception):
    """Why an entry cannot be used (one short phrase)."""


def canonical(payload) -> str:
    """The text the checksum covers: sorted keys, no spaces, no NaN or infinity."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(payload) -> str:
    return hashlib.sha256(canonical(payload).encode()).hexdigest()


def sources_sha256(module_file: str, names: tuple[str, ...]) -> str:
    """sha256 of the source files `names` beside `module_file` (a module's __file__), read in that order: the code
    part of a cache key, so that an entry made by other code is never read as this code's."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(module_file))
    for name in names:
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def entry_path(folder: str, key: str) -> str:
    return os.path.join(folder, f"{key}.json")


# ---------------------------------------------------------------------------------------------- reading
def read_bytes(path: str, max_bytes: int) -> bytes | None:
    """The file's bytes; None when there is none. Never opens anything but a regular file of at most `max_bytes`."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadEntry(f"cannot inspect ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise BadEntry(f"is {file_kind(mode)}")
    try:
        # O_NOFOLLOW | O_NONBLOCK: a file swapped for a link or a FIFO since the lstat is refused, not waited on
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise BadEntry(f"cannot open ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry(f"is {file_kind(st.st_mode)}")
        if st.st_size > max_bytes:
            raise BadEntry(f"{st.st_size} bytes, more than any entry ({max_bytes})")
        data = f.read(st.st_size + 1)  # what the file holds, never a buffer of max_bytes
    if len(data) != st.st_size:
        raise BadEntry("changed while it was read")
    return data


def _read_text(path: str) -> str | None:
    """The entry's text; None when there is none."""
    data = read_bytes(path, MAX_ENTRY_BYTES)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadEntry("not UTF-8 text") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_entry(text: str, kind: str, key: str | None, check: Check):
    """The payload of an entry's text, checked; raises BadEntry. `key` None: whatever inputs it was made for."""
    try:
        entry = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BadEntry(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(entry, dict):
        raise BadEntry(f"not a cache entry (a JSON {type(entry).__name__})")
    if "format" not in entry or "sha256" not in entry:
        raise BadEntry("old format without a checksum")
    if entry["format"] != FORMAT:
        raise BadEntry(f"format {str(entry['format'])[:40]!r}, expected {FORMAT!r}")
    if entry.get("kind") != kind:
        raise BadEntry(f"kind {str(entry.get('kind'))[:40]!r}, expected {kind!r}")
    if not isinstance(entry.get("key"), str) or (key is not None and entry["key"] != key):
        raise BadEntry("made for other inputs (its key differs)")
    if "payload" not in entry:
        raise BadEntry("no payload")
    payload = entry["payload"]
    if entry["sha256"] != digest(payload):
        raise BadEntry("checksum mismatch (changed since it was written)")
    check(payload)
    return payload


def inspect(path: str, kind: str, key: str | None, check: Check):
    """The checked payload at `path`, None when there is no entry; raises BadEntry."""
    text = _read_text(path)
    return None if text is None else parse_entry(text, kind, key, check)


def note(kind: str, path: str, why: str) -> None:
    """One line per entry per process: the entry is not used and is computed again."""
    if (kind, path) in _NOTED:
        return
    _NOTED.add((kind, path))
    print(f"chipsim: note: {kind} cache {path}: {why}; recomputing", file=sys.stderr)


def read(path: str, kind: str, key: str, check: Check):
    """The checked payload of the entry at `path` for inputs `key`, or None (absent, or not usable: noted)."""
    try:
        return inspect(path, kind, key, check)
    except BadEntry as exc:
        note(kind, path, str(exc))
        return None


# ---------------------------------------------------------------------------------------------- writing
def entry_text(kind: str, key: str, payload) -> str:
    entry = {"format": FORMAT, "kind": kind, "key": key, "sha256": digest(payload), "payload": payload}
    return json.dumps(entry, sort_keys=True, indent=1, allow_nan=False) + "\n"


def clear_place(path: str) -> bool:
    """Make room for a new entry: a file, link, FIFO or device in its place is removed (a link, not what it points
    to). False when the place cannot be used (a folder there, or nothing can be removed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return False
    if stat.S_ISREG(mode):
        return True  # write_atomic replaces it whole
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def write(path: str, kind: str, key: str, payload) -> None:
    """Store `payload` as the entry at `path`, replacing whatever was there; silently nothing when the cache
    cannot be written (a read-only folder: computed again next time)."""
    try:
        text = entry_text(kind, key, payload)
    except ValueError:  # NaN or infinity: not a value to keep
        return
    if not clear_place(path):
        return
    with contextlib.suppress(OSError, InputError):
        write_atomic(path, text)


# ---------------------------------------------------------------------------------------------- folders
def entries(folder: str) -> list[str]:
    """The names of chipsim's entries (and interrupted writes) in `folder`, sorted; nothing else there is its."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if ENTRY_NAME.match(n) or TEMP_NAME.match(n) or DATA_NAME.match(n))


def survey(folder: str, kind: str, check: Check) -> dict:
    """{entries, bytes, failing} of a cache folder: each entry read and checked as a run would (keyed by its
    name), and the reasons of the failing ones."""
    out = {"entries": 0, "bytes": 0, "failing": 0, "problems": []}
    for name in entries(folder):
        path = os.path.join(folder, name)
        try:
            out["bytes"] += os.lstat(path).st_size
        except OSError:
            continue
        if DATA_NAME.match(name):
            continue  # part of the entry of its name (checked when that entry is used)
        out["entries"] += 1
        if not ENTRY_NAME.match(name):
            out["failing"] += 1
            out["problems"].append((name, "left by an interrupted write"))
            continue
        try:
            inspect(path, kind, name[: -len(".json")], check)
        except BadEntry as exc:
            out["failing"] += 1
            out["problems"].append((name, str(exc)))
    return out


def clear(folder: str) -> tuple[int, int]:
    """Remove chipsim's entries from `folder` (never a folder, nor a file it did not name): (entries, bytes), an
    entry's data file (DATA_NAME) counted with its entry."""
    files = size = 0
    for name in entries(folder):
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            os.unlink(path)
        except OSError:
            continue
        files += 0 if DATA_NAME.match(name) else 1
        size += st.st_size
    return files, size


# ---------------------------------------------------------------------------------------------- value checks
def number(value, where: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, integer: bool = False) -> float:
    """A finite number (an int when `integer`) within [low, high] ((low, high] when low_open); else BadEntry."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BadEntry(f"{where}: {str(value)[:40]!r} is not {'a whole number' if integer else 'a number'}")
    if not math.isfinite(value):
        raise BadEntry(f"{where}: {value} is not finite")
    if low is not None and (value <= low if low_open else value < low):
        raise BadEntry(f"{where}: {value} is {'not above' if low_open else 'below'} {low}")
    if high is not None and value > high:
        raise BadEntry(f"{where}: {value} is above {high}")
    return value


def mapping(value, where: str, fields=None) -> dict:
    """A JSON object (with exactly `fields` when given); else BadEntry."""
    if not isinstance(value, dict):
        raise BadEntry(f"{where}: not an object")
    if fields is not None and set(value) != set(fields):
        missing, extra = sorted(set(fields) - set(value)), sorted(set(value) - set(fields))
        raise BadEntry(f"{where}: " + "; ".join(filter(None, [missing and f"missing {', '.join(missing)}",
                                                               extra and f"unknown {', '.join(extra)}"])))
    return value
