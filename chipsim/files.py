"""Reading inputs and writing outputs safely: the one input reader every file a user names goes through
(read_input / open_input: regular files of bounded size only) and the one atomic writer every output goes
through (write_atomic: whole or not at all)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import BinaryIO, Callable

from chipsim.errors import InputError


# Bounds on what one input file may hold, each far above any real file of its kind, so that a wrong path (a
# disk image, /dev/zero, a log) is refused in one line instead of filling memory.
MIB = 1 << 20
GIB = 1 << 30
YAML_MAX_BYTES = 4 * MIB  # a config, base, DRAM standard or experiment: thor.yaml is 12 KB, the largest (h200) 28 KB
JSON_MAX_BYTES = 64 * MIB  # a measurement or reference JSON: the largest committed (validation/regimes) is 5.9 MB
TRACE_MAX_BYTES = 4 * GIB  # an .npz trace: the bundled ones are 1-16 MB, a 32k-token trace 190 MB
TEXT_MAX_BYTES = 4 * MIB  # a notes file and other small text inputs


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a one-line message ("a FIFO (named pipe)")."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _check_input_stat(st: os.stat_result, label: str, max_bytes: int) -> None:
    """A regular file no larger than `max_bytes`, or one line saying what it is instead."""
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{label}: is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise InputError(f"{label}: is {st.st_size / MIB:.1f} MiB, over the {max_bytes / MIB:g} MiB such a file "
                         "may be")


def check_input(path: str, what: str, max_bytes: int) -> None:
    """Before any work: `path` exists and is a regular file of at most `max_bytes` (open_input checks again when
    it reads it)."""
    label = f"{what} {path}" if what else str(path)
    try:
        _check_input_stat(os.stat(path), label, max_bytes)
    except FileNotFoundError:
        raise InputError(f"{label}: file not found") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None


def open_input(path: str, what: str, max_bytes: int) -> BinaryIO:
    """Open a file the user named (a config, trace, reference ...) for reading, binary, after checking that it
    is a regular file of at most `max_bytes` (a symbolic link to one is fine); `what` names it in the one-line
    error ("config", "trace", "--microbench"). The path is checked before it is opened and the open file again
    (fstat): it is opened without blocking, so a FIFO swapped in between is refused instead of waiting for a
    writer. The caller closes the file and reads no more than `max_bytes` from it (read_input does both)."""
    label = f"{what} {path}" if what else str(path)
    if not path:
        raise InputError(f"{what}: empty path")
    try:
        _check_input_stat(os.stat(path), label, max_bytes)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{label}: file not found") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        _check_input_stat(os.fstat(fd), label, max_bytes)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str, what: str, max_bytes: int) -> bytes:
    """The whole content of a file the user named, read safely (see open_input); a file that grew past
    `max_bytes` while it was read is refused too. Every input of chipsim is read through here or open_input."""
    label = f"{what} {path}" if what else str(path)
    with open_input(path, what, max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InputError(f"{label}: grew past {max_bytes / MIB:g} MiB while it was read")
    return data


def read_input_text(path: str, what: str, max_bytes: int) -> str:
    """read_input, decoded as UTF-8 (one line naming the file when it is not)."""
    data = read_input(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        label = f"{what} {path}" if what else str(path)
        raise InputError(f"{label}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | None, what: str = "JSON file", max_bytes: int = JSON_MAX_BYTES, unique_keys: bool = False):
    """A JSON file named on a command line, or None when not named; one clear line when it cannot be read, or,
    with `unique_keys`, when an object names a key twice (json keeps the last silently; YAML inputs refuse it)."""
    import json

    if not path:
        return None
    text = read_input_text(path, what, max_bytes)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except RecursionError:
        raise InputError(f"{what} {path}: not JSON (nested too deeply)") from None
    except ValueError as exc:
        raise InputError(f"{what} {path}: not JSON ({exc})") from None


def _unique_keys(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"key {twice[0]!r} given twice in one object")
    return dict(pairs)


def cache_dir(kind: str) -> str:
    """Where the computed-once tables of one kind live (`dram`, `compute`): $CHIPSIM_CACHE_DIR/<kind>, by default
    ~/.cache/chipsim/<kind>."""
    base = os.environ.get("CHIPSIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "chipsim")
    return os.path.join(base, kind)


def write_atomic(path: str, data: str | bytes | Callable[[BinaryIO], None], what: str = "") -> None:
    """Write `data` to `path` through a temporary file in the same directory, then rename it into place, so
    that a reader never sees a half-written file and a failure leaves nothing behind. `data` may also be a
    function that writes into the open binary file (a large output streams instead of being built in memory
    first); whatever it raises leaves nothing behind either. The file gets the ordinary permissions of a new
    file (0666 less the umask). `what` names the option or file in the one-line error (e.g. "--timeline")."""
    parent = os.path.dirname(os.path.abspath(path))
    label = f"{what} {path}" if what else path
    _refuse_special(path, label)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        text = isinstance(data, str)
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is private; an output is an ordinary file
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"{label}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _refuse_special(path: str, label: str) -> None:
    """Only a regular file is ever replaced: never a FIFO, a device, a socket, a symbolic link or a folder."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"{label}: cannot inspect ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{label}: is a directory")
    if not stat.S_ISREG(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise InputError(f"{label}: is {kind}; refusing to replace it")


def _probe(directory: str, label: str) -> None:
    """Whether a file can be created in `directory` (permissions, a read-only file system, a full quota)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".chipsim-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise InputError(f"{label}: cannot write in {directory} ({exc.strerror or exc})") from None


def _existing_ancestor(path: str) -> str:
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder


def check_output_file(path: str, what: str) -> None:
    """Before any work: `path` can be written as an output file (its folder exists and is writable, and it
    is absent or a regular file)."""
    label = f"{what} {path}"
    if not path:
        raise InputError(f"{what}: empty path")
    _refuse_special(path, label)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"{label}: directory {parent} does not exist")
    _probe(parent, label)


def check_output_dir(path: str, names, what: str) -> None:
    """Before any work: `path` is (or can be made) a folder in which the files `names` can be written."""
    label = f"{what} {path}"
    if not path:
        raise InputError(f"{what}: empty path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InputError(f"{label}: exists and is not a directory")
    for name in names:
        _refuse_special(os.path.join(path, name), f"{label}: {name}")
    folder = _existing_ancestor(path)
    if not os.path.isdir(folder):
        raise InputError(f"{label}: {folder} is not a directory")
    _probe(folder, label)


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
