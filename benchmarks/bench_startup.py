"""Start-up: what `chipsim run CONFIG --policy apex` spends before the simulation's first event, phase by phase, and
the whole process's wall time; each the median of `--repeats` runs (5), every run a fresh process.

    python benchmarks/bench_startup.py [--config hwconfigs/thor.yaml] [--policy apex ...] [--repeats 5]
                                       [--root DIR] [--imports 12]

The chipsim measured is the one under --root (default: this repository), run by this interpreter (the repository
with its compiled modules where it was built in place, e.g. an editable install). The caches are warm: one run
before the timed ones fills them (calibration, operation tables), as every run after a user's first finds them.

- phases: a small driver (`python -c`) imports the modules `chipsim run` imports, wraps, from outside, the functions
  the run calls (no probe in chipsim) with timers, then runs `chipsim.cli.main` as the command would. Each phase is
  its functions' own time (a phase called inside another counts for itself only; so do the imports made on the way):
  interpreter (process start to the driver's first line), imports, config (read, merge, check), DRAM standards and
  calibration caches, trace (read, check), policy prepare (parse, check, the throwaway set-up), workload (the
  decode step's operations, rates, time bound), other (the rest of `prepare` and the command), and pool (entering
  the policy runner to the first `runner.simulate` call: the workers' start, where there are several policies).
  The first event is the first `simulate` call; the driver ends there when it runs in the command's process.
- imports: `-X importtime` of the command as a user types it, self time grouped by package (chipsim's modules
  by their subpackage), the largest first; -X importtime's own overhead inflates it.
- process start to the first event: the headline, the same command with nothing timed but the first event (the
  phases' timers wrap every import and slow the timed driver, whose total is shown above it).
- whole process: `python -m chipsim.cli run CONFIG --policy ...` as a user types it, start to exit.
- floor: a fresh process that only imports numpy and reads and hashes what a warm run must read and check before
  its first event (the trace file, whose sha256 keys the trace cache and the provenance, and the arrays the run
  reads from the trace's checked, unpacked copy in the cache): no run that reads its trace with numpy and never
  trusts a cache unchecked starts sooner on this machine.
- bytecode: every process runs without PYTHONDONTWRITEBYTECODE, so the warm-up run writes __pycache__ as a user's
  first run (or pip, installing) does; a machine that sets it compiles chipsim's sources in every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from machine import describe  # noqa: E402  (benchmarks/machine.py)

# The driver: argv[1] the file the first-event mark goes to, argv[2:] the command's arguments after `chipsim`.
# time.monotonic() is CLOCK_MONOTONIC, one clock for every process, so the parent's start and a worker's first
# event compare with the driver's phases.
DRIVER = r"""
import time
T_UP = time.monotonic()
import builtins, json, os, sys

MARKS, ARGV = sys.argv[1], sys.argv[2:]
MAIN_PID = os.getpid()
PHASES = {}
STACK = []  # [phase, started, time of nested phases]


def enter(phase):
    STACK.append([phase, time.monotonic(), 0.0])


def leave():
    phase, started, nested = STACK.pop()
    spent = time.monotonic() - started
    PHASES[phase] = PHASES.get(phase, 0.0) + spent - nested
    if STACK:
        STACK[-1][2] += spent


def timed(phase, fn):
    def wrapper(*args, **kwargs):
        if STACK and STACK[-1][0] == phase:
            return fn(*args, **kwargs)
        enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            leave()
    return wrapper


builtins.__import__ = timed("imports", builtins.__import__)
enter("imports")
import chipsim.cli
from chipsim import runner
from chipsim.analysis import report  # what `chipsim run` imports (cli._cmd_run)
from chipsim.hw import paths
import chipsim.dramsim.calibrate as calibrate
from chipsim.trace import format as trace_format
leave()

for name, phase in (("load_config", "config"), ("check_op_keys", "workload"), ("check_policy_config", "policy"),
                    ("make_policy", "policy"), ("_check_rates", "workload"), ("build_workload", "workload"),
                    ("_check_time_fits", "workload"), ("_check_policy", "policy")):
    setattr(runner, name, timed(phase, getattr(runner, name)))
for name in ("load", "check_arrays"):
    setattr(trace_format, name, timed("trace", getattr(trace_format, name)))
for name in ("retimed_standard", "_calibrate"):
    setattr(calibrate, name, timed("calibration", getattr(calibrate, name)))
RUN = {}  # when the policy runner was entered, and the phases' totals then
run_all = runner.run_policies_with_timelines


def run_policies_with_timelines(*args, **kwargs):
    RUN.update(t=time.monotonic(), phases=dict(PHASES))
    return run_all(*args, **kwargs)


simulate = runner.simulate


def first_event(*args, **kwargs):
    with open(MARKS, "a") as f:
        f.write(f"{time.monotonic()!r}\n")
    if os.getpid() == MAIN_PID:
        report_and_exit()
    return simulate(*args, **kwargs)


def report_and_exit():
    with open(MARKS) as f:
        t_first = min(float(line) for line in f)
    phases = dict(RUN["phases"])
    during_main = sum(phases.values()) - IMPORTS_BEFORE_MAIN
    phases["imports"] += T_MAIN - T_UP - IMPORTS_BEFORE_MAIN  # the driver's own set-up (microseconds) with them
    phases["other"] = RUN["t"] - T_MAIN - during_main
    phases["pool"] = t_first - RUN["t"]
    sys.__stdout__.write("\nSTARTUP " + json.dumps({"up": T_UP, "first_event": t_first, **phases}) + "\n")
    sys.__stdout__.flush()
    os._exit(0)


runner.run_policies_with_timelines = run_policies_with_timelines
runner.simulate = first_event
IMPORTS_BEFORE_MAIN = PHASES["imports"]
T_MAIN = time.monotonic()
rc = chipsim.cli.main(ARGV)
report_and_exit() if RUN else sys.exit(f"no simulation ran (exit {rc})")
"""

PHASE_ORDER = ("interpreter", "imports", "config", "calibration", "trace", "policy", "workload", "other", "pool")
PHASE_WORDS = {
    "interpreter": "interpreter start (to the first line)",
    "imports": "imports",
    "config": "config read and checks",
    "calibration": "DRAM standards, calibration caches",
    "trace": "trace load and checks",
    "policy": "policy prepare",
    "workload": "workload, rates, time bound",
    "other": "other (prepare, command)",
    "pool": "worker/pool start",
}


def _env(root: str) -> dict:
    # bytecode as a user's install has it: pip compiles it when it installs, and Python writes __pycache__ at the
    # first import of an editable install (the warm-up run here), unless PYTHONDONTWRITEBYTECODE is set, as it is
    # on some CI and sandbox machines; there every run would compile chipsim's sources again (~0.07 s)
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _command(args) -> list[str]:
    out = ["run", args.config]
    for policy in args.policy:
        out += ["--policy", policy]
    return out


def measure_phases(args) -> dict[str, float]:
    """One fresh driver process: seconds per phase, and `first_event`: process start to the first event."""
    with tempfile.TemporaryDirectory() as tmp:
        marks = os.path.join(tmp, "first-event")
        t_start = time.monotonic()
        child = subprocess.run([sys.executable, "-c", DRIVER, marks, *_command(args)], capture_output=True,
                               text=True, env=_env(args.root), cwd=args.root)
    line = next((x for x in child.stdout.splitlines() if x.startswith("STARTUP ")), None)
    if line is None:
        raise SystemExit(f"bench_startup: the driver failed (exit {child.returncode}):\n{child.stderr[-2000:]}")
    found = json.loads(line[len("STARTUP "):])
    phases = {name: found.get(name, 0.0) for name in PHASE_ORDER if name != "interpreter"}
    phases["interpreter"] = found["up"] - t_start
    phases["first_event"] = found["first_event"] - t_start
    return phases


# The same command with nothing timed but its first event: the phases' timers (every import statement goes through
# a Python wrapper) slow the instrumented driver by tens of milliseconds, so its total is not the start-up a user
# sees; this driver only replaces `runner.simulate` with a mark and an exit.
PLAIN = r"""
import os, sys, time
import chipsim.cli
from chipsim import runner


def first_event(*args, **kwargs):
    sys.__stdout__.write(f"FIRST {time.monotonic()!r}\n")
    sys.__stdout__.flush()
    os._exit(0)


runner.simulate = first_event
sys.exit(chipsim.cli.main(sys.argv[1:]))
"""


def first_event_plain(args) -> float:
    """Process start to the first event of the uninstrumented command (seconds)."""
    t_start = time.monotonic()
    child = subprocess.run([sys.executable, "-c", PLAIN, *_command(args)], capture_output=True, text=True,
                           env=_env(args.root), cwd=args.root)
    line = next((x for x in child.stdout.splitlines() if x.startswith("FIRST ")), None)
    if line is None:
        raise SystemExit(f"bench_startup: the command failed (exit {child.returncode}):\n{child.stderr[-2000:]}")
    return float(line.split()[1]) - t_start


def whole_process(args) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "chipsim.cli", *_command(args)], check=True, capture_output=True,
                   env=_env(args.root), cwd=args.root)
    return time.perf_counter() - t0


def import_groups(args) -> tuple[float, list[tuple[str, float]]]:
    """-X importtime of the command: total self time and self time per group, largest first (seconds)."""
    child = subprocess.run([sys.executable, "-X", "importtime", "-m", "chipsim.cli", *_command(args)],
                           capture_output=True, text=True, env=_env(args.root), cwd=args.root, check=True)
    groups: dict[str, float] = {}
    for line in child.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|")
        name = name.strip()
        parts = name.split(".")
        group = ".".join(parts[:2]) if parts[0] == "chipsim" and len(parts) > 1 else parts[0]
        groups[group] = groups.get(group, 0.0) + int(self_us) / 1e6
    return sum(groups.values()), sorted(groups.items(), key=lambda kv: -kv[1])


FLOOR = r"""
import time
import hashlib, os, sys
import numpy
with open(sys.argv[1], "rb") as f:
    hashlib.sha256(f.read()).hexdigest()
for part in sys.argv[2:]:
    path, offset, count = part.rsplit(":", 2)
    fd = os.open(path, os.O_RDONLY)
    hashlib.sha256(os.pread(fd, int(count), int(offset))).hexdigest()
    os.close(fd)
print("FLOOR", time.monotonic())
"""


def read_parts(args) -> tuple[list[str], int]:
    """What a warm run must read and hash before its first event: the config's trace file (its sha256 keys the
    trace cache and the provenance), then `path:offset:count` of each array the run reads from the trace's
    checked copy in the cache (filled by the warm-up run); and the bytes of those in all."""
    sys.path.insert(0, args.root)
    from chipsim.runner import prepare

    prep = prepare(os.path.join(args.root, args.config), [], args.policy)
    arrays = prep.trace.arrays
    parts, total = [prep.trace.path], os.path.getsize(prep.trace.path)
    for name in sorted(getattr(arrays, "verified", ())):
        spec = arrays._specs[name]
        count = arrays[name].nbytes
        parts.append(f"{arrays.path}:{spec['offset']}:{count}")
        total += count
    return parts, total


def floor(args, parts: list[str]) -> float:
    """Process start to numpy imported and `parts` read and hashed (seconds)."""
    t_start = time.monotonic()
    child = subprocess.run([sys.executable, "-c", FLOOR, *parts], capture_output=True, text=True, check=True,
                           env=_env(args.root), cwd=args.root)
    return float(child.stdout.split()[-1]) - t_start


def _row(name: str, times: list[float]) -> str:
    return f"{name:40} {statistics.median(times):7.3f} {min(times):7.3f} {max(times):7.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=os.path.dirname(HERE), help="the chipsim tree to measure")
    parser.add_argument("--config", default="hwconfigs/thor.yaml", help="relative to --root, or absolute")
    parser.add_argument("--policy", action="append", help="(repeatable) default: apex")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imports", type=int, default=12, help="import groups to list (0: none)")
    args = parser.parse_args()
    args.root = os.path.abspath(args.root)
    args.policy = args.policy or ["apex"]
    whole_process(args)  # fills the caches a first run computes
    runs = [measure_phases(args) for _ in range(args.repeats)]
    plain = [first_event_plain(args) for _ in range(args.repeats)]
    wall = [whole_process(args) for _ in range(args.repeats)]
    parts, floor_bytes = read_parts(args)
    floors = [floor(args, parts) for _ in range(args.repeats)]
    print(f"`chipsim run {args.config} {' '.join('--policy ' + p for p in args.policy)}` in {args.root}, "
          f"{sys.executable}; median of {args.repeats} fresh processes (min, max), seconds; warm caches; "
          f"machine {describe()}")
    print(f"{'phase':40} {'median':>7} {'min':>7} {'max':>7}")
    for name in PHASE_ORDER:
        print(_row(PHASE_WORDS[name], [r[name] for r in runs]))
    print(_row("process start to the first event, timed", [r["first_event"] for r in runs]))
    print(_row("process start to the first event", plain))
    print(_row("whole process (start to exit)", wall))
    print(_row(f"floor: numpy, read and hash {floor_bytes / 1e6:.0f} MB", floors))
    if args.imports:
        total, groups = import_groups(args)
        print(f"\nimports (-X importtime, self time by package, one run): {total:.3f} s in all")
        for name, seconds in groups[:args.imports]:
            print(f"  {name:30} {seconds:7.3f}")


if __name__ == "__main__":
    main()
