"""Provenance covers every file a result depends on, and chipsim installs as a package.

- `runner.code_sha256` hashes every file of chipsim/ that a run reads (modules, DRAM standards, native.pyx), not
  bytecode, built extensions or the build record; the DRAM standards a config names are hashed into provenance
  and into the sweep cache key.
- A wheel and an sdist hold every file of the package, and building them leaves the source tree as it was (an
  editable install beside it keeps its compiled modules)."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, THOR

from chipsim.analysis.sweep import run_sweep
from chipsim.runner import code_files, prepare, provenance, tree_sha256

PACKAGE = Path(ROOT) / "chipsim"
HBM3 = PACKAGE / "dramsim" / "standards" / "hbm3.yaml"
# short runs, and only the HBM on the command-level model (one calibration per standard, not two)
SHORT = ["workload.max_tokens=2", "memory.lpddr5x.timing_model=closed-form"]


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def slower_standard(path: Path) -> None:
    """hbm3.yaml with nCCDS (RD to RD within a stack) 2 -> 6 cycles: the command-level HBM streams slower."""
    text = HBM3.read_text()
    assert text.count("    nCCDS: 2\n") == 1
    path.write_text(text.replace("    nCCDS: 2\n", "    nCCDS: 6\n"))


# ---------------------------------------------------------------------------------------------- the code hash
def test_code_files_are_the_package_files_a_run_reads():
    files = code_files()
    assert files == sorted(files)
    for rel in ("runner.py", "dramsim/standards/hbm3.yaml", "dramsim/standards/lpddr5.yaml", "sim/native.pyx"):
        assert rel in files
    assert not [f for f in files if f.endswith((".pyc", ".so", ".pyd")) or "__pycache__" in f
                or f.endswith("_compiled_sources.json")]


def test_code_hash_follows_every_source_file_and_ignores_build_outputs(tmp_path):
    copy = tmp_path / "chipsim"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.pyc",
                                                                 "_compiled_sources.json"))
    assert tree_sha256(copy) == tree_sha256(copy)  # a fixed order
    original = tree_sha256(copy)
    # what a build or a run adds does not change it
    (copy / "sim" / "engine.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (copy / "_compiled_sources.json").write_text("{}\n")
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "runner.cpython-311.pyc").write_bytes(b"bytecode")
    assert tree_sha256(copy) == original
    # a DRAM standard, the Cython source and a module each change it
    for rel in ("dramsim/standards/hbm3.yaml", "sim/native.pyx", "units.py"):
        path = copy / rel
        text = path.read_bytes()
        path.write_bytes(text + b"\n")
        assert tree_sha256(copy) != original, rel
        path.write_bytes(text)
    assert tree_sha256(copy) == original
    slower_standard(copy / "dramsim" / "standards" / "hbm3.yaml")
    assert tree_sha256(copy) != original


# ---------------------------------------------------------------------------------------------- named files
def test_provenance_carries_the_contents_of_the_standards_a_config_names(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    std = tmp_path / "my-hbm3.yaml"
    shutil.copy(HBM3, std)
    prov = provenance(prepare(THOR, SHORT + [f"memory.hbm.standard={std}"]))
    assert prov["input_files"] == {"memory.hbm.standard": {"path": str(std), "sha256": sha256(HBM3)}}
    # a built-in name is its file in the package; a closed-form memory (here lpddr5x) reads none
    prov = provenance(prepare(THOR, SHORT))
    assert prov["input_files"] == {"memory.hbm.standard": {"path": str(HBM3), "sha256": sha256(HBM3)}}


def test_sweep_rerun_after_a_named_standard_changed_simulates_again(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    std = tmp_path / "my-hbm3.yaml"
    shutil.copy(HBM3, std)
    out = tmp_path / "sw"

    def sweep():
        return run_sweep(THOR, {"workload.max_tokens": [2]}, ["no-prefetch"], str(out), jobs=1, progress=False,
                         overrides=SHORT + [f"memory.hbm.standard={std}"])

    first = sweep()
    assert (first.attrs["simulated"], first.attrs["reused"]) == (1, 0)
    again = sweep()
    assert (again.attrs["simulated"], again.attrs["reused"]) == (0, 1)
    slower_standard(std)
    changed = sweep()
    assert (changed.attrs["simulated"], changed.attrs["reused"]) == (1, 0)
    before, after = first["latency_ms_per_token"][0], changed["latency_ms_per_token"][0]
    assert after > before * 1.05, (before, after)  # the slower HBM's result, not the cached one
    info = json.loads((out / "sweep.json").read_text())
    assert info["points"][0]["input_files"] == {"memory.hbm.standard": {"path": str(std), "sha256": sha256(std)}}
    assert len(os.listdir(out / "cache")) == 2  # one entry per standard's contents


# ---------------------------------------------------------------------------------------------- wheel and sdist
def _can_build_wheels() -> bool:
    """setuptools >= 70.1 builds wheels itself; older ones need the `wheel` package."""
    return any(importlib.util.find_spec(m) is not None for m in ("setuptools.command.bdist_wheel", "wheel"))


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _package_snapshot() -> dict:
    """Every file under chipsim/ (ignored ones too: compiled modules, their record) -> sha256."""
    return {p.relative_to(PACKAGE).as_posix(): sha256(p) for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".git")),
                    reason="needs the git checkout (the tracked files are the package's)")
@pytest.mark.skipif(not _can_build_wheels(), reason="setuptools < 70.1 without the wheel package cannot build wheels")
def test_pure_wheel_and_sdist_hold_every_package_file_and_leave_the_tree_alone(tmp_path):
    tracked = [line.removeprefix("chipsim/") for line in _git("ls-files", "chipsim").splitlines()]
    assert "dramsim/standards/hbm3.yaml" in tracked and "sim/native.pyx" in tracked
    status, snapshot = _git("status", "--porcelain"), _package_snapshot()
    env = dict(os.environ, CHIPSIM_PURE_PYTHON="1", PIP_NO_INDEX="1")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheel"), ROOT], cwd=tmp_path, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_sdist(sys.argv[1])", str(tmp_path / "sdist")],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    # the source tree is as it was: no file changed, none removed (an editable install's compiled modules and
    # the record of their sources stay, so it keeps running compiled)
    assert _git("status", "--porcelain") == status
    assert _package_snapshot() == snapshot

    (wheel,) = (tmp_path / "wheel").iterdir()
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    # package files sit at the wheel's root or under <name>.data/purelib|platlib/: both install in site-packages
    in_wheel = {n.split("/", 2)[2] if n.split("/")[0].endswith(".data") else n for n in names}
    assert {f"chipsim/{rel}" for rel in tracked} <= in_wheel
    assert not [n for n in in_wheel if n.endswith((".so", ".pyd", "_compiled_sources.json"))]  # pure Python

    (sdist,) = (tmp_path / "sdist").iterdir()
    with tarfile.open(sdist) as tf:
        in_sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {f"chipsim/{rel}" for rel in tracked} <= in_sdist
    assert {"setup.py", "pyproject.toml", "README.md"} <= in_sdist
    assert not [n for n in in_sdist if n.endswith((".so", ".pyd", "_compiled_sources.json"))]
