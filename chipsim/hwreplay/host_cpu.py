"""The two measurements behind a GPU config's host_cpu keys, each alone on the machine it runs on (issue #44 item 1):
one routed expert computed on the host CPU as the replay computes it (chipsim.hwreplay.host_experts), and an empty
host job's round trip on the GPU's timeline. `gpuconfig --host-cpu FILE` writes host_cpu.memory_bandwidth_gbps (the
expert's bytes / its median time), dispatch_overhead_ns (the round trip less the activation's two PCIe trips, which
the simulator charges apart: chipsim.workload.host.host_timing) and cores (the threads). On a GPU the probe also
times the expert while host-to-device copies stream from the same host memory (`beside_copies`): what the host
DRAM's keys (`lpddr5x` in the GPU configs, ASSUMPTIONs) would need to say for the simulator's shared host-memory
flows to slow it as the host does; no key takes it yet.

    python -m chipsim.hwreplay.host_cpu hwconfigs/h100-pcie5.yaml --out validation/h100/h100-host-cpu-expert.json
    python -m chipsim.hwreplay.host_cpu CONFIG --shape-config CONFIG --out F    (a per-shape config: its own rate)
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from chipsim.hwreplay.host_experts import HostExperts
from chipsim.hwreplay.kernels import weight_bytes


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
    compute = _quantiles(_expert_times(runner, keys, reps)[n:])
    log(f"  one expert ({expert_bytes} bytes) on {threads} threads: {compute['median']} us, "
        f"{expert_bytes / compute['median'] / 1e3:.2f} GB/s")
    beside = _beside_copies(runner, keys, reps, device, log) if device.type == "cuda" else None
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
            "roundtrip_us": roundtrip, "beside_copies": beside}


def _expert_times(runner: HostExperts, keys: list, reps: int) -> list[float]:
    """µs of each of one pass over `keys` then `reps` more experts, back to back (the pass's first: a cold pool)."""
    times = []
    for i in range(len(keys) + reps):
        t0 = time.perf_counter()
        for fn, args, kwargs in runner.calls(keys[i % len(keys)]):
            fn(*args, **kwargs)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def _beside_copies(runner: HostExperts, keys: list, reps: int, device, log) -> dict:
    """The same experts while pinned host-to-device copies stream out of the same host memory (as a policy that fetches
    and computes on the host at once, CG-MoE, makes them), and the copies' rate while they do: whether the CPU and
    the copy engine share the host DRAM's bandwidth (the simulator's host-memory flows, `lpddr5x`) on this host.
    16 MiB copies from a 1 GiB pinned pool, enqueued ahead to outlast the timed experts; their rate is their mean
    over their whole span."""
    from chipsim.hwreplay.host_frontend import stream_copies

    t_alone = sum(_expert_times(runner, keys[:1], min(reps, 20))[1:]) / max(1, min(reps, 20))  # a rough expert time
    # the timed span's worth at 60 GB/s and a fifth more: the copies outlast the experts (checked), not by much, so
    # their mean rate is mostly the rate beside the CPU's reads
    copies = max(64, int(1.2 * (len(keys) + reps) * t_alone * 1e-6 * 60e9 / (16 << 20)))
    start, end, nbytes, _buffers = stream_copies(device, copies)
    times = _expert_times(runner, keys, reps)
    busy = not end.query()  # the copies outlasted the experts: every timed expert ran beside them
    torch.cuda.synchronize()
    copy_gbps = nbytes / (start.elapsed_time(end) * 1e-3) / 1e9
    out = {"expert_us": _quantiles(times[len(keys):]), "copies_gbps": round(copy_gbps, 2),
           "copies_outlasted_experts": busy}
    log(f"  one expert beside copies at {copy_gbps:.1f} GB/s: {out['expert_us']['median']} us"
        + ("" if busy else " (the copies ended first: some experts ran alone)"))
    return out


def set_shape_rate(config_path: str, probe_path: str, probe_res: dict) -> None:
    """A per-shape config (a `base:` config's model swapped) gets its own expert's measured rate: its host_cpu block
    becomes memory_bandwidth_gbps from `probe_res` (the rest of host_cpu stays the base config's)."""
    from chipsim.files import write_atomic

    with open(config_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if "host_cpu:" in lines:  # the block: its indented and blank lines, up to the next top-level key
        start = lines.index("host_cpu:")
        end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "#")), len(lines))
        del lines[start:end]
    while lines and not lines[-1].strip():
        lines.pop()
    us = probe_res["expert_us"]["median"]
    gbps = round(probe_res["expert_bytes"] / us / 1e3, 2)
    lines += ["", "host_cpu:", f"  memory_bandwidth_gbps: {gbps}      # measured: this shape's expert, {probe_res['expert_bytes']}"
              f" BF16 bytes / its median {us} us on {probe_res['threads']} threads ({probe_path}, python -m "
              "chipsim.hwreplay.host_cpu); the rest of host_cpu is the base config's", ""]
    write_atomic(config_path, "\n".join(lines))


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
    if a.device != "cpu" and not a.device.startswith("cuda"):
        raise InputError(f"--device {a.device}: expected cuda (or cuda:N) or cpu")
    if not os.path.isfile(a.config):
        raise InputError(f"{a.config}: no such config file")
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
