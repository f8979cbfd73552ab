"""The docs and docstrings name chipsim's rooms as they are: every path under chipsim/ and every dotted chipsim module
that README.md, CONTRIBUTING.md, the traces' and validation's READMEs and the package's own docstrings and comments
name exists (a module moved or removed leaves no reader pointing at it)."""

from __future__ import annotations

import glob
import os
import re

from conftest import ROOT

DOCS = ["README.md", "CONTRIBUTING.md", "traces/README.md", "traces/README-real.md", "validation/NOTES.md",
        *sorted(glob.glob("validation/*/README.md", root_dir=ROOT)),
        *sorted(glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True))]
SOURCES = sorted(glob.glob("chipsim/**/*.py", root_dir=ROOT, recursive=True)
                 + glob.glob("chipsim/**/*.pyx", root_dir=ROOT, recursive=True))
# a path under the package (not one ending in chipsim/, such as a venv's /tmp/chipsim/bin), and a dotted module name
PATH = re.compile(r"(?<![\w/~.-])chipsim/[A-Za-z0-9_/.]*[A-Za-z0-9_]")
DOTTED = re.compile(r"(?<![\w/~.])chipsim(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
NOT_MODULES = {"chipsim.policy_param"}  # a dataclass field's metadata key (chipsim.policies.base)


def _is_module(parts: list[str]) -> bool:
    path = os.path.join(ROOT, *parts)
    return os.path.isfile(path + ".py") or os.path.isfile(path + ".pyx") or os.path.isdir(path)


def stale_references(text: str) -> list[str]:
    """The chipsim/... paths and chipsim.x.y modules in `text` that do not exist. A dotted name counts as a module
    reference as far as its lowercase parts go below a package: chipsim.sim.engine.Simulation needs
    chipsim/sim/engine.py, chipsim.sim.NATIVE only chipsim/sim/."""
    stale = []
    for match in PATH.findall(text):
        path = os.path.join(ROOT, match)
        if not (os.path.exists(path) or os.path.exists(path + ".py")):
            stale.append(match)
    for match in DOTTED.findall(text):
        if match in NOT_MODULES:
            continue
        parts = match.split(".")
        depth = 2
        while depth < len(parts) and os.path.isdir(os.path.join(ROOT, *parts[:depth])) and parts[depth].islower():
            depth += 1  # a lowercase name under a package: a module (or subpackage) of it, or a name its __init__ has
        if not _is_module(parts[:depth]) and not _defined_in_package(parts[:depth]):
            stale.append(match)
    return stale


def _defined_in_package(parts: list[str]) -> bool:
    """`parts[-1]` is a name the package `parts[:-1]` defines in its __init__.py (chipsim.sim.core is a module, but a
    function of a package's __init__ is named the same way)."""
    init = os.path.join(ROOT, *parts[:-1], "__init__.py")
    return os.path.isfile(init) and re.search(rf"^(def |class )?{parts[-1]}\b", open(init, encoding="utf-8").read(),
                                              re.MULTILINE) is not None


def test_the_docs_name_only_paths_and_modules_that_exist():
    stale = {doc: stale_references(open(os.path.join(ROOT, doc), encoding="utf-8").read()) for doc in DOCS
             if os.path.exists(os.path.join(ROOT, doc))}
    assert {doc: refs for doc, refs in stale.items() if refs} == {}


def test_the_package_names_only_paths_and_modules_that_exist():
    stale = {src: stale_references(open(os.path.join(ROOT, src), encoding="utf-8").read()) for src in SOURCES}
    assert {src: refs for src, refs in stale.items() if refs} == {}


def test_a_moved_module_is_caught():
    """What the two checks above would say of a doc naming the modules before issue 38 moved them."""
    text = ("chipsim.sim.fast.NativeSimulation; chipsim/dram/standards/hbm3.yaml; chipsim.trace.train; "
            "chipsim.hw.compute.ArrayModel; /tmp/chipsim/bin/pip; chipsim.sim.NATIVE; chipsim.sim.engine.Simulation")
    assert stale_references(text) == ["chipsim/dram/standards/hbm3.yaml", "chipsim.sim.fast.NativeSimulation",
                                      "chipsim.trace.train", "chipsim.hw.compute.ArrayModel"]
