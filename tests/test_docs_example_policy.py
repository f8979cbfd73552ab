"""The write-a-policy tutorial's example, docs/examples/my_policy.py: loaded as the tutorial's script loads it (its
@register fills the registry), then run on hand-made traces whose outcome is worked out by hand. The tutorial's
console blocks run it through chipsim's command line (tests/test_docs_examples.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
from conftest import ROOT, THOR, tiny_shape
from helpers import write_hand_trace

from chipsim.errors import InputError
from chipsim.policies import REGISTRY, make_policy
from chipsim.runner import prepare, simulate, summarize_result
from chipsim.workload.models import MODELS

EXAMPLE = os.path.join(ROOT, "docs", "examples", "my_policy.py")
ONE_LAYER = tiny_shape(1, top_k=1)  # one expert of 196,608 B per token: a 4 MiB buffer holds 21


@pytest.fixture
def repeat(monkeypatch):
    """The example's policy class, registered for this test only (every other test sees the registry unchanged)."""
    monkeypatch.setitem(MODELS, ONE_LAYER.name, ONE_LAYER)
    spec = importlib.util.spec_from_file_location("docs_example_my_policy", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
        yield module.Repeat
    finally:
        REGISTRY.pop("repeat", None)


def _run(tmp_path, sequence, spec):
    trace = write_hand_trace(tmp_path / "t.npz", ONE_LAYER, np.array(sequence, dtype=np.uint8).reshape(-1, 1, 1))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: {THOR}\nmodel:\n  name: {ONE_LAYER.name}\nworkload:\n  trace: {trace}\n"
                   "expert_buffer:\n  capacity_mib: 4\n")
    prep = prepare(str(cfg), policy_specs=[spec])
    result = simulate(prep, prep.policies[0])
    return result.per_layer.demand_fetches[:, 0].tolist(), summarize_result(prep, result, prep.policies[0])


def test_the_example_registers_its_policy_with_its_parameter(repeat):
    assert REGISTRY["repeat"] is repeat
    assert make_policy("repeat", {}).params.tokens == 1
    assert make_policy("repeat:tokens=3", {}).params.tokens == 3
    with pytest.raises(InputError, match="policies.repeat.tokens: must be at most 8"):
        make_policy("repeat:tokens=9", {})


def test_repeating_routing_is_staged_before_the_router_asks(tmp_path, repeat):
    """0 0 1 1 1 2: the token before's expert is right at tokens 1, 3 and 4; tokens 0, 2 and 5 fetch on demand."""
    demands, row = _run(tmp_path, [0, 0, 1, 1, 1, 2], "repeat")
    assert demands == [1, 0, 1, 0, 0, 1]
    assert row["repeat_staged_share"] == pytest.approx(3 / 6)
    assert row["prefetches_issued"] == 5  # every token but the first prefetches one expert


def test_a_longer_memory_catches_routing_that_alternates(tmp_path, repeat):
    """0 1 0 1 0 1: the token before's expert is never the next one; the two before hold both from token 2 on."""
    one, row_one = _run(tmp_path, [0, 1, 0, 1, 0, 1], "repeat")
    two, row_two = _run(tmp_path, [0, 1, 0, 1, 0, 1], "repeat:tokens=2")
    assert one == [1] * 6 and row_one["repeat_staged_share"] == 0.0
    assert two == [1, 1, 0, 0, 0, 0] and row_two["repeat_staged_share"] == pytest.approx(4 / 6)
    assert row_two["latency_ms_per_token"] < row_one["latency_ms_per_token"]


def test_several_sequences_are_refused_in_one_line(tmp_path, repeat):
    trace = write_hand_trace(tmp_path / "b.npz", ONE_LAYER, np.zeros((4, 1, 1), dtype=np.uint8))
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"base: {THOR}\nmodel:\n  name: {ONE_LAYER.name}\nworkload:\n  trace: {trace}\n  batch: 2\n"
                   "  max_tokens: 2\nexpert_buffer:\n  capacity_mib: 4\n")
    with pytest.raises(InputError, match="--policy repeat: runs one token a step.*one sequence"):
        prepare(str(cfg), policy_specs=["repeat"])


def test_a_policy_file_outside_the_package_is_part_of_the_results_record_and_the_sweep_keys(tmp_path, repeat):
    """code_sha256 covers the package only: the example's file is recorded by its own sha256 (path and bytes, as
    runner.policy_files hashes it), and a sweep's cache key for its rows differs from the key the package's code
    alone gives, so an edit to the file is never answered from the cache. A built-in policy adds no record."""
    import hashlib

    from chipsim.analysis import sweep
    from chipsim.runner import code_sha256, provenance

    trace = write_hand_trace(tmp_path / "t.npz", ONE_LAYER, np.zeros((4, 1, 1), dtype=np.uint8))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: {THOR}\nmodel:\n  name: {ONE_LAYER.name}\nworkload:\n  trace: {trace}\n"
                   "expert_buffer:\n  capacity_mib: 4\n")
    path = os.path.realpath(EXAMPLE)
    want = hashlib.sha256(path.encode() + open(path, "rb").read()).hexdigest()
    prep = prepare(str(cfg), policy_specs=["repeat", "no-prefetch"])
    assert provenance(prep)["policy_files"] == {"repeat": {"path": path, "sha256": want}}
    assert "policy_files" not in provenance(prepare(str(cfg), policy_specs=["no-prefetch"]))
    points, code, _ = sweep._prepare_points(str(cfg), [], ["repeat", "no-prefetch"], {})
    keys = {e["label"]: e["key"] for e in points[0]["entries"]}
    inputs = sweep._inputs_sha256(provenance(prep)["input_files"])
    assert keys["repeat"] != sweep._task_key(prep.config.raw, prep.trace.sha256, inputs, code_sha256(), "repeat")
    assert keys["no-prefetch"] == sweep._task_key(prep.config.raw, prep.trace.sha256, inputs, code_sha256(),
                                                  "no-prefetch")
    assert points[0]["policy_files"] == {"repeat": {"path": path, "sha256": want}}


def test_a_policy_with_no_source_file_is_keyed_by_its_code(tmp_path):
    """A class defined by `exec` (as a notebook cell is) has no file to hash: its methods' code is, so two bodies
    give two records and two sweep keys, and the same body gives the same key again."""
    from chipsim.analysis import sweep
    from chipsim.policies.base import Policy, register
    from chipsim.runner import provenance

    body = ("@register\nclass Cell(Policy):\n    name = 'cell'\n    summary = 'a cell'\n"
            "    def on_layer_start(self, ctx, t, layer):\n        return {}\n")
    keys = []
    try:
        for value in ("None", "1", "None"):
            REGISTRY.pop("cell", None)
            exec(body.format(value), {"register": register, "Policy": Policy})
            prep = prepare(THOR, ["workload.max_tokens=4"], ["cell"])
            assert provenance(prep)["policy_files"]["cell"]["path"] == "<builtins.Cell>"
            points, _, _ = sweep._prepare_points(THOR, ["workload.max_tokens=4"], ["cell"], {})
            keys.append(points[0]["entries"][0]["key"])
    finally:
        REGISTRY.pop("cell", None)
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_a_cells_code_hashes_alike_in_every_process():
    """A set literal compiles to a frozenset constant whose repr follows the process's string hash seed: the key
    of a policy without a file must not (two seeds gave two keys before the constants were sorted)."""
    import subprocess

    script = ("import hashlib; from chipsim.runner import _code_bytes\n"
              "def f(x): return x in {'alpha', 'beta', 'gamma', 'delta'}\n"
              "print(hashlib.sha256(_code_bytes(f.__code__)).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONHASHSEED=seed),
                              capture_output=True, text=True, check=True).stdout for seed in ("1", "2", "3")}
    assert len(digests) == 1


def test_the_example_script_profiles_its_own_policy_under_the_compiled_engine(tmp_path):
    """`python docs/examples/my_policy.py run ... --profile`: where the engine is compiled, the profile runs in a
    fresh process of the same script, so its policy exists there (a child of `-m chipsim.cli` knew no `repeat`); the
    profiled table is a plain run's."""
    import subprocess

    import chipsim.sim

    if not chipsim.sim.BUILD.startswith("compiled"):
        pytest.skip("the engine is Python here: --profile runs in the same process")
    base = [sys.executable, EXAMPLE, "run", THOR, "--policy", "repeat", "--set", "workload.max_tokens=4", "--json",
            "--jobs", "1"]
    env = dict(os.environ, CHIPSIM_CACHE_DIR=str(tmp_path))
    plain = subprocess.run(base, capture_output=True, text=True, env=env, cwd=tmp_path)
    profiled = subprocess.run(base + ["--profile"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert plain.returncode == 0 and profiled.returncode == 0, profiled.stderr
    assert profiled.stdout == plain.stdout
    assert "slowest policy hook (cumulative): repeat on_route" in profiled.stderr
