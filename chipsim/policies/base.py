"""The policy plug-in interface, its registry and the contract between policies and the engine.

A policy decides what to prefetch and when, which experts a layer executes, and what to evict. The
engine (chipsim.sim.engine.Simulation) calls its hooks at fixed points of the decode step and passes
itself as `ctx`, a `SimContext`: the members listed there are all a policy may use.

    on_run_start(ctx)                   once, before the first token
    on_token_start(ctx, t)
    on_layer_start(ctx, t, l)           MoE layer l is about to run attention: prefetch now
    on_route(ctx, t, l, routed) -> LayerPlan   the router has chosen `routed`; say what runs
    on_layer_end(ctx, t, l)             the layer's experts have run: evict now
    choose_victims(ctx, l, needed, n) -> list of (layer, expert) to evict to make room for demand fetches
    extra_metrics() -> dict             policy-specific results for the output

A step is one decode token, or in a whole request (chipsim.workload.request) a prefill chunk of several tokens: then
t is the chunk's last token, `ctx.step_tokens` all of them, `routed` the union of their routed experts, and a
prefill policy (`phase = "prefill"`, chipsim.policies.prefill) runs the chunks and ends with

    on_prefill_end(ctx)                 the prompt is read: what stays in the buffer is what decode starts with

before the decode policy's on_run_start. `--policy PREFILL+DECODE` names both (e.g. layer-ahead+apex); a decode
policy alone gets the config's run.prefill_policy. Today's decode policies see one token per step, as before.

A policy reads the trace's core arrays (chipsim.trace.format.CORE_ARRAYS: routing, weights, the router's
ranking) and the predictor outputs it declares in `trace_arrays` (specs from chipsim.trace.predictor_arrays);
`runner.prepare` checks a trace carries them, naming the policy and the array, before anything runs.

The boundary is enforced by the engine, and a policy that crosses it is stopped with one line naming it, the
call and the value (`PolicyError`: the CLI prints `chipsim: error: policy lru: prefetch(6, 30.0): expert id 30.0
is not an integer` and exits 2):
- Ids. Every layer, expert and token id a policy hands the engine (in a ctx call, in the LayerPlan `on_route`
  returns, in `choose_victims`' keys, in the `needed` and `protect` collections) is taken exactly when it is an
  integer of any type (int or a NumPy integer: `operator.index`) and refused otherwise; a bool is refused (True
  is not expert 1). An action (prefetch, a LayerPlan's experts, a victim, a trace read) must name an expert the
  model has; a query (present, resident, evict, keys_of_layer, ...) about an integer id outside the model
  answers "absent" or does nothing.
- Routing. What the system knows at each hook: at `on_route(t, l)`, `on_layer_end(t, l)` and `choose_victims`
  the routing of every (token, MoE layer) up to and including the last that routed, (t, l); at
  `on_layer_start(t, l)` only those before it; at `on_token_start(t)` every layer of the tokens before t; at
  `on_run_start` none. The routing arrays (`ROUTING_ARRAYS`: routed ids and weights, the router's ranking and
  probabilities) are read per token and layer through `trace_routed` / `trace_row`, which refuse a position
  the run has not routed yet; `trace_array` does not hand them out whole. Only a policy that sets
  `sees_future_routing` (the oracle, an upper bound) reads routing ahead.

A policy that changes what the model computes (substitutes, drops or approximates routed experts) reports
the quality cost measured for it on the trace's model (meta['quality'], chipsim.tracegen.quality) through
`quality_fields`: extra metrics `quality_mode`, `quality_cost` and `quality_source`.

Policies are registered by name with `@register`. A policy's parameters are a frozen dataclass (its `Params`),
one `param(...)` field each (type from the annotation, default, meaning, bounds); the policy receives one instance
as `self.params` (annotated with its dataclass, so `self.params.tau` is checked by mypy and known to an IDE). The
values come from `policies.<name>.<param>` in the config or inline (`--policy apex:tau=0.6`, `--policy static-4`),
checked by the same value checker as config keys (chipsim.values).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, ClassVar, Collection, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from chipsim.errors import InputError
from chipsim.hw.config import HardwareConfig
from chipsim.trace.format import ArraySpec
from chipsim.values import Bounds, check_value, yaml_load
from chipsim.workload.decode import DecodeWorkload, ExpertFormat
from chipsim.workload.host import HostTiming

if TYPE_CHECKING:
    from chipsim.hw.compute_formula import OpCost

Key = tuple[int, int]  # (MoE layer, expert)

# the core trace arrays that carry the router's decision (chipsim.trace.format.CORE_ARRAYS): known only once the
# run has routed that token and layer
ROUTING_ARRAYS = frozenset({"routed_ids", "routed_weights", "router_rank", "router_rank_prob"})


class PolicyError(InputError):
    """A policy broke the boundary (an id that is not an integer or not the model's, routing not known yet): one
    line, `policy <label>: <call>: <what>`, printed by the CLI as an input error (exit 2)."""


class SimContext(Protocol):
    """What the engine offers a policy: read the run's set-up and the trace, act on the expert buffer.

    Times are integer picoseconds of simulated time; a (layer, expert) key names one routed expert of one
    MoE layer (layers count MoE layers only, from 0). Every member may be called from any hook, from
    `on_run_start` on, unless its docstring says otherwise. An id handed in is taken exactly when it is an integer
    of any type (int, a NumPy integer), a bool or anything else is refused (PolicyError); the module docstring
    says which calls also refuse an id outside the model and what routing each hook may read."""

    # ---- the run's set-up (constant for the whole run)
    @property
    def hw(self) -> HardwareConfig:
        """The validated hardware and workload config of the run."""

    @property
    def workload(self) -> DecodeWorkload:
        """The decode step as costed operations (model shape, expert bytes, HBM budget)."""

    @property
    def expert_format(self) -> ExpertFormat:
        """How this policy's experts are moved, stored and computed (bytes per part, slot bytes, arrays ps)."""

    @property
    def host_timing(self) -> HostTiming:
        """One expert on the host CPU: dispatch + PCIe transit + compute, in ps."""

    @property
    def num_tokens(self) -> int:
        """Tokens this run replays (the trace's, capped by workload.max_tokens)."""

    @property
    def num_moe_layers(self) -> int:
        """MoE layers per token (dense first layers excluded)."""

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer."""

    @property
    def top_k(self) -> int:
        """Routed experts the router picks per token and MoE layer."""

    @property
    def slots(self) -> int:
        """Expert slots the buffer holds in this policy's expert format."""

    @property
    def first_token(self) -> int:
        """The first token this policy's steps run: 0, or in a request the first decode step's token for a decode
        policy (the prompt's tokens ran under the prefill policy)."""

    @property
    def step_tokens(self) -> Sequence[int]:
        """The tokens of the running step: the decode token, or a prefill chunk's prompt tokens (the routing of each
        is known layer by layer, as routing reaches it); in a served run (workload.requests) the step's parts'
        tokens, several requests' windows of the trace, each part's in order (a range where the step is one part)."""

    @property
    def batch(self) -> int:
        """Sequences decoded together (workload.batch): a step's tokens are one of each, and a token's predecessor in
        its own sequence is `batch` tokens before it (chipsim.workload.batch)."""

    @property
    def row_keep(self) -> int:
        """Tokens a chipsim.trace.format.TokenRows of this run should keep converted (`keep=`): every token of its
        widest step, which a policy reading per token meets once per MoE layer."""

    @property
    def step_clock(self) -> int:
        """A served run's step index (its steps' tokens are not in time order: a policy that keeps time by tokens
        stamps with this instead); -1 in other runs, whose tokens are in time order."""

    @property
    def read_tokens(self):
        """A served run's trace tokens read by its requests so far (a numpy bool array over the trace, filled as
        requests are admitted; None in other runs): what a policy's per-token results average over
        (measured_rows)."""

    @property
    def served(self) -> bool:
        """A served run (workload.requests): a step's tokens are its requests' windows of the trace, not in time
        order; a token's predecessor is the one before it in its window, unless it is its request's first."""

    @property
    def in_place(self) -> bool:
        """The machine reads every expert where it is stored (roles.expert_staging: in-place): every expert is
        present from the start, nothing is ever fetched or missing, and `slots` counts them all."""

    # ---- the trace
    @property
    def trace_meta(self) -> dict:
        """The trace's meta record (model counts, provenance, predictor metrics, quality records)."""

    def trace_array(self, key: str) -> np.ndarray:
        """A read-only trace array, whole: a core array or one the policy declares in `trace_arrays`; (T, L, ...)
        arrays are indexed [token, MoE layer]. Not a routing array (ROUTING_ARRAYS: read them with trace_routed and
        trace_row), unless the policy `sees_future_routing`."""

    def trace_routed(self, t: int, layer: int) -> list[int]:
        """The experts the router picks at token t, MoE layer `layer`, once the run has routed it (at on_route(t,
        layer) and later; ahead of that only for a policy that `sees_future_routing`)."""

    def trace_row(self, key: str, t: int, layer: int) -> list:
        """Row [t, layer] of a (T, L, ...) trace array that trace_array would hand out, as a list; a routing array's
        once the run has routed (t, layer), as trace_routed."""

    # ---- the expert buffer (a key is present from its prefetch or demand until evicted)
    def present(self, layer: int, expert: int) -> bool:
        """In the buffer: arrived or on its way."""

    def resident(self, layer: int, expert: int) -> bool:
        """Arrived: all its bytes have landed."""

    def resident_keys(self) -> list[Key]:
        """Every arrived expert."""

    def keys_of_layer(self, layer: int) -> list[Key]:
        """Every present expert of one MoE layer (arrived or on its way)."""

    def last_use(self, key: Key) -> int:
        """When a present expert was last computed, as token × MoE layers + layer; -1 if never."""

    def least_recently_used(self, count: int, protect: list[tuple[int, Collection[int]]]) -> list[Key]:
        """The `count` arrived experts used longest ago (ordered by (last_use(key), key): never used first, ties by
        key), leaving out every expert of `protect`'s (layer, experts): an LRU cache's victims, in one call."""

    def free_slots(self) -> int:
        """Slots neither held nor still draining an evicted transfer."""

    # ---- estimates (for policies that choose between a fetch and the host CPU)
    @property
    def fetch_bytes_per_s(self) -> int:
        """The rate one expert fetch moves at alone (bytes/s): the path's bottleneck, or the pageable copy rate below
        it where host_frontend.expert_memory is pageable."""

    @property
    def fetch_setup_ps(self) -> int:
        """The fixed cost of each part (descriptor) of a fetch (ps): dma.setup_ns, or host_frontend's pageable one."""

    def fetch_estimate_ps(self) -> int:
        """How long an expert fetched now would take to land, queued behind every byte on the link (ps)."""

    def host_estimate_ps(self) -> int:
        """How long an expert handed to the host CPU now would take, counting the host's queue (ps)."""

    # ---- actions (from any hook, on_run_start included: Fiddler places its experts there). The buffer
    # queries see an action at once; the link re-plans its transfers once per hook, at the same simulated time
    def prefetch(self, layer: int, expert: int) -> bool:
        """Stage an expert ahead of need; True if present afterwards, False if the buffer has no free slot
        (nothing is evicted for a prefetch)."""

    def evict(self, layer: int, expert: int, stop_transfer: bool = True) -> None:
        """Free an expert's slot; one on its way stops at its next chunk boundary (stop_transfer=False: it
        moves all its bytes first, and its slot frees when they land)."""

    def evict_layer(self, layer: int, stop_transfers: bool = True) -> None:
        """Evict every present expert of one MoE layer."""

    def cancel_unneeded(self, layer: int, needed) -> list[int]:
        """Evict this layer's experts still on their way that are not in `needed`; the experts evicted, in issue
        order."""


@dataclass(frozen=True)
class Param:
    """A policy parameter: its type, default and meaning, and the values it allows (bounds inclusive unless
    marked exclusive, or a list of choices)."""

    type: type
    default: object
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    choices: tuple | None = None

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.minimum, self.maximum, self.min_exclusive, self.max_exclusive, self.choices)

    def check(self, key: str, value):
        """`value` read and bounded as this parameter (InputError naming `key` otherwise)."""
        return check_value(key, value, self.type, self.bounds)


_PARAM = "chipsim.policy_param"  # the metadata key of a `param` field: its Param minus the type
_T = TypeVar("_T")


def param(default: _T, doc: str, *, minimum: float | None = None, maximum: float | None = None,
          min_exclusive: bool = False, max_exclusive: bool = False, choices: tuple | None = None) -> _T:
    """A field of a policy's parameter dataclass: its default, one-line meaning and allowed values (bounds inclusive
    unless marked exclusive, or a list of choices); its type is the field's annotation."""
    spec = {"doc": doc, "minimum": minimum, "maximum": maximum, "min_exclusive": min_exclusive,
            "max_exclusive": max_exclusive, "choices": choices}
    return field(default=default, metadata={_PARAM: spec})


@dataclass(frozen=True)
class NoParams:
    """The parameters of a policy that has none."""


@functools.cache
def param_specs(params_class: type) -> Mapping[str, Param]:
    """A parameter dataclass's fields as Params, in field order: what the config, --policy and the listings read
    (read-only: the answer is cached)."""
    made_by = getattr(params_class, "__dataclass_params__", None)  # @dataclass's arguments
    if made_by is None or not made_by.frozen:
        raise TypeError(f"{params_class.__name__}: a policy's parameters must be a frozen dataclass")
    types = typing.get_type_hints(params_class)
    specs = {}
    for f in dataclasses.fields(params_class):
        if _PARAM not in f.metadata:
            raise TypeError(f"{params_class.__name__}.{f.name}: declare a policy parameter with param(...)")
        specs[f.name] = Param(types[f.name], f.default, **f.metadata[_PARAM])
    return MappingProxyType(specs)


@dataclass
class LayerPlan:
    """What a MoE layer executes once routing is known.

    execute:     experts computed on the arrays; any not in the buffer is fetched on demand and the
                 layer waits for it (correctness-preserving)
    on_host:     experts computed by the host CPU from its own copy; activations cross PCIe both ways
                 and the layer's weighted sum waits for the results
    surrogate:   experts replaced by the resident shared expert plus a low-rank residual, computed on the
                 arrays at the cost of `Policy.surrogate_op`
    substituted: routed experts replaced by another expert (a routing deviation; the substitute is in
                 `execute`)
    dropped:     routed experts not computed at all (a routing deviation)
    tokens:      in a step of several tokens, how many of them each executed or host expert runs for, where the
                 policy changed what runs (a substitute, a pre-gate's choice, a dropped expert); None: the number
                 routed to it (`per_token_plan` makes one from each token's own set)
    """

    execute: list[int]
    on_host: list[int] = field(default_factory=list)
    surrogate: list[int] = field(default_factory=list)
    substituted: int = 0
    dropped: int = 0
    tokens: dict[int, int] | None = None


class Policy:
    name: str = ""
    summary: str = ""
    # "decode": runs decode steps; "prefill": runs a request's prefill chunks (chipsim.policies.prefill)
    phase: ClassVar[str] = "decode"
    # True: its decisions read the buffer as the engine holds it, so after a request's prefill it uses what prefill
    # kept there; False: it keeps its own record of what it placed (Fiddler's placement, SPICE's stamps), so the
    # engine empties the buffer before its first decode step
    adopts_buffer: ClassVar[bool] = True
    # how it decides for a step of several sequences' tokens (workload.batch > 1), in words; "" where it runs one
    # sequence only (`chipsim policies` prints it; a batch run refuses such a policy in one line)
    # scalar metrics of extra_metrics() that experiments may tabulate (results.csv carries every scalar one)
    result_columns: ClassVar[tuple[str, ...]] = ()
    batch_support: ClassVar[str] = ""
    # why it runs one sequence only (where batch_support is ""), for the refusal
    batch_refusal: ClassVar[str] = "it does not say how it handles several sequences"
    # the frozen dataclass of this policy's parameters (fields made by `param`); a subclass that sets it also
    # annotates `params` with it, so that a type checker knows `self.params.<field>`
    Params: ClassVar[type] = NoParams
    params: object  # this run's values, an instance of Params (`object` here: a subclass must say which)
    # False: experts are staged per layer (loaded, used, evicted); True: kept across tokens
    caches_across_tokens: bool = False
    # True: each expert moves as a chain of three DMA descriptors (gate, up, down) on one engine:
    # three setup costs instead of one
    transfer_per_matrix: bool = False
    # arrays cost of one surrogate expert, for policies that return LayerPlan.surrogate
    surrogate_op: OpCost | None = None
    # True: prefetches the router did not pick still move all their bytes (no cancel at routing or at the
    # layer's end), as in the APEX paper's accounting of static k+N; set from the `complete_unpicked` parameter
    complete_unpicked: bool = False
    # a variant reads its family's `policies.<family>` section first (apex-sf reads policies.apex, then
    # policies.apex-sf), so one τ in the config reaches both modes
    param_family: str = ""
    # the predictor outputs this policy reads beyond the trace's core arrays (chipsim.trace.predictor_arrays)
    trace_arrays: tuple[ArraySpec, ...] = ()
    # True only for the oracle (an upper bound, not a realisable policy): it reads routing before the run reaches
    # it, through trace_routed, trace_row and trace_array's routing arrays; every other policy is refused
    sees_future_routing: bool = False
    # what it does on a machine that reads experts where they are stored (roles.expert_staging: in-place), where no
    # cache level or faster tier is modelled: `chipsim policies` and the run's notes say it
    in_place: ClassVar[str] = ("every expert is already where the arrays read it: its prefetches and evictions do "
                               "nothing, and what else it decides (the host CPU, substitutes) it still does")

    def __init__(self, label: str, params: object = None):
        """params: an instance of this policy's Params (None: every default)."""
        if params is None:
            params = self.Params()
        if type(params) is not self.Params:
            raise TypeError(f"policy {self.name}: parameters must be a {self.Params.__name__}, got "
                            f"{type(params).__name__}")
        self.label = label
        self.params = params

    @classmethod
    def param_specs(cls) -> Mapping[str, Param]:
        """This policy's parameters by name, in declaration order (type, default, meaning, bounds)."""
        return param_specs(cls.Params)

    def expert_format(self, workload: DecodeWorkload, hw: HardwareConfig) -> ExpertFormat:
        """How experts are moved, stored and computed under this policy (default: as published)."""
        return workload.expert_format(per_matrix=self.transfer_per_matrix)

    def warmup_tokens(self) -> int:
        """Leading tokens whose results are reported separately (caches filling up)."""
        return 0

    def on_run_start(self, ctx: SimContext) -> None:
        pass

    def on_token_start(self, ctx: SimContext, t: int) -> None:
        pass

    def on_layer_start(self, ctx: SimContext, t: int, layer: int) -> None:
        pass

    def on_route(self, ctx: SimContext, t: int, layer: int, routed: list[int]) -> LayerPlan:
        """Default: execute the routed set; per-layer staging abandons this layer's prefetches that the
        router did not pick (a queued one never starts, a moving one stops at its next chunk boundary)."""
        if not self.caches_across_tokens and not self.complete_unpicked:
            ctx.cancel_unneeded(layer, routed)
        return LayerPlan(execute=list(routed))

    def on_layer_end(self, ctx: SimContext, t: int, layer: int) -> None:
        """Default per-layer staging: drop this layer's experts once it has run."""
        ctx.evict_layer(layer, stop_transfers=not self.complete_unpicked)

    def choose_victims(self, ctx: SimContext, layer: int, needed: set[int], count: int) -> list[Key]:
        """Default: resident experts not needed now, other layers' first, then least recently used."""
        candidates = [
            key for key in ctx.resident_keys()
            if not (key[0] == layer and key[1] in needed)
        ]
        candidates.sort(key=lambda key: (key[0] == layer, ctx.last_use(key)))
        return candidates[:count]

    def extra_metrics(self) -> dict:
        return {}


def measured_from(ctx: SimContext, warmup: int) -> int:
    """The first token a policy's own results average from: after `warmup` steps of a decode-only run (all but one
    at most; a step is `ctx.batch` tokens), or a request's first decode step (its prefill warmed the buffer;
    workload.warmup_tokens is not read); in a served run, the first."""
    if ctx.first_token:
        return ctx.first_token
    if ctx.served:  # tokens are windows of the trace, not time: every step counts
        return 0
    return min(warmup * ctx.batch, ctx.num_tokens - ctx.batch)


def measured_rows(ctx: SimContext, warmup: int):
    """What a policy's own per-(token, layer) results average over: the tokens from measured_from on (a slice), or, in
    a served run, the trace tokens its requests read (a boolean mask over the trace's tokens, filled as the run admits
    them; a window read by several requests holds its last one's values)."""
    read = ctx.read_tokens
    return read if read is not None else slice(measured_from(ctx, warmup), None)


def per_token_plan(ctx: SimContext, t: int, layer: int, routed: list[int],
                   decide: Callable[[int, list[int]], tuple]) -> tuple[list[int], dict[int, int] | None, tuple]:
    """Each of the step's tokens decides its own experts: `decide(token, its routed set)` -> (experts, *counts). One
    token: its experts, no LayerPlan.tokens, its counts. Several: the union of their experts in order of first
    appearance, how many of the tokens run each (LayerPlan.tokens) and their counts summed."""
    if len(ctx.step_tokens) == 1:
        experts, *counts = decide(t, routed)
        return experts, None, tuple(counts)
    sets: dict[int, list[int]] = {}
    tokens: dict[int, int] = {}
    totals: list[int] = []
    for token in ctx.step_tokens:
        experts, *counts = decide(token, ctx.trace_routed(token, layer))
        sets[token] = experts
        for e in experts:
            tokens[int(e)] = tokens.get(int(e), 0) + 1
        totals = [a + b for a, b in zip(totals, counts)] if totals else list(counts)
    return step_union(ctx, sets.__getitem__), tokens, tuple(totals)


def step_union(ctx: SimContext, rows: Callable[[int], Collection[int]]) -> list[int]:
    """The union of `rows(token)` over the step's tokens, in order of first appearance (one token: its row)."""
    tokens = ctx.step_tokens
    if len(tokens) == 1:
        return list(rows(tokens[0]))
    seen: dict[int, None] = {}
    for token in tokens:
        for e in rows(token):
            seen.setdefault(int(e), None)
    return list(seen)


def _key_text(key) -> str:
    return f"{key:g}" if isinstance(key, float) else str(key)


def quality_record(meta: dict, path) -> tuple[dict | None, str]:
    """The trace's measured quality cost at meta['quality'][path[0]][path[1]]…, or None and why not.

    A str key is looked up as is; a float key (a τ) matches the record's numeric keys within 1e-9, so τ 0.9
    finds '0.9'. Returns (entry, source): source names the record found ("meta['quality']['apex_sf']['0.9']")
    or says why there is none.
    """
    node = meta.get("quality") if isinstance(meta, dict) else None
    where = "meta['quality']"
    if not isinstance(node, dict) or not node:
        return None, "not measured: the trace has no meta['quality'] record"
    for key in path:
        found = None
        if isinstance(node, dict):
            if isinstance(key, float):
                for name in node:
                    try:
                        if math.isclose(float(name), key, rel_tol=0.0, abs_tol=1e-9):
                            found = name
                            break
                    except (TypeError, ValueError):
                        continue
            elif key in node:
                found = key
        if found is None:
            # name the alternatives within a mode's record (its τ values), not every top-level entry
            known = ", ".join(sorted(str(k) for k in node)) if isinstance(node, dict) and where != "meta['quality']" else ""
            held = f" (it holds {known})" if known else ""
            return None, f"not measured: the trace has no {where}['{_key_text(key)}'] record{held}"
        where += f"['{found}']"
        node = node[found]
    if not isinstance(node, dict):
        return None, f"not measured: {where} of the trace is not a quality record"
    return node, where


def quality_fields(mode: str | None, meta: dict | None = None, path=(), reason: str | None = None) -> dict:
    """The extra metrics through which a policy reports its quality cost.

    mode: the approximation this run makes, in words ("tau 0.9"); None when the run computes every routed
    expert exactly (then nothing is read). reason: why no measured record applies to this run (the record
    is then not read). Otherwise `quality_record(meta, path)`.
    """
    if mode is None:
        return {"quality_mode": None, "quality_cost": None,
                "quality_source": reason or "exact: every routed expert is computed as routed"}
    if reason is not None:
        return {"quality_mode": mode, "quality_cost": None, "quality_source": reason}
    entry, source = quality_record(meta or {}, path)
    return {"quality_mode": mode, "quality_cost": entry, "quality_source": source}


REGISTRY: dict[str, type[Policy]] = {}
# name pattern parsers: e.g. "static-4" -> ("static", {"extra": 4})
SHORTHANDS: list[Callable[[str], tuple[str, dict] | None]] = []


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"policy name {cls.name!r} missing or registered twice")
    REGISTRY[cls.name] = cls
    return cls


def _parse_inline(text: str, spec: str = "") -> dict:
    import yaml

    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise InputError(f"--policy: expected name:param=value, got '{item}'")
        key, _, value = item.partition("=")
        if key.strip() in out:  # the last would silently win: which one was meant?
            raise InputError(f"--policy {spec or text}: parameter '{key.strip()}' given twice")
        try:
            out[key.strip()] = yaml_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def make_policy(spec: str, config_params: dict, where: str = "") -> Policy:
    """Build a policy from 'name', a shorthand like 'static-4', or 'name:param=value,...'.

    Parameters come, in increasing precedence, from the declared defaults, `policies.<name>` in the
    config, the shorthand, and the inline assignments.
    """
    spec = spec.strip()
    head, _, inline = spec.partition(":")
    name, shorthand = head, {}
    if name not in REGISTRY:
        for parse in SHORTHANDS:
            hit = parse(head)
            if hit:
                name, shorthand = hit
                break
    if name not in REGISTRY:
        raise InputError(f"{where or '--policy ' + spec}: unknown policy '{head}' (known: {', '.join(sorted(REGISTRY))})")
    cls = REGISTRY[name]
    specs = cls.param_specs()
    family = (config_params.get(cls.param_family, {}) or {}) if cls.param_family else {}
    family = {k: v for k, v in family.items() if k in specs}
    from_config = config_params.get(name, {}) or {}
    values = {}
    for source in (family, from_config, shorthand, _parse_inline(inline, spec)):
        for key, value in source.items():
            if key not in specs:
                known = ", ".join(specs) or "none"
                raise InputError(f"policies.{name}.{key}: unknown parameter (known: {known})")
            values[key] = specs[key].check(f"policies.{name}.{key}", value)
    return cls(label=spec, params=cls.Params(**values))


def _names_policy(spec: str) -> bool:
    """The spec's head (before any ':') is a registered policy or a shorthand of one (static-4)."""
    head = spec.partition(":")[0].strip()
    return head in REGISTRY or any(parse(head) for parse in SHORTHANDS)


def split_request_spec(spec: str) -> tuple[str, str] | None:
    """'PREFILL+DECODE' -> (PREFILL, DECODE) at the first '+' with a registered policy on its left and a policy or
    nothing on its right (so a '+' inside a parameter value, static:extra=+4 or apex:tau=0.5e+0, is not a split);
    None for a spec without one."""
    for i, char in enumerate(spec):
        if char == "+" and spec[:i].partition(":")[0].strip() in REGISTRY:
            right = spec[i + 1:].strip()
            if not right or _names_policy(right):
                return spec[:i].strip(), right
    return None


def make_request_policies(spec: str, config_params: dict, default_prefill: str) -> tuple[Policy, Policy]:
    """A request's (prefill, decode) policies from 'PREFILL+DECODE' or a decode spec alone (then `default_prefill`,
    the config's run.prefill_policy); the decode policy is labelled with both, 'PREFILL+DECODE'."""
    spec = spec.strip()
    pair = split_request_spec(spec)
    prefill_spec, decode_spec = pair if pair else (default_prefill, spec)
    where = f"--policy {spec}" if pair else f"run.prefill_policy {default_prefill}"
    if pair and not decode_spec:
        raise InputError(f"--policy {spec}: no decode policy after '+' (PREFILL+DECODE, e.g. {prefill_spec}+apex)")
    prefill = make_policy(prefill_spec, config_params, where)
    decode = make_policy(decode_spec, config_params)
    if prefill.phase != "prefill":
        raise InputError(f"{where}: '{prefill_spec}' is a decode policy, not a prefill policy (prefill: "
                         f"{', '.join(sorted(phase_names('prefill')))})")
    if decode.phase != "decode":
        raise InputError(f"--policy {spec}: '{decode_spec}' is a prefill policy; name a decode policy after "
                         f"it (PREFILL+DECODE, e.g. {prefill_spec}+apex)")
    decode.label = f"{prefill.label}+{decode.label}"
    return prefill, decode


def phase_names(phase: str) -> list[str]:
    """The registered policies of one phase ("decode" or "prefill")."""
    return [name for name, cls in REGISTRY.items() if cls.phase == phase]


def check_policy_config(config_params: dict) -> None:
    """Reject a `policies:` section naming an unknown policy or parameter, before anything runs."""
    for name, params in config_params.items():
        if name not in REGISTRY:
            raise InputError(f"policies.{name}: unknown policy (known: {', '.join(sorted(REGISTRY))})")
        specs = REGISTRY[name].param_specs()
        for key, value in (params or {}).items():
            if key not in specs:
                raise InputError(f"policies.{name}.{key}: unknown parameter")
            specs[key].check(f"policies.{name}.{key}", value)
