"""Bad input as a hostile user gives it: numbers at the edge of what parses, special files where a trace or an
output should be, corrupt saved records, Ctrl-C and closed pipes. Each ends in one line and exit 2 (or 130
for Ctrl-C, 141 for a closed pipe), with no traceback and nothing half-written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, THOR

from chipsim.cli import main
from chipsim.errors import InputError
from chipsim.hw.config import load_config
from chipsim.trace import format as tf
from chipsim.values import yaml_load

R = ["run", THOR, "--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1"]
TRACE = os.path.join(ROOT, "traces", "real-granite-3b.npz")


def one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("chipsim: error: "), (code, err)
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("assignment, fragment", [
    ("links.pcie.bandwidth_gbps=1.0e+308", "links.pcie.bandwidth_gbps: must be at most 1e+06"),
    ("links.pcie.bandwidth_gbps=1.0e-10", "links.pcie.bandwidth_gbps: must be at least 0.001"),
    ("dma.chunk_kib=0.0005", "dma.chunk_kib: must be at least 0.000976562"),
    ("memory.hbm.trp_ns=1.0e+18", "memory.hbm.trp_ns: must be at most 1e+06"),
    ("host_cpu.clock_ghz=1.0e-300", "host_cpu.clock_ghz: must be at least 0.001"),
    ("compute.op_overhead_cycles=1.0e+18", "compute.op_overhead_cycles: must be at most 1e+09"),
    ("memory.hbm.channel_width_bits=1.0e+308", "memory.hbm.channel_width_bits: must be at most 65536"),
    ("links.ucie.modules=1.0e+308", "links.ucie.modules: must be at most 4096"),
    ("links.pcie.energy_pj_per_bit=1.0e+308", "links.pcie.energy_pj_per_bit: must be at most 1e+06"),
    ("dma.engines=1.0e+18", "dma.engines: must be at most 64"),
])
def test_numbers_past_physical_bounds_are_one_line_naming_the_key(capsys, assignment, fragment):
    assert fragment in one_line_error(capsys, R + ["--set", assignment])


def test_a_run_whose_simulated_time_cannot_fit_integer_picoseconds_is_refused(capsys):
    """Each key within its bounds, together past 2^62 ps: a 1 MHz clock with a billion cycles per operation."""
    line = one_line_error(capsys, R + ["--set", "compute.clock_mhz=1", "--set", "compute.op_overhead_cycles=1e9"])
    assert "integer picoseconds" in line


def test_a_dram_whose_timing_leaves_less_than_a_byte_per_second_is_refused(capsys):
    """One 1-bit channel at 1 MT/s (125 kB/s peak) refreshing all but a millionth of the time: 0.0125 B/s."""
    line = one_line_error(capsys, R + ["--set", "memory.hbm.channels=1", "--set", "memory.hbm.channel_width_bits=1",
                                       "--set", "memory.hbm.data_rate_mtps=1", "--set", "memory.hbm.trefi_ns=1e6",
                                       "--set", "memory.hbm.trfc_ns=999999", "--set", "memory.hbm.timing_model=closed-form"])
    assert line.startswith("chipsim: error: memory.hbm: its timing keys leave") and "less than one byte" in line
    # the command-level model re-times the standard to the same keys (on HBM3's own 64-bit channel): at 4 us per
    # cycle nothing is left either
    line = one_line_error(capsys, R + ["--set", "memory.hbm.channels=1",
                                       "--set", "memory.hbm.data_rate_mtps=1", "--set", "memory.hbm.trefi_ns=1e6",
                                       "--set", "memory.hbm.trfc_ns=999999"])
    assert line.startswith("chipsim: error: memory.hbm: at 4000000 ps per cycle the refresh time nRFC")


def test_1e9_is_a_number_in_yaml_and_in_set():
    assert yaml_load("1e9") == 1e9 and yaml_load("-2E-3") == -0.002 and yaml_load("1e") == "1e"
    config = load_config(THOR, ["links.pcie.bandwidth_gbps=1e2", "workload.max_tokens=1e3"])
    assert config.hw.links["pcie"].bandwidth_gbps == 100.0 and config.hw.workload.max_tokens == 1000


def test_json_never_holds_nan_or_infinity(capsys):
    assert main(R + ["--json"]) == 0
    text = capsys.readouterr().out
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-finite {c} in --json"))


# ---------------------------------------------------------------------------------------------- outputs
def test_special_files_are_never_replaced(tmp_path, capsys):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(precious)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "symbolic link" in one_line_error(capsys, R + ["--timeline", str(link)])
    assert "not a regular file" in one_line_error(capsys, R + ["--timeline", str(fifo)])
    assert "is a directory" in one_line_error(capsys, R + ["--timeline", str(tmp_path)])
    out = tmp_path / "o"
    out.mkdir()
    os.mkfifo(out / "results.csv")
    assert "results.csv" in one_line_error(capsys, R + ["--out", str(out)])
    assert precious.read_text() == "keep me" and link.is_symlink() and fifo.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json", "o", "precious"]


def test_the_timeline_may_not_be_a_file_of_out(tmp_path, capsys):
    line = one_line_error(capsys, R + ["--out", str(tmp_path / "o"), "--timeline", str(tmp_path / "o" / "results.json")])
    assert "is --out" in line and not (tmp_path / "o").exists()


def test_an_unwritable_out_is_refused_before_anything_runs(capsys):
    """A place no file can be created in (as root, a read-only or kernel file system): refused at once."""
    place = "/sys/chipsim-test-out" if os.geteuid() == 0 else "/proc/chipsim-test-out"
    t0 = time.perf_counter()
    assert "cannot write" in one_line_error(capsys, ["run", THOR, "--out", place])  # default run: 7 policies
    assert time.perf_counter() - t0 < 5  # nothing was simulated


def test_a_second_sweep_into_a_directory_being_written_is_refused(tmp_path, capsys):
    import fcntl

    out = tmp_path / "s"
    out.mkdir()
    with open(out / ".sweep.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another sweep holds it
        line = one_line_error(capsys, ["sweep", THOR, "--grid", "dma.engines=1,2", "--policy", "no-prefetch", "--set",
                                       "workload.max_tokens=2", "--out", str(out), "--jobs", "1", "--quiet"])
    assert "another chipsim sweep" in line and not (out / "results.csv").exists()


def test_the_generator_refuses_a_folder_as_out_and_leaves_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "chipsim.tracegen.synthetic", "--model", "granite-1b", "--tokens", "8",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stderr.strip() == f"chipsim: error: --out {tmp_path}: is a directory"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------- traces
@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_a_trace_that_is_not_a_regular_file_is_refused_at_once(tmp_path, capsys, kind):
    path = "/dev/zero" if kind == "devzero" else str(tmp_path / "t.npz")
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block for ever
    t0 = time.perf_counter()
    assert "not a regular file" in one_line_error(capsys, R + ["--trace", path])
    assert time.perf_counter() - t0 < 5


def _edited_trace(tmp_path, edit) -> str:
    with np.load(TRACE) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays.pop("meta")))
    edit(arrays, meta)
    path = tmp_path / "t.npz"
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return str(path)


@pytest.mark.parametrize("edit, fragment", [
    (lambda a, m: a["routed_weights"].__setitem__((0, 0, 0), np.float16("nan")), "routed_weights holds a non-finite"),
    (lambda a, m: a["routed_weights"].__setitem__((0, 0, 0), -1), "routed_weights holds -1.0, below its minimum 0"),
    (lambda a, m: a["draft_conf"].__setitem__((0, 0, 0), 2), "draft_conf holds 2.0, above its maximum 1"),
    (lambda a, m: a["train_expert_counts"].__setitem__((0, 0), -5), "train_expert_counts holds -5"),
    (lambda a, m: m.__setitem__("provenance", "x"), "meta.provenance must be a mapping"),
    (lambda a, m: m.__setitem__("synthetic", "no"), "meta.synthetic must be true or false"),
    (lambda a, m: m.__setitem__("schema_version", 1.0), "schema_version 1.0 is not supported"),
    (lambda a, m: m["model"].__setitem__("top_k", 8.0), "must be whole numbers"),
])
def test_values_and_meta_types_are_checked_not_just_shapes(tmp_path, capsys, edit, fragment):
    """NaN router weights once moved adapmoe from 6.243 to 10.083 ms without a word."""
    path = _edited_trace(tmp_path, edit)
    assert fragment in one_line_error(capsys, ["run", THOR, "--policy", "adapmoe", "--trace", path])
    assert fragment in one_line_error(capsys, ["inspect", path])


def test_a_short_trace_and_a_long_warm_up_are_said_on_stderr(capsys):
    assert main(["run", THOR, "--policy", "adapmoe", "--set", "workload.max_tokens=8", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "policy adapmoe: 16 warm-up tokens of 8 replayed leave 1 measured token" in err
    assert main(R[:-4] + ["--set", "workload.max_tokens=3000", "--jobs", "1", "--trace",
                          os.path.join(ROOT, "traces", "synthetic-granite-3b.npz")]) == 0
    trace = tf.load(os.path.join(ROOT, "traces", "synthetic-granite-3b.npz"))
    assert f"workload.max_tokens 3000 exceeds the {trace.num_tokens} tokens" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- saved records
def test_plot_on_a_corrupt_or_incomplete_experiment_record_is_one_line(tmp_path, capsys):
    exp = tmp_path / "apex_fig8"
    exp.mkdir()
    (exp / "experiment.json").write_text('{"name": "apex_fig8", "title": ')  # truncated
    assert "not a readable experiment record" in one_line_error(capsys, ["plot", str(tmp_path)])
    (exp / "experiment.json").write_text('{"name": "apex_fig8"}')
    assert "incomplete experiment record (title" in one_line_error(capsys, ["plot", str(tmp_path)])


# ---------------------------------------------------------------------------------------------- the CLI
def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", THOR, "--jobs", "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["chipsim: error: chipsim run: argument --jobs: invalid int value: 'abc' (see chipsim run --help)"]


def test_negative_jobs_are_refused_everywhere(capsys):
    for argv in (R + ["--jobs", "-1"], ["reproduce", "apex_fig8", "--jobs", "-2"],
                 ["sweep", THOR, "--grid", "dma.engines=1", "--out", "x", "--jobs", "-1"]):
        assert "--jobs" in one_line_error(capsys, argv)


@pytest.mark.parametrize("argv", [["trace", "--help"], ["hwreplay", "--help"], ["hwcompare", "--help"],
                                  ["hwreplay", THOR, "--out", "x", "--contexts", "512,abc"],
                                  ["trace", ROOT, "--text", "README.md", "--out", "t.npz", "--seq", "0"]])
def test_gpu_subcommands_show_their_help_and_check_their_options_without_torch(argv):
    """`chipsim trace` / `hwreplay` need torch to work, not to say how they are used: with torch unimportable
    (sys.modules['torch'] = None) --help prints the subcommand's own usage, one help text per option, and a
    bad option is one line, exit 2."""
    code = f"import sys; sys.modules['torch'] = None; from chipsim.cli import main; sys.exit(main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    if "--help" in argv:
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: chipsim {argv[0]} ")
        lines = proc.stdout.splitlines() + [""]
        options = [i for i, line in enumerate(lines) if line.startswith("  -")]
        # each option's help: after two spaces on its line, or on the next line when the option is long
        undocumented = [lines[i] for i in options if "   " not in lines[i].strip() and not lines[i + 1].startswith(" " * 8)]
        assert len(options) >= 4 and undocumented == []
    else:
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("chipsim: error: --")


def test_hwreplay_without_torch_says_so_after_checking_its_options(tmp_path, capsys):
    code = (f"import sys; sys.modules['torch'] = None; from chipsim.cli import main; "
            f"sys.exit(main(['hwreplay', {THOR!r}, '--out', {str(tmp_path / 'out')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "chipsim: error: chipsim hwreplay needs torch with CUDA (pip install torch on the GPU machine)")
    assert not (tmp_path / "out").exists()  # nothing made before it could run


def test_keys_lists_the_policy_parameters_with_their_bounds(capsys):
    assert main(["keys"]) == 0
    out = capsys.readouterr().out
    assert "policies.apex.tau" in out and "[0 < x < 1]" in out and "policies.spice.lore_form" in out


def test_a_closed_pipe_ends_quietly():
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "chipsim.cli", "keys"], stdout=write, stderr=subprocess.PIPE,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == b""


def _wait_for_busy_workers(proc, count):
    """Until `count` forked workers of `proc` have each used 0.5 s of CPU (they are simulating, not starting):
    a fixed sleep was too short on a loaded machine and too long on a fast one."""
    psutil = pytest.importorskip("psutil")
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        workers = psutil.Process(proc.pid).children()
        with contextlib.suppress(psutil.Error):
            if sum(sum(w.cpu_times()[:2]) > 0.5 for w in workers) >= count:
                return
        time.sleep(0.1)
    pytest.fail(f"{count} workers never got busy")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_a_parallel_run_at_once_with_one_line(presses):
    """The terminal sends SIGINT to the whole process group: parent and workers. The run ends within a
    second, workers included, says so in one line; a second Ctrl-C while it stops changes nothing."""
    # all 2,560 tokens of the trace: the run lasts well past the 3 s below even on a fast machine (~6 s)
    proc = subprocess.Popen([sys.executable, "-m", "chipsim.cli", "run", THOR, "--jobs", "2", "--set",
                             "workload.max_tokens=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    _wait_for_busy_workers(proc, 2)
    assert proc.poll() is None
    t0 = time.perf_counter()
    for _ in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.perf_counter() - t0 < 1.0 + 0.05 * presses
    assert proc.returncode == 130 and err.decode().strip() == "chipsim: interrupted"
    with pytest.raises(ProcessLookupError):  # no worker outlived it
        os.killpg(proc.pid, 0)


# An interrupted worker pool, then the interpreter's exit, with the window a loaded machine opened in CPython 3.11's
# exit hook (concurrent.futures.process._python_exit) made 0.5 s wide: the hook checks that a manager thread's
# wake-up pipe is open, then writes to it, while the thread, seeing its workers dead, closes that pipe and ends.
INTERRUPTED_POOL = """
import sys, time
import concurrent.futures.process as cfp
from chipsim.pool import worker_pool

def slow_wakeup(self):
    if not self._closed:
        time.sleep(0.5)
        self._writer.send_bytes(b"")

try:
    with worker_pool(2) as pool:
        futures = [pool.submit(time.sleep, 30) for _ in range(4)]
        time.sleep(0.2)
        cfp._ThreadWakeup.wakeup = slow_wakeup
        raise KeyboardInterrupt
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
"""


def test_an_interrupted_pool_exits_with_nothing_more_on_stderr_under_load():
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_POOL], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0 and proc.stderr == "interrupted\n"


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_a_dask_sweep_at_once_with_one_line(tmp_path, presses):
    """The same for `sweep --backend dask` on its own LocalCluster: the worker processes (and any the
    cluster starts while it closes) never answer the terminal's SIGINT themselves; all are gone soon after."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("distributed")
    proc = subprocess.Popen([sys.executable, "-m", "chipsim.cli", "sweep", THOR, "--grid", "dma.engines=1,2,3,4",
                             "--backend", "dask", "--jobs", "2", "--out", str(tmp_path / "s"), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:  # both workers up
            workers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if "spawn_main" in " ".join(p.cmdline())]
            if len(workers) >= 2:
                break
            time.sleep(0.2)
        time.sleep(2.0)  # they are simulating
        assert proc.poll() is None
        group = psutil.Process(proc.pid).children(recursive=True)
        t0 = time.perf_counter()
        for _ in range(presses):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=20)
        elapsed = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # closing the LocalCluster's worker processes is Dask's: 1.0-1.5 s on a quiet day on this 2-core VM, up to 1.9 s
    # on a slow one; the sweep itself (4 points of 7 policies over 1,024 tokens) would run for minutes
    assert elapsed < 3.0 + 0.05 * presses
    assert proc.returncode == 130 and err.decode().strip() == "chipsim: interrupted"
    _, alive = psutil.wait_procs(group, timeout=3.0)
    assert alive == []
    assert not (tmp_path / "s" / "results.csv").exists()


def test_input_error_is_one_line_even_with_newlines_in_it():
    assert str(InputError("a\nb")) == "a b"
