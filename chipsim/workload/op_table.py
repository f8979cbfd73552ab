"""Every operation of a config's decode step, costed by the analytic array model and by the cycle-level model
side by side (`chipsim calibrate CONFIG`): matrix-vector operations by the tile loop, special functions by the
SFU pipelines, elementwise work by the lanes (and the tile loop where it reads HBM)."""

from __future__ import annotations

import dataclasses

from chipsim.errors import InputError
from chipsim.workload.op_keys import check_op_keys


def op_table(hw) -> list[dict]:
    """One row per distinct operation of the decode step: its group, name, shape key, both times (µs) and its
    actions. Needs compute.timing: cycle-level (the analytic times are computed beside it)."""
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.workload.decode import op_group_builders
    from chipsim.workload.models import model_of

    if hw.compute.timing != "cycle-level":
        raise InputError("compute.timing: analytic; chipsim calibrate needs compute.timing: cycle-level and its keys "
                         "(hwconfigs/thor.yaml sets them)")
    check_op_keys(hw)
    analytic_hw = dataclasses.replace(hw, compute=dataclasses.replace(hw.compute, timing="analytic"))
    m = model_of(hw.model)
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


# APEX (arXiv 2608.11688), Fig. 12 at 1,024 context: APEX 42 % faster than no-prefetch on Granite-3B
PAPER_APEX_GAIN = 0.42


def _layer_groups(config_path: str, overrides, names) -> tuple:
    """(hw, model, {group: OpCost}) of one MoE layer's op groups `names`, costed without building the whole
    decode step (the LM head's tile loop is the longest operation and none of these needs it)."""
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.hw.config import load_config
    from chipsim.workload.decode import op_group_builders
    from chipsim.workload.models import model_of

    hw = load_config(config_path, list(overrides)).hw
    check_op_keys(hw)
    m = model_of(hw.model)
    am = ArrayModel(hw)
    builders = op_group_builders(am, m, hw)
    costs = {name: builders[name]() for name in names}
    costs = {name: am.step_group(name, op) for name, op in costs.items()}  # as build_workload
    am.save_table()
    return hw, m, costs


def apex_window(config_path: str, contexts, overrides=()) -> list[dict]:
    """Per MoE layer of the config's model at each context: attention's time (the window a prefetch issued at
    the layer's start hides behind), the router's, one routed expert's compute, and the top-k experts' load over
    the fetch path; from the cycle-level model and the analytic one side by side. `needed_attention_us` is the
    attention a serial load of that size needs for the paper's gain g: a prefetch hidden behind attention A
    saves min(A, L) of A + L, so g = A / (A + L) gives A = L g / (1 - g)."""
    from chipsim.hw.config import load_config
    from chipsim.hw.paths import fetch_path_timing
    from chipsim.workload.decode import expert_matrix_sizes

    if load_config(config_path, list(overrides)).hw.compute.timing != "cycle-level":
        raise InputError("compute.timing: analytic; the APEX window needs compute.timing: cycle-level and its keys "
                         "(hwconfigs/thor.yaml sets them)")
    rows = []
    for ctx in contexts:
        row = {"context": int(ctx)}
        for label, extra in (("cycle_level", []), ("analytic", ["compute.timing=analytic"])):
            hw, m, costs = _layer_groups(config_path, list(overrides) + [f"workload.context_length={ctx}"] + extra,
                                         ("attention", "router", "expert"))
            for group in ("attention", "router", "expert"):
                row[f"{group}_us_{label}"] = costs[group].duration_ps / 1e6
        path = fetch_path_timing(hw)
        expert_bytes = sum(expert_matrix_sizes(hw, m))
        load_us = m.top_k * expert_bytes / path.bandwidth_gbps / 1e3 + path.latency_ns / 1e3
        row.update(model=m.name, top_k=m.top_k, expert_mb=expert_bytes / 1e6, fetch_gbps=path.bandwidth_gbps,
                   load_us=load_us, load_over_attention=load_us / row["attention_us_cycle_level"],
                   needed_attention_us=load_us * PAPER_APEX_GAIN / (1 - PAPER_APEX_GAIN))
        rows.append(row)
    return rows


def window_lines(rows: list[dict]) -> list[str]:
    """The APEX-window table in markdown."""
    r0 = rows[0]
    lines = [f"{r0['model']}, per MoE layer: the top-{r0['top_k']} experts ({r0['expert_mb']:.2f} MB each) over the "
             f"fetch path's {r0['fetch_gbps']:.1f} GB/s against the layer's attention, the window a prefetch issued "
             "at the layer's start hides behind. 'needed' is the attention a load that long needs for the paper's "
             f"{100 * PAPER_APEX_GAIN:.0f} % (APEX Fig. 12: a prefetch saves min(A, L) of A + L, so A = L g / (1 − g)).",
             "", "| context | attention µs (cycle-level) | attention µs (analytic) | router µs | one expert µs | "
             "expert load µs | load / attention | attention needed µs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['attention_us_cycle_level']:.1f} | {r['attention_us_analytic']:.1f} | "
                     f"{r['router_us_cycle_level']:.2f} | {r['expert_us_cycle_level']:.1f} | {r['load_us']:.0f} | "
                     f"{r['load_over_attention']:.1f} | {r['needed_attention_us']:.0f} |")
    return lines


def value_reaching_window(config_path: str, key: str, candidates, needed_us: float, context: int) -> tuple | None:
    """The first of `candidates` (tried in order) at which the layer's cycle-level attention reaches `needed_us`,
    with that attention (µs); None if none does."""
    for value in candidates:
        _, _, costs = _layer_groups(config_path, [f"workload.context_length={context}", f"{key}={value}"],
                                    ("attention",))
        attention_us = costs["attention"].duration_ps / 1e6
        if attention_us >= needed_us:
            return value, attention_us
    return None
