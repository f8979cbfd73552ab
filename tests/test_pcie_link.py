"""The PCIe link layer by hand (TLP headers, framing, Acks, encoding, SKP, FLITs, tags), against thor's PCIe 6.0
figure and against the H200 host's measured PCIe 5.0 copies (validation/pcie/, validation/h200-microbench.json)."""

import json
import math
from pathlib import Path

import pytest

from chipsim.hw.config import load_config
from chipsim.hw.pcie_link import PcieLinkParams, transfer_ns, usable_gbps, wire_bytes

ROOT = Path(__file__).resolve().parents[1]
GEN5 = dict(lanes=16, gtps=32.0, encoding="128b/130b", completion_latency_ns=700)


def h200_link() -> PcieLinkParams:
    """The H200 host link with the settings read from its config space (validation/pcie/h200-host-pcie.json); its
    read completion boundary (64 B) does not split aligned reads."""
    probe = json.loads((ROOT / "validation" / "pcie" / "h200-host-pcie.json").read_text())
    gpu = next(iter(probe["functions"].values()))["gpu"]
    assert (gpu["link_speed_code"], gpu["link_width"]) == (5, 16)  # 32 GT/s x16
    return PcieLinkParams(max_payload_bytes=gpu["mps_bytes"], max_read_request_bytes=gpu["mrrs_bytes"],
                          tags=768 if gpu["tag10_requester_enabled"] else 256, **GEN5)


def test_a_gen5_read_request_by_hand():
    """One 4096 B read, 256 B payloads: 16 completions of 256 + 12 (3-DW header) + 8 (STP + LCRC) bytes and one
    8-byte Ack, times 130/128 for the encoding and 371/370 for SKP ordered sets."""
    p = PcieLinkParams(max_payload_bytes=256, max_read_request_bytes=4096, tags=256, **GEN5)
    assert wire_bytes(4096, p) == pytest.approx((16 * (256 + 12 + 8) + 8) * 130 / 128 * 371 / 370)
    assert p.raw_gbps == 64.0
    assert usable_gbps(p) == pytest.approx(64.0 * 4096 / wire_bytes(4096, p), rel=1e-6)


def test_a_smaller_max_payload_means_more_completions_and_their_headers():
    small = PcieLinkParams(max_payload_bytes=64, max_read_request_bytes=512, tags=256, **GEN5)
    assert wire_bytes(512, small) == pytest.approx((8 * (64 + 20) + 8) * 130 / 128 * 371 / 370)


def test_a_flit_link_carries_236_tlp_bytes_per_256_and_gives_thors_figure():
    """thor's PCIe 6.0 x16: 64 GT/s, FLITs, 256 B completions: 128 x 236/256 x 256/268 = 112.72 GB/s per direction,
    thor.yaml's links.pcie figure (118 x 256/268) derived from the protocol instead of typed in."""
    p = PcieLinkParams(lanes=16, gtps=64.0, encoding="flit", max_payload_bytes=256, max_read_request_bytes=512,
                       tags=256, completion_latency_ns=600, tlp_framing_bytes=0,
                       dllp_bytes=0)
    expert = 4718592  # one Granite-3B expert at BF16
    assert wire_bytes(expert, p) == math.ceil(expert / 256 * 268 / 236) * 256
    thor = load_config(str(ROOT / "hwconfigs" / "thor.yaml")).hw.links.pcie
    assert usable_gbps(p) == pytest.approx(thor.data_gbps, rel=1e-3)


def test_too_few_tags_bound_the_rate_by_tags_times_request_over_latency():
    p = PcieLinkParams(max_payload_bytes=256, max_read_request_bytes=512, tags=4, **GEN5)
    request_ns = wire_bytes(512, p) / p.raw_gbps
    assert usable_gbps(p) == pytest.approx(4 * 512 / (700 + request_ns))
    assert transfer_ns(1 << 20, p) == pytest.approx(700 + (1 << 20) / usable_gbps(p, 1 << 20))


def test_the_h200_hosts_large_copies_come_within_ten_percent_from_protocol_parameters_alone():
    """The measured PCIe 5.0 x16 H2D curve (16 copies queued, validation/h200-microbench.json) against the link
    layer with the settings the probe read (MPS 256, MRRS 4096, 10-bit tags, RCB 64) and an assumed 700 ns
    completion latency: within 10 % at 4 MB and up, and the asymptote within 5 % of the fit. Smaller copies are
    dominated by the copy engine's ~3 us per copy, which is no link-layer quantity (VALIDATION notes say so)."""
    p = h200_link()
    mb = json.loads((ROOT / "validation" / "h200-microbench.json").read_text())
    assert usable_gbps(p) == pytest.approx(mb["h2d_pinned_queued16_fit"]["bandwidth_gbps"], rel=0.05)
    for point in mb["h2d_pinned_queued16"]:
        if point["bytes"] >= 4 << 20:
            model = point["bytes"] / transfer_ns(point["bytes"], p)
            assert model == pytest.approx(point["gbps"], rel=0.10), point
