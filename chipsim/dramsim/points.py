"""The DRAM validation points: which streams chipsim's command-level model and Ramulator 2.1 both run
(validation/dram/run_ramulator.py writes Ramulator's results; tests/test_dram.py compares)."""

from __future__ import annotations

from chipsim.dramsim.standard import load_standard
from chipsim.dramsim.streams import requests

REQUESTS = 30000


def _points():
    out = []
    for std in ("hbm3", "lpddr5", "hbm2"):
        for refresh in (False, True):
            for share in (1.0, 0.75, 0.5):
                out.append({"standard": std, "kind": "sequential", "read_share": share, "channels": 1,
                            "streams": 1, "refresh": refresh})
            out.append({"standard": std, "kind": "random", "read_share": 1.0, "channels": 1, "streams": 1,
                        "refresh": refresh})
        out.append({"standard": std, "kind": "random", "read_share": 0.5, "channels": 1, "streams": 1,
                    "refresh": True})
        out.append({"standard": std, "kind": "sequential", "read_share": 1.0, "channels": 4, "streams": 1,
                    "refresh": True})
        out.append({"standard": std, "kind": "sequential", "read_share": 1.0, "channels": 1, "streams": 4,
                    "refresh": True})
    # per-bank refresh: LPDDR5 one REFpb every tREFIpb in rotation, as Ramulator 2.1's PerBank manager does; HBM3
    # one per pseudo-channel every tREFIpb, against Ramulator's HBM34PerBankRefresh (JESD238's REFpb sets: a set's
    # next round waits tRFCpb after its last bank); HBM2 one per channel every tREFIpb (tREFI / 32) in rotation over
    # both pseudo-channels' banks, as Ramulator 2.1's PerBank manager does
    for std in ("lpddr5", "hbm3", "hbm2"):
        for kind, share in (("sequential", 1.0), ("sequential", 0.5), ("random", 1.0)):
            out.append({"standard": std, "kind": kind, "read_share": share, "channels": 1, "streams": 1,
                        "refresh": "per-bank"})
    # capped pages (a row closes after 4 accesses: Ramulator 2.1's ClosedCAP with its default cap); read-only, as
    # Ramulator stops with writes mixed in ("Failed to send all-bank refresh": its priority queue fills with
    # precharges it may not issue)
    for std in ("hbm3", "lpddr5", "hbm2"):
        for kind, share in (("sequential", 1.0), ("random", 1.0)):
            out.append({"standard": std, "kind": kind, "read_share": share, "channels": 1, "streams": 1,
                        "refresh": True, "page": "capped"})
    for p in out:
        tag = {False: "noref", True: "ref", "per-bank": "refpb"}[p["refresh"]]
        page = "-capped" if p.get("page") == "capped" else ""
        p["name"] = (f"{p['standard']}-{p['kind']}-r{int(p['read_share'] * 100)}-ch{p['channels']}"
                     f"-s{p['streams']}-{tag}{page}")
    return out


POINTS = _points()


def point_requests(point: dict):
    std = load_standard(point["standard"])
    reqs = requests(std, REQUESTS, kind=point["kind"], read_share=point["read_share"], channels=point["channels"],
                    streams=point["streams"], seed=7)
    return std, reqs
