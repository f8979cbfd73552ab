"""Where a run's time goes (`chipsim run --profile`): each policy simulated once under cProfile, its Python time
split by the part of the simulator it was spent in, with the counts that drive it: SimPy events and flows added to
the network (cProfile's call counts), fetches issued, op groups run and stalls (an observer of the engine:
chipsim.sim.observe), policy hook calls. A user whose policy is slow sees it in the `policy` column
and in its slowest hooks. cProfile sees nothing inside the engine compiled by mypyc, so `chipsim run --profile`
profiles it as Python (chipsim.cli). Profiling slows the run (2-4x); the results are the same.
"""

from __future__ import annotations

import cProfile
import pstats
import time

from chipsim.sim.observe import Observer

# (column, the part of the simulator): by the file a function is defined in
PARTS = (("simpy", "SimPy event loop"), ("flows", "flow network (bandwidth sharing)"), ("dma", "DMA queue"),
         ("engine", "decode-step engine"), ("policy", "policy hooks and their code"), ("other", "everything else"))
HOOKS = ("on_run_start", "on_token_start", "on_layer_start", "on_route", "on_layer_end", "choose_victims")


def _part(filename: str) -> str:
    path = filename.replace("\\", "/")
    if "/simpy/" in path:
        return "simpy"
    if path.endswith("chipsim/sim/flows.py"):
        return "flows"
    if path.endswith("chipsim/sim/dma.py"):
        return "dma"
    if "/chipsim/sim/" in path:
        return "engine"
    if "/chipsim/policies/" in path:
        return "policy"
    return "other"


class EngineCounts(Observer):
    """What the engine did, as it publishes it: fetches issued, op groups run on the arrays, stalls."""

    def __init__(self) -> None:
        self.fetches = self.op_groups = self.stalls = 0

    def issued(self, layer, expert, demand, transfer) -> None:
        self.fetches += 1

    def ops(self, kind, index, experts, start, end) -> None:
        self.op_groups += 1

    def stall(self, layer, start, end) -> None:
        self.stalls += 1


def profile_run(run):
    """Call `run(observers)` under cProfile, an EngineCounts among the observers: (its result, wall seconds, the
    profile's breakdown)."""
    engine = EngineCounts()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    try:
        result = run([engine])
    finally:
        prof.disable()
    wall = time.perf_counter() - t0
    return result, wall, breakdown(pstats.Stats(prof), engine)


def breakdown(stats: pstats.Stats, engine: EngineCounts) -> dict:
    """Seconds of Python per part (own time of the functions defined there), and the counts."""
    seconds = {name: 0.0 for name, _ in PARTS}
    counts = {"events": 0, "transfers": 0, "fetches": engine.fetches, "op_groups": engine.op_groups,
              "stalls": engine.stalls, "hook_calls": 0}
    hooks: dict[str, list] = {}
    for (filename, _line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        part = _part(filename)
        seconds[part] += tottime
        # an event: a SimPy step (profiled, the engine runs as Python on SimPy: chipsim.cli)
        if part == "simpy" and func == "step":
            counts["events"] += ncalls
        elif part == "flows" and func == "add":
            counts["transfers"] += ncalls
        elif part == "policy" and func in HOOKS:
            # a hook overridden down a class chain (an override calling super()) is one call of the hook: its
            # outermost implementation's calls and cumulative time
            h = hooks.setdefault(func, [0, 0.0])
            h[0] = max(h[0], ncalls)
            h[1] = max(h[1], cumtime)
    counts["hook_calls"] = sum(calls for calls, _ in hooks.values())
    return {"seconds": seconds, "counts": counts, "hooks": {k: tuple(v) for k, v in hooks.items()}}


def format_profile(labels: list[str], walls: list[float], parts: list[dict]) -> str:
    head = (["policy", "wall s", "events", "transfers", "fetches", "op groups", "stalls", "hook calls"]
            + [f"{n} s" for n, _ in PARTS])
    rows = [head]
    for label, wall, b in zip(labels, walls, parts):
        c, s = b["counts"], b["seconds"]
        rows.append([label, f"{wall:.2f}"] + [f"{c[k]:,}" for k in ("events", "transfers", "fetches", "op_groups",
                                                                     "stalls", "hook_calls")]
                    + [f"{s[n]:.2f}" for n, _ in PARTS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["profile: each policy once under cProfile, the engine run as Python (2-4x slower than a plain run of "
             "the compiled engine); seconds of Python by where it was spent: "
             + "; ".join(f"{n} = {what}" for n, what in PARTS), ""]
    for j, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    slow = []
    for label, b in zip(labels, parts):
        if b["hooks"]:
            name, (calls, secs) = max(b["hooks"].items(), key=lambda kv: kv[1][1])
            slow.append(f"{label} {name} {secs:.2f} s over {calls:,} calls")
    if slow:
        lines += ["", "slowest policy hook (cumulative): " + "; ".join(slow)]
    return "\n".join(lines)
