"""What the GPU did during a replay, from its own activity record, with no event on any stream.

A replay's token latencies come from CUDA events on the compute stream, and its --stalls and --op-spans put more
events there, which cost the GPU time (validation/compute/probe_step_costs.py). CUPTI's activity record (through
torch.profiler) instead stamps every kernel and every copy with its start and end on the GPU's clock. `run
--activity` replays each plan once more under it (after the measured replays, which it leaves as they were) and keeps
this module's summary of the record, in the simulator's terms:

- the compute stream (the stream with the most kernel time): its kernels' busy time, and its idle gaps split into
  those a host-to-device copy ended inside (in a replay whose compute waits for its copies, LRU's, its waits; a
  prefetch that lands during a launch gap counts too: the record says what ended when, not what waited for what)
  and the rest (launches, the host);
- the hand-off: from the last copy that ended inside such a gap to the next kernel (compute.copy_wait_ns's
  counterpart);
- the copies: how many, their busy time, and of those no other copy overlapped (a copy sharing the link runs
  slower), the median duration per size, and where there are two sizes or more a least-squares fit to
  intercept + bytes / bandwidth (the link's keys, measured beside the replay's compute rather than on an idle GPU);
- each copy's start: where a compute kernel ended while its stream was idle, how long after the last kernel to end
  (an on-demand copy's start after the compute event it waits for; for a prefetch, whatever kernel ended last), and
  otherwise how long after the copy before it on its stream ended.

A record is complete when it holds every copy the replay made (the profiler stops collecting when its buffer is full,
and says so only in its log): the summary's "complete".

Everything is per token of the replay, warm-up tokens included (the record has no token marks), so its counterpart is
the simulator's mean over all of the plan's tokens (chipsim.hwreplay.compare_activity sets them side by side).
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

from chipsim.errors import InputError
from chipsim.hwreplay.fits import fit_intercept_and_rate

TRACE_MAX_BYTES = 2 << 30  # a 144-token Granite-3B replay: 2.3e5 kernels and 2.4e4-8.2e4 copies, well under this


@dataclass(frozen=True)
class Activity:
    kind: str  # "kernel" or "copy" (host to device)
    stream: int
    start_ns: int
    end_ns: int
    bytes: int = 0


def activities_from_trace(trace: dict, label: str = "trace") -> list[Activity]:
    """The kernels and host-to-device copies of a Chrome trace as torch.profiler exports it (times in µs)."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise InputError(f"{label}: no traceEvents list (not a torch.profiler Chrome trace)")
    gpu = [e for e in events if isinstance(e, dict) and _kind(e)]
    try:
        times = [(float(e["ts"]), float(e["dur"])) for e in gpu]
        t0 = min((ts for ts, _ in times), default=0.0)
        out = [Activity(_kind(e), int(e.get("args", {}).get("stream", e.get("tid", 0))), round((ts - t0) * 1000),
                        round((ts - t0 + dur) * 1000), int(e.get("args", {}).get("bytes", 0)))
               for e, (ts, dur) in zip(gpu, times)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{label}: a kernel or copy event without a numeric ts, dur, stream or bytes "
                         f"({type(exc).__name__}: {exc})") from None
    return sorted(out, key=lambda a: (a.start_ns, a.end_ns))


def _kind(e: dict) -> str:
    if e.get("cat") == "kernel":
        return "kernel"
    if e.get("cat") == "gpu_memcpy" and "HtoD" in str(e.get("name", "")):
        return "copy"
    return ""


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _spread(xs: list[float]) -> dict:
    """Median, 10th and 90th percentile (nearest rank) and count, µs."""
    if not xs:
        return {"n": 0}
    s = sorted(xs)
    at = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]  # noqa: E731
    return {"n": len(s), "median_us": round(statistics.median(s) / 1e3, 3), "p10_us": round(at(0.1) / 1e3, 3),
            "p90_us": round(at(0.9) / 1e3, 3)}


def compute_stream(acts: list[Activity]) -> int | None:
    """The stream whose kernels ran longest (the replay's compute stream)."""
    busy: dict[int, int] = {}
    for a in acts:
        if a.kind == "kernel":
            busy[a.stream] = busy.get(a.stream, 0) + a.end_ns - a.start_ns
    return max(sorted(busy), key=lambda s: busy[s]) if busy else None


def compute_gaps(busy: list[tuple[int, int]], copy_ends: list[int]) -> tuple[int, int, list[int]]:
    """The compute stream's idle gaps between busy stretches: (ns waiting for a copy, ns otherwise, hand-offs in ns).
    A gap waits for a copy when one ends inside it; its hand-off is from the last such end to the next kernel."""
    waiting = other = 0
    handoffs = []
    for (_, g0), (g1, _) in zip(busy, busy[1:]):
        i = bisect.bisect_right(copy_ends, g1) - 1
        if i >= 0 and copy_ends[i] >= g0:
            waiting += g1 - g0
            handoffs.append(g1 - copy_ends[i])
        else:
            other += g1 - g0
    return waiting, other, handoffs


def copy_fit(copies: list[Activity]) -> dict:
    """Each copy's duration = intercept + bytes / bandwidth, the copy microbenchmark's least-squares fit (needs two
    sizes at least)."""
    if len({c.bytes for c in copies}) < 2:
        return {}
    return fit_intercept_and_rate([c.bytes for c in copies], [(c.end_ns - c.start_ns) / 1e3 for c in copies])


def lone(copies: list[Activity]) -> list[Activity]:
    """The copies no other copy overlapped (each had the link to itself)."""
    s = sorted(copies, key=lambda c: (c.start_ns, c.end_ns))
    out, reach = [], -1  # reach: the latest end of the copies before
    for i, c in enumerate(s):
        nxt = s[i + 1].start_ns if i + 1 < len(s) else c.end_ns
        if c.start_ns >= reach and nxt >= c.end_ns:
            out.append(c)
        reach = max(reach, c.end_ns)
    return out


def _by_size(copies: list[Activity]) -> list[dict]:
    sizes: dict[int, list[int]] = {}
    for c in copies:
        sizes.setdefault(c.bytes, []).append(c.end_ns - c.start_ns)
    return [{"bytes": b, "n": len(d), "median_us": round(statistics.median(d) / 1e3, 3)} for b, d in sorted(sizes.items())]


def copy_gaps(copies: list[Activity], kernel_ends: list[int]) -> tuple[list[int], list[int]]:
    """Each copy's start after the one before it on its stream ended: (ns since a compute kernel that ended inside
    that idle gap, for copies that waited for compute; the gap itself, for the rest)."""
    after_kernel, between = [], []
    prev: dict[int, int] = {}
    for c in sorted(copies, key=lambda c: c.start_ns):
        i = bisect.bisect_right(kernel_ends, c.start_ns) - 1
        if i >= 0 and kernel_ends[i] > prev.get(c.stream, -1):
            after_kernel.append(c.start_ns - kernel_ends[i])
        elif c.stream in prev:
            between.append(c.start_ns - prev[c.stream])
        prev[c.stream] = max(prev.get(c.stream, -1), c.end_ns)
    return after_kernel, between


def summarise(acts: list[Activity], tokens: int) -> dict:
    """The record's summary (module docstring), per token of `tokens`."""
    if tokens < 1:
        raise ValueError(f"tokens {tokens}: at least 1")
    cs = compute_stream(acts)
    if cs is None:
        return {"kernels": 0, "copies": {"n": 0}}
    kernels = [a for a in acts if a.kind == "kernel" and a.stream == cs]
    copies = [a for a in acts if a.kind == "copy"]
    busy = _merged([(k.start_ns, k.end_ns) for k in kernels])
    waiting, other, handoffs = compute_gaps(busy, sorted(c.end_ns for c in copies))
    first, last = min(a.start_ns for a in acts), max(a.end_ns for a in acts)
    per_token = lambda ns: round(ns / tokens / 1e6, 4)  # noqa: E731
    after_kernel, between = copy_gaps(copies, sorted(k.end_ns for k in kernels))
    alone = lone(copies)
    copy_busy = sum(b - a for a, b in _merged([(c.start_ns, c.end_ns) for c in copies]))
    return {
        "tokens": tokens, "span_ms_per_token": per_token(last - first), "kernels": len(kernels),
        "other_stream_kernels": sum(1 for a in acts if a.kind == "kernel" and a.stream != cs),
        "compute_busy_ms_per_token": per_token(sum(b - a for a, b in busy)),
        "compute_waits_for_copies_ms_per_token": per_token(waiting),
        "compute_other_gaps_ms_per_token": per_token(other), "handoff": _spread(handoffs),
        "copies": {"n": len(copies), "streams": len({c.stream for c in copies}), "bytes": sum(c.bytes for c in copies),
                   "busy_ms_per_token": per_token(copy_busy), "alone": len(alone), "fit": copy_fit(alone),
                   "by_size": _by_size(alone)},
        "copy_start_after_kernel": _spread(after_kernel), "copy_after_copy": _spread(between),
    }


def record_activity(run) -> tuple[object, list[Activity]]:
    """run() under torch.profiler's activity record (CUDA where there is a GPU; on a CPU dry run the CPU's, which has
    no kernel or copy): its result and the record's kernels and copies."""
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    from chipsim.files import read_json

    kind = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[kind]) as prof:
        result = run()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        trace = read_json(path, "activity trace", TRACE_MAX_BYTES)
    return result, activities_from_trace(trace, "activity trace")


def traced_replay(run, plan, copies: int) -> dict:
    """run() (one replay of `plan`, making `copies` copies) under the activity record: the record's summary, per token
    of the replay's, whether it holds every copy, the replay's own token latency (its CUDA events) while traced, and
    the plan's simulated latency and stall over the same tokens (as planned: the config the replay ran with) and its
    arrays' busy time."""
    res, acts = record_activity(run)
    lat, n = res["latency_ms"], len(plan.sim_latency_ms)
    s = summarise(acts, len(lat))
    return {**s, "complete": s["copies"]["n"] == copies, "latency_ms_per_token": round(sum(lat) / len(lat), 4),
            "sim_latency_ms_per_token": round(sum(plan.sim_latency_ms) / n, 4),
            "sim_stall_ms_per_token": round(sum(map(sum, plan.sim_stall_ms)) / n, 4),
            "sim_busy_ms_per_token": round(sum(plan.sim_busy_ms) / n, 4)}


def activity_text(a: dict) -> str:
    """The summary on a replay's log line."""
    if not a.get("kernels"):
        return ": no kernel in the record (a CPU dry run)"
    sizes = ", ".join(f"{b['bytes']} B {b['median_us']} us" for b in a["copies"]["by_size"][:3])
    return (f" {a['latency_ms_per_token']:.3f} ms/token{'' if a['complete'] else ' (INCOMPLETE record)'}: compute busy "
            f"{a['compute_busy_ms_per_token']:.3f}, waiting for copies {a['compute_waits_for_copies_ms_per_token']:.3f}, "
            f"other gaps {a['compute_other_gaps_ms_per_token']:.3f}; copies alone {sizes or 'none'}")
