"""What `chipsim run` loads before its first event: the modules a run does not need stay unimported, the trace's
checks that replaced sorting (rows of distinct ids) refuse what sorting refused, a trace read a second time comes
from its checked, unpacked copy in the cache (a changed copy is noticed and rebuilt), and YAML read by libyaml's
parser gives what PyYAML's Python parser gives, data and refusals alike. Speed itself is measured by
benchmarks/bench_startup.py, not here."""

import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from chipsim import cache, cli, values
from chipsim.errors import InputError
from chipsim.runner import prepare
from chipsim.trace import format as tf
from chipsim.trace import spec, unpacked
from conftest import ROOT, THOR, tiny_shape
from helpers import hand_trace_arrays, random_routing

# what a run of one policy never needs: plotting and tables (analysis; plotly draws `chipsim report`'s page), GPU
# replay and trace recording (torch), the worker pool (one policy runs in the process) and the progress bar (not on
# a terminal)
NOT_IMPORTED = ("pandas", "matplotlib", "plotly", "scipy", "torch", "chipsim.hwreplay", "chipsim.tracegen",
                "chipsim.analysis.sweep", "chipsim.analysis.plots", "multiprocessing",
                "concurrent.futures", "chipsim.pool", "tqdm")


# `python -m chipsim.cli ARGS` as runpy runs it, then the names of every module loaded, on stderr's last line
_RUN_AND_LIST = """import json, runpy, sys
sys.argv = ["chipsim", *sys.argv[1:]]
try:
    runpy.run_module("chipsim.cli", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    assert exc.code == 0, exc.code
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def _imported(*args: str) -> set[str]:
    """The modules the command `chipsim ARGS` has loaded when it ends."""
    child = subprocess.run([sys.executable, "-c", _RUN_AND_LIST, *args], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    assert child.returncode == 0, child.stderr[-2000:]
    return set(json.loads(child.stderr.rsplit("MODULES ", 1)[1]))


def test_a_run_of_one_policy_imports_only_what_it_runs():
    prepare(THOR, ["workload.max_tokens=4"], ["apex"])  # calibrates thor's memories into the session's cache
    # first (a calibration shows a progress bar): the command then reads them as every later run does
    modules = _imported("run", THOR, "--policy", "apex", "--set", "workload.max_tokens=4")
    assert {"numpy", "chipsim.runner", "chipsim.policies.apex"} <= modules  # the listing is read right
    assert sorted(m for m in modules if m.split(".")[0] in NOT_IMPORTED or m in NOT_IMPORTED) == []
    from chipsim.sim.core import native_available

    if native_available():  # `run.engine: fast` on the native core: SimPy (which imports zipfile) is never loaded
        assert "simpy" not in modules and "zipfile" not in modules and "chipsim.sim.native" in modules


def test_two_policies_on_two_workers_start_the_pool():
    modules = _imported("run", THOR, "--policy", "apex", "--policy", "lru", "--jobs", "2",
                        "--set", "workload.max_tokens=4")
    assert {"chipsim.pool", "multiprocessing"} <= modules


def _arrays():
    arrays, meta = hand_trace_arrays(tiny_shape(), random_routing(tiny_shape(), tokens=5, seed=3))
    return arrays, meta


def test_a_valid_hand_trace_passes():
    arrays, meta = _arrays()
    tf.validate(arrays, meta)


def test_a_ranking_row_with_an_expert_twice_is_refused():
    arrays, meta = _arrays()
    arrays["router_rank"][4, 1, 7] = arrays["router_rank"][4, 1, 0]  # expert listed twice, another missing
    with pytest.raises(InputError, match=r"every row of router_rank must be a permutation of 0\.\.7"):
        tf.validate(arrays, meta)


def test_a_ranking_row_with_no_prediction_is_refused():
    arrays, meta = _arrays()
    arrays["router_rank"][0, 0, 3] = tf.NO_EXPERT
    with pytest.raises(InputError, match="every row of router_rank must be a permutation"):
        tf.validate(arrays, meta)


def test_a_token_routed_to_one_expert_twice_is_refused():
    arrays, meta = _arrays()
    arrays["routed_ids"][2, 2, 1] = arrays["routed_ids"][2, 2, 0]
    with pytest.raises(InputError, match="routed_ids repeats an expert within one token-layer"):
        tf.validate(arrays, meta)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_distinct_rows_agree_with_sorting(monkeypatch, chunk):
    """Marking ids, in chunks of any size, finds exactly the rows that sorting finds with a repeat."""
    monkeypatch.setattr(spec, "DISTINCT_CHUNK", chunk)
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, width = 6, int(rng.integers(1, 7))
        arr = np.argsort(rng.random((3, 2, n)), axis=-1)[..., :width].astype(np.uint8)
        for _ in range(int(rng.integers(0, 3))):
            arr[tuple(int(rng.integers(0, s)) for s in arr.shape)] = int(rng.integers(0, n))
        ordered = np.sort(arr, axis=-1)
        assert spec.rows_distinct(arr, n) == (not (ordered[..., 1:] == ordered[..., :-1]).any())


# ---------------------------------------------------------------------------------------------- the trace cache
def _saved_trace(tmp_path, monkeypatch) -> str:
    """A hand trace written to tmp_path, with this test's own cache folder and no trace loaded in the process."""
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tf, "_LOADED", type(tf._LOADED)())
    arrays, meta = _arrays()
    path = str(tmp_path / "hand.npz")
    tf.save(path, arrays, meta)
    return path


def _cache_files(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path / "cache" / "trace"))


def _fresh_load(path: str) -> tf.Trace:
    tf._LOADED.clear()  # as a new process: not the Trace this process already holds
    return tf.load(path)


def _same(a: tf.Trace, b: tf.Trace) -> None:
    assert (a.meta, a.sha256, sorted(a.arrays)) == (b.meta, b.sha256, sorted(b.arrays))
    for name in a.arrays:
        assert a.arrays[name].dtype == b.arrays[name].dtype and np.array_equal(a.arrays[name], b.arrays[name])
        assert not b.arrays[name].flags.writeable


def _root(array: np.ndarray):
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def test_a_second_load_reads_the_unpacked_copy(tmp_path, monkeypatch):
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    assert len({id(_root(a)) for a in first.arrays.values()}) == len(first.arrays)  # unpacked one by one
    key = unpacked.entry_key(first.sha256)
    assert _cache_files(tmp_path) == [f"{key}.arrays", f"{key}.json"]
    second = _fresh_load(path)
    assert isinstance(second.arrays, unpacked.CheckedArrays) and second.arrays.verified == set(first.arrays)
    _same(first, second)


def test_a_load_from_the_cache_reads_the_arrays_it_needs_and_the_rest_when_asked(tmp_path, monkeypatch):
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    tf._LOADED.clear()
    second = tf.load(path, needed=["routed_ids", "not_in_this_trace"])
    assert second.arrays.verified == {"routed_ids"} and "apex_rank" in second.arrays
    assert second.arrays.verified == {"routed_ids"}  # asking whether it is there reads nothing
    assert np.array_equal(second.arrays["apex_rank"], first.arrays["apex_rank"])
    assert second.arrays.verified == {"routed_ids", "apex_rank"}
    assert tf.load(path, needed=["draft_ids"]) is second and second.arrays.verified >= {"draft_ids"}


def test_the_predictor_checks_a_trace_passed_when_unpacked_are_not_run_again(tmp_path, monkeypatch):
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    carried = {spec.name for spec in first._checked}
    assert "apex_rank" in carried and "draft_ids" in carried  # every predictor output the hand trace carries

    def refuse(self, array, dims, where):
        raise InputError(f"{where}: {self.name} checked again")

    monkeypatch.setattr(spec.ArraySpec, "check", refuse)
    second = _fresh_load(path)
    assert {spec.name for spec in second._checked} == carried
    tf.check_arrays(second, list(second._checked), "policy x")  # what the runner asks: already checked
    for name in os.listdir(tmp_path / "cache" / "trace"):
        os.remove(tmp_path / "cache" / "trace" / name)
    with pytest.raises(InputError, match="checked again"):  # unpacked afresh, the checks run
        _fresh_load(path)


def _first_array_changed_in_the_cache(tmp_path, monkeypatch):
    """A hand trace loaded once (so cached), then its cached copy's first byte changed: the trace's path, the first
    load, the arrays file and its good bytes."""
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    arrays_file = tmp_path / "cache" / "trace" / f"{unpacked.entry_key(first.sha256)}.arrays"
    good = arrays_file.read_bytes()
    arrays_file.write_bytes(b"\x07" + good[1:])  # the first array (apex_rank) starts at byte 0
    return path, first, arrays_file, good


def test_an_array_changed_in_the_cache_after_the_load_is_refused_when_first_read(tmp_path, monkeypatch, capsys):
    path, first, arrays_file, good = _first_array_changed_in_the_cache(tmp_path, monkeypatch)
    capsys.readouterr()
    tf._LOADED.clear()
    second = tf.load(path, needed=["routed_ids"])  # a run that does not read apex_rank
    assert capsys.readouterr().err == ""
    with pytest.raises(InputError) as caught:
        second.arrays["apex_rank"]
    assert str(caught.value) == (f"trace cache {arrays_file}: array apex_rank: checksum mismatch (changed since it "
                                 "was written) (`chipsim cache clear trace` removes it)")
    third = tf.load(path, needed=["apex_rank"])  # a run that does: noted, unpacked and stored again
    assert third is not second and "array apex_rank: checksum mismatch" in capsys.readouterr().err
    _same(first, third)
    assert arrays_file.read_bytes() == good


def test_a_changed_array_in_the_cache_is_noticed_and_rebuilt(tmp_path, monkeypatch, capsys):
    path, first, arrays_file, good = _first_array_changed_in_the_cache(tmp_path, monkeypatch)
    capsys.readouterr()
    _same(first, _fresh_load(path))
    assert capsys.readouterr().err == (f"chipsim: note: trace cache {arrays_file}: array apex_rank: checksum mismatch "
                                       "(changed since it was written); recomputing\n")
    assert arrays_file.read_bytes() == good  # stored again
    _same(first, _fresh_load(path))


def test_a_damaged_cache_entry_is_noticed_and_rebuilt(tmp_path, monkeypatch, capsys):
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    entry = tmp_path / "cache" / "trace" / f"{unpacked.entry_key(first.sha256)}.json"
    good = entry.read_text()
    entry.write_text(good.replace('"order": "C"', '"order": "F"', 1))
    capsys.readouterr()
    _same(first, _fresh_load(path))
    assert capsys.readouterr().err == (f"chipsim: note: trace cache {entry}: checksum mismatch (changed since it was "
                                       "written); recomputing\n")
    assert entry.read_text() == good


def test_a_trace_that_fails_its_checks_is_not_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))
    arrays, meta = _arrays()
    arrays["routed_ids"][0, 0, 0] = tf.NO_EXPERT
    path = tmp_path / "bad.npz"
    np.savez(path, meta=np.array(json.dumps(dict(meta, schema_version=1))), **arrays)
    with pytest.raises(InputError, match="routed_ids must name an expert"):
        tf.load(str(path))
    assert not (tmp_path / "cache" / "trace").exists()


def test_cache_info_and_clear_know_the_trace_cache(tmp_path, monkeypatch, capsys):
    path = _saved_trace(tmp_path, monkeypatch)
    tf.load(path)
    folder = tmp_path / "cache" / "trace"
    size = sum(os.lstat(folder / name).st_size for name in _cache_files(tmp_path))
    capsys.readouterr()
    assert cli.main(["cache", "info", "trace"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["trace", "1", str(size), "0", str(folder)]
    assert cli.main(["cache", "clear", "trace"]) == 0
    assert capsys.readouterr().out == f"removed 1 trace entry ({size} bytes) from {folder}\n"
    assert _cache_files(tmp_path) == []


# ---------------------------------------------------------------------------------------------- YAML through libyaml
SHIPPED_YAML = sorted(glob.glob(os.path.join(ROOT, "hwconfigs", "*.yaml")) + glob.glob(os.path.join(ROOT, "experiments",
                                                                                     "*.yaml"))
                      + glob.glob(os.path.join(ROOT, "chipsim", "dramsim", "standards", "*.yaml")))
needs_libyaml = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")


@needs_libyaml
@pytest.mark.parametrize("path", SHIPPED_YAML, ids=os.path.basename)
def test_libyaml_and_the_python_parser_read_every_shipped_file_alike(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    python = values._parse_with(values._Loader, text)
    assert repr(values._parse_with(values._FastLoader, text)) == repr(python)  # types too: 1, 1.0 and True differ
    assert repr(values.yaml_load(text)) == repr(python)


def test_thor_and_its_memories_are_read_by_libyaml():
    for path in (THOR, *glob.glob(os.path.join(ROOT, "chipsim", "dramsim", "standards", "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            assert values._fast_ok(f.read()), path
    assert (values._FAST_LOADER is values._FastLoader) if yaml.__with_libyaml__ else values._FAST_LOADER is None


@pytest.mark.parametrize("text, problem", [
    ("a: [1,\t2]\n", "found character '\\t' that cannot start any token"),  # libyaml would read [1, 2]
    ("a: [0.2?, 1]\n", "expected ',' or ']', but got '?'"),  # libyaml: ['0.2?', 1]
    ("a: |#x\n", "expected chomping or indentation indicators, but found '#'"),  # libyaml: ''
])
def test_what_pyyaml_refuses_stays_refused_with_its_words(text, problem):
    with pytest.raises(yaml.YAMLError) as caught:
        values.yaml_load(text)
    assert caught.value.problem == problem


def test_an_empty_tagged_node_reads_as_before():
    assert values.yaml_load("a: !\nb: 1\n") == {"a": None, "b": 1}  # libyaml alone reads a: ''


@pytest.mark.parametrize("text, problem, line", [
    ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (first at line 1)", 3),
    ("x: " + "[" * 70 + "]" * 70 + "\n", "nested deeper than 64 levels", 1),
    ("a: 1\n  b: 2\n", "mapping values are not allowed here", 2),
])
def test_chipsims_yaml_checks_and_pyyaml_messages_are_unchanged(text, problem, line):
    with pytest.raises(yaml.YAMLError) as caught:
        values.yaml_load(text)
    assert (caught.value.problem, caught.value.problem_mark.line + 1) == (problem, line)


def test_an_entry_that_claims_more_bytes_than_its_file_holds_is_noticed(tmp_path, monkeypatch, capsys):
    """A well-formed entry (its checksum recomputed) promising 1,000 times the last array: one note, and the trace
    is unpacked again."""
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    key = unpacked.entry_key(first.sha256)
    entry = str(tmp_path / "cache" / "trace" / f"{key}.json")
    payload = cache.inspect(entry, "trace", key, unpacked.check_entry)
    last = payload["arrays"][-1]
    last["shape"][0] *= 1000
    payload["bytes"] = last["offset"] + math.prod(last["shape"]) * np.dtype(last["dtype"]).itemsize
    cache.write(entry, "trace", key, payload)
    capsys.readouterr()
    _same(first, _fresh_load(path))
    arrays_file = tmp_path / "cache" / "trace" / f"{key}.arrays"
    assert capsys.readouterr().err == (f"chipsim: note: trace cache {arrays_file}: {arrays_file.stat().st_size} bytes, "
                                       f"expected {payload['bytes']}; recomputing\n")


def test_an_entry_that_claims_a_check_of_an_array_it_lacks_is_noticed(tmp_path, monkeypatch, capsys):
    path = _saved_trace(tmp_path, monkeypatch)
    first = tf.load(path)
    key = unpacked.entry_key(first.sha256)
    entry = str(tmp_path / "cache" / "trace" / f"{key}.json")
    payload = cache.inspect(entry, "trace", key, unpacked.check_entry)
    payload["checked"].append("floe_rank_v2")
    cache.write(entry, "trace", key, payload)  # its checksum recomputed: well-formed, but wrong
    capsys.readouterr()
    _same(first, _fresh_load(path))
    assert capsys.readouterr().err == (f"chipsim: note: trace cache {entry}: checked: not a list of the entry's array "
                                       "names; recomputing\n")
