"""The event-level model: the decode-step engine (engine) on an event core (core: SimPy, the engine of record, or
the C event core native), the flow network (flows) and the DMA queue (dma), plus what they record.

The engine's modules are compiled by mypyc at install (chipsim._compiled: which modules, and the guard that runs
their .py files instead where a compiled copy is stale). `BUILD` says how they run in this process and `NATIVE`
whether the C event core may run (chipsim.sim.core.fast_core).
"""

from __future__ import annotations

import os
import sys

from chipsim import _compiled

BUILD = _compiled.load("sim")  # how the event engine runs in this process, e.g. "compiled (mypyc)"


def _native_state() -> bool:
    """Whether chipsim.sim.native may run: built from native.pyx as it is now, with the rest compiled and run so."""
    if BUILD != _compiled.COMPILED_STATE or not _compiled.has_extension("sim", "native"):
        return False
    recorded = _compiled.RECORDED
    source = _compiled.NATIVE_SOURCE
    if source not in recorded:  # the last install did not build it (no Cython): an older build's file stays unused
        return False
    if recorded[source] == _compiled.source_digest(source):
        return True
    if not os.environ.get("CHIPSIM_NATIVE_STALE_WARNED"):
        os.environ["CHIPSIM_NATIVE_STALE_WARNED"] = "1"  # once, not again in worker processes
        print(f"chipsim: chipsim/{source} changed since it was built: `run.engine: fast` runs on SimPy "
              "(the same results, slower); `pip install -e .` builds it again", file=sys.stderr)
    return False


NATIVE = _native_state()  # `run.engine: fast` runs on chipsim.sim.native (chipsim.sim.core.native_available)
