"""Run chipsim's DRAM validation streams through Ramulator 2.1 and write its results as reference data.

    PYTHONPATH=<ramulator2>/python python validation/dram/run_ramulator.py --out validation/dram/ramulator.json

Ramulator 2.1 is built from source offline (README "Two levels: DRAM"); it is never a dependency of
chipsim. Each point's requests come from chipsim.dramsim.streams (seeded), written as a ReadWriteTrace file, so
both simulators see the same requests (LoadStoreTrace for one channel, ReadWriteTrace for several); the front end offers two requests per memory tick (saturating), the
controllers keep Ramulator's defaults (32-entry read and write buffers unless a point gives its own, write
watermarks 0.2 / 0.8), FR-FCFS with row hits first, open pages; all-bank, per-bank (LPDDR5, GDDR7 and HBM2:
PerBank; HBM3: HBM34PerBankRefresh) or no refresh.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from chipsim.dramsim.points import POINTS, point_requests  # noqa: E402
from chipsim.dramsim.streams import ramulator_loadstore_lines, ramulator_trace_lines  # noqa: E402

RAMULATOR = {  # chipsim standard -> Ramulator 2.1 classes and presets, and its tick in ns (its HBM3 model ticks
    # twice per CK: tick_multiplier = 2 in python/ramulator/dram/hbm3.py; GDDR6 and GDDR7 once)
    "hbm3": ("HBM3", "HBM3_8Gb_8hi", "HBM3_6400Mbps", "HBM34", 0.3125),
    "lpddr5": ("LPDDR5", "LPDDR5_8Gb_x16", "LPDDR5_6400", "LPDDR5", 1.25),
    "ddr4": ("DDR4", "DDR4_8Gb_x8", "DDR4_3200AA", "GenericDDR", 0.625),
    "ddr5": ("DDR5", "DDR5_16Gb_x8", "DDR5_4800AN", "GenericDDR", 0.416),  # the preset's tCK_ps, 416
    "gddr6": ("GDDR6", "GDDR6_8Gb_x16", "GDDR6_14000_1350mV_double", "GenericDDR", 0.570),
    "gddr7": ("GDDR7", "GDDR7_16Gb_x8", "GDDR7_28000_PAM3", "GDDR7", 0.571),
    "hbm2": ("HBM2", "HBM2_8Gb", "HBM2_2000Mbps", "HBM12", 1.0),  # HBM2 ticks once per CK
}

ONE_POINT = r'''
import json, sys
import ramulator
std, org, timing, ctrl_name, channels, refresh, trace, loadstore, page, rb, wb = json.loads(sys.argv[1])
ctrls = []
for _ in range(channels):
    dram = getattr(ramulator.dram, std)(org_preset=org, timing_preset=timing)
    ctrls.append(getattr(ramulator.controller, ctrl_name)(
        dram=dram, read_buffer_size=rb, write_buffer_size=wb, scheduler=ramulator.scheduler.FRFCFSRowHit(), row_policy=ramulator.row_policy.ClosedCAP() if page == "capped" else ramulator.row_policy.Open(),
        addr_mapper=ramulator.addr_mapper.RoBaRaCoCh() if loadstore else ramulator.addr_mapper.PassThroughAddrMapper(),
        refresh_manager=((ramulator.refresh_manager.HBM34PerBankRefresh() if std == "HBM3" else
                          ramulator.refresh_manager.PerBank()) if refresh == "per-bank" else
                         ramulator.refresh_manager.AllBank() if refresh else ramulator.refresh_manager.NoRefresh())))
mem = ramulator.memory_system.GenericDRAM(clock_ratio=1, controllers=ctrls,
                                          channel_mapper=ramulator.channel_mapper.CacheLineInterleave() if loadstore else ramulator.channel_mapper.PassThroughChannelMapper())
fe = (ramulator.frontend.LoadStoreTrace if loadstore else ramulator.frontend.ReadWriteTrace)(clock_ratio=2, path=trace)
sim = ramulator.Simulation(fe, mem)
sim.run()
print(json.dumps(sim.stats))
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "validation", "dram", "ramulator.json"))
    parser.add_argument("--only", help="comma-separated point names")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in POINTS:
            if only and point["name"] not in only:
                continue
            std, reqs = point_requests(point)
            # one channel: LoadStoreTrace (each request its own address); several: ReadWriteTrace address vectors
            # (read-only points: its requests share one address, harmless without writes)
            loadstore = point["channels"] == 1
            lines = ramulator_loadstore_lines(std, reqs) if loadstore else ramulator_trace_lines(std, reqs)
            trace = os.path.join(tmp, f"{point['name']}.trace")
            with open(trace, "w") as f:
                f.write("\n".join(lines) + "\n")
            cls, org, timing, ctrl, tick_ns = RAMULATOR[point["standard"]]
            spec = json.dumps([cls, org, timing, ctrl, point["channels"], point["refresh"], trace, loadstore,
                               point.get("page", "open"), point.get("read_buffer", 32), point.get("write_buffer", 32)])
            proc = subprocess.run([sys.executable, "-c", ONE_POINT, spec], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{point['name']}: ramulator failed: {proc.stderr.strip().splitlines()[-1]}")
            stats = json.loads(proc.stdout.strip().splitlines()[-1])
            ctrl_stats = stats["memory_system"]["controller"]
            ctrl_stats = ctrl_stats if isinstance(ctrl_stats, list) else [ctrl_stats]
            throughput = sum(c["total_throughput_MBps"] for c in ctrl_stats) / 1e3  # GB/s
            served = sum(c["num_read_reqs_served"] for c in ctrl_stats)
            latency_cycles = (sum(c["avg_read_latency"] * c["num_read_reqs_served"] for c in ctrl_stats) / served
                              if served else 0.0)
            row = {"name": point["name"], "bandwidth_gbps": round(throughput, 4),
                   "read_latency_avg_ns": round(latency_cycles * tick_ns, 3),
                   "read_latency_avg_ticks": round(latency_cycles, 3), "tick_ns": tick_ns,
                   "ticks": ctrl_stats[0]["cycles"], "reads_served": served,
                   "writes_served": sum(c["num_write_reqs_served"] for c in ctrl_stats),
                   "row_hits": sum(c["row_hits"] for c in ctrl_stats),
                   "row_misses": sum(c["row_misses"] for c in ctrl_stats),
                   "row_conflicts": sum(c["row_conflicts"] for c in ctrl_stats)}
            print(json.dumps(row))
            results.append(row)
    import ramulator

    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ramulator.__file__))))
    commit = subprocess.run(["git", "-C", source, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump({"tool": "Ramulator 2.1 (CMU-SAFARI/ramulator2)", "commit": commit,
                   "command": "PYTHONPATH=<ramulator2>/python python validation/dram/run_ramulator.py",
                   "requests_per_point": 30000, "points": results}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
