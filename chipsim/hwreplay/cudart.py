"""The replay's host front-end without PyTorch's per-call cost: the compiled program lowered to raw CUDA runtime
calls (cudaMemcpyAsync, cudaEventRecord, cudaStreamWaitEvent, cudaGraphLaunch) on the handles PyTorch made, and
issued through ctypes from the libcudart PyTorch itself loaded.

Why: where a quarter of 4-bit experts fit on the GPU, a Granite-3B token enqueues 165-567 copies and ~190 graph
launches; through `Tensor.copy_` and `CUDAGraph.replay` that cost the host 4.7-8.5 ms per token, more than the
GPU's own time, so the replay measured its host. The same calls made directly cost the host a few microseconds
each. The GPU receives the same operations on the same streams in the same order.

Nothing here is new CUDA code: the library is the one PyTorch ships with (no dependency is added).
"""

from __future__ import annotations

import ctypes
import functools

_H2D = 1  # cudaMemcpyHostToDevice

# name: (argument types); every call returns a cudaError_t (0: success)
_SIGNATURES = {
    "cudaMemcpyAsync": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p),
    "cudaEventRecord": (ctypes.c_void_p, ctypes.c_void_p),
    "cudaStreamWaitEvent": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint),
    "cudaGraphLaunch": (ctypes.c_void_p, ctypes.c_void_p),
}


def lower(prog: list, compute_stream, handle, is_graph_launch) -> list:
    """The harness's compiled program (chipsim.hwreplay.harness.replay) as (call name, arguments) pairs, with
    ("token", (event, compute stream)) where a token ends (an event record the host also marks). Compute runs on
    `compute_stream`. handle(obj): the raw handle of a stream, an event or a graph's executable (an int; None for a
    graph whose executable PyTorch does not expose: its replay is then called as it is, with the compute stream
    current); is_graph_launch(fn): whether a compute call is a captured graph's replay (only those can be
    lowered: the replay must run with --graphs)."""
    cs = handle(compute_stream)
    low = []
    for op in prog:
        kind = op[0]
        if kind == "c":
            for fn, args, kwargs in op[1]:
                if not is_graph_launch(fn) or args or kwargs:
                    raise ValueError("the cudart front-end launches captured CUDA graphs only (replay with --graphs)")
                exe = handle(fn.__self__)
                low.append(("cudaGraphLaunch", (exe, cs)) if exe is not None else ("call", (fn,)))
        elif kind == "x":
            _, stream, after, pairs, done = op
            s = handle(stream)
            if after is not None:
                low.append(("cudaStreamWaitEvent", (s, handle(after), 0)))
            for dst, src in pairs:
                low.append(("cudaMemcpyAsync", (dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size(), _H2D, s)))
            low.append(("cudaEventRecord", (handle(done), s)))
        elif kind == "wait":
            low.append(("cudaStreamWaitEvent", (handle(op[1]), handle(op[2]), 0)))
        elif kind == "rec":
            low.append(("cudaEventRecord", (handle(op[1]), handle(op[2]))))
        elif kind == "tok":
            low.append(("token", (handle(op[1]), cs)))
        elif kind == "host":  # the host computes experts (chipsim.hwreplay.host_cpu), then enqueues on
            low.append(("call", (functools.partial(op[1].run, op[2], op[3], compute_stream),)))
        else:
            raise ValueError(f"unknown program step {kind!r}")
    return low


def _library_path() -> str:
    """The libcudart this process has loaded (PyTorch's), found in its memory map."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        paths = set()
    if paths:
        return sorted(paths)[0]
    import ctypes.util

    found = ctypes.util.find_library("cudart")
    if found is None:
        raise RuntimeError("hwreplay --enqueue cudart: no libcudart loaded in this process or on the library path")
    return found


def _call(fn) -> int:
    fn()
    return 0


class Runtime:
    """The four calls, bound once; `run(low, marks, clock)` issues a lowered program."""

    def __init__(self, path: str | None = None) -> None:
        lib = ctypes.CDLL(path or _library_path())
        self.fns = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            self.fns[name] = fn
        self.fns["token"] = self.fns["cudaEventRecord"]
        self.fns["call"] = _call

    def bind(self, low: list) -> list:
        """(function, arguments, marks the host clock) per call, resolved before any timing."""
        return [(self.fns[name], args, name == "token") for name, args in low]

    @staticmethod
    def run(bound: list, marks: list, clock) -> None:
        for fn, args, token in bound:
            err = fn(*args)
            if err:
                raise RuntimeError(f"hwreplay --enqueue cudart: {fn.__name__}{args} returned CUDA error {err}")
            if token:
                marks.append(clock())

