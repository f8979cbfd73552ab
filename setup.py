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
    for source in SOURCES + [NATIVE_SOURCE]:
        stem = package / Path(source).with_suffix("")
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
        super().finalize_options()  # sets inplace for an editable install
        if building and self.inplace and not self.distribution.ext_modules:
            # an editable install runs from the source tree: built as Python, its earlier extensions must not run.
            # A wheel (pip wheel, pip install .) leaves chipsim/ as it is and cleans its build folder (run)
            _remove_built(PACKAGE)

    def run(self) -> None:
        if not self.inplace:  # an earlier build's extensions in build/lib would otherwise go into this wheel
            _remove_built(Path(self.build_lib) / "chipsim")
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
