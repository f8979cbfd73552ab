"""Hand checks of the shared-resource flow model (chipsim.sim.flows): what a hardware engineer computes on paper."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from chipsim.sim.flows import PPM, READ, WRITE, FlowNetwork
from chipsim.units import PS_PER_S
from conftest import native_core

Environment = simpy.Environment  # the reference's clock; the native core's classes run on its own Loop


@pytest.fixture(params=["reference", "native"], autouse=True)
def engine(request, monkeypatch):
    """Every check here runs on the engine of record's FlowNetwork (on SimPy) and on the native event core's
    (chipsim.sim.native, where the install built it): the same network, checked against the same hand sums."""
    if request.param == "native":
        native = native_core()
        monkeypatch.setitem(globals(), "FlowNetwork", native.FlowNetwork)
        monkeypatch.setitem(globals(), "Environment", native.Loop)
    return request.param


GB = 10**9


def network(capacities: dict[str, int], turnaround: dict[str, float] | None = None):
    env = Environment()
    names = list(capacities)
    ppm = [round((turnaround or {}).get(n, 0.0) * PPM) for n in names]
    return env, FlowNetwork(env, names, [capacities[n] for n in names], ppm)


def finish_times(env, net, specs):
    """specs: (start ps, bytes, [(resource, WRITE?)...], level, cap); returns each flow's finish time (ps)."""
    done = {}

    def starter(i, start, nbytes, hops, level, cap):
        yield env.timeout(start)
        net.add(nbytes, net.path(*hops), level, cap, on_target=lambda f, i=i: done.__setitem__(i, env.now))

    for i, spec in enumerate(specs):
        env.process(starter(i, *spec))
    env.run()
    return [done[i] for i in range(len(specs))]


def test_one_flow_on_an_idle_resource_takes_n_over_b():
    env, net = network({"hbm": 800 * GB})
    assert finish_times(env, net, [(0, 4 << 20, [("hbm", READ)], 0, 0)]) == [-(-(4 << 20) * PS_PER_S // (800 * GB))]


def test_two_equal_flows_sharing_a_resource_each_take_twice_as_long():
    env, net = network({"hbm": 800 * GB})
    n = 8 * 10**6  # 8 MB: 10 us alone, 20 us shared
    assert finish_times(env, net, [(0, n, [("hbm", READ)], 0, 0), (0, n, [("hbm", WRITE)], 0, 0)]) == [20_000_000] * 2


def test_a_flow_limited_elsewhere_leaves_the_rest_to_the_others():
    """A fetch capped by PCIe (100 GB/s) writes HBM (800 GB/s) while an operand stream reads it: the stream
    gets 700 GB/s, not 800 (the bandwidth is not used twice)."""
    env, net = network({"pcie": 100 * GB, "hbm": 800 * GB})
    fetch = net.add(10**9, net.path(("pcie", READ), ("hbm", WRITE)))
    stream = net.add(10**9, net.path(("hbm", READ)))
    assert (fetch.rate, stream.rate) == (100 * GB, 700 * GB)
    # an operand stream of 7 MB overlapping the fetch: 10 us instead of 8.75 us alone
    env, net = network({"pcie": 100 * GB, "hbm": 800 * GB})
    times = finish_times(env, net, [(0, 10**7, [("pcie", READ), ("hbm", WRITE)], 0, 0), (0, 7 * 10**6, [("hbm", READ)], 0, 0)])
    assert times == [100_000_000, 10_000_000]


def test_read_write_turnaround_charges_written_bytes_more_while_both_directions_run():
    env, net = network({"pcie": 100 * GB, "hbm": 800 * GB}, {"hbm": 0.25})
    fetch = net.add(10**9, net.path(("pcie", READ), ("hbm", WRITE)))
    assert fetch.rate == 100 * GB  # writes alone: no turnaround
    stream = net.add(10**9, net.path(("hbm", READ)))
    assert (fetch.rate, stream.rate) == (100 * GB, 800 * GB - 125 * GB)
    net.remove(fetch)
    assert stream.rate == 800 * GB


def test_a_higher_level_goes_first_and_the_lower_gets_what_is_left():
    env, net = network({"pcie": 100 * GB})
    n = 10**6  # 10 us alone
    times = finish_times(env, net, [(0, n, [("pcie", READ)], 1, 0), (0, n, [("pcie", READ)], 0, 0)])
    assert times == [20_000_000, 10_000_000]  # the prefetch (level 1) waits for the demand (level 0)


def test_a_capped_flow_runs_at_its_cap_and_the_others_share_the_rest():
    env, net = network({"hbm": 800 * GB})
    slow = net.add(10**9, net.path(("hbm", READ)), cap=50 * GB)
    a = net.add(10**9, net.path(("hbm", READ)))
    b = net.add(10**9, net.path(("hbm", WRITE)))
    assert (slow.rate, a.rate, b.rate) == (50 * GB, 375 * GB, 375 * GB)


def test_a_late_flow_slows_the_first_from_when_it_starts():
    """A: 2 MB alone on 100 GB/s from 0; B: 1 MB from 10 us. At 10 us A has 1 MB left; both share 50 GB/s:
    both end at 30 us."""
    env, net = network({"pcie": 100 * GB})
    assert finish_times(env, net, [(0, 2 * 10**6, [("pcie", READ)], 0, 0),
                                   (10_000_000, 10**6, [("pcie", READ)], 0, 0)]) == [30_000_000, 30_000_000]


def test_a_target_pauses_a_flow_and_resume_finishes_it_where_it_would_have():
    env, net = network({"pcie": 100 * GB})
    log = []

    def paused(flow):
        log.append(("paused", env.now, flow.remaining_bytes))
        flow.on_target = lambda f: log.append(("done", env.now, f.remaining_bytes))
        net.resume(flow)

    flow = net.add(10**6, net.path(("pcie", READ)), on_target=paused)
    net.set_target(flow, 6 * 10**5 * PS_PER_S)  # stop with 600 kB left
    env.run()
    assert log == [("paused", 4_000_000, 600_000), ("done", 10_000_000, 0)]


def test_the_same_combination_of_flows_is_solved_once():
    env, net = network({"pcie": 100 * GB, "hbm": 800 * GB})
    for _ in range(5):
        a = net.add(10**6, net.path(("pcie", READ), ("hbm", WRITE)))
        b = net.add(10**6, net.path(("hbm", READ)))
        net.remove(a)
        net.remove(b)
    assert net.allocations == 3  # {fetch}, {fetch, stream}, {stream}; then only memo hits


def test_random_flow_sets_are_feasible_and_max_min_fair():
    """Every resource carries no more than its capacity, and every flow is held back by something: its cap,
    or a full resource on its path where no flow of its level gets more."""
    rng = np.random.default_rng(7)
    names = ["lpddr", "pcie", "ucie", "hbm"]
    for _ in range(200):
        caps = [int(c) * GB for c in rng.integers(20, 900, size=4)]
        env = Environment()
        net = FlowNetwork(env, names, caps, [0, 0, 0, int(rng.integers(0, 400_000))])
        with net.batch():
            for _ in range(int(rng.integers(1, 8))):
                hops = sorted(rng.choice(4, size=int(rng.integers(1, 4)), replace=False))
                path = tuple((int(r), bool(rng.integers(0, 2))) for r in hops)
                cap = int(rng.integers(1, 600)) * GB if rng.random() < 0.3 else 0
                net.add(10**6, path, int(rng.integers(0, 2)), cap)
        flows = net.flows
        reads = {r for f in flows for r, w in f.path if not w}
        used = [0] * 4
        for f in flows:
            for r, w in f.path:
                used[r] += f.rate * (PPM + (net.turnaround_ppm[r] if w and r in reads else 0))
        assert all(used[r] <= caps[r] * PPM for r in range(4))
        for f in flows:
            if f.cap and f.rate == f.cap:
                continue
            full = [r for r, _ in f.path if caps[r] * PPM - used[r] < 2 * PPM * len(flows)]
            assert any(all(g.rate <= f.rate for g in flows if g.level == f.level and any(q == r for q, _ in g.path))
                       for r in full), (caps, [(g.path, g.level, g.cap, g.rate) for g in flows])


def test_bad_resources_are_refused():
    with pytest.raises(ValueError):
        FlowNetwork(Environment(), ["hbm"], [0])


def test_the_host_cpu_and_a_fetch_together_never_exceed_the_lpddr5x():
    """thor's numbers: LPDDR5X 253.5 GB/s effective; a fetch limited to 112.7 GB/s by PCIe and a host-CPU weight
    read capped at 200 GB/s (the sensitivity point): the host gets 140.8, not 200, and the sum is the memory's."""
    env, net = network({"lpddr5x": 253_500_000_000, "pcie": 112_700_000_000})
    fetch = net.add(10**9, net.path(("lpddr5x", READ), ("pcie", WRITE)))
    host = net.add(10**9, net.path(("lpddr5x", READ)), cap=200 * GB)
    assert fetch.rate == 112_700_000_000 and host.rate == 140_800_000_000
    assert fetch.rate + host.rate == 253_500_000_000


def test_two_readers_of_a_dram_share_its_two_stream_capacity_and_one_alone_gets_the_full_one():
    """LPDDR5X at 250 GB/s for one stream, 245 for two (the DRAM model's two-stream figure): a 112.7 GB/s fetch
    beside an uncapped host read leaves the host 132.3, not 137.3; once the fetch ends the host has 250."""
    env = Environment()
    net = FlowNetwork(env, ["lpddr5x", "pcie"], [250 * GB, 112_700_000_000], None, [245 * GB, 0])
    fetch = net.add(10**9, net.path(("lpddr5x", READ), ("pcie", WRITE)))
    assert fetch.rate == 112_700_000_000  # one reader: the full capacity is no limit on it
    host = net.add(10**9, net.path(("lpddr5x", READ)))
    assert (fetch.rate, host.rate) == (112_700_000_000, 132_300_000_000)
    net.remove(fetch)
    assert host.rate == 250 * GB
    # a writer beside one reader is not a second reader: the turnaround, not the shared capacity, applies
    net.add(10**9, net.path(("pcie", READ), ("lpddr5x", WRITE)))
    assert host.rate + 112_700_000_000 == 250 * GB


def test_a_flow_that_may_not_end_before_its_compute_time_ends_then_alone_and_later_when_shared():
    """An operation's operand stream: 7 MB whose arrays need 10 us; alone on 800 GB/s it would stream in 8.75 us
    but ends at 10 us; sharing with a 100 GB/s fetch (700 left) it still ends at 10 us; with a 400 GB/s fetch
    (400 left) it takes 17.5 us."""
    for fetch_gbps, end_ps in ((None, 10_000_000), (100, 10_000_000), (400, 17_500_000)):
        env, net = network({"pcie": (fetch_gbps or 1) * GB, "hbm": 800 * GB})
        done = []
        if fetch_gbps:
            net.add(10**9, net.path(("pcie", READ), ("hbm", WRITE)))
        net.add(7 * 10**6, net.path(("hbm", READ)), cap=700 * GB, not_before=10_000_000,
                on_target=lambda f: done.append(env.now))
        env.run(until=100_000_000)
        assert done == [end_ps], fetch_gbps
