"""Write a lent Hopper GPU's config (hwconfigs/h200-pcie5.yaml, hwconfigs/h100-pcie5.yaml) from the microbenchmark
JSON (chipsim.hwreplay.microbench) measured on it.

    python -m chipsim.hwreplay.gpuconfig validation/h200-microbench.json --out hwconfigs/h200-pcie5.yaml --kernel-launch graph

The GPU named in the file picks its datasheet facts (GPUS: HBM width and rate); everything else is measured there.

Every timing number comes from a single-copy or single-op measurement (named in its comment) or a
datasheet; the mapping onto chipsim's chiplet terms is stated per key. Energy numbers are not validated
(the replay measures time and bytes) and are marked ASSUMPTION.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from chipsim.errors import InputError, OneLineParser, run_module_main
from chipsim.files import check_output_file, read_json, write_atomic
from chipsim.hw.config import DramConfig
from chipsim.hw.dram_formula import dram_timing
from chipsim.hwreplay.checks import check_microbench, check_op_energy, check_op_times

# The HBM's core timings in JEDEC HBM3 channel terms, as thor.yaml (channels and rate: GPUS)
HBM_CORE = dict(channel_width_bits=64, banks_per_channel=16, page_bytes=1024, burst_length=8, tcl_ns=12.5,
                trcd_ns=19.375, trp_ns=16.25, tras_ns=28.125, tfaw_ns=15.0, trfc_ns=350, trefi_ns=3900, trtw_ns=12.5,
                twtr_ns=11.875, write_drain_bursts=19, background_power_w=0.7)


@dataclass(frozen=True)
class GpuFacts:
    """What a GPU's config takes from its datasheet rather than a measurement: its name in the config and its HBM."""

    slug: str  # the config's name begins with it (h200 -> h200-pcie5)
    title: str  # in the header and description
    hbm_channels: int
    hbm_data_rate_mtps: int
    channels_note: str  # the channel count's source
    rate_note: str  # the data rate's source


# Hopper GPUs only: the compute keys' SM structure (4 sub-partitions of 32 lanes, 16 SFUs) is Hopper's
GPUS = {
    "NVIDIA H200": GpuFacts(
        "h200", "NVIDIA H200", 96, 6250,
        "H200 datasheet 4.8 TB/s = 6 HBM3e stacks x 16 channels x 64 bit x 6.25 GT/s",
        "H200 datasheet: 4.8 TB/s over a 6144-bit interface"),
    "NVIDIA H100 80GB HBM3": GpuFacts(
        "h100", "NVIDIA H100 SXM5 80GB", 80, 5234,
        "H100 SXM5 datasheet 3.35 TB/s; H100 whitepaper: 5 HBM3 stacks, 5120 bits = 80 channels x 64 bit",
        "H100 SXM5 datasheet: 3.35 TB/s over a 5120-bit interface = 5.234 GT/s"),
}


def gpu_facts(machine: dict, source: str) -> GpuFacts:
    """The datasheet facts of the microbenchmark file's GPU; a GPU not in GPUS is one error naming it."""
    name = str(machine.get("gpu"))
    if name not in GPUS:
        raise InputError(f"{source}: machine.gpu {name!r} has no datasheet facts in chipsim.hwreplay.gpuconfig.GPUS "
                         f"(known: {', '.join(sorted(GPUS))}); add its HBM channels and rate with their source")
    return GPUS[name]


def host_link(machine: dict) -> tuple[str, str]:
    """("5", "16"): the PCIe generation and width nvidia-smi reported (its third and fourth fields)."""
    fields = [f.strip() for f in str(machine.get("nvidia_smi", "")).split(",")]
    if len(fields) < 4 or not (fields[2].isdigit() and fields[3].isdigit()):
        return "5", "16"  # files written before the fields were read: the H200's
    return fields[2], fields[3]


def config_name(machine: dict, source: str) -> str:
    """The config's name: the GPU's slug and its host link, e.g. h200-pcie5."""
    return f"{gpu_facts(machine, source).slug}-pcie{host_link(machine)[0]}"


def _users(names: list[str]) -> str:
    """An operation's users in a config comment: the first three, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _op_table(mb: dict, kernel_launch: str, extra: tuple = ()) -> str:
    """compute.op_times_ns: each decode-step kernel shape's measured time (microbench op_times), or nothing.
    extra: (path, op-times-only microbench file) pairs whose shapes the main file lacks (e.g. long contexts)."""
    rows = list(mb.get("op_times") or [])
    if not rows:
        return ""
    known = {r["key"] for r in rows}
    added = []
    field = "eager_us" if kernel_launch == "eager" else "graph_us"
    for path, more in extra:
        new = [r for r in more.get("op_times", []) if r["key"] not in known]
        if any(field not in r for r in new):
            raise InputError(f"{path}: its shapes were timed inside CUDA graphs only (microbench --prompts); "
                             "they need --kernel-launch graph")
        known.update(r["key"] for r in new)
        rows += new
        if new:
            rows.sort(key=lambda r: r["key"])
            src = more.get("op_times_from", {})
            where = (f"in the prefill chunks of prompts {src['prompts']}" if "prompts" in src
                     else f"in the decode steps of batches of {src['batch']}" if "batch" in src
                     else f"at contexts {src.get('contexts')}")
            partial = (f"; stopped after {len(more['op_times'])} of its {more.get('shapes')} shapes, the rest "
                       "left to the array model" if more.get("complete") is False else "")
            added.append(f"{path} ({len(new)} shapes of {', '.join(src.get('configs', []))} "
                         + (f"with {' '.join(src['set'])} " if src.get("set") else "") + f"{where}{partial})")
    how = ("launched eagerly, queued behind a sleep (GPU time only)" if kernel_launch == "eager"
           else "inside one CUDA graph")
    src = mb.get("op_times_from", {})
    lines = [f"  op_times_ns:                    # measured: every kernel shape of the decode steps of "
             f"{', '.join(src.get('configs', []))} at contexts {src.get('contexts')}, each timed alone "
             f"(microbench op_times.{field}: a chain of it over weights rotating through 2 GiB, {how}); "
             f"an op not listed falls back to the array model"]
    if added:
        lines.append(f"    # and, timed the same way (microbench --gemv cublas), the shapes only in {'; '.join(added)}")
    for r in rows:
        lines.append(f'    "{r["key"]}": {round(r[field] * 1e3, 1)}   # {_users(r["users"])}{_row_note(r)}')
    return "\n".join(lines) + "\n"


def _row_note(r: dict) -> str:
    """What a measured row's comment adds to its users: a fused primitive's kernel, an attention kernel's share."""
    if r.get("fused"):
        inside = "the attention kernel" if "attention" in r["fused"] else "the 4-bit matvecs"
        return f": no kernel of its own, it runs inside {inside}"
    if r.get("kernel_us") is not None:
        return (f": half of one {r['kernel']} kernel's {r['kernel_us']} us (the simulator's scores and value mix, "
                "one shape)")
    return ""


def _op_energy_table(probes: tuple = ()) -> str:
    """compute.op_energy_pj: each kernel shape's energy alone above the board's idle power, per kernel
    (validation/energy/probe_op_energy.py, chipsim.hwreplay.energy_table.op_energy_rows), or nothing. probes: (path,
    file) pairs, an earlier file's shape kept over a later one's. A shape that drew no measurable energy above idle
    is left to the energy table's per-action prices; one fused into other kernels (its "fused" window) costs 0 here,
    its energy being in theirs, as its time is in op_times_ns."""
    if not probes:
        return ""
    from chipsim.hwreplay.energy_table import op_energy_rows

    found: dict[str, tuple[int, str]] = {}
    notes = []
    for path, probe in probes:
        try:
            rows = op_energy_rows(probe)
            fused = [w for w in probe["windows"] if w.get("kind") == "fused"]
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise InputError(f"{path}: not probe_op_energy.py's output (no idle and op windows)") from None
        kept = [r for r in rows if r["nj_per_kernel"] > 0 and r["key"] not in found]
        for r in kept:
            found[r["key"]] = (round(r["nj_per_kernel"] * 1e3), _users(r["users"]))
        for w in fused:
            found.setdefault(w["key"], (0, _users(w["users"]) + ": no kernel of its own, its energy is in the 4-bit "
                                           "matvecs'"))
        notes.append(f"{path} (above its idle windows' {rows[0]['idle_w']:.1f} W; {len(rows) - len(kept)} shapes "
                     f"without a measurable energy or listed already)")
    lines = ["  op_energy_pj:                   # measured: each kernel shape of the decode steps run alone as a chain "
             "in one CUDA graph (validation/energy/probe_op_energy.py), the board's energy above idle per kernel, "
             "from " + "; ".join(notes) + "; a shape not listed is priced by the table"]
    for key in sorted(found):
        pj, users = found[key]
        lines.append(f'    "{key}": {pj}   # {users}')
    return "\n".join(lines) + "\n"


def _energy_lines(fit, source: str | None, arrays: int, gemm_clock_source: str | None = None) -> dict:
    """The energy keys' values and comments: measured (chipsim.hwreplay.energy_table, from the board's NVML counter
    around single-op microbenchmarks) when a probe is given, else the ASSUMPTIONs as before."""
    if fit is None:
        return {
            "mac": "0.9              # ASSUMPTION (as thor.yaml); energy is not validated here",
            "sram_read": "0.45      # ASSUMPTION (as thor.yaml)",
            "sram_write": "0.45     # ASSUMPTION (as thor.yaml)",
            "clock": "0.5    # ASSUMPTION (as thor.yaml)",
            "gated": "false    # ASSUMPTION: an SM's clocks run while the GPU waits on a copy",
            "occupancy": "",
            "leakage": "0.5  # ASSUMPTION: energy is not validated here",
            "hbm": "7.0        # ASSUMPTION (APEX Table III's HBM figure); energy is not validated here",
            "hbm_bg": "0.7       # ASSUMPTION (as thor.yaml)",
            "pcie": "5.0        # ASSUMPTION; energy is not validated here",
            "pcie_static": "1.5           # ASSUMPTION (as thor.yaml)",
        }
    src = f"measured ({source}, chipsim.hwreplay.energy_table)"
    pcie = fit.pcie_pj_per_bit - fit.hbm_pj_per_bit
    return {
        "mac": f"{fit.mac_pj:.4f}              # {src}: per BF16 MAC, solved with the busy power and the HBM energy "
               + (f"(the GEMMs at the full SM clock, paced below the power cap: {gemm_clock_source})" if gemm_clock_source
                  else "(the GEMM window's power and clocks are in the probe file)"),
        "sram_read": "0.0      # in memory.hbm.energy_pj_per_bit: the GEMV fit charges a weight byte's whole way to the SMs",
        "sram_write": "0.0     # as sram_read_pj_per_bit",
        "clock": f"{fit.busy_w / arrays:.4f}    # {src}: every SM busy, {fit.busy_w:.1f} W above idle, / {arrays} SMs "
                 "(the small GEMVs', the large GEMV's and the " + ("paced GEMMs'" if gemm_clock_source else "GEMM's")
                 + f" power solved together; one-block kernels back to back drew {fit.tiny_above_idle_w:.1f} W above idle)",
        "gated": "true   # measured: the board's power while it waits is its idle power (leakage_power_w_per_array)",
        "occupancy": _occupancy_line(fit),
        "leakage": f"{fit.idle_w / arrays:.4f}  # {src}: the whole board idle with its clocks up at its resting "
                   f"temperature, {fit.idle_w:.1f} W, "
                   f"/ {arrays} SMs (HBM background, PCIe PHY and the rest of the board included)",
        "hbm": f"{fit.hbm_pj_per_bit:.4f}        # {src}: per bit read into the SMs, solved with the busy power and "
               "the MAC energy",
        "hbm_bg": "0.0       # in compute.leakage_power_w_per_array (the board's idle power)",
        "pcie": f"{pcie:.4f}        # {src}: the copies' power over their rate, {fit.pcie_pj_per_bit:.2f} pJ per bit, "
                f"less the HBM write charged on memory.hbm ({fit.hbm_pj_per_bit:.2f})",
        "pcie_static": "0.0           # in compute.leakage_power_w_per_array (the board's idle power)",
    }


def _occupancy_line(fit) -> str:
    """compute.clock_power_by_occupancy from the probe: true where one-block kernels back to back draw well under
    half the power of kernels over every SM (a kernel's clock power then scales with the SMs it occupies), false where
    they draw about as much (the board's busy power follows any kernel, whatever its size)."""
    by_occupancy = fit.tiny_above_idle_w < 0.5 * fit.busy_w
    return (f"  clock_power_by_occupancy: {'true' if by_occupancy else 'false'}  # measured: one-block kernels back to "
            f"back drew {fit.tiny_above_idle_w:.1f} W above idle, kernels over every SM {fit.busy_w:.1f} W\n")


def _probe_median_ns(probe: dict, source: str, what: str, values) -> tuple[float, list[float]]:
    """The median of `values(probe)` (µs) in ns, not below 0, and the values; a file without them is one error
    naming it and `what` it should hold."""
    try:
        per = [float(v) for v in values(probe)]
    except (KeyError, TypeError, AttributeError, ValueError):
        raise InputError(f"{source}: not {what}")
    if not per:
        raise InputError(f"{source}: no measurements in it")
    return max(0.0, round(1e3 * statistics.median(per), 1)), per


def _handoff_line(handoff: dict | None, source: str | None) -> str:
    """compute.copy_wait_ns from probe_handoff.py's file: the median over its copy sizes of the copy-then-graph
    time less the copy and the graph alone; none (the key's default, 0) without a file."""
    if handoff is None:
        return ""
    wait_ns, per_size = _probe_median_ns(
        handoff, source, "probe_handoff.py's output (no copies.*.summary.handoff_copy_to_compute_us)",
        lambda p: [v["summary"]["handoff_copy_to_compute_us"]["median"] for v in p["copies"].values()])
    return (f"  copy_wait_ns: {wait_ns}   # measured: a graph waiting on a copy's event starts this long after the copy "
            f"ends, median over {len(per_size)} copy sizes of copy-then-graph less each alone ({source})\n")


# graphs per step of each kind probe_step_costs.py times (an expert; the weighted sum; attention and router), for files
# that do not say (its graphs_per_step)
STEP_GRAPHS = {"expert": 1, "combine": 1, "attention+router": 2}


def _step_graphs(kind: str, row: dict, source: str) -> int:
    """Graphs per step of a probe_step_costs.py kind: the file's own figure, else STEP_GRAPHS'."""
    graphs = (row.get("config") or {}).get("graphs_per_step") or STEP_GRAPHS.get(kind)
    if not isinstance(graphs, int) or graphs < 1:
        raise InputError(f"{source}: kinds.{kind}: no graphs per step (config.graphs_per_step)")
    return graphs


def _refuse_dry_run(path: str, probe) -> None:
    """probe_step_costs.py's file from a GPU, or one line: a CPU dry run's file times nothing."""
    if not isinstance(probe, dict) or str(probe.get("device", "")).startswith("cpu"):
        raise InputError(f"{path}: not a GPU's probe_step_costs.py output (a CPU dry run times nothing)")


def _beside_copy_line(step_costs: tuple) -> str:
    """compute.launch_beside_copy_ns from probe_step_costs.py's files ((path, probe) pairs): what a graph launch adds
    while a copy is in flight (its steps back to back beside copies less alone, per graph), median over every file
    and step kind, not below 0; none (the key's default, 0) without a file. A CPU dry run's file is refused."""
    if not step_costs:
        return ""
    per, listed = [], []
    for path, probe in step_costs:
        _refuse_dry_run(path, probe)
        kinds = probe.get("kinds") if isinstance(probe.get("kinds"), dict) else {}
        # op-group graphs only: a "layer" step (one segment graph of a whole layer) is reported, not part of the key
        kinds = {k: v for k, v in kinds.items() if k in STEP_GRAPHS}
        graphs = {k: _step_graphs(k, v, path) for k, v in kinds.items() if isinstance(v, dict)}

        def extra(_):
            return [(v["graphs_beside_copies"]["us_per_step"] - v["graphs"]["us_per_step"]) / graphs[k]
                    for k, v in kinds.items()]
        _, values = _probe_median_ns(probe, path, "probe_step_costs.py's output (no kinds.*.graphs_beside_copies)", extra)
        per += values
        listed.append(f"{path}: " + ", ".join(f"{k} {v:.2f}" for k, v in zip(kinds, values)))
    ns = max(0.0, round(1e3 * statistics.median(per), 1))
    return (f"  launch_beside_copy_ns: {ns}   # measured: a graph launched while a copy is in flight takes this much "
            f"longer than back to back alone, median per graph over the replay's op groups (us: {'; '.join(listed)})\n")


# the op group a probe_step_costs.py kind's in-sequence cost is charged to (compute.in_sequence_ns): attention and
# router are timed as one kind, and their cost goes to attention, which runs in every layer (a dense first layer has
# no router)
IN_SEQUENCE_GROUP = {"attention+router": "attention", "expert": "expert", "combine": "combine"}


def in_sequence_ns(step_costs) -> tuple[dict, list[str]]:
    """compute.in_sequence_ns from probe_step_costs.py's files ((path, probe) pairs; a CPU dry run's is refused): per
    op-group kind, its steps' kernels in one graph (chain) less each kernel chained alone
    (kernels_alone_us, the profile's method), median over the files, not below 0; and, where a file has a whole layer
    as one graph (the layer kind), its own figure, for comparison."""
    per, layers = {}, []
    for path, probe in step_costs:
        _refuse_dry_run(path, probe)
        for kind, group in IN_SEQUENCE_GROUP.items():
            _, values = _probe_median_ns(
                probe, path, f"probe_step_costs.py's output (no kinds.{kind}.chain.us_per_step and kernels_alone_us)",
                lambda p: [p["kinds"][kind]["chain"]["us_per_step"] - p["kinds"][kind]["kernels_alone_us"]])
            per.setdefault(group, []).extend(values)
        try:  # a whole layer as one graph, for comparison (files before the layer kind have none)
            layer = probe["kinds"]["layer"]
            layers.append(f"{layer['chain']['us_per_step'] - layer['kernels_alone_us']:.2f} ({path})")
        except (KeyError, TypeError):
            pass
    return {group: max(0.0, round(1e3 * statistics.median(v), 1)) for group, v in per.items()}, layers


def _in_sequence_line(step_costs: tuple) -> str:
    """The compute.in_sequence_ns line of the config (in_sequence_ns); none without a file."""
    if not step_costs:
        return ""
    ns, layers = in_sequence_ns(step_costs)
    beside = f"; a whole layer in one graph, over its kernels alone: {', '.join(layers)} us" if layers else ""
    return (f"  in_sequence_ns: {{{', '.join(f'{g}: {v}' for g, v in ns.items())}}}   # measured: an op group's "
            f"kernels back to back after other groups' take this much longer than each kernel alone, median per "
            f"kind over {len(step_costs)} files (attention: attention and router timed together){beside}\n")


def _launch_from_gaps(gaps: dict, source: str) -> tuple[float, str]:
    """compute.op_group_launch_ns from probe_launch_gaps.py: what a separate graph adds on the GPU over its kernels
    run in one chain, median over the graph sizes it ran (back to back, no events: they added nothing)."""
    ns, _ = _probe_median_ns(gaps, source, "probe_launch_gaps.py's output (no results.*.us_per_graph_over_chain.graphs)",
                             lambda p: [v["us_per_graph_over_chain"]["graphs"] for v in p["results"].values()])
    listed = ", ".join(f"{k} {v['us_per_graph_over_chain']['graphs']} us" for k, v in gaps["results"].items())
    return ns, (f"measured: a graph launched after another adds this over its kernels in one chain, median of "
                f"{listed} ({source})")


@dataclass(frozen=True)
class _Derived:
    """What the config derives from the microbenchmark file, in the units its keys take."""

    clock_mhz: int  # the SM clock (nvidia-smi clocks.max.sm)
    per_op_us: float  # one tiny kernel, eager or inside a graph as the replay launches them
    per_op_source: str
    overhead_cycles: int  # per_op_us at clock_mhz
    launch_ns: float  # compute.op_group_launch_ns
    launch_source: str
    hbm_access_ns: float  # the HBM model's first-byte latency
    sram_ns: float  # a GEMV's fixed time less the per-kernel time and the HBM access
    gemv_gbps: float  # the SMs' HBM read rate in a GEMV
    pcie_latency_ns: float  # single-copy less queued-copy intercept
    setup_ns: float  # per-copy fixed cost


def _clock_mhz(smi: str) -> int:
    """The SM clock from nvidia-smi's first field; 1980 MHz (the H100's and H200's maximum) where it cannot be read."""
    try:
        return int(float(smi.split(",")[0].split()[0]))
    except (ValueError, IndexError):
        return 1980


def _per_op_us(mb: dict, kernel_launch: str, source: str) -> tuple[float, str]:
    """One tiny kernel's time as the replay launches it (eager, or inside one CUDA graph), and where it is from."""
    key = "gpu_us_per_kernel" if kernel_launch == "eager" else "graph_us_per_kernel"
    per_op_us = mb["tiny_kernels"][key]
    if not isinstance(per_op_us, (int, float)):
        raise InputError(f"{source}: tiny_kernels.{key}: no usable {kernel_launch} per-kernel time: {per_op_us}")
    return per_op_us, ("GPU side, 500 queued behind a sleep (microbench tiny_kernels.gpu_us_per_kernel)"
                       if kernel_launch == "eager" else
                       "inside one CUDA graph (microbench tiny_kernels.graph_us_per_kernel); the replay runs with --graphs")


def _op_group_launch(mb: dict, kernel_launch: str, per_op_us: float, launch_gaps: dict | None,
                     launch_gaps_source: str | None, source: str) -> tuple[float, str]:
    """compute.op_group_launch_ns and its comment: nothing for eager launches; for graphs, a one-kernel graph's
    launch less its kernel, or probe_launch_gaps.py's measurement when given."""
    if kernel_launch != "graph":
        return 0.0, "eager launches: no per-group start beyond each kernel's own time"
    gl = mb.get("graph_launch", {}).get("us_per_one_kernel_graph")
    if not isinstance(gl, (int, float)):
        raise InputError(f"{source}: graph_launch.us_per_one_kernel_graph: no graph launch time: "
                         f"{mb.get('graph_launch')}")
    if launch_gaps is not None:
        return _launch_from_gaps(launch_gaps, launch_gaps_source)
    return max(0.0, round((gl - per_op_us) * 1e3, 1)), (
        f"measured: a one-kernel graph takes {gl} us per launch (graph_launch) - {per_op_us} us for "
        f"its kernel (tiny_kernels.graph_us_per_kernel)")


def _derive(mb: dict, kernel_launch: str, launch_gaps: dict | None, launch_gaps_source: str | None,
            source: str) -> _Derived:
    """The microbenchmark's numbers turned into the config's."""
    m, tiny, g = mb["machine"], mb["tiny_kernels"], mb["gemv_fit"]
    q, s = mb["h2d_pinned_queued16_fit"], mb["h2d_pinned_single_fit"]
    clock_mhz = _clock_mhz(str(m.get("nvidia_smi", "")))
    per_op_us, per_op_source = _per_op_us(mb, kernel_launch, source)
    launch_ns, launch_source = _op_group_launch(mb, kernel_launch, per_op_us, launch_gaps, launch_gaps_source, source)
    facts = gpu_facts(m, source)
    hbm_cfg = DramConfig(capacity_gib=m["gpu_memory_gib"], energy_pj_per_bit=7.0, channels=facts.hbm_channels,
                         data_rate_mtps=facts.hbm_data_rate_mtps, **HBM_CORE)
    hbm_access_ns = dram_timing(hbm_cfg).access_latency_ns
    # a GEMV's fixed time = per-kernel time + first operand (HBM access + SRAM); the SRAM term takes the rest
    first_operand_ns = g["intercept_us"] * 1e3 - tiny["gpu_us_per_kernel"] * 1e3  # the GEMV sweep launches eagerly
    return _Derived(
        clock_mhz=clock_mhz, per_op_us=per_op_us, per_op_source=per_op_source,
        overhead_cycles=max(0, round(per_op_us * clock_mhz)), launch_ns=launch_ns, launch_source=launch_source,
        hbm_access_ns=hbm_access_ns, sram_ns=max(0.0, round(first_operand_ns - hbm_access_ns, 1)),
        gemv_gbps=g["bandwidth_gbps"], pcie_latency_ns=max(0.0, round((s["intercept_us"] - q["intercept_us"]) * 1e3, 1)),
        setup_ns=max(0.0, round(q["intercept_us"] * 1e3, 1)))


def render(mb: dict, kernel_launch: str = "eager", extra_op_times: tuple = (), energy=None,
           energy_source: str | None = None, command: str = "", handoff: dict | None = None,
           handoff_source: str | None = None, launch_gaps: dict | None = None,
           launch_gaps_source: str | None = None, op_energy: tuple = (), source: str = "microbenchmark",
           gemm_clock_source: str | None = None, host_probe: dict | None = None,
           host_probe_source: str | None = None, frontend_probe: dict | None = None,
           frontend_source: str | None = None, pace: tuple | None = None, step_costs: tuple = ()) -> str:
    """The config text. kernel_launch: how the replay launches kernels ("eager": one launch per kernel, per-op
    cost = GPU-side tiny-kernel time; "graph": per-segment CUDA graphs, per-op cost = graph tiny-kernel time).
    extra_op_times: (path, microbench op-times file) pairs adding shapes the main file lacks; energy: an
    EnergyFit (chipsim.hwreplay.energy_table) from `energy_source`, or None for the ASSUMPTION figures; source:
    the microbenchmark file's name, for errors; pace: (front-end probe, its path, "torch" or "cudart"): the host's
    issue costs and launch queue (host_pace_text); step_costs: (path, probe_step_costs.py file) pairs
    (compute.launch_beside_copy_ns and in_sequence_ns)."""
    d = _derive(mb, kernel_launch, launch_gaps, launch_gaps_source, source)
    table = _op_table(mb, kernel_launch, extra_op_times)
    e = _energy_lines(energy, energy_source, mb["machine"]["sm_count"], gemm_clock_source)
    header = _header_text(mb["machine"], kernel_launch, command, energy is not None, source)
    tables = (_handoff_line(handoff, handoff_source) + _beside_copy_line(step_costs) + _in_sequence_line(step_costs)
              + table + _op_energy_table(op_energy))
    host = _host_cpu_text(mb["machine"], d, mb["h2d_pinned_queued16_fit"]["bandwidth_gbps"], host_probe,
                          host_probe_source) + _host_frontend_text(frontend_probe, frontend_source)
    if pace is not None:
        host += ("" if frontend_probe is not None else "\nhost_frontend:\n") + host_pace_text(*pace)
    return header + _compute_text(mb, d, e, tables) + _memory_text(mb["machine"], e, gpu_facts(mb["machine"], source)) + _links_text(mb, d, e) + \
        _tail_text(mb["machine"], d, host)


def _header_text(m: dict, kernel_launch: str, command: str, measured_energy: bool, source: str) -> str:
    """The comment saying how the file was written and from what, the config's name and description."""
    smi = str(m.get("nvidia_smi", ""))
    facts, (gen, width), name = gpu_facts(m, source), host_link(m), config_name(m, source)
    return f"""# chipsim hardware config: the lent {facts.title} (PCIe {gen}.0 x{width} host link) as chipsim sees it, for
# validation against real replays (chipsim hwreplay; VALIDATION.md). WRITTEN BY
#   {command or f"python -m chipsim.hwreplay.gpuconfig {source} --out hwconfigs/{name}.yaml --kernel-launch {kernel_launch}"}
# (--kernel-launch {kernel_launch}: the replay launches {"each kernel on its own" if kernel_launch == "eager" else "each op group as one CUDA graph (chipsim hwreplay --graphs)"})
# from single-copy and single-op microbenchmarks (python -m chipsim.hwreplay.microbench) run on that machine:
# {m["gpu"]}, {m["sm_count"]} SMs, {m["gpu_memory_gib"]} GiB; host {m.get("host_cpu")}, {m.get("host_cpus")} CPUs,
# {m.get("host_memory_gib")} GiB; torch {m["torch"]}, CUDA {m["cuda"]}; nvidia-smi: {smi}.
# Chiplet terms mapped onto a GPU: the "arrays" are the SMs; "UCIe" is not present and stands for the SMs'
# achieved HBM read path in a GEMV; "LPDDR5X" is the host's DRAM holding the pinned experts; the DMA engine
# is one CUDA copy stream (FIFO, no preemption, an enqueued copy cannot be abandoned). No number below was
# fitted to an end-to-end replay.{"" if not measured_energy else chr(10) + "# Energy: the board's NVML counter (the GPU board only; host DRAM and CPU are outside it) around single-op" + chr(10) + "# microbenchmarks (validation/energy/probe_energy.py): idle, copies at four rates, tiny kernels, small and" + chr(10) + "# large GEMVs, a GEMM."}
name: {name}
description: {facts.title} with experts in pinned host memory over PCIe {gen}.0 x{width} (validation target)

"""


def _compute_text(mb: dict, d: _Derived, e: dict, tables: str) -> str:
    """compute: the SMs as arrays, per-op and launch costs, the measured op tables."""
    m = mb["machine"]
    return f"""compute:
  arrays: {m["sm_count"]}                     # measured: torch.cuda device properties, SM count
  unit_rows: 4                    # Hopper SM: 4 sub-partitions (NVIDIA H100 whitepaper)
  unit_cols: 32                   # Hopper SM sub-partition: 32 FP32 lanes (whitepaper)
  vector_length: 2                # BF16x2 FMA per lane; sets a compute bound far below a batch-1 GEMV's memory time
  clock_mhz: {d.clock_mhz}                 # measured: nvidia-smi clocks.max.sm
  sfus_per_array: 16              # Hopper SM: 4 SFUs per sub-partition (whitepaper)
  sfu_ops_per_cycle: 1            # one result per SFU per cycle
  op_overhead_cycles: {d.overhead_cycles}         # measured: {d.per_op_us} us per tiny kernel, {d.per_op_source}, x clock
  sram_mib_per_array: 0.25        # Hopper SM: 256 KB L1/shared memory (whitepaper)
  sram_access_ns: {d.sram_ns}            # measured: GEMV fixed time {mb["gemv_fit"]["intercept_us"]} us (gemv_fit) - per-kernel time - HBM access ({d.hbm_access_ns:.1f} ns)
  mac_energy_pj: {e['mac']}
  sram_read_pj_per_bit: {e['sram_read']}
  sram_write_pj_per_bit: {e['sram_write']}
  sfu_op_energy_pj: 4.0           # ASSUMPTION (as thor.yaml)
  vector_op_energy_pj: 0.4        # ASSUMPTION (as thor.yaml)
  clock_power_w_per_array: {e['clock']}
  clock_gated_when_idle: {e['gated']}
{e['occupancy']}  leakage_power_w_per_array: {e['leakage']}
  dequant_ops_per_weight: 2       # an offset and a scale per weight below 16 bit, as the 4-bit replays' kernel (triton_kernels.gemv_q4) does
  op_group_launch_ns: {d.launch_ns}   # {d.launch_source}
{tables}
"""


def _memory_text(m: dict, e: dict, facts: GpuFacts) -> str:
    """memory: the GPU's HBM and the host DRAM that holds the pinned experts."""
    return f"""memory:
  hbm:
    capacity_gib: {m["gpu_memory_gib"]}           # measured: torch.cuda device properties total memory
    channels: {facts.hbm_channels}                  # {facts.channels_note}
    channel_width_bits: 64        # JESD238 HBM3 channel (HBM3e keeps it)
    data_rate_mtps: {facts.hbm_data_rate_mtps}          # {facts.rate_note}
    banks_per_channel: 16         # JESD238 HBM3
    page_bytes: 1024              # JESD238 HBM3
    burst_length: 8               # JESD238 HBM3
    tcl_ns: 12.5                  # JESD238-class HBM3 core timing (as thor.yaml)
    trcd_ns: 19.375               # as thor.yaml
    trp_ns: 16.25                 # as thor.yaml
    tras_ns: 28.125               # as thor.yaml
    tfaw_ns: 15.0                 # as thor.yaml
    trfc_ns: 350                  # ASSUMPTION (as thor.yaml)
    trefi_ns: 3900                # JESD238 HBM3 tREFI
    trtw_ns: 12.5                 # as thor.yaml (Ramulator 2.1 HBM3_6400Mbps nRTW)
    twtr_ns: 11.875               # as thor.yaml (Ramulator 2.1 HBM3_6400Mbps nCWL + nBL + nWTRS)
    write_drain_bursts: 19        # as thor.yaml (Ramulator 2.1 HBM3 controller watermarks)
    energy_pj_per_bit: {e['hbm']}
    background_power_w: {e['hbm_bg']}
  lpddr5x:                        # stands for the host DRAM that holds the pinned experts
    capacity_gib: {m.get("host_memory_gib", 128)}           # measured: /proc/meminfo MemTotal
    channels: 8                   # ASSUMPTION: one socket's 8 DDR5 channels (server Xeon); never the bottleneck (PCIe is)
    channel_width_bits: 64        # DDR5 DIMM: 2 x 32-bit subchannels
    data_rate_mtps: 4800          # ASSUMPTION: DDR5-4800
    banks_per_channel: 32         # JESD79-5 DDR5: 8 bank groups x 4 banks
    page_bytes: 1024              # JESD79-5 x8 device page 1 KB
    burst_length: 16              # JESD79-5 DDR5: BL16
    tcl_ns: 16.7                  # JESD79-5 DDR5-4800B: CL40
    trcd_ns: 16.7                 # JESD79-5 DDR5-4800B
    trp_ns: 16.7                  # JESD79-5 DDR5-4800B
    tras_ns: 32.0                 # JESD79-5
    tfaw_ns: 13.3                 # JESD79-5 x8, 1 KB page
    trfc_ns: 295                  # JESD79-5 16 Gb tRFC1
    trefi_ns: 3900                # JESD79-5
    trtw_ns: 5.824                # Ramulator 2.1 DDR5_4800AN: RD->WR nCL 34 + nBL 8 + 2 - nCWL 32 + 2 = 14 x 0.416 ns
    twtr_ns: 19.136               # Ramulator 2.1 DDR5_4800AN: WR->RD nCWL 32 + nBL 8 + nWTRS 6 = 46 x 0.416 ns
    write_drain_bursts: 19        # Ramulator 2.1 DDR5 controller: 32-entry write buffer, watermarks 0.8 / 0.2
    energy_pj_per_bit: 3.0        # ASSUMPTION; energy is not validated here
    background_power_w: 1.0       # ASSUMPTION (as thor.yaml)

"""


def _links_text(mb: dict, d: _Derived, e: dict) -> str:
    """links: PCIe as the copies measured it, and the SMs' GEMV read path standing for UCIe."""
    q, s = mb["h2d_pinned_queued16_fit"], mb["h2d_pinned_single_fit"]
    return f"""links:
  pcie:
    bandwidth_gbps: {q["bandwidth_gbps"]}         # measured: pinned H2D, 16 copies back to back, fit t = a + N/B over 256 KiB-16 MiB (h2d_pinned_queued16_fit)
    max_payload_bytes: 256        # PCIe base spec default max payload (the measured copy rate already includes its cost)
    tlp_overhead_bytes: 0         # measured: bandwidth_gbps is the data rate of real copies, net of TLP overhead
    latency_ns: {d.pcie_latency_ns}             # measured: single-copy fit intercept {s["intercept_us"]} us - queued intercept {q["intercept_us"]} us (not serialised)
    energy_pj_per_bit: {e['pcie']}
    static_power_w: {e['pcie_static']}
  ucie:                           # not present: the SMs' HBM read path in a GEMV
    modules: 1                    # a stand-in: one module, so gtps carries the measured GEMV bandwidth alone
    lanes_per_module: 64          # a stand-in lane count that gtps is scaled by (below)
    gtps: {round(d.gemv_gbps * 8 / 64, 3)}                 # measured: GEMV bandwidth {d.gemv_gbps} GB/s (gemv_fit over 8-256 MiB) = 64 lanes x this / 8
    latency_ns: 0.0               # folded into sram_access_ns (the measured GEMV fixed time)
    energy_pj_per_bit: 0.0        # not present
    static_power_w: 0.0           # not present

"""


MODEL = "granite-3.1-3b-a800m"  # the model the config describes (its per-shape configs set others)


def _host_cpu_text(m: dict, d: _Derived, bandwidth_gbps: float, probe: dict | None, source: str | None) -> str:
    """host_cpu: from chipsim.hwreplay.host_cpu's probe where given (each key measured alone), else ASSUMPTIONs. The
    dispatch overhead is the empty job's round trip less what the simulator charges apart: the activation's two
    trips over PCIe (chipsim.workload.host.host_timing), at the link's latency and bandwidth above."""
    if probe is None:
        return f"""host_cpu:                         # not used by the validated policies
  cores: {m.get("host_cpus", 16)}                      # measured: os.cpu_count()
  clock_ghz: 2.0                  # ASSUMPTION (not used here)
  flops_per_cycle_per_core: 32    # ASSUMPTION: AVX-512 FMA x2 (not used here)
  memory_bandwidth_gbps: 100      # ASSUMPTION (not used here)
  dispatch_overhead_ns: 10000     # ASSUMPTION (not used here)
  active_power_w: 100             # ASSUMPTION (not used here)
"""
    if not isinstance(probe, dict) or probe.get("model") != MODEL:
        raise InputError(f"{source}: model {probe.get('model') if isinstance(probe, dict) else None!r}: the host probe "
                         f"must time this config's expert ({MODEL})")
    try:
        us, trip_us = float(probe["expert_us"]["median"]), float(probe["roundtrip_us"]["median"])
        act, nbytes, threads = int(probe["activation_bytes"]), int(probe["expert_bytes"]), int(probe["threads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: not a host probe (python -m chipsim.hwreplay.host_cpu): {exc!r}") from None
    if us <= 0 or trip_us <= 0 or act <= 0 or nbytes <= 0 or threads < 1:
        raise InputError(f"{source}: the probe's times, bytes and threads must be positive")
    transit_ns = 2 * (d.pcie_latency_ns + act / bandwidth_gbps)
    dispatch = max(0.0, round(trip_us * 1e3 - transit_ns, 1))
    gbps = round(nbytes / us / 1e3, 2)
    return f"""host_cpu:                         # measured alone by python -m chipsim.hwreplay.host_cpu ({source})
  cores: {threads}                      # measured: the threads the probe (and the replay: torch.set_num_threads) computes on
  clock_ghz: 2.0                  # ASSUMPTION: with the FMA width below {threads * 64} GFLOP/s, far from binding one token's expert
  flops_per_cycle_per_core: 32    # ASSUMPTION: AVX-512 FMA x2
  memory_bandwidth_gbps: {gbps}      # measured: one expert's {nbytes} BF16 bytes / its median {us:g} us on the CPU (cold weights in pinned memory)
  dispatch_overhead_ns: {dispatch}      # measured: an empty host job's median round trip {trip_us:g} us - 2 x (PCIe latency + {act} activation bytes / bandwidth)
  active_power_w: 100             # ASSUMPTION (outside the board's counter: no validation reads it)
"""


FRONTEND_FIT_MAX_BYTES = 16 << 20  # the pageable fit's sizes, as the pinned fit's (h2d_pinned_queued16_fit)


def _host_frontend_text(probe: dict | None, source: str | None) -> str:
    """host_frontend: the read-back and pageable-copy costs from chipsim.hwreplay.host_frontend's probe, each measured
    alone; the software keys stay the replays' (routing known ahead, experts in pinned memory). The pageable rate
    is t = a + N/B fitted over the probe's copies of 256 KiB-16 MiB, the pinned fit's sizes (an expert's parts are
    1-8 MB). Nothing without a probe (the host is then always ahead)."""
    if probe is None:
        return ""
    try:
        readback = probe["readback"]["tolist"]
        idle_us, n = float(readback["gpu_idle_us"]), int(readback["n"])
        rows = [(int(c["bytes"]), float(c["gpu_us"])) for c in probe["copies"]["pageable"]["copies"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: not a front-end probe (python -m chipsim.hwreplay.host_frontend), or its "
                         f"read-back or pageable copies failed: {exc!r}") from None
    points = [(b, us) for b, us in rows if b <= FRONTEND_FIT_MAX_BYTES]
    if idle_us <= 0 or n < 1 or len({b for b, _ in points}) < 2 or any(us <= 0 for _, us in points):
        raise InputError(f"{source}: needs a positive read-back time and pageable copies of two sizes or more up to "
                         f"{FRONTEND_FIT_MAX_BYTES >> 20} MiB")
    k = len(points)
    mx, my = sum(b for b, _ in points) / k, sum(us for _, us in points) / k
    slope = sum((b - mx) * (us - my) for b, us in points) / sum((b - mx) ** 2 for b, _ in points)  # us per byte
    if slope <= 0:
        raise InputError(f"{source}: the pageable copies do not take longer with size")
    gbps, intercept_us = 1e-3 / slope, my - slope * mx
    sizes = sorted(b for b, _ in points)
    return f"""
host_frontend:                    # measured alone by python -m chipsim.hwreplay.host_frontend ({source})
  routing: device                 # the replays' programs: every layer's plan known ahead (chipsim hwreplay)
  routing_readback_ns: {round(idle_us * 1e3, 1)}      # measured: the GPU idle from a layer's chosen experts being ready to the next kernel enqueued after .tolist() (median of {n})
  expert_memory: pinned           # the replays' experts sit in pinned host memory
  pageable_bandwidth_gbps: {round(gbps, 3)}    # measured: pageable host-to-device copies, one at a time, t = a + N/B over {sizes[0] >> 10} KiB-{sizes[-1] >> 20} MiB
  pageable_setup_ns: {round(max(0.0, intercept_us) * 1e3, 1)}      # measured: that fit's intercept
"""


PACE_CALLS = {"torch": ("", "through PyTorch (CUDAGraph.replay, Tensor.copy_, Event.record, Stream.wait_event)"),
              "cudart": ("cudart", "as raw CUDA runtime calls (cudaGraphLaunch, cudaMemcpyAsync, cudaEventRecord, "
                                   "cudaStreamWaitEvent; hwreplay --enqueue cudart)")}


def host_pace_text(probe: dict, source: str, calls: str) -> str:
    """host_frontend's issue keys (chipsim.sim.host_pace) from a front-end probe's issue_costs, the host's calls
    made `calls`' way (PACE_CALLS), and the launch queue's run-ahead, each measured alone. A launch and a copy are
    priced as a program makes them, each on other memory (the probe's _distinct figures), where the probe has
    them; the same call repeated is in the comment."""
    sub, how = PACE_CALLS[calls]
    try:
        costs = probe["issue_costs"][sub] if sub else probe["issue_costs"]
        us = {k: float(costs[k]["host_us_per_call"]) for k in ("graph_launch", "pinned_copy_64kib", "event_record",
                                                                "stream_wait_event")}
        repeated = dict(us)
        for k in ("graph_launch", "pinned_copy_64kib"):
            if k + "_distinct" in costs:
                us[k] = float(costs[k + "_distinct"]["host_us_per_call"])
        depth = int(probe["launch_queue"]["graph_launch"]["enqueued_before_blocking"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: no issue costs {how} or launch queue in this front-end probe "
                         f"(python -m chipsim.hwreplay.host_frontend): {exc!r}") from None
    if min(us.values()) <= 0 or depth < 1:
        raise InputError(f"{source}: the issue costs and the launch queue's run-ahead must be positive")
    sizes = [f"{float(costs[k]['host_us_per_call']):g}" for k in ("graph_launch_8_kernels", "graph_launch_32_kernels")
             if k in costs]
    each = "each of 256 distinct graphs in turn" if us != repeated else "the same graph again"
    return f"""  launch_issue_ns: {round(us['graph_launch'] * 1e3, 1)}      # measured: the host's time per CUDA graph launch {how}, {each}, enqueued behind a sleeping kernel ({source}; the same one-kernel graph again {repeated['graph_launch']:g} us, {' and '.join(sizes) or 'no other'} us for graphs of 8 and 32 kernels)
  copy_issue_ns: {round(us['pinned_copy_64kib'] * 1e3, 1)}        # measured: the host's time per pinned 64 KiB copy, the same way (the same copy again: {repeated['pinned_copy_64kib']:g} us)
  event_issue_ns: {round((us['event_record'] + us['stream_wait_event']) / 2 * 1e3, 1)}        # measured: the mean of an event record's ({us['event_record']:g} us) and a stream wait's ({us['stream_wait_event']:g} us)
  launch_queue_depth: {depth}        # measured: graph launches enqueued behind a long kernel before the host's call blocked
"""


def _tail_text(m: dict, d: _Derived, host: str) -> str:
    """dma, host CPU, expert buffer, model, workload, run and policies."""
    return f"""dma:
  engines: 1                      # one CUDA copy stream: one copy at a time
  setup_ns: {d.setup_ns}              # measured: per-copy fixed cost, queued fit intercept (h2d_pinned_queued16_fit)
  chunk_kib: 256                  # unused (no preemption, no cancel)
  demand_preempts_prefetch: false # a CUDA stream cannot pause a copy
  demand_first: false             # a CUDA stream runs copies in issue order
  cancel_in_flight: false         # an enqueued CUDA copy always completes

{host}
expert_buffer:
  capacity_mib: 1536              # the replay's bounded GPU expert buffer (a harness choice; per-shape configs set theirs)

model:
  name: {MODEL}
  expert_bits: 16                 # BF16 experts (the 4-bit replays set model.expert_bits=4)
  quant_group_size: 128           # the 4-bit replays' kernel: one scale per 128 weights (triton_kernels.gemv_q4)
  quant_scale_bits: 16            # its scales are BF16 (triton_kernels.gemv_q4)

workload:
  trace: ../traces/real-granite-3b.npz
  context_length: 1024            # a harness choice: the replays' default context (--contexts sets others)
  max_tokens: 144                 # 16 warm-up + 128 measured tokens per case
  warmup_tokens: 16               # a harness choice: the first tokens, while buffers fill and graphs are first launched, are reported apart

run:
  policies: [no-prefetch, oracle, static-4, promoe, apex, apex-sf, lru]

policies:
  apex:
    tau: 0.90                     # APEX default confidence, as thor.yaml
  static:
    extra: 4                      # APEX Fig. 8 baselines: k+4, as thor.yaml
  promoe:
    slots: 0                      # 0 = the whole expert buffer as ProMoE's LRU cache, as thor.yaml
  oracle:
    lookahead: 1                  # prefetch as early as any policy can, as thor.yaml
"""


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m chipsim.hwreplay.gpuconfig",
                       description="write a lent Hopper GPU's config (hwconfigs/h200-pcie5.yaml) from microbenchmark results")
    ap.add_argument("microbench")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernel-launch", default="eager", choices=("eager", "graph"),
                    help="how the replay launches kernels (chipsim hwreplay --graphs for graph)")
    ap.add_argument("--op-times-extra", action="append", default=[], metavar="FILE",
                    help="an op-times-only microbenchmark file (microbench --gemv cublas --contexts ...) whose shapes "
                         "the main file lacks, e.g. long contexts (repeatable)")
    ap.add_argument("--energy-probe", default=None, metavar="FILE",
                    help="validation/energy/h200-energy-probe-settled.json: the energy table from the board's counter "
                         "(otherwise the energy figures stay ASSUMPTIONs)")
    ap.add_argument("--gemm-clock", default=None, metavar="FILE",
                    help="validation/h100/h100-gemm-clock.json (validation/energy/probe_gemm_clock.py): the MAC's energy "
                         "from GEMMs paced below the power cap, at the full SM clock (with --energy-probe)")
    ap.add_argument("--launch-gaps", default=None, metavar="FILE",
                    help="validation/compute/h200-launch-gaps.json (probe_launch_gaps.py): compute.op_group_launch_ns "
                         "with --kernel-launch graph, instead of the microbenchmark's one-kernel graph launch")
    ap.add_argument("--op-energy", action="append", default=[], metavar="FILE",
                    help="validation/energy/h200-op-energy-settled.json (probe_op_energy.py): compute.op_energy_pj, each "
                         "kernel shape's measured energy alone, charged instead of the table's per-action prices "
                         "(repeatable: an earlier file's shapes win)")
    ap.add_argument("--handoff", default=None, metavar="FILE",
                    help="validation/compute/h200-handoff.json (validation/compute/probe_handoff.py): compute.copy_wait_ns")
    ap.add_argument("--step-costs", action="append", default=[], metavar="FILE",
                    help="validation/h100/h100-step-costs.json (validation/compute/probe_step_costs.py): "
                         "compute.launch_beside_copy_ns and in_sequence_ns (repeatable: medians over every file's op groups)")
    ap.add_argument("--host-cpu", default=None, metavar="FILE",
                    help="validation/h100/h100-host-cpu-expert.json (python -m chipsim.hwreplay.host_cpu): the host_cpu "
                         "keys, each measured alone (otherwise ASSUMPTIONs, unused by the GPU-side policies)")
    ap.add_argument("--host-frontend", default=None, metavar="FILE",
                    help="validation/h100/h100-host-frontend.json (python -m chipsim.hwreplay.host_frontend): the "
                         "host_frontend block's measured costs (routing read-back, pageable copies)")
    ap.add_argument("--host-pace", default=None, metavar="FILE",
                    help="a front-end probe (python -m chipsim.hwreplay.host_frontend): host_frontend's issue costs "
                         "and launch queue depth, the host's pace")
    ap.add_argument("--host-pace-calls", default="torch", choices=tuple(PACE_CALLS),
                    help="with --host-pace: the host's calls as PyTorch makes them (default: what offloading "
                         "software and hwreplay's default enqueue call) or raw CUDA runtime calls")
    return ap


def _read_tables(a) -> tuple[dict, list, tuple]:
    """The microbenchmark file, the --op-times-extra and --op-energy files, each checked where it is read
    (chipsim.hwreplay.checks): the config's every number finite and in range, every table key well-formed, once."""
    mb = check_microbench(read_json(a.microbench, "microbenchmark"), a.microbench, a.kernel_launch)
    gpu_facts(mb["machine"], a.microbench)
    extra = [(path, read_json(path, "--op-times-extra")) for path in a.op_times_extra]
    for path, more in extra:
        check_op_times(more, path)
    op_energy = tuple((path, check_op_energy(read_json(path, "--op-energy"), path)) for path in a.op_energy)
    return mb, extra, op_energy


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    check_output_file(a.out, "--out")  # before any work: nothing half-written, no traceback at the end
    mb, extra, op_energy = _read_tables(a)
    fit = None
    if a.gemm_clock and not a.energy_probe:
        raise InputError("--gemm-clock goes with --energy-probe (it replaces one of that probe's windows)")
    if a.energy_probe:
        from chipsim.hwreplay.energy_table import derive

        try:
            fit = derive(read_json(a.energy_probe), read_json(a.gemm_clock) if a.gemm_clock else None)
        except InputError as exc:  # the table's errors name the probe kind; the line names the files too
            raise InputError(f"{a.energy_probe}{' / ' + a.gemm_clock if a.gemm_clock else ''}: {exc}") from None
    command = (f"python -m chipsim.hwreplay.gpuconfig {a.microbench} --out {a.out} --kernel-launch {a.kernel_launch}"
               + "".join(f" --op-times-extra {p}" for p in a.op_times_extra)
               + (f" --energy-probe {a.energy_probe}" if a.energy_probe else "")
               + (f" --gemm-clock {a.gemm_clock}" if a.gemm_clock else "")
               + (f" --handoff {a.handoff}" if a.handoff else "")
               + (f" --launch-gaps {a.launch_gaps}" if a.launch_gaps else "")
               + "".join(f" --step-costs {p}" for p in a.step_costs)
               + "".join(f" --op-energy {p}" for p in a.op_energy)
               + (f" --host-cpu {a.host_cpu}" if a.host_cpu else "")
               + (f" --host-frontend {a.host_frontend}" if a.host_frontend else "")
               + (f" --host-pace {a.host_pace} --host-pace-calls {a.host_pace_calls}" if a.host_pace else ""))
    handoff = read_json(a.handoff) if a.handoff else None
    gaps = read_json(a.launch_gaps) if a.launch_gaps else None
    text = render(mb, a.kernel_launch, tuple(extra), fit, a.energy_probe, command, handoff, a.handoff, gaps,
                  a.launch_gaps, op_energy, source=a.microbench,
                  gemm_clock_source=a.gemm_clock, host_probe=read_json(a.host_cpu) if a.host_cpu else None,
                  host_probe_source=a.host_cpu,
                  frontend_probe=read_json(a.host_frontend) if a.host_frontend else None,
                  frontend_source=a.host_frontend,
                  pace=(read_json(a.host_pace), a.host_pace, a.host_pace_calls) if a.host_pace else None,
                  step_costs=tuple((p, read_json(p)) for p in a.step_costs))
    write_atomic(a.out, text, "--out")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    run_module_main(main)
