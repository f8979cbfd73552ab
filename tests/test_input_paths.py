"""Every file chipsim reads is read safely (chipsim.files.read_input / open_input): a FIFO, a device, a folder or a
file over its kind's bound is refused in one line before anything is read; relative paths inside a config resolve
against the folder of the file that wrote them; YAML with a duplicate key, deep nesting or an alias bomb is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import zipfile

import numpy as np
import pytest
from conftest import ROOT, THOR

from chipsim.cli import main
from chipsim.dramsim.standard import STANDARDS_DIR, load_standard
from chipsim.errors import InputError
from chipsim.files import JSON_MAX_BYTES, YAML_MAX_BYTES, read_input, read_json
from chipsim.hw.config import load_config
from chipsim.trace import format as tf
from chipsim.values import YamlLimitError, yaml_load

R = ["run", THOR, "--policy", "no-prefetch", "--set", "workload.max_tokens=2", "--jobs", "1"]
TRACE = os.path.join(ROOT, "traces", "real-granite-3b.npz")
PROMPT_S = 5  # a refusal before any read takes well under a second; a FIFO that is opened blocks for ever


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Nothing here may write into the user's cache."""
    monkeypatch.setenv("CHIPSIM_CACHE_DIR", str(tmp_path / "cache"))


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def one_line_error(capsys, argv) -> str:
    """main(argv) must exit 2 with one `chipsim: error:` line, promptly (a blocked FIFO read ends in _Hang)."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(30)
    t0 = time.perf_counter()
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("chipsim: error: "), (code, err)
    assert time.perf_counter() - t0 < PROMPT_S
    return lines[0]


def _special(tmp_path, kind: str) -> str:
    """A path that is not a regular file: a FIFO with no writer, a device or a folder."""
    if kind == "fifo":
        path = str(tmp_path / "special.yaml")
        os.mkfifo(path)
        return path
    return {"devzero": "/dev/zero", "devnull": "/dev/null", "dir": str(tmp_path)}[kind]


WORDS = {"fifo": "is a FIFO (named pipe), not a regular file", "devzero": "is a device, not a regular file",
         "devnull": "is a device, not a regular file", "dir": "is a directory, not a regular file"}


def _sparse(path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)  # no blocks written: a file of that size in no time and no disk
    return str(path)


# ---------------------------------------------------------------------------------------------- the one reader
def test_read_input_reads_a_regular_file_and_a_link_to_one(tmp_path):
    target = tmp_path / "a.json"
    target.write_text('{"x": 1}')
    (tmp_path / "link.json").symlink_to(target)
    assert read_input(str(target), "JSON file", 100) == b'{"x": 1}'
    assert read_json(str(tmp_path / "link.json")) == {"x": 1}


@pytest.mark.parametrize("kind", ["fifo", "devzero", "devnull", "dir"])
def test_read_input_refuses_what_is_not_a_regular_file(tmp_path, kind):
    path = _special(tmp_path, kind)
    with pytest.raises(InputError) as exc:
        read_input(path, "JSON file", 100)
    assert str(exc.value) == f"JSON file {path}: {WORDS[kind]}"


def test_read_input_refuses_a_file_over_the_bound_before_reading_it(tmp_path):
    path = _sparse(tmp_path / "big.json", JSON_MAX_BYTES + 1)
    with pytest.raises(InputError, match=r"is 64\.0 MiB, over the 64 MiB such a file may be"):
        read_json(path)
    assert read_input(_sparse(tmp_path / "edge", 100), "x", 100) == bytes(100)  # the bound itself is allowed


# ---------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("kind", ["fifo", "devzero", "devnull", "dir"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(tmp_path, capsys, kind):
    path = _special(tmp_path, kind)
    assert one_line_error(capsys, ["run", path]) == f"chipsim: error: config {path}: {WORDS[kind]}"


def test_a_huge_config_is_refused_before_it_is_read(tmp_path, capsys):
    path = _sparse(tmp_path / "huge.yaml", YAML_MAX_BYTES + 1)
    assert "over the 4 MiB such a file may be" in one_line_error(capsys, ["run", path])


def test_a_fifo_as_base_is_refused_at_once(tmp_path, capsys):
    fifo = _special(tmp_path, "fifo")
    config = tmp_path / "c.yaml"
    config.write_text("base: special.yaml\n")
    assert one_line_error(capsys, ["run", str(config)]) == f"chipsim: error: config {fifo}: {WORDS['fifo']}"


def test_a_symbolic_link_to_a_config_reads_what_its_target_reads(tmp_path):
    """thor.yaml names its trace relative to its folder (../traces/...): through a link elsewhere it still finds
    it, and the config is the same."""
    link = tmp_path / "thor-link.yaml"
    link.symlink_to(THOR)
    via_link, direct = load_config(str(link)), load_config(THOR)
    assert via_link.trace_path == direct.trace_path == os.path.realpath(TRACE)
    assert via_link.raw == direct.raw


# ---------------------------------------------------------------------------------------------- DRAM standards
def _config_with_standard(folder, standard: str, name: str = "c.yaml") -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"base: {THOR}\nmemory:\n  hbm:\n    standard: {standard}\n")
    return path


def test_a_fifo_as_standard_is_refused_at_once(tmp_path, capsys):
    fifo = _special(tmp_path, "fifo")
    config = _config_with_standard(tmp_path, "./special.yaml")
    assert one_line_error(capsys, R[:1] + [config] + R[2:]) == \
        f"chipsim: error: memory.hbm.standard: DRAM standard {fifo}: {WORDS['fifo']}"


def test_a_standard_path_is_relative_to_the_config_that_names_it(tmp_path, monkeypatch):
    """From another folder, `standard: std/hbm3-copy.yaml` is the file beside the config; the DRAM model it
    describes (organisation, timing re-timed to the config) is the built-in hbm3's."""
    from chipsim.dramsim.calibrate import cache_key, retimed_standard

    os.mkdir(tmp_path / "std")
    shutil.copy(os.path.join(STANDARDS_DIR, "hbm3.yaml"), tmp_path / "std" / "hbm3-copy.yaml")
    config = _config_with_standard(tmp_path, "std/hbm3-copy.yaml")
    os.mkdir(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    hbm = load_config(config).hw.memory["hbm"]
    assert hbm.standard == str(tmp_path / "std" / "hbm3-copy.yaml")
    copy = retimed_standard(hbm, "memory.hbm")
    built_in = retimed_standard(load_config(THOR).hw.memory["hbm"], "memory.hbm")
    assert (copy.params, copy.org, copy.org_name, copy.timing_name) == \
        (built_in.params, built_in.org, built_in.org_name, built_in.timing_name)
    assert cache_key(copy, 0.5) == cache_key(built_in, 0.5)  # the same calibration, hence the same results


def test_a_run_with_a_relative_standard_gives_the_built_in_results(tmp_path, monkeypatch, capsys):
    os.mkdir(tmp_path / "std")
    shutil.copy(os.path.join(STANDARDS_DIR, "hbm3.yaml"), tmp_path / "std" / "hbm3-copy.yaml")
    config = _config_with_standard(tmp_path, "std/hbm3-copy.yaml")
    monkeypatch.chdir("/")
    assert main(R[:1] + [config] + R[2:] + ["--json"]) == 0
    relative = json.loads(capsys.readouterr().out)
    assert main(R + ["--json"]) == 0
    assert relative == json.loads(capsys.readouterr().out)


def test_an_inherited_standard_keeps_its_base_folder_and_set_uses_the_current_one(tmp_path, monkeypatch):
    for folder in ("a", "a/std", "b", "b/std", "cwd"):
        os.mkdir(tmp_path / folder)
    for copy in ("a/std/s.yaml", "b/std/s.yaml", "cwd/s.yaml"):
        shutil.copy(os.path.join(STANDARDS_DIR, "hbm3.yaml"), tmp_path / copy)
    _config_with_standard(tmp_path / "a", "std/s.yaml", "base.yaml")
    derived = tmp_path / "b" / "derived.yaml"
    derived.write_text("base: ../a/base.yaml\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert load_config(str(derived)).hw.memory["hbm"].standard == str(tmp_path / "a" / "std" / "s.yaml")
    derived.write_text("base: ../a/base.yaml\nmemory:\n  hbm:\n    standard: std/s.yaml\n")
    assert load_config(str(derived)).hw.memory["hbm"].standard == str(tmp_path / "b" / "std" / "s.yaml")
    hw = load_config(str(derived), ["memory.hbm.standard=s.yaml", "memory.lpddr5x.standard=lpddr5"]).hw
    assert hw.memory["hbm"].standard == str(tmp_path / "cwd" / "s.yaml")
    assert hw.memory["lpddr5x"].standard == "lpddr5"  # a built-in name is not a path
    with pytest.raises(InputError, match=r"^memory.hbm.standard: DRAM standard .*/cwd/t.yaml: file not found$"):
        load_config(str(derived), ["memory.hbm.standard=t.yaml"])  # checked on loading, before any calibration


def test_a_built_in_standard_name_is_never_a_file_of_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hbm3").write_text("not a standard")
    assert load_standard("hbm3").path == os.path.join(STANDARDS_DIR, "hbm3.yaml")


# ---------------------------------------------------------------------------------------------- traces
@pytest.mark.parametrize("kind", ["fifo", "devzero", "devnull", "dir"])
def test_a_trace_that_is_not_a_regular_file_is_refused_at_once(tmp_path, capsys, kind):
    path = _special(tmp_path, kind)
    assert one_line_error(capsys, R + ["--trace", path]) == f"chipsim: error: trace {path}: {WORDS[kind]}"
    assert one_line_error(capsys, ["inspect", path]) == f"chipsim: error: trace {path}: {WORDS[kind]}"


@pytest.mark.parametrize("name", ["t #1.npz", "a: b.npz", "'q'.npz"])
def test_a_trace_path_with_yaml_characters_is_read_as_written(tmp_path, monkeypatch, name):
    """--trace travels as a --set value: '#' began a comment (trace .../t: file not found) and ': ' made a
    mapping (workload.trace: expected a non-empty string)."""
    from chipsim.runner import prepare

    shutil.copy(TRACE, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    closed_form = ["memory.hbm.timing_model=closed-form", "memory.lpddr5x.timing_model=closed-form"]
    prep = prepare(THOR, closed_form, ["no-prefetch"], trace_path=name)
    assert prep.config.trace_path == str(tmp_path / name) and prep.trace.path == str(tmp_path / name)


def test_a_trace_over_the_bound_is_refused_before_it_is_read(tmp_path, capsys):
    path = _sparse(tmp_path / "t.npz", tf.TRACE_MAX_BYTES + 1)
    assert "is 4096.0 MiB, over the 4096 MiB" in one_line_error(capsys, R + ["--trace", path])


def test_a_trace_whose_arrays_unpack_past_the_bound_is_refused(monkeypatch):
    """The bundled trace declares 22 MB of arrays: over a 1 MiB bound it is refused from the zip's directory."""
    tf._LOADED.clear()
    monkeypatch.setattr(tf, "TRACE_MAX_UNPACKED_BYTES", 1 << 20)
    with pytest.raises(InputError, match=r"its arrays would unpack to 0\.0 GiB, over the 0\.000976562 GiB"):
        tf.load(TRACE)
    tf._LOADED.clear()


def test_an_array_header_claiming_more_than_its_member_holds_is_refused(tmp_path):
    """np.load allocates what a .npy header declares before reading: 8 TB here, in a 200-byte file."""
    path = str(tmp_path / "lie.npz")
    with zipfile.ZipFile(path, "w") as zf, zf.open("routed_ids.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    with pytest.raises(InputError, match=r"array routed_ids\.npy declares 8000000000000 bytes in a member of \d+"):
        tf.load(path)


# ---------------------------------------------------------------------------------------------- experiments, references
def test_a_fifo_as_experiment_is_refused_at_once(tmp_path, capsys):
    fifo = _special(tmp_path, "fifo")
    assert one_line_error(capsys, ["reproduce", fifo, "--out", str(tmp_path / "o")]) == \
        f"chipsim: error: experiment {fifo}: {WORDS['fifo']}"
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("argv", [["dram", "--validate"], ["hwcompare"]])
def test_a_fifo_as_reference_json_is_refused_at_once(tmp_path, capsys, argv):
    fifo = _special(tmp_path, "fifo")
    assert one_line_error(capsys, argv + [fifo]).endswith(f"{fifo}: {WORDS['fifo']}")


def test_hwcompare_refuses_a_report_it_cannot_write_before_any_work(tmp_path, capsys):
    """--report in a folder that does not exist, or under a file, is one line at once (not a traceback after the
    comparison); in a folder that exists the report is written."""
    measured = os.path.join(ROOT, "validation", "regimes", "launch-gaps", "pcie", "h200-pcie5.json")
    missing = tmp_path / "new" / "r.md"
    assert one_line_error(capsys, ["hwcompare", measured, "--jobs", "1", "--report", str(missing)]) == \
        f"chipsim: error: --report {missing}: directory {missing.parent} does not exist"
    assert main(["hwcompare", measured, "--jobs", "1", "--report", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("#")


def test_a_fifo_as_the_text_to_record_is_refused_at_once(tmp_path, capsys):
    fifo = _special(tmp_path, "fifo")
    assert one_line_error(capsys, ["trace", str(tmp_path), "--text", fifo, "--out", str(tmp_path / "t.npz")]) == \
        f"chipsim: error: --text {fifo}: {WORDS['fifo']}"


# ---------------------------------------------------------------------------------------------- YAML
@pytest.mark.parametrize("text, fragment", [
    ("compute:\n  arrays: 4\nmodel:\n  name: x\ncompute:\n  unit_rows: 2\n",
     "duplicate key 'compute' (first at line 2) at line 6, column 1"),
    ("compute:\n  arrays: 4\n  unit_rows: 2\n  arrays: 8\n",
     "duplicate key 'compute.arrays' (first at line 3) at line 5, column 3"),
    ("policies:\n  apex: {tau: 0.9, tau: 0.5}\n", "duplicate key 'policies.apex.tau' (first at line 3) at line 3"),
])
def test_a_duplicate_key_is_refused_naming_it(tmp_path, capsys, text, fragment):
    """PyYAML would keep the last silently; the lines are the file's (its first is `base:`)."""
    config = tmp_path / "c.yaml"
    config.write_text(f"base: {THOR}\n" + text)
    assert one_line_error(capsys, ["run", str(config)]).startswith(f"chipsim: error: config {config}: {fragment}")


def test_yaml_load_names_the_duplicate_key_by_its_dotted_path():
    with pytest.raises(YamlLimitError) as exc:
        yaml_load("a: 1\nb:\n  c: 2\n  d: 3\n  c: 4\n")
    assert exc.value.problem == "duplicate key 'b.c' (first at line 3)" and exc.value.problem_mark.line + 1 == 5


def test_a_duplicate_key_in_a_set_value_or_an_experiment_is_refused(tmp_path, capsys):
    line = one_line_error(capsys, R + ["--set", "compute.op_times_ns={x: 1, x: 2}"])
    assert line == "chipsim: error: --set compute.op_times_ns: duplicate key 'x' (first at line 1)"
    exp = tmp_path / "e.yaml"
    exp.write_text("title: t\ntitle: u\n")
    assert "duplicate key 'title' (first at line 1) (line 2)" in one_line_error(capsys, ["reproduce", str(exp)])


def test_merge_keys_are_not_duplicates():
    assert yaml_load("a: &x {k: 1, j: 2}\nb:\n  <<: *x\n  k: 3\n") == {"a": {"k": 1, "j": 2}, "b": {"k": 3, "j": 2}}


@pytest.mark.parametrize("text, fragment", [
    ("x: " + "[" * 2000 + "]" * 2000 + "\n", "nested deeper than 64 levels"),
    ("x: " + "{a: " * 70 + "1" + "}" * 70 + "\n", "nested deeper than 64 levels"),
    ("x: &a [*a]\n", "nested deeper than 64 levels (aliases expanded)"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\n"
     + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)),
     "more than 200000 values (aliases counted as what they stand for)"),
])
def test_deep_nesting_and_alias_bombs_are_refused_quickly(tmp_path, capsys, text, fragment):
    """The bomb stands for 10^10 values in 10 lines; refused after 200,000 of them are counted."""
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert fragment in one_line_error(capsys, ["run", str(config)])
