"""Many requests served (workload.requests, issue #43 item 2). Hand checks: one request served alone takes exactly
what it takes as a request (TTFT, every step, energy); far below capacity no request waits and every step is one
request's; Little's law holds on the simulated queue; a static batch admits nobody until it has finished, continuous
batching admits at every step, a chunked step holds every decode token and at most max_step_tokens; the KV cache
bounds what is admitted; a closed loop keeps its users' requests in the system; arrivals are reproducible and
Poisson at the rate asked; no step sees its requests' routing before they route it; bad input: one line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from chipsim.cli import main
from chipsim.errors import InputError
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.units import PS_PER_S
from conftest import THOR
from helpers import routing_peek_policy

SMALL = ["workload.prompt_tokens=32", "workload.output_tokens=8"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


def serve(sets, policy="no-prefetch", config=THOR):
    prep = prepare(config, sets, [policy])
    result = simulate(prep, prep.policies[0])
    return prep, result, summarize_result(prep, result, prep.policies[0])


def arrivals_file(tmp_path, rows, name="arrivals.csv"):
    path = tmp_path / name
    path.write_text("arrival_ms,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return str(path)


def test_one_request_served_alone_takes_what_the_request_takes():
    """Its prompt chunks and decode steps are the request's, step for step: TTFT, TPOT and energy to the pJ."""
    for chunk in (0, 16):
        sets = SMALL + [f"workload.prefill_chunk_tokens={chunk}"]
        _, alone, alone_row = serve(sets, "on-demand+no-prefetch")
        _, served, row = serve(sets + ["workload.requests=1", "workload.arrivals.poisson_rps=10"])
        assert served.per_token.latency_ps.tolist() == alone.per_token.latency_ps.tolist()
        assert served.per_token.bytes["pcie"].tolist() == alone.per_token.bytes["pcie"].tolist()
        s, r = row["served"], alone_row["request"]
        assert s["per_request"]["ttft_ms"] == [pytest.approx(r["ttft_ms"], rel=1e-12)]
        assert s["per_request"]["tpot_ms"] == [pytest.approx(r["tpot_ms_mean"], rel=1e-12)]
        # the chip waited for the request before it came: not in the run's span, so no idle energy
        assert s["idle_ms"] == 0 and s["energy_mj"] == pytest.approx(r["energy_request_mj"], rel=1e-12)
        assert s["queue_ms_p50"] == 0


def test_far_below_capacity_no_request_waits_and_each_runs_alone(tmp_path):
    """Requests 1 s apart, each done in well under 1 s: no queueing, every step one request's, the chip idle in
    between (span = the steps' time + the idle time), and the first request's TTFT the unloaded request's."""
    _, alone, alone_row = serve(SMALL, "on-demand+no-prefetch")
    f = arrivals_file(tmp_path, [(1000 * i, 32, 8) for i in range(5)])
    _, served, row = serve(["workload.requests=5", f"workload.arrivals.file={f}"])
    s, rec = row["served"], served.served
    assert s["queue_ms_p99"] == 0
    assert rec.step_parts.tolist() == [1] * len(rec.step_parts)
    assert np.all(rec.arrival_ps[1:] > rec.finish_ps[:-1])  # (the load really is that low)
    assert int(served.per_token.latency_ps.sum()) + rec.idle_ps == int(rec.finish_ps[-1] - rec.arrival_ps[0])
    assert s["per_request"]["ttft_ms"][0] == pytest.approx(alone_row["request"]["ttft_ms"], rel=1e-12)
    # each request's steps: its prompt chunk, then one decode step per later output token
    assert len(rec.step_tokens) == 5 * (1 + 7) and rec.step_tokens.tolist()[:8] == [32] + [1] * 7


def test_littles_law_holds_on_the_simulated_queue():
    """The mean number in the system, counted as requests came and went, equals throughput x mean time in the
    system computed from each request's own times (within 1 %), at a load that queues."""
    _, served, row = serve(SMALL + ["workload.requests=40", "workload.arrivals.poisson_rps=30",
                                    "workload.scheduler.max_sequences=4"])
    s, rec = row["served"], served.served
    assert s["queue_ms_p99"] > 0  # requests did wait
    assert s["mean_in_system"] == pytest.approx(s["littles_law_in_system"], rel=0.01)
    # and the area under N(t) is each request's time in the system, summed (integer ps: exactly)
    assert rec.area_ps == int((rec.finish_ps - rec.arrival_ps).sum())


def test_every_step_keeps_to_the_scheduler_s_caps():
    for kind in ("static", "continuous", "chunked"):
        _, served, _ = serve(SMALL + ["workload.requests=12", "workload.arrivals.poisson_rps=50",
                                      f"workload.scheduler.kind={kind}", "workload.scheduler.max_sequences=3",
                                      "workload.scheduler.max_step_tokens=24"])
        rec = served.served
        assert rec.step_tokens.max() <= 24 and rec.step_parts.max() <= 3, kind
        assert np.all(rec.finish_ps > rec.first_token_ps) and np.all(rec.first_token_ps > rec.arrival_ps), kind
        # each request's prompt in chunks of at most 24 tokens: 32 = 24 + 8, and it yields 8 tokens
        assert int(rec.step_tokens.sum()) == 12 * (32 + 7), kind


def test_static_batching_admits_nobody_until_the_batch_has_finished(tmp_path):
    f = arrivals_file(tmp_path, [(0, 32, 8)] * 4 + [(0, 32, 3)] * 2)
    _, served, _ = serve(["workload.requests=6", f"workload.arrivals.file={f}", "workload.scheduler.kind=static",
                          "workload.scheduler.max_sequences=2"])
    rec = served.served
    assert rec.admitted_ps[2] >= rec.finish_ps[:2].max() and rec.admitted_ps[3] == rec.admitted_ps[2]
    assert rec.admitted_ps[4] >= rec.finish_ps[2:4].max()
    _, cont, _ = serve(["workload.requests=6", f"workload.arrivals.file={f}", "workload.scheduler.kind=continuous",
                        "workload.scheduler.max_sequences=2"])
    # continuous batching admits request 2 as soon as a sequence is free, at the step after one finishes
    assert cont.served.admitted_ps[2] == cont.served.finish_ps[:2].min()


def test_continuous_batching_pauses_decode_for_a_prefill_and_chunked_does_not(tmp_path):
    """Request 1 arrives while request 0 decodes: continuous runs its prompt in a step of its own (request 0 makes no
    token meanwhile); chunked runs it in the same step as request 0's decode token."""
    f = arrivals_file(tmp_path, [(0, 32, 8), (5, 32, 8)])
    sets = ["workload.requests=2", f"workload.arrivals.file={f}"]
    _, cont, _ = serve(sets + ["workload.scheduler.kind=continuous"])
    assert 32 in cont.served.step_tokens.tolist()[1:] and 33 not in cont.served.step_tokens.tolist()
    _, chunk, _ = serve(sets + ["workload.scheduler.kind=chunked"])
    assert 33 in chunk.served.step_tokens.tolist()  # 1 decode token + the 32-token prompt


def test_the_kv_cache_bounds_what_is_admitted(tmp_path):
    """Two long and two short requests at once, max_sequences 4, a KV cache for one long and two short: the second
    long one waits for the first to finish although sequences are free."""
    from chipsim.workload.decode import BF16_BYTES

    prep = prepare(THOR, SMALL, ["no-prefetch"])
    m = prep.workload.model
    long, short = m.cache_bytes(200 + 8 - 1, BF16_BYTES), m.cache_bytes(16 + 4 - 1, BF16_BYTES)
    mib = (long + 2 * short) / 2**20
    f = arrivals_file(tmp_path, [(0, 200, 8), (0, 200, 8), (0, 16, 4), (0, 16, 4)])
    _, served, _ = serve(["workload.requests=4", f"workload.arrivals.file={f}", "workload.scheduler.max_sequences=4",
                          f"workload.scheduler.kv_capacity_mib={mib}"])
    rec = served.served
    assert rec.admitted_ps[1] >= rec.finish_ps[0]  # the second long request waited for the first's cache
    # first come first served: the short ones behind it waited too
    assert rec.admitted_ps[2] >= rec.admitted_ps[1] and rec.admitted_ps[3] >= rec.admitted_ps[1]


def test_a_closed_loop_keeps_its_users_requests_in_the_system():
    _, served, row = serve(SMALL + ["workload.requests=9", "workload.arrivals.closed_users=3",
                                    "workload.arrivals.think_ms=0"])
    rec = served.served
    assert rec.arrival_ps[:3].tolist() == [0, 0, 0]
    # with no think time each later request arrives the moment an earlier one finishes
    assert set(rec.arrival_ps[3:].tolist()) <= set(rec.finish_ps.tolist())
    assert row["served"]["mean_in_system"] == pytest.approx(3, rel=0.25)
    events = sorted([(a, 1) for a in rec.arrival_ps] + [(f, -1) for f in rec.finish_ps], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) <= 3


def test_arrivals_are_reproducible_and_poisson_at_the_rate_asked():
    from chipsim.hw.config import load_config
    from chipsim.serve.arrivals import request_sizes

    def arrivals(seed, n=4000, rps=20.0):
        hw = load_config(THOR, SMALL + [f"workload.requests={n}", f"workload.arrivals.poisson_rps={rps}",
                                        f"workload.arrivals.seed={seed}"]).hw
        return request_sizes(hw.workload).arrival_ps

    a = arrivals(1)
    assert a.tolist() == arrivals(1).tolist() and a.tolist() != arrivals(2).tolist()
    gaps = np.diff(np.concatenate([[0], a])) / PS_PER_S
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.05)
    assert gaps.std() == pytest.approx(1 / 20.0, rel=0.05)  # exponential: standard deviation = mean


def test_a_served_run_is_byte_identical_when_repeated():
    sets = SMALL + ["workload.requests=10", "workload.arrivals.poisson_rps=40", "workload.scheduler.kind=chunked",
                    "workload.scheduler.max_step_tokens=20"]
    _, a, _ = serve(sets, "promoe")
    _, b, _ = serve(sets, "promoe")
    from chipsim.sim.record import differences

    assert differences(a, b) == []


def test_no_served_step_sees_its_requests_routing_before_they_route_it():
    """A new request reuses a trace window: nothing of it is known when it starts, though the window's earlier
    request routed the same trace tokens."""
    prep = prepare(THOR, SMALL + ["workload.requests=70", "workload.arrivals.poisson_rps=100",
                                  "workload.scheduler.kind=chunked", "workload.scheduler.max_step_tokens=40"],
                   ["no-prefetch"])
    result = simulate(prep, routing_peek_policy())
    assert result.served.window.max() == prep.served.windows - 1  # every window used, the first ones again
    assert np.bincount(result.served.window).max() > 1


@pytest.mark.parametrize("sets, message", [
    (["workload.requests=3"], "workload.arrivals: 3 requests need exactly one of"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.arrivals.closed_users=2"],
     "given: poisson_rps, closed_users"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=-1"], "workload.arrivals.poisson_rps"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.batch=2"],
     "workload.batch: a served run's scheduler decides"),
    (["workload.arrivals.poisson_rps=1"], "workload.arrivals: read only by a served run"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.scheduler.max_sequences=100"],
     "workload.scheduler.max_sequences: 100 requests at once need 100 windows"),
    # a request of 39 tokens caches 39 x 64 KiB (32 layers x 8 KV heads x 64 x 2 (K, V) x 2 bytes): 1 fits, 8 do not
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.scheduler.kv_capacity_mib=5"],
     "workload.scheduler.max_sequences: 8 sequences of at least 39 tokens need 19.5 MiB"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.scheduler.kind=chunked",
      "workload.scheduler.max_step_tokens=4"], "cannot hold the decode tokens of 8 sequences"),
    (["workload.requests=3", "workload.arrivals.poisson_rps=1", "workload.arrivals.think_ms=5"],
     "think_ms: read only by a closed loop"),
])
def test_bad_served_configs_are_refused_in_one_line(sets, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare(THOR, SMALL + sets, ["no-prefetch"])


def test_policies_that_cannot_serve_are_refused():
    sets = SMALL + ["workload.requests=3", "workload.arrivals.poisson_rps=1"]
    with pytest.raises(InputError, match="floe: runs one token a step, not workload.requests"):
        prepare(THOR, sets, ["floe"])
    with pytest.raises(InputError, match="name one decode policy"):
        prepare(THOR, sets, ["on-demand+no-prefetch"])


@pytest.mark.parametrize("rows, message", [
    ("arrival_ms,prompt_tokens,output_tokens\n5,32,8\n1,32,8\n", "line 3: arrival 1 ms comes before"),
    ("arrival_ms,prompt_tokens,output_tokens\n-1,32,8\n0,32,8\n", "line 2: arrival -1 ms is not a time"),
    ("arrival,prompt,output\n0,32,8\n0,32,8\n", "line 1 must be the header"),
    ("arrival_ms,prompt_tokens,output_tokens\n0,32,8\n", "holds 1 requests; workload.requests asks for 2"),
    ("arrival_ms,prompt_tokens,output_tokens\n0,32\n0,32,8\n", "line 2: expected 3 values"),
    ("arrival_ms,prompt_tokens,output_tokens\n0,x,8\n0,32,8\n", "is not a time in ms and two whole token counts"),
    ("arrival_ms,prompt_tokens,output_tokens\n0,0,8\n0,32,8\n", "prompt 0 and output 8 tokens must each be"),
])
def test_a_bad_arrivals_file_is_refused_in_one_line_naming_it(tmp_path, capsys, rows, message):
    path = tmp_path / "a.csv"
    path.write_text(rows)
    code = main(["run", THOR, "--set", "workload.requests=2", "--set", f"workload.arrivals.file={path}",
                 "--policy", "no-prefetch"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and str(path) in err[0]


def test_run_writes_each_policy_s_requests_and_the_slo_attainment(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["run", THOR, "--set", "workload.prompt_tokens=32", "--set", "workload.output_tokens=8",
                 "--set", "workload.requests=6", "--set", "workload.arrivals.poisson_rps=20",
                 "--policy", "no-prefetch", "--slo", "ttft_ms=1e9,tpot_ms=1e9", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "SLO met" in text
    lines = (out / "requests-no-prefetch.csv").read_text().splitlines()
    assert lines[0] == "request,arrival_ms,window,queue_ms,ttft_ms,tpot_ms,e2e_ms" and len(lines) == 7
    assert "1.000" in text.split("SLO met")[1].splitlines()[2]  # every request meets a generous SLO
    assert main(["run", THOR, "--slo", "ttft=3", "--policy", "no-prefetch"]) == 2
    assert "--slo ttft=3: expected ttft_ms=VALUE" in capsys.readouterr().err


def test_a_run_into_a_used_folder_leaves_none_of_the_earlier_run_s_requests(tmp_path, capsys):
    """--out DIR holds one run: results.csv and results.json are replaced, and the requests-POLICY.csv an earlier
    served run wrote there and this run does not write are removed (a plain run: all of them)."""
    out = tmp_path / "out"
    served = ["run", THOR, "--set", "workload.prompt_tokens=8", "--set", "workload.output_tokens=3", "--set",
              "workload.requests=2", "--set", "workload.arrivals.closed_users=1", "--jobs", "1", "--out", str(out)]
    assert main([*served, "--policy", "lru", "--policy", "no-prefetch"]) == 0
    (out / "notes.txt").write_text("mine")
    assert sorted(os.listdir(out)) == ["notes.txt", "requests-lru.csv", "requests-no-prefetch.csv", "results.csv",
                                       "results.json"]
    assert main([*served, "--policy", "lru"]) == 0
    assert sorted(os.listdir(out)) == ["notes.txt", "requests-lru.csv", "results.csv", "results.json"]
    assert main(["run", THOR, "--policy", "lru", "--set", "workload.max_tokens=3", "--jobs", "1", "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["notes.txt", "results.csv", "results.json"]
    capsys.readouterr()


def test_a_long_run_packs_its_step_ledgers_with_the_same_result(monkeypatch):
    """Step ledgers are packed into arrays every LEDGERS_PER_BLOCK steps (memory per step: a few integers); the
    result is the one kept unpacked, to the byte."""
    import chipsim.sim.record as record
    from chipsim.sim.record import differences

    sets = SMALL + ["workload.requests=6", "workload.arrivals.poisson_rps=2"]
    _, whole, _ = serve(sets)
    monkeypatch.setattr(record, "LEDGERS_PER_BLOCK", 7)
    _, packed, _ = serve(sets)
    assert whole.tokens > 3 * 7 and differences(whole, packed) == []


def test_an_edited_arrivals_file_is_another_input(tmp_path):
    from chipsim.runner import input_files

    f = arrivals_file(tmp_path, [(0, 16, 4), (3, 16, 4)])
    before = input_files(prepare(THOR, ["workload.requests=2", f"workload.arrivals.file={f}"], ["no-prefetch"]).config.hw)
    arrivals_file(tmp_path, [(0, 200, 30), (3, 200, 30)])
    after = input_files(prepare(THOR, ["workload.requests=2", f"workload.arrivals.file={f}"], ["no-prefetch"]).config.hw)
    assert before["workload.arrivals.file"]["sha256"] != after["workload.arrivals.file"]["sha256"]


def test_a_sweep_s_fresh_and_cached_rows_agree_where_tpot_is_undefined(tmp_path, capsys):
    """Requests of one output token have no TPOT: the fresh sweep and its cached rerun write the same results.csv."""
    f = arrivals_file(tmp_path, [(0, 16, 1), (3, 16, 1)])
    args = ["sweep", THOR, "--grid", "workload.scheduler.max_sequences=1,2", "--set", "workload.requests=2",
            "--set", f"workload.arrivals.file={f}", "--policy", "no-prefetch", "--out", str(tmp_path / "s"), "--quiet"]
    assert main(args) == 0
    fresh = (tmp_path / "s" / "results.csv").read_text()
    assert main(args) == 0 and "2 reused" in capsys.readouterr().out
    assert (tmp_path / "s" / "results.csv").read_text() == fresh


def test_a_served_policy_s_own_rates_average_over_the_tokens_its_requests_read():
    """Pre-gated's deviation rate of one request served alone, by hand from the trace: per (token, layer) of its
    P + O - 1 tokens, the pre-gate's k experts not in the routed set (none where the pre-gate has no usable set)."""
    from chipsim.trace.format import NO_EXPERT

    prep, _, row = serve(SMALL + ["workload.requests=1", "workload.arrivals.poisson_rps=1"], "pregated")
    k = prep.workload.model.top_k
    pred, routed = prep.trace["pregate_rank"][:39, :, :k], prep.trace["routed_ids"][:39]
    deviations = 0
    for t in range(39):
        for layer in range(pred.shape[1]):
            ids = pred[t, layer].tolist()
            if NO_EXPERT not in ids and len(set(ids)) == k:
                deviations += len(set(ids) - set(routed[t, layer].tolist()))
    assert row["deviation_rate"] == pytest.approx(deviations / (39 * pred.shape[1] * k), rel=1e-12)


@pytest.mark.parametrize("sets, message", [
    (["workload.requests=5", "workload.arrivals.poisson_rps=1e-8"], "workload.arrivals.poisson_rps: 5 requests at"),
    (["workload.requests=2", "workload.arrivals.poisson_rps=1", "workload.scheduler.kv_capacity_mib=0.5",
      "workload.scheduler.max_sequences=1"], "workload.prompt_tokens: a request of 39 tokens needs"),
])
def test_requests_that_could_never_run_are_refused(sets, message):
    with pytest.raises(InputError, match=message):
        prepare(THOR, SMALL + sets, ["no-prefetch"])


def test_a_file_s_requests_may_be_chunked_and_one_too_big_for_the_cache_is_named(tmp_path):
    f = arrivals_file(tmp_path, [(0, 16, 4), (1, 600, 4)])
    with pytest.raises(InputError, match=r"workload.arrivals.file request 1 \(line 3\): a request of 603 tokens"):
        prepare(THOR, ["workload.requests=2", f"workload.arrivals.file={f}", "workload.scheduler.kv_capacity_mib=10",
                       "workload.scheduler.max_sequences=1"], ["no-prefetch"])
    f = arrivals_file(tmp_path, [(0, 20, 4), (1, 5, 4)], name="b.csv")
    _, served, _ = serve(["workload.requests=2", f"workload.arrivals.file={f}", "workload.prefill_chunk_tokens=8"])
    # 20 = 8 + 8 + 4; request 1 (5 tokens) arrives during the first chunk and joins the second step's prefill
    assert served.served.step_tokens.tolist()[:3] == [8, 8 + 5, 4]


def test_a_closed_loop_of_long_think_times_is_not_refused():
    prep = prepare(THOR, SMALL + ["workload.requests=1000", "workload.arrivals.closed_users=100",
                                  "workload.arrivals.think_ms=1e5"], ["no-prefetch"])
    assert prep.served.sizes.count == 1000


def test_an_excel_csv_is_read_and_odd_counts_are_not(tmp_path, capsys):
    path = tmp_path / "bom.csv"
    path.write_text("\ufeffarrival_ms,prompt_tokens,output_tokens\n0,16,4\n")
    prep = prepare(THOR, ["workload.requests=1", f"workload.arrivals.file={path}"], ["no-prefetch"])
    assert prep.served.sizes.prompt.tolist() == [16]
    path.write_text("arrival_ms,prompt_tokens,output_tokens\n0,1_6,4\n")
    with pytest.raises(InputError, match="is not a time in ms and two whole token counts"):
        prepare(THOR, ["workload.requests=1", f"workload.arrivals.file={path}"], ["no-prefetch"])
    assert main(["run", THOR, "--slo", "", "--policy", "no-prefetch"]) == 2
    assert "--slo : expected ttft_ms=VALUE" in capsys.readouterr().err
