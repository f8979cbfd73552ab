"""The event-level model: the decode-step engine (engine), its fast path (fast, fast_flows, fast_dma, wake), the flow
network (flows) and the DMA queue (dma), plus what they record.

Those modules (`COMPILED`) are compiled to C extensions by mypyc when chipsim is installed (setup.py; `pip install
-e .` too): the same code, run about twice as fast. Where they were not compiled (no C compiler; CHIPSIM_PURE_PYTHON=1
at install) Python runs their .py files as usual. A compiled module whose .py has changed since it was compiled
would run the old code, so then (or with CHIPSIM_PURE_PYTHON=1 when running) every one of them is loaded from its .py
file instead, with one warning line when stale; `pip install -e .` compiles them again.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

COMPILED = ("wake", "flows", "dma", "fast_flows", "fast_dma", "engine", "fast")
RECORD = "_compiled_sources.json"  # written by setup.py next to the compiled modules: the sources they came from
NATIVE_SOURCE = "native.pyx"  # the fast path's event core in C (Cython), built beside them where Cython is there
_HERE = Path(__file__).resolve().parent


def source_digests() -> dict[str, str]:
    """sha256 of each compiled module's .py file as it is now."""
    return {name: hashlib.sha256((_HERE / f"{name}.py").read_bytes()).hexdigest() for name in COMPILED}


def _has_extensions() -> bool:
    return any((_HERE / f"{name}{suffix}").exists() for name in COMPILED
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


_COMPILED_STATE, _NOT_COMPILED_STATE = "compiled (mypyc)", "pure Python (not compiled)"


def _recorded() -> dict[str, str]:
    """The sources the last install compiled (their sha256 by module; "native": native.pyx), {} if none."""
    try:
        recorded: dict[str, str] = json.loads((_HERE / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return recorded


_RECORDED = _recorded()


def _build_state() -> str:
    if not _has_extensions():
        return _NOT_COMPILED_STATE
    if os.environ.get("CHIPSIM_PURE_PYTHON"):
        return "pure Python (CHIPSIM_PURE_PYTHON is set)"
    recorded = _RECORDED
    changed = [name for name, digest in source_digests().items() if recorded.get(name) != digest]
    if changed:
        return f"pure Python (stale: chipsim/sim/{changed[0]}.py changed since it was compiled)"
    return _COMPILED_STATE


class _SourceFinder:
    """Finds this package's compiled modules as their .py files (ahead of the extension next to each)."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, _HERE / f"{name}.py")


BUILD = _build_state()  # how the event engine runs in this process, e.g. "compiled (mypyc)"
if BUILD not in (_COMPILED_STATE, _NOT_COMPILED_STATE):  # compiled, but not to be run
    sys.meta_path.insert(0, _SourceFinder())
    if "stale" in BUILD and not os.environ.get("CHIPSIM_STALE_WARNED"):
        os.environ["CHIPSIM_STALE_WARNED"] = "1"  # once, not again in worker processes
        print(f"chipsim: the event engine runs as {BUILD}; `pip install -e .` compiles it again", file=sys.stderr)


def _native_state() -> bool:
    """Whether chipsim.sim.native may run: built from native.pyx as it is now, with the rest compiled and run so."""
    if BUILD != _COMPILED_STATE or not any((_HERE / f"native{suffix}").exists()
                                           for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return False
    recorded = _RECORDED
    if "native" not in recorded:  # the last install did not build it (no Cython): an older build's file stays unused
        return False
    if recorded["native"] == hashlib.sha256((_HERE / NATIVE_SOURCE).read_bytes()).hexdigest():
        return True
    if not os.environ.get("CHIPSIM_NATIVE_STALE_WARNED"):
        os.environ["CHIPSIM_NATIVE_STALE_WARNED"] = "1"  # once, not again in worker processes
        print(f"chipsim: chipsim/sim/{NATIVE_SOURCE} changed since it was built: the fast path runs without its C "
              "event core (the same results, slower); `pip install -e .` builds it again", file=sys.stderr)
    return False


NATIVE = _native_state()  # the fast path runs on chipsim.sim.native (chipsim.sim.fast.native_available)
