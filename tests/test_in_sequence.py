"""compute.in_sequence_ns: what a decode step's op group adds run back to back after other groups' kernels, over its
kernels each timed alone (validation/compute/probe_step_costs.py: a step kind's chain less its kernels alone).
Checked by hand on the tiny model (3 MoE layers, top-2, 8 experts), its experts read where they are stored, so a
token is its op groups one after another and nothing else."""

import pytest
from conftest import IN_PLACE, native_core

from chipsim.errors import InputError
from chipsim.hw.compute_formula import ArrayModel
from chipsim.hw.config import OP_GROUPS
from chipsim.runner import prepare, simulate
from chipsim.units import ns_to_ps
from chipsim.workload.decode import op_group_builders
from chipsim.workload.models import model_of

ENGINES = ("fast", "reference")
MS = 1_000_000  # ns


def _run(cfg, sets, engine, policy="no-prefetch"):
    prep = prepare(cfg, sets + [f"run.engine={engine}"], [policy])
    return simulate(prep, prep.policies[0])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("launch_per", ["op_group", "segment"])
def test_each_group_pays_its_cost_each_time_it_runs(tiny, engine, launch_per):
    """1 ms more per expert adds 3 layers x 2 experts = 6 ms to every token; 1 ms per attention 3 ms, per router 3,
    per weighted sum 3, per head 1: 16 ms a token with all five, whichever launch granularity. The key is time only:
    the arrays' operation-weighted (occupied) time does not move."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    if engine == "fast":
        native_core()
    base_sets = [f"compute.launch_per={launch_per}", "compute.op_group_launch_ns=1000"]
    base = _run(cfg, base_sets, engine)
    for groups, added_ms in ((("expert",), 6), (("attention",), 3), (("router",), 3), (("combine",), 3),
                             (("head",), 1), (("expert", "attention", "router", "combine", "head"), 16)):
        sets = base_sets + [f"compute.in_sequence_ns.{g}={MS}" for g in groups]
        more = _run(cfg, sets, engine)
        added = (more.per_token.latency_ps - base.per_token.latency_ps).tolist()
        assert added == [added_ms * ns_to_ps(MS)] * len(added), groups
        assert (more.per_token.occupied_ps == base.per_token.occupied_ps).all()


def test_a_group_the_model_lacks_changes_nothing(tiny):
    """The tiny model has no Mamba mixer, shared expert or dense first layer: their keys cost no token anything."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    base = _run(cfg, [], "reference")
    more = _run(cfg, [f"compute.in_sequence_ns.{g}={MS}" for g in ("mamba", "shared", "dense")], "reference")
    assert more.per_token.latency_ps.tolist() == base.per_token.latency_ps.tolist()


def test_the_key_names_every_op_group_the_decode_step_builds(tiny):
    """OP_GROUPS (the names the key may take) is exactly the set of groups op_group_builders builds."""
    prep = prepare(tiny.config(tiny.routing()), [], ["no-prefetch"])
    hw = prep.config.hw
    assert set(op_group_builders(ArrayModel(hw), model_of(hw.model), hw)) == set(OP_GROUPS)


def test_an_unknown_group_is_refused_naming_the_key(tiny):
    """A name that is not an op group is refused on loading, naming the dotted key and the names it may take."""
    cfg = tiny.config(tiny.routing())
    with pytest.raises(InputError, match=r"^compute.in_sequence_ns.experts: not an op group \(expected one of: "
                                         r"attention, attention_sliding, mamba, dense, router, shared, expert, "):
        prepare(cfg, ["compute.in_sequence_ns.experts=5"], ["no-prefetch"])
