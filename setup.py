"""Builds chipsim (the metadata is in pyproject.toml) and compiles its event engine, the modules listed in
chipsim/sim/__init__.py's COMPILED, to C extensions with mypyc: the same code, about twice as fast.

If mypyc or a C compiler is missing, or compiling fails, chipsim installs as pure Python (a warning says why).
CHIPSIM_PURE_PYTHON=1 skips compiling. The sources compiled are recorded (chipsim/sim/_compiled_sources.json), so
that an edited module is not run from its old compiled copy (chipsim/sim/__init__.py)."""

import ast
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "chipsim" / "sim"


def _constant(name: str):
    """A constant of chipsim/sim/__init__.py, read without importing chipsim (its dependencies are not here)."""
    tree = ast.parse((SIM / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"chipsim/sim/__init__.py has no {name}")


NAMES = tuple(_constant("COMPILED"))
RECORD = _constant("RECORD")
NATIVE_SOURCE = _constant("NATIVE_SOURCE")


def _warn(why: str) -> None:
    print(f"chipsim: the event engine is not compiled ({why}); it runs as pure Python", file=sys.stderr)


@functools.cache
def _extensions() -> list:
    if os.environ.get("CHIPSIM_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc reads pyproject.toml's [tool.mypy] and writes its C files under build/
    try:
        extensions = mypycify([f"chipsim/sim/{name}.py" for name in NAMES], opt_level="3")
    except BaseException as e:  # a type error in the compiled modules ends mypyc with SystemExit
        _warn(f"mypyc failed: {e}")
        return []
    finally:
        os.chdir(cwd)
    return extensions + _native_extension()


def _native_extension() -> list:
    """chipsim.sim.native (the fast path's event core in C) from its Cython source; without Cython the fast path
    runs on the compiled Python classes instead."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("chipsim: Cython is not installed; the fast path runs without its C event core", file=sys.stderr)
        return []
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return cythonize([Extension("chipsim.sim.native", [f"chipsim/sim/{NATIVE_SOURCE}"])], quiet=True,
                         build_dir="build")
    except BaseException as e:  # a Cython compile error
        print(f"chipsim: Cython failed ({e}); the fast path runs without its C event core", file=sys.stderr)
        return []
    finally:
        os.chdir(cwd)


class OptionalBuildExt(build_ext):
    """Builds the extensions, or none of them: any failure leaves the pure-Python modules."""

    def finalize_options(self) -> None:
        # mypyc runs once, for a build: not when pip only asks setup.py for its requirements or metadata (egg_info
        # then looks at build_ext's sources too)
        if not set(self.distribution.commands) <= {"egg_info", "dist_info", "sdist"}:
            self.distribution.ext_modules = _extensions()
            if not self.distribution.ext_modules:  # built as Python: an earlier build's extensions must not run
                for path in SIM.iterdir():
                    if path.name == RECORD or (path.name.split(".")[0] in NAMES + ("native",)
                                               and path.suffix in (".so", ".pyd")):
                        path.unlink()
        super().finalize_options()

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no C compiler, a compile error
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            _warn(f"compiling failed: {e}")
            return
        if self.extensions:
            record = Path(self.get_ext_fullpath("chipsim.sim.engine")).parent / RECORD
            digests = {name: hashlib.sha256((SIM / f"{name}.py").read_bytes()).hexdigest() for name in NAMES}
            if any(ext.name == "chipsim.sim.native" for ext in self.extensions):
                digests["native"] = hashlib.sha256((SIM / NATIVE_SOURCE).read_bytes()).hexdigest()
            record.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


# a stand-in, so that setuptools builds extensions (and tags the wheel for this platform); build_ext replaces it
setup(ext_modules=[Extension("chipsim.sim.engine", sources=[])], cmdclass={"build_ext": OptionalBuildExt})
