"""The PCIe link layer of a DMA read (a device reading host memory, as an expert fetch or a cudaMemcpy H2D does):
usable bandwidth and time for every transfer size from the protocol's parameters.

A read of N bytes goes out as memory-read requests of at most max_read_request_bytes (4-DW headers) and comes
back as completions (3-DW headers) of `completion_bytes` each: the completer may split a request's data at any
multiple of its read completion boundary (RCB, 64 or 128 B) up to max_payload_bytes, and root complexes often
return cache-line or RCB-sized completions, so the size is the completer's, given (default: max payload). On a
128b/130b link (PCIe 3.0-5.0) every TLP carries framing (STP token, LCRC), and the completer's DLLPs share the data
direction: an Ack for the requests it received and an UpdateFC returning their non-posted credits (one each per
`requests_per_ack` and `requests_per_fc_update` requests; the requester advertises infinite completion credits, so
no UpdateFC answers the completions); SKP ordered sets interrupt the stream. PCIe 6.0 packs TLPs into 256 B FLITs
of 236 TLP bytes (DLLPs, CRC and FEC live in the rest). Reads in flight are bounded by the requester's tags (and the completer's
non-posted credits): each holds its tag for the completion latency plus its own data time. So

    wire bytes(N)  = sum of the completions' payload + header + framing, + Acks, x encoding and SKP overhead
    rate           = min(lanes x GT/s / 8 x N / wire bytes(N),  tags x max_read_request / (latency + its data))
    time(N)        = completion latency + wire bytes(N) / (lanes x GT/s / 8)   (or the tag-bound time)

Sources: PCIe Base Specification 5.0 / 6.0 (header sizes, framing tokens, FLIT layout, SKP interval); the
model follows Neugebauer et al., "Understanding PCIe performance for end host networking", SIGCOMM 2018.

A config's `links.pcie` (or `links.extra.<name>`) with `timing_model: link-layer` takes its data rate from here
(`params_from_config`); its `bandwidth_gbps` is then the rate after encoding (what 128b/130b or the FLIT leaves
for TLP bytes), so that sweeping it still scales the link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


ENCODING_EFFICIENCY = {"128b/130b": 128 / 130, "flit": 236 / 256}  # TLP bytes per wire byte, before SKP / DLLPs


@dataclass(frozen=True)
class PcieLinkParams:
    raw_gbps: float  # bytes per ns on the wire per direction, before encoding: lanes x GT/s / 8
    encoding: str  # "128b/130b" or "flit"
    max_payload_bytes: int  # MPS: largest completion payload
    max_read_request_bytes: int  # MRRS
    tags: int  # reads in flight (requester tags, or the completer's non-posted credits if fewer)
    completion_latency_ns: float  # a read request out to its first completion byte back
    completion_header_bytes: int = 12  # 3-DW CplD header
    request_header_bytes: int = 16  # 4-DW MemRd header (64-bit address)
    tlp_framing_bytes: int = 8  # 128b/130b: 4 B STP token (length, sequence number) + 4 B LCRC; FLIT: 0
    dllp_bytes: int = 8  # 128b/130b: 6 B DLLP + 2 B SDP token; FLIT: carried in the flit's DLP bytes
    requests_per_ack: int = 1  # Ack coalescing of the completer acknowledging our requests (1: one each)
    requests_per_fc_update: int = 1  # UpdateFC DLLPs returning the requests' non-posted credits (1: one each)
    completion_bytes: int = 0  # the completer's completion size (0: max_payload_bytes)
    skp_interval_blocks: int = 370  # 128b/130b: a SKP ordered set at least every 370 blocks
    flit_bytes: int = 256
    flit_tlp_bytes: int = 236


def link_params(lanes: int, gtps: float, **kw) -> PcieLinkParams:
    """A link of `lanes` at `gtps` GT/s per lane (the other fields as PcieLinkParams names them)."""
    return PcieLinkParams(raw_gbps=lanes * gtps / 8, **kw)


def params_from_config(link) -> PcieLinkParams:
    """The link layer of a `links.pcie`-shaped config section (timing_model: link-layer): its bandwidth_gbps is
    the rate after encoding, its tlp_overhead_bytes the completion header, latency_ns the completion latency."""
    return PcieLinkParams(raw_gbps=link.bandwidth_gbps / ENCODING_EFFICIENCY[link.encoding], encoding=link.encoding,
                          max_payload_bytes=link.max_payload_bytes,
                          max_read_request_bytes=link.max_read_request_bytes, tags=link.read_tags,
                          completion_latency_ns=link.latency_ns, completion_header_bytes=link.tlp_overhead_bytes,
                          completion_bytes=link.read_completion_bytes,
                          requests_per_fc_update=link.requests_per_fc_update)


def _request_tlp(size: int, p: PcieLinkParams) -> tuple[int, int]:
    """(TLP bytes, completions) of one aligned read request of `size` bytes: completions of the completer's size
    (max payload unless it splits smaller), each with its header."""
    n = math.ceil(size / (p.completion_bytes or p.max_payload_bytes))
    return size + n * p.completion_header_bytes, n


def wire_bytes(nbytes: int, p: PcieLinkParams) -> float:
    """Bytes on the completion (data) direction's wire for a read of `nbytes` (aligned): full requests of
    max_read_request_bytes and a shorter last one."""
    full, last = divmod(nbytes, p.max_read_request_bytes)
    tlp, ncpl = (full * x for x in _request_tlp(p.max_read_request_bytes, p))
    if last:
        tlp_last, ncpl_last = _request_tlp(last, p)
        tlp, ncpl = tlp + tlp_last, ncpl + ncpl_last
    if p.encoding == "flit":
        return math.ceil(tlp / p.flit_tlp_bytes) * p.flit_bytes
    framed = tlp + ncpl * p.tlp_framing_bytes
    requests = full + (1 if last else 0)
    dllps = (math.ceil(requests / p.requests_per_ack) + math.ceil(requests / p.requests_per_fc_update)) * p.dllp_bytes
    encoded = (framed + dllps) * 130 / 128
    return encoded * (1 + 1 / p.skp_interval_blocks)


def wire_bytes_per_data_byte(p: PcieLinkParams, nbytes: int = 1 << 30) -> float:
    """Bytes on the wire (encoding, FLIT or framing, headers, DLLPs, SKP) per data byte of a long read: what a
    per-wire-bit energy is charged on."""
    return wire_bytes(nbytes, p) / nbytes


def usable_gbps(p: PcieLinkParams, nbytes: int = 1 << 30) -> float:
    """Sustained data rate of a long read (the asymptote), bytes per ns = GB/s."""
    link = p.raw_gbps * nbytes / wire_bytes(nbytes, p)
    request_ns = wire_bytes(p.max_read_request_bytes, p) / p.raw_gbps
    tag_bound = p.tags * p.max_read_request_bytes / (p.completion_latency_ns + request_ns)
    return min(link, tag_bound)


def transfer_ns(nbytes: int, p: PcieLinkParams) -> float:
    """Time of one DMA read of `nbytes` on an idle link: the first completion's latency, then the data at the
    link's or the tags' rate."""
    rate = usable_gbps(p, max(nbytes, p.max_read_request_bytes))
    return p.completion_latency_ns + nbytes / rate
