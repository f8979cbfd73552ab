"""Which keys `compute.op_times_ns` and `compute.op_energy_pj` may hold: the shape of an operation that a model
chipsim knows produces.

A measured table (hwconfigs/h200-pcie5.yaml) lists the kernel shapes of several models, at several contexts
and expert precisions, and every config derived from it inherits the whole table; a key that names no such
shape (a typo, a d_model or expert width no model has, a kind chipsim does not cost) would be silently never
used. The rule:

    a key is `matvec rR oO bB`, `sfu nN` or `vector nN bB` (op_key's form, whole numbers), and some operation
    of the decode step of a model in chipsim.workload.models (`chipsim models`), or of the config's own model,
    has exactly that shape at some
    context length (1 .. workload.context_length's maximum) and some expert precision (model.expert_bits'
    choices) and non-expert precision (model.dense_bits' choices), with the config's quantisation group, scale
    bits and dequantisation operations.

Every dimension of a decode step is an affine function of the context length (the KV cache's length: the
scores' outputs, the value mix's reduction, the softmax's elements), so each operation is recorded at
contexts 1 and 2 and a key matches it if one context c >= 1 gives all its fields.

A request's prefill chunks (chipsim.workload.prefill) add their shapes, accepted by the same rule over a chunk's
tokens (`prefill_shape`): a GEMM `matmul mM rR oO bB` of some model's prefill at any M >= 2 tokens; an operation
affine in the chunk's tokens (norms, RoPE, biases, the router's and each expert's elementwise work over the tokens
routed to it) at some token count; and a grouped-query attention's scores, value mix and softmax at some chunk
offset and length (full, or over a sliding window; the pairs each chunk query attends, solved for exactly).

A batch's decode step (chipsim.workload.batch) adds its own (`batch_shape`): a GEMM of some model's batch step at any
M >= 2 sequences (its projections, router, LM head over every sequence), and an operation affine in the sequences
(norms, the LM head's argmax over each); each sequence's attention is the decode step's, at its own context.
"""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace

from chipsim.errors import InputError
from chipsim.hw.compute_formula import OpCost, op_key, parse_op_key
from chipsim.hw.config import HardwareConfig, ModelConfig, WorkloadConfig, field_bounds
from chipsim.workload.decode import op_group_builders
from chipsim.workload.models import model_of
from chipsim.workload.shape import SLIDING

_FORMS = {"matvec": re.compile(r"matvec r(\d+) o(\d+) b(\d+)"), "sfu": re.compile(r"sfu n(\d+)"),
          "vector": re.compile(r"vector n(\d+) b(\d+)"), "matmul": re.compile(r"matmul m(\d+) r(\d+) o(\d+) b(\d+)")}
_SHOWN = {"matvec": "matvec rR oO bB", "sfu": "sfu nN", "vector": "vector nN bB", "matmul": "matmul mM rR oO bB"}
# a prefill chunk's operations over the pairs its queries attend (not affine in its tokens): prefill_shape solves them
_ATTENTION = ("scores", "value_mix", "softmax_exp", "softmax_norm")
TABLES = ("op_times_ns", "op_energy_pj")


class _KeyRecorder:
    """Stands in for ArrayModel while the decode step's op groups are built: it records each operation's key
    (op_key, as ArrayModel names it) and costs nothing."""

    def _record(self, key: str) -> OpCost:
        self.keys.append(key)
        return OpCost(key, 0, 0, 0, 0, 0, 0, 0)

    def __init__(self):
        self.keys: list[str] = []
        self.names: list[str] = []  # each key's operation name

    def matvec(self, name, reduction, outputs, weight_bytes, write_bytes=0, groups=1) -> OpCost:
        self.names.append(name)
        return self._record(op_key("matvec", reduction=reduction, outputs=outputs, read_bytes=weight_bytes))

    def matmul(self, name, tokens, reduction, outputs, weight_bytes, write_bytes=0, groups=1) -> OpCost:
        if tokens == 1:  # as ArrayModel.matmul: one token is the GEMV
            return self.matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)
        self.names.append(name)
        return self._record(op_key("matmul", reduction=reduction, outputs=outputs, read_bytes=weight_bytes,
                                   tokens=tokens))

    def sfu(self, name, ops) -> OpCost:
        self.names.append(name)
        return self._record(op_key("sfu", elements=ops))

    def vector(self, name, lane_ops, read_bytes=0) -> OpCost:
        self.names.append(name)
        return self._record(op_key("vector", read_bytes=read_bytes, elements=lane_ops))


def _precisions() -> list[tuple[int, int]]:
    """(model.expert_bits, model.dense_bits) pairs that between them take every choice of each: an operation's key
    depends on one of the two (a routed expert's on the first, every other weight's on the second), so the union of
    the keys over these pairs is the union over all combinations (5 builds of each model, not 20)."""
    experts = field_bounds(ModelConfig, "expert_bits").choices
    dense = field_bounds(ModelConfig, "dense_bits").choices
    return [(experts[i % len(experts)], dense[i % len(dense)]) for i in range(max(len(experts), len(dense)))]


def _step_keys(quant: tuple, model, context: int, bits: int, dense_bits: int) -> list[str]:
    """Every operation key of one decode step of `model`, in build order; quant = (model.quant_group_size,
    model.quant_scale_bits, compute.dequant_ops_per_weight): what op_group_builders reads of a config."""
    group, scale_bits, dequant_ops = quant
    hw = SimpleNamespace(workload=SimpleNamespace(context_length=context),
                         model=SimpleNamespace(expert_bits=bits, dense_bits=dense_bits, quant_group_size=group,
                                               quant_scale_bits=scale_bits),
                         compute=SimpleNamespace(dequant_ops_per_weight=dequant_ops))
    recorder = _KeyRecorder()
    for build in op_group_builders(recorder, model, hw).values():
        if build is not None:
            build()
    return recorder.keys


@functools.lru_cache(maxsize=16)
def _templates(quant: tuple, models: tuple) -> dict[str, set]:
    """kind -> {(field names, values at context 1, change per context)} over `models` (ModelShapes) and every
    expert precision."""
    out: dict[str, set] = {kind: set() for kind in _FORMS}
    for model in models:
        for bits, dense_bits in _precisions():
            at1, at2 = _step_keys(quant, model, 1, bits, dense_bits), _step_keys(quant, model, 2, bits, dense_bits)
            for k1, k2 in zip(at1, at2, strict=True):
                kind, f1 = parse_op_key(k1)
                _, f2 = parse_op_key(k2)
                names = tuple(f1)
                out[kind].add((names, tuple(f1[n] for n in names), tuple(f2[n] - f1[n] for n in names)))
    return out


def _matches(values: tuple, at1: tuple, step: tuple, max_context: int) -> bool:
    """Whether one context c in 1..max_context gives `values` = at1 + (c - 1) x step."""
    context = None
    for v, a, s in zip(values, at1, step):
        if s == 0:
            if v != a:
                return False
            continue
        extra, rest = divmod(v - a, s)
        if rest or extra < 0 or (context is not None and extra != context):
            return False
        context = extra
    return context is None or context + 1 <= max_context


def _chunk_keys(quant: tuple, model, bits: int, dense_bits: int, tokens: int) -> list[tuple[str, str]]:
    """(operation name, key) of every operation of one prefill chunk of `tokens` tokens from position 0 (its head
    with the LM head) and of one routed expert over `tokens` tokens, in build order; Mamba layers are left out."""
    from chipsim.workload.prefill import prefill_group_builders

    group, scale_bits, dequant_ops = quant
    hw = SimpleNamespace(model=SimpleNamespace(expert_bits=bits, dense_bits=dense_bits, quant_group_size=group,
                                               quant_scale_bits=scale_bits),
                         compute=SimpleNamespace(dequant_ops_per_weight=dequant_ops))
    recorder = _KeyRecorder()
    for name, build in prefill_group_builders(recorder, model, hw, 0, tokens).items():
        if build is not None and name != "mamba":
            build(tokens) if name == "expert" else build()
    return list(zip(recorder.names, recorder.keys))


@functools.lru_cache(maxsize=16)
def _prefill_templates(quant: tuple, models: tuple) -> tuple[set, dict]:
    """({(r, o, b) of every prefill GEMM}, kind -> {(field names, values at 1 token, change per token)}) over
    `models` and every expert precision; the attention's pair-counted operations are left to _attention_matches."""
    gemms: set = set()
    affine: dict[str, set] = {kind: set() for kind in _FORMS}
    for model in models:
        for bits, dense_bits in _precisions():
            at1, at2 = _chunk_keys(quant, model, bits, dense_bits, 1), _chunk_keys(quant, model, bits, dense_bits, 2)
            for (name, k1), (_, k2) in zip(at1, at2, strict=True):
                kind2, f2 = parse_op_key(k2)
                if kind2 == "matmul":
                    gemms.add((f2["reduction"], f2["outputs"], f2["read_bytes"]))
                kind, f1 = parse_op_key(k1)
                if name in _ATTENTION or kind != kind2:  # (one token's GEMM is the decode step's matvec)
                    continue
                names = tuple(f1)
                affine[kind].add((names, tuple(f1[n] for n in names), tuple(f2[n] - f1[n] for n in names)))
    return gemms, affine


def _pairs(offset: int, tokens: int, window: int) -> int:
    """Query-key pairs of a chunk of `tokens` queries from `offset`, each over every earlier key and its own (window
    0) or the last `window` of them: chipsim.workload.prefill.attended_pairs's total, in closed form."""
    if not window:
        return tokens * offset + tokens * (tokens + 1) // 2
    below = max(0, min(tokens, window - offset - 1))  # queries that see fewer than `window` keys
    return below * (offset + 1) + below * (below - 1) // 2 + (tokens - below) * window


def _chunk_for(target: int, offset: int, window: int, sink: int, max_tokens: int) -> bool:
    """Whether some chunk length from `offset` has pairs + sink x tokens == target (both grow with the tokens)."""
    lo, hi = 1, max_tokens
    while lo <= hi:
        mid = (lo + hi) // 2
        got = _pairs(offset, mid, window) + sink * mid
        if got == target:
            return True
        lo, hi = (mid + 1, hi) if got < target else (lo, mid - 1)
    return False


def _logits_match(logits: int, window: int, sink: int, max_tokens: int) -> bool:
    """Whether some chunk (offset, tokens) of an attention layer has `logits` softmax logits (pairs + sinks)."""
    if window:  # from offset window - 1 on every query sees `window` keys; below it, the offset is one of few
        if logits % (window + sink) == 0 and logits // (window + sink) <= max_tokens:
            return True
        return any(_chunk_for(logits, offset, window, sink, max_tokens) for offset in range(window - 1))
    tokens = 1
    while tokens <= max_tokens and tokens * (tokens + 1) // 2 + sink * tokens <= logits:  # offset = what is left / tokens
        if (logits - tokens * (tokens + 1) // 2 - sink * tokens) % tokens == 0:
            return True
        tokens += 1
    return False


def _attention_matches(model, kind: str, f: dict, max_tokens: int) -> bool:
    """Whether a grouped-query attention layer of `model` (full, or over its sliding window) has a chunk offset and
    length whose scores and value mix (matvec: head_dim reductions, heads x pairs outputs, the cached keys read) or
    softmax (SFU: one exp per logit; vector: three lane operations per logit; logits: the pairs and one sink per
    query with sinks) is the key."""
    if model.attention != "gqa":
        return False
    nq, nkv, hd, sink = model.num_heads, model.num_kv_heads, model.head_dim, int(model.attention_sinks)
    windows = {model.sliding_window if model.mixer(layer) == SLIDING else 0 for layer in range(model.num_layers)}
    for window in windows:
        if kind == "matvec":
            kv = nkv * hd * 2  # a cached key's bytes
            if f["reduction"] != hd or f["outputs"] % nq or f["read_bytes"] % kv:
                continue
            cached, pairs = f["read_bytes"] // kv, f["outputs"] // nq
            if window and cached == window - 1:  # any offset from window - 1 on: every query sees `window` keys
                if pairs % window == 0 and pairs // window <= max_tokens:
                    return True
            elif (not window or cached < window - 1) and _chunk_for(pairs, cached, window, 0, max_tokens):
                return True
        elif kind in ("sfu", "vector"):
            per = nq * (3 if kind == "vector" else 1)
            if f.get("read_bytes", 0) == 0 and f["elements"] % per == 0 and \
                    _logits_match(f["elements"] // per, window, sink, max_tokens):
                return True
    return False


def prefill_shape(quant: tuple, key: str, models: tuple) -> bool:
    """Whether `key` is an operation of some prefill chunk of a model of `models` (the module's rule); quant =
    (model.quant_group_size, model.quant_scale_bits, compute.dequant_ops_per_weight)."""
    kind, f = parse_op_key(key)
    max_tokens = field_bounds(WorkloadConfig, "prompt_tokens").maximum
    gemms, affine = _prefill_templates(quant, models)
    if kind == "matmul":
        return 2 <= f["tokens"] <= max_tokens and (f["reduction"], f["outputs"], f["read_bytes"]) in gemms
    names = tuple(f)
    values = tuple(f[n] for n in names)
    if any(t == names and _matches(values, at1, step, max_tokens) for t, at1, step in affine[kind]):
        return True
    return any(_attention_matches(model, kind, f, max_tokens) for model in models)


# a batch step's operations per sequence at its own context: the decode step's (_templates) accept them
_PER_SEQUENCE = (*_ATTENTION, "latent_mix")


def _batch_keys(quant: tuple, model, bits: int, dense_bits: int, sequences: int) -> list[tuple[str, str]]:
    """(operation name, key) of every operation of one batch step of `sequences` (each at context 1) but their own
    attention cores, and of one routed expert over `sequences` tokens, in build order."""
    from chipsim.workload.batch import batch_group_builders

    group, scale_bits, dequant_ops = quant
    hw = SimpleNamespace(model=SimpleNamespace(expert_bits=bits, dense_bits=dense_bits, quant_group_size=group,
                                               quant_scale_bits=scale_bits),
                         compute=SimpleNamespace(dequant_ops_per_weight=dequant_ops))
    recorder = _KeyRecorder()
    for name, build in batch_group_builders(recorder, model, hw, [1] * sequences).items():
        if build is not None:
            build(sequences) if name == "expert" else build()
    return [(n, k) for n, k in zip(recorder.names, recorder.keys) if n not in _PER_SEQUENCE]


@functools.lru_cache(maxsize=16)
def _batch_templates(quant: tuple, models: tuple) -> tuple[set, dict]:
    """({(r, o, b) of every batch-step GEMM}, kind -> {(field names, values at 2 sequences, change per sequence)})
    over `models` and every expert precision."""
    gemms: set = set()
    affine: dict[str, set] = {kind: set() for kind in _FORMS}
    for model in models:
        for bits, dense_bits in _precisions():
            at2, at3 = _batch_keys(quant, model, bits, dense_bits, 2), _batch_keys(quant, model, bits, dense_bits, 3)
            for (_, k2), (_, k3) in zip(at2, at3, strict=True):
                kind, f2 = parse_op_key(k2)
                _, f3 = parse_op_key(k3)
                if kind == "matmul":
                    gemms.add((f2["reduction"], f2["outputs"], f2["read_bytes"]))
                names = tuple(f2)
                affine[kind].add((names, tuple(f2[n] for n in names), tuple(f3[n] - f2[n] for n in names)))
    return gemms, affine


def batch_shape(quant: tuple, key: str, models: tuple) -> bool:
    """Whether `key` is an operation of some batch step of a model of `models` (the module's rule)."""
    kind, f = parse_op_key(key)
    most = field_bounds(WorkloadConfig, "batch").maximum
    gemms, affine = _batch_templates(quant, models)
    if kind == "matmul":
        return 2 <= f["tokens"] <= most and (f["reduction"], f["outputs"], f["read_bytes"]) in gemms
    names = tuple(f)
    values = tuple(f[n] for n in names)  # (_matches counts from 1: here from 2 sequences)
    return any(t == names and _matches(values, at2, step, most - 1) for t, at2, step in affine[kind])


def known_models(hw: HardwareConfig) -> tuple:
    """Every bundled shape and the config's own (a config.json's model is as much a model chipsim knows)."""
    from chipsim.workload.models import MODELS  # every bundled shape: read here, on the runs that need them

    models = tuple(MODELS.values())
    own = model_of(hw.model)
    return models if own in models else models + (own,)


def _is_operation(quant: tuple, models: tuple, key: str) -> bool:
    """Whether a well-formed `key` is a decode step's operation at some context or a prefill chunk's (the module's
    rule)."""
    kind, fields = parse_op_key(key)
    names = tuple(fields)
    values = tuple(fields[n] for n in names)
    max_context = field_bounds(WorkloadConfig, "context_length").maximum
    for t_names, at1, step in _templates(quant, models)[kind]:
        if t_names == names and _matches(values, at1, step, max_context):
            return True
    return prefill_shape(quant, key, models) or batch_shape(quant, key, models)


@functools.lru_cache(maxsize=16)
def _verdicts(quant: tuple, models: tuple) -> dict[str, bool]:
    """_is_operation's answers so far for (quant, models): a measured table of thousands of keys is checked on every
    config load."""
    return {}


def form_problem(key: str) -> str | None:
    """None where `key` is written as op_key writes one (a known kind, its fields whole numbers), else what is
    wrong: the first check of every table key, before whether any model has the shape."""
    kind = key.split(" ", 1)[0]
    form = _FORMS.get(kind)
    if form is None:
        return f"unknown operation kind '{kind}' (kinds: {', '.join(_FORMS)})"
    if not form.fullmatch(key):
        return f"not of the form '{_SHOWN[kind]}' (op_key's, with whole numbers)"
    return None


def _problem(hw: HardwareConfig, key: str, models: tuple, verdicts: dict) -> str | None:
    problem = form_problem(key)
    if problem:
        return problem
    quant = (hw.model.quant_group_size, hw.model.quant_scale_bits, hw.compute.dequant_ops_per_weight)
    ok = verdicts.get(key)
    if ok is None:
        ok = verdicts[key] = _is_operation(quant, models, key)
    if ok:
        return None
    return (f"no operation of any model chipsim knows (chipsim models) has this shape at any context length, "
            f"prefill chunk, expert or non-expert precision (model.quant_group_size {hw.model.quant_group_size}, "
            f"model.quant_scale_bits {hw.model.quant_scale_bits}, compute.dequant_ops_per_weight "
            f"{hw.compute.dequant_ops_per_weight})")


def _quant(hw: HardwareConfig) -> tuple:
    return hw.model.quant_group_size, hw.model.quant_scale_bits, hw.compute.dequant_ops_per_weight


def known_shape(hw: HardwareConfig, key: str, models: tuple | None = None) -> str | None:
    """None if `key` names an operation some model of `models` (default: known_models) produces (the module's
    rule), else what is wrong."""
    models = known_models(hw) if models is None else models
    return _problem(hw, key, models, _verdicts(_quant(hw), models))


def check_op_keys(hw: HardwareConfig) -> None:
    """Every key of compute.op_times_ns and compute.op_energy_pj names an operation of a model (the rule above);
    an InputError naming the first that does not."""
    if not any(getattr(hw.compute, table) for table in TABLES):
        return
    models = known_models(hw)
    verdicts = _verdicts(_quant(hw), models)
    for table in TABLES:
        for key in getattr(hw.compute, table):
            problem = _problem(hw, key, models, verdicts)
            if problem:
                raise InputError(f"compute.{table}.'{key}': {problem}")
