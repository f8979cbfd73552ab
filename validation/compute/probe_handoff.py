"""The hand-off between the replay's copy stream and its compute stream, timed alone (the device machine: torch with
CUDA). The simulator starts an expert's kernels the moment its last byte lands and a demand copy the moment routing
is known; on the GPU each is a cross-stream event wait followed by a graph launch or a copy that the host enqueued
ahead of time. Timed with CUDA events (the GPU's clock, common to every stream), `--repeats` times for each copy
size, medians printed; before each case the stream that starts it spins (~100 us; ~2 ms for the spans) so the host
is well ahead:

- copy, graph: a host-to-device copy alone on the copy stream; a CUDA graph of 3 GEMVs (an expert's kernels) alone
  on the compute stream;
- copy_then_graph: the copy, an event, the compute stream waiting on it, then the graph (an expert that stalled
  for its bytes); handoff_copy_to_compute = copy_then_graph - copy - graph, per repeat;
- graph_then_copy: the graph, an event, the copy stream waiting on it, then the copy (a demand copy issued at
  routing); handoff_compute_to_copy = graph_then_copy - graph - copy;
- one_stream: the copy then the graph on one stream (the same transition with no event), to compare;
- spans: 16 copy spans back to back on the copy stream, each as the replay enqueues one (a wait for an event the
  compute stream recorded earlier and has passed, the span's copies, 1 or 3 parts, an event recorded after), against
  the same copies with no events and with only the records: what each span's synchronisation costs the copy
  engine, per span (us_per_span), at three span sizes;
- under_copies: a graph of 64 GEMVs over distinct weights (3 MiB each, an expert's gate and up projections of
  Granite-3B) and one of 64 tiny kernels, each timed alone and while host-to-device copies run throughout on the
  copy stream: how much the copies' writes into HBM slow the kernels (slowdown_pct).

    python validation/compute/probe_handoff.py > validation/compute/h200-handoff.json
"""

import argparse
import json
import statistics

import torch

SPIN_CYCLES = 200_000  # ~100 us at the H200's ~2 GHz
SPAN_SPIN_CYCLES = 4_000_000  # ~2 ms: the host enqueues 16 spans through PyTorch meanwhile


def summary(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median": round(statistics.median(s), 3), "p10": round(s[len(s) // 10], 3),
            "p90": round(s[9 * len(s) // 10], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--copy-kib", default="1024,4096", help="copy sizes, KiB, comma-separated")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_handoff: needs a CUDA GPU")
    dev = torch.device("cuda")
    cs, xs = torch.cuda.Stream(), torch.cuda.Stream()
    w = torch.randn(4096, 1024, dtype=torch.bfloat16, device=dev)  # 8 MiB: a few-us GEMV
    v = torch.randn(1024, dtype=torch.bfloat16, device=dev)
    o = torch.empty(4096, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        torch.mv(w, v, out=o)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            torch.mv(w, v, out=o)
    torch.cuda.synchronize()

    def ev():
        return torch.cuda.Event(enable_timing=True)

    def timed(first: torch.cuda.Stream, first_part, second: torch.cuda.Stream | None = None, second_part=None) -> float:
        """Microseconds from an event before `first_part` (on `first`) to one after `second_part` (on `second`, which
        waits for `first_part` through an event; on `first` itself when `second` is None)."""
        begin, mid, end = ev(), ev(), ev()
        torch.cuda.synchronize()
        with torch.cuda.stream(first):
            torch.cuda._sleep(SPIN_CYCLES)
            begin.record(first)
            first_part()
            mid.record(first)
        last = first
        if second_part is not None:
            last = second or first
            with torch.cuda.stream(last):
                if last is not first:
                    last.wait_event(mid)
                second_part()
        end.record(last)
        torch.cuda.synchronize()
        return 1e3 * begin.elapsed_time(end)

    results = {}
    for kib in (int(k) for k in a.copy_kib.split(",")):
        host = torch.empty(kib << 10, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(kib << 10, dtype=torch.uint8, device=dev)

        def copy(host=host, dst=dst):
            dst.copy_(host, non_blocking=True)

        rows = {"copy_us": [], "graph_us": [], "copy_then_graph_us": [], "graph_then_copy_us": [],
                "one_stream_us": [], "handoff_copy_to_compute_us": [], "handoff_compute_to_copy_us": []}
        for i in range(3 + a.repeats):
            t_copy = timed(xs, copy)
            t_graph = timed(cs, graph.replay)
            t_cg = timed(xs, copy, cs, graph.replay)
            t_gc = timed(cs, graph.replay, xs, copy)
            t_one = timed(xs, copy, None, graph.replay)
            if i < 3:  # warm-up
                continue
            for k, x in (("copy_us", t_copy), ("graph_us", t_graph), ("copy_then_graph_us", t_cg),
                         ("graph_then_copy_us", t_gc), ("one_stream_us", t_one),
                         ("handoff_copy_to_compute_us", t_cg - t_copy - t_graph),
                         ("handoff_compute_to_copy_us", t_gc - t_graph - t_copy)):
                rows[k].append(x)
        results[f"{kib}KiB"] = {"summary": {k: summary(x) for k, x in rows.items()},
                                "samples_us": {k: [round(x, 3) for x in rows[k]] for k in
                                               ("handoff_copy_to_compute_us", "handoff_compute_to_copy_us")}}
    spans = copy_spans(xs, cs, dev, ev, max(20, a.repeats // 4))
    under = under_copies(xs, cs, dev, ev, max(20, a.repeats // 4))
    print(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "repeats": a.repeats,
                      "spin_cycles": SPIN_CYCLES, "graph": "3 x torch.mv, 4096 x 1024 bf16", "copies": results,
                      "spans": spans, "under_copies": under}, indent=1))


def copy_spans(xs, cs, dev, ev, repeats: int, n: int = 16) -> dict:
    """Per-span time of `n` spans back to back on the copy stream `xs`, medians over `repeats`: "plain" (the copies
    alone), "record" (an event recorded after each span), "wait_record" (as the replay: a wait for a passed event
    of the compute stream `cs` before each span, a record after)."""
    out = {}
    for kib in (256, 1024, 4096):
        host = torch.empty(n * kib << 10, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(n * kib << 10, dtype=torch.uint8, device=dev)
        for parts in (1, 3):
            cuts = [kib * 1024 * p // parts for p in range(parts + 1)]
            for mode in ("plain", "record", "wait_record"):
                times = []
                for i in range(3 + repeats):
                    marker, begin, end = ev(), ev(), ev()
                    after = [torch.cuda.Event() for _ in range(n)]
                    marker.record(cs)
                    torch.cuda.synchronize()
                    with torch.cuda.stream(xs):
                        torch.cuda._sleep(SPAN_SPIN_CYCLES)
                        begin.record(xs)
                        for s in range(n):
                            if mode == "wait_record":
                                xs.wait_event(marker)
                            base = s * kib * 1024
                            for lo, hi in zip(cuts, cuts[1:]):
                                dst[base + lo:base + hi].copy_(host[base + lo:base + hi], non_blocking=True)
                            if mode != "plain":
                                after[s].record(xs)
                        end.record(xs)
                    torch.cuda.synchronize()
                    if i >= 3:
                        times.append(1e3 * begin.elapsed_time(end) / n)
                out[f"{kib}KiB x{parts} {mode}"] = {"us_per_span": summary(times)}
    return out


def under_copies(xs, cs, dev, ev, repeats: int) -> dict:
    """Kernel graphs on the compute stream `cs` timed alone and while 16 MiB host-to-device copies keep the copy
    stream `xs` busy from before the graph starts to after it ends; medians over `repeats`, us per graph."""
    ws = [torch.randn(1024, 1536, dtype=torch.bfloat16, device=dev) for _ in range(64)]  # 192 MiB: beyond L2
    v = torch.randn(1536, dtype=torch.bfloat16, device=dev)
    o = torch.empty(1024, dtype=torch.bfloat16, device=dev)
    t = torch.zeros(512, dtype=torch.bfloat16, device=dev)
    graphs = {}
    for name, body in (("gemv 1536x1024 x64", lambda: [torch.mv(w, v, out=o) for w in ws]),
                       ("tiny add x64", lambda: [t.add_(1) for _ in range(64)])):
        body()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        graphs[name] = g
    torch.cuda.synchronize()
    host = torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(16 << 20, dtype=torch.uint8, device=dev)
    out = {}
    for name, g in graphs.items():
        rows = {"alone_us": [], "under_copies_us": []}
        for i in range(3 + repeats):
            for mode in rows:
                begin, end = ev(), ev()
                torch.cuda.synchronize()
                if mode == "under_copies":
                    with torch.cuda.stream(xs):
                        for _ in range(6):  # ~1.8 ms of copies; the graph starts ~0.3 ms in
                            dst.copy_(host, non_blocking=True)
                with torch.cuda.stream(cs):
                    torch.cuda._sleep(SPAN_SPIN_CYCLES // 6)
                    begin.record(cs)
                    g.replay()
                    end.record(cs)
                torch.cuda.synchronize()
                if i >= 3:
                    rows[mode].append(1e3 * begin.elapsed_time(end))
        alone, under = statistics.median(rows["alone_us"]), statistics.median(rows["under_copies_us"])
        out[name] = {**{k: summary(x) for k, x in rows.items()}, "slowdown_pct": round(100.0 * (under - alone) / alone, 2)}
    return out


if __name__ == "__main__":
    main()
