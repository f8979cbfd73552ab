"""The native event core (chipsim.sim.core, chipsim.sim.native; `run.engine: fast`, the default) against the engine
of record on SimPy (`run.engine: reference`): every registered policy on the configs whose behaviour differs
(Thor's queue with preemption and cancels, DeepSeek-V2-Lite's shared experts, the H200's one FIFO copy stream,
experts staged in SRAM, operations faster than their operand path, Thor without preemption or cancels), results
identical to the picosecond, the byte and the picojoule, the recorded timeline included."""

import copy
import os

import numpy as np
import pytest

import chipsim.policies  # noqa: F401  (registers every policy)
import chipsim.sim
from chipsim.errors import InputError
from chipsim.policies.base import phase_names
from chipsim.runner import prepare, simulate
from chipsim.sim.core import fast_core, native_available, simpy_core
from chipsim.sim.engine import Simulation
from conftest import native_core
from chipsim.sim.energy import EnergyTable
from chipsim.sim.metrics import per_token_energy_pj
from chipsim.sim.record import differences

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = 32  # past every policy's cache warm-up on Thor's 42-expert buffer: evictions every token

CONFIGS = {
    "thor": ("thor.yaml", []),
    "thor-deepseek-v2-lite": ("thor-deepseek-v2-lite.yaml", []),
    "h200-pcie5": ("h200-pcie5.yaml", []),
    "thor-sram-staging": ("thor-sram-staging.yaml", []),
    # two HBM channels: the H200's measured operations stream faster than its memory then gives one flow
    "h200-pcie5-narrow-hbm": ("h200-pcie5.yaml", ["memory.hbm.channels=2"]),
    "thor-no-preempt-no-cancel": ("thor.yaml", ["dma.demand_preempts_prefetch=false", "dma.cancel_in_flight=false",
                                                "dma.engines=2"]),
}


def _prepared(config: str, overrides: list[str], engine: str, policies):
    return prepare(os.path.join(ROOT, "hwconfigs", config),
                   [f"workload.max_tokens={TOKENS}", f"run.engine={engine}", *overrides], policies)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_policy_gives_the_reference_results_exactly(name):
    config, overrides = CONFIGS[name]
    policies = phase_names("decode")
    ref = _prepared(config, overrides, "reference", policies)
    fast = _prepared(config, overrides, "fast", policies)
    table = EnergyTable.from_config(ref.config.hw)
    hw, workload, trace = fast.config.hw, fast.workload, fast.trace
    for p_ref, p_fast in zip(ref.policies, fast.policies):
        a = simulate(ref, p_ref)
        assert a.tokens == TOKENS
        energy_a = per_token_energy_pj(a, table)
        b = Simulation(hw, workload, trace, copy.deepcopy(p_fast), max_tokens=TOKENS, core=native_core_or_skip()).run()
        assert differences(a, b) == [], f"{name} {p_ref.label}"
        energy_b = per_token_energy_pj(b, table)
        assert all(np.array_equal(energy_a[k], energy_b[k]) for k in energy_a), f"{name} {p_ref.label}"


@pytest.mark.parametrize("name", ["thor", "h200-pcie5", "thor-sram-staging"])
def test_every_prefill_policy_gives_the_reference_results_exactly(name):
    """A whole request (chunked prefill, then decode over a growing cache) on both cores: every prefill policy before
    a decode policy that prefetches and one that caches."""
    config, overrides = CONFIGS[name]
    keys = [*overrides, "workload.prompt_tokens=48", "workload.output_tokens=6", "workload.prefill_chunk_tokens=16"]
    policies = [f"{p}+{d}" for p in phase_names("prefill") for d in ("apex", "lru")]
    ref = _prepared(config, keys, "reference", policies)
    fast = _prepared(config, keys, "fast", policies)
    table = EnergyTable.from_config(ref.config.hw)
    for p_ref, p_fast in zip(ref.policies, fast.policies):
        a = simulate(ref, p_ref)
        assert a.prefill_steps == 3 and a.tokens == 8
        b = Simulation(fast.config.hw, fast.workload, fast.trace, copy.deepcopy(p_fast), core=native_core_or_skip(),
                       request=fast.request, prefill_policy=copy.deepcopy(fast.prefill_for[p_fast.label])).run()
        assert differences(a, b) == [], f"{name} {p_ref.label}"
        energy_a, energy_b = per_token_energy_pj(a, table), per_token_energy_pj(b, table)
        assert all(np.array_equal(energy_a[k], energy_b[k]) for k in energy_a), f"{name} {p_ref.label}"


def native_core_or_skip():
    native_core()  # skips where the install did not build it
    from chipsim.sim.core import native_core as core

    return core()


def test_the_fast_engine_runs_on_the_c_event_core_where_it_was_built():
    """`run.engine: fast` is the native core where it was built and may run, else SimPy (the same results)."""
    assert fast_core().name == ("native" if native_available() else "simpy")
    if native_available():
        assert chipsim.sim.NATIVE and chipsim.sim.BUILD == "compiled (mypyc)"
    assert simpy_core().name == "simpy" and simpy_core().operation is None


@pytest.mark.parametrize("policy", ["apex", "no-prefetch"])
def test_the_recorded_timeline_is_the_same(policy):
    """The events, DMA spans and link samples to the picosecond. No-prefetch's first fetch comes after instants at
    which the reference engine looks at the link and the native core does not: the link's samples are its changes
    from idle, so both record the same."""
    config, overrides = CONFIGS["thor"]
    prep = _prepared(config, overrides, "reference", [policy])
    ref = simulate(prep, prep.policies[0], record_events=True, record_tokens=4).timeline
    assert len(ref.dma) > 0
    fast_prep = _prepared(config, overrides, "fast", [policy])
    fast = Simulation(fast_prep.config.hw, fast_prep.workload, fast_prep.trace, copy.deepcopy(fast_prep.policies[0]),
                      max_tokens=TOKENS, record_events=True, record_tokens=4, core=native_core_or_skip()).run().timeline
    assert ref.events == fast.events and ref.dma == fast.dma and ref.link == fast.link


def test_an_unknown_engine_is_refused_naming_the_key():
    with pytest.raises(InputError, match="run.engine"):
        _prepared("thor.yaml", [], "turbo", ["no-prefetch"])


def test_differences_names_what_differs():
    prep = _prepared("thor.yaml", [], "fast", ["no-prefetch"])
    a = simulate(prep, prep.policies[0])
    b = simulate(prep, prep.policies[0])
    assert differences(a, b) == []
    b.per_token.latency_ps[3] += 1
    b.per_token.bytes["pcie"][0] += 1
    b.counts.fetches_total += 1
    assert differences(a, b) == ["per_token.latency_ps", "per_token.bytes.pcie", "counts"]


def test_the_event_engine_runs_compiled_where_it_was_installed():
    """`pip install -e .` compiles chipsim.sim's engine with mypyc (setup.py); a clean install here, as in CI, must
    give the compiled modules, not fall back to pure Python without anyone noticing."""
    import importlib.machinery

    import chipsim.sim
    import chipsim.sim.engine

    if os.environ.get("CHIPSIM_PURE_PYTHON"):
        pytest.skip("CHIPSIM_PURE_PYTHON is set")
    assert chipsim.sim.BUILD == "compiled (mypyc)", chipsim.sim.BUILD
    assert chipsim.sim.engine.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_pure_python_and_compiled_print_the_same_run(tmp_path):
    """The same sources run as mypyc's C extensions or as Python (CHIPSIM_PURE_PYTHON=1: every compiled module
    loaded from its .py file) give byte-identical output."""
    import subprocess
    import sys

    outputs = {}
    for pure in ("", "1"):
        env = dict(os.environ, CHIPSIM_PURE_PYTHON=pure, CHIPSIM_CACHE_DIR=str(tmp_path / "cache"))
        code = ("import chipsim.sim, chipsim.sim.engine, sys; sys.stderr.write(chipsim.sim.BUILD + ' ' + "
                "chipsim.sim.engine.__file__); from chipsim.cli import main; main()")
        run = subprocess.run([sys.executable, "-c", code, "run", os.path.join(ROOT, "hwconfigs", "thor.yaml"),
                              "--set", "workload.max_tokens=16", "--policy", "apex", "--policy", "lru", "--jobs", "1"],
                             capture_output=True, text=True, env=env, check=True)
        outputs[pure] = run.stdout
        if pure:
            assert run.stderr.startswith("pure Python (CHIPSIM_PURE_PYTHON is set)") and ".py" in run.stderr
    assert outputs[""] == outputs["1"] and "apex" in outputs[""]


@pytest.mark.parametrize("core", ["simpy", "native"])
def test_a_finished_process_is_freed_by_reference_counting(core):
    """A process (a host-CPU job is one per expert) holds its resume callback, a method bound to itself: when its
    generator returns it lets go of it, so finished processes never pile up for the cyclic garbage collector."""
    import gc
    import weakref

    import simpy

    env = simpy.Environment() if core == "simpy" else native_core().Loop()

    def job(delay):
        yield env.timeout(delay)
        return delay

    processes = [env.process(job(d)) for d in (5, 7)]
    env.run()
    assert [p.value for p in processes] == [5, 7]
    gc.disable()
    try:
        gen = job(1)
        process = env.process(gen)
        env.run()
        watch = weakref.ref(gen)  # the generator: a process object itself may take no weak reference
        del process, gen
        assert watch() is None
    finally:
        gc.enable()
