"""What a served run needs before it starts (chipsim.runner.prepare calls here): the requests and their arrivals,
the trace cut into windows, the KV cache they are admitted against, every check of the config against them (one
line, exit 2, before any work), and a fresh Server for each policy's run."""

from __future__ import annotations

import numpy as np

from chipsim.errors import InputError
from chipsim.hw.config import HardwareConfig
from chipsim.serve.arrivals import RequestSizes, request_sizes
from chipsim.serve.server import ServePlan, Server
from chipsim.trace.format import Trace
from chipsim.units import BYTES_PER_MIB
from chipsim.workload.decode import BF16_BYTES, DecodeWorkload
from chipsim.workload.request import chunk_activation_bytes
from chipsim.workload.served import ServedCosts


def is_served(hw: HardwareConfig) -> bool:
    return hw.workload.requests > 0


def longest_request(hw: HardwareConfig) -> tuple[RequestSizes, int]:
    """The requests and the trace tokens the longest reads (P + O - 1): the context the memory plan is built at."""
    sizes = request_sizes(hw.workload)
    return sizes, int((sizes.prompt + sizes.output - 1).max())


def serve_plan(hw: HardwareConfig, decode: DecodeWorkload, trace: Trace, sizes: RequestSizes) -> ServePlan:
    """The plan of a served run, refused in one line where the trace or the KV cache cannot hold what the scheduler
    admits."""
    w, s, m = hw.workload, hw.workload.scheduler, decode.model
    tokens = sizes.prompt + sizes.output - 1
    n = int(tokens.max())
    windows = trace.num_tokens // n
    if windows < s.max_sequences:
        raise InputError(
            f"workload.scheduler.max_sequences: {s.max_sequences} requests at once need {s.max_sequences} windows of "
            f"the trace of {n} tokens each (the longest request's prompt + output - 1); {trace.path} has "
            f"{trace.num_tokens} tokens, {windows} window{'s' if windows != 1 else ''}")
    kv = np.array([m.cache_bytes(int(c), BF16_BYTES) for c in tokens], dtype=np.int64)
    capacity = _kv_capacity(hw, decode, s.max_sequences)
    least, most = int(kv.min()), int(kv.max())
    room = f"{capacity / BYTES_PER_MIB:.1f} MiB is there for it (workload.scheduler.kv_capacity_mib, or the operand " \
           "memory's room)"
    if most > capacity:
        r = int(kv.argmax())
        where = f"workload.arrivals.file request {r} (line {r + 2})" if w.arrivals.file else "workload.prompt_tokens"
        raise InputError(f"{where}: a request of {int(tokens[r])} tokens needs {most / BYTES_PER_MIB:.1f} MiB of KV "
                         f"cache; {room}")
    if s.max_sequences * least > capacity:
        raise InputError(
            f"workload.scheduler.max_sequences: {s.max_sequences} sequences of at least {int(tokens.min())} tokens "
            f"need {s.max_sequences * least / BYTES_PER_MIB:.1f} MiB of KV cache; {room}")
    return ServePlan(sizes, n, windows, capacity, kv, s.max_sequences, s.kind, s.max_step_tokens,
                     w.prefill_chunk_tokens)


def _kv_capacity(hw: HardwareConfig, decode: DecodeWorkload, sequences: int) -> int:
    """The KV cache's room: workload.scheduler.kv_capacity_mib, or what the operand memory has beside the weights,
    the expert buffer, each sequence's activations and the widest step's (its plan holds one sequence's cache)."""
    s = hw.workload.scheduler
    room = (decode.hbm_spare_bytes + decode.hbm_kv_bytes + decode.hbm_activation_bytes
            - sequences * decode.hbm_activation_bytes - chunk_activation_bytes(decode.model, s.max_step_tokens))
    if room <= 0:
        raise InputError(f"workload.scheduler.max_step_tokens: steps of {s.max_step_tokens} tokens and "
                         f"{sequences} sequences' activations leave the operand memory no room for KV caches")
    if not s.kv_capacity_mib:
        return room
    given = int(s.kv_capacity_mib * BYTES_PER_MIB)
    if given > room:
        raise InputError(f"workload.scheduler.kv_capacity_mib: {s.kv_capacity_mib:g} MiB is more than the "
                         f"{room / BYTES_PER_MIB:.1f} MiB the operand memory has for KV caches")
    return given


def widest_step_union(hw: HardwareConfig, decode: DecodeWorkload) -> int:
    """The most experts one MoE layer of a served step can route to: its tokens (at most max_step_tokens) times
    top-k, at most every expert."""
    m = decode.model
    return min(m.num_experts, hw.workload.scheduler.max_step_tokens * m.top_k)


def new_server(hw: HardwareConfig, plan: ServePlan, costs: ServedCosts, trace: Trace, moe_layers: int) -> Server:
    return Server(plan, hw.workload, costs, trace.num_tokens, moe_layers)


def served_costs(hw: HardwareConfig, decode: DecodeWorkload) -> ServedCosts:
    return ServedCosts(hw, decode)
