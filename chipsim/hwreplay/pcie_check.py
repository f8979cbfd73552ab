"""The PCIe link layer (chipsim/hw/pcie_link) against the H200 host's measured copy curve, from the protocol
settings read from config space (validation/pcie/h200-host-pcie.json) and two fixed costs each measured on its own
(validation/pcie/h200-copy-latency.json): the PCIe read round trip (a GPU thread chasing pointers through pinned
host memory, less the same chase through a 5 MB buffer in GPU memory, which L2 serves: the SM's own load path) and the copy engine's cost per copy (tiny device-to-device
copies queued 16 deep, no PCIe read in them). Nothing comes from the curve it is compared with.

    time(N) = engine cost + round trip + wire bytes(N) / (lanes x GT/s / 8)
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, read_input_text
from chipsim.hwreplay.checks import MISSING, WHOLE_POSITIVE, field, obj, objects
from chipsim.hw.pcie_link import PcieLinkParams, link_params, transfer_ns, usable_gbps
from chipsim.values import POSITIVE, Bounds

GEN_GTPS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}  # PCIe base spec, Link Status speed codes


def host_link(host_probe: dict, completion_latency_ns: float) -> PcieLinkParams:
    """The GPU's link with the settings in force: width and speed, MPS, MRRS, 10-bit tags (768) or 8-bit (256)."""
    gpu = next(iter(host_probe["functions"].values()))["gpu"]
    speed = gpu["link_speed_code"]
    return link_params(lanes=gpu["link_width"], gtps=GEN_GTPS[speed], encoding="flit" if speed >= 6 else "128b/130b",
                       max_payload_bytes=gpu["mps_bytes"], max_read_request_bytes=gpu["mrrs_bytes"],
                       tags=768 if gpu["tag10_requester_enabled"] else 256, completion_latency_ns=completion_latency_ns)


def fixed_costs(copy_probe: dict) -> tuple[float, float]:
    """(PCIe read round trip, copy engine cost per copy), ns."""
    chase = copy_probe["pcie_read_pointer_chase"]
    round_trip = chase["spread"]["ns_per_dependent_load"] - chase["gpu_memory"]["ns_per_dependent_load"]
    engine = 1e3 * statistics.median(p["us_per_copy"] for p in copy_probe["d2d_tiny_queued16"])
    return round_trip, engine


def check(microbench: dict, host_probe: dict, copy_probe: dict) -> dict:
    """Model against measurement at every size of the queued curve, and at the separately measured 4 KiB copy."""
    round_trip, engine = fixed_costs(copy_probe)
    p = host_link(host_probe, round_trip)
    rows = []
    points = [("curve", q["bytes"], q["us_per_copy"]) for q in microbench["h2d_pinned_queued16"]]
    points += [("tiny", q["bytes"], q["us_per_copy"]) for q in copy_probe["h2d_tiny_queued16"] if q["bytes"] == 4096]
    for source, nbytes, measured_us in points:
        model_us = (engine + transfer_ns(nbytes, p)) / 1e3
        rows.append({"source": source, "bytes": nbytes, "measured_us": measured_us, "model_us": round(model_us, 3),
                     "error_pct": round(100 * (model_us / measured_us - 1), 1)})
    # the completer's completion size is its own (a multiple of its read completion boundary): what each would give
    by_split = {size: round(usable_gbps(dataclasses.replace(p, completion_bytes=size)), 2)
                for size in (64, 128, p.max_payload_bytes)}
    return {"round_trip_ns": round(round_trip, 1), "engine_ns": round(engine, 1), "usable_gbps": round(usable_gbps(p), 2),
            "measured_gbps": microbench["h2d_pinned_queued16_fit"]["bandwidth_gbps"], "rows": rows,
            "usable_gbps_by_completion_bytes": by_split}


def report_lines(result: dict) -> list[str]:
    lines = ["### The PCIe link layer against the measured copies", "",
             "chipsim/hw/pcie_link with the settings read from the GPU's config space (PCIe 5.0 x16, MPS 256 B, MRRS "
             "4096 B, 10-bit tags), plus two fixed costs measured on their own (validation/pcie/probe_copy_latency.py): "
             f"the PCIe read round trip {result['round_trip_ns']:.0f} ns (pointer chase through host memory less the same "
             f"through a 5 MB GPU buffer that L2 serves: the SM's own load path) and the copy engine's {result['engine_ns']:.0f} ns per copy (tiny device-to-device "
             f"copies). The protocol's sustained rate is {result['usable_gbps']} GB/s against "
             f"{result['measured_gbps']} GB/s fitted to the curve; the curve itself is not used. Completions of the "
             "maximum payload are assumed: a completer may return a read's data in pieces of its 64 or 128 B read "
             "completion boundary, and the host's root port, hidden by its VM, does not say which it does ("
             + ", ".join(f"{size} B completions: {gbps} GB/s" for size, gbps in
                         result["usable_gbps_by_completion_bytes"].items()) + ").", "",
             "| copy | measured µs | link layer µs | error |", "| --- | --- | --- | --- |"]
    for r in result["rows"]:
        label = f"{r['bytes'] // 1024} KiB" + (" (measured on its own)" if r["source"] == "tiny" else "")
        lines.append(f"| {label} | {r['measured_us']} | {r['model_us']} | {r['error_pct']:+.1f} % |")
    return lines + [""]


def load(microbench_path: str, host_probe_path: str, copy_probe_path: str) -> dict:
    texts = [read_input_text(p, "--pcie-probes", JSON_MAX_BYTES) for p in (microbench_path, host_probe_path,
                                                                          copy_probe_path)]
    microbench, host_probe, copy_probe = (json.loads(t) for t in texts)
    check_probes(host_probe, host_probe_path, copy_probe, copy_probe_path)
    return check(microbench, host_probe, copy_probe)


def check_probes(host_probe, host_path: str, copy_probe, copy_path: str) -> None:
    """The fields host_link and fixed_costs read: the GPU function's link settings (a known speed code, whole
    positive widths and sizes) and the copy probe's pointer chases and tiny copies (finite, positive times)."""
    functions = obj(host_path, obj(host_path, host_probe, "").get("functions", MISSING), "functions")
    if not functions:
        raise InputError(f"{host_path}: functions: no PCIe function in it")
    name = next(iter(functions))
    at = f"functions.{name}.gpu"
    gpu = obj(host_path, obj(host_path, functions[name], f"functions.{name}").get("gpu", MISSING), at)
    field(host_path, gpu, at, "link_speed_code", int, Bounds(choices=tuple(GEN_GTPS)))
    for key in ("link_width", "mps_bytes", "mrrs_bytes"):
        field(host_path, gpu, at, key, int, WHOLE_POSITIVE)
    field(host_path, gpu, at, "tag10_requester_enabled", bool)
    chase = obj(copy_path, obj(copy_path, copy_probe, "").get("pcie_read_pointer_chase", MISSING),
                "pcie_read_pointer_chase")
    for part in ("spread", "gpu_memory"):
        where = f"pcie_read_pointer_chase.{part}"
        field(copy_path, obj(copy_path, chase.get(part, MISSING), where), where, "ns_per_dependent_load", float,
              POSITIVE)
    if chase["spread"]["ns_per_dependent_load"] <= chase["gpu_memory"]["ns_per_dependent_load"]:
        raise InputError(f"{copy_path}: pcie_read_pointer_chase.spread.ns_per_dependent_load: not above gpu_memory's "
                         "(the PCIe read round trip is their difference)")
    for series in ("d2d_tiny_queued16", "h2d_tiny_queued16"):
        for i, row in enumerate(objects(copy_path, copy_probe.get(series, MISSING), series)):
            field(copy_path, row, f"{series}[{i}]", "bytes", int, WHOLE_POSITIVE)
            field(copy_path, row, f"{series}[{i}]", "us_per_copy", float, POSITIVE)
