"""Triton kernels of a known structure: batch-1 GEMVs for the GPU replay (`chipsim hwreplay --gemv triton`) and
the single-op probe (validation/compute/probe_sm.py --gemv), and the pointer chase both latency probes run
(validation/compute/probe_sm.py, validation/pcie/probe_copy_latency.py). Needs Triton (the device machine;
never imported by the simulator).

cuBLAS picks a different kernel per shape (split-K, nvjet tiles; validation/compute/h200-kernel-mapping.json),
so a replay with torch.mv checks the simulator against a library's choices. These kernels fix the structure
that hwconfigs/h200-cycle-level.yaml describes instead:

- a program (CTA, `WARPS` warps) computes `ROWS` consecutive weight rows;
- it walks the reduction `BLOCK` columns at a time: one load of ROWS x BLOCK BF16 weights per iteration,
  accumulated in FP32 registers and summed once at the end; the loop is not software-pipelined (Triton
  pipelines only loops that feed tl.dot), so the next tile's loads issue after this one's are consumed;
- an operand shared by g outputs per row (GQA heads on one KV entry) is read once: each row is dotted with
  g input vectors, x laid out (reduction, g) as the replay's torch.mm stand-in has it.

`gemv_q4` is the 4-bit experts' kernel (there is no cuBLAS one): it streams the packed weights and their scales
(chipsim.hwreplay.harness.quant_views gives the layout) and dequantises in registers, an offset and a scale per
weight, as the simulator's `compute.dequant_ops_per_weight: 2` lane operations. `gemv_q8` is the same for 8-bit
experts: a byte per weight, less 128, times its group's BF16 scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 8  # weight rows per program
BLOCK = 512  # reduction columns per iteration: one tile of ROWS x BLOCK x 2 B = 8 KiB
GROUPED_BLOCK = 128  # the same with g input vectors: the (ROWS, BLOCK, g) products stay in registers
WARPS = 4


@triton.jit
def chase(ptr, out, steps):
    """One thread following `steps` pointers from ptr[0] (each a word offset): every load waits for the last,
    so time / steps is one load's latency from wherever the words live."""
    i = tl.load(ptr)
    for _ in range(steps):
        i = tl.load(ptr + i, volatile=True)
    tl.store(out, i)


@triton.jit
def _gemv(w, x, y, R: tl.constexpr, O: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """y = W x for W of O rows x R (row-major BF16): each program ROWS rows, BLOCK columns at a time."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for off in range(0, R, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        wv = tl.load(w + rows[:, None].to(tl.int64) * R + cols[None, :], mask=(rows[:, None] < O) & (cols[None, :] < R),
                     other=0.0)
        xv = tl.load(x + cols, mask=cols < R, other=0.0)
        acc += wv.to(tl.float32) * xv[None, :].to(tl.float32)
    tl.store(y + rows, tl.sum(acc, axis=1).to(tl.bfloat16), mask=rows < O)


@triton.jit
def _gemv_grouped(w, x, y, R: tl.constexpr, O: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """y (O x G) = W (O x R) X (R x G), all row-major BF16; GP = G rounded up to a power of two."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    gs = tl.arange(0, GP)
    acc = tl.zeros((ROWS, GP), dtype=tl.float32)
    for off in range(0, R, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        wv = tl.load(w + rows[:, None].to(tl.int64) * R + cols[None, :], mask=(rows[:, None] < O) & (cols[None, :] < R),
                     other=0.0).to(tl.float32)
        xv = tl.load(x + cols[:, None] * G + gs[None, :], mask=(cols[:, None] < R) & (gs[None, :] < G),
                     other=0.0).to(tl.float32)
        acc += tl.sum(wv[:, :, None] * xv[None, :, :], axis=1)
    tl.store(y + rows[:, None] * G + gs[None, :], acc.to(tl.bfloat16), mask=(rows[:, None] < O) & (gs[None, :] < G))


@triton.jit
def _gemv_q4(q, s, x, y, R: tl.constexpr, O: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
             BLOCK: tl.constexpr):
    """y = W x for W of O rows x R 4-bit weights: q (O, R/2) bytes, s (O, R/GROUP) BF16 scales. In each group of
    GROUP columns, byte j holds column j (low nibble) and column j + GROUP/2 (high); a weight is (nibble - 8) x
    scale. Each program ROWS rows, BLOCK bytes (2 x BLOCK columns) at a time."""
    HALF: tl.constexpr = GROUP // 2
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for off in range(0, R // 2, BLOCK):
        b = off + tl.arange(0, BLOCK)
        grp = b // HALF
        lo_col = grp * GROUP + b % HALF
        m = (rows[:, None] < O) & (b[None, :] < R // 2)
        qb = tl.load(q + rows[:, None].to(tl.int64) * (R // 2) + b[None, :], mask=m, other=0)
        sc = tl.load(s + rows[:, None].to(tl.int64) * (R // GROUP) + grp[None, :], mask=m, other=0.0).to(tl.float32)
        xl = tl.load(x + lo_col, mask=b < R // 2, other=0.0).to(tl.float32)
        xh = tl.load(x + lo_col + HALF, mask=b < R // 2, other=0.0).to(tl.float32)
        lo = (qb & 15).to(tl.float32) - 8.0
        hi = (qb >> 4).to(tl.float32) - 8.0
        acc += (lo * xl[None, :] + hi * xh[None, :]) * sc
    tl.store(y + rows, tl.sum(acc, axis=1).to(tl.bfloat16), mask=rows < O)


def gemv_q4(packed: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, out: torch.Tensor, group: int) -> torch.Tensor:
    """out = W x for a 4-bit weight given as (packed (rows, reduction/2) uint8, scales (rows, reduction/group) BF16)."""
    rows, half = packed.shape
    block = min(BLOCK // 2, triton.next_power_of_2(half))
    _gemv_q4[(triton.cdiv(rows, ROWS),)](packed, scales, x, out, 2 * half, rows, group, ROWS, block, num_warps=WARPS)
    return out


@triton.jit
def _gemv_q8(q, s, x, y, R: tl.constexpr, O: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
             BLOCK: tl.constexpr):
    """y = W x for W of O rows x R 8-bit weights: q (O, R) bytes, s (O, R/GROUP) BF16 scales; a weight is
    (byte - 128) x its group's scale. Each program ROWS rows, BLOCK columns at a time."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for off in range(0, R, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        m = (rows[:, None] < O) & (cols[None, :] < R)
        qb = tl.load(q + rows[:, None].to(tl.int64) * R + cols[None, :], mask=m, other=128)
        sc = tl.load(s + rows[:, None].to(tl.int64) * (R // GROUP) + cols[None, :] // GROUP, mask=m,
                     other=0.0).to(tl.float32)
        xv = tl.load(x + cols, mask=cols < R, other=0.0).to(tl.float32)
        acc += (qb.to(tl.float32) - 128.0) * sc * xv[None, :]
    tl.store(y + rows, tl.sum(acc, axis=1).to(tl.bfloat16), mask=rows < O)


def gemv_q8(packed: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, out: torch.Tensor, group: int) -> torch.Tensor:
    """out = W x for an 8-bit weight given as (packed (rows, reduction) uint8, scales (rows, reduction/group) BF16)."""
    rows, cols = packed.shape
    block = min(BLOCK, triton.next_power_of_2(cols))
    _gemv_q8[(triton.cdiv(rows, ROWS),)](packed, scales, x, out, cols, rows, group, ROWS, block, num_warps=WARPS)
    return out


def gemv(weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor, rows_per_program: int = ROWS) -> torch.Tensor:
    """out = weight @ x for a (rows, reduction) BF16 weight and x of (reduction,) or (reduction, g)."""
    rows, reduction = weight.shape
    grid = (triton.cdiv(rows, rows_per_program),)
    if x.dim() == 1:
        block = min(BLOCK if rows_per_program <= 8 else 128, triton.next_power_of_2(reduction))
        _gemv[grid](weight, x, out, reduction, rows, rows_per_program, block, num_warps=WARPS)
    else:
        g = x.shape[1]
        block = min(GROUPED_BLOCK, triton.next_power_of_2(reduction))
        _gemv_grouped[grid](weight, x, out, reduction, rows, g, triton.next_power_of_2(g), rows_per_program, block,
                            num_warps=WARPS)
    return out


def registers_per_thread(weight: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> int:
    """Registers per thread of the kernel `gemv` compiles for this shape (it sets how many programs fit on an
    SM: 65,536 registers / (registers x 32 x WARPS))."""
    rows, reduction = weight.shape
    if x.dim() == 1:
        block = min(BLOCK, triton.next_power_of_2(reduction))
        k = _gemv.warmup(weight, x, out, reduction, rows, ROWS, block, num_warps=WARPS, grid=(1,))
    else:
        g = x.shape[1]
        block = min(GROUPED_BLOCK, triton.next_power_of_2(reduction))
        k = _gemv_grouped.warmup(weight, x, out, reduction, rows, g, triton.next_power_of_2(g), ROWS, block,
                                 num_warps=WARPS, grid=(1,))
    if hasattr(k, "_init_handles"):  # Triton 3: the counts are read when the kernel is loaded
        k._init_handles()
    return int(getattr(k, "n_regs", 0) or 0)
