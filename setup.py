"""Builds chipsim (the metadata is in pyproject.toml) and compiles its event engine, the modules listed in
chipsim/sim/__init__.py's COMPILED, to C extensions with mypyc: the same code, about twice as fast.

If mypyc or a C compiler is missing, or compiling fails, chipsim installs as pure Python (a warning says why).
CHIPSIM_PURE_PYTHON=1 skips compiling. The sources compiled are recorded (chipsim/sim/_compiled_sources.json), so
that an edited module is not run from its old compiled copy (chipsim/sim/__init__.py)."""

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "chipsim" / "sim"


def _compiled_names() -> tuple[str, ...]:
    tree = ast.parse((SIM / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPILED" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("chipsim/sim/__init__.py has no COMPILED")


NAMES = _compiled_names()


def _warn(why: str) -> None:
    print(f"chipsim: the event engine is not compiled ({why}); it runs as pure Python", file=sys.stderr)


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
        return mypycify([f"chipsim/sim/{name}.py" for name in NAMES], opt_level="3")
    except BaseException as e:  # a type error in the compiled modules ends mypyc with SystemExit
        _warn(f"mypyc failed: {e}")
        return []
    finally:
        os.chdir(cwd)


class OptionalBuildExt(build_ext):
    """Builds the extensions, or none of them: any failure leaves the pure-Python modules."""

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
            record = Path(self.get_ext_fullpath("chipsim.sim.engine")).parent / "_compiled_sources.json"
            record.write_text(json.dumps({name: hashlib.sha256((SIM / f"{name}.py").read_bytes()).hexdigest()
                                          for name in NAMES}, indent=1, sort_keys=True) + "\n")


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
