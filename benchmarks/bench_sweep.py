"""A large sweep on a Dask LocalCluster: wall time, points per second, and the per-point overhead of the sweep
machinery itself (checking every point, shipping tasks, reading config and trace in the worker, writing the cache
and results.csv), apart from the simulation it runs.

    python benchmarks/bench_sweep.py [--points 10000] [--tokens 4] [--backend dask] [--jobs 0]

Each point is thor with another `dma.setup_ns` (1000, 1001, ...), `no-prefetch` over `--tokens` tokens: a point
whose simulation is short, so the machinery's cost shows. The simulation's own time is the median of 20
in-process `simulate()` calls of such a point; the overhead per point is

    (wall x workers / points) - simulation time,

the time a worker spends on a point beyond simulating it, plus the main process's share spread over the points.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chipsim.analysis.sweep import run_sweep  # noqa: E402
from chipsim.runner import prepare, simulate, summarize_result  # noqa: E402

CONFIG = os.path.join(ROOT, "hwconfigs", "thor.yaml")


def simulation_seconds(tokens: int) -> float:
    """Median wall time of simulating and summarising one point in-process (config and trace already loaded)."""
    prep = prepare(CONFIG, [f"workload.max_tokens={tokens}"], ["no-prefetch"])
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        summarize_result(prep, simulate(prep, prep.policies[0]), prep.policies[0])
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=10000)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--backend", default="dask", choices=("dask", "process"))
    ap.add_argument("--jobs", type=int, default=0, help="workers (default: cores)")
    args = ap.parse_args()
    workers = args.jobs or os.cpu_count() or 1
    sim_s = simulation_seconds(args.tokens)
    grid = {"dma.setup_ns": list(range(1000, 1000 + args.points))}
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        df = run_sweep(CONFIG, grid, ["no-prefetch"], out, overrides=[f"workload.max_tokens={args.tokens}"],
                       jobs=workers, backend=args.backend, progress=False)
        wall = time.perf_counter() - t0
    assert len(df) == args.points and df.attrs["simulated"] == args.points
    per_point = wall * workers / args.points
    print(f"{args.points} points on a {args.backend} {'LocalCluster' if args.backend == 'dask' else 'pool'} of "
          f"{workers} workers, no-prefetch over {args.tokens} tokens each")
    print(f"wall {wall:.1f} s, {args.points / wall:.1f} points/s")
    print(f"per point: {per_point * 1e3:.1f} ms of a worker, of which simulation {sim_s * 1e3:.1f} ms, "
          f"sweep machinery {(per_point - sim_s) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
