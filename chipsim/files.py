"""Writing output files whole or not at all: the one atomic writer every output of chipsim goes through."""

from __future__ import annotations

import contextlib
import os
import tempfile

from chipsim.errors import InputError


def write_atomic(path: str, data: str | bytes, what: str = "") -> None:
    """Write `data` to `path` through a temporary file in the same directory, then rename it into place, so
    that a reader never sees a half-written file and a failure leaves nothing behind. The file gets the
    ordinary permissions of a new file (0666 less the umask). `what` names the option or file in the one-line
    error (e.g. "--timeline")."""
    parent = os.path.dirname(os.path.abspath(path))
    label = f"{what} {path}" if what else path
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w", **({} if isinstance(data, bytes)
                                                                        else {"encoding": "utf-8"})) as fh:
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
