"""Hand checks of the seed papers' GPUs (hwconfigs/rtx3090.yaml, rtx4060.yaml, rtx5090.yaml, a800.yaml; issue 40):
each GPU memory's peak is the card's datasheet bandwidth, by the config's bus and by its DRAM standard's
organisation re-timed to the config's data rate; the PCIe link's rate follows from its generation and width; the
arrays are the SMs; and `chipsim check` builds each machine."""

import os

import pytest

from chipsim import cli
from chipsim.dramsim.calibrate import retimed_standard
from chipsim.hw.config import load_config
from chipsim.hw.dram_formula import dram_timing
from chipsim.hw.machine import roles
from chipsim.hw.pcie_link import link_params, usable_gbps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# config: (SMs, GPU memory GB/s from the datasheets (each config cites its source line by line), PCIe 4.0 lanes (the papers'))
GPUS = {
    "rtx3090": (82, 936.0, 16),   # GA102 whitepaper: 936 GB/sec; FloE: PCIe 4.0 (the card's x16)
    "rtx4060": (24, 272.0, 8),    # 272.0 GB/s; SPICE: PCIe 4.0 x8
    "rtx5090": (170, 1792.0, 8),  # 1792 GB/sec; SPICE: PCIe 4.0 x8 (the card is 5.0 x16)
    "a800": (108, 1935.0, 16),    # the 80 GB PCIe part's 1,935 GB/s (2,039 for the SXM); SPICE: PCIe 4.0 x16
}


def _hw(gpu: str):
    return load_config(os.path.join(ROOT, "hwconfigs", f"{gpu}.yaml")).hw


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_gpu_memory_peak_is_the_datasheet_bandwidth(gpu):
    """channels x width x rate, and the standard's own data bus re-timed to the config's rate (bursts per nBL
    cycles of the rounded clock), both within 1 % of the card's bandwidth; the organisation is the config's bus."""
    hw = _hw(gpu)
    name = roles(hw).operand_memory
    mem = hw.memory[name]
    datasheet = GPUS[gpu][1]
    assert dram_timing(mem).peak_gbps == pytest.approx(datasheet, rel=0.01)
    std = retimed_standard(mem, f"memory.{name}")
    data_nodes = 1  # data buses under one channel of the organisation (an HBM2 channel's two pseudo-channels)
    for count in std.org.counts[1: std.data_level + 1]:
        data_nodes *= count
    assert (std.org.channel_width_bits * data_nodes, std.org.burst_length) == (mem.channel_width_bits,
                                                                               mem.burst_length)
    assert std.peak_gbps(1) * mem.channels == pytest.approx(datasheet, rel=0.01)  # one channel: all its data buses


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_pcie_rate_follows_from_generation_and_width(gpu):
    """PCIe 4.0: 16 GT/s per lane, 128b/130b; the link layer leaves ~90 % of it as data (Gen4 x8 ~14.2 GB/s)."""
    link = _hw(gpu).links["pcie"]
    lanes = GPUS[gpu][2]
    assert link.timing_model == "link-layer" and link.encoding == "128b/130b"
    assert link.bandwidth_gbps == pytest.approx(lanes * 16 * 128 / 130 / 8, rel=1e-4)
    expected = usable_gbps(link_params(lanes, 16.0, encoding="128b/130b", max_payload_bytes=256,
                                       max_read_request_bytes=512, tags=link.read_tags,
                                       completion_latency_ns=link.latency_ns, completion_header_bytes=12))
    assert link.data_gbps == pytest.approx(expected, rel=1e-4)  # bandwidth_gbps is given to 3 decimals
    assert link.data_gbps == pytest.approx({8: 14.16, 16: 28.32}[lanes], rel=0.01)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_arrays_are_the_sms_and_the_machine_checks(gpu, capsys):
    assert _hw(gpu).compute.arrays == GPUS[gpu][0]
    assert cli.main(["check", os.path.join(ROOT, "hwconfigs", f"{gpu}.yaml")]) == 0
    assert "check:  ok" in capsys.readouterr().out
