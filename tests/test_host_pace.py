"""The host's pace (host_frontend.launch_issue_ns, copy_issue_ns, event_issue_ns, launch_queue_depth;
chipsim.sim.host_pace): one host thread enqueues every launch, copy and event in program order, each at its own cost,
and the machine starts nothing it has not enqueued. Checked by hand on the tiny model."""

import subprocess
import sys

import pytest
from conftest import IN_PLACE, native_core

from chipsim.runner import prepare, simulate
from chipsim.sim.engine import Simulation
from chipsim.sim.host_pace import HostPace
from chipsim.sim.work import cost_of
from chipsim.units import ns_to_ps

ENGINES = ("fast", "reference")


def _pace(launch_ns=0, copy_ns=0, event_ns=0, depth=0):
    return [f"host_frontend.launch_issue_ns={launch_ns}", f"host_frontend.copy_issue_ns={copy_ns}",
            f"host_frontend.event_issue_ns={event_ns}", f"host_frontend.launch_queue_depth={depth}"]


def _run(cfg, sets, policy, engine):
    prep = prepare(cfg, sets + [f"run.engine={engine}"], [policy])
    return prep, simulate(prep, prep.policies[0])


def _in_place_work(cfg):
    """(a token's work by hand, its head's): per layer attention and router, then its top-k experts and the weighted
    sum (tests/test_components.py)."""
    prep = prepare(cfg, ["dma.setup_ns=0"], ["no-prefetch"])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    k = prep.workload.model.top_k
    head = cost_of(prep.workload.token_head).ps
    return head + sum(c.pre.ps + (c.dense + c.expert.times(k) + c.combine).ps for c in sim._layer_costs()), head


def test_a_host_slower_than_the_machine_sets_the_pace(tiny):
    """1 ms per launch, far above any op group's time: the host enqueues a token's 16 launches (per layer 2 for
    attention and router, 3 for the two experts and the weighted sum; 1 for the head) one after another, and each
    run of compute ends its share of work after its last launch is enqueued. So the first token ends at 16 ms and
    the head's work, every later one lasts 16 ms exactly, and all the rest is the arrays waiting for the host
    (a stall)."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    work, head = _in_place_work(cfg)
    launch = ns_to_ps(1_000_000)
    native_core()
    for engine in ENGINES:
        _, result = _run(cfg, ["dma.setup_ns=0"] + _pace(launch_ns=1_000_000), "no-prefetch", engine)
        latency = result.per_token.latency_ps.tolist()
        assert latency[0] == 16 * launch + head
        assert set(latency[1:]) == {16 * launch}
        assert (result.per_token.stall_ps == result.per_token.latency_ps - work).all()
        assert (result.per_token.idle_ps == result.per_token.stall_ps).all()


def test_a_host_ahead_of_the_machine_costs_only_its_first_launch(tiny):
    """100 ns per launch, 50 per copy or event, far below any op group's time: the machine waits for the host once,
    for the very first launch; from then on the host is ahead and every token is its work alone."""
    cfg = tiny.config(tiny.routing(), extra_yaml=IN_PLACE)
    work, _ = _in_place_work(cfg)
    for engine in ENGINES:
        _, result = _run(cfg, ["dma.setup_ns=0"] + _pace(100, 50, 50, 1021), "no-prefetch", engine)
        latency = result.per_token.latency_ps.tolist()
        assert latency[0] == work + ns_to_ps(100)
        assert set(latency[1:]) == {work}


def test_copies_start_no_earlier_than_the_host_enqueues_them(tiny):
    """No-prefetch fetches both routed experts of every layer (tests/test_host_frontend.py). With 1 ms per copy,
    far above everything else, and launches and events free, the host enqueues each expert's parts (one copy each)
    one after another, and each transfer starts only once its own are enqueued: from the second token on, a token
    lasts exactly its six experts' copies on the host."""
    cfg = tiny.config(tiny.routing())
    copy = ns_to_ps(1_000_000)
    for engine in ENGINES:
        prep, result = _run(cfg, _pace(copy_ns=1_000_000), "no-prefetch", engine)
        parts = len(prep.policies[0].expert_format(prep.workload, prep.config.hw).part_bytes)
        assert result.counts.fetches_total == 6 * len(result.per_token.latency_ps)
        latency = result.per_token.latency_ps.tolist()
        assert latency[0] > 6 * parts * copy
        assert set(latency[1:]) == {6 * parts * copy}


def test_the_launch_queue_holds_at_most_its_depth():
    """HostPace by hand: 10 per launch, a queue of 2. The first two launches are enqueued at once (0-10, 10-20);
    the third may enter only once the machine has reached the first (at 100), the fourth the second (at 200); a
    call of two launches waits for the step two before its last."""
    pace = HostPace(10, 0, 0, 2)
    assert pace.enqueue(1, 0, 0) == (0, 10)
    pace.reached(1, 100)
    assert pace.enqueue(1, 0, 0) == (10, 20)
    pace.reached(1, 200)
    assert pace.enqueue(1, 0, 0) == (100, 110)
    pace.reached(1, 300)
    assert pace.enqueue(2, 0, 0) == (300, 320)  # its last needs the one reached at 300 (two before it)
    unbounded = HostPace(10, 0, 0, 0)
    for _ in range(5):
        unbounded.reached(1, 10**6)
        start, done = unbounded.enqueue(1, 0, 0)
    assert (start, done, unbounded.busy_ps) == (40, 50, 50)


def test_a_shallow_launch_queue_slows_a_host_that_was_ahead(tiny):
    """No-prefetch with 0.5 µs per launch: with room in the queue the host is ahead (while a layer's copies move it
    has already enqueued the layer's experts), so a token after the first is exactly as without the host. With room
    for one step it may enqueue a run of compute only once the machine has reached the step before, so the arrays
    wait for it after their fetches land. A queue deeper than the run's steps is unbounded."""
    cfg = tiny.config(tiny.routing())
    _, base = _run(cfg, [], "no-prefetch", "fast")
    runs = {}
    for depth in (0, 1, 10**6):
        _, result = _run(cfg, _pace(launch_ns=500, depth=depth), "no-prefetch", "fast")
        runs[depth] = result.per_token.latency_ps.tolist()
    assert runs[0] == runs[10**6]
    assert runs[0][0] == base.per_token.latency_ps[0] + ns_to_ps(500)  # the first launch
    assert runs[0][1:] == base.per_token.latency_ps.tolist()[1:]
    assert all(a > b for a, b in zip(runs[1][1:], runs[0][1:]))


def test_the_pace_is_the_same_on_both_engines_with_fetches_and_prefetches(tiny):
    """Both engines, with a queue shallow enough to hold the host back (its results differ from an unbounded
    queue's, so the check covers the gate)."""
    native_core()
    cfg = tiny.config(tiny.routing(tokens=8), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    for policy in ("promoe", "lru", "oracle"):
        _, unbounded = _run(cfg, _pace(3000, 4000, 700, 0), policy, "fast")
        _, fast = _run(cfg, _pace(3000, 4000, 700, 2), policy, "fast")
        _, ref = _run(cfg, _pace(3000, 4000, 700, 2), policy, "reference")
        assert (fast.per_token.latency_ps != unbounded.per_token.latency_ps).any(), policy
        assert (fast.per_token.latency_ps == ref.per_token.latency_ps).all(), policy
        assert (fast.per_token.stall_ps == ref.per_token.stall_ps).all(), policy


@pytest.mark.parametrize("key", ["launch_issue_ns", "copy_issue_ns", "event_issue_ns", "launch_queue_depth"])
def test_a_negative_pace_key_is_one_line_naming_it(thor_path, key):
    out = subprocess.run([sys.executable, "-m", "chipsim.cli", "run", thor_path, "--policy", "no-prefetch",
                          "--set", f"host_frontend.{key}=-1"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and f"host_frontend.{key}" in out.stderr, out.stderr


def _probe(distinct=True):
    costs = {"graph_launch": 2.5, "pinned_copy_64kib": 3.7, "event_record": 0.7, "stream_wait_event": 0.8,
             "graph_launch_8_kernels": 2.6, "graph_launch_32_kernels": 2.7}
    if distinct:
        costs.update(graph_launch_distinct=12.0, pinned_copy_64kib_distinct=5.0)
    issue = {k: {"host_us_per_call": v} for k, v in costs.items()}
    issue["cudart"] = {k: {"host_us_per_call": v / 2} for k, v in costs.items()}
    return {"issue_costs": issue, "launch_queue": {"graph_launch": {"enqueued_before_blocking": 1021}}}


def test_gpuconfig_writes_the_pace_keys_from_the_probe():
    """A launch and a copy as a program makes them (distinct graphs and buffers) where the probe has them, else the
    same call repeated; an event the mean of a record and a wait; the queue's depth as measured; PyTorch's calls or
    the runtime's."""
    import yaml

    from chipsim.hwreplay.gpuconfig import host_pace_text

    keys = yaml.safe_load("host_frontend:\n" + host_pace_text(_probe(), "p.json", "torch"))["host_frontend"]
    assert keys == {"launch_issue_ns": 12000.0, "copy_issue_ns": 5000.0, "event_issue_ns": 750.0,
                    "launch_queue_depth": 1021}
    keys = yaml.safe_load("host_frontend:\n" + host_pace_text(_probe(False), "p.json", "cudart"))["host_frontend"]
    assert keys == {"launch_issue_ns": 1250.0, "copy_issue_ns": 1850.0, "event_issue_ns": 375.0,
                    "launch_queue_depth": 1021}


def test_gpuconfig_refuses_a_probe_without_issue_costs_in_one_line():
    from chipsim.errors import InputError
    from chipsim.hwreplay.gpuconfig import host_pace_text

    probe = _probe()
    del probe["issue_costs"]["event_record"]
    with pytest.raises(InputError, match=r"^p\.json: no issue costs through PyTorch .* in this front-end probe"):
        host_pace_text(probe, "p.json", "torch")
    probe = _probe()
    probe["launch_queue"]["graph_launch"]["enqueued_before_blocking"] = 0
    with pytest.raises(InputError, match=r"^p\.json: the issue costs and the launch queue's run-ahead must be positive$"):
        host_pace_text(probe, "p.json", "torch")


def test_each_event_the_host_enqueues_is_counted(tiny):
    """1 ms per event, launches and copies free: per MoE layer the host records the issue point of its demand
    fetches, and per fetch has the copy stream wait for it and records the copy's end (2 x 2), and the arrays wait
    for each fetched expert (2): 7 events a layer, 21 a token and its end's: from the second token on, 22 ms a
    token."""
    cfg = tiny.config(tiny.routing())
    for engine in ENGINES:
        _, result = _run(cfg, _pace(event_ns=1_000_000), "no-prefetch", engine)
        assert set(result.per_token.latency_ps.tolist()[1:]) == {22 * ns_to_ps(1_000_000)}


@pytest.mark.parametrize("policy, launch_per", [("lru", "segment"), ("promoe", "segment"), ("lru", "op_group"),
                                                ("oracle", "op_group")])
def test_the_host_enqueues_the_replay_programs_copies_events_and_launches(tiny, policy, launch_per):
    """Counted two ways, independently: the simulator's host as it runs (HostPace's tallies), and the GPU replay's
    program built from the same plan on the CPU (chipsim.hwreplay.harness): every copy call, every event recorded
    or waited for (program steps less runs of compute, plus each copy span's wait and record in one step), and with
    segments every launch."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.ops import primitive_ops
    from chipsim.hwreplay.plan import build_plan

    cfg = tiny.config(tiny.routing(tokens=6), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    sets = _pace(1000, 1000, 1000) + [f"compute.launch_per={launch_per}", "compute.op_group_launch_ns=2000",
                                      "dma.engines=1", "dma.demand_first=false", "dma.demand_preempts_prefetch=false",
                                      "dma.cancel_in_flight=false"]
    prep = prepare(cfg, sets, [policy])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    sim.run()
    pace = sim._pace
    plan = build_plan(prep, prep.policies[0])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    res = replay(plan, step, host, slots, m.first_dense_layers, segments=launch_per == "segment")
    compute_steps = round(res["compute_steps_per_token"] * plan.tokens)
    assert plan.fetches > 0
    assert pace.copies == res["copies"]
    assert pace.events == res["program_steps"] - compute_steps + plan.fetches
    if launch_per == "segment":
        assert pace.launches == compute_steps


def test_op_spans_time_every_compute_step_and_label_it(tiny):
    """hwreplay --op-spans on a CPU dry run: per token, as many spans as runs of compute, and the spans by op-group
    label add up to the token's."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.ops import primitive_ops
    from chipsim.hwreplay.plan import build_plan

    cfg = tiny.config(tiny.routing(tokens=4), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    prep = prepare(cfg, [], ["lru"])
    plan = build_plan(prep, prep.policies[0])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
    slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
    for segments in (False, True):
        res = replay(plan, step, host, slots, m.first_dense_layers, segments=segments, op_spans=True)
        spans, kinds = res["op_span_ms"], res["op_span_kinds"]
        assert len(spans) == plan.tokens
        assert sum(n for _, n in spans) == round(res["compute_steps_per_token"] * plan.tokens)
        assert set(kinds) <= {"+".join(sorted(c)) for c in _label_sets()} and "expert" in "".join(kinds)
        for t, (ms, _) in enumerate(spans):
            assert abs(sum(v[t] for v in kinds.values()) - ms) < 1e-3
        assert "op_span_ms" not in replay(plan, step, host, slots, m.first_dense_layers, segments=segments)


def _label_sets():
    """Every set of op group names a run of compute may hold."""
    from itertools import combinations

    names = ("attention", "router", "shared", "expert", "combine", "head", "dense")
    return [set(c) for n in range(1, len(names) + 1) for c in combinations(names, n)]
