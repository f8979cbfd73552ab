"""What `chipsim run` loads before its first event: the modules a run does not need stay unimported, and the trace's
checks that replaced sorting (rows of distinct ids) refuse what sorting refused. Speed itself is measured by
benchmarks/bench_startup.py, not here."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chipsim.errors import InputError
from chipsim.runner import prepare
from chipsim.trace import format as tf
from conftest import ROOT, THOR, tiny_shape
from helpers import hand_trace_arrays, random_routing

# what a run of one policy never needs: plotting and tables (analysis), GPU replay and trace recording (torch),
# the worker pool (one policy runs in the process) and the progress bar (not on a terminal)
NOT_IMPORTED = ("pandas", "matplotlib", "scipy", "torch", "chipsim.hwreplay", "chipsim.trace.train",
                "chipsim.trace.recorder", "chipsim.analysis.sweep", "chipsim.analysis.plots", "multiprocessing",
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
    monkeypatch.setattr(tf, "DISTINCT_CHUNK", chunk)
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, width = 6, int(rng.integers(1, 7))
        arr = np.argsort(rng.random((3, 2, n)), axis=-1)[..., :width].astype(np.uint8)
        for _ in range(int(rng.integers(0, 3))):
            arr[tuple(int(rng.integers(0, s)) for s in arr.shape)] = int(rng.integers(0, n))
        ordered = np.sort(arr, axis=-1)
        assert tf._rows_distinct(arr, n) == (not (ordered[..., 1:] == ordered[..., :-1]).any())
