"""Replay speed: one policy over 1,024 Granite-3B tokens, per policy and engine, and the default run; each the
median of `--repeats` runs (5). The engine runs compiled where the install compiled it; CHIPSIM_PURE_PYTHON=1 times
it as Python.

    python benchmarks/bench_replay.py [--tokens 1024] [--config hwconfigs/thor.yaml] [--repeats 5]
                                      [--engine fast,reference] [--policy apex ...] [--no-default-run]

The policies are the config's default run plus SPICE and LRU. A policy is simulated in this process (config and
trace loaded once, as a worker of `chipsim run` does); the default run is `chipsim run CONFIG` as a user types
it, in a fresh process (loading, the worker pool and the output included).
Targets (issue 17, this 2-core machine): every policy under 1 s; the default run under 10 s.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chipsim.runner import prepare, simulate  # noqa: E402
from machine import describe  # noqa: E402  (benchmarks/machine.py)

EXTRA_POLICIES = ["spice", "lru"]


def _median_spread(times: list[float]) -> str:
    return f"{statistics.median(times):8.2f} {min(times):6.2f} {max(times):6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine", default="fast", help="comma-separated: fast, reference")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--no-default-run", action="store_true")
    args = parser.parse_args()
    engines = args.engine.split(",")
    policies = args.policy
    if not policies:
        defaults = prepare(args.config).config.hw.run.policies
        policies = list(defaults) + [p for p in EXTRA_POLICIES if p not in defaults]
    import chipsim.sim

    build = chipsim.sim.BUILD + (", C event core" if chipsim.sim.NATIVE else "")
    print(f"{args.tokens} tokens, median of {args.repeats} runs (min, max), wall seconds; engine {build}; "
          f"machine {describe()}")
    print(f"{'policy':14} {'engine':9} {'median':>8} {'min':>6} {'max':>6} {'token-layers/s':>15}")
    for engine in engines:
        prep = prepare(args.config, [f"workload.max_tokens={args.tokens}", f"run.engine={engine}"], policies)
        layers = prep.workload.model.num_layers
        for policy in prep.policies:
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = simulate(prep, policy)
                times.append(time.perf_counter() - t0)
            rate = result.tokens * layers / statistics.median(times)
            print(f"{policy.label:14} {engine:9} {_median_spread(times)} {rate:>15.0f}", flush=True)
    if args.no_default_run:
        return
    for engine in engines:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "chipsim.cli", "run", args.config, "--engine", engine], check=True,
                           capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT))
            times.append(time.perf_counter() - t0)
        print(f"default run (`chipsim run {os.path.relpath(args.config, ROOT)} --engine {engine}`): "
              f"{_median_spread(times)}", flush=True)


if __name__ == "__main__":
    main()
