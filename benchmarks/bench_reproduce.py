"""Wall time of the full `chipsim reproduce` (every experiments/*.yaml, empty cache) on this machine.

    python benchmarks/bench_reproduce.py

Target (issue 5): under 15 minutes on the 2-core CI-class machine. Prints the per-experiment timings that
`chipsim reproduce` records in DIR/timings.json and the total.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "chipsim.cli", "reproduce", "--out", out, "--quiet",
                        "--report", os.path.join(out, "REPRODUCTION.md")],
                       check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL)
        total = time.perf_counter() - start
        timings_path = os.path.join(out, "timings.json")
        if os.path.exists(timings_path):
            with open(timings_path) as f:
                per_experiment = json.load(f).get("seconds", {})
            for name, seconds in sorted(per_experiment.items()):
                print(f"{name:32} {seconds:8.1f} s")
    print(f"full `chipsim reproduce` (empty cache, {os.cpu_count()} cores): {total:.1f} s wall (target < 900 s)")


if __name__ == "__main__":
    main()
