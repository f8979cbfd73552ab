"""Experts computed on the host CPU during a replay, for real: the host's round trip the simulator charges per expert.

A plan's ["host", t, l, [e, ...]] action (chipsim.hwreplay.plan) becomes one program step at the layer's end, after
every GPU expert of the layer has been enqueued, so that the GPU computes those while the host computes these. For
each host expert, one after another, as the simulator's host resource runs them (chipsim.sim.engine._host_job):

1. the token's activation (hidden_size BF16 values) is copied down to pinned host memory on the host stream, behind
   an event recorded on the compute stream where routing became known (the first expert's) or behind the previous
   expert's result (the others'), and the host waits for that copy (Event.synchronize);
2. the host CPU computes the expert with PyTorch on `torch.get_num_threads()` threads (the replay sets the config's
   host_cpu.cores): the expert's primitives (chipsim.hwreplay.ops), each matvec a torch.mv over the expert's BF16
   weights where they are, in the pinned host memory the GPU's copies read too, SFU and vector work as the GPU's;
3. the result (hidden_size BF16 values) is copied up on the host stream and the compute stream waits for it before
   the layer's weighted sum.

While the host waits and computes it enqueues nothing: the GPU runs what was enqueued before and then idles, and
the layers after wait for the host to launch them, as they do in the software that runs experts on the CPU
(Fiddler, SPICE's fallback). `probe()` measures the two config keys this needs, each alone: one expert's CPU time
(host_cpu.memory_bandwidth_gbps = its bytes / that time) and a round trip with nothing computed
(host_cpu.dispatch_overhead_ns = that less the activation's two trips over the link: chipsim.hwreplay.gpuconfig).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from chipsim.hwreplay.harness import kernel_call, weight_bytes, weight_views
from chipsim.hwreplay.ops import Primitive


def expert_width(prims: list[Primitive]) -> tuple[int, int]:
    """(activation elements in, result elements out) of one expert: its first matvec's reduction, its last's rows."""
    mv = [p for p in prims if p.kind == "matvec"]
    return mv[0].reduction, mv[-1].outputs


def host_expert_prims(prims: list[Primitive]) -> list[Primitive]:
    """The expert's primitives, if the host CPU can run them as the replay does: BF16 matvecs (a 4-bit or 8-bit
    operand would need a CPU kernel for its format: none is measured)."""
    bits = sorted({p.bits for p in prims if p.kind == "matvec"})
    if bits != [16]:
        raise ValueError(f"hwreplay: host-CPU experts run BF16 weights; this expert's matvecs are {bits}-bit")
    return prims


class HostExperts:
    """The host CPU's side of a replay: pinned buffers, the host stream, each host expert's calls bound once.
    api: chipsim.hwreplay.harness._sync_api's (Stream, Event, use, make_current, synchronize) for the device."""

    def __init__(self, prims: list[Primitive], host_experts: torch.Tensor, device, api) -> None:
        self.prims = host_expert_prims(prims)
        self.host_experts = host_experts
        Stream, Event, _, self.make_current, _ = api
        pin = device.type == "cuda"
        n_in, n_out = expert_width(prims)
        n_scratch = max([p.elements for p in prims] + [p.outputs for p in prims] + [1])
        n_x = max([p.reduction * p.groups for p in prims] + [1])
        bf16 = torch.bfloat16
        self.x = torch.zeros(n_x, dtype=bf16, pin_memory=pin)  # the activation, copied down
        self.scratch_a = torch.randn(n_scratch, dtype=bf16)
        self.scratch_b = torch.randn(n_scratch, dtype=bf16)
        self.out = torch.zeros(n_scratch + n_x, dtype=bf16, pin_memory=pin)  # the result: its first n_out values
        self.activation = torch.randn(n_in, dtype=bf16, device=device)  # the token's activation on the GPU
        self.result = torch.zeros(n_out, dtype=bf16, device=device)  # where the result lands on the GPU
        self.n_in, self.n_out = n_in, n_out
        self.stream = Stream()
        self.down, self.up = Event(), Event()  # recorded again for every expert (made once: not in the timing)
        self._calls: dict[tuple[int, int], list] = {}
        self.compute_us: list[float] = []  # each host expert's CPU time since the last reset
        self.roundtrip_us: list[float] = []  # each host expert's time on the host, its wait for the activation included

    def calls(self, key: tuple[int, int] | None) -> list:
        """Expert `key`'s (MoE layer, expert) calls over its weights in host memory (None: nothing, an empty job)."""
        if key is None:
            return []
        if key not in self._calls:
            row, views, off = self.host_experts[key[0], key[1]], [], 0
            for p in self.prims:
                if p.kind == "matvec":
                    views.append(weight_views(row[off:], p))
                    off += weight_bytes(p)
            calls, wi = [], 0
            for p in self.prims:
                w = None
                if p.kind == "matvec":
                    w, wi = views[wi], wi + 1
                calls.append(kernel_call(p, w, self.x, self.scratch_a, self.scratch_b, self.out))
            self._calls[key] = calls
        return self._calls[key]

    def bind(self, keys: list) -> None:
        """Every view of these experts made now, before any timing."""
        for key in keys:
            self.calls(key)

    def run(self, routed_event, keys: list, compute_stream) -> None:
        """The host experts `keys` one after another, each a round trip (module docstring); then the compute stream
        waits for the last result. routed_event: recorded on the compute stream where the activation is ready."""
        s, down, up = self.stream, self.down, self.up
        s.wait_event(routed_event)
        for key in keys:
            t0 = time.perf_counter()
            self.make_current(s)
            self.x[:self.n_in].copy_(self.activation, non_blocking=True)  # behind the previous result, in stream order
            down.record(s)
            self.make_current(compute_stream)
            down.synchronize()
            t1 = time.perf_counter()
            for fn, args, kwargs in self.calls(key):
                fn(*args, **kwargs)
            t2 = time.perf_counter()
            self.make_current(s)
            self.result.copy_(self.out[:self.n_out], non_blocking=True)
            up.record(s)
            self.make_current(compute_stream)
            self.compute_us.append((t2 - t1) * 1e6)
            self.roundtrip_us.append((t2 - t0) * 1e6)
        if keys:
            compute_stream.wait_event(up)

    def reset(self) -> None:
        self.compute_us, self.roundtrip_us = [], []


def summary(runner: HostExperts | None) -> dict:
    """The last run's host experts: how many, and their CPU and round-trip times (µs, median and mean)."""
    if runner is None or not runner.compute_us:
        return {}
    c, r = runner.compute_us, runner.roundtrip_us
    return {"host_experts": len(c), "host_compute_us_median": round(statistics.median(c), 2),
            "host_compute_us_mean": round(sum(c) / len(c), 2), "host_roundtrip_us_median": round(statistics.median(r), 2),
            "host_roundtrip_us_mean": round(sum(r) / len(r), 2)}


def _quantiles(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median": round(statistics.median(s), 2), "p10": round(s[len(s) // 10], 2),
            "p90": round(s[(9 * len(s)) // 10], 2), "n": len(s)}


def probe(config: str, threads: int, reps: int, pool_gib: float, device, log=print) -> dict:
    """The two measurements behind the config's host_cpu keys, each alone on this machine (module docstring):
    - one expert of the config's model on the CPU, `threads` threads, the replay's own calls (HostExperts.calls),
      each on the next of enough experts in pinned host memory (`pool_gib`, normal BF16 numbers) that no cache holds
      its weights: median µs over `reps` after one pass over the pool;
    - the round trip of an empty host job (HostExperts.run with nothing to compute) on the GPU's timeline: from an
      event where the activation is ready, the GPU busy before it as in a replay (the host already waiting), to the
      compute stream past its wait for the result: median µs over `reps`."""
    from chipsim.hw.config import load_config
    from chipsim.hwreplay.harness import _sync_api
    from chipsim.hwreplay.ops import primitive_ops
    from chipsim.hwreplay.replay_setup import experts_in_host

    hw = load_config(config, []).hw
    prims = primitive_ops(hw)["expert"]
    expert_bytes = sum(weight_bytes(p) for p in prims if p.kind == "matvec")
    n = max(2, int(pool_gib * (1 << 30)) // expert_bytes)
    host = experts_in_host((1, n, expert_bytes), device)
    torch.set_num_threads(threads)
    api = _sync_api(device)
    runner = HostExperts(prims, host, device, api)
    keys = [(0, i) for i in range(n)]
    runner.bind(keys)
    times = []
    for i in range(n + reps):
        t0 = time.perf_counter()
        for fn, args, kwargs in runner.calls(keys[i % n]):
            fn(*args, **kwargs)
        times.append((time.perf_counter() - t0) * 1e6)
    compute = _quantiles(times[n:])
    log(f"  one expert ({expert_bytes} bytes) on {threads} threads: {compute['median']} us, "
        f"{expert_bytes / compute['median'] / 1e3:.2f} GB/s")
    Stream, Event, use, _, synchronize = api
    cs, trips = Stream(), []
    for i in range(20 + reps):
        a, c = Event(enable_timing=True), Event(enable_timing=True)
        with use(cs):
            if device.type == "cuda":
                torch.cuda._sleep(100_000)  # the GPU busy when the host starts waiting, as in a replay
            a.record(cs)
            runner.run(a, [None], cs)
            c.record(cs)
        synchronize()
        trips.append(a.elapsed_time(c) * 1e3)
    roundtrip = _quantiles(trips[20:])
    log(f"  an empty host job's round trip: {roundtrip['median']} us")
    return {"config": config, "model": hw.model.name, "device": torch.cuda.get_device_name(device)
            if device.type == "cuda" else "cpu (dry run)", "torch": torch.__version__, "threads": threads,
            "cpus": os.cpu_count(), "expert_bytes": expert_bytes, "activation_bytes": 2 * runner.n_in,
            "result_bytes": 2 * runner.n_out, "pool_experts": n, "reps": reps, "expert_us": compute,
            "roundtrip_us": roundtrip}


def set_shape_rate(config_path: str, probe_path: str, probe_res: dict) -> None:
    """A per-shape config (a `base:` config's model swapped) gets its own expert's measured rate: its host_cpu block
    becomes memory_bandwidth_gbps from `probe_res` (the rest of host_cpu stays the base config's)."""
    with open(config_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if "host_cpu:" in lines:  # the block runs to the next blank line
        start = lines.index("host_cpu:")
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        del lines[start:end + 1]
    while lines and not lines[-1].strip():
        lines.pop()
    us = probe_res["expert_us"]["median"]
    gbps = round(probe_res["expert_bytes"] / us / 1e3, 2)
    lines += ["", "host_cpu:", f"  memory_bandwidth_gbps: {gbps}      # measured: this shape's expert, {probe_res['expert_bytes']}"
              f" BF16 bytes / its median {us} us on {probe_res['threads']} threads ({probe_path}, python -m "
              "chipsim.hwreplay.host_cpu); the rest of host_cpu is the base config's", ""]
    with open(config_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv=None) -> int:
    from chipsim.errors import InputError, OneLineParser
    from chipsim.files import write_atomic

    ap = OneLineParser(prog="python -m chipsim.hwreplay.host_cpu",
                       description="measure a host CPU's expert and an empty host job's round trip, each alone "
                                   "(gpuconfig --host-cpu takes the file)")
    ap.add_argument("config", help="the GPU config whose model's expert the host computes")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: every CPU)")
    ap.add_argument("--reps", type=int, default=300, help="timed experts and round trips (default 300)")
    ap.add_argument("--pool-gib", type=float, default=2.0, help="experts in pinned host memory, GiB (default 2)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run (timings meaningless)")
    ap.add_argument("--shape-config", default=None, metavar="CONFIG",
                    help="also write the expert's measured rate into this per-shape config's host_cpu block (CONFIG "
                         "itself: its model is the one timed)")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.reps < 1 or not 0 < a.pool_gib <= 64:
        raise InputError(f"--threads {a.threads}, --reps {a.reps}, --pool-gib {a.pool_gib}: expected whole numbers "
                         ">= 1 and a pool in (0, 64] GiB")
    if a.shape_config is not None:
        if a.shape_config != a.config:
            raise InputError(f"--shape-config {a.shape_config}: the config whose rate is written is the one timed "
                             f"({a.config})")
        with open(a.shape_config, encoding="utf-8") as f:
            if not any(line.startswith("base:") for line in f):
                raise InputError(f"--shape-config {a.shape_config}: not a per-shape config (no base:)")
    res = probe(a.config, a.threads, a.reps, a.pool_gib, torch.device(a.device))
    write_atomic(a.out, json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}")
    if a.shape_config:
        set_shape_rate(a.shape_config, a.out, res)
        print(f"wrote {a.shape_config}'s host_cpu.memory_bandwidth_gbps")
    return 0


if __name__ == "__main__":
    from chipsim.errors import run_module_main

    run_module_main(main)
