"""Wall time of the full `chipsim reproduce` (every experiments/*.yaml) on this machine, from empty caches: the
sweeps' result cache and the DRAM calibrations (CHIPSIM_CACHE_DIR points at an empty folder for the run).

    python benchmarks/bench_reproduce.py

Target (issue 17): under 3 minutes on the 2-core CI-class machine. Prints what `chipsim reproduce` records in
DIR/timings.json: the simulations of all experiments in one pool (their DRAM calibrations included), then each
experiment's own time (reading its results from the cache, writing its tables and figures), and the total.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402  (benchmarks/machine.py)


def main() -> None:
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "chipsim.cli", "reproduce", "--out", out, "--quiet",
                        "--report", os.path.join(out, "REPRODUCTION.md")],
                       check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, CHIPSIM_CACHE_DIR=cache),
                       stdout=subprocess.DEVNULL)
        total = time.perf_counter() - start
        timings_path = os.path.join(out, "timings.json")
        if os.path.exists(timings_path):
            with open(timings_path) as f:
                timings = json.load(f)
            print(f"{'(simulations, one pool)':32} {timings.get('simulate_seconds', 0.0):8.1f} s")
            for name, seconds in sorted(timings.get("seconds", {}).items()):
                print(f"{name:32} {seconds:8.1f} s")
        calibrations = len(os.listdir(os.path.join(cache, "dram"))) if os.path.isdir(os.path.join(cache, "dram")) else 0
    print(f"full `chipsim reproduce` (empty caches, {calibrations} DRAM calibrations, {describe()}): "
          f"{total:.1f} s wall (target < 180 s)")


if __name__ == "__main__":
    main()
