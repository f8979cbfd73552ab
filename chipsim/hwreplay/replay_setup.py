"""What every GPU replay sets up (no GPU needed to import): the plans built in worker processes, the experts in
pinned host memory filled with normal BF16 numbers, the GPU slots their copies land in, and one plan replayed once
unmeasured and then --repeats times measured. chipsim.hwreplay.run (decode steps, prefill, batch) and
chipsim.hwreplay.run_served (a served run) use them alike."""

from __future__ import annotations

import time

from chipsim.hwreplay.plan import build_plan
from chipsim.runner import prepare


def _plan_job(args):
    config, overrides, spec = args
    prep = prepare(config, overrides, [spec])
    return build_plan(prep, prep.policies[0])


def fill_normal_bf16(buf, device, chunk_bytes: int = 256 << 20) -> None:
    """Write normal BF16 numbers over `buf`'s bytes (a contiguous uint8 tensor), generated on `device` a chunk at a
    time. The experts in host memory must hold weights like real ones: freshly pinned memory is zeros, and a GEMV
    over zero weights draws markedly less power than one over real weights (its time is the same)."""
    import torch

    flat = buf.view(-1)
    for off in range(0, flat.numel(), chunk_bytes):
        part = flat[off:off + chunk_bytes]
        words = torch.empty(-(-part.numel() // 2), dtype=torch.bfloat16, device=device).normal_()
        part.copy_(words.view(torch.uint8)[:part.numel()])


def expert_slots(n: int, expert_bytes: int, device):
    """`n` GPU slots of `expert_bytes` each (uint8 rows) starting as normal BF16 numbers (packed 4-bit weights read
    them as nibbles and scales). Rows of whole BF16 words: an even-sized expert's slots stay as aligned as the
    buffer (one word more per row would put every slot 2 bytes further off: slower, costlier GEMVs)."""
    import torch

    words = torch.empty((n, -(-expert_bytes // 2)), dtype=torch.bfloat16, device=device).normal_()
    return words.view(torch.uint8)[:, :expert_bytes]


def experts_in_host(shape: tuple[int, int, int], device, pinned: bool = True):
    """(MoE layers, experts, expert bytes) uint8 in pinned host memory (or pageable: host_frontend.expert_memory),
    normal BF16 numbers (fill_normal_bf16); on a CPU dry run one expert's zeros stand for every expert (a model
    larger than this machine's memory fits)."""
    import torch

    if device.type != "cuda":
        return torch.zeros(shape[2], dtype=torch.uint8).expand(shape)
    host = torch.empty(shape, dtype=torch.uint8, pin_memory=pinned)
    fill_normal_bf16(host, device)
    return host


def _host_and_slots(m, expert_bytes: int, plans, device, log) -> tuple:
    """Every expert in host memory (experts_in_host) and the GPU slots the plans' copies land in, timed in the log."""
    t1 = time.perf_counter()
    host = experts_in_host((m.num_moe_layers, m.num_experts, expert_bytes), device)
    slots = _slots_used(plans)
    gpu_slots = expert_slots(slots, expert_bytes, device)
    log(f"  {host.numel() / 2**30:.2f} GiB of experts in host memory, {slots} GPU slots, in {time.perf_counter() - t1:.1f} s")
    return host, gpu_slots


def _slots_used(plans) -> int:
    """GPU slots the plans' copies land in (the lowest free slot is always taken: the plan's slots are fewer)."""
    return 1 + max([a[6] for plan in plans for a in plan.actions if a[0] == "issue"] + [0])


def replay_repeated(plan, step, host, gpu_slots, first_dense: int, repeats: int, kw: dict) -> dict:
    """One plan replayed once unmeasured (the first launch of every graph, cuBLAS's first call of each shape), then
    `repeats` times with the board's energy read around each: the first's result, the others' steps and energy."""
    from chipsim.hwreplay.harness import replay

    replay(plan, step, host, gpu_slots, first_dense, **{**kw, "gpu": None})  # warm-up
    runs = [replay(plan, step, host, gpu_slots, first_dense, **kw) for _ in range(repeats)]
    res = runs[0]
    res["repeat_latency_ms"] = [r["latency_ms"] for r in runs[1:]]
    res["repeat_energy"] = [r["energy"] for r in runs[1:]]
    return res
