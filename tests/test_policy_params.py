"""Typed policy parameters: each registered policy's frozen dataclass is what the config and --policy set, and the
policy holds one instance of it as `self.params`."""

from __future__ import annotations

import dataclasses

import pytest

from chipsim.errors import InputError
from chipsim.policies import REGISTRY
from chipsim.policies.apex import ApexParams
from chipsim.policies.base import NoParams, Policy, make_policy, param, param_specs
from chipsim.policies.caching import AdapMoEParams, CacheParams
from chipsim.policies.spice import SpiceParams

# what each registry entry accepts, written out by hand (the order is the order `chipsim policies` lists them in)
ACCEPTED = {
    "adapmoe": ["slots", "warmup", "gate_threshold"],
    "apex": ["tau", "max_extra", "complete_unpicked"],
    "apex-sf": ["tau", "max_extra", "complete_unpicked"],
    "cg-moe": ["slots", "warmup"],
    "deepspeed-mii": [],
    "fiddler": ["slots", "warmup"],
    "fiddler-prefill": ["keep"],
    "floe": ["compression", "sparsity"],
    "layer-ahead": ["keep", "experts"],
    "lfu": ["slots", "warmup"],
    "lru": ["slots", "warmup"],
    "mixtral-offloading": ["slots", "warmup", "bits", "group", "scale_bits"],
    "no-prefetch": [],
    "on-demand": ["keep"],
    "oracle": ["lookahead"],
    "pregated": ["lookahead"],
    "promoe": ["slots", "cache", "warmup"],
    "spice": ["confidence", "max_depth", "slots", "lore_rank", "lore_form", "deep", "cpu_fallback", "surrogate",
              "schedule", "warmup"],
    "static": ["extra", "complete_unpicked"],
}


def _annotated_params_type(cls: type) -> str:
    """The annotation of `params` a type checker sees on this class (the nearest class that declares it)."""
    for klass in cls.__mro__:
        if "params" in klass.__dict__.get("__annotations__", {}):
            return klass.__dict__["__annotations__"]["params"]
    raise AssertionError(f"{cls.__name__} declares no params annotation")


def test_every_registered_policy_is_covered_here():
    assert sorted(REGISTRY) == sorted(ACCEPTED)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_the_dataclass_has_exactly_the_fields_the_policy_accepts(name):
    cls = REGISTRY[name]
    fields = [f.name for f in dataclasses.fields(cls.Params)]
    assert fields == ACCEPTED[name] == list(cls.param_specs())
    # what the type checker is told `self.params` is, is the dataclass make_policy builds
    assert _annotated_params_type(cls) == cls.Params.__name__
    # each field typed, and its default is a value its own bounds accept
    for key, spec in cls.param_specs().items():
        assert spec.type in (int, float, bool, str)
        assert spec.check(f"policies.{name}.{key}", spec.default) == spec.default
        assert make_policy(f"{name}:{key}={str(spec.default).lower()}", {}).params == cls.Params()
    known = ", ".join(ACCEPTED[name]) or "none"
    with pytest.raises(InputError, match=f"^policies.{name}.bogus: unknown parameter \\(known: {known}\\)$"):
        make_policy(f"{name}:bogus=1", {})


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_defaults_come_through_to_the_policy(name):
    cls = REGISTRY[name]
    policy = make_policy(name, {})
    assert type(policy.params) is cls.Params
    for key, spec in cls.param_specs().items():
        value = getattr(policy.params, key)
        assert value == spec.default and type(value) is spec.type


def test_declared_defaults_by_hand():
    assert make_policy("apex", {}).params == ApexParams(tau=0.9, max_extra=-1, complete_unpicked=False)
    assert make_policy("lru", {}).params == CacheParams(slots=0, warmup=16)
    assert make_policy("adapmoe", {}).params == AdapMoEParams(slots=0, warmup=16, gate_threshold=0.9)
    spice = make_policy("spice", {}).params
    assert (spice.confidence, spice.max_depth, spice.lore_rank, spice.lore_form, spice.warmup) == (
        0.7, 8, 16, "residual", 4)
    assert make_policy("no-prefetch", {}).params == NoParams()


def test_a_value_from_the_config_and_from_policy_reaches_the_instance():
    assert make_policy("apex", {"apex": {"tau": 0.6}}).params.tau == 0.6
    assert make_policy("apex:tau=0.6", {}).params.tau == 0.6
    # --policy beats the config; apex-sf reads its family's section first, then its own
    assert make_policy("apex:tau=0.7", {"apex": {"tau": 0.6}}).params.tau == 0.7
    assert make_policy("apex-sf", {"apex": {"tau": 0.6, "max_extra": 3}, "apex-sf": {"tau": 0.8}}).params == \
        ApexParams(tau=0.8, max_extra=3, complete_unpicked=False)
    # the shorthand, and a value converted by the checker (3.0 is the integer 3)
    assert make_policy("static-6", {}).params.extra == 6
    assert make_policy("static:extra=3.0", {}).params.extra == 3
    assert type(make_policy("static:extra=3.0", {}).params.extra) is int
    spice = make_policy("spice:deep=false,lore_form=factored", {"spice": {"confidence": 0.5, "deep": True}}).params
    assert spice == SpiceParams(confidence=0.5, deep=False, lore_form="factored")
    promoe = make_policy("promoe", {"promoe": {"cache": False}})
    assert promoe.params.cache is False and not promoe.caches_across_tokens


def test_complete_unpicked_sets_the_engine_facing_flag():
    assert make_policy("static:complete_unpicked=true", {}).complete_unpicked is True
    assert make_policy("static", {}).complete_unpicked is False
    assert make_policy("apex-sf", {"apex": {"complete_unpicked": True}}).complete_unpicked is True


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_the_parameters_are_frozen(name):
    cls = REGISTRY[name]
    assert cls.Params.__dataclass_params__.frozen
    policy = make_policy(name, {})
    for key in ACCEPTED[name]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(policy.params, key, getattr(policy.params, key))


def test_a_policy_built_directly_gets_its_defaults_or_refuses_another_dataclass():
    assert REGISTRY["apex"]("apex").params == ApexParams()
    assert REGISTRY["apex"]("apex", ApexParams(tau=0.5)).params.tau == 0.5
    with pytest.raises(TypeError, match="parameters must be a ApexParams, got CacheParams"):
        REGISTRY["apex"]("apex", CacheParams())


def test_a_parameter_dataclass_must_be_frozen_and_declare_each_field_with_param():
    @dataclasses.dataclass
    class Loose:
        depth: int = param(2, "layers ahead")

    @dataclasses.dataclass(frozen=True)
    class Bare:
        depth: int = 2

    with pytest.raises(TypeError, match="must be a frozen dataclass"):
        param_specs(Loose)
    with pytest.raises(TypeError, match=r"Bare.depth: declare a policy parameter with param\(...\)"):
        param_specs(Bare)

    @dataclasses.dataclass(frozen=True)
    class DepthParams:
        depth: int = param(2, "layers ahead to prefetch", minimum=1, maximum=8)

    class Deep(Policy):
        name = "test-deep"
        Params = DepthParams
        params: DepthParams

    spec = Deep.param_specs()["depth"]
    assert (spec.type, spec.default, spec.doc, spec.bounds.describe()) == (int, 2, "layers ahead to prefetch",
                                                                           "1 <= x <= 8")
    assert Deep("deep").params.depth == 2
