"""The contract between policies and the engine: policies use only the members `SimContext` declares (and
between them every one), read only the trace arrays they declare, and take parameters checked by the same
value checker as config keys."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import THOR

from chipsim.cli import main
from chipsim.errors import InputError
from chipsim.policies import REGISTRY
from chipsim.policies.base import LayerPlan, Param, Policy, PolicyError, SimContext, make_policy, phase_names
from chipsim.runner import prepare
from chipsim.sim.engine import Simulation
from chipsim.trace import format as tf
from chipsim.trace import predictor_arrays as pa

MEMBERS = {name for name in dir(SimContext) if not name.startswith("_")}
HOOKS = ("on_run_start", "on_token_start", "on_layer_start", "on_route", "on_layer_end", "choose_victims",
         "on_prefill_end")


class GuardedContext:
    """Hands a policy the simulation, but only the members SimContext declares; records which it used."""

    def __init__(self, sim, used: set):
        object.__setattr__(self, "_sim", sim)
        object.__setattr__(self, "_used", used)

    def __getattr__(self, name):
        assert name in MEMBERS, f"a policy used ctx.{name}, which SimContext does not declare"
        self._used.add(name)
        return getattr(self._sim, name)


class Guarded:
    """Wraps a policy so that each hook gets a GuardedContext instead of the Simulation itself."""

    def __init__(self, policy: Policy, used: set):
        self._policy, self._used = policy, used

    def __getattr__(self, name):
        attr = getattr(self._policy, name)
        if name not in HOOKS:
            return attr
        return lambda ctx, *args: attr(GuardedContext(ctx, self._used), *args)


def test_the_policies_use_exactly_the_members_simcontext_declares(tiny):
    """Every built-in policy on the tiny model (host CPU and surrogates included via SPICE's and Fiddler's
    paths) and on a bundled trace: no member outside SimContext, and every member used by some policy."""
    used: set = set()
    cfg = tiny.config(tiny.routing(8, seed=1), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    specs = phase_names("decode") + ["promoe:cache=false", "oracle:lookahead=0"]
    deepseek = THOR.replace("thor.yaml", "thor-deepseek-v2-lite.yaml")
    for config, overrides in ((cfg, []), (deepseek, ["workload.max_tokens=4"])):
        prep = prepare(config, overrides, specs)
        for policy in prep.policies:
            sim = Simulation(prep.config.hw, prep.workload, prep.trace, Guarded(policy, used),
                             max_tokens=prep.config.hw.workload.max_tokens)
            sim.run()
    # the prefill policies, each before a decode policy, on a request of two chunks
    prep = prepare(deepseek, ["workload.prompt_tokens=8", "workload.output_tokens=3", "workload.prefill_chunk_tokens=4"],
                   [f"{name}:keep=0.5+lru" for name in phase_names("prefill")] + ["layer-ahead:experts=predicted+apex"])
    for policy in prep.policies:
        Simulation(prep.config.hw, prep.workload, prep.trace, Guarded(policy, used), request=prep.request,
                   prefill_policy=Guarded(prep.prefill_for[policy.label], used)).run()
    assert used == MEMBERS, f"declared but used by no policy: {sorted(MEMBERS - used)}"


def test_a_policy_reading_an_array_it_does_not_declare_is_stopped(tiny):
    class Sneaky(Policy):
        name = "test-sneaky"

        def on_run_start(self, ctx):
            ctx.trace_array("promoe_rank")

    prep = prepare(tiny.config(), [], ["no-prefetch"])
    with pytest.raises(PolicyError, match="policy sneaky: trace_array\\('promoe_rank'\\): trace array 'promoe_rank' is "
                                          "not a core array and not declared in the policy's trace_arrays"):
        Simulation(prep.config.hw, prep.workload, prep.trace, Sneaky("sneaky")).run()


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_an_expert_the_model_does_not_have_is_never_in_the_buffer_and_cannot_be_fetched(tiny, engine):
    """The buffer keys experts by layer * experts + expert: an id outside 0..experts-1 must not alias another
    layer's expert. Asked about, it is absent; prefetched or executed, the policy is stopped, naming it."""
    from chipsim.sim.core import core_for

    engine_class = functools.partial(Simulation, core=core_for(engine))
    prep = prepare(tiny.config(), [], ["no-prefetch"])
    n = prep.workload.model.num_experts
    seen, layers_out = [], []

    class Asks(Policy):
        name = "test-asks"

        def on_layer_end(self, ctx, t, layer):
            if layer == 1:  # its experts are in the buffer until the default end evicts them
                for _, e in ctx.keys_of_layer(1):
                    # (0, n + e) and (2, e - n) would have layer 1's expert e's index
                    seen.append((ctx.present(1, e), ctx.resident(1, e), ctx.present(0, n + e),
                                 ctx.resident(0, n + e), ctx.present(2, e - n), ctx.resident(2, e - n)))
                    # no such expert, no such layer: nothing to do
                    ctx.evict(0, n + e)
                    ctx.evict(-1, e)
                    ctx.evict(ctx.num_moe_layers, e)
                    layers_out.append((ctx.present(-1, e), ctx.resident(ctx.num_moe_layers, e)))
            super().on_layer_end(ctx, t, layer)

    engine_class(prep.config.hw, prep.workload, prep.trace, Asks("asks"), max_tokens=2).run()
    assert seen and all(answers == (True, True, False, False, False, False) for answers in seen)
    assert layers_out and not any(any(answers) for answers in layers_out)

    class Prefetches(Policy):
        name = "test-prefetches"

        def on_layer_start(self, ctx, t, layer):
            ctx.prefetch(layer, n)

    with pytest.raises(PolicyError, match=rf"policy prefetches: prefetch\(0, {n}\): expert id {n} is out of range: the "
                                          f"model has experts 0..{n - 1}"):
        engine_class(prep.config.hw, prep.workload, prep.trace, Prefetches("prefetches"), max_tokens=2).run()

    class BeyondTheModel(Policy):
        name = "test-beyond"

        def on_layer_start(self, ctx, t, layer):
            ctx.prefetch(ctx.num_moe_layers, 0)

    layers = prep.workload.model.num_moe_layers
    with pytest.raises(PolicyError, match=rf"policy beyond: prefetch\({layers}, 0\): MoE layer {layers} is out of range: "
                                          f"the model has MoE layers 0..{layers - 1}"):
        engine_class(prep.config.hw, prep.workload, prep.trace, BeyondTheModel("beyond"), max_tokens=2).run()

    class Executes(Policy):
        name = "test-executes"

        def on_route(self, ctx, t, layer, routed):
            return LayerPlan(execute=[-1])

    with pytest.raises(PolicyError, match=r"policy executes: on_route\(0, 0\) -> LayerPlan.execute: expert id -1 is out "
                                          "of range"):
        engine_class(prep.config.hw, prep.workload, prep.trace, Executes("executes"), max_tokens=2).run()


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_cancel_unneeded_drops_only_this_layers_experts_still_on_their_way_and_names_them(tiny, engine):
    """At layer 1's routing, three of its experts and one of layer 2's are on their way (prefetched by layer 1's
    start, no time has passed) and one of layer 1's has arrived (prefetched a layer earlier). Keeping the first
    of the three drops the other two, returned in issue order; the arrived one and layer 2's stay."""
    from chipsim.sim.core import core_for

    engine_class = functools.partial(Simulation, core=core_for(engine))
    prep = prepare(tiny.config(), [], ["no-prefetch"])
    answers = []

    class Cancels(Policy):
        name = "test-cancels"
        caches_across_tokens = True

        def on_layer_start(self, ctx, t, layer):
            if t == 0 and layer == 0:
                ctx.prefetch(1, 0)
            if t == 0 and layer == 1:
                for e in (3, 1, 2):
                    ctx.prefetch(1, e)
                ctx.prefetch(2, 1)

        def on_route(self, ctx, t, layer, routed):
            if t == 0 and layer == 1:
                arrived = ctx.resident(1, 0)
                dropped = ctx.cancel_unneeded(1, [3])
                answers.append((arrived, dropped, sorted(e for _, e in ctx.keys_of_layer(1)), ctx.present(2, 1)))
            return LayerPlan(execute=list(routed))

        def choose_victims(self, ctx, layer, needed, count):
            return ctx.least_recently_used(count, [(layer, needed)])

    engine_class(prep.config.hw, prep.workload, prep.trace, Cancels("cancels"), max_tokens=1).run()
    assert answers == [(True, [1, 2], [0, 3], True)]


def test_a_trace_with_only_the_core_arrays_replays_every_policy_that_reads_nothing_more(tiny, capsys):
    """No predictor outputs at all, plus an array no policy reads: the policies that need nothing more run;
    one that needs a missing array is refused before anything runs, in one line naming it and the array."""

    def core_only(arrays, meta):
        for name in pa.BY_NAME:
            del arrays[name]
        arrays["someone_elses_predictor"] = np.zeros((6, 3), dtype=np.float32)

    cfg = tiny.config(edit=core_only)
    trace = prepare(cfg, [], ["no-prefetch"]).trace
    assert set(trace.arrays) == set(tf.CORE_ARRAYS) | {"someone_elses_predictor"}
    decode = set(phase_names("decode"))
    readers_of_nothing = [name for name, cls in sorted(REGISTRY.items()) if not cls.trace_arrays]
    assert {"no-prefetch", "oracle", "lru", "lfu", "on-demand", "fiddler-prefill"} <= set(readers_of_nothing)
    # a prefill policy runs a request's prompt, before a decode policy
    specs = [name if name in decode else f"{name}+no-prefetch" for name in readers_of_nothing]
    request = ["--set", "workload.prompt_tokens=2", "--set", "workload.output_tokens=2"]
    for names in ([s for s in specs if "+" not in s], [s for s in specs if "+" in s]):
        args = ["run", cfg, "--json", "--jobs", "1"] + [a for name in names for a in ("--policy", name)]
        assert main(args + (request if "+" in names[0] else [])) == 0
    capsys.readouterr()
    for name, cls in sorted(REGISTRY.items()):
        if not cls.trace_arrays:
            continue
        spec, more = (name, []) if name in decode else (f"{name}+no-prefetch", request)
        assert main(["run", cfg, "--policy", spec, *more]) == 2
        err = capsys.readouterr().err.strip()
        first = cls.trace_arrays[0].name
        assert err.count("\n") == 0 and f"policy {name} reads array '{first}'" in err, err


def test_every_declared_array_is_a_recorded_predictor_output():
    """What policies read is what the bundled recorder and generator write (a policy declaring an array no
    recorder makes could never run on a bundled trace)."""
    for name, cls in REGISTRY.items():
        for spec in cls.trace_arrays:
            assert pa.BY_NAME.get(spec.name) is spec, (name, spec.name)


@pytest.mark.parametrize("spec, message", [
    ("apex:tau=0", "policies.apex.tau: must be positive, got 0.0"),
    ("apex:tau=1.0", "policies.apex.tau: must be less than 1, got 1.0"),
    ("apex-sf:tau=1.5", "policies.apex-sf.tau: must be less than 1, got 1.5"),
    ("spice:lore_form=diagonal", "policies.spice.lore_form: must be one of residual, factored, got 'diagonal'"),
    ("spice:confidence=1.2", "policies.spice.confidence: must be at most 1, got 1.2"),
    ("promoe:cache=3", "policies.promoe.cache: expected true or false, got 3"),
    ("static:extra=-1", "policies.static.extra: must be at least 0, got -1"),
    ("floe:compression=.nan", "policies.floe.compression: must be finite, got nan"),
    ("lru:slots=2.5", "policies.lru.slots: expected an integer, got 2.5"),
])
def test_policy_parameters_are_checked_like_config_keys(spec, message):
    with pytest.raises(InputError) as err:
        make_policy(spec, {})
    assert str(err.value) == message


def test_the_same_bounds_hold_for_a_parameter_in_the_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: {THOR}\npolicies:\n  apex:\n    tau: 1.0\n")
    assert main(["run", str(cfg), "--policy", "no-prefetch"]) == 2
    assert capsys.readouterr().err.strip() == "chipsim: error: policies.apex.tau: must be less than 1, got 1.0"


def test_an_integral_float_is_an_integer_and_bounds_read_in_words():
    assert make_policy("static:extra=3.0", {}).params.extra == 3
    assert Param(float, 0.5, "", minimum=0, maximum=1, min_exclusive=True).bounds.describe() == "0 < x <= 1"
    assert Param(int, 1, "", minimum=1).bounds.describe() == "x >= 1"
    assert Param(str, "a", "", choices=("a", "b")).bounds.describe() == "one of a, b"
