"""VALIDATION.md sections from two single-purpose device probes, as `chipsim hwcompare --handoff/--step-energy`
renders them: the copy/compute streams' hand-off (validation/compute/probe_handoff.py) and a token's kernels run
together against the same kernels alone (validation/energy/probe_step_energy.py)."""

from __future__ import annotations

from chipsim.errors import InputError
from chipsim.hwreplay.energy_table import above_idle_j


def _median(summary: dict, key: str) -> float:
    return float(summary[key]["median"])


def handoff_lines(probe: dict, source: str) -> list[str]:
    """The hand-off table: per copy size, each part alone, the two cross-stream sequences and what each adds over
    its parts; per span layout, a copy span's time plain, with a record, and with the replay's wait and record."""
    try:
        sizes = probe["copies"]
        spans = probe.get("spans", {})
        rows = []
        for size, v in sizes.items():
            s = v["summary"]
            rows.append(f"| {size} | {_median(s, 'copy_us'):.2f} | {_median(s, 'graph_us'):.2f} | "
                        f"{_median(s, 'copy_then_graph_us'):.2f} | {_median(s, 'one_stream_us'):.2f} | "
                        f"{_median(s, 'handoff_copy_to_compute_us'):+.2f} | {_median(s, 'graph_then_copy_us'):.2f} | "
                        f"{_median(s, 'handoff_compute_to_copy_us'):+.2f} |")
        span_rows = []
        layouts = sorted({k.rsplit(" ", 1)[0] for k in spans}, key=lambda k: (int(k.split("KiB")[0]), k))
        for layout in layouts:
            t = {m: float(spans[f"{layout} {m}"]["us_per_span"]["median"]) for m in ("plain", "record", "wait_record")}
            span_rows.append(f"| {layout} | {t['plain']:.2f} | {t['record']:.2f} | {t['wait_record']:.2f} | "
                             f"{t['wait_record'] - t['plain']:+.2f} |")
        under_rows = [f"| {name} | {_median(v, 'alone_us'):.2f} | {_median(v, 'under_copies_us'):.2f} | "
                      f"{float(v['slowdown_pct']):+.1f} % |" for name, v in probe.get("under_copies", {}).items()]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InputError(f"{source}: not probe_handoff.py's output")
    lines = ["### The hand-off between copy and compute streams", "",
             f"Single-op timings on the GPU's own clock (CUDA events; validation/compute/probe_handoff.py, "
             f"{source}; {probe.get('repeats')} repeats, medians, µs). A 3-GEMV CUDA graph stands for an expert's "
             "kernels; every case starts behind a spin so the host is ahead, as in a replay. The hand-off is the "
             "sequence less its parts alone, per repeat.", "",
             "| copy | copy alone | graph alone | copy, then graph waiting on its event | copy then graph on one "
             "stream | hand-off copy → compute | graph, then copy waiting on its event | hand-off compute → copy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"] + rows + [""]
    if span_rows:
        lines += ["16 copy spans back to back on the copy stream, per span (µs): the copies alone, with an event "
                  "recorded after each span, and as the replay enqueues a span (a wait for an event the compute "
                  "stream has already passed, the copies, a record).", "",
                  "| span (size × parts) | copies alone | + record | + wait and record (the replay's) | "
                  "wait and record add |", "| --- | --- | --- | --- | --- |"] + span_rows + [""]
    if under_rows:
        lines += ["A kernel graph alone and while host-to-device copies run throughout on the copy stream (µs per "
                  "graph): what the copies' writes into HBM cost the kernels.", "",
                  "| graph | alone | under copies | slowdown |", "| --- | --- | --- | --- |"] + under_rows + [""]
    return lines


def step_energy_row(probe: dict, source: str) -> dict:
    """One probe_step_energy.py file as per-token figures: the token as one graph and as per-group graphs (time,
    energy above idle) against its kernels alone (each shape's window × its launches per token)."""
    try:
        windows = probe["windows"]
        out = {"source": source, "config": probe["config"], "context": int(probe["context"]),
               "kernels": int(probe["kernels_per_token"]),
               "idle_w": sum(float(w["idle_w"]) for w in windows) / len(windows)}
        alone_mj = alone_ms = 0.0
        for w in windows:
            if w["kind"] in ("step", "groups"):
                tokens = int(w["calls"]) * int(w["tokens_per_call"])
                out[w["kind"]] = {"ms": 1e3 * float(w["seconds"]) / tokens, "mj": 1e3 * above_idle_j(w) / tokens,
                                  "launches": int(w["launches_per_token"])}
            elif w["kind"] == "op":
                kernels = int(w["calls"]) * int(w["kernels_per_call"])
                alone_mj += 1e3 * above_idle_j(w) / kernels * int(w["per_token"])
                alone_ms += 1e3 * float(w["seconds"]) / kernels * int(w["per_token"])
        out["alone"] = {"ms": alone_ms, "mj": alone_mj}
        out["in_situ"] = probe.get("in_situ_against_alone", {})
        if "step" not in out or "groups" not in out:
            raise KeyError("step")
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise InputError(f"{source}: not probe_step_energy.py's output")
    return out


def step_energy_lines(probes: list[tuple[str, dict]]) -> list[str]:
    """The kernels-together table, and where the probes timed each group inside the token, the groups' times."""
    rows = [step_energy_row(p, src) for src, p in probes]
    lines = ["### A token's kernels together against the same kernels alone", "",
             "One board, one probe per shape (validation/energy/probe_step_energy.py): a decode token's kernels at "
             "context 1,024 run back to back as one CUDA graph (`step`), as one graph per op group launched through "
             "PyTorch (`groups`, host-paced), and each kernel shape alone as a chain; every window read by the "
             "Meter, energy above the board's idle power, per token. No copies, no events: what the replays add to "
             "a token is not here.", "",
             "| probe | kernels per token | board idle W | step ms | step mJ | groups ms | groups mJ | kernels alone "
             "ms | kernels alone mJ | alone against step, energy | alone against step, time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        s, g, a = r["step"], r["groups"], r["alone"]
        lines.append(f"| {r['source']} | {r['kernels']} | {r['idle_w']:.1f} | {s['ms']:.3f} | {s['mj']:.1f} | "
                     f"{g['ms']:.3f} | {g['mj']:.1f} | {a['ms']:.3f} | {a['mj']:.1f} | "
                     f"{100.0 * (a['mj'] - s['mj']) / s['mj']:+.1f} % | {100.0 * (a['ms'] - s['ms']) / s['ms']:+.1f} % |")
    lines.append("")
    timed = [r for r in rows if r["in_situ"]]
    if timed:
        lines += ["Each op group's GPU time inside the token (CUDA events between the per-group graphs, the host "
                  "ahead behind a spin; median of 5 tokens) against its kernels' times alone, summed over the "
                  "token's groups of each kind, ms:", "",
                  "| probe | group | groups per token | inside the token | kernels alone | inside against alone |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in timed:
            for label, v in r["in_situ"].items():
                inside, alone = float(v["in_situ_ms"]), float(v["alone_ms"])
                lines.append(f"| {r['source']} | {label} | {v['groups']} | {inside:.3f} | {alone:.3f} | "
                             f"{100.0 * (inside - alone) / alone:+.1f} % |")
        lines.append("")
    return lines
