"""Every kind of bad input gets one line on stderr naming the problem, a non-zero exit, no traceback and
no output written."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, THOR
from helpers import random_routing, write_hand_trace

from chipsim.workload.models import MODELS

GRANITE_3B_TRACE = os.path.join(ROOT, "traces", "synthetic-granite-3b.npz")


def chipsim(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "chipsim.cli", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    return proc.returncode, proc.stdout, proc.stderr


def assert_rejected(args, *fragments, out_dir=None):
    code, stdout, stderr = chipsim(*args)
    assert code != 0, stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("chipsim: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    if out_dir is not None:
        assert not os.path.exists(out_dir)
    return lines[0]


def write_config(tmp_path, body: str, name="c.yaml") -> str:
    path = tmp_path / name
    path.write_text(f"base: {THOR}\n{body}")
    return str(path)


def test_missing_config_file(tmp_path):
    assert_rejected(["run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")], "nope.yaml", "not found",
                    out_dir=tmp_path / "o")


def test_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("compute:\n  arrays: [4\n  clock_mhz: 750\n")
    assert_rejected(["run", str(path)], "malformed YAML", "line")


def test_unknown_key(tmp_path):
    cfg = write_config(tmp_path, "links:\n  pcie:\n    bandwith_gbps: 64\n")
    assert_rejected(["run", cfg], "links.pcie.bandwith_gbps", "unknown key")


def test_missing_key(tmp_path):
    path = tmp_path / "partial.yaml"
    text = open(THOR).read().replace("    latency_ns: 600", "")
    path.write_text(text.replace("../traces", os.path.join(ROOT, "traces")))
    assert_rejected(["run", str(path)], "links.pcie.latency_ns", "missing key")


def test_wrong_type(tmp_path):
    cfg = write_config(tmp_path, "compute:\n  arrays: four\n")
    assert_rejected(["run", cfg], "compute.arrays", "expected an integer")


@pytest.mark.parametrize("value", ["-64", "0"])
def test_non_positive_bandwidth_from_set(value):
    assert_rejected(["run", THOR, "--set", f"links.pcie.bandwidth_gbps={value}"], "links.pcie.bandwidth_gbps",
                    "must be positive")


def test_profiled_op_time_must_be_a_number_at_least_0(tmp_path):
    cfg = write_config(tmp_path, 'compute:\n  op_times_ns:\n    "matvec r8 o8 b128": -5\n')
    assert_rejected(["run", cfg], "compute.op_times_ns.matvec r8 o8 b128", "must be at least 0")
    cfg = write_config(tmp_path, 'compute:\n  op_energy_pj:\n    "matvec r8 o8 b128": -1\n', name="e.yaml")
    assert_rejected(["run", cfg], "compute.op_energy_pj.matvec r8 o8 b128", "must be at least 0")
    cfg = write_config(tmp_path, "compute:\n  op_times_ns: 12\n", name="d.yaml")
    assert_rejected(["run", cfg], "compute.op_times_ns", "expected a section")


def test_unknown_key_from_set():
    assert_rejected(["run", THOR, "--set", "links.pcie.speed=3"], "links.pcie.speed", "unknown key")


def test_expert_bits_must_be_a_supported_precision():
    assert_rejected(["run", THOR, "--set", "model.expert_bits=6"], "model.expert_bits", "one of 4, 5, 8, 16, 32")


def test_buffer_smaller_than_one_expert():
    assert_rejected(["run", THOR, "--set", "expert_buffer.capacity_mib=1"], "expert_buffer.capacity_mib",
                    "smaller than one expert")


def test_hbm_overflow():
    assert_rejected(["run", THOR, "--set", "memory.hbm.capacity_gib=0.5"], "memory.hbm.capacity_gib", "cannot hold")


def test_unknown_model():
    assert_rejected(["run", THOR, "--set", "model.name=gpt-5"], "model.name", "unknown model")


def test_missing_trace(tmp_path):
    assert_rejected(["run", THOR, "--trace", str(tmp_path / "none.npz")], "none.npz", "not found")


def test_trace_for_another_model(tmp_path):
    other = tmp_path / "granite1b.npz"
    m = MODELS["granite-3.1-1b-a400m"]
    write_hand_trace(other, m, random_routing(m, 4))
    assert_rejected(["run", THOR, "--trace", str(other), "--out", str(tmp_path / "o")], "num_layers=24",
                    "granite-3.1-3b-a800m", out_dir=tmp_path / "o")


def test_truncated_trace(tmp_path):
    data = open(GRANITE_3B_TRACE, "rb").read()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 3])
    assert_rejected(["run", THOR, "--trace", str(cut)], "cut.npz", "truncated")


def test_trace_that_is_not_a_trace(tmp_path):
    fake = tmp_path / "fake.npz"
    np.savez(fake, x=np.arange(3))
    assert_rejected(["run", THOR, "--trace", str(fake)], "fake.npz")


def test_unknown_policy_and_parameter():
    assert_rejected(["run", THOR, "--policy", "magic"], "unknown policy 'magic'")
    assert_rejected(["run", THOR, "--policy", "static:depth=3"], "policies.static.depth", "unknown parameter")
    assert_rejected(["run", THOR, "--policy", "static:extra=-1"], "policies.static.extra", "at least 0")


def test_bad_set_syntax():
    assert_rejected(["run", THOR, "--set", "links.pcie.bandwidth_gbps"], "expected dotted.key=value")


def test_base_chain_that_loops(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"base: {b}\n")
    b.write_text(f"base: {a}\n")
    assert_rejected(["run", str(a)], "loops")


def test_out_path_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_rejected(["run", THOR, "--set", "workload.max_tokens=2", "--out", str(f)], "not a directory")


def test_a_policy_that_cannot_fit_is_rejected_before_anything_runs(tmp_path):
    out = tmp_path / "o"
    assert_rejected(["run", THOR, "--policy", "no-prefetch", "--policy", "lru:slots=3", "--out", str(out)],
                    "policies.lru.slots", out_dir=out)
    assert_rejected(["run", THOR, "--policy", "promoe:cache=maybe"], "policies.promoe.cache", "true or false")
