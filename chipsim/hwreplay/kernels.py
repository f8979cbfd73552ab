"""The replay's kernels and weight layouts (needs torch): which one kernel stands for each primitive the simulator
costs, and how a matvec's weight operand (BF16, or 4- and 8-bit with BF16 group scales) is laid out in an expert's
bytes. The GPU replay (chipsim.hwreplay.harness), the host CPU's experts (chipsim.hwreplay.host_experts) and the
per-shape microbenchmark launch exactly these."""

from __future__ import annotations

import torch

from chipsim.hwreplay.ops import Primitive


def _nothing() -> None:
    """A fused primitive's launch: its work runs inside another primitive's kernel."""


QUANT_BITS = (4, 8)  # the sub-16-bit expert formats the replay has kernels for (triton_kernels.gemv_q4, gemv_q8)


def quant_views(buf: torch.Tensor, p: Primitive) -> tuple[torch.Tensor, torch.Tensor]:
    """A 4- or 8-bit matvec primitive's operand in `buf` (uint8, at least p.weight_bytes): (packed (rows,
    reduction x bits / 8) bytes, scales (rows, reduction/quant_group) BF16), the layout chipsim.hwreplay.
    triton_kernels.gemv_q4 and gemv_q8 read."""
    if p.bits not in QUANT_BITS or p.reduction % p.quant_group or p.quant_group % 2:
        raise ValueError(f"{p.name}: the replay runs 4- or 8-bit weights whose groups divide the reduction "
                         f"({p.bits} bit, group {p.quant_group}, reduction {p.reduction})")
    rows = weight_shape(p)[0]
    width = p.reduction * p.bits // 8
    n = rows * width
    scales = buf[n:p.weight_bytes].view(torch.bfloat16)
    if scales.numel() != rows * (p.reduction // p.quant_group):
        raise ValueError(f"{p.name}: {p.weight_bytes} bytes are not a packed {p.bits}-bit weight with BF16 scales")
    return buf[:n].view(rows, width), scales.view(rows, p.reduction // p.quant_group)


q4_views = quant_views  # (the 4-bit replays' name)


def weight_views(buf: torch.Tensor, p: Primitive):
    """A matvec primitive's weight operand laid out in `buf` (uint8, from its first byte): a (rows, reduction) BF16
    matrix, or for 4- and 8-bit weights quant_views' (packed, scales) pair; what kernel_call takes as its weight."""
    if p.bits < 16:
        return quant_views(buf, p)
    rows, reduction = weight_shape(p)
    return buf[:2 * rows * reduction].view(torch.bfloat16).view(rows, reduction)


def weight_bytes(p: Primitive) -> int:
    """Bytes of a matvec primitive's weight operand as weight_views lays it out."""
    return p.weight_bytes if p.bits < 16 else 2 * weight_shape(p)[0] * p.reduction


def dequantise_q4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The BF16 matrix a 4-bit operand stands for (the reference gemv_q4 is checked against; the CPU dry run's
    kernel)."""
    rows, half = packed.shape
    group = 2 * half // scales.shape[1]
    q = packed.view(rows, half // (group // 2), group // 2)
    w = torch.cat([(q & 15), (q >> 4)], dim=2).to(torch.float32) - 8.0  # per group: low nibbles, then high
    return (w * scales.to(torch.float32)[:, :, None]).reshape(rows, 2 * half).to(torch.bfloat16)


def dequantise_q8(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The BF16 matrix an 8-bit operand stands for: each byte less 128, times its group's scale (the reference
    gemv_q8 is checked against; the CPU dry run's kernel)."""
    rows, cols = packed.shape
    group = cols // scales.shape[1]
    w = packed.view(rows, cols // group, group).to(torch.float32) - 128.0
    return (w * scales.to(torch.float32)[:, :, None]).reshape(rows, cols).to(torch.bfloat16)


def _mv_q4_reference(packed, scales, x, out):
    return torch.mv(dequantise_q4(packed, scales), x, out=out)


def _mv_q8_reference(packed, scales, x, out):
    return torch.mv(dequantise_q8(packed, scales), x, out=out)


def kernel_call(p: Primitive, weight, x, scratch_a, scratch_b, out, gemv: str = "cublas") -> tuple:
    """The one kernel that stands for primitive `p`, as (function, args, kwargs): a GEMV (or, for an operand
    shared by g heads, a (rows × reduction)·(reduction × g) matmul) on `weight`, a GEMM of `p.tokens` rows of `x`
    for a matmul primitive (a prefill chunk's), an exp for SFU work, an add for vector work, nothing for a fused
    primitive (a prefill chunk's attention kernel is chipsim.hwreplay.prefill_harness.attention_call's). The replay
    and the per-shape microbenchmark launch exactly these. gemv: "cublas" (torch.mv / torch.mm) or "triton" (chipsim.hwreplay.triton_kernels: the structure the
    cycle-level H200 description assumes). A 4- or 8-bit matvec's weight is quant_views' pair, and its kernel is
    always triton_kernels.gemv_q4 or gemv_q8 (cuBLAS has no such GEMV; on a CPU dry run, the dequantised reference)."""
    if p.kind == "matvec" and p.bits < 16:
        packed, scales = weight
        res = out[:weight_shape(p)[0]]
        if packed.device.type != "cuda":
            return (_mv_q4_reference if p.bits == 4 else _mv_q8_reference), (packed, scales, x[:p.reduction], res), {}
        from chipsim.hwreplay import triton_kernels

        kernel = triton_kernels.gemv_q4 if p.bits == 4 else triton_kernels.gemv_q8
        return kernel, (packed, scales, x[:p.reduction], res, p.quant_group), {}
    if p.kind == "matmul":  # tokens x reduction activations times the (rows x reduction) weight: one GEMM
        xin = x[:p.tokens * p.reduction].view(p.tokens, p.reduction)
        res = out[:p.tokens * weight.shape[0]].view(p.tokens, weight.shape[0])
        return torch.mm, (xin, weight.t()), {"out": res}
    if p.kind == "matvec":
        g = p.groups
        rows = weight.shape[0]
        xin = x[:p.reduction] if g == 1 else x[:p.reduction * g].view(p.reduction, g)
        res = out[:rows] if g == 1 else out[:rows * g].view(rows, g)
        if gemv == "triton":
            from chipsim.hwreplay import triton_kernels

            return triton_kernels.gemv, (weight, xin, res), {}
        return (torch.mv if g == 1 else torch.mm), (weight, xin), {"out": res}
    if p.fused:
        return _nothing, (), {}
    n = max(p.elements, 1)
    if p.kind == "sfu":
        return torch.exp, (scratch_a[:n],), {"out": out[:n]}
    return torch.add, (scratch_a[:n], scratch_b[:n]), {"out": out[:n]}


def operand_sizes(prims: list[Primitive]) -> tuple[int, int]:
    """(scratch elements, input elements) every kernel_call of `prims` reads or writes at most: its elementwise
    operands and outputs, and its input vector (g of them for a grouped operand)."""
    return (max([p.elements for p in prims] + [p.outputs for p in prims] + [1]),
            max([p.reduction * p.groups for p in prims] + [1]))


def weight_shape(p: Primitive) -> tuple[int, int]:
    """(rows, reduction) of a matvec primitive's weight operand."""
    return -(-p.outputs // p.groups), p.reduction
