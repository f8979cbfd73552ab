"""`chipsim run ... --timeline FILE`: a Chrome / Perfetto trace-event JSON of the runs, checked against the
format, the engine's own numbers and the hand arithmetic of tests/test_engine.py."""

import json
import os
from collections import defaultdict

import pytest
from conftest import tiny_shape

from chipsim.analysis.timeline import ARRAYS, DMA0, LANE_STRIDE, build_trace, dumps
from chipsim.cli import main
from chipsim.runner import prepare, simulate
from chipsim.hw.paths import fetch_path_timing
from chipsim.sim.engine import Simulation
from chipsim.units import gbps_to_bytes_per_s, ns_to_ps

TINY = tiny_shape()
TOKENS = 6
POLICIES = ["no-prefetch", "static-3", "oracle", "promoe", "apex"]


def ns(us: float) -> int:
    """A file time (µs, whole ns) as integer ns, the way Perfetto reads it."""
    return round(us * 1000)


def run_cli(capsys, *args):
    code = main(["run", *args])
    out, err = capsys.readouterr()
    return code, out, err


def load(path):
    with open(path) as f:
        return json.load(f)


def x_events(doc, **match):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


# --------------------------------------------------------------------------------------------- the format
def test_the_file_is_trace_event_json_with_named_processes_and_lanes(tiny, tmp_path, capsys):
    cfg = tiny.config()
    path = tmp_path / "t.json"
    args = [cfg, "--timeline", str(path), "--timeline-tokens", "0", "--jobs", "1"]
    for p in POLICIES:
        args += ["--policy", p]
    assert run_cli(capsys, *args)[0] == 0
    doc = load(path)
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    process_names, thread_names = {}, {}
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e), e
        assert e["ph"] in ("X", "M", "C"), e
        assert e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["cat"], str)
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int) and v >= 0 for v in e["args"].values())
        if e["ph"] == "M" and e["name"] == "process_name":
            process_names[e["pid"]] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_name":
            thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
    assert [process_names[pid] for pid in sorted(process_names)] == POLICIES
    for e in events:
        if e["ph"] != "M":
            assert (e["pid"], e["tid"]) in thread_names, e
    lanes = set(thread_names.values())
    assert {"tokens", "arrays 0-3 (each op uses all 4)", "host CPU"} <= lanes
    assert {f"DMA engine {i}" for i in range(4)} <= lanes
    assert any(n.startswith("link") for n in lanes)
    # thread ids are unique across processes (Perfetto keys threads by tid)
    assert len({tid for _, tid in thread_names}) == len(thread_names)
    # prefetches and demand fetches are told apart, with their expert, size and fate
    cats = {e["cat"] for e in x_events(doc)}
    assert {"prefetch", "demand", "setup,prefetch", "setup,demand", "stall", "compute", "token"} <= cats
    for e in x_events(doc):
        if e["cat"] in ("prefetch", "demand") or e["cat"].startswith("setup"):
            assert {"layer", "expert", "bytes", "cancelled"} <= set(e["args"])
            assert e["name"].split()[0] in ("prefetch", "demand", "setup")
    assert any(e["args"]["cancelled"] for e in x_events(doc, cat="prefetch"))  # static-3 drops unrouted ones
    assert any(e["name"] == "link" and e["ph"] == "C" and e["args"]["moving"] > 1 for e in events)
    # no two spans cross on any lane (Perfetto cannot draw crossing spans on one track): in integer ns,
    # as the viewer reads them, every lane's spans are disjoint
    by_lane = defaultdict(list)
    for e in x_events(doc):
        by_lane[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    for spans in by_lane.values():
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


# --------------------------------------------------------------------------------------------- the numbers
def test_the_first_fetches_match_the_hand_arithmetic(tiny, tmp_path):
    cfg = tiny.config()
    prep = prepare(cfg, policy_specs=["no-prefetch"])
    wl, hw = prep.workload, prep.config.hw
    bandwidth = gbps_to_bytes_per_s(fetch_path_timing(hw).bandwidth_gbps)
    pre = wl.layers[0].attention.duration_ps + wl.layers[0].router.duration_ps
    setup = ns_to_ps(hw.dma.setup_ns)
    # as in test_no_prefetch_token_latency_equals_the_hand_sum: both routed experts are set up together on
    # two engines after attention + router, then share the bottleneck: data ends at pre + setup + 2N/B
    data_end = pre + setup + -(-2 * wl.expert_bytes * 10**12 // bandwidth)
    result = simulate(prep, prep.policies[0], record_events=True, record_tokens=1)
    first = [s for s in result.timeline.dma if s[2] < data_end]
    assert sorted((engine, phase, start, end) for engine, phase, start, end, *_ in first) == [
        (0, "data", pre + setup, data_end), (0, "setup", pre, pre + setup),
        (1, "data", pre + setup, data_end), (1, "setup", pre, pre + setup)]
    routed0 = sorted(int(e) for e in prep.trace["routed_ids"][0][0])
    assert sorted(s[5] for s in first if s[1] == "data") == routed0
    # in the file: on DMA engine 0 and 1 lanes, named, in µs rounded to the ns
    doc = json.loads(dumps(build_trace([result.timeline.run_data("no-prefetch")])))
    for engine in (0, 1):
        lane = x_events(doc, tid=LANE_STRIDE + DMA0 + engine)
        setup_span, data_span = lane[0], lane[1]
        assert setup_span["name"].startswith("setup L0E") and setup_span["cat"] == "setup,demand"
        assert data_span["name"].startswith("demand L0E") and data_span["cat"] == "demand"
        assert data_span["args"] == {"layer": 0, "expert": data_span["args"]["expert"],
                                     "bytes": wl.expert_bytes, "cancelled": False}
        assert ns(setup_span["ts"]) == (pre + 500) // 1000
        assert ns(data_span["ts"]) == ns(setup_span["ts"]) + ns(setup_span["dur"]) == (pre + setup + 500) // 1000
        assert ns(data_span["ts"]) + ns(data_span["dur"]) == (data_end + 500) // 1000
    # and the arrays stall from the end of attention + router until the bytes land
    stall = x_events(doc, cat="stall")[0]
    assert stall["name"] == "stall L0" and stall["args"] == {"layer": 0, "token": 0}
    landed = data_end + ns_to_ps(fetch_path_timing(hw).latency_ns)
    assert (ns(stall["ts"]), ns(stall["ts"]) + ns(stall["dur"])) == ((pre + 500) // 1000, (landed + 500) // 1000)


def _tiny_runs(cfg, specs=POLICIES, record_tokens=0):
    prep = prepare(cfg, policy_specs=specs)
    return prep, [(p, simulate(prep, p, record_events=True, record_tokens=record_tokens)) for p in prep.policies]


def test_dma_engine_spans_never_overlap_and_account_for_every_landing(tiny):
    cfg = tiny.config()
    prep, runs = _tiny_runs(cfg)
    latency = ns_to_ps(fetch_path_timing(prep.config.hw).latency_ns)
    engines = prep.config.hw.dma.engines
    for policy, result in runs:
        per_engine = defaultdict(list)
        for engine, phase, start, end, *_ in result.timeline.dma:
            assert 0 <= engine < engines and 0 <= start <= end
            per_engine[engine].append((start, end))
        for spans in per_engine.values():
            spans.sort()
            assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), policy.label
        # every landing the engine recorded is the end of a data span plus the path latency, or the end of
        # the setup of a transfer cancelled during it, or a transfer cancelled before it had an engine
        ends, starts = defaultdict(set), defaultdict(list)
        for engine, phase, start, end, layer, expert, nbytes, kind, cancelled, promoted in result.timeline.dma:
            key = f"L{layer}E{expert}"
            ends[key].add(end + latency if phase == "data" else end)
            starts[key].append(start)
        landings = 0
        for lane, name, issue, landed in result.timeline.events:
            if lane.startswith("dma"):
                landings += 1
                assert landed in ends[name] or not any(issue <= s <= landed for s in starts[name]), (policy.label, name)
        assert landings == result.counts.fetches_total, policy.label
        # the link counter never shows more moving transfers than engines
        assert all(0 <= moving <= engines for _, moving, _ in result.timeline.link)
        assert [t for t, *_ in result.timeline.link] == sorted({t for t, *_ in result.timeline.link})


def test_stall_spans_sum_to_the_engines_stall_per_token(tiny):
    cfg = tiny.config()
    prep, runs = _tiny_runs(cfg)
    trace = build_trace([r.timeline.run_data(p.label) for p, r in runs])
    for pid, (policy, result) in enumerate(runs, start=1):
        # exactly, in picoseconds, from the recorded spans
        tokens = sorted((s, e) for lane, name, s, e in result.timeline.events if lane == "tokens")
        assert len(tokens) == TOKENS
        per_token = [0] * TOKENS
        for lane, name, start, end in result.timeline.events:
            if lane == "arrays" and name.endswith(" stall"):
                t = max(i for i, (s, _) in enumerate(tokens) if s <= start)
                assert end <= tokens[t][1]
                per_token[t] += end - start
        assert per_token == result.per_token.stall_ps.tolist(), policy.label
        # in the file: to the nanosecond each span was rounded to
        stalls = [e for e in x_events(trace, pid=pid, cat="stall")]
        assert all(e["tid"] == pid * LANE_STRIDE + ARRAYS for e in stalls)
        for t in range(TOKENS):
            mine = [e for e in stalls if e["args"]["token"] == t]
            total_ns = sum(ns(e["ts"] + e["dur"]) - ns(e["ts"]) for e in mine)
            assert abs(total_ns * 1000 - result.per_token.stall_ps[t]) <= 1000 * len(mine)


def test_host_cpu_experts_and_the_arrays_wait_for_them_are_on_their_lanes(tiny):
    cfg = tiny.config()
    from chipsim.policies.base import LayerPlan, Policy

    class AllOnHost(Policy):
        name = "test-host"

        def on_route(self, ctx, t, layer, routed):
            return LayerPlan(execute=[], on_host=list(routed))

    prep = prepare(cfg, policy_specs=["no-prefetch"])
    result = Simulation(prep.config.hw, prep.workload, prep.trace, AllOnHost("host"), record_events=True).run()
    doc = build_trace([result.timeline.run_data("host")])
    host = x_events(doc, cat="host-cpu")
    assert len(host) == TOKENS * TINY.num_moe_layers * TINY.top_k
    assert all(e["name"].startswith("host L") and {"layer", "expert"} <= set(e["args"]) for e in host)
    waits = defaultdict(int)
    for e in x_events(doc, cat="host-wait"):
        waits[e["args"]["token"]] += ns(e["ts"] + e["dur"]) - ns(e["ts"])
    assert all(abs(waits[t] * 1000 - result.per_token.host_wait_ps[t]) <= 1000 * TINY.num_moe_layers for t in range(TOKENS))
    assert result.per_token.host_wait_ps.min() > 0
    assert not x_events(doc, cat="prefetch") and not x_events(doc, cat="demand")


# --------------------------------------------------------------------------------------------- the command
def test_same_run_gives_identical_files_and_the_same_results_as_without_a_timeline(tiny, tmp_path, capsys):
    cfg = tiny.config()
    specs = ["--policy", "no-prefetch", "--policy", "static-3", "--policy", "oracle"]
    outs, files = [], []
    for i, jobs in enumerate(("1", "2")):  # in this process and in worker processes
        path = tmp_path / f"t{i}.json"
        code, out, _ = run_cli(capsys, cfg, *specs, "--json", "--jobs", jobs, "--timeline", str(path))
        assert code == 0
        outs.append(out)
        files.append(path.read_bytes())
    code, plain, _ = run_cli(capsys, cfg, *specs, "--json", "--jobs", "1")
    assert code == 0
    assert files[0] == files[1]
    assert outs[0] == outs[1] == plain
    code, table_with, _ = run_cli(capsys, cfg, *specs, "--jobs", "1", "--timeline", str(tmp_path / "t2.json"))
    code, table_without, _ = run_cli(capsys, cfg, *specs, "--jobs", "1")
    assert table_with == table_without
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_timeline_tokens_limits_what_is_recorded(tiny, tmp_path, capsys):
    cfg = tiny.config()
    path = tmp_path / "t.json"
    assert run_cli(capsys, cfg, "--policy", "oracle", "--policy", "static-3", "--jobs", "1",
                   "--timeline", str(path), "--timeline-tokens", "2")[0] == 0
    doc = load(path)
    assert doc["otherData"]["timeline_tokens"] == 2
    for pid in (1, 2):
        tokens = x_events(doc, pid=pid, cat="token")
        assert [e["name"] for e in tokens] == ["token 0", "token 1"]
        end = ns(tokens[-1]["ts"] + tokens[-1]["dur"])
        spans = x_events(doc, pid=pid)
        assert all(ns(e["ts"]) + ns(e["dur"]) <= end for e in spans if e["tid"] % LANE_STRIDE == ARRAYS)
        assert all(ns(e["ts"]) <= end for e in spans)  # DMA spans issued by then finish, nothing after starts
    # recording stops for good: the DMA path drops its recorder once the last recorded transfer is done
    prep = prepare(cfg, policy_specs=["static-3"])
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0], record_events=True,
                     record_tokens=1)
    recorded = sim.run().timeline
    assert sim.dma.recorder is None and [name for lane, name, *_ in recorded.events if lane == "tokens"] == ["token 0"]
    plain = Simulation(prep.config.hw, prep.workload, prep.trace, prep.policies[0])
    assert plain.dma.recorder is None and plain.run().timeline is None


@pytest.mark.parametrize("bad", ["missing-dir/t.json", "a-directory", "tokens"])
def test_a_bad_timeline_path_is_one_line_exit_2_and_nothing_written(tiny, tmp_path, capsys, bad):
    cfg = tiny.config()
    (tmp_path / "a-directory").mkdir()
    out_dir = tmp_path / "out"
    path = str(tmp_path / bad)
    extra = ["--timeline-tokens", "-1"] if bad == "tokens" else []
    if bad == "tokens":
        path = str(tmp_path / "t.json")
    before = sorted(os.listdir(tmp_path))
    code, out, err = run_cli(capsys, cfg, "--policy", "no-prefetch", "--timeline", path, "--out", str(out_dir), *extra)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chipsim: error: --timeline"), err
    assert sorted(os.listdir(tmp_path)) == before
