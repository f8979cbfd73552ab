"""Caches are checked, never trusted (chipsim/cache.py): a DRAM calibration, a cycle-level operation table or a
sweep result that is corrupt, garbled but parsable, old, foreign or not a regular file is reported as one
`chipsim: note:` line and recomputed, so a run prints what it prints with a cold cache; `chipsim cache info|clear`
show and empty the caches; tests never touch the user's cache."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chipsim import cache, cli
from chipsim.analysis import sweep
from chipsim.tilesim import op_cache
from chipsim.dramsim import calibrate as cal
from conftest import ROOT, THOR

CYCLE = os.path.join(ROOT, "hwconfigs", "thor.yaml")
RUN = ["--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1", "--json"]
FUZZ = settings(deadline=None, derandomize=True, database=None, max_examples=150,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _forget_in_process() -> None:
    """A new process as far as caching goes: only the files are left."""
    cal.calibrate.cache_clear()
    op_cache._TABLES.clear()


def _run(capsys, config: str = THOR) -> tuple[dict, list[str]]:
    """One `chipsim run --json`: (its row, its stderr lines)."""
    _forget_in_process()
    assert cli.main(["run", config, *RUN]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)[0], err.splitlines()


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache folder holding exactly what thor uses (its DRAM calibrations, its tile model's operation
    table), calibrated once for the module."""
    folder = tmp_path_factory.mktemp("warm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHIPSIM_CACHE_DIR", str(folder))
        _forget_in_process()
        for config in (THOR, CYCLE):
            assert cli.main(["run", config, *RUN]) == 0
        _forget_in_process()
    return folder


@pytest.fixture
def private_cache(tmp_path, monkeypatch, warm_cache, capsys):
    """A copy of warm_cache of the test's own (corrupting it leaves the others alone). Returns its path."""
    folder = tmp_path / "cache"
    shutil.copytree(warm_cache, folder)
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(folder))
    _forget_in_process()
    capsys.readouterr()
    yield folder
    _forget_in_process()


def _entries(folder) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.json"))


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _save(path: str, entry) -> None:
    os.unlink(path)  # a new file (it may have been a link)
    with open(path, "w", encoding="utf-8") as f:
        f.write(entry if isinstance(entry, str) else json.dumps(entry))


def _notes(err: list[str], kind: str) -> list[str]:
    return [line for line in err if line.startswith(f"chipsim: note: {kind} cache ")]


# ---------------------------------------------------------------------------------------------- mutations
def _floats(entry: dict, change) -> dict:
    """The entry with every float of its payload (a calibration's fields) changed, its checksum kept."""
    entry["payload"] = {k: change(v) if isinstance(v, float) else v for k, v in entry["payload"].items()}
    return entry


def _mutate(path: str, how: str, tmp_path) -> None:
    """Corrupt the entry at `path` one way."""
    entry = _load(path)
    if how == "halved":
        _save(path, _floats(entry, lambda v: v / 2))
    elif how == "halved, checksum recomputed":  # garbled by someone who knew the format
        _floats(entry, lambda v: v / 2)
        entry["payload"]["efficiency"] = 1.7  # halving keeps read/peak: make it out of range
        entry["sha256"] = cache.digest(entry["payload"])
        _save(path, entry)
    elif how == "NaN":
        _save(path, json.dumps(_floats(entry, lambda v: math.nan)))
    elif how == "a string":
        _save(path, _floats(entry, lambda v: str(v)))
    elif how == "negative":
        _save(path, _floats(entry, lambda v: -v))
    elif how == "truncated":
        _save(path, json.dumps(entry)[:100])
    elif how == "empty":
        _save(path, "")
    elif how == "old format":
        _save(path, entry["payload"])
    elif how == "another key":
        entry["key"] = "0" * 64
        _save(path, entry)
    elif how == "fifo":
        os.unlink(path)
        os.mkfifo(path)
    elif how == "symlink":  # to a valid entry elsewhere: still not a file of the cache
        target = tmp_path / "elsewhere.json"
        shutil.copy(path, target)
        os.unlink(path)
        os.symlink(target, path)
    elif how == "directory":
        os.unlink(path)
        os.mkdir(path)
    elif how == "huge":
        with open(path, "r+b") as f:
            f.truncate(cache.MAX_ENTRY_BYTES + 1)  # sparse: nothing written
    else:
        raise ValueError(how)


def test_a_dram_entry_with_its_floats_halved_runs_as_cold_with_a_note(private_cache, capsys):
    """The issue's case: thor no-prefetch read 14.491 ms per token from entries with halved floats (12.572 cold, the README's)."""
    cold, err = _run(capsys)
    assert cold["latency_ms_per_token"] == pytest.approx(12.572, abs=5e-4) and not _notes(err, "dram")
    paths = _entries(private_cache / "dram")
    assert len(paths) == 2  # HBM and LPDDR5X
    for path in paths:
        _mutate(path, "halved", None)
    row, err = _run(capsys)
    assert row == cold
    assert sorted(_notes(err, "dram")) == [f"chipsim: note: dram cache {p}: checksum mismatch (changed since it was "
                                           "written); recomputing" for p in paths]
    for path in paths:  # rewritten valid
        assert cache.inspect(path, "dram", os.path.basename(path)[:-5], cal.check_calibration) is not None
    again, err = _run(capsys)
    assert again == cold and not _notes(err, "dram")


@pytest.mark.parametrize("how", ["fifo", "directory"])
def test_a_dram_entry_that_is_not_a_file_runs_as_cold_without_a_hang(private_cache, capsys, how):
    cold, _ = _run(capsys)
    path = _entries(private_cache / "dram")[0]
    _mutate(path, how, None)
    row, err = _run(capsys)
    assert row == cold
    assert _notes(err, "dram") == [f"chipsim: note: dram cache {path}: is a "
                                   f"{'FIFO (named pipe)' if how == 'fifo' else 'directory'}; recomputing"]
    assert os.path.isdir(path) if how == "directory" else os.path.isfile(path) and not os.path.islink(path)


MUTATIONS = ["halved", "halved, checksum recomputed", "NaN", "a string", "negative", "truncated", "empty",
             "old format", "another key", "fifo", "symlink", "directory", "huge"]
WHY = {"halved": "checksum mismatch", "halved, checksum recomputed": "efficiency: 1.7 is above 1.0",
       "NaN": "not JSON (NaN is not a JSON number)", "a string": "checksum mismatch", "negative": "checksum mismatch",
       "truncated": "not JSON", "empty": "not JSON", "old format": "old format without a checksum",
       "another key": "made for other inputs", "fifo": "is a FIFO", "symlink": "is a symbolic link",
       "directory": "is a directory", "huge": f"{cache.MAX_ENTRY_BYTES + 1} bytes, more than any entry"}


@pytest.mark.parametrize("how", MUTATIONS)
def test_every_kind_of_bad_dram_entry_is_noted_and_replaced(private_cache, tmp_path, capsys, how):
    """The reader on a real calibration entry: each corruption is one note naming why, and writing the value
    again leaves a valid entry (a folder in its place is left alone; a link is replaced, not what it points to)."""
    path = _entries(private_cache / "dram")[0]
    key = os.path.basename(path)[:-5]
    good = cache.inspect(path, "dram", key, cal.check_calibration)
    _mutate(path, how, tmp_path)
    assert cache.read(path, "dram", key, cal.check_calibration) is None
    notes = _notes(capsys.readouterr().err.splitlines(), "dram")
    assert len(notes) == 1 and notes[0].startswith(f"chipsim: note: dram cache {path}: {WHY[how]}")
    assert notes[0].endswith("; recomputing")
    cache.write(path, "dram", key, good)
    if how == "directory":
        assert os.path.isdir(path)
        return
    assert cache.inspect(path, "dram", key, cal.check_calibration) == good
    if how == "symlink":
        assert cache.inspect(str(tmp_path / "elsewhere.json"), "dram", key, cal.check_calibration) == good


def test_a_cache_folder_that_cannot_be_written_only_means_recomputing(private_cache, tmp_path, monkeypatch, capsys):
    """$CHIPSIM_CACHE_DIR under a regular file: nothing can be read or written there; the run is the same."""
    cold, _ = _run(capsys)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(blocker / "cache"))
    row, err = _run(capsys)
    assert row == cold and err and all(line.startswith(("chipsim: note: dram cache ", "chipsim: note: compute cache "))
                                       for line in err)
    assert blocker.read_text() == "x"


# ---------------------------------------------------------------------------------------------- compute table
def test_a_garbled_operation_table_runs_as_cold_with_a_note(private_cache, capsys):
    cold, err = _run(capsys, CYCLE)
    [path] = _entries(private_cache / "compute")
    entry = _load(path)
    for op in entry["payload"]["ops"].values():
        op["ps"] //= 2
    _save(path, entry)
    row, err = _run(capsys, CYCLE)
    assert row == cold
    assert _notes(err, "compute") == [f"chipsim: note: compute cache {path}: checksum mismatch (changed since it "
                                      "was written); recomputing"]
    assert cache.inspect(path, "compute", os.path.basename(path)[:-5], op_cache.check_table) == \
        _load(path)["payload"] and _load(path)["payload"]["ops"] != entry["payload"]["ops"]
    os.unlink(path)
    os.mkfifo(path)
    assert _run(capsys, CYCLE)[0] == cold
    assert os.path.isfile(path)


# ---------------------------------------------------------------------------------------------- sweep rows
def test_a_sweep_row_of_nan_is_simulated_again_and_results_csv_equals_a_fresh_sweep(tmp_path, capsys):
    args = dict(grid={"dma.engines": [1, 2]}, policies=["no-prefetch"], overrides=["workload.max_tokens=4"], jobs=1,
                progress=False)
    sweep.run_sweep(THOR, out_dir=str(tmp_path / "fresh"), **args)
    fresh = (tmp_path / "fresh" / "results.csv").read_text()
    [first, _] = _entries(tmp_path / "fresh" / "cache")
    entry = _load(first)
    entry["payload"]["row"]["latency_ms_per_token"] = math.nan
    _save(first, json.dumps(entry))
    capsys.readouterr()
    df = sweep.run_sweep(THOR, out_dir=str(tmp_path / "fresh"), **args)
    assert (df.attrs["simulated"], df.attrs["reused"]) == (1, 1)
    assert (tmp_path / "fresh" / "results.csv").read_text() == fresh
    assert capsys.readouterr().err == (f"chipsim: note: sweep cache {first}: not JSON (NaN is not a JSON number); "
                                       "recomputing\n")
    # garbled with a valid checksum: a row of another policy, a latency as a string
    rewritten = _load(first)
    for field, value, why in (("policy", "apex", "row.policy: 'apex', expected 'no-prefetch'"),
                              ("latency_ms_per_token", "12", "row.latency_ms_per_token: '12' is not a number")):
        entry = json.loads(json.dumps(rewritten))
        entry["payload"]["row"][field] = value
        entry["sha256"] = cache.digest(entry["payload"])
        _save(first, entry)
        with pytest.raises(cache.BadEntry, match=why.replace("(", r"\(")):
            cache.inspect(first, "sweep", os.path.basename(first)[:-5], sweep.check_row)
        assert sweep._read_cache(first, os.path.basename(first)[:-5], "no-prefetch") is None


# ---------------------------------------------------------------------------------------------- properties
def _entry_of(payload, kind="dram", key="k" * 64) -> str:
    return cache.entry_text(kind, key, payload)


CALIBRATION = {"efficiency": 0.8340144230769231, "turnaround": 2.1104123792214713,
               "access_latency_ns": 44.312185929648244, "write_share": 0.151, "read_gbps": 42.70153846153846,
               "mixed_gbps": 32.382222222222225, "peak_gbps": 51.2, "loaded_read_latency_ns": 37.744051336247615,
               "second_read_share": 0.0, "shared_efficiency": 0.8340144230769231}  # thor's HBM, as calibrated
json_values = st.one_of(st.floats(), st.integers(), st.text(max_size=8), st.booleans(), st.none(),
                        st.lists(st.integers(), max_size=2))


def test_the_calibration_fixture_is_valid():
    cache.parse_entry(_entry_of(CALIBRATION), "dram", "k" * 64, lambda p: cal.check_calibration(p, 0.151, 0.0))


@FUZZ
@given(field=st.sampled_from(sorted(CALIBRATION)), value=json_values)
def test_any_change_of_a_calibration_value_is_detected(field, value):
    """Whatever a field becomes, the stored checksum no longer matches."""
    if value == CALIBRATION[field] and type(value) is type(CALIBRATION[field]):
        return
    entry = json.loads(_entry_of(CALIBRATION))
    entry["payload"][field] = value
    with pytest.raises(cache.BadEntry):
        cache.parse_entry(json.dumps(entry), "dram", "k" * 64, cal.check_calibration)


@FUZZ
@given(field=st.sampled_from(sorted(CALIBRATION)),
       value=st.one_of(st.floats().filter(lambda v: not math.isfinite(v) or v < 0), st.floats(max_value=-1e-300),
                       st.text(max_size=8), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
def test_a_calibration_value_that_is_no_measurement_is_refused_even_with_its_checksum(field, value):
    """NaN, infinite, negative, a string, a boolean, null, a list: refused by the check itself."""
    payload = dict(CALIBRATION, **{field: value})
    entry = json.loads(json.dumps({"format": cache.FORMAT, "kind": "dram", "key": "k" * 64, "payload": payload,
                                   "sha256": "0" * 64}))  # NaN: json's own, as a hand-edited file would have
    entry["sha256"] = hashlib_digest(entry["payload"])
    with pytest.raises(cache.BadEntry):
        cache.parse_entry(json.dumps(entry), "dram", "k" * 64, cal.check_calibration)


def hashlib_digest(payload) -> str:
    """The checksum chipsim would compute, NaN and infinity included (canonical() refuses them)."""
    import hashlib

    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


OP = {"ps": 1689350, "stream_ps": 1625350, "macs": 1572864, "sfu_ops": 0, "hbm_bytes": 1048576,
      "sram_write_bytes": 1048576, "sram_read_bytes": 1048576, "compute_cycles": 128, "tiles": 4, "requests": 4096}


@FUZZ
@given(field=st.sampled_from(sorted(OP)),
       value=st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=4), st.booleans(), st.none()))
def test_an_operation_count_that_is_not_a_whole_number_from_zero_is_refused(field, value):
    table = {"params": {"arrays": 4}, "ops": {"matvec r1 o1": dict(OP, **{field: value})}}
    with pytest.raises(cache.BadEntry):
        op_cache.check_table(table)
    op_cache.check_table({"params": {"arrays": 4}, "ops": {"matvec r1 o1": OP}})  # the original passes


# ---------------------------------------------------------------------------------------------- chipsim cache
def test_cache_info_counts_entries_and_failing_ones_and_clear_removes_only_chipsims(private_cache, capsys):
    dram = private_cache / "dram"
    paths = _entries(dram)
    _mutate(paths[0], "halved", None)
    foreign = dram / "notes.txt"
    foreign.write_text("mine")
    sizes = sum(os.lstat(p).st_size for p in paths)
    assert cli.main(["cache", "info", "dram"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"cache: {private_cache} ($CHIPSIM_CACHE_DIR)"
    assert out[2].split() == ["dram", "2", str(sizes), "1", str(dram)]
    assert out[4] == f"  dram {os.path.basename(paths[0])}: checksum mismatch (changed since it was written)"
    assert cli.main(["cache", "clear", "dram"]) == 0
    assert capsys.readouterr().out == f"removed 2 dram entries ({sizes} bytes) from {dram}\n"
    assert os.listdir(dram) == ["notes.txt"]


def test_cache_info_and_clear_of_a_sweep(tmp_path, capsys):
    sweep.run_sweep(THOR, {"dma.engines": [1]}, ["no-prefetch"], str(tmp_path / "s"),
                    overrides=["workload.max_tokens=4"], jobs=1, progress=False)
    folder = tmp_path / "s" / "cache"
    [path] = _entries(folder)
    assert cli.main(["cache", "info", "sweep", "--sweep", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["sweep", "1", str(os.lstat(path).st_size), "0",
                                                               str(folder)]
    assert cli.main(["cache", "clear", "sweep", "--sweep", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.startswith("removed 1 sweep entry (")
    assert os.listdir(folder) == []


@pytest.mark.parametrize("argv, error", [
    (["cache", "clear", "nope"], "chipsim cache clear: unknown kind 'nope' (expected dram, compute, trace, sweep)"),
    (["cache", "info", "sweep"], "chipsim cache info sweep: needs --sweep DIR (a sweep's or reproduce's --out)"),
    (["cache", "info", "--sweep", "/nonexistent"], "--sweep /nonexistent: not a directory (a sweep's or "
                                                   "reproduce's --out)"),
])
def test_cache_command_bad_input_is_one_line(argv, error, capsys):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"chipsim: error: {error}\n"


# ---------------------------------------------------------------------------------------------- the user's cache
def test_tests_and_their_subprocesses_use_the_session_cache_not_the_users(session_cache_dir):
    user = os.path.join(os.path.expanduser("~"), ".cache", "chipsim")
    assert os.environ["CHIPSIM_CACHE_DIR"] == session_cache_dir and not session_cache_dir.startswith(user)
    child = subprocess.run([sys.executable, "-c", "from chipsim.files import cache_dir; print(cache_dir('dram'))"],
                           capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert child.stdout.strip() == os.path.join(session_cache_dir, "dram")
