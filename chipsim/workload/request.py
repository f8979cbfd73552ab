"""A whole request as costed operations: the prompt read in prefill chunks, then decode steps over a KV cache that
grows (workload.prompt_tokens, workload.output_tokens, workload.prefill_chunk_tokens).

The prompt is the trace's first P tokens; prefill runs them in chunks of C (the last may be shorter), every layer
as matrix-matrix work (chipsim.workload.prefill), and its last chunk's LM head yields the first output token. Each
later output token is one decode step: step j (1 .. O - 1) reads trace token P + j - 1, attends over the P + j
tokens then in the cache (its own appended) and yields token j + 1. So a request of O output tokens runs
ceil(P / C) prefill chunks and O - 1 decode steps over the trace's first P + O - 1 tokens.

Only the token mixer of a decode step depends on the context; the rest of the step is the decode workload's
(chipsim.workload.decode), built with the final context P + O - 1 so that the memory plan holds the last step's
cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel, OpCost
from chipsim.hw.config import HardwareConfig
from chipsim.units import BYTES_PER_MIB
from chipsim.workload.decode import BF16_BYTES, MIXER_GROUP, DecodeWorkload, _mixer, dense_weights
from chipsim.workload.prefill import ExpertGemms, launch_grouped, prefill_group_builders


def is_request(hw: HardwareConfig) -> bool:
    """The config describes a whole request (a prompt and its output), not decode steps at a fixed context nor many
    requests served (workload.requests, chipsim.serve)."""
    return hw.workload.prompt_tokens > 0 and not hw.workload.requests


def final_context(hw: HardwareConfig) -> int:
    """The context the memory plan must hold: the last decode step's (P + O - 1 tokens), else context_length."""
    w = hw.workload
    return w.prompt_tokens + w.output_tokens - 1 if is_request(hw) else w.context_length


def trace_tokens_needed(hw: HardwareConfig) -> int:
    """Trace tokens a request reads: the prompt's, then one per decode step (the first output comes from prefill)."""
    w = hw.workload
    return w.prompt_tokens + w.output_tokens - 1


@dataclass(frozen=True)
class PrefillLayer:
    """One layer of a prefill chunk: its mixer (and router, in a MoE layer), dense FFN or shared experts, and the
    weighted sum of its experts' outputs."""

    mixer: OpCost
    router: OpCost | None
    dense: OpCost | None
    combine: OpCost | None


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens offset .. offset + tokens - 1, through every layer."""

    offset: int
    tokens: int
    layers: tuple[PrefillLayer, ...]
    head: OpCost  # the chunk's embedding lookups; the last chunk's also the LM head of its last token


@dataclass
class RequestWorkload:
    """A request's prefill chunks and decode-step mixers, costed on the arrays (the decode workload's ArrayModel
    settings: timing, measured operations, group launches)."""

    prompt_tokens: int
    output_tokens: int
    chunk_tokens: int
    chunks: tuple[PrefillChunk, ...]
    prefill_activation_bytes: int  # the largest chunk's activations in the operand memory
    expert: ExpertGemms  # expert(n): one routed expert as a GEMM over the chunk's n tokens routed to it
    _decode_mixer: Callable[[str, int], OpCost]
    _mixers: dict[tuple[str, int], OpCost] = field(default_factory=dict)

    @property
    def decode_steps(self) -> int:
        return self.output_tokens - 1

    def decode_mixer(self, kind: str, context: int) -> OpCost:
        """A decode step's token mixer of `kind` (chipsim.workload.shape FULL, SLIDING, MAMBA) over `context`
        cached tokens (its own included)."""
        key = (kind, context)
        op = self._mixers.get(key)
        if op is None:
            op = self._mixers[key] = self._decode_mixer(kind, context)
        return op

    def step_context(self, step: int) -> int:
        """The tokens decode step `step` (1 .. O - 1) attends over: the prompt, the outputs before it, itself."""
        return self.prompt_tokens + step


def chunk_spans(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, tokens) of each prefill chunk of a `prompt`-token prompt in chunks of `chunk` (0: one chunk)."""
    size = chunk or prompt
    return [(offset, min(size, prompt - offset)) for offset in range(0, prompt, size)]


def build_request(hw: HardwareConfig, decode: DecodeWorkload) -> RequestWorkload:
    """The request of hw.workload costed on hw's arrays; refused in one line when a chunk's activations do not fit
    beside the decode workload's memory plan (which holds the final context's cache)."""
    w, m = hw.workload, decode.model
    spans = chunk_spans(w.prompt_tokens, w.prefill_chunk_tokens)
    activations = max(chunk_activation_bytes(m, tokens) for _, tokens in spans)
    if activations > decode.hbm_spare_bytes:
        raise InputError(
            f"workload.prefill_chunk_tokens: a chunk of {max(t for _, t in spans)} tokens needs "
            f"{activations / BYTES_PER_MIB:.1f} MiB of activations, more than the "
            f"{decode.hbm_spare_bytes / BYTES_PER_MIB:.1f} MiB the operand memory has left; use smaller chunks")
    am = ArrayModel(hw)
    grouped = launch_grouped(am)
    chunks = [build_chunk(am, grouped, m, hw, offset, tokens, offset + tokens == w.prompt_tokens)
              for offset, tokens in spans]
    experts = ExpertGemms(hw, decode, am)
    am.save_table()

    dense = dense_weights(hw)

    # built during the run, one per decode context (as the experts per token count): not written back from inside it
    def decode_mixer(kind: str, context: int) -> OpCost:
        op = grouped(MIXER_GROUP[kind], _mixer(am, m, dense, kind, context))
        assert op is not None
        return op

    return RequestWorkload(w.prompt_tokens, w.output_tokens, w.prefill_chunk_tokens or w.prompt_tokens,
                           tuple(chunks), activations, experts, decode_mixer)


def build_chunk(am: ArrayModel, grouped: Callable, m, hw: HardwareConfig, offset: int, tokens: int, last: bool
                ) -> PrefillChunk:
    """The prefill chunk of `tokens` prompt tokens at `offset`, every layer's groups launched as `grouped` says;
    `last`: the prompt's last chunk, whose head runs the LM head of its last token."""
    b = prefill_group_builders(am, m, hw, offset, tokens)
    built = {name: grouped(name, fn()) for name, fn in b.items() if fn is not None and name not in ("expert", "head")}
    layers = []
    for layer in range(m.num_layers):
        mixer = built[MIXER_GROUP[m.mixer(layer)]]
        if layer < m.first_dense_layers:
            layers.append(PrefillLayer(mixer, None, built["dense"], None))
        else:
            layers.append(PrefillLayer(mixer, built["router"], built.get("shared"), built["combine"]))
    return PrefillChunk(offset, tokens, tuple(layers), grouped("head", b["head"](last)))


def chunk_activation_bytes(m, tokens: int) -> int:
    """A chunk's working activations: per token the residual stream and the normed input (2 x hidden), the
    attention projections (queries, keys, values) and the widest FFN intermediate (gate and up), BF16. Attention
    scores are not materialised (computed in tiles, as flash attention does)."""
    d = m.hidden_size
    qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    ffn = 2 * max(m.expert_ffn * m.top_k, m.dense_ffn, m.shared_expert_ffn * m.num_shared_experts)
    return tokens * (2 * d + qkv + ffn) * BF16_BYTES

