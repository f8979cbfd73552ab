"""Timelines of policy runs as Chrome / Perfetto trace-event JSON (`chipsim run ... --timeline FILE`).

The file is the trace-event "JSON Object Format" (`{"traceEvents": [...], "displayTimeUnit": "ns",
"otherData": {...}}`) that ui.perfetto.dev and chrome://tracing open. One process per policy run, named
by the policy's label; in it one thread ("lane") each for:

- `tokens`: one span per decoded token;
- `arrays 0-N`: every operation on the compute chiplet. An operation occupies all the arrays at once in
  this model, so it is drawn once on a lane standing for all of them, not repeated per array. Stalls
  (the arrays waiting for expert bytes, or for the host that issues them: `stall L<layer>`, L-1 outside MoE
  layers, category `stall`) and waits for the host CPU
  (`host wait L<layer>`) are spans on this lane too; the stall spans of a token sum to its `stall_ps`;
- `DMA engine i`: the setup (`setup L<l>E<e>`) and data phases (`prefetch L<l>E<e>` / `demand L<l>E<e>`,
  categories `prefetch` / `demand`) of the transfers engine i ran; a prefetch that pauses for a demand
  fetch and resumes later shows as several data spans, possibly on different engines. Args: layer,
  expert, bytes (the whole transfer), cancelled, promoted (a prefetch the layer came to wait for);
- `link`: a counter ("C" events, shown as the process's counter tracks `link moving` / `link waiting`):
  transfers sharing the bottleneck bandwidth, and transfers waiting for an engine (queued or paused);
- `host CPU`: experts computed on the host.

Times (`ts`, `dur`) are microseconds, the format's unit, rounded to whole nanoseconds from the simulator's
integer picoseconds: Perfetto rounds every time to a nanosecond, and rounding start and duration apart
would make back-to-back spans overlap by a nanosecond, which it cannot draw. Rounding each boundary once
keeps every span's start and end exactly where its neighbours' are.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right

from chipsim.files import write_atomic

# lanes: thread id = pid * LANE_STRIDE + offset; order in the viewer by sort index
LANE_STRIDE = 1000
TOKENS, ARRAYS, HOST, LINK, DMA0 = 1, 2, 3, 4, 10
_SORT = {TOKENS: 0, ARRAYS: 1, LINK: 900, HOST: 901}

# a request's prefill chunk on the tokens lane (chipsim.sim.timeline_recorder): chunk, first and last prompt token
_PREFILL = re.compile(r"^prefill chunk (\d+) \(prompt tokens (\d+)-(\d+)\)$")


def _step_token(name: str) -> int:
    """The token a step's span ends: "token N", or a prefill chunk's last prompt token."""
    chunk = _PREFILL.match(name)
    return int(chunk[3]) if chunk else int(name.split()[1])

_STALL = re.compile(r"L(-?\d+) stall$")  # L-1: outside MoE layers (a host held in pageable copies)
_HOST_WAIT = re.compile(r"L(\d+) host wait$")
_EXPERT = re.compile(r"L(\d+)E(\d+)$")


def _us(ps: int) -> float:
    """Integer picoseconds -> microseconds, rounded to a whole nanosecond."""
    return ((ps + 500) // 1000) / 1000


def _span(name: str, cat: str, start: int, end: int, pid: int, tid: int, args: dict | None = None) -> dict:
    # dur from the rounded ends, so that ts + dur is exactly the rounded end
    dur = ((end + 500) // 1000 - (start + 500) // 1000) / 1000
    ev = {"name": name, "cat": cat, "ph": "X", "ts": _us(start), "dur": dur, "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0.0, "pid": pid, "tid": tid, "args": args}


def _process_events(pid: int, run: dict) -> list[dict]:
    base = pid * LANE_STRIDE
    arrays = run["arrays"]
    names = {TOKENS: "tokens", LINK: "link (counters: moving, waiting)", HOST: "host CPU",
             ARRAYS: f"arrays 0-{arrays - 1} (each op uses all {arrays})" if arrays > 1 else "array 0"}
    for i in range(run["engines"]):
        names[DMA0 + i] = f"DMA engine {i}"
    meta = [_meta("process_name", pid, 0, {"name": run["label"]}),
            _meta("process_sort_index", pid, 0, {"sort_index": pid})]
    for lane in sorted(names):
        meta.append(_meta("thread_name", pid, base + lane, {"name": names[lane]}))
        meta.append(_meta("thread_sort_index", pid, base + lane, {"sort_index": _SORT.get(lane, lane)}))

    tokens = sorted((start, end, _step_token(name)) for lane, name, start, end in run["events"] if lane == "tokens")
    token_starts = [start for start, _, _ in tokens]

    def token_of(ps: int) -> int:
        return tokens[bisect_right(token_starts, ps) - 1][2] if tokens and ps >= token_starts[0] else -1

    spans = []  # (tid, start, end, name, event)
    for lane, name, start, end in run["events"]:
        if lane == "tokens":
            chunk = _PREFILL.match(name)
            args = ({"chunk": int(chunk[1]), "first": int(chunk[2]), "last": int(chunk[3])} if chunk
                    else {"token": int(name.split()[1])})
            tid, ev = TOKENS, _span(name, "prefill" if chunk else "token", start, end, pid, base + TOKENS, args)
        elif lane == "arrays":
            m = _STALL.match(name)
            w = _HOST_WAIT.match(name) if m is None else None
            if m is not None:
                ev = _span(f"stall L{m[1]}", "stall", start, end, pid, base + ARRAYS,
                           {"layer": int(m[1]), "token": token_of(start)})
            elif w is not None:
                ev = _span(f"host wait L{w[1]}", "host-wait", start, end, pid, base + ARRAYS,
                           {"layer": int(w[1]), "token": token_of(start)})
            else:
                ev = _span(name, "compute", start, end, pid, base + ARRAYS)
            tid = ARRAYS
        elif lane == "host-cpu":
            m = _EXPERT.match(name)
            args = {"layer": int(m[1]), "expert": int(m[2])} if m else None
            tid, ev = HOST, _span(f"host {name}", "host-cpu", start, end, pid, base + HOST, args)
        else:
            continue
        spans.append((tid, start, end, ev["name"], ev))
    for engine, phase, start, end, layer, expert, nbytes, kind, cancelled, promoted in run["dma"]:
        args = {"layer": layer, "expert": expert, "bytes": nbytes, "cancelled": bool(cancelled)}
        if promoted:
            args["promoted"] = True
        if phase == "setup":
            name, cat = f"setup L{layer}E{expert}", f"setup,{kind}"
        else:
            name, cat = f"{kind} L{layer}E{expert}", kind
        tid = DMA0 + engine
        spans.append((tid, start, end, name, _span(name, cat, start, end, pid, base + tid, args)))
    spans.sort(key=lambda s: (_SORT.get(s[0], s[0]), s[1], s[2], s[3]))
    counters = [{"name": "link", "ph": "C", "ts": _us(t), "pid": pid, "tid": base + LINK,
                 "args": {"moving": moving, "waiting": waiting}} for t, moving, waiting in run["link"]]
    return meta + [s[4] for s in spans] + counters


def build_trace(runs: list[dict], other: dict | None = None) -> dict:
    """The trace-event JSON object for several policy runs (`RecordedTimeline.run_data`), one process each."""
    events = []
    for pid, run in enumerate(runs, start=1):
        events.extend(_process_events(pid, run))
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": dict(other or {})}


def dumps(trace: dict) -> str:
    """Deterministic text: keys sorted, one event per line."""
    parts = []
    for key in sorted(trace):
        if key == "traceEvents":
            body = ",\n".join(json.dumps(ev, sort_keys=True, separators=(",", ":")) for ev in trace[key])
            parts.append(f'"traceEvents":[\n{body}\n]')
        else:
            parts.append(f"{json.dumps(key)}:{json.dumps(trace[key], sort_keys=True, separators=(',', ':'))}")
    return "{" + ",\n".join(parts) + "}\n"


def estimate_bytes(tokens: int, policies: int, model) -> float:
    """About how large a timeline of `tokens` tokens of `policies` runs is: per MoE layer and token some six
    operation spans plus a setup and a data span for each of top-k transfers, ~170 bytes each (measured on
    thor: 1,024 Granite-3B tokens of no-prefetch give 121.5 MB)."""
    return tokens * policies * model.num_layers * (6 + 2 * model.top_k) * 170.0


def write(path: str, trace: dict) -> None:
    """Write the trace-event file, whole or not at all (only ever replacing a regular file)."""
    write_atomic(path, dumps(trace), what="--timeline")
