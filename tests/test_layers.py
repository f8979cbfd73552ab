"""The package's import graph, read with `ast` (every import statement, at module level or inside a function):
no module imports itself through others, and no module imports from a layer above its own.

Layers, lowest first: the base modules (errors, units, values, files, cache, pool, _compiled, the package itself), the
two component simulators (dramsim: the command-level DRAM model; tilesim: the cycle-level compute tiles), hw, workload,
trace (reading traces), policies, sim, serve (many requests served: they read the sim's records, the runner prepares
them), runner, then analysis, tracegen (producing traces: recording, training,
predictors, quality, synthetic) and hwreplay (the GPU validation) side by side (none imports another), then cli. Implicit imports of parent packages (importing chipsim.policies.base runs chipsim/policies/__init__.py)
are not edges: only the modules an import statement names are."""

from __future__ import annotations

import ast
import os

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "chipsim")
LAYERS = {"base": 0, "dramsim": 1, "tilesim": 1, "hw": 2, "workload": 3, "trace": 4, "policies": 5, "sim": 6,
          "serve": 7, "runner": 8, "analysis": 9, "tracegen": 9, "hwreplay": 9, "cli": 10}
BASE = {"chipsim", "chipsim.errors", "chipsim.units", "chipsim.values", "chipsim.files", "chipsim.cache",
        "chipsim.pool", "chipsim._compiled"}


def modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(folder, name)
    return out


def imports_of(path: str, module: str, known: set[str]) -> set[str]:
    """The package modules an import statement in `path` names (`from a.b import c` names a.b.c when that is
    a module, else a.b)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    type_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def _is_type_checking_block(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: imports for the type checker (and mypyc) only, never run, so no edge of the import graph."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def layer_of(module: str) -> tuple[int, str]:
    """(rank, layer name) of a module: chipsim.sim.engine -> (5, 'sim'), chipsim.runner -> (6, 'runner')."""
    if module in BASE:
        return LAYERS["base"], "base"
    part = module.split(".")[1]
    return LAYERS[part], part


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(p, m, known) for m, p in mods.items()}


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)  # KeyError names a module outside every layer


def test_no_module_imports_from_a_higher_layer_or_a_sibling_layer():
    wrong = []
    for module, targets in graph().items():
        rank, name = layer_of(module)
        for target in targets:
            t_rank, t_name = layer_of(target)
            if t_rank > rank or (t_rank == rank and t_name != name):
                wrong.append(f"{module} ({name}) imports {target} ({t_name})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_import_graph_has_no_cycle():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_an_import_for_the_type_checker_only_is_no_edge(tmp_path):
    """chipsim.sim.context names the engine's type under `if TYPE_CHECKING:` (the engine creates its context): that
    import never runs, so it makes no cycle."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chipsim.sim import engine\n"
                   "import chipsim.runner\n")
    known = {"chipsim.sim.engine", "chipsim.runner"}
    assert imports_of(str(src), "chipsim.sim.m", known) == {"chipsim.runner"}


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    """A lazy import counts as much as one at the top (the circles this test guards against were lazy)."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from chipsim.analysis import sweep\n    import chipsim.runner\n")
    known = {"chipsim.analysis", "chipsim.analysis.sweep", "chipsim.runner"}
    assert imports_of(str(src), "chipsim.analysis.m", known) == {"chipsim.analysis.sweep", "chipsim.runner"}


MAX_FUNCTION_LINES = 80  # a function that fits on a screen (CONTRIBUTING.md)


def test_no_function_is_longer_than_a_screen():
    """Every function and method of the package, its decorators excluded, is at most MAX_FUNCTION_LINES long."""
    long = []
    for module, path in sorted(modules().items()):
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert not long, "\n".join(long)


def test_the_length_check_counts_a_function_from_def_to_its_last_line(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    node = ast.parse(f"def f():\n{body}").body[0]
    assert node.end_lineno - node.lineno + 1 == MAX_FUNCTION_LINES + 1  # the def line and 80 statements: too long
