"""Memory and time of a long trace: generate a synthetic Granite-3B trace of N tokens, then replay each policy
on it alone, each step in its own process; prints wall time and peak resident memory (ru_maxrss).

    python benchmarks/bench_long_trace.py [--tokens 32768] [--policy apex ...] [--trace existing.npz]

Targets (issue 13): a 32k-token trace generated in under 1 GiB and replayed in under 1 GiB.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["no-prefetch", "oracle", "static-8", "apex", "apex-sf", "promoe", "lru", "spice", "adapmoe", "pregated"]


def measured(argv: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS GiB) of one child process."""
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=ROOT))
    wall = time.perf_counter() - t0
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / (1 << 20)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--trace", help="replay this trace instead of generating one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or os.path.join(tmp, "long.npz")
        if not args.trace:
            wall, rss = measured([sys.executable, "-m", "chipsim.tracegen.synthetic", "--model", "granite-3.1-3b-a800m",
                                  "--tokens", str(args.tokens), "--out", trace])
            print(f"generate {args.tokens} tokens: {wall:.1f} s, peak {rss:.2f} GiB")
        for policy in args.policy or POLICIES:
            # RUSAGE_CHILDREN is the largest child so far: each replay runs in a fresh interpreter through a
            # one-policy wrapper process, so its own figure is read from it
            argv = [sys.executable, "-c",
                    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
                    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                    sys.executable, "-m", "chipsim.cli", "run", os.path.join(ROOT, "hwconfigs", "thor.yaml"),
                    "--trace", trace, "--set", "workload.max_tokens=0", "--policy", policy, "--jobs", "1"]
            t0 = time.perf_counter()
            out = subprocess.run(argv, check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
            print(f"replay {policy:12}: {time.perf_counter() - t0:7.1f} s, peak {int(out.stdout) / (1 << 20):.2f} GiB")


if __name__ == "__main__":
    main()
