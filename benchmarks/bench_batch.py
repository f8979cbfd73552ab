"""Several tokens a step: B sequences decoded together (workload.batch) and speculative verify steps
(workload.speculative), per policy the median of `--repeats` simulations in this process after one warm-up, with
the steps simulated per second.

    python benchmarks/bench_batch.py [--config hwconfigs/thor.yaml] [--batch 8] [--tokens 128] [--draft 4]
                                     [--repeats 3] [--policy SPEC ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chipsim.runner import prepare, simulate  # noqa: E402

DEFAULT = ["no-prefetch", "apex", "lru", "promoe", "spice", "oracle"]


def median_seconds(prep, policy, repeats: int) -> tuple[float, int]:
    simulate(prep, policy)  # warm-up: operation tables and expert GEMM shapes built
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = simulate(prep, policy)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result.tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="decode steps per sequence")
    ap.add_argument("--draft", type=int, default=4, help="draft tokens of the speculative run (rate 0.8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policy", action="append")
    a = ap.parse_args()
    runs = {f"batch {a.batch}": [f"workload.batch={a.batch}", f"workload.max_tokens={a.tokens}"],
            f"speculative {a.draft}": [f"workload.speculative.draft_tokens={a.draft}", "workload.speculative.draft=rate",
                                       "workload.speculative.acceptance=0.8", f"workload.max_tokens={a.tokens}"]}
    print(f"{os.path.relpath(a.config, ROOT)}, median of {a.repeats} simulations after a warm-up")
    print(f"{'run':16s} {'policy':12s} {'simulate s':>10s} {'steps':>6s} {'steps/s':>8s}")
    for name, keys in runs.items():
        prep = prepare(a.config, keys, a.policy or DEFAULT)
        for policy in prep.policies:
            seconds, steps = median_seconds(prep, policy, a.repeats)
            print(f"{name:16s} {policy.label:12s} {seconds:10.3f} {steps:6d} {steps / seconds:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
