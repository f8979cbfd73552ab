"""The documentation site's reference pages, written from the code at build time.

docs/hooks.py (a MkDocs hook) replaces each `<!-- generated: NAME -->` marker in a page with SECTIONS[NAME](), so a
reference page lists exactly what the installed code knows: every config key (chipsim.hw.config's field metadata),
every policy and its parameters (chipsim.policies.REGISTRY), every bundled model (chipsim.workload.models.MODELS),
every results.csv column (chipsim.analysis.columns) and every experiment `chipsim reproduce` runs (experiments/*.yaml).
Nothing here is typed by hand but the headings.
"""

from __future__ import annotations

from typing import Callable

from chipsim.analysis import docs_concepts
from chipsim.analysis.markdown import code as _code, table as _table


def config_keys() -> str:
    """Every config key: its type, meaning (with its unit), allowed values and default."""
    from chipsim.hw.config import iter_key_specs

    rows = []
    for key, type_name, doc, bounds, default, optional in iter_key_specs():
        rows.append((_code(key), type_name, doc, bounds.describe(),
                     _code(repr(default)) if optional else "required"))
    return _table(("key", "type", "meaning", "allowed", "default"), rows)


def policy_keys() -> str:
    """Every policy parameter as a config key, `policies.<name>.<param>` (all optional)."""
    from chipsim.policies import REGISTRY

    rows = [(_code(f"policies.{name}.{param}"), p.type.__name__, p.doc, p.bounds.describe(), _code(repr(p.default)))
            for name, cls in sorted(REGISTRY.items()) for param, p in cls.param_specs().items()]
    return _table(("key", "type", "meaning", "allowed", "default"), rows)


def policies() -> str:
    """Each registered policy: what it does, its parameters, the trace arrays it reads and the columns it adds."""
    from chipsim.policies import REGISTRY

    parts = []
    for name, cls in sorted(REGISTRY.items()):
        lines = [f"### `{name}`", "", cls.summary, "",
                 f"- phase: {cls.phase}", f"- experts read in place: {cls.in_place}"]
        if cls.trace_arrays:
            lines.append("- reads trace arrays: " + ", ".join(_code(spec.name) for spec in cls.trace_arrays))
        if cls.phase == "decode":
            lines.append(f"- several sequences (workload.batch > 1): {cls.batch_support or 'runs one sequence only'}")
        if cls.result_columns:
            lines.append("- results.csv columns of its own: " + ", ".join(_code(c) for c in cls.result_columns))
        specs = cls.param_specs()
        if specs:
            lines += ["", _table(("parameter", "type", "default", "allowed", "meaning"),
                                 [(_code(key), p.type.__name__, _code(repr(p.default)), p.bounds.describe(), p.doc)
                                  for key, p in specs.items()])]
        else:
            lines += ["", "No parameters."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def models() -> str:
    """The bundled model shapes in one table, then what chipsim derives from each (`chipsim models NAME`)."""
    from chipsim.workload.model_report import describe_bundled, expert_bytes
    from chipsim.workload.models import MODELS

    rows = []
    for name in sorted(MODELS):
        m = MODELS[name]
        fmt = m.published_expert_format or "bf16"
        rows.append((_code(name), m.hf_architecture, m.num_layers, m.num_moe_layers, m.num_experts, m.top_k,
                     m.num_shared_experts, f"{expert_bytes(m, fmt) / 1e6:.2f}", f"{m.total_params() / 1e9:.2f}",
                     f"{m.active_params() / 1e9:.2f}"))
    parts = [_table(("name", "architecture", "layers", "MoE layers", "experts", "top-k", "shared", "expert MB",
                     "total B", "active B"), rows),
             "expert MB: one routed expert as the checkpoint ships it (BF16 unless the model says otherwise)."]
    for name in sorted(MODELS):
        parts.append(f"### `{name}`\n\n```text\n{describe_bundled(name)}\n```")
    return "\n\n".join(parts)


def columns() -> str:
    """results.csv's columns: those of every run, of each mode, and those a policy adds."""
    from chipsim.analysis.columns import MODE_COLUMNS, POLICY_COLUMNS, RUN_COLUMNS

    parts = ["### Every run", "", _table(("column", "meaning"), [(_code(c), m) for c, m in RUN_COLUMNS.items()])]
    for mode, cols in MODE_COLUMNS.items():
        parts += ["", f"### {mode[0].upper()}{mode[1:]}", "",
                  _table(("column", "meaning"), [(_code(c), m) for c, m in cols.items()])]
    parts += ["", "### Reported by policies", "",
              "A policy's own scalar metrics, in its rows only (empty in the others).", "",
              _table(("column", "meaning"), [(_code(c), m) for c, m in POLICY_COLUMNS.items()])]
    return "\n".join(parts)


def table_columns() -> str:
    """The columns of the table `chipsim run` prints (chipsim.analysis.report.TABLE_COLUMNS), each with the
    results.csv column it shows and that column's meaning."""
    from chipsim.analysis.columns import RUN_COLUMNS
    from chipsim.analysis.report import HOST_COLUMN, TABLE_COLUMNS

    rows = [(header, _code(key), RUN_COLUMNS[key]) for header, key, _ in TABLE_COLUMNS]
    host, key, _ = HOST_COLUMN
    rows.insert(8, (host, _code(key), RUN_COLUMNS[key] + "; shown only where a policy computes experts there"))
    link = [i for i, row in enumerate(rows) if row[1] == _code("energy_expert_link_mj")][0]
    rows[link] = (rows[link][0] + " (the expert link's name: cxl on thor-cxl)",) + rows[link][1:]
    return _table(("table column", "results.csv column", "meaning"), rows)


def experiments() -> str:
    """Every experiment of experiments/ that `chipsim reproduce` runs: its name, the paper figure or table it
    reproduces, its title and the configs it runs on. Read from the files' own keys (not load_experiment, which
    also checks every config and grid key: seconds for the whole set, and a broken file fails its own tests)."""
    import os

    from chipsim.analysis.experiments import EXPERIMENTS_DIR, find_experiment, list_experiments
    from chipsim.files import YAML_MAX_BYTES, read_input_text
    from chipsim.values import yaml_load

    rows = []
    for name in list_experiments():
        raw = yaml_load(read_input_text(find_experiment(name), "experiment", YAML_MAX_BYTES))
        configs = raw["config"] if isinstance(raw["config"], list) else [raw["config"]]
        stems = ", ".join(_code(os.path.splitext(os.path.basename(c))[0]) for c in configs)
        rows.append((_code(name), raw["paper"], raw["title"], stems))
    return _table(("experiment", "paper", "what it shows", "configs"), rows) + \
        f"\n\nRead from the {len(rows)} files of `{os.path.basename(EXPERIMENTS_DIR)}/` when this site was built."


SECTIONS: dict[str, Callable[[], str]] = {
    "table-columns": table_columns,
    "config-keys": config_keys,
    "policy-keys": policy_keys,
    "policies": policies,
    "models": models,
    "columns": columns,
    **docs_concepts.SECTIONS,  # the concept pages' and findings' sections
    "experiments": experiments,
}
