"""Builds chipsim (the metadata is in pyproject.toml) and compiles the modules listed in chipsim/_compiled.py's
COMPILED (the event engine, the command-level DRAM model) to C extensions with mypyc: the same code, two to three
times as fast; and the fast path's C event core from its Cython source.

If mypyc or a C compiler is missing, or compiling fails, chipsim installs as pure Python (a warning says why).
CHIPSIM_PURE_PYTHON=1 skips compiling. The sources compiled are recorded (chipsim/_compiled_sources.json), so
that an edited module is not run from its old compiled copy (chipsim/_compiled.py)."""

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
PACKAGE = ROOT / "chipsim"


def _constant(name: str):
    """A constant of chipsim/_compiled.py, read without importing chipsim (its dependencies are not here)."""
    tree = ast.parse((PACKAGE / "_compiled.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"chipsim/_compiled.py has no {name}")


SOURCES = [f"{package}/{name}.py" for package, names in _constant("COMPILED").items() for name in names]
RECORD = _constant("RECORD")
NATIVE_SOURCE = _constant("NATIVE_SOURCE")


def _warn(why: str) -> None:
    print(f"chipsim: the event engine and the DRAM model are not compiled ({why}); they run as pure Python",
          file=sys.stderr)


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
        extensions = mypycify([f"chipsim/{source}" for source in SOURCES], opt_level="3")
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
        return cythonize([Extension("chipsim.sim.native", [f"chipsim/{NATIVE_SOURCE}"])], quiet=True,
                         build_dir="build")
    except BaseException as e:  # a Cython compile error
        print(f"chipsim: Cython failed ({e}); the fast path runs without its C event core", file=sys.stderr)
        return []
    finally:
        os.chdir(cwd)


def _remove_built(package: Path) -> None:
    """An earlier build's extensions and record under `package` (a chipsim/ folder), so they never run beside
    sources they were not built from."""
    for path in [package / RECORD, package / "sim" / RECORD]:  # (chipsim/sim/: where it was before)
        path.unlink(missing_ok=True)
    stems = [package / Path(source).with_suffix("") for source in SOURCES + [NATIVE_SOURCE]]
    stems.append(package.parent / "*__mypyc")  # mypyc's shared library, beside chipsim/
    for stem in stems:
        for path in stem.parent.glob(f"{stem.name}.*"):
            if path.suffix in (".so", ".pyd"):
                path.unlink()


class OptionalBuildExt(build_ext):
    """Builds the extensions, or none of them: any failure leaves the pure-Python modules."""

    def finalize_options(self) -> None:
        # mypyc runs once, for a build: not when pip only asks setup.py for its requirements or metadata (egg_info
        # then looks at build_ext's sources too)
        building = not set(self.distribution.commands) <= {"egg_info", "dist_info", "sdist"}
        if building:
            self.distribution.ext_modules = _extensions()
        super().finalize_options()
        if building and not self.distribution.ext_modules:
            # built as Python, an earlier build's extensions must not run: an editable install runs from the source
            # tree, so they go from there; a wheel (pip wheel, pip install .) leaves chipsim/ as it is, and they go
            # from its build folder, where they would otherwise be packed into it
            _remove_built(PACKAGE if self._in_place() else Path(self.build_lib) / "chipsim")

    def _in_place(self) -> bool:
        # editable_wheel finalizes this command before it sets editable_mode: its name says it
        editable = {"editable_wheel", "develop"} & set(self.distribution.commands)
        return bool(self.inplace or getattr(self, "editable_mode", False) or editable)

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
            record = Path(self.get_ext_fullpath("chipsim.sim.engine")).parent.parent / RECORD  # in chipsim/
            built = SOURCES + ([NATIVE_SOURCE] if any(ext.name == "chipsim.sim.native" for ext in self.extensions)
                               else [])
            digests = {source: hashlib.sha256((PACKAGE / source).read_bytes()).hexdigest() for source in built}
            record.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
            (record.parent / "sim" / RECORD).unlink(missing_ok=True)  # an earlier build's, where it was before


# a stand-in, so that setuptools builds extensions (and tags the wheel for this platform); build_ext replaces it
setup(ext_modules=[Extension("chipsim.sim.engine", sources=[])], cmdclass={"build_ext": OptionalBuildExt})
