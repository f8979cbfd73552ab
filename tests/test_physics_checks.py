"""Every number that reaches a model is checked against physics (issue 37): a DRAM standard's timings and kind,
cycle-level tiles and requests against the SRAM, PCIe sizes, measured operation keys, trace metadata against the
trace's counts, and the CLI options of `chipsim dram`, `calibrate --window` and `--policy`. Each rule: the boundary
value accepted, the one past it refused with one line naming the key or option."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from chipsim.cli import _int_list, main
from chipsim.dramsim.standard import load_standard
from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.policies.base import make_policy
from chipsim.trace import format as tf
from chipsim.workload.models import MODELS
from chipsim.workload.op_keys import _step_keys, check_op_keys, known_shape
from conftest import ROOT, THOR
from helpers import hand_trace_arrays, random_routing

CYCLE = os.path.join(ROOT, "hwconfigs", "thor.yaml")
H200 = os.path.join(ROOT, "hwconfigs", "h200-pcie5.yaml")
H200_CYCLE = os.path.join(ROOT, "hwconfigs", "h200-cycle-level.yaml")
CXL = os.path.join(ROOT, "hwconfigs", "thor-cxl.yaml")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


def refused(fn, *words):
    with pytest.raises(InputError) as exc:
        fn()
    text = str(exc.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


def one_line_exit_2(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chipsim: error: ") and all(w in err[0] for w in words), err


# ---------------------------------------------------------------------------------------------- DRAM standards
def test_a_clock_period_burst_and_data_rate_of_zero_are_refused():
    assert load_standard("hbm3", timing_overrides={"tck_ps": 1}).tck_ps == 1
    refused(lambda: load_standard("hbm3", timing_overrides={"tck_ps": 0}), "hbm3.yaml.timings.HBM3_6400Mbps.tck_ps",
            "at least 1, got 0")
    refused(lambda: load_standard("hbm3", timing_overrides={"nBL": 0}), ".nBL", "got 0")
    refused(lambda: load_standard("lpddr5", timing_overrides={"rate_mtps": 0}), ".rate_mtps", "got 0")


def test_refresh_must_end_before_the_next_is_due():
    # hbm3's preset: nREFI 6240
    assert load_standard("hbm3", timing_overrides={"nRFC": 6239}).params["nRFC"] == 6239
    refused(lambda: load_standard("hbm3", timing_overrides={"nRFC": 6240}), ".nRFC", "(6240 cycles)",
            "nREFI (6240)")


def test_a_latency_expression_below_zero_is_refused():
    # lpddr5: RD -> WR waits nCL + nBL + 2 - nCWL = 17 + 2 + 2 - nCWL cycles (constraints[4])
    std = load_standard("lpddr5", timing_overrides={"nCWL": 21})
    assert 0 in {c.latency for c in std.constraints}
    refused(lambda: load_standard("lpddr5", timing_overrides={"nCWL": 22}), "lpddr5.yaml.constraints[4].latency",
            "comes to -1 cycles")


def test_a_standard_file_that_breaks_physics_names_the_config_key_and_the_file(tmp_path):
    text = open(os.path.join(ROOT, "chipsim", "dramsim", "standards", "hbm3.yaml"), encoding="utf-8").read()
    bad = tmp_path / "slow.yaml"
    bad.write_text(text.replace("    tck_ps: 625", "    tck_ps: 0"))
    refused(lambda: load_config(THOR, [f"memory.hbm.standard={bad}"]), "memory.hbm.standard: slow.yaml",
            "tck_ps", "got 0")


def test_a_standard_belongs_to_the_memory_s_kind():
    load_config(THOR)  # hbm3 for memory.hbm, lpddr5 for memory.lpddr5x
    refused(lambda: load_config(THOR, ["memory.hbm.standard=lpddr5"]), "memory.hbm.standard", "describes LPDDR5",
            "not an HBM memory")
    refused(lambda: load_config(THOR, ["memory.lpddr5x.standard=hbm3"]), "memory.lpddr5x.standard",
            "describes HBM3")
    # a further tier has no kind chipsim knows by name: any standard whose bus is the tier's (LPDDR5's x16 channels
    # of BL16), and not DDR5's 32-bit sub-channels timed as LPDDR5
    load_config(CXL, ["memory.extra.cxl_ddr5.standard=lpddr5", "memory.extra.cxl_ddr5.timing_model=command-level",
                      "memory.extra.cxl_ddr5.channel_width_bits=16"])
    refused(lambda: load_config(CXL, ["memory.extra.cxl_ddr5.standard=lpddr5",
                                      "memory.extra.cxl_ddr5.timing_model=command-level"]),
            "memory.extra.cxl_ddr5.channel_width_bits: 32, but memory.extra.cxl_ddr5.standard LPDDR5 has 16")
    # the closed form reads no standard: nothing to check
    load_config(THOR, ["memory.hbm.standard=lpddr5", "memory.hbm.timing_model=closed-form"])


# ---------------------------------------------------------------------------------------------- PCIe sizes
PCIE_SIZES = {128, 256, 512, 1024, 2048, 4096}


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=4096) | st.sampled_from(sorted(PCIE_SIZES)))
def test_pcie_payload_is_exactly_a_power_of_two_from_128_to_4096(size):
    for key in ("links.pcie.max_payload_bytes", "links.pcie.max_read_request_bytes"):
        if size in PCIE_SIZES:
            assert getattr(load_config(THOR, [f"{key}={size}"]).hw.links["pcie"], key.rsplit(".", 1)[1]) == size
        else:
            refused(lambda: load_config(THOR, [f"{key}={size}"]), key, f"got {size}", "power of two")


def test_the_pcie_rule_applies_to_pcie_links_only():
    refused(lambda: load_config(THOR, ["links.pcie.max_payload_bytes=127"]), "links.pcie.max_payload_bytes")
    # thor-cxl's CXL.mem link moves 64 B: its own protocol, timed by the fixed model
    assert load_config(CXL).hw.links["cxl"].max_payload_bytes == 64
    # timed by the PCIe link layer, a link is PCIe and takes PCIe's sizes
    layer = ["links.extra.cxl.timing_model=link-layer", "links.extra.cxl.encoding=flit",
             "links.extra.cxl.max_read_request_bytes=512", "links.extra.cxl.read_tags=768"]
    refused(lambda: load_config(CXL, layer), "links.extra.cxl.max_payload_bytes", "got 64")
    load_config(CXL, layer + ["links.extra.cxl.max_payload_bytes=128"])


# ---------------------------------------------------------------------------------------------- tiles
def test_the_tiles_an_array_holds_fit_its_sram():
    # thor: 2 MiB of SRAM per array, two tiles (double-buffered)
    load_config(CYCLE, ["compute.operand_tile_kib=1024"])
    refused(lambda: load_config(CYCLE, ["compute.operand_tile_kib=1024.0009765625"]), "compute.operand_tile_kib",
            "2 tiles", "2 MiB")
    load_config(CYCLE, ["compute.operand_tile_kib=2048", "compute.operand_tile_buffers=1"])
    # h200-cycle-level: 7 programs per SM x one 8 KiB tile each, in 256 KiB; 32 fill it, 33 do not
    load_config(H200_CYCLE, ["compute.programs_per_array=32"])
    refused(lambda: load_config(H200_CYCLE, ["compute.programs_per_array=33"]), "compute.operand_tile_kib",
            "33 tiles", "programs_per_array")


def test_a_request_fits_in_a_tile_and_a_tile_is_whole_bytes():
    load_config(CYCLE, ["compute.hbm_request_bytes=65536"])  # one 64 KiB tile
    refused(lambda: load_config(CYCLE, ["compute.hbm_request_bytes=65537"]), "compute.hbm_request_bytes",
            "65537 B", "65536 B")
    load_config(CYCLE, ["compute.operand_tile_kib=0.0009765625", "compute.hbm_request_bytes=1"])  # 1 byte
    refused(lambda: load_config(CYCLE, ["compute.operand_tile_kib=0.0001"]), "compute.operand_tile_kib",
            "0.1024 bytes")


# ---------------------------------------------------------------------------------------------- operation keys
def test_every_committed_measured_key_names_an_operation():
    hw = load_config(H200).hw
    assert len(hw.compute.op_times_ns) > 100 and len(hw.compute.op_energy_pj) > 50
    check_op_keys(hw)


def test_every_operation_of_every_model_is_accepted_at_any_context_and_precision():
    hw = load_config(H200).hw
    quant = (hw.model.quant_group_size, hw.model.quant_scale_bits, hw.compute.dequant_ops_per_weight)
    for model in MODELS.values():
        for bits, dense_bits in [(b, 16) for b in (4, 5, 8, 16, 32)] + [(16, b) for b in (4, 5, 8)]:
            for context in (1, 3, 8192, 32768, 1 << 24):
                for key in _step_keys(quant, model, context, bits, dense_bits):
                    assert known_shape(hw, key) is None, (model.name, bits, dense_bits, context, key)


def test_a_typo_a_foreign_width_or_a_malformed_key_is_refused():
    hw = load_config(H200).hw
    # granite-3.1-3b-a800m's gate+up at 16 bit: d 1536, 2 x 512 outputs, 1536 x 1024 x 2 bytes
    assert known_shape(hw, "matvec r1536 o1024 b3145728") is None
    for key in ("matvec r1536 o1024 b3145729", "matvec r1537 o1024 b3145728", "matvec r1536 o1023 b3145728"):
        assert "no operation of any model" in known_shape(hw, key)
    assert "not of the form 'matvec rR oO bB'" in known_shape(hw, "matvec r1536 o1024")
    assert "not of the form" in known_shape(hw, "matvec r+1536 o1024 b3145728")
    assert "unknown operation kind 'conv'" in known_shape(hw, "conv n1")
    # granite-3b's value mix reads the KV cache: r = context, b = 8 heads x context x 64 x 2 bytes
    top = 1 << 24  # workload.context_length's maximum
    assert known_shape(hw, f"matvec r{top} o1536 b{8 * top * 128}") is None
    assert known_shape(hw, f"matvec r{top + 1} o1536 b{8 * (top + 1) * 128}") is not None
    # a context that gives one field and not the other
    assert known_shape(hw, "matvec r1024 o1536 b1048577") is not None


def test_an_unknown_key_is_one_line_before_anything_runs(capsys, tmp_path):
    one_line_exit_2(capsys, ["run", THOR, "--policy", "no-prefetch", "--jobs", "1", "--set",
                             'compute.op_times_ns={"matvec r1536 o1024 b314572": 5}'],
                    "compute.op_times_ns.'matvec r1536 o1024 b314572'", "no operation of any model")
    one_line_exit_2(capsys, ["run", THOR, "--policy", "no-prefetch", "--jobs", "1", "--set",
                             'compute.op_energy_pj={"conv n1": 5}'], "compute.op_energy_pj.'conv n1'")
    assert not os.path.exists(tmp_path / "cache")  # refused before the DRAM calibration


def test_a_model_registered_later_has_its_keys_accepted(tiny):
    hw = load_config(THOR).hw
    key = f"matvec r{tiny.shape.hidden_size} o{tiny.shape.num_experts} b{tiny.shape.hidden_size * 8 * 2}"  # router
    assert known_shape(hw, key) is None


# ---------------------------------------------------------------------------------------------- trace metadata
def _trace(tokens=5):
    model = next(m for m in MODELS.values() if m.name == "granite-3.1-1b-a400m")
    return hand_trace_arrays(model, random_routing(model, tokens))


def test_trace_tokens_in_meta_agree_with_the_arrays():
    arrays, meta = _trace(5)
    meta["provenance"]["trace_tokens"] = 5
    tf.validate(arrays, meta)
    meta["provenance"]["trace_tokens"] = 6
    refused(lambda: tf.validate(arrays, meta), "meta.provenance.trace_tokens is 6", "holds 5 tokens")
    meta["provenance"]["trace_tokens"] = "5"
    refused(lambda: tf.validate(arrays, meta), "trace_tokens is '5'")


def test_meta_model_counts_agree_with_each_other():
    arrays, meta = _trace()
    meta["model"]["top_k"] = 33  # of 32 experts
    refused(lambda: tf.validate(arrays, meta), "meta.model.top_k 33", "from 1 to meta.model.num_experts (32)")
    meta["model"]["top_k"] = 0
    refused(lambda: tf.validate(arrays, meta), "meta.model.top_k 0")
    arrays, meta = _trace()
    meta["model"]["first_dense_layers"] = 24
    refused(lambda: tf.validate(arrays, meta), "first_dense_layers 24 leaves no MoE layer")


# ---------------------------------------------------------------------------------------------- CLI options
@pytest.mark.parametrize("option,value,words", [
    ("--seed", "-1", "--seed must be within 0"),
    ("--requests", "10000001", "--requests must be within 1 ... 10000000"),
    ("--requests", "0", "--requests must be within 1"),
    ("--channels", "4097", "--channels must be within 1 ... 4096"),
    ("--streams", "8193", "--streams must be within 1 ... 8192"),  # hbm3's 8192 rows
    ("--read-buffer", "4097", "--read-buffer must be within 1 ... 4096"),
    ("--write-buffer", "0", "--write-buffer must be within 1"),
])
def test_dram_options_out_of_range_are_one_line(capsys, option, value, words):
    one_line_exit_2(capsys, ["dram", "hbm3", "--requests", "100", option, value], words)


def test_dram_options_at_their_bounds_run(capsys):
    assert main(["dram", "hbm3", "--requests", "100", "--seed", "0", "--streams", "8192", "--read-buffer", "4096",
                 "--write-buffer", "1", "--json"]) == 0
    assert '"streams": 8192' in capsys.readouterr().out


def test_window_contexts_are_plain_numbers_up_to_the_largest_context(capsys):
    top = 1 << 24
    assert _int_list(f"1,{top}", "--window", top, "the largest workload.context_length") == [1, top]
    one_line_exit_2(capsys, ["calibrate", CYCLE, "--window", f"512,{top + 1}"], "--window", f"{top + 1} is above",
                    str(top))
    for text in ("1_000", "+5", "٣", "512,", " 512"):
        one_line_exit_2(capsys, ["calibrate", CYCLE, "--window", text], "--window: expected whole numbers")


def test_a_policy_parameter_given_twice_is_refused(capsys, tmp_path):
    assert make_policy("apex:tau=0.6", {}).params.tau == 0.6
    refused(lambda: make_policy("apex:tau=0.9,tau=0.6", {}), "--policy apex:tau=0.9,tau=0.6",
            "parameter 'tau' given twice")
    one_line_exit_2(capsys, ["run", THOR, "--policy", "static:extra=2,extra=4"], "'extra' given twice")
    assert not os.path.exists(tmp_path / "cache")  # refused before the DRAM calibration


# ---------------------------------------------------------------------------------------------- sweep leftovers
def test_a_sweep_that_fails_after_taking_the_lock_leaves_nothing(capsys, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "a" / "s"
    one_line_exit_2(capsys, ["sweep", THOR, "--grid", "dma.engines=1", "--policy", "no-prefetch", "--set",
                             "workload.max_tokens=4", "--out", str(out), "--backend", "dask", "--scheduler", "nope://x",
                             "--quiet", "--jobs", "1"], "--scheduler nope://x: cannot connect")
    assert not (tmp_path / "a").exists()
