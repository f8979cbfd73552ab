"""The concept pages' generated sections (docs/concepts/, docs/findings.md), written from the code and the repository's
own files when the site is built, so that no number on those pages is typed by hand.

- `thor-energy-table`: every energy entry of hwconfigs/thor.yaml with its value, the ledger entry it prices, that
  entry's category (chipsim.sim.energy.EnergyTable's own) and the comment that names its source;
- `thor-assumptions`: every key of hwconfigs/thor.yaml whose comment says ASSUMPTION, and the experiments that sweep it;
- `dram-validation-points`: the command-level DRAM model's validation points against Ramulator 2.1, per standard
  (chipsim.dramsim.points), and the targets the tests hold every point to (chipsim.dramsim.validate);
- `trace-arrays`: what a trace holds (chipsim.trace.format's core arrays, chipsim.trace.predictor_arrays' outputs)
  and which policies read each;
- `expert-formats`: every named expert format (chipsim.hw.expert_formats), its bits, scales and source;
- `policy-overview`: every registered policy in one table, its phase, whether it keeps experts across tokens, and the
  trace arrays it reads;
- `findings-*`: rows quoted from REPRODUCTION.md, which `chipsim reproduce` writes from the saved results.

chipsim.analysis.docs_gen.SECTIONS registers them beside the reference pages' sections.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Callable

from chipsim.analysis.markdown import table as _table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THOR = os.path.join(ROOT, "hwconfigs", "thor.yaml")
REPRODUCTION = os.path.join(ROOT, "REPRODUCTION.md")
# a comment shorter than this says too little on its own ("ASSUMPTION, swept"): the comment block above the key,
# where thor.yaml explains a group of keys, is quoted with it
SHORT_COMMENT = 30


def commented_keys(path: str) -> list[tuple[str, str, str, str]]:
    """(dotted key, value, its own comment, the comment lines right above it) of every leaf of a block-style YAML
    config, in file order."""
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    block: list[str] = []  # full-line comments since the last key
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith("#"):
                block.append(stripped.lstrip("#").strip())
                continue
            body, _, comment = line.partition("#")
            body = body.rstrip()
            if not body.strip() or ":" not in body:
                block = []
                continue
            indent = len(body) - len(body.lstrip())
            key, _, value = body.strip().partition(":")
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if not value.strip():
                stack.append((indent, key))
            else:
                out.append((".".join([k for _, k in stack] + [key]), value.strip(), comment.strip(), " ".join(block)))
            block = []
    return out


def assumed_keys(path: str) -> list[str]:
    """The dotted keys of a config whose own comment says ASSUMPTION, in file order (the tests hold each of thor's,
    the Jetson's, the phone's and the seed papers' GPUs' to a sweep)."""
    return [key for key, _, own, _ in commented_keys(path) if "ASSUMPTION" in own]


def _source(own: str, above: str) -> str:
    """A key's comment, with the block above it where its own says too little on its own."""
    if len(own) >= SHORT_COMMENT or not above:
        return own
    return f"{own} ({above})" if own else above


def _ledger_entry(key: str) -> str | None:
    """The energy ledger entry (chipsim.sim.metrics.per_token_energy_pj) a thor.yaml key prices, or None."""
    section, _, name = key.rpartition(".")
    compute = {"mac_energy_pj": "arrays_mac", "sram_read_pj_per_bit": "arrays_sram",
               "sram_write_pj_per_bit": "arrays_sram", "sfu_op_energy_pj": "arrays_sfu",
               "vector_op_energy_pj": "arrays_vector", "clock_power_w_per_array": "arrays_clock",
               "clock_gated_when_idle": "arrays_clock", "clock_power_by_occupancy": "arrays_clock",
               "leakage_power_w_per_array": "static_arrays"}
    if section == "compute":
        return compute.get(name)
    if section == "host_cpu" and name == "active_power_w":
        return "host_cpu"
    component = section.rpartition(".")[2]
    if section.startswith(("memory.", "links.")):
        if name == "energy_pj_per_bit":
            return component
        if name in ("background_power_w", "static_power_w"):
            return f"static_{component}"
    return None


def energy_table() -> str:
    """thor.yaml's energy table: each entry, the ledger entry it prices, its category and its source."""
    from chipsim.hw.config import load_config
    from chipsim.sim.energy import EnergyTable

    # the categories are EnergyTable's own; the closed-form memories only spare the DRAM calibration, which
    # decides no category
    hw = load_config(THOR, ["memory.hbm.timing_model=closed-form",
                            "memory.lpddr5x.timing_model=closed-form"]).hw
    category = EnergyTable.from_config(hw).category_of
    names = {"onchip_active": "on-chip active", "offchip_io": "off-chip I/O", "idle_leakage": "idle / leakage",
             "host_cpu": "host CPU"}
    rows = [(f"`{key}`", value, f"`{entry}`", names[category[entry]], _source(own, above))
            for key, value, own, above in commented_keys(THOR) if (entry := _ledger_entry(key)) is not None]
    return _table(("key in hwconfigs/thor.yaml", "value", "ledger entry", "category", "source (the config's comment)"),
                  rows)


def _sweeps() -> dict[str, list[str]]:
    """Each config key swept by an experiment on thor.yaml -> the experiments' names."""
    import yaml

    swept: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            exp = yaml.safe_load(f)
        configs = exp.get("config")
        configs = configs if isinstance(configs, list) else [configs]
        if "../hwconfigs/thor.yaml" not in configs:
            continue
        for key in exp.get("grid") or {}:
            swept.setdefault(key, []).append(os.path.splitext(os.path.basename(path))[0])
    return swept


def assumptions() -> str:
    """Every ASSUMPTION of thor.yaml: its value, why, and the experiments that sweep it."""
    swept = _sweeps()
    assumed = set(assumed_keys(THOR))
    rows = [(f"`{key}`", value, _source(own, above), ", ".join(f"`{name}`" for name in swept.get(key, [])) or "none")
            for key, value, own, above in commented_keys(THOR) if key in assumed]
    return _table(("key in hwconfigs/thor.yaml", "value", "why (the config's comment)", "swept by"), rows)


def dram_points() -> str:
    """The DRAM validation points per standard, and the targets every point is held to."""
    from chipsim.dramsim.points import POINTS, REQUESTS
    from chipsim.dramsim.validate import BANDWIDTH_TOLERANCE, LATENCY_TOLERANCE

    by_standard: dict[str, list[dict]] = {}
    for p in POINTS:
        by_standard.setdefault(p["standard"], []).append(p)

    def listed(points, field, show=str, default=None) -> str:
        values = {p.get(field, default) for p in points}
        return ", ".join(show(v) for v in sorted(values, key=str if any(isinstance(v, str) for v in values) else None))

    refresh = {False: "off", True: "all-bank", "per-bank": "per-bank"}
    rows = [(std, len(points), listed(points, "kind"), listed(points, "read_share", lambda s: f"{s:.0%}"),
             listed(points, "refresh", refresh.__getitem__), listed(points, "channels"), listed(points, "streams"),
             listed(points, "page", default="open"), listed(points, "read_buffer", default=32),
             listed(points, "xor", lambda v: "yes" if v else "no", default=""))
            for std, points in by_standard.items()]
    rows.append(("all", len(POINTS), "", "", "", "", "", "", "", ""))
    table = _table(("standard", "points", "streams", "read share", "refresh", "channels", "interleaved streams",
                    "pages", "read queue", "bank hash"), rows)
    return (f"{table}\n\nEach point runs {REQUESTS:,} requests through both simulators. The target, which "
            f"`tests/test_dram.py` holds every point to: bandwidth within {BANDWIDTH_TOLERANCE:.0%} and average "
            f"read latency within {LATENCY_TOLERANCE:.0%} of Ramulator 2.1's.")


def trace_arrays() -> str:
    """The arrays a trace holds: the core ones every run reads, then each predictor output and its readers."""
    from chipsim.policies import REGISTRY
    from chipsim.trace.format import CORE_ARRAYS
    from chipsim.trace.predictor_arrays import RECORDED

    readers: dict[str, list[str]] = {}
    for name, cls in sorted(REGISTRY.items()):
        for spec in cls.trace_arrays:
            readers.setdefault(spec.name, []).append(f"`{name}`")
    rows = [(f"`{s.name}`", s.dtype, "(" + ", ".join(s.shape) + ")", s.meaning, "core: the engine and every policy")
            for s in CORE_ARRAYS.values()]
    rows += [(f"`{s.name}`", s.dtype, "(" + ", ".join(s.shape) + ")", s.meaning,
              ", ".join(readers.get(s.name, [])) or "no shipped policy") for s in RECORDED]
    return _table(("array", "dtype", "shape", "meaning", "read by"), rows)


def expert_formats() -> str:
    """Every named expert format (`model.expert_format`): bits per weight, scales, and what it is."""
    from chipsim.hw.expert_formats import FORMATS, PER_TENSOR

    def group(fmt) -> str:
        if fmt.group_size is None:
            return "model.quant_group_size" if fmt.bits < 16 else "none"
        return "one per matrix" if fmt.group_size == PER_TENSOR else f"{fmt.group_size:,}"

    def scale(fmt) -> str:
        return ("model.quant_scale_bits" if fmt.bits < 16 else "none") if fmt.scale_bits is None else str(fmt.scale_bits)

    rows = [(f"`{name}`", fmt.bits, group(fmt), scale(fmt), fmt.source) for name, fmt in FORMATS.items()]
    return _table(("format", "bits per weight", "weights per scale", "scale bits", "what it is"), rows)


def policy_overview() -> str:
    """Every registered policy: phase, whether it keeps experts across tokens, the predictor outputs it reads."""
    from chipsim.policies import REGISTRY

    rows = []
    for name, cls in sorted(REGISTRY.items(), key=lambda item: (item[1].phase != "decode", item[0])):
        arrays = ", ".join(f"`{s.name}`" for s in cls.trace_arrays) or "routing only"
        if cls.sees_future_routing:
            arrays = "future routing (an upper bound)"
        rows.append((f"`{name}`", cls.phase, "yes" if cls.caches_across_tokens else "no", arrays, cls.summary))
    return _table(("policy", "phase", "keeps experts across tokens", "reads", "what it does"), rows)


def report_rows(heading: str, first_cells: tuple[str, ...] = (), path: str = REPRODUCTION) -> str:
    """The first table under the heading that starts with `heading` in a report, whole or only the rows whose
    first cell is one of `first_cells` (in the report's order). An absent heading, table or row is an error, so a
    strict build fails rather than quote something the report no longer says."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"#+ ", line) and
                  line.lstrip("#").strip().startswith(heading)), None)
    if start is None:
        raise ValueError(f"{os.path.basename(path)}: no section '{heading}'")
    table: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 3:
        raise ValueError(f"{os.path.basename(path)}: section '{heading}' has no table")
    if not first_cells:
        return "\n".join(table)
    body = [row for row in table[2:] if row.split("|")[1].strip() in first_cells]
    missing = set(first_cells) - {row.split("|")[1].strip() for row in body}
    if missing:
        raise ValueError(f"{os.path.basename(path)}: section '{heading}' has no row {sorted(missing)[0]!r}")
    return "\n".join(table[:2] + body)


SECTIONS: dict[str, Callable[[], str]] = {
    "thor-energy-table": energy_table,
    "thor-assumptions": assumptions,
    "dram-validation-points": dram_points,
    "trace-arrays": trace_arrays,
    "expert-formats": expert_formats,
    "policy-overview": policy_overview,
    "findings-apex-window": lambda: report_rows("The APEX window"),
    "findings-apex-gain": lambda: report_rows("apex_fig12:", (
        "APEX vs no-prefetch @512", "APEX vs no-prefetch @1024", "APEX vs no-prefetch @2048",
        "APEX vs ProMoE @1024")),
    "findings-energy": lambda: report_rows("apex_table5:", (
        "no-prefetch on-chip active", "no-prefetch off-chip I/O", "no-prefetch PCIe only",
        "no-prefetch idle / leakage", "no-prefetch total", "static k+8 PCIe only, unpicked completed")),
    "findings-expert-buffer": lambda: report_rows("sensitivity_expert_buffer:"),
}
