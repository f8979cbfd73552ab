"""Many requests served (workload.requests): a Poisson run of Granite-3B on thor (issue #43: 1,000 requests of 256
prompt and 64 output tokens in under a minute on a 2-core machine), each policy simulated once in a fresh process
state after a short warm-up run, with its wall time, steps, steps per second and the process's peak memory.

    python benchmarks/bench_served.py [--requests 1000] [--rps 1.0] [--scheduler continuous] [--policy SPEC ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chipsim.runner import prepare, simulate, summarize_result  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rps", type=float, default=1.0, help="Poisson arrival rate, requests per second")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--scheduler", default="continuous", choices=("static", "continuous", "chunked"))
    ap.add_argument("--policy", action="append")
    a = ap.parse_args()
    keys = [f"workload.prompt_tokens={a.prompt}", f"workload.output_tokens={a.output}",
            f"workload.arrivals.poisson_rps={a.rps}", f"workload.scheduler.kind={a.scheduler}"]
    print(f"{os.path.relpath(a.config, ROOT)}: {a.requests} requests of {a.prompt} + {a.output} tokens, Poisson "
          f"{a.rps:g}/s, {a.scheduler} scheduler; one simulation each after a 20-request warm-up")
    print(f"{'policy':12s} {'simulate s':>10s} {'steps':>6s} {'steps/s':>8s} {'TTFT p99 ms':>11s} {'peak MiB':>8s}")
    for spec in a.policy or ["no-prefetch", "promoe"]:
        warm = prepare(a.config, keys + ["workload.requests=20"], [spec])
        simulate(warm, warm.policies[0])  # operation tables built, caches warm
        prep = prepare(a.config, keys + [f"workload.requests={a.requests}"], [spec])
        start = time.perf_counter()
        result = simulate(prep, prep.policies[0])
        seconds = time.perf_counter() - start
        row = summarize_result(prep, result, prep.policies[0])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{spec:12s} {seconds:10.1f} {result.tokens:6d} {result.tokens / seconds:8.0f} "
              f"{row['ttft_ms_p99']:11.1f} {peak:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
