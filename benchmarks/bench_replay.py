"""Replay speed: simulated token-layers per wall second, per policy, and the wall time of the default run.

    python benchmarks/bench_replay.py [--tokens 1024] [--config hwconfigs/thor.yaml]

Targets (issue 2, this 2-core machine): one policy over 1,024 Granite-3B tokens < 10 s (aim 3 s);
`chipsim run hwconfigs/thor.yaml` with its default policies < 30 s.
"""

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chipsim.runner import prepare, simulate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--policy", action="append")
    args = parser.parse_args()
    prep = prepare(args.config, [f"workload.max_tokens={args.tokens}"], args.policy or ())
    layers = prep.workload.model.num_layers
    print(f"{prep.trace.provenance_line()}")
    print(f"{'policy':14} {'tokens':>6} {'wall s':>8} {'cpu s':>8} {'token-layers/s':>15}")
    for policy in prep.policies:
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(prep, policy)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        n = result.tokens * layers
        print(f"{policy.label:14} {result.tokens:>6} {wall:>8.2f} {cpu:>8.2f} {n / wall:>15.0f}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "chipsim.cli", "run", args.config], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=ROOT))
    print(f"default run (`chipsim run {os.path.relpath(args.config, ROOT)}`, all default policies): "
          f"{time.perf_counter() - start:.1f} s wall")


if __name__ == "__main__":
    main()
