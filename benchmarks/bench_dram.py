"""Speed of the command-level DRAM model: calibrating a config's memories from a cold cache (target: under 30 s
per config on this 2-core machine), and the Ramulator validation points.

    python benchmarks/bench_dram.py [--config hwconfigs/thor.yaml]
"""

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["CHIPSIM_CACHE_DIR"] = cache
        from chipsim.dramsim import calibrate as cal
        from chipsim.dramsim import validate
        from chipsim.hw.config import load_config, memory_tiers
        from chipsim.hw.paths import memory_timing

        hw = load_config(args.config).hw
        total = 0.0
        for name, (key, d) in memory_tiers(hw).items():
            if d.timing_model != "command-level":
                continue
            start = time.perf_counter()
            t = memory_timing(hw, name)
            took = time.perf_counter() - start
            total += took
            print(f"calibrate {key:16} {took:5.2f} s cold: {t.effective_gbps:.1f} GB/s, turnaround {t.turnaround:.2f}, "
                  f"first byte {t.access_latency_ns:.1f} ns")
        start = time.perf_counter()
        for name in memory_tiers(hw):
            memory_timing(hw, name)
        cal.calibrate.cache_clear()
        for name in memory_tiers(hw):
            memory_timing(hw, name)
        print(f"calibrate config     {total:5.2f} s cold, {time.perf_counter() - start:.3f} s from the cache")
        start = time.perf_counter()
        for point in validate.POINTS:
            validate.run_point(point)
        print(f"validation points    {time.perf_counter() - start:5.2f} s for {len(validate.POINTS)} points")


if __name__ == "__main__":
    main()
