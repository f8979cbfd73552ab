"""The host's front-end (host_frontend): a routing read back by the host, and experts copied from pageable memory,
checked against hand sums on the tiny model and against what a host thread held in its copies allows."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import native_core

from chipsim.hw.paths import fetch_path_timing
from chipsim.runner import prepare, simulate
from chipsim.sim.observe import Observer
from chipsim.units import gbps_to_bytes_per_s, ns_to_ps

ROOT = Path(__file__).resolve().parents[1]
# pageable copies, from one host thread: one at a time in issue order (thor's DMA has four engines, demand first)
PAGEABLE = ["host_frontend.expert_memory=pageable", "host_frontend.pageable_bandwidth_gbps=2.5",
            "host_frontend.pageable_setup_ns=7000", "dma.engines=1", "dma.demand_first=false",
            "dma.demand_preempts_prefetch=false", "dma.cancel_in_flight=false"]


def _run(cfg, sets, policy, engine="fast"):
    prep = prepare(cfg, sets + [f"run.engine={engine}"], [policy])
    return prep, simulate(prep, prep.policies[0])


def test_a_routing_read_back_idles_the_machine_once_per_moe_layer(tiny):
    """routing: host: every MoE layer (3) waits 20 µs after its router before anything the host enqueues after
    reading the routing back; nothing else moves. The wait is the layer's stall (its experts wait for the host's
    decision), so a token is still exactly its arrays' time and its stall (the arrays idle only when stalled)."""
    cfg = tiny.config(tiny.routing())
    _, base = _run(cfg, [], "no-prefetch")
    native_core()  # "fast" is the C core (skipped where it was not built)
    for engine in ("fast", "reference"):
        _, result = _run(cfg, ["host_frontend.routing=host", "host_frontend.routing_readback_ns=20000"],
                         "no-prefetch", engine)
        assert (result.per_token.latency_ps == base.per_token.latency_ps + 3 * ns_to_ps(20000)).all()
        assert (result.per_token.stall_ps == base.per_token.stall_ps + 3 * ns_to_ps(20000)).all()
        assert (result.per_token.idle_ps == result.per_token.stall_ps).all()
        assert result.counts.fetches_total == base.counts.fetches_total
        assert (result.per_token.bytes["pcie"] == base.per_token.bytes["pcie"]).all()
    # routing: device (the default) reads no read-back time
    _, same = _run(cfg, ["host_frontend.routing_readback_ns=20000"], "no-prefetch")
    assert (same.per_token.latency_ps == base.per_token.latency_ps).all()


def test_pageable_copies_move_at_their_own_rate_and_fixed_cost(tiny):
    """The tiny no-prefetch hand sum (tests/test_engine.py) with pageable copies: a layer's two routed experts are
    copied one after the other, each 7 µs (the pageable fit's intercept, in place of dma.setup_ns, the link's
    latency inside it) and then its bytes at 2.5 GB/s (below the path's bandwidth: the copy's own rate binds); the
    first expert does not start under the second's copy (the copy holds the host), so both then run back to
    back."""
    cfg = tiny.config(tiny.routing())
    for engine in ("fast", "reference"):
        prep, result = _run(cfg, PAGEABLE, "no-prefetch", engine)
        wl, hw = prep.workload, prep.config.hw
        path = fetch_path_timing(hw)
        assert gbps_to_bytes_per_s(path.bandwidth_gbps) > gbps_to_bytes_per_s(2.5)
        fetch_ps = 2 * (ns_to_ps(7000) + -(-wl.expert_bytes * 10**12 // gbps_to_bytes_per_s(2.5)))
        expected = sum(c.attention.duration_ps + c.router.duration_ps + fetch_ps + 2 * c.expert.duration_ps
                       + c.combine.duration_ps for c in wl.layers) + wl.token_head.duration_ps
        assert (result.per_token.latency_ps == expected).all()
        assert (result.per_token.stall_ps == 3 * fetch_ps).all()
        assert (result.per_token.idle_ps == result.per_token.stall_ps).all()


class _Spans(Observer):
    """Each op group's start, each fetch's issue and landing, each stall's span."""

    def __init__(self):
        self.op_starts, self.copies, self.stalls = [], [], []

    def stall(self, layer, start, end):
        self.stalls.append(end - start)

    def ops(self, kind, index, experts, start, end):
        self.op_starts.append(start)

    def landed(self, layer, expert, demand, issue_ps, end_ps):
        self.copies.append((issue_ps, end_ps))


def _op_starts_during_copies(cfg, sets, policy):
    prep = prepare(cfg, sets, [policy])
    spans = _Spans()
    simulate(prep, prep.policies[0], observers=[spans])
    assert spans.copies, "the run fetched nothing"
    return sum(1 for s in spans.op_starts for i, e in spans.copies if i <= s < e)


@pytest.mark.parametrize("policy", ["oracle", "lru", "no-prefetch"])
def test_no_work_starts_while_a_pageable_copy_holds_the_host(tiny, policy):
    """A pageable copy holds the host thread that issued it, so no op group starts while one is in flight (what was
    enqueued before it may still be running). With pinned copies the oracle's ops do start under its prefetches:
    the check can tell the two apart."""
    cfg = tiny.config(tiny.routing(tokens=8), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    assert _op_starts_during_copies(cfg, PAGEABLE, policy) == 0
    if policy == "oracle":  # it prefetches the next layer's experts while this one computes
        assert _op_starts_during_copies(cfg, [], policy) > 0


def test_the_stall_spans_add_up_to_the_stall_with_read_backs_and_pageable_copies(tiny):
    """Every wait of the arrays, for expert bytes, for a routing read back or for a host held in pageable copies (the
    oracle's prefetches hold it before attention too), is a stall span, and the spans add up to the run's stall."""
    cfg = tiny.config(tiny.routing(tokens=8), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    for sets in ([], PAGEABLE, PAGEABLE + ["host_frontend.routing=host", "host_frontend.routing_readback_ns=15000"]):
        prep = prepare(cfg, sets, ["oracle"])
        spans = _Spans()
        result = simulate(prep, prep.policies[0], observers=[spans])
        assert sum(spans.stalls) == result.per_token.stall_ps.sum() > 0, sets
        assert (result.per_token.idle_ps == result.per_token.stall_ps).all(), sets


def test_pageable_results_are_the_same_on_both_engines(tiny):
    native_core()  # the fast engine is the C core here (skipped where it was not built)
    cfg = tiny.config(tiny.routing(tokens=8), extra_yaml="expert_buffer:\n  capacity_mib: 2\n")
    for policy in ("promoe", "lru", "oracle"):
        _, fast = _run(cfg, PAGEABLE + ["host_frontend.routing=host", "host_frontend.routing_readback_ns=15000"],
                       policy, "fast")
        _, ref = _run(cfg, PAGEABLE + ["host_frontend.routing=host", "host_frontend.routing_readback_ns=15000"],
                      policy, "reference")
        assert (fast.per_token.latency_ps == ref.per_token.latency_ps).all(), policy
        assert (fast.per_token.stall_ps == ref.per_token.stall_ps).all(), policy


@pytest.mark.parametrize("sets, message", [
    (["host_frontend.expert_memory=pageable"],
     "host_frontend.pageable_bandwidth_gbps: host_frontend.expert_memory: pageable needs it (at least 0.001 GB/s)"),
    (["host_frontend.expert_memory=pageable", "host_frontend.pageable_bandwidth_gbps=1e-10"],
     "host_frontend.pageable_bandwidth_gbps: host_frontend.expert_memory: pageable needs it (at least 0.001 GB/s)"),
    (["host_frontend.expert_memory=pageable", "host_frontend.pageable_bandwidth_gbps=7"],  # thor: 4 engines
     "host_frontend.expert_memory: pageable: the host thread issues one copy at a time"),
    (["host_frontend.routing=gpu"], "host_frontend.routing"),
    (["host_frontend.readback_ns=5"], "host_frontend.readback_ns: unknown key"),
])
def test_a_bad_host_frontend_key_is_one_line_naming_it(thor_path, sets, message):
    args = [sys.executable, "-m", "chipsim.cli", "run", thor_path, "--policy", "no-prefetch"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------- the replay and gpuconfig
def _granite_1b(tmp_path, extra=""):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: {ROOT}/hwconfigs/h200-pcie5-granite-1b.yaml\nworkload:\n  max_tokens: 2\n"
                    f"  warmup_tokens: 0\n{extra}")
    return str(path)


def test_the_replay_reads_back_every_moe_layers_routing_before_what_follows_it(tmp_path):
    """routing: host in the replay: one blocking read on the compute stream per (token, MoE layer), placed right at
    the plan's routing point, before the layer's demand copies and experts; none with routing: device."""
    torch = pytest.importorskip("torch")
    from chipsim.hwreplay.harness import GpuDecodeStep, _compiled, _sync_api
    from chipsim.hwreplay.ops import primitive_ops
    from chipsim.hwreplay.plan import build_plan

    cpu = torch.device("cpu")
    for routing, reads in (("host", True), ("device", False)):
        prep = prepare(_granite_1b(tmp_path), [f"host_frontend.routing={routing}",
                                               "host_frontend.routing_readback_ns=20000"], ["no-prefetch"])
        m = prep.workload.model
        step = GpuDecodeStep(primitive_ops(prep.config.hw), m.num_layers, m.first_dense_layers, cpu)
        plan = build_plan(prep, prep.policies[0])
        host = torch.zeros((m.num_moe_layers, m.num_experts, step.expert_bytes), dtype=torch.uint8)
        slots = torch.zeros((plan.slots, step.expert_bytes), dtype=torch.uint8)
        Stream, Event, *_ = _sync_api(cpu)
        compiled = _compiled(plan, step, host, slots, m.first_dense_layers, False, Event, Stream(), [Stream()],
                             host_routing=reads)
        kinds = [op[0] for op in compiled.prog]
        assert kinds.count("sync") == (plan.tokens * m.num_moe_layers if reads else 0)
        if reads:  # each read right after its layer's attention and router, its demand copies right after it
            for i, kind in enumerate(kinds):
                if kind == "sync":
                    assert kinds[i - 1] == "c"
                    assert [k for k in kinds[i + 1:] if k != "rec"][0] == "x"


def test_gpuconfig_writes_the_fitted_pageable_rate_and_the_read_back(tmp_path):
    """Pageable copies of 1 and 4 MiB at exactly t = 10 µs + N / 5 GB/s, and a 64 MiB one far off the line (outside
    the 256 KiB-16 MiB fit, as the pinned fit's sizes): the block says 5.0 GB/s and 10,000 ns, the read-back's median
    in ns, and keeps the replays' software (routing device, pinned experts)."""
    import json

    import yaml

    from chipsim.errors import InputError
    from chipsim.hwreplay import gpuconfig

    def us(n):
        return 10 + n / 5e3

    probe = {"readback": {"tolist": {"gpu_idle_us": 18.672, "n": 100}},
             "copies": {"pageable": {"copies": [{"bytes": b, "gpu_us": us(b)} for b in (1 << 20, 4 << 20)]
                                     + [{"bytes": 64 << 20, "gpu_us": 99999.0}]}}}
    (tmp_path / "fe.json").write_text(json.dumps(probe))
    out = tmp_path / "h.yaml"
    microbench = str(ROOT / "validation" / "h100" / "h100-microbench.json")
    assert gpuconfig.main([microbench, "--out", str(out), "--kernel-launch", "graph",
                           "--host-frontend", str(tmp_path / "fe.json")]) == 0
    block = yaml.safe_load(out.read_text())["host_frontend"]
    assert block == {"routing": "device", "routing_readback_ns": 18672.0, "expert_memory": "pinned",
                     "pageable_bandwidth_gbps": 5.0, "pageable_setup_ns": 10000.0}
    probe["copies"]["pageable"]["copies"] = probe["copies"]["pageable"]["copies"][:1]
    (tmp_path / "fe.json").write_text(json.dumps(probe))
    with pytest.raises(InputError, match="two sizes or more"):
        gpuconfig.main([microbench, "--out", str(out), "--kernel-launch", "graph",
                        "--host-frontend", str(tmp_path / "fe.json")])
