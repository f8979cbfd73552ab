"""model.dense_bits (the precision of every non-expert weight matrix) and the q5_k format, each number by hand."""

import os

import pytest
from conftest import ROOT, THOR
from test_bad_input import assert_rejected, chipsim

from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.hw.expert_formats import FORMATS
from chipsim.hw.compute_formula import parse_op_key
from chipsim.workload.decode import build_workload, op_group_builders, weight_bytes
from chipsim.workload.models import MODELS, model_of
from chipsim.workload.op_keys import _KeyRecorder

RTX4060 = os.path.join(ROOT, "hwconfigs", "rtx4060.yaml")
# Qwen2-57B-A14B on the 8 GB card with q5_k experts (33.9 GB: they fit its 64 GiB DDR4) and a 1 GiB expert buffer
QWEN_ON_4060 = ["model.name=qwen2-57b-a14b", "model.expert_format=q5_k", "expert_buffer.capacity_mib=1024"]


def _ops(overrides, group: str) -> dict[str, dict]:
    """Operation name -> its key's fields (read_bytes, elements, ...) in op group `group` of thor's decode step."""
    hw = load_config(THOR, overrides).hw
    recorder = _KeyRecorder()
    op_group_builders(recorder, model_of(hw.model), hw)[group]()
    return {name: parse_op_key(key)[1] for name, key in zip(recorder.names, recorder.keys)}


def test_q5_k_is_176_bytes_per_256_weights():
    """block_q5_K: 2 + 2 (d, dmin) + 12 (scales, mins) + 32 (qh) + 128 (qs) = 176 bytes per 256 weights."""
    f = FORMATS["q5_k"]
    assert weight_bytes(256, f.bits, f.group_size, f.scale_bits) == 2 + 2 + 12 + 32 + 128 == 176
    wl = build_workload(load_config(THOR, ["model.expert_format=q5_k"]).hw)
    assert wl.expert_bytes == 3 * 1536 * 512 * 176 // 256  # Granite-3B's expert: 3 x 1536 x 512 weights


def test_lm_head_at_8_bit_is_its_weights_plus_one_16_bit_scale_per_128():
    """Granite-3B's LM head, d 1536 x V 49155: BF16, 2 bytes a weight; at 8 bit, 1 byte a weight and one 2-byte
    scale per 128 (thor.yaml's group and scale bits), widened at compute.dequant_ops_per_weight lane ops a weight."""
    d, v = 1536, 49155
    bf16 = _ops([], "head")
    q8 = _ops(["model.dense_bits=8"], "head")
    assert bf16["lm_head"]["read_bytes"] == d * v * 2
    assert q8["lm_head"]["read_bytes"] == d * v + -(-d * v // 128) * 2 == 76_681_800  # 75,502,080 + 589,860 scales x 2
    assert q8["embedding"]["read_bytes"] == d + d // 128 * 2  # one row looked up
    dequant_ops = load_config(THOR).hw.compute.dequant_ops_per_weight
    assert q8["lm_head_dequant"]["elements"] == d * v * dequant_ops
    assert "lm_head_dequant" not in bf16


def test_every_projection_and_the_router_take_the_dense_precision_the_kv_cache_does_not():
    d, nq, nkv, hd, experts = 1536, 24, 8, 64, 40
    q4 = _ops(["model.dense_bits=4"], "attention")
    qkv = d * (nq + 2 * nkv) * hd
    assert q4["qkv_proj"]["read_bytes"] == qkv // 2 + qkv // 128 * 2
    assert q4["o_proj"]["read_bytes"] == nq * hd * d // 2 + nq * hd * d // 128 * 2
    context = load_config(THOR).hw.workload.context_length
    assert q4["scores"]["read_bytes"] == nkv * context * hd * 2  # the KV cache stays BF16
    router = _ops(["model.dense_bits=4"], "router")["router"]
    assert router["read_bytes"] == d * experts // 2 + d * experts // 128 * 2


def test_shared_experts_take_the_dense_precision():
    """Qwen2-57B's shared expert (3 x 3584 x 20480) and its gate (3584 x 1) at 8 bit, one 2-byte scale per 128."""
    hw = load_config(os.path.join(ROOT, "hwconfigs", "a800-qwen2-57b-a14b.yaml"), ["model.dense_bits=8"]).hw
    recorder = _KeyRecorder()
    op_group_builders(recorder, model_of(hw.model), hw)["shared"]()
    ops = {name: parse_op_key(key)[1] for name, key in zip(recorder.names, recorder.keys)}
    gu = 2 * 3584 * 20480
    assert ops["shared_gate_up"]["read_bytes"] == gu + gu // 128 * 2
    assert ops["shared_gate"]["read_bytes"] == 3584 + 28 * 2  # 3584 / 128 = 28 groups
    assert "shared_dequant" in ops and "shared_gate_dequant" in ops


def test_qwen2_57b_non_expert_matrices_by_hand():
    """Two untied embeddings of V 151936 x d 3584; per layer q, k, v (28 + 2 x 4 heads of 128) and o, the router
    (64 experts), the shared expert (3 x d x 20480) and its gate (d); the rest is RMSNorms: two a layer, one final."""
    m = MODELS["qwen2-57b-a14b"]
    d = 3584
    layer = d * (28 + 8) * 128 + 28 * 128 * d + d * 64 + 3 * d * 20480 + d
    assert m.non_expert_matrix_params() == 2 * 151936 * d + 28 * layer == 8_083_310_592
    assert m.non_expert_params() - m.non_expert_matrix_params() == 28 * 2 * d + d


def test_the_memory_plan_prices_the_matrices_at_the_dense_precision_so_qwen2_57b_fits_the_4060_at_5_bit():
    m = MODELS["qwen2-57b-a14b"]
    matrices, norms = m.non_expert_matrix_params(), m.non_expert_params() - m.non_expert_matrix_params()
    with pytest.raises(InputError, match=r"memory.gddr6.capacity_gib: 8.0 GiB cannot hold non-expert weights "
                                         r"\(15.06 GiB\)"):
        build_workload(load_config(RTX4060, QWEN_ON_4060).hw)
    wl = build_workload(load_config(RTX4060, QWEN_ON_4060 + ["model.dense_bits=5"]).hw)
    # q5_k sets group 32 and 16-bit scales (expert_formats.FORMATS), which dense_bits shares: 5.5 bits a weight
    assert wl.hbm_non_expert_bytes == weight_bytes(matrices, 5, 32, 16) + norms * 2
    assert wl.hbm_non_expert_bytes == matrices * 11 // 16 + norms * 2  # 8,083,310,592 is a multiple of 32
    assert wl.hbm_spare_bytes > 0


def test_16_bit_dense_weights_are_the_bf16_bytes_of_before():
    wl = build_workload(load_config(THOR).hw)
    assert wl.hbm_non_expert_bytes == MODELS["granite-3.1-3b-a800m"].non_expert_params() * 2
    explicit = build_workload(load_config(THOR, ["model.dense_bits=16"]).hw)
    assert explicit == wl


def test_a_lower_dense_precision_reads_fewer_bytes_and_pays_lane_work():
    base = build_workload(load_config(THOR).hw)
    q8 = build_workload(load_config(THOR, ["model.dense_bits=8"]).hw)
    m = base.model
    dequant_ops = load_config(THOR).hw.compute.dequant_ops_per_weight
    attention = m.mixer_matrix_params(0)
    assert q8.layers[0].attention.vector_ops - base.layers[0].attention.vector_ops == attention * dequant_ops
    assert q8.layers[0].attention.hbm_read_bytes < base.layers[0].attention.hbm_read_bytes
    assert q8.token_head.vector_ops - base.token_head.vector_ops == (1536 + 1536 * 49155) * dequant_ops
    assert q8.layers[0].expert == base.layers[0].expert  # the routed experts keep model.expert_bits


def test_dense_bits_3_is_refused_in_one_line_with_exit_2():
    assert_rejected(["run", THOR, "--set", "model.dense_bits=3"], "model.dense_bits", "one of 4, 5, 8, 16")
    code, _, _ = chipsim("run", THOR, "--set", "model.dense_bits=3")
    assert code == 2


def test_expert_bits_5_is_accepted():
    wl = build_workload(load_config(THOR, ["model.expert_bits=5"]).hw)
    assert wl.expert_bytes == 3 * weight_bytes(1536 * 512, 5, 128, 16) == 3 * (1536 * 512 * 5 // 8 + 1536 * 512 // 128 * 2)
