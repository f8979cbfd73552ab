"""Every operation of a config's decode step, costed by the analytic array model and by the cycle-level model
side by side (`chipsim calibrate CONFIG`): matrix-vector operations by the tile loop, special functions by the
SFU pipelines, elementwise work by the lanes (and the tile loop where it reads HBM)."""

from __future__ import annotations

import dataclasses

from chipsim.errors import InputError


def op_table(hw) -> list[dict]:
    """One row per distinct operation of the decode step: its group, name, shape key, both times (µs) and its
    actions. Needs compute.timing: cycle-level (the analytic times are computed beside it)."""
    from chipsim.hw.compute import ArrayModel
    from chipsim.workload.decode import op_group_builders
    from chipsim.workload.models import get_model

    if hw.compute.timing != "cycle-level":
        raise InputError("compute.timing: analytic; chipsim calibrate needs compute.timing: cycle-level and its keys "
                         "(hwconfigs/thor-cycle-level.yaml sets them)")
    analytic_hw = dataclasses.replace(hw, compute=dataclasses.replace(hw.compute, timing="analytic"))
    m = get_model(hw.model.name)
    rows, seen = [], set()
    costs = {}
    for label, model_hw in (("analytic", analytic_hw), ("cycle", hw)):
        am = ArrayModel(model_hw)
        am.op_log = []
        for group, build in op_group_builders(am, m, model_hw).items():
            if build is None:
                continue
            build()
            for name, key, cost in am.op_log:
                costs.setdefault((group, name, key), {})[label] = cost
            am.op_log = []
        am.save_table()  # the cycle-level table, cached by content hash for the runs that follow
    for (group, name, key), pair in costs.items():
        if (group, key) in seen:
            continue
        seen.add((group, key))
        a, c = pair["analytic"], pair["cycle"]
        rows.append({"group": group, "op": name, "shape": key, "analytic_us": a.duration_ps / 1e6,
                     "cycle_level_us": c.duration_ps / 1e6, "ratio": c.duration_ps / a.duration_ps if a.duration_ps else 1.0,
                     "macs": c.macs, "hbm_bytes": c.hbm_read_bytes + c.hbm_write_bytes, "sfu_ops": c.sfu_ops,
                     "vector_ops": c.vector_ops, "timed_by": _timed_by(key)})
    return rows


def _timed_by(key: str) -> str:
    """Which part of the cycle-level model times an operation of this shape key."""
    kind = key.split()[0]
    if kind == "matvec":
        return "tile loop"
    if kind == "sfu":
        return "SFU pipeline"
    return "lanes, tile loop" if not key.endswith(" b0") else "lanes"


def format_table(rows: list[dict]) -> str:
    lines = [f"{'group':10} {'operation':22} {'analytic us':>12} {'cycle-level us':>15} {'ratio':>7}  {'HBM MB':>8}  timed by"]
    for r in rows:
        lines.append(f"{r['group']:10} {r['op']:22} {r['analytic_us']:12.3f} {r['cycle_level_us']:15.3f} {r['ratio']:7.3f}"
                     f"  {r['hbm_bytes'] / 1e6:8.3f}  {r['timed_by']}")
    return "\n".join(lines)
