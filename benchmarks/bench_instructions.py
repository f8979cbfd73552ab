"""Replay cost as machine instructions: each policy over `--tokens` Granite-3B tokens run under valgrind's callgrind,
counting the instructions executed inside `Simulation.run` (the replay, not imports, config or trace loading).

    python benchmarks/bench_instructions.py [--tokens 32] [--config hwconfigs/thor.yaml] [--policy no-prefetch ...]

Wall time on this shared 2-core VM moves by ±15 % between runs and by more between days; an instruction count does
not (the same build, inputs and environment give the same count, whatever else the machine runs), so a change to
the engine is measured here, and its wall time with bench_replay.py. Needs valgrind (Debian's package); about 50
times slower than a plain run (32 tokens: ~15 s a policy). With the engine compiled (mypyc) only `Simulation.run` is
counted; as pure Python the whole process is (the run is then most of it: compare like with like).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_POLICIES = ["no-prefetch", "apex", "promoe", "lru", "spice"]
# one policy's replay, in a child process so that callgrind sees nothing else
CHILD = """
import sys
from chipsim.runner import prepare, simulate
prep = prepare(sys.argv[1], [f"workload.max_tokens={sys.argv[2]}"], [sys.argv[3]])
simulate(prep, prep.policies[0])
"""


def count(config: str, tokens: int, policy: str, compiled: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        if compiled:  # mypyc's C function for Simulation.run: counting starts and stops with it
            cmd.append("--toggle-collect=CPyDef_engine___Simulation___run")
        cmd += [sys.executable, "-c", CHILD, config, str(tokens), policy]
        run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode or not found:
            raise SystemExit(f"callgrind failed for {policy}: {run.stderr.strip().splitlines()[-1:]}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(ROOT, "hwconfigs", "thor.yaml"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--policy", action="append")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    import chipsim.sim

    compiled = chipsim.sim.BUILD.startswith("compiled")
    build = chipsim.sim.BUILD + (", C event core" if chipsim.sim.NATIVE else "")
    print(f"{args.tokens} tokens of {os.path.relpath(args.config, ROOT)}; engine {build}; "
          f"instructions inside {'Simulation.run' if compiled else 'the whole process'}")
    print(f"{'policy':14} {'instructions':>15} {'per token-layer':>16}")
    from chipsim.runner import prepare

    layers = prepare(args.config, [f"workload.max_tokens={args.tokens}"]).workload.model.num_layers
    for policy in args.policy or DEFAULT_POLICIES:
        n = count(args.config, args.tokens, policy, compiled)
        print(f"{policy:14} {n:>15,} {n / (args.tokens * layers):>16,.0f}", flush=True)


if __name__ == "__main__":
    main()
