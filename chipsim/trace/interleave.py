"""A trace laid out for a batch run (workload.batch, chipsim.workload.batch): token i·B + b is sequence b's i-th,
sequence b reading its own window of the trace (tokens b·n .. b·n + n − 1), so that each step's B tokens are
consecutive, as the engine runs a step of several tokens."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from chipsim.errors import InputError
from chipsim.hw.config import HardwareConfig
from chipsim.trace.format import CORE_ARRAYS, Trace
from chipsim.trace.predictor_arrays import BY_NAME
from chipsim.workload.batch import tokens_per_sequence

def interleave(trace: Trace, batch: int, steps: int) -> Trace:
    """The trace re-ordered for a batch run: token i·B + b is sequence b's i-th (trace token b·steps + i), so step i
    reads B consecutive tokens. Per-token arrays (their spec's first axis is T) are re-ordered when first read."""
    order = (np.arange(batch)[None, :] * steps + np.arange(steps)[:, None]).ravel()
    meta = dict(trace.meta, batch={"sequences": batch, "tokens_each": steps,
                                   "order": "token i*B + b is sequence b's i-th, trace token b*tokens_each + i"})
    arrays = _Interleaved(trace.arrays, order, trace.num_tokens)
    return replace(trace, arrays=arrays, meta=meta, _checked=set(trace._checked))


class _Interleaved(Mapping):
    """A trace's arrays with the per-token ones re-ordered by `order` (each once, on first use, read-only)."""

    def __init__(self, arrays: Mapping, order: np.ndarray, tokens: int):
        self._arrays, self._order, self._tokens = arrays, order, tokens
        self._made: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._arrays)

    def __iter__(self):
        return iter(self._arrays)

    def __contains__(self, name) -> bool:
        return name in self._arrays

    def __getitem__(self, name: str) -> np.ndarray:
        made = self._made.get(name)
        if made is None:
            arr = self._arrays[name]
            spec = CORE_ARRAYS.get(name) or BY_NAME.get(name)
            per_token = spec.per_token if spec is not None else arr.shape[:1] == (self._tokens,)
            if per_token:
                arr = arr[self._order]
                arr.setflags(write=False)
            made = self._made[name] = arr
        return made


def check_batch_fits(hw: HardwareConfig, trace: Trace) -> None:
    """A batch run needs a window of its decode steps for every sequence in the trace; refused in one line."""
    w = hw.workload
    steps = tokens_per_sequence(hw, trace.num_tokens)
    if steps < 1 or steps * w.batch > trace.num_tokens:
        raise InputError(
            f"workload.batch: {w.batch} sequences of {max(steps, 1)} tokens each read "
            f"{w.batch * max(steps, 1)} trace tokens; {trace.path} has {trace.num_tokens} "
            f"(lower workload.max_tokens or workload.batch)")
