"""Property-based fuzzing (hypothesis) of what a user can hand chipsim: config values, `--set` strings, policy
parameters and trace files. Whatever the input, `chipsim run` either succeeds with valid, finite JSON, or
exits 2 with one line `chipsim: error: ...`: never a traceback, never a file left behind.

The examples are derandomised (the same ones on every run, so CI is reproducible); `tests/hostile_inputs.py`
is the wider hand-written sweep."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os

import numpy as np
import pytest
from conftest import THOR, tiny_shape
from helpers import hand_trace_arrays, random_routing, thor_keys
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chipsim.cli import main
from chipsim.policies import REGISTRY
from chipsim.workload.models import MODELS

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# thor's memories on the closed form here: every new memory value would calibrate the command-level model (seconds);
# a smaller fuzz below keeps them command-level
CLOSED_FORM = ["--set", "memory.hbm.timing_model=closed-form", "--set", "memory.lpddr5x.timing_model=closed-form"]
R = ["run", THOR, "--policy", "no-prefetch", "--set", "workload.max_tokens=2", "--jobs", "1", "--json"] + CLOSED_FORM
KEYS = thor_keys()
NUMERIC_KEYS = [key for key, tp in KEYS if tp in ("int", "float")]
OTHER_KEYS = [key for key, tp in KEYS if tp not in ("int", "float")]
MEMORY_KEYS = [key for key in NUMERIC_KEYS if key.startswith(("memory.hbm.", "memory.lpddr5x."))]
POLICY_PARAMS = [(name, param) for name, cls in sorted(REGISTRY.items()) for param in cls.param_specs()]

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2 ** 80), 2 ** 80),
                    st.floats(min_value=-1e3, max_value=1e6))
words = st.sampled_from(["1e9", "1.0e+308", "-0", ".inf", ".nan", "[1, 2]", "{a: 1}", "~", "", "true", "'3'",
                         "0x10", "1_000", "1e-400", "2.5", "-1"])
value_texts = st.one_of(numbers.map(repr), words, st.text(max_size=10))


def outcome(argv: list[str], cwd) -> None:
    """Run chipsim in `cwd`; assert it succeeded with finite JSON or failed in one line, and left no file."""
    before = sorted(os.listdir(cwd))
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage error, made one line by chipsim
                code = exc.code
    finally:
        os.chdir(here)
    text = err.getvalue()
    assert "Traceback" not in text, text
    if code == 0:
        rows = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(f"non-finite {c} in JSON"))
        assert rows and all(math.isfinite(r["latency_ms_per_token"]) for r in rows)
    else:
        errors = [line for line in text.strip().splitlines() if not line.startswith("chipsim: note: ")]
        assert code == 2 and len(errors) == 1 and errors[0].startswith("chipsim: error: "), (code, text)
    assert sorted(os.listdir(cwd)) == before, "a file was left behind"


@settings(FUZZ, max_examples=700)
@given(key=st.sampled_from(NUMERIC_KEYS), value=value_texts)
def test_any_value_of_a_numeric_key(tmp_path, key, value):
    outcome(R + ["--set", f"{key}={value}"], tmp_path)


@settings(FUZZ, max_examples=25)
@given(key=st.sampled_from(MEMORY_KEYS), value=value_texts)
def test_any_value_of_a_memory_key_under_the_command_level_model(tmp_path, key, value):
    outcome(R[:-len(CLOSED_FORM)] + ["--set", f"{key}={value}"], tmp_path)


@settings(FUZZ, max_examples=200)
@given(key=st.sampled_from(OTHER_KEYS), value=value_texts)
def test_any_value_of_another_key(tmp_path, key, value):
    outcome(R + ["--set", f"{key}={value}"], tmp_path)


@settings(FUZZ, max_examples=300)
@given(assignment=st.text(max_size=40))
def test_any_set_string(tmp_path, assignment):
    outcome(R + ["--set", assignment], tmp_path)


@settings(FUZZ, max_examples=400)
@given(param=st.sampled_from(POLICY_PARAMS), value=value_texts)
def test_any_policy_parameter(tmp_path, param, value):
    name, key = param
    outcome(["run", THOR, "--policy", f"{name}:{key}={value}", "--set", "workload.max_tokens=2", "--jobs", "1",
             "--json"], tmp_path)


# ---------------------------------------------------------------------------------------------- traces
TINY = tiny_shape(3)
ROUTED = random_routing(TINY, 4, seed=5)
BASE_ARRAYS, BASE_META = hand_trace_arrays(TINY, ROUTED)
ARRAYS = sorted(BASE_ARRAYS)
cell_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-300, 300))


@st.composite
def trace_edits(draw):
    """One corruption of the hand trace: a cell's value, an array's dtype or length, an array or a meta field
    dropped or changed."""
    kind = draw(st.sampled_from(["cell", "cell", "cell", "dtype", "truncate", "drop", "meta", "extra"]))
    name = draw(st.sampled_from(ARRAYS))
    if kind == "cell":
        index = draw(st.integers(0, BASE_ARRAYS[name].size - 1))
        return kind, name, (index, draw(cell_values))
    if kind == "dtype":
        return kind, name, draw(st.sampled_from(["float64", "float16", "int8", "uint16", "int64", "bool"]))
    if kind == "truncate":
        return kind, name, draw(st.integers(0, 3))
    if kind == "meta":
        field = draw(st.sampled_from(["schema_version", "synthetic", "provenance", "model", "quality", "top_k",
                                      "num_experts", "num_layers"]))
        value = draw(st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=False),
                               st.text(max_size=4), st.just([]), st.just({})))
        return kind, field, value
    return kind, name, None


def _apply(edit) -> tuple[dict, dict]:
    arrays = {k: v.copy() for k, v in BASE_ARRAYS.items()}
    meta = json.loads(json.dumps(BASE_META))
    kind, name, arg = edit
    if kind == "cell":
        index, value = arg
        flat = arrays[name].reshape(-1)
        with np.errstate(all="ignore"):  # what a corrupt writer would store, wrapped or not
            flat[index] = np.array(value).astype(flat.dtype, casting="unsafe")
    elif kind == "dtype":
        with np.errstate(all="ignore"):
            arrays[name] = arrays[name].astype(arg, casting="unsafe")
    elif kind == "truncate":
        arrays[name] = arrays[name][:arg]
    elif kind == "drop":
        del arrays[name]
    elif kind == "meta":
        if name in ("top_k", "num_experts", "num_layers"):
            meta["model"][name] = arg
        else:
            meta[name] = arg
    else:
        arrays["unknown_extra"] = np.zeros(3, dtype=np.float32)
    return arrays, meta


@pytest.fixture(scope="module")
def tiny_model():
    MODELS[TINY.name] = TINY
    yield TINY
    del MODELS[TINY.name]


@settings(FUZZ, max_examples=400)
@given(edit=trace_edits(), policy=st.sampled_from(sorted(REGISTRY)))
def test_any_corrupted_trace(tmp_path, tiny_model, edit, policy):
    arrays, meta = _apply(edit)
    trace = tmp_path / "t.npz"
    np.savez(trace, meta=np.array(json.dumps(meta)), **arrays)  # unvalidated, as any tool might write it
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: {THOR}\nmodel:\n  name: {TINY.name}\nworkload:\n  trace: {trace}\n"
                   "expert_buffer:\n  capacity_mib: 4\n")
    outcome(["run", str(cfg), "--policy", policy, "--jobs", "1", "--json"], tmp_path)
    trace.unlink()
    cfg.unlink()
