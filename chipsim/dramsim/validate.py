"""chipsim's command-level DRAM model beside Ramulator 2.1 at every validation point (chipsim.dramsim.points):
bandwidth within 3 % and average read latency within 10 % is the target."""

from __future__ import annotations

import json
import os

from chipsim.dramsim.controller import ControllerConfig, simulate
from chipsim.dramsim.points import POINTS, point_requests
from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, read_input_text

BANDWIDTH_TOLERANCE = 0.03
LATENCY_TOLERANCE = 0.10
# front-end offers per CK that match Ramulator's trace front end at clock ratio 2 (two requests per memory tick;
# its HBM3 model ticks twice per CK; DDR4, DDR5, GDDR6, GDDR7 and HBM2 once)
OFFERS_PER_CYCLE = {"hbm3": 4, "lpddr5": 2, "ddr4": 2, "ddr5": 2, "gddr6": 2, "gddr7": 2, "hbm2": 2}
REFRESH = {False: "off", True: "all-bank", "per-bank": "per-bank"}


def point_controller(point: dict) -> ControllerConfig:
    """The controller a point runs: its refresh and page policy, its queues (Ramulator 2.1's 32 unless it says)."""
    return ControllerConfig(refresh=REFRESH[point["refresh"]], page_policy=point.get("page", "open"),
                            read_buffer=point.get("read_buffer", 32), write_buffer=point.get("write_buffer", 32))


def run_point(point: dict):
    std, reqs = point_requests(point)
    return simulate(std, reqs, channels=point["channels"], offers_per_cycle=OFFERS_PER_CYCLE[point["standard"]],
                    controller=point_controller(point))


def load_reference(path: str) -> dict:
    if not os.path.exists(path):
        raise InputError(f"{path}: file not found (validation/dram/run_ramulator.py writes it)")
    text = read_input_text(path, "--validate", JSON_MAX_BYTES)
    try:
        data = json.loads(text)
        return {p["name"]: p for p in data["points"]}
    except (ValueError, RecursionError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a Ramulator reference file ({exc.__class__.__name__})") from None


def compare(path: str) -> list[dict]:
    ref = load_reference(path)
    rows = []
    for point in POINTS:
        if point["name"] not in ref:
            raise InputError(f"{path}: no result for validation point {point['name']}")
        r, R = run_point(point), ref[point["name"]]
        bw_err = r.bandwidth_gbps / R["bandwidth_gbps"] - 1
        lat_err = r.read_latency_avg_ns / R["read_latency_avg_ns"] - 1
        rows.append({"name": point["name"], "bandwidth_gbps": r.bandwidth_gbps,
                     "ramulator_bandwidth_gbps": R["bandwidth_gbps"], "bandwidth_error": bw_err,
                     "read_latency_avg_ns": r.read_latency_avg_ns,
                     "ramulator_read_latency_avg_ns": R["read_latency_avg_ns"], "latency_error": lat_err,
                     "within_target": abs(bw_err) <= BANDWIDTH_TOLERANCE and abs(lat_err) <= LATENCY_TOLERANCE})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'point':40} {'chipsim GB/s':>12} {'Ramulator':>10} {'error':>8}   {'chipsim ns':>10} {'Ramulator':>10} "
             f"{'error':>8}"]
    for r in rows:
        lines.append(f"{r['name']:40} {r['bandwidth_gbps']:12.3f} {r['ramulator_bandwidth_gbps']:10.3f} "
                     f"{100 * r['bandwidth_error']:+7.2f}%   {r['read_latency_avg_ns']:10.1f} "
                     f"{r['ramulator_read_latency_avg_ns']:10.1f} {100 * r['latency_error']:+7.1f}%"
                     + ("" if r["within_target"] else "  MISSES TARGET"))
    worst_bw = max(abs(r["bandwidth_error"]) for r in rows)
    worst_lat = max(abs(r["latency_error"]) for r in rows)
    lines.append(f"{len(rows)} points; worst bandwidth error {100 * worst_bw:.2f} % (target 3 %), worst read-latency "
                 f"error {100 * worst_lat:.1f} % (target 10 %)")
    return "\n".join(lines)
