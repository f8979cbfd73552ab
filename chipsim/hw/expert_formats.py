"""Expert weight formats as data: what one routed expert's bytes are, moved and stored, for each format.

A format is its bits per weight and, below 16 bit, one scale of `scale_bits` per `group_size` weights
(`decode.weight_bytes`). Every format below 16 bit is widened to BF16 on the arrays before the MACs,
at compute.dequant_ops_per_weight lane operations a weight (the arrays have no FP8 or FP4 datapath).

`model.expert_format` names one; empty keeps what model.expert_bits, model.quant_group_size and
model.quant_scale_bits say (integer weights with group scales below 16 bit, as configs before it did).
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.errors import InputError

PER_TENSOR = 1 << 30  # one scale per matrix: a group no expert matrix reaches (model.quant_group_size's maximum)


@dataclass(frozen=True)
class ExpertFormat:
    bits: int
    group_size: int | None  # None: the config's model.quant_group_size (integer formats)
    scale_bits: int | None  # None: the config's model.quant_scale_bits
    source: str


FORMATS = {
    "bf16": ExpertFormat(16, None, None, "bfloat16: 1 sign, 8 exponent, 7 mantissa bits; no scales"),
    "fp16": ExpertFormat(16, None, None, "IEEE 754 binary16; no scales"),
    "fp8-e4m3": ExpertFormat(8, PER_TENSOR, 32, "OCP FP8 E4M3 with one FP32 scale per matrix (per-tensor scaling, "
                                                  "as FP8 checkpoints of Qwen3 and Llama ship)"),
    "fp8-e4m3-block128": ExpertFormat(8, 128 * 128, 32, "OCP FP8 E4M3 with one FP32 scale per 128 x 128 block "
                                                        "(DeepSeek-V3 technical report, arXiv 2412.19437, sec. 3.3)"),
    "int8": ExpertFormat(8, None, None, "8-bit integers with one scale per model.quant_group_size weights"),
    "int4": ExpertFormat(4, None, None, "4-bit integers with one scale per model.quant_group_size weights"),
    "mxfp4": ExpertFormat(4, 32, 8, "OCP Microscaling MXFP4 (MX spec v1.0): E2M1 elements, one E8M0 scale per 32; "
                                    "gpt-oss ships its experts so"),
    "nvfp4": ExpertFormat(4, 16, 8, "NVIDIA NVFP4: E2M1 elements, one FP8 E4M3 scale per 16 (the per-tensor FP32 "
                                    "scale is not counted)"),
    # 5 + 16/32 = 5.5 bits a weight = 176 bytes per 256, as block_q5_K is
    "q5_k": ExpertFormat(5, 32, 16, "llama.cpp Q5_K (ggml-common.h block_q5_K): per 256 weights an FP16 d and dmin, "
                                    "12 bytes of 6-bit sub-block scales and mins for 8 sub-blocks of 32, 32 bytes "
                                    "of high bits (qh) and 128 of low nibbles (qs) = 176 bytes = 5.5 bits a weight, "
                                    "here 5-bit elements and 16 scale bits per 32 weights; llama.cpp's Q5_K_M *mix* "
                                    "raises some tensors (attn_v, and ffn_down in about half the layers: "
                                    "llama_tensor_get_type's use_more_bits) to Q6_K (block_q6_K: 210 bytes per 256 "
                                    "= 6.5625 bits a weight), which this format does not model"),
}


def resolve_format(model: dict, overrides: list[str]) -> None:
    """Write the named format's bits, group and scale bits into a config's `model` section (in place), so that every
    reader of model.expert_bits sees them; a --set of a key the format decides is refused (it would be ignored)."""
    name = model.get("expert_format") or ""
    if not name:
        return
    fmt = FORMATS.get(name)
    if fmt is None:
        raise InputError(f"model.expert_format: unknown format {name!r} (known: {', '.join(FORMATS)})")
    decided = {"expert_bits": fmt.bits, "quant_group_size": fmt.group_size, "quant_scale_bits": fmt.scale_bits}
    for assignment in overrides:
        key = assignment.partition("=")[0].strip()
        for shadowed, value in decided.items():
            if key == f"model.{shadowed}" and value is not None:
                raise InputError(f"{key}: model.expert_format {name} decides it ({value}); set one of the two")
    for key, value in decided.items():
        if value is not None:
            model[key] = value
