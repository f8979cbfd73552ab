"""compute.launch_beside_copy_ns: a launch the machine starts while a copy is in flight costs that much more (a GPU's
front end serving the copy stream beside the compute stream; validation/compute/probe_step_costs.py). Checked by hand
on the tiny model (3 MoE layers, top-2, 8 experts)."""

import pytest
from conftest import IN_PLACE, native_core

from chipsim.runner import prepare, simulate
from chipsim.units import ns_to_ps

ENGINES = ("fast", "reference")
MS = 1_000_000  # ns


def _latency(cfg, sets, engine):
    prep = prepare(cfg, sets + [f"run.engine={engine}"], ["no-prefetch"])
    return simulate(prep, prep.policies[0]).per_token.latency_ps.tolist()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("launch_per", ["op_group", "segment"])
def test_one_launch_a_layer_starts_beside_a_copy_under_no_prefetch(tiny, launch_per, engine):
    """No-prefetch fetches a layer's two routed experts at its routing, one after the other on one DMA engine.
    The first expert's launch starts while the second's copy flows; the second's (with the weighted sum) and the
    next layer's attention start with no copy in flight. With 1 and 2 ms per launch beside a copy, far above every
    copy and op group, that launch sets the layer's pace, so each further ms adds exactly one ms per MoE layer: 3 ms
    a token, every token, in either engine and for either launch granularity (a copy counts as in flight from its
    issue to its landing)."""
    cfg = tiny.config(tiny.routing())
    if engine == "fast":
        native_core()
    base = [f"compute.launch_per={launch_per}", "compute.op_group_launch_ns=1000", "dma.engines=1"]
    one = _latency(cfg, base + [f"compute.launch_beside_copy_ns={MS}"], engine)
    two = _latency(cfg, base + [f"compute.launch_beside_copy_ns={2 * MS}"], engine)
    assert [b - a for a, b in zip(one, two)] == [3 * ns_to_ps(MS)] * len(one)


def test_launches_with_no_copy_in_flight_cost_nothing_more(tiny):
    """Experts read where they are stored (nothing is ever copied): the key changes no token."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    for engine in ENGINES:
        assert (_latency(cfg, [f"compute.launch_beside_copy_ns={MS}"], engine)
                == _latency(cfg, [], engine))


def test_a_cheap_launch_beside_a_copy_hides_under_the_copy(tiny):
    """1 ns more per launch beside a copy: the first expert still finishes before the second lands, so the token
    is unchanged (the copy, not the launch, sets the pace)."""
    cfg = tiny.config(tiny.routing())
    for engine in ENGINES:
        assert (_latency(cfg, ["dma.engines=1", "compute.launch_beside_copy_ns=1"], engine)
                == _latency(cfg, ["dma.engines=1"], engine))
