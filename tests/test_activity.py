"""The GPU's activity record summarised (chipsim.hwreplay.activity): hand-made records, each number summed by hand."""

import json

import pytest

from conftest import ROOT

from chipsim.errors import InputError
from chipsim.hwreplay import activity, compare_activity
from chipsim.hwreplay.activity import Activity, activities_from_trace, compute_gaps, copy_fit, copy_gaps, summarise

MB = 1_000_000


def _copy(start_ns, nbytes, gbps=50.0, fixed_ns=3000, stream=9):
    """A copy of nbytes that takes fixed + bytes / bandwidth (1 GB/s = 1 byte/ns)."""
    return Activity("copy", stream, start_ns, start_ns + fixed_ns + round(nbytes / gbps), nbytes)


def test_copies_of_two_sizes_fit_the_link_they_ran_at():
    # 1 MB at 50 GB/s is 20,000 ns, 2 MB 40,000; each plus 3,000 ns
    copies = [_copy(0, MB), _copy(30_000, 2 * MB), _copy(80_000, MB), _copy(110_000, 2 * MB)]
    assert [c.end_ns - c.start_ns for c in copies] == [23_000, 43_000, 23_000, 43_000]
    assert copy_fit(copies) == {"bandwidth_gbps": 50.0, "intercept_us": 3.0, "max_rel_residual": 0.0}


def test_copies_of_one_size_have_no_fit():
    assert copy_fit([_copy(0, MB), _copy(30_000, MB)]) == {}


def test_a_gap_that_a_copy_ends_inside_is_a_wait_and_its_hand_off_runs_from_that_copy():
    busy = [(0, 10_000), (20_000, 30_000), (50_000, 60_000)]
    # a copy ends at 12,000 and another at 15,000 inside the first gap (10,000-20,000): a wait of 10,000 whose hand-off
    # runs from the last end, 15,000, to 20,000; nothing ends inside the second (30,000-50,000): 20,000 otherwise
    waiting, other, handoffs = compute_gaps(busy, [12_000, 15_000, 70_000])
    assert (waiting, other, handoffs) == (10_000, 20_000, [5_000])


def test_a_copy_after_a_kernel_and_a_copy_after_a_copy_are_told_apart():
    a = Activity("copy", 9, 0, 100_000, MB)
    b = Activity("copy", 9, 160_000, 200_000, MB)  # its stream idle from 100,000; a kernel ended at 150,000
    c = Activity("copy", 9, 205_000, 300_000, MB)  # no kernel ended in 200,000-205,000: 5,000 after b
    after_kernel, between = copy_gaps([c, a, b], [50_000, 150_000, 250_000])
    # a is the stream's first copy and no kernel had ended: neither
    assert (after_kernel, between) == ([10_000], [5_000])


def test_the_first_copy_counts_after_a_kernel_only_if_one_ended_before_it():
    first = Activity("copy", 9, 40_000, 60_000, MB)
    assert copy_gaps([first], [50_000]) == ([], [])
    assert copy_gaps([first], [30_000]) == ([10_000], [])


def test_a_two_token_record_summed_by_hand():
    cs, xs = 7, 9
    acts = [
        Activity("kernel", cs, 0, 40_000),            # token 1: compute 40 us
        _copy(40_000, MB, stream=xs),                 # 40,000-63,000, a kernel ended at 40,000 on an idle stream
        Activity("kernel", cs, 65_000, 100_000),      # waits for it: hand-off 2,000, gap 25,000
        Activity("kernel", cs, 104_000, 144_000),     # a launch gap of 4,000 (no copy ends in it)
        _copy(144_000, 2 * MB, stream=xs),            # 144,000-187,000
        Activity("kernel", cs, 188_000, 200_000),     # hand-off 1,000, gap 44,000
        Activity("kernel", 3, 10_000, 11_000),        # another stream's kernel: counted apart
    ]
    s = summarise(acts, tokens=2)
    assert s["span_ms_per_token"] == 0.1  # 200,000 ns over 2 tokens
    assert s["kernels"] == 4 and s["other_stream_kernels"] == 1
    assert s["compute_busy_ms_per_token"] == 0.0635  # (40 + 35 + 40 + 12) us / 2
    assert s["compute_waits_for_copies_ms_per_token"] == 0.0345  # (25 + 44) us / 2
    assert s["compute_other_gaps_ms_per_token"] == 0.002  # 4 us / 2
    assert s["handoff"] == {"n": 2, "median_us": 1.5, "p10_us": 1.0, "p90_us": 2.0}
    assert s["copies"]["fit"] == {"bandwidth_gbps": 50.0, "intercept_us": 3.0, "max_rel_residual": 0.0}
    assert s["copies"]["busy_ms_per_token"] == 0.033  # (23 + 43) us / 2
    assert s["copies"]["bytes"] == 3 * MB and s["copies"]["streams"] == 1
    assert s["copy_start_after_kernel"]["median_us"] == 0.0  # both start as a kernel ends
    assert s["copy_after_copy"] == {"n": 0}


def test_only_copies_that_had_the_link_to_themselves_are_fitted():
    a = _copy(0, MB)                     # 0-23,000 alone
    b = _copy(30_000, MB, stream=9)      # 30,000-53,000, overlapped by c from 50,000
    c = _copy(50_000, MB, stream=10)     # 50,000-73,000
    d = _copy(80_000, 2 * MB)            # alone
    assert activity.lone([d, c, b, a]) == [a, d]


def test_percentiles_are_nearest_rank():
    s = activity._spread([1000.0 * i for i in range(1, 11)])  # 1 ... 10 us
    assert (s["p10_us"], s["median_us"], s["p90_us"]) == (1.0, 5.5, 9.0)


def test_an_event_without_a_duration_is_named():
    trace = _trace([{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "args": {"stream": 7}}])
    with pytest.raises(InputError, match="activity trace: a kernel or copy event without a numeric ts, dur"):
        activities_from_trace(trace, "activity trace")


def test_a_record_with_no_kernel_says_so():
    assert summarise([], tokens=3) == {"kernels": 0, "copies": {"n": 0}}
    with pytest.raises(ValueError):
        summarise([], tokens=0)


def _trace(events):
    return {"traceEvents": events}


def test_a_chrome_trace_gives_its_kernels_and_host_to_device_copies_in_ns_from_the_first():
    trace = _trace([
        {"ph": "X", "cat": "kernel", "name": "gemv", "ts": 1000.5, "dur": 12.25, "args": {"stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 1001.0, "dur": 43.0,
         "args": {"stream": 13, "bytes": 2359296}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 1002.0, "dur": 2.0,
         "args": {"stream": 7, "bytes": 64}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 990.0, "dur": 3.0, "args": {}},
    ])
    assert activities_from_trace(trace) == [Activity("kernel", 7, 0, 12_250), Activity("copy", 13, 500, 43_500, 2359296)]


def test_a_file_that_is_not_a_chrome_trace_is_named():
    with pytest.raises(InputError, match="activity trace: no traceEvents list"):
        activities_from_trace({"events": []}, "activity trace")


def _result(tmp_path, with_activity: bool):
    a = summarise([Activity("kernel", 7, 0, 40_000), _copy(40_000, MB), Activity("kernel", 7, 65_000, 100_000),
                   _copy(100_000, 2 * MB), Activity("kernel", 7, 145_000, 150_000)], tokens=2)
    a.update(complete=True, latency_ms_per_token=0.076, sim_latency_ms_per_token=0.07, sim_stall_ms_per_token=0.03,
             sim_busy_ms_per_token=0.041)
    case = {"context_length": 1024, "policy": "lru", "latency_ms": [0.074, 0.076], "plan": {}}
    if with_activity:
        case["activity"] = a
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"config": "hwconfigs/h100-pcie5.yaml", "overrides": ["model.expert_bits=4"],
                                "model": "granite-3.1-3b-a800m", "device": "NVIDIA H100 80GB HBM3", "cases": [case]}))
    return str(path)


def test_the_report_sets_the_record_beside_the_simulator_and_the_configs_link(tmp_path, capsys):
    assert compare_activity.main([_result(tmp_path, True)]) == 0
    out = capsys.readouterr().out
    assert "untraced 0.075, traced 0.076, simulated 0.070" in out
    assert "record: complete, 2 kernels a token, first to last 0.075 ms a token" in out  # 150 us over 2 tokens
    assert ("compute busy 0.040 (simulated arrays busy 0.041), gaps a copy ended in 0.035 (simulated stall 0.030), "
            "other gaps 0.000; hand-off median 2.0 us (compute.copy_wait_ns 1784 ns)") in out
    # each size's copies against hwconfigs/h100-pcie5.yaml's link: 2,984 ns + 1e6 B / 55.116 B/ns = 21,127.6 ns
    assert "copies of 1000000 B alone: median 23.0 us over 1 (the config's link: 21.128 us" in out
    assert "copies of 2000000 B alone: median 43.0 us over 1 (the config's link: 39.271 us" in out
    assert "their fit: 50.0 GB/s + 3.0 us" in out


def test_a_result_without_a_traced_case_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(InputError, match="no case was replayed with --activity"):
        compare_activity.main([_result(tmp_path, False)])


def _edit_result(tmp_path, edit) -> str:
    path = _result(tmp_path, True)
    meas = json.loads(open(path).read())
    edit(meas["cases"][0], meas["cases"][0]["activity"])
    with open(path, "w") as f:
        f.write(json.dumps(meas))  # NaN as Python's json writes it (and reads it back)
    return path


# each bad field of a traced case: a ZeroDivisionError, KeyError, AttributeError or TypeError, or 'nan' printed
BAD_RECORDS = {
    "activity a string": (lambda c, a: c.__setitem__("activity", "x"),
                          "cases[0].activity: expected a JSON object, got 'x'"),
    "no copies": (lambda c, a: a.pop("copies"), "cases[0].activity.copies: missing"),
    "tokens 0": (lambda c, a: a.__setitem__("tokens", 0),
                 "cases[0].activity.tokens: must be positive (at least 1), got 0"),
    "no latency": (lambda c, a: c.__setitem__("latency_ms", []),
                   "cases[0].latency_ms: expected a non-empty list of numbers, got 0"),
    "busy a string": (lambda c, a: a.__setitem__("compute_busy_ms_per_token", "3"),
                      "cases[0].activity.compute_busy_ms_per_token: expected a number, got '3'"),
    "busy NaN": (lambda c, a: a.__setitem__("compute_busy_ms_per_token", float("nan")),
                 "cases[0].activity.compute_busy_ms_per_token: must be finite, got nan"),
}


@pytest.mark.parametrize("name", BAD_RECORDS)
def test_a_bad_record_field_is_refused_in_one_line_naming_it(tmp_path, capsys, name):
    from chipsim.errors import run_module_main

    edit, words = BAD_RECORDS[name]
    path = _edit_result(tmp_path, edit)
    with pytest.raises(SystemExit) as exc:
        run_module_main(lambda: compare_activity.main([path]))
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == ""  # nothing printed before the line
    assert captured.err == f"chipsim: error: hwreplay result {path}: {words}\n"


def test_the_record_is_for_decode_replays_only(tmp_path):
    from chipsim.hwreplay import run

    with pytest.raises(InputError, match="--activity: for decode steps"):
        run.main(["hwconfigs/h100-pcie5.yaml", "--prompts", "64", "--activity", "--out", str(tmp_path / "o")])
    # the profiler stays attached once it has run: a second context's measured replays would run under it
    with pytest.raises(InputError, match="--activity: one config and one context at a time"):
        run.main(["hwconfigs/h100-pcie5.yaml", "--contexts", "512,1024", "--activity", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_a_traced_cpu_replay_keeps_the_plans_simulated_times_and_finds_no_gpu_work(tmp_path):
    """A CPU dry run under the record: the replay runs as it would untraced (every byte of the plan copied), the
    record has no kernel, and the simulator's side is the plan's own mean over all its tokens."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.activity import traced_replay
    from chipsim.hwreplay.harness import GpuDecodeStep, replay
    from chipsim.hwreplay.ops import primitive_ops
    from chipsim.hwreplay.plan import build_plan
    from chipsim.runner import prepare

    config = tmp_path / "c.yaml"
    config.write_text(f"base: {ROOT}/hwconfigs/h200-pcie5-granite-1b.yaml\nworkload:\n  max_tokens: 3\n"
                      "  warmup_tokens: 0\n")
    prep = prepare(str(config), [], ["lru"])
    m = prep.workload.model
    step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, torch.device("cpu"))
    host = torch.zeros((m.num_moe_layers, m.num_experts, prep.workload.expert_bytes), dtype=torch.uint8)
    plan = build_plan(prep, prep.policies[0])
    slots = torch.zeros((plan.slots, prep.workload.expert_bytes), dtype=torch.uint8)
    copied = []
    a = traced_replay(lambda: copied.append(replay(plan, step, host, slots, m.first_dense_layers)) or copied[-1], plan,
                      plan.fetches)
    assert copied[0]["copied_bytes"] == plan.fetch_bytes
    assert a["kernels"] == 0
    assert not a["complete"]  # the CPU's record holds none of the plan's copies
    assert a["sim_latency_ms_per_token"] == round(sum(plan.sim_latency_ms) / 3, 4)
    assert a["sim_busy_ms_per_token"] == round(sum(plan.sim_busy_ms) / 3, 4)
    # the simulator's token is its arrays' busy time and their idle time, of which the stall is part
    assert a["sim_busy_ms_per_token"] + a["sim_stall_ms_per_token"] <= a["sim_latency_ms_per_token"] + 1e-4
