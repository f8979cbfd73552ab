"""Writing output files whole or not at all: the one atomic writer every output of chipsim goes through."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import BinaryIO, Callable

from chipsim.errors import InputError


def read_json(path: str | None):
    """A JSON file named on a command line, or None when not named; one clear line when it cannot be read."""
    import json

    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise InputError(f"{exc.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None


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
