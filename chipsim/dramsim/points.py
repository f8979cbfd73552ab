"""The DRAM validation points: which streams chipsim's command-level model and Ramulator 2.1 both run
(validation/dram/run_ramulator.py writes Ramulator's results; tests/test_dram.py compares)."""

from __future__ import annotations

from chipsim.dramsim.standard import load_standard
from chipsim.dramsim.streams import requests, stream_mapping

REQUESTS = 30000
SEED = 7


def _points():
    out = []
    for std in ("hbm3", "lpddr5", "ddr4", "ddr5", "gddr6", "gddr7", "hbm2"):
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
    # next round waits tRFCpb after its last bank); GDDR7 one REFpb every tREFIpb in rotation (PerBank); HBM2 one
    # per channel every tREFIpb (tREFI / 32) in rotation over both pseudo-channels' banks, as Ramulator 2.1's
    # PerBank manager does. DDR4 has no per-bank refresh, Ramulator 2.1's DDR5 has no same-bank refresh (REFsb) to
    # compare with and its GDDR6 no tREFIpb
    for std in ("lpddr5", "hbm3", "gddr7", "hbm2"):
        for kind, share in (("sequential", 1.0), ("sequential", 0.5), ("random", 1.0)):
            out.append({"standard": std, "kind": kind, "read_share": share, "channels": 1, "streams": 1,
                        "refresh": "per-bank"})
    # capped pages (a row closes after 4 accesses: Ramulator 2.1's ClosedCAP with its default cap); read-only, as
    # Ramulator stops with writes mixed in ("Failed to send all-bank refresh": its priority queue fills with
    # precharges it may not issue)
    for std in ("hbm3", "lpddr5", "ddr4", "ddr5", "gddr6", "gddr7", "hbm2"):
        for kind, share in (("sequential", 1.0), ("random", 1.0)):
            out.append({"standard": std, "kind": kind, "read_share": share, "channels": 1, "streams": 1,
                        "refresh": True, "page": "capped"})
    out += _production_points()
    for p in out:
        tag = {False: "noref", True: "ref", "per-bank": "refpb"}[p["refresh"]]
        page = "-capped" if p.get("page") == "capped" else ""
        queues = f"-q{p['read_buffer']}x{p['write_buffer']}" if "read_buffer" in p else ""
        xor = "-xor" if p.get("xor") else ""
        p["name"] = (f"{p['standard']}-{p['kind']}-r{int(p['read_share'] * 100)}-ch{p['channels']}"
                     f"-s{p['streams']}-{tag}{page}{queues}{xor}")
    return out


def _production_points():
    """A production controller's look-ahead and bank hash: deeper queues (128 reads / 64 writes, Ramulator 2.1's
    own HBM3 test case) let the controller open the next rows early; several streams, each in its own region of
    rows, conflict in the same banks unless the bank bits are XOR-ed with the row's (`xor`); LPDDR5's second
    activate shows in a conflict-heavy bank-parallel stream (eight streams)."""
    out = []
    deep = {"read_buffer": 128, "write_buffer": 64}
    for std in ("hbm3", "lpddr5"):
        for share in (1.0, 0.5):
            out.append({"standard": std, "kind": "sequential", "read_share": share, "channels": 1, "streams": 1,
                        "refresh": True, **deep})
        for streams in (2, 8):
            out.append({"standard": std, "kind": "sequential", "read_share": 1.0, "channels": 1,
                        "streams": streams, "refresh": True, "xor": "bankgroup,bank"})
        out.append({"standard": std, "kind": "sequential", "read_share": 1.0, "channels": 1, "streams": 8,
                    "refresh": True})
        out.append({"standard": std, "kind": "sequential", "read_share": 1.0, "channels": 1, "streams": 8,
                    "refresh": True, "xor": "bankgroup,bank", **deep})
    return out


POINTS = _points()


def point_requests(point: dict):
    std = load_standard(point["standard"])
    mapping = stream_mapping(std, point["channels"], point.get("mapping", "interleaved"), point.get("xor", ""))
    reqs = requests(std, REQUESTS, kind=point["kind"], read_share=point["read_share"], channels=point["channels"],
                    streams=point["streams"], seed=SEED, mapping=mapping)
    return std, reqs
