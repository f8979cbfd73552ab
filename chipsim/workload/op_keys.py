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
    choices), with the config's quantisation group, scale bits and dequantisation operations.

Every dimension of a decode step is an affine function of the context length (the KV cache's length: the
scores' outputs, the value mix's reduction, the softmax's elements), so each operation is recorded at
contexts 1 and 2 and a key matches it if one context c >= 1 gives all its fields.
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

_FORMS = {"matvec": re.compile(r"matvec r(\d+) o(\d+) b(\d+)"), "sfu": re.compile(r"sfu n(\d+)"),
          "vector": re.compile(r"vector n(\d+) b(\d+)")}
_SHOWN = {"matvec": "matvec rR oO bB", "sfu": "sfu nN", "vector": "vector nN bB"}
TABLES = ("op_times_ns", "op_energy_pj")


class _KeyRecorder:
    """Stands in for ArrayModel while the decode step's op groups are built: it records each operation's key
    (op_key, as ArrayModel names it) and costs nothing."""

    def __init__(self):
        self.keys: list[str] = []

    def _record(self, key: str) -> OpCost:
        self.keys.append(key)
        return OpCost(key, 0, 0, 0, 0, 0, 0, 0)

    def matvec(self, name, reduction, outputs, weight_bytes, write_bytes=0, groups=1) -> OpCost:
        return self._record(op_key("matvec", reduction=reduction, outputs=outputs, read_bytes=weight_bytes))

    def matmul(self, name, tokens, reduction, outputs, weight_bytes, write_bytes=0, groups=1) -> OpCost:
        if tokens == 1:  # as ArrayModel.matmul: one token is the GEMV
            return self.matvec(name, reduction, outputs, weight_bytes, write_bytes, groups)
        return self._record(op_key("matmul", reduction=reduction, outputs=outputs, read_bytes=weight_bytes,
                                   tokens=tokens))

    def sfu(self, name, ops) -> OpCost:
        return self._record(op_key("sfu", elements=ops))

    def vector(self, name, lane_ops, read_bytes=0) -> OpCost:
        return self._record(op_key("vector", read_bytes=read_bytes, elements=lane_ops))


def _step_keys(quant: tuple, model, context: int, bits: int) -> list[str]:
    """Every operation key of one decode step of `model`, in build order; quant = (model.quant_group_size,
    model.quant_scale_bits, compute.dequant_ops_per_weight): what op_group_builders reads of a config."""
    group, scale_bits, dequant_ops = quant
    hw = SimpleNamespace(workload=SimpleNamespace(context_length=context),
                         model=SimpleNamespace(expert_bits=bits, quant_group_size=group, quant_scale_bits=scale_bits),
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
        for bits in field_bounds(ModelConfig, "expert_bits").choices:
            at1, at2 = _step_keys(quant, model, 1, bits), _step_keys(quant, model, 2, bits)
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


def known_models(hw: HardwareConfig) -> tuple:
    """Every bundled shape and the config's own (a config.json's model is as much a model chipsim knows)."""
    from chipsim.workload.models import MODELS  # every bundled shape: read here, on the runs that need them

    models = tuple(MODELS.values())
    own = model_of(hw.model)
    return models if own in models else models + (own,)


def known_shape(hw: HardwareConfig, key: str, models: tuple | None = None) -> str | None:
    """None if `key` names an operation some model of `models` (default: known_models) produces (the module's
    rule), else what is wrong."""
    kind = key.split(" ", 1)[0]
    form = _FORMS.get(kind)
    if form is None:
        return f"unknown operation kind '{kind}' (kinds: {', '.join(_FORMS)})"
    if not form.fullmatch(key):
        return f"not of the form '{_SHOWN[kind]}' (op_key's, with whole numbers)"
    if models is None:
        models = known_models(hw)
    _, fields = parse_op_key(key)
    names = tuple(fields)
    values = tuple(fields[n] for n in names)
    max_context = field_bounds(WorkloadConfig, "context_length").maximum
    quant = (hw.model.quant_group_size, hw.model.quant_scale_bits, hw.compute.dequant_ops_per_weight)
    for t_names, at1, step in _templates(quant, models)[kind]:
        if t_names == names and _matches(values, at1, step, max_context):
            return None
    return (f"no operation of any model chipsim knows (chipsim models) has this shape at any context length or "
            f"expert precision (model.quant_group_size {hw.model.quant_group_size}, model.quant_scale_bits "
            f"{hw.model.quant_scale_bits}, compute.dequant_ops_per_weight {hw.compute.dequant_ops_per_weight})")


def check_op_keys(hw: HardwareConfig) -> None:
    """Every key of compute.op_times_ns and compute.op_energy_pj names an operation of a model (the rule above);
    an InputError naming the first that does not."""
    if not any(getattr(hw.compute, table) for table in TABLES):
        return
    models = known_models(hw)
    for table in TABLES:
        for key in getattr(hw.compute, table):
            problem = known_shape(hw, key, models)
            if problem:
                raise InputError(f"compute.{table}.'{key}': {problem}")
