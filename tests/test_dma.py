"""DMA path checks a hardware engineer would do by hand (times in integer picoseconds)."""

import pytest
import simpy

from chipsim.sim.dma import DEMAND, PREFETCH, DmaPath
from chipsim.sim.flows import FlowNetwork
from conftest import native_core

Environment = simpy.Environment  # the reference's clock; the native core's classes run on its own Loop


@pytest.fixture(params=["reference", "native"], autouse=True)
def engine(request, monkeypatch):
    """Every check here runs on the engine of record's DmaPath (on SimPy) and on the native event core's
    (chipsim.sim.native, where the install built it): the same DMA queue, checked against the same hand sums."""
    if request.param == "native":
        native = native_core()
        monkeypatch.setitem(globals(), "DmaPath", native.DmaPath)
        monkeypatch.setitem(globals(), "FlowNetwork", native.FlowNetwork)
        monkeypatch.setitem(globals(), "Environment", native.Loop)
    return request.param


GBPS_100 = 100_000_000_000  # 100 GB/s = 0.1 byte per ps
MB = 1_000_000


def make_path(engines=4, setup_ps=1_000_000, latency_ps=500_000, chunk_bytes=256 * 1024, bw=GBPS_100):
    env = Environment()
    landed = {}
    path = DmaPath(env, bw, latency_ps, setup_ps, engines, chunk_bytes,
                   on_landed=lambda tr: landed.__setitem__(tr.tag, (env.now, tr)))
    return env, path, landed


def test_single_transfer_on_idle_path_finishes_at_setup_plus_latency_plus_bytes_over_bandwidth():
    env, path, landed = make_path()
    path.submit(4 * MB, PREFETCH, tag="a")
    env.run()
    # 4 MB at 100 GB/s = 40 us = 40_000_000 ps
    assert landed["a"][0] == 1_000_000 + 500_000 + 40_000_000


def test_odd_sizes_round_up_to_the_next_picosecond():
    env, path, landed = make_path(setup_ps=0, latency_ps=0, bw=3_000_000_000)  # 3 GB/s
    path.submit(1, DEMAND, tag="a")  # 1 byte at 3e9 B/s = 333.33 ps -> 334
    env.run()
    assert landed["a"][0] == 334


def test_two_equal_transfers_started_together_share_the_link_and_finish_together():
    env, path, landed = make_path()
    path.submit(4 * MB, PREFETCH, tag="a")
    path.submit(4 * MB, PREFETCH, tag="b")
    env.run()
    expected = 1_000_000 + 500_000 + 2 * 40_000_000
    assert landed["a"][0] == expected
    assert landed["b"][0] == expected


def test_transfers_beyond_the_engine_count_queue_for_an_engine():
    env, path, landed = make_path(engines=1)
    path.submit(1 * MB, PREFETCH, tag="a")
    path.submit(1 * MB, PREFETCH, tag="b")
    env.run()
    # a: setup, 10 us of data, latency. b gets the engine when a's data phase ends, then its own setup.
    a_data_end = 1_000_000 + 10_000_000
    assert landed["a"][0] == a_data_end + 500_000
    assert landed["b"][0] == a_data_end + 1_000_000 + 10_000_000 + 500_000


def test_a_late_transfer_slows_the_one_in_flight_by_exactly_the_shared_time():
    env, path, landed = make_path(setup_ps=0, latency_ps=0)
    path.submit(2 * MB, PREFETCH, tag="a")  # alone: 20 us
    env.run(until=10_000_000)  # a is half done (1 MB left)
    path.submit(1 * MB, PREFETCH, tag="b")
    env.run()
    # from 10 us both share: 1 MB each at 50 GB/s -> both end at 10 + 20 = 30 us
    assert landed["a"][0] == 30_000_000
    assert landed["b"][0] == 30_000_000


def test_demand_goes_before_queued_prefetches_and_in_flight_prefetch_yields_at_chunk_boundary():
    chunk = 1 * MB
    env, path, landed = make_path(engines=1, setup_ps=0, latency_ps=0, chunk_bytes=chunk)
    path.submit(4 * MB, PREFETCH, tag="p1")  # moving from t=0
    path.submit(4 * MB, PREFETCH, tag="p2")  # queued behind it
    env.run(until=15_000_000)  # p1 has moved 1.5 MB; its next chunk boundary is at 2 MB
    path.submit(1 * MB, DEMAND, tag="d")
    env.run()
    # p1 runs alone to its boundary (0.5 MB, 5 us) and pauses at 20 us, freeing the engine: the demand
    # then moves alone (10 us), ahead of the queued p2.
    assert landed["d"][0] == 30_000_000
    # p1 resumes its remaining 2 MB without a second setup (20 us), then p2 (40 us).
    assert landed["p1"][0] == 50_000_000
    assert landed["p2"][0] == 90_000_000


def test_demand_with_a_free_engine_shares_until_the_prefetch_reaches_its_boundary():
    chunk = 1 * MB
    env, path, landed = make_path(engines=2, setup_ps=0, latency_ps=0, chunk_bytes=chunk)
    path.submit(4 * MB, PREFETCH, tag="p")
    env.run(until=5_000_000)  # p has moved 0.5 MB
    path.submit(2 * MB, DEMAND, tag="d")
    env.run()
    # both share (50 GB/s each) until p reaches 1 MB: 0.5 MB more takes 10 us -> t = 15 us, d has 0.5 MB.
    # d alone: 1.5 MB at 100 GB/s = 15 us -> 30 us. p resumes with 3 MB -> 30 us more.
    assert landed["d"][0] == 30_000_000
    assert landed["p"][0] == 60_000_000


def test_promoting_a_queued_prefetch_moves_it_ahead_of_other_prefetches():
    env, path, landed = make_path(engines=1, setup_ps=0, latency_ps=0, chunk_bytes=1 * MB)
    path.submit(1 * MB, PREFETCH, tag="a")
    path.submit(1 * MB, PREFETCH, tag="b")
    c = path.submit(1 * MB, PREFETCH, tag="c")
    path.promote(c)
    env.run()
    # a is already moving: it sits on a chunk boundary at t=0 and yields at once; c goes first.
    assert landed["c"][0] == 10_000_000
    assert landed["a"][0] == 20_000_000
    assert landed["b"][0] == 30_000_000


def test_cancel_a_queued_transfer_moves_nothing_and_a_moving_one_stops_at_its_chunk_boundary():
    env, path, landed = make_path(engines=1, setup_ps=0, latency_ps=0, chunk_bytes=1 * MB)
    a = path.submit(4 * MB, PREFETCH, tag="a")
    b = path.submit(4 * MB, PREFETCH, tag="b")
    env.run(until=15_000_000)  # a moved 1.5 MB
    path.cancel(b)
    path.cancel(a)
    env.run()
    assert landed["b"][1].moved_bytes == 0 and landed["b"][1].cancelled
    assert landed["a"][0] == 20_000_000 and landed["a"][1].moved_bytes == 2 * MB
    assert path.bytes_moved == 2 * MB


def test_same_submissions_give_identical_timelines():
    def run_once():
        env, path, landed = make_path(engines=3, chunk_bytes=300_000)
        for i in range(7):
            path.submit(1_234_567 + i * 1000, PREFETCH if i % 2 else DEMAND, tag=i)
        env.run()
        return sorted((tag, t) for tag, (t, _) in landed.items())

    assert run_once() == run_once()


def test_without_preemption_a_demand_only_jumps_the_queue():
    env = Environment()
    landed = {}
    path = DmaPath(env, GBPS_100, 0, 0, 1, 1 * MB, on_landed=lambda tr: landed.__setitem__(tr.tag, env.now),
                   preempt=False)
    path.submit(4 * MB, PREFETCH, tag="p1")
    path.submit(4 * MB, PREFETCH, tag="p2")
    env.run(until=15_000_000)
    path.submit(1 * MB, DEMAND, tag="d")
    env.run()
    assert landed["p1"] == 40_000_000  # not interrupted
    assert landed["d"] == 50_000_000  # ahead of the queued p2
    assert landed["p2"] == 90_000_000


def test_a_descriptor_chain_pays_one_setup_per_descriptor_on_one_engine():
    env, path, landed = make_path(engines=4)
    path.submit(3 * MB, PREFETCH, tag="chain", descriptors=3)  # e.g. an expert's gate, up and down
    env.run()
    assert landed["chain"][0] == 3 * 1_000_000 + 500_000 + 30_000_000
    assert path.descriptors_submitted == 3 and path.transfers_done == 1


def test_a_paused_prefetch_promoted_then_cancelled_charges_what_it_moved():
    env, path, landed = make_path(engines=1, setup_ps=0, latency_ps=0, chunk_bytes=1 * MB)
    p = path.submit(4 * MB, PREFETCH, tag="p")
    env.run(until=15_000_000)  # 1.5 MB moved; pauses at 2 MB when the demand arrives
    path.submit(4 * MB, DEMAND, tag="d")
    env.run(until=25_000_000)  # p paused at 20 us, d moving
    path.promote(p)  # p now waits in the demand queue, its 2 MB already moved
    path.cancel(p)
    env.run()
    assert landed["p"][1].cancelled and landed["p"][1].moved_bytes == 2 * MB
    assert landed["d"][0] == 60_000_000
    assert path.bytes_moved == 6 * MB


def test_an_empty_batch_while_a_transfer_moves_does_not_delay_it():
    """A policy hook that changes nothing (an empty batch) at 10 us must leave a 40 us transfer's end where it
    was (the first DmaPath re-planned from stale progress here and ended it at 50 us)."""
    env, path, landed = make_path(engines=1, setup_ps=0, latency_ps=0)
    path.submit(4 * MB, PREFETCH, tag="a")
    env.run(until=10_000_000)
    with path.batch():
        pass
    env.run()
    assert landed["a"][0] == 40_000_000


def test_a_network_without_the_path_its_transfers_cross_is_refused():
    env = Environment()
    with pytest.raises(ValueError, match="path"):
        DmaPath(env, None, 0, 0, 1, MB, network=FlowNetwork(env, ["pcie"], [GBPS_100]))
