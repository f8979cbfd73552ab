"""The policy boundary is hard (issue 37): every id a policy hands the engine is taken exactly when it is an integer
of any type (NumPy's included) and refused in one line naming the policy, the call and the value otherwise; a policy
other than the oracle cannot read routing the system would not know yet.

Test-only policies are registered for one test (monkeypatch.setitem on REGISTRY: removed afterwards); every run
writes its caches under tmp_path, and the configs use the closed-form DRAM timing (no calibration to wait for)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chipsim.cli import main
from chipsim.policies import REGISTRY
from chipsim.policies.base import LayerPlan, Policy, PolicyError
from chipsim.runner import prepare, summarize_result
from chipsim.sim.engine import Simulation
from chipsim.sim.core import core_for

CLOSED_FORM = ("expert_buffer:\n  capacity_mib: 4\n"
               "memory:\n  hbm:\n    timing_model: closed-form\n  lpddr5x:\n    timing_model: closed-form\n")
ENGINES = ("fast", "reference")  # fast: the native core where it was built (chipsim.sim.core.core_for)
INTEGER_TYPES = [int, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.intp]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def cfg(tiny):
    """The tiny model (3 MoE layers, 8 experts top-2), 6 tokens."""
    return tiny.config(extra_yaml=CLOSED_FORM)


@pytest.fixture
def registered(monkeypatch):
    """register(cls): `cls` in the policy registry for this test only."""
    def register(cls):
        monkeypatch.setitem(REGISTRY, cls.name, cls)
        return cls
    return register


def _run(cfg: str, policy: Policy, engine: str = "fast", tokens: int = 0) -> dict:
    """The policy's summary row (every number of its result) on the tiny config."""
    prep = prepare(cfg, [], ["no-prefetch"])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy, max_tokens=tokens, core=core_for(engine))
    return summarize_result(prep, sim.run(), policy)


def _cli_error(capsys, argv: list[str]) -> str:
    """The one stderr line of a `chipsim` run that must be refused (exit 2)."""
    capsys.readouterr()
    assert main(argv + ["--set", "workload.max_tokens=6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("chipsim: error: "), err
    return err.strip()


class Busy(Policy):
    """A cache across tokens that uses every call taking ids, each id passed as `kind(value)`: prefetches three
    experts per layer (two of the next layer), executes the routed set in reverse, cancels with a `needed` array,
    evicts a fixed expert at each layer's end, and picks its victims with least_recently_used."""

    name = "test-busy"
    caches_across_tokens = True
    kind = int

    def on_layer_start(self, ctx, t, layer):
        k, n = self.kind, ctx.num_experts
        for j in range(3):
            ctx.prefetch(k(layer), k((t + 3 * layer + j) % n))
        if layer + 1 < ctx.num_moe_layers:
            ctx.prefetch(k(layer + 1), k((t + 1) % n))
        ctx.present(k(layer), k(t % n))
        ctx.resident(k(layer), k((t + 1) % n))
        ctx.keys_of_layer(k(layer))

    def on_route(self, ctx, t, layer, routed):
        k = self.kind
        ctx.cancel_unneeded(k(layer), np.array(routed, dtype=np.int64) if k is not int else routed)
        return LayerPlan(execute=[k(e) for e in reversed(routed)])

    def on_layer_end(self, ctx, t, layer):
        k = self.kind
        ctx.evict(k(layer), k((t + 5) % ctx.num_experts))
        if layer == ctx.num_moe_layers - 1 and t % 2:
            ctx.evict_layer(k(0))

    def choose_victims(self, ctx, layer, needed, count):
        k = self.kind
        victims = ctx.least_recently_used(count, [(k(layer), [k(e) for e in needed])])
        for key in victims:
            ctx.last_use((k(key[0]), k(key[1])))
        return [(k(a), k(b)) for a, b in victims]


# ---------------------------------------------------------------------------------------------- integer ids
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_numpy_integer_ids_give_exactly_the_result_of_python_ints(cfg, engine):
    """uint8 overflowed layer * experts + expert in Python (another layer's expert was staged); compiled, a typed int
    parameter raised a bare TypeError. Every NumPy integer type now runs as the Python ints do, number for number,
    on a buffer small enough for victims to be chosen (2 MiB: 10 slots)."""
    small = cfg.replace(".yaml", "-small.yaml")
    with open(cfg) as f, open(small, "w") as g:
        g.write(f.read().replace("capacity_mib: 4", "capacity_mib: 2"))
    want = _run(small, Busy("busy"), engine)
    assert want["tokens"] == 6 and want["prefetches_issued"] > 0
    for kind in (np.uint8, np.int32, np.int64):
        policy = Busy("busy")
        policy.kind = kind
        assert _run(small, policy, engine) == want, kind


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(INTEGER_TYPES), layer=st.integers(0, 2), expert=st.integers(0, 7))
def test_any_integer_type_names_the_same_expert(cfg, kind, layer, expert):
    """prefetch(kind(layer), kind(expert)) stages exactly (layer, expert): present under Python ints, keyed by them."""
    seen = []

    class One(Policy):
        name = "test-one"

        def on_run_start(self, ctx):
            ctx.prefetch(kind(layer), kind(expert))
            seen.append((ctx.present(layer, expert), ctx.keys_of_layer(layer),
                         sum(len(ctx.keys_of_layer(other)) for other in range(ctx.num_moe_layers))))

    _run(cfg, One("one"), "fast", tokens=1)
    assert seen == [(True, [(layer, expert)], 1)]
    assert all(type(part) is int for part in seen[0][1][0])


BAD_IDS = [(30.0, "expert id 30.0 is not an integer"), ("3", "expert id '3' is not an integer"),
           (None, "expert id None is not an integer"), (True, "expert id True is a bool, not an integer id"),
           (np.bool_(True), "expert id np.True_ is a bool, not an integer id"),
           (np.float32(3), "expert id np.float32(3.0) is not an integer"),
           (-1, "expert id -1 is out of range: the model has experts 0..7"),
           (8, "expert id 8 is out of range: the model has experts 0..7"),
           (np.uint8(40), "expert id 40 is out of range: the model has experts 0..7")]


@pytest.mark.parametrize("value, problem", BAD_IDS, ids=[repr(v) for v, _ in BAD_IDS])
def test_a_prefetch_of_anything_but_an_expert_id_of_the_model_is_refused_in_one_line(cfg, registered, capsys,
                                                                                     value, problem):
    @registered
    class Odd(Policy):
        name = "test-odd"

        def on_layer_start(self, ctx, t, layer):
            if layer == 1:
                ctx.prefetch(1, value)

    err = _cli_error(capsys, ["run", cfg, "--policy", "test-odd", "--jobs", "1"])
    assert err == f"chipsim: error: policy test-odd: prefetch(1, {value!r}): {problem}"


def _misuse(where: str):
    """A policy handing 3.0 (a float, not an id) to the engine at `where`."""

    class Misuse(Policy):
        name = "test-misuse"
        caches_across_tokens = where.startswith("choose_victims")

        def on_layer_start(self, ctx, t, layer):
            if where == "present":
                ctx.present(layer, 3.0)
            elif where == "evict_layer":
                ctx.evict_layer(np.float64(1))
            elif where == "trace_routed":
                ctx.trace_routed(3.0, 0)
            elif where == "protect":
                ctx.least_recently_used(1, [(layer, [1, 3.0])])
            elif where == "last_use":
                ctx.last_use((layer, 3.0))

        def on_route(self, ctx, t, layer, routed):
            if where == "needed":
                ctx.cancel_unneeded(layer, [routed[0], 3.0])
            if where == "execute":
                return LayerPlan(execute=routed[:1] + [3.0])
            if where == "on_host":
                return LayerPlan(execute=[], on_host=[3.0])
            return LayerPlan(execute=list(routed))

        def on_layer_end(self, ctx, t, layer):
            if not where.startswith("choose_victims"):  # else the buffer stays full: the next layer's demands need victims
                super().on_layer_end(ctx, t, layer)

        def choose_victims(self, ctx, layer, needed, count):
            return [(0, 3.0)] if where == "choose_victims" else [(0, 8)]

    return Misuse


MISUSES = {
    "present": "present(0, 3.0): expert id 3.0 is not an integer",
    "evict_layer": "evict_layer(np.float64(1.0)): MoE layer np.float64(1.0) is not an integer",
    "trace_routed": "trace_routed(3.0, 0): token 3.0 is not an integer",
    "protect": "least_recently_used(1, ...): protect expert id 3.0 is not an integer",
    "needed": "cancel_unneeded(0, ...): needed expert id 3.0 is not an integer",
    "execute": "on_route(0, 0) -> LayerPlan.execute: expert id 3.0 is not an integer",
    "on_host": "on_route(0, 0) -> LayerPlan.on_host: expert id 3.0 is not an integer",
    "choose_victims": "choose_victims(1, ..., 1) -> (0, 3.0): expert id 3.0 is not an integer",
    "choose_victims out of range": "choose_victims(1, ..., 1) -> (0, 8): expert id 8 is out of range: the model has "
                                   "experts 0..7",
    "last_use": "last_use((0, 3.0)): expert id 3.0 is not an integer",
}


@pytest.mark.parametrize("where", sorted(MISUSES))
def test_every_call_taking_ids_refuses_a_float(tiny, registered, capsys, where):
    """The ids of every call, of the LayerPlan and of choose_victims' keys, in both engines; a buffer of 2 slots
    (top-2) that the policy never empties makes the engine ask for victims at layer 1's routing."""
    registered(_misuse(where))
    cfg = tiny.config(extra_yaml=CLOSED_FORM.replace("capacity_mib: 4", "capacity_mib: 0.4"))
    for engine in ("reference", "fast"):
        err = _cli_error(capsys, ["run", cfg, "--policy", "test-misuse", "--jobs", "1", "--set",
                                  f"run.engine={engine}"])
        assert err == f"chipsim: error: policy test-misuse: {MISUSES[where]}", (engine, err)


def test_queries_about_integers_outside_the_model_answer_absent(cfg):
    """A query (present, resident, evict, keys_of_layer) about an id the model does not have is not an action: it
    answers "absent" or does nothing, whatever its integer type; only the non-integers are refused."""
    answers = []

    class Asks(Policy):
        name = "test-asks"

        def on_run_start(self, ctx):
            ctx.prefetch(1, 3)  # on its way: present, not resident
            for layer, expert in ((np.int64(1), np.uint8(11)), (-1, 3), (np.int16(3), 3)):
                ctx.evict(layer, expert)  # no such expert: nothing to do (layer 1's expert 3 stays)
                answers.append((ctx.present(layer, expert), ctx.resident(layer, expert), ctx.keys_of_layer(layer)))
            answers.append((ctx.present(1, 3), ctx.resident(1, 3), ctx.keys_of_layer(1)))

    _run(cfg, Asks("asks"), tokens=1)
    assert answers == [(False, False, [(1, 3)]), (False, False, []), (False, False, []), (True, False, [(1, 3)])]


def test_a_refusal_in_a_worker_process_is_the_same_one_line(cfg, registered, capsys):
    """Two policies on two workers (--jobs 2): the refusal travels back from the worker and is printed as it is."""
    @registered
    class Odd(Policy):
        name = "test-odd"

        def on_layer_start(self, ctx, t, layer):
            ctx.prefetch(layer, "3")

    err = _cli_error(capsys, ["run", cfg, "--policy", "no-prefetch", "--policy", "test-odd", "--jobs", "2"])
    assert err == "chipsim: error: policy test-odd: prefetch(0, '3'): expert id '3' is not an integer"


# ---------------------------------------------------------------------------------------------- future routing
class Peeks(Policy):
    """Reads routing at (t, layer) + `ahead` cells (layers, across tokens) from the hook `hook`, through `how`."""

    name = "test-peeks"
    hook, ahead, how = "on_route", 0, "trace_routed"

    def _peek(self, ctx, t, layer):
        cell = t * ctx.num_moe_layers + layer + self.ahead
        at_t, at_layer = divmod(cell, ctx.num_moe_layers)
        if cell < 0 or at_t >= ctx.num_tokens:
            return
        if self.how == "trace_routed":
            self.seen.append(ctx.trace_routed(at_t, at_layer))
        elif self.how == "trace_row":
            self.seen.append(ctx.trace_row("routed_weights", at_t, at_layer))
        else:
            self.seen.append(ctx.trace_array(self.how)[at_t, at_layer].tolist())

    def on_run_start(self, ctx):
        self.seen = []

    def on_layer_start(self, ctx, t, layer):
        if self.hook == "on_layer_start":
            self._peek(ctx, t, layer)

    def on_route(self, ctx, t, layer, routed):
        if self.hook == "on_route":
            self._peek(ctx, t, layer)
        return super().on_route(ctx, t, layer, routed)


def _peeks(hook: str, ahead: int, how: str, oracle: bool = False) -> Peeks:
    policy = Peeks("peeks")
    policy.hook, policy.ahead, policy.how, policy.sees_future_routing = hook, ahead, how, oracle
    return policy


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("how", ["trace_routed", "trace_row"])
def test_routing_is_readable_once_routed_and_not_before(cfg, engine, how):
    """At on_route(t, l) the routing of (t, l) and everything before it is known; at on_layer_start(t, l) only what
    came before (t, l); the next layer or token is refused, naming where the run is."""
    routed = prepare(cfg, [], ["no-prefetch"]).trace["routed_ids"]
    weights = prepare(cfg, [], ["no-prefetch"]).trace["routed_weights"]
    want = routed if how == "trace_routed" else weights
    for hook, ahead in (("on_route", 0), ("on_route", -1), ("on_layer_start", -1), ("on_layer_start", -3)):
        policy = _peeks(hook, ahead, how)
        _run(cfg, policy, engine)
        cells = [(t, layer) for t in range(6) for layer in range(3)]
        expected = [want[divmod(t * 3 + layer + ahead, 3)].tolist() for t, layer in cells if t * 3 + layer + ahead >= 0]
        assert policy.seen == expected, (hook, ahead)
    call = "trace_routed(0, 1)" if how == "trace_routed" else "trace_row('routed_weights', 0, 1)"
    with pytest.raises(PolicyError, match=rf"^policy peeks: {call.replace('(', '[(]').replace(')', '[)]')}: token 0, "
                                          r"MoE layer 1 has not routed yet \(the run has routed up to token 0, MoE "
                                          r"layer 0\); only a policy that sees_future_routing \(the oracle\)"):
        _run(cfg, _peeks("on_route", 1, how), engine)
    with pytest.raises(PolicyError, match=r"token 0, MoE layer 0 has not routed yet \(the run has routed nothing yet\)"):
        _run(cfg, _peeks("on_layer_start", 0, how), engine)


@pytest.mark.parametrize("array", ["routed_ids", "routed_weights", "router_rank", "router_rank_prob"])
def test_the_routing_arrays_are_not_handed_out_whole(cfg, array):
    with pytest.raises(PolicyError, match=rf"^policy peeks: trace_array\('{array}'\): '{array}' carries routing"):
        _run(cfg, _peeks("on_route", 0, array))
    oracle = _peeks("on_route", 1, array, oracle=True)  # the oracle reads it whole, ahead included
    _run(cfg, oracle)
    assert oracle.seen[0] == prepare(cfg, [], ["no-prefetch"]).trace[array][0, 1].tolist()


def test_a_policy_peeking_at_the_next_token_is_refused_through_the_cli(cfg, registered, capsys):
    @registered
    class NextToken(Policy):
        name = "test-next-token"

        def on_token_start(self, ctx, t):
            if t + 1 < ctx.num_tokens:
                ctx.trace_routed(t + 1, 0)

    err = _cli_error(capsys, ["run", cfg, "--policy", "test-next-token", "--jobs", "1"])
    assert err == ("chipsim: error: policy test-next-token: trace_routed(1, 0): token 1, MoE layer 0 has not routed "
                   "yet (the run has routed nothing yet); only a policy that sees_future_routing (the oracle) reads "
                   "routing ahead")


def test_only_the_oracle_sees_future_routing_and_the_oracle_still_runs(cfg, capsys):
    assert [name for name, cls in REGISTRY.items() if cls.sees_future_routing] == ["oracle"]
    assert main(["run", cfg, "--policy", "oracle", "--policy", "oracle:lookahead=0", "--jobs", "1", "--json",
                 "--set", "workload.max_tokens=6"]) == 0
    assert capsys.readouterr().err == ""


def test_trace_row_reads_only_what_trace_array_would(cfg):
    class Rows(Policy):
        name = "test-rows"

        def on_run_start(self, ctx):
            ctx.trace_row(self.key, 0, 0)

    for key, problem in (("promoe_rank", "trace array 'promoe_rank' is not a core array and not declared"),
                         ("moe_layers", "'moe_layers' is not a \\(token, MoE layer, ...\\) array")):
        policy = Rows("rows")
        policy.key = key
        with pytest.raises(PolicyError, match=rf"^policy rows: trace_row\('{key}'(, \.\.\.)?\): {problem}"):
            _run(cfg, policy, tokens=1)


def test_a_policy_receives_exactly_sim_context_never_the_engine(tiny):
    """The object a policy's hooks get (chipsim.sim.context.PolicyContext) has SimContext's members and nothing
    else: not the engine, its DMA queue, its buffer or its policy."""
    from chipsim.policies.base import SimContext
    from chipsim.sim.context import PolicyContext

    declared = {name for name in vars(SimContext) if not name.startswith("_")}
    public = {name for name in dir(PolicyContext) if not name.startswith("_")}
    assert public == declared
    prep = prepare(tiny.config(tiny.routing(4)), [], ["lru"])
    seen = []

    class Watch(Policy):
        name = "watch"

        def on_token_start(self, ctx, t):
            seen.append(ctx)

    Simulation(prep.config.hw, prep.workload, prep.trace, Watch("watch"), max_tokens=1).run()
    ctx = seen[0]
    assert type(ctx) is PolicyContext and not isinstance(ctx, Simulation)
    for engine_part in ("dma", "policy", "network", "env", "evict_at", "free_slots_of"):
        assert not hasattr(ctx, engine_part), engine_part
    with pytest.raises(AttributeError):
        ctx.num_experts = 3  # the run's set-up is read-only
