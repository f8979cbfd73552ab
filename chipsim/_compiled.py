"""Which of chipsim's modules run compiled, and the guard against running an old compiled copy.

The modules in `COMPILED` (by package) are compiled to C extensions by mypyc when chipsim is installed (setup.py;
`pip install -e .` too): the same code, run two to three times as fast. Where they were not compiled (no C compiler;
CHIPSIM_PURE_PYTHON=1 at install) Python runs their .py files as usual. A compiled module whose .py has changed
since it was compiled would run the old code, so then (or with CHIPSIM_PURE_PYTHON=1 when running) every compiled
module of that package is loaded from its .py file instead, with one warning line when stale; `pip install -e .`
compiles them again. Each package checks this when it is imported (its __init__ calls `load`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

COMPILED: dict[str, tuple[str, ...]] = {
    # the event engine on SimPy (the engine of record): its flow network, DMA queue and decode steps
    "sim": ("flows", "dma", "work", "buffer", "tally", "context", "demands", "engine"),
    # the command-level DRAM model: a config's memories are calibrated with it once per new config
    "dramsim": ("controller", "streams"),
}
RECORD = "_compiled_sources.json"  # written by setup.py in chipsim/: the sha256 of every source it compiled
NATIVE_SOURCE = "sim/native.pyx"  # the fast path's event core in C (Cython), built beside them where Cython is there
COMPILED_STATE, NOT_COMPILED_STATE = "compiled (mypyc)", "pure Python (not compiled)"
_ROOT = Path(__file__).resolve().parent


def source_digest(relative: str) -> str:
    """sha256 of a source file under chipsim/ as it is now (e.g. "sim/engine.py")."""
    return hashlib.sha256((_ROOT / relative).read_bytes()).hexdigest()


def _read_record() -> dict[str, str]:
    try:
        recorded: dict[str, str] = json.loads((_ROOT / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


RECORDED = _read_record()  # the sources the last install compiled ({} if none), read once


def has_extension(package: str, name: str) -> bool:
    return any((_ROOT / package / f"{name}{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def build_state(package: str) -> str:
    """How `package`'s compiled modules run in this process, e.g. "compiled (mypyc)"."""
    names = COMPILED[package]
    if not any(has_extension(package, name) for name in names):
        return NOT_COMPILED_STATE
    if os.environ.get("CHIPSIM_PURE_PYTHON"):
        return "pure Python (CHIPSIM_PURE_PYTHON is set)"
    changed = [f"{package}/{name}.py" for name in names
               if RECORDED.get(f"{package}/{name}.py") != source_digest(f"{package}/{name}.py")]
    if changed:
        return f"pure Python (stale: chipsim/{changed[0]} changed since it was compiled)"
    return COMPILED_STATE


class _SourceFinder:
    """Finds one package's compiled modules as their .py files (ahead of the extension next to each)."""

    def __init__(self, package: str) -> None:
        self.package = f"chipsim.{package}"
        self.names = COMPILED[package]
        self.folder = _ROOT / package

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != self.package or name not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / f"{name}.py")


def load(package: str) -> str:
    """Called by `package`'s __init__: where its compiled modules must not run, load them from their .py files
    (warning once per package and process tree when they are stale). Returns the build state."""
    state = build_state(package)
    if state not in (COMPILED_STATE, NOT_COMPILED_STATE):  # compiled, but not to be run
        sys.meta_path.insert(0, _SourceFinder(package))
        warned = f"CHIPSIM_STALE_WARNED_{package.upper()}"
        if "stale" in state and not os.environ.get(warned):
            os.environ[warned] = "1"  # once, not again in worker processes
            print(f"chipsim: chipsim.{package} runs as {state}; `pip install -e .` compiles it again", file=sys.stderr)
    return state
