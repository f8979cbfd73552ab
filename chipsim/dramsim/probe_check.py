"""A memory's description against a streaming probe of the real memory (validation/dram/probe_hbm.py on a GPU):
each probed kernel's streams through the command-level model, organised, re-timed and controlled as the config's
memory, beside what the probe measured.

A kernel `read` sweeps one array; `KrNw` sweeps K arrays and writes N, in turn, each array its own region (the
probe's grid-stride kernels). The model's figure is the streams' bandwidth over whole refresh intervals as a share of
the data-bus peak (as the calibration measures efficiency); the probe's is its bandwidth as a share of the pin peak
(NVML's memory clock x 2 x bus width). The target is 3 %.

    chipsim dram --probe validation/dram/h200-hbm-streams.json --config hwconfigs/h200-cycle-level.yaml
"""

from __future__ import annotations

import json

from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, read_input_text

TOLERANCE = 0.03
REFRESH_PERIODS = 6  # whole refresh intervals each kernel is measured over


def kernel_streams(kernel: str, where: str = "--kernel") -> tuple[int, tuple]:
    """(streams, write streams) of a kernel: read -> one read stream; KrNw -> K read streams then N write streams."""
    if kernel == "read":
        return 1, ()
    k, _, rest = kernel.partition("r")
    if not (k.isdigit() and rest.endswith("w") and rest[:-1].isdigit() and 1 <= int(k) <= 64
            and 1 <= int(rest[:-1]) <= 64):
        raise InputError(f"{where} {kernel}: read, or KrNw (K arrays read, N written, 1 ... 64 each)")
    reads, writes = int(k), int(rest[:-1])
    return reads + writes, tuple(range(reads, reads + writes))


def model_share(std, controller, mapping, kernel: str) -> float:
    """The kernel's streams through the model over whole refresh intervals: bandwidth / the data-bus peak."""
    from dataclasses import replace

    from chipsim.dramsim.controller import simulate
    from chipsim.dramsim.streams import requests

    streams, writes = kernel_streams(kernel)
    period = std.params["nREFI"]
    count = int(REFRESH_PERIODS * period * std.peak_gbps(1) * std.tck_ps * 1e-3 / std.org.burst_bytes * 1.2) + 4000
    reqs = requests(std, count, streams=streams, write_streams=writes, seed=11, mapping=mapping)
    result = simulate(std, reqs, offers_per_cycle=4, controller=replace(controller, refresh="all-bank"),
                      window=(period, period * (1 + REFRESH_PERIODS)))
    return result.bandwidth_gbps / std.peak_gbps(1)


def load_probe(path: str) -> list[dict]:
    """The probe's kernels that chipsim can run (read, KrNw) with their measured share of the pin peak."""
    text = read_input_text(path, "--probe", JSON_MAX_BYTES)
    try:
        rows = json.loads(text)["kernels"]
        out = [{"kernel": r["kernel"], "measured": float(r["share_of_pin_peak"])} for r in rows
               if r["kernel"] == "read" or r["kernel"][:1].isdigit()]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise InputError(f"{path}: not a probe_hbm.py result ({exc.__class__.__name__})") from None
    if not out:
        raise InputError(f"{path}: no kernel chipsim can run (read, KrNw)")
    return out


def compare(probe_path: str, cfg, key: str) -> list[dict]:
    """Each probed kernel: the model's share of peak for memory `cfg` (a config's command-level DramConfig; `key`
    its dotted key) beside the measured share, and the error."""
    from chipsim.dramsim.calibrate import controller_of, retimed_standard
    from chipsim.dramsim.streams import stream_mapping

    probes = load_probe(probe_path)
    std = retimed_standard(cfg, key)
    mapping = stream_mapping(std, 1, cfg.address_mapping, cfg.address_xor, key)
    rows = []
    for probe in probes:
        share = model_share(std, controller_of(cfg), mapping, probe["kernel"])
        error = share / probe["measured"] - 1
        rows.append({**probe, "model": share, "error": error, "within_target": abs(error) <= TOLERANCE})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'kernel':8} {'measured':>9} {'model':>7} {'error':>8}"]
    for r in rows:
        lines.append(f"{r['kernel']:8} {r['measured']:9.3f} {r['model']:7.3f} {100 * r['error']:+7.1f}%"
                     + ("" if r["within_target"] else "  MISSES TARGET"))
    return "\n".join(lines)
