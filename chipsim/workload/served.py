"""The costs of a served run's steps (workload.requests, chipsim.serve): a step runs parts of several requests at
once, each a `Part`: a prompt chunk (`tokens` prompt tokens from `position` on) or one decode token (at `position`,
attending over position + 1 tokens). The scheduler decides each step's parts (chipsim.serve.scheduler).

A step of one part is costed as a lone request costs it (chipsim.workload.request): one prompt chunk as that prefill
chunk, one decode token as that decode step, so that a request served alone takes exactly what it takes as a
request. A step of several parts is costed as a batch step is (chipsim.workload.batch), over its N tokens: per layer
the input norms, the mixer's projections as GEMMs of N rows (weights streamed once), each part's own attention core
(a decode token's over its cache as at decode; a chunk's causal scores over its cache and itself as at prefill; MLA
absorbed for decode tokens, not for chunks; a Mamba2 layer with a state per part), the output projection of N rows;
the router, dense FFN or shared experts and the weighted sums over N tokens; each routed expert a GEMM over the step's
tokens routed to it; the embedding lookups of the N tokens and the LM head of each part that yields a token (every
decode token, a prompt's last chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from chipsim.hw.compute_formula import ArrayModel, OpCost
from chipsim.hw.config import HardwareConfig
from chipsim.workload.batch import (BatchLayer, gqa_decode_core, gqa_output, mla_decode_core, step_layers)
from chipsim.workload.decode import (BF16_BYTES, MIXER_GROUP, DecodeWorkload, DenseWeights, _mamba2, _mixer,
                                     dense_weights, embedding_op, weight_op)
from chipsim.workload.prefill import (ExpertGemms, _norm, gqa_chunk_core, gqa_projections, launch_grouped,
                                      mla_chunk_core, mla_projections, prefill_group_builders)
from chipsim.workload.request import PrefillChunk, build_chunk
from chipsim.workload.shape import FULL, MAMBA, SLIDING, ModelShape


class Part(NamedTuple):
    """One request's share of a step: `tokens` tokens from its `position` on (a prompt chunk, or one decode token:
    `decode`), read from trace token `first`; `emits`: the step yields this request's next output token."""

    request: int
    first: int
    position: int
    tokens: int
    decode: bool
    emits: bool


@dataclass(frozen=True)
class MixedStep:
    """A step of several parts: its layers (as a batch step's) and its head."""

    layers: tuple[BatchLayer, ...]
    head: OpCost


class ServedCosts:
    """Every step shape a served run meets, costed on the decode workload's arrays as the run asks for it (each
    part's attention core, each token count's GEMMs and each lone chunk or decode step made once)."""

    def __init__(self, hw: HardwareConfig, decode: DecodeWorkload):
        self.hw, self.model = hw, decode.model
        self.dense = dense_weights(hw)
        self.am = ArrayModel(hw)
        self.grouped = launch_grouped(self.am)
        self.expert = ExpertGemms(hw, decode, self.am)  # expert(n): a routed expert over n tokens
        self.am.save_table()
        self._chunks: dict[tuple[int, int, bool], PrefillChunk] = {}
        self._mixers: dict[tuple[str, int], OpCost] = {}
        self._cores: dict[tuple, list[OpCost]] = {}
        self._groups: dict[int, dict] = {}

    # ------------------------------------------------------------------------------------ a step of one part
    def chunk(self, position: int, tokens: int, last: bool) -> PrefillChunk:
        """A lone prompt chunk, as a request's prefill chunk (its LM head when it is the prompt's last)."""
        key = (position, tokens, last)
        chunk = self._chunks.get(key)
        if chunk is None:
            chunk = self._chunks[key] = build_chunk(self.am, self.grouped, self.model, self.hw, position, tokens, last)
        return chunk

    def decode_mixer(self, kind: str, context: int) -> OpCost:
        """A lone decode token's mixer of `kind` over `context` cached tokens, as a request's decode step's."""
        key = (kind, context)
        op = self._mixers.get(key)
        if op is None:
            op = self.grouped(MIXER_GROUP[kind], _mixer(self.am, self.model, self.dense, kind, context))
            assert op is not None
            self._mixers[key] = op
        return op

    # ------------------------------------------------------------------------------------ a step of several
    def mixed(self, parts: list[Part]) -> MixedStep:
        """A step of several parts (each layer's groups launched as a batch step's are)."""
        m, n = self.model, sum(p.tokens for p in parts)
        groups = self._n_groups(n)
        kinds = {m.mixer(layer) for layer in range(m.num_layers)}
        built = dict(groups)
        for kind in (FULL, SLIDING, MAMBA):
            built[MIXER_GROUP[kind]] = self.grouped(MIXER_GROUP[kind], self._mixer(kind, parts, n)) \
                if kind in kinds else None
        emitting = sum(1 for p in parts if p.emits)
        head = self.grouped("head", served_head(self.am, m, self.dense, n, emitting))
        assert head is not None
        return MixedStep(step_layers(m, built), head)

    def _n_groups(self, n: int) -> dict:
        """The router, dense FFN, shared experts and weighted sums over n tokens (launches included)."""
        groups = self._groups.get(n)
        if groups is None:
            b = prefill_group_builders(self.am, self.model, self.hw, 0, n)
            groups = self._groups[n] = {name: self.grouped(name, b[name]()) if b[name] is not None else None
                                        for name in ("router", "dense", "shared", "combine")}
        return groups

    def _mixer(self, kind: str, parts: list[Part], n: int) -> OpCost:
        return mixed_mixer(self.am, self.model, self.dense, kind, parts, n, self._core)

    def _core(self, attention: str, p: Part, window: int) -> list[OpCost]:
        """A part's own attention core (part_core), made once per shape."""
        if p.decode:
            context = p.position + 1
            key: tuple = (attention, "decode", min(context, window) if window else context)
        else:
            key = (attention, "chunk", p.position, p.tokens, window)
        ops = self._cores.get(key)
        if ops is None:
            ops = self._cores[key] = part_core(self.am, self.model, self.dense, attention, p, window)
        return ops


Core = Callable[[str, Part, int], list[OpCost]]


def mixed_mixer(am: ArrayModel, m: ModelShape, dense: DenseWeights, kind: str, parts: list[Part], n: int, core: Core
                ) -> OpCost:
    """A mixed step's token mixer of `kind` over its n tokens, with its input norm and residual; `core(attention,
    part, window)` gives each part's own attention core (part_core: ServedCosts makes each shape once, the
    hardware replay marks a chunk's as its attention kernel)."""
    if kind == MAMBA:
        ops = _mamba2(am, m, dense, tokens=n, states=len(parts))
    elif m.attention == "mla":
        ops = _mla_mixed(am, m, dense, parts, n, core)
    else:
        window = m.sliding_window if kind == SLIDING else 0
        ops = gqa_projections(am, m, dense, n)
        for p in parts:
            ops += core("gqa", p, window)
        ops += gqa_output(am, m, dense, n)
    total = _norm(am, "attn_norm", n, m.hidden_size)
    for op in ops:
        total = total + op
    return total + am.vector("attn_residual", n * m.hidden_size)


def _mla_mixed(am: ArrayModel, m: ModelShape, dense: DenseWeights, parts: list[Part], n: int, core: Core
               ) -> list[OpCost]:
    """MLA for a mixed step: the projections over all n tokens; the decode tokens absorbed (their queries into
    the latent space, scores and mix against their caches, lifted to values), each chunk not absorbed."""
    h, nope, lora, v = m.num_heads, m.qk_nope_head_dim, m.kv_lora_rank, m.v_head_dim
    ops = mla_projections(am, m, dense, n)
    decoding = sum(1 for p in parts if p.decode)
    if decoding:
        ops.append(weight_op(am, dense, "q_absorb_uk", decoding, nope, h * lora))
    for p in parts:
        ops += core("mla", p, 0)
    if decoding:
        ops.append(weight_op(am, dense, "v_up_uv", decoding, lora, h * v))
    ops.append(weight_op(am, dense, "o_proj", n, h * v, m.hidden_size))
    return ops


def part_core(am: ArrayModel, m: ModelShape, dense: DenseWeights, attention: str, p: Part, window: int
              ) -> list[OpCost]:
    """A part's own attention core ("gqa" or "mla"): a decode token's over its cache (at most the window), a
    chunk's causal one over its cache and itself."""
    if p.decode:
        context = p.position + 1
        kv = min(context, window) if window else context
        return gqa_decode_core(am, m, kv) if attention == "gqa" else mla_decode_core(am, m, kv)
    if attention == "gqa":
        return gqa_chunk_core(am, m, p.position, p.tokens, window)
    return mla_chunk_core(am, m, dense, p.position, p.tokens)


def served_head(am: ArrayModel, m: ModelShape, dense: DenseWeights, tokens: int, emitting: int) -> OpCost:
    """The embedding lookups of a step's tokens and the LM head of the `emitting` parts (each samples a token)."""
    d = m.hidden_size
    op = embedding_op(am, dense, tokens, d)
    if not emitting:
        return op
    op = op + _norm(am, "final_norm", emitting, d)
    op = op + weight_op(am, dense, "lm_head", emitting, d, m.vocab_size)
    if m.lm_head_bias:
        op = op + am.vector("lm_head_bias", emitting * m.vocab_size, read_bytes=m.vocab_size * BF16_BYTES)
    return op + am.vector("argmax", emitting * m.vocab_size)
