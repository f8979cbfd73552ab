"""Run policies on one config: load and check everything first, then simulate (in parallel), then summarise.

`prepare` is where every input check happens (config, trace, policies and the trace arrays they read);
`provenance` is the one record of where a result came from (config, trace and code, with their hashes)."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from chipsim import __version__
from chipsim._compiled import RECORD
from chipsim.dramsim.standard import standard_file_sha256
from chipsim.errors import InputError
from chipsim.files import read_input
from chipsim.hw.config import Config, HardwareConfig, load_config, memory_tiers, yaml_text
from chipsim.hw.machine import roles
from chipsim.hw.paths import components, copy_timing, fetch_path_timing, memory_timing, package_link
from chipsim.policies.base import Policy, check_policy_config, make_policy, make_request_policies, split_request_spec
from chipsim.sim.energy import EnergyTable
from chipsim.sim.core import core_for
from chipsim.sim.engine import Simulation
from chipsim.sim.observe import Observer
from chipsim.sim.metrics import summarize
from chipsim.sim.record import SimResult
from chipsim.trace import format as trace_format
from chipsim.trace.format import Trace
from chipsim.units import PS_PER_S, gbps_to_bytes_per_s, ns_to_ps, transfer_ps
from chipsim.workload import hf_config
from chipsim.trace.interleave import check_batch_fits, interleave
from chipsim.workload.batch import BatchWorkload, build_batch, is_batch
from chipsim.workload.decode import DecodeWorkload, build_workload
from chipsim.workload.speculative import SpecWorkload, build_speculative, is_speculative
from chipsim.workload.op_keys import check_op_keys
from chipsim.workload.host import host_timing
from chipsim.workload.request import RequestWorkload, build_request, final_context, is_request, trace_tokens_needed
from chipsim.serve import prepare as serve_prep
from chipsim.serve.server import ServePlan
from chipsim.workload.served import ServedCosts


@dataclass
class Prepared:
    config: Config
    workload: DecodeWorkload
    trace: Trace
    policies: list[Policy]
    notes: list[str] = field(default_factory=list)  # what the user should know, e.g. a trace shorter than asked
    request: RequestWorkload | None = None  # a whole request (workload.prompt_tokens > 0)
    prefill_for: dict[str, Policy] = field(default_factory=dict)  # a request's prefill policy per decode label
    batch: BatchWorkload | None = None  # several sequences decoded together (workload.batch > 1)
    speculative: SpecWorkload | None = None  # drafts verified with each step's token (workload.speculative)
    served: ServePlan | None = None  # many requests served (workload.requests > 0)
    served_costs: ServedCosts | None = None  # their steps' costs
    slo: dict = field(default_factory=dict)  # --slo: ttft_ms, tpot_ms


# what code_sha256 leaves out: bytecode, built extensions and the record of their build (the same sources give
# the same results compiled or not: chipsim/_compiled.py runs a compiled module only if its source is unchanged)
_NOT_CODE_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
PACKAGE_DIR = Path(__file__).resolve().parent  # chipsim/
STDLIB_DIR = Path(sysconfig.get_paths()["stdlib"]).resolve()


def code_files(root: Path = PACKAGE_DIR) -> list[str]:
    """Every file of the package (under `root`) that chipsim reads at run time: its modules, the DRAM standards,
    the compiled modules' sources such as sim/native.pyx; as paths relative to `root` with '/', sorted."""
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if (not path.is_file() or "__pycache__" in rel.parts or path.suffix in _NOT_CODE_SUFFIXES
                or path.name == RECORD):
            continue
        out.append(rel.as_posix())
    return sorted(out)


def tree_sha256(root: Path) -> str:
    """sha256 of `code_files(root)`: each file's relative path and bytes, in that order."""
    h = hashlib.sha256()
    for rel in code_files(root):
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_sha256() -> str:
    """Hash of the simulator's code and data (`tree_sha256` of the package), so results say which code produced
    them and a sweep's cache is not reused after any of it changed. The same sources give the same hash, installed
    or in a source tree, compiled or not. Computed once per process: the modules were loaded when it started, so
    the files as they were then are the code that runs."""
    return tree_sha256(PACKAGE_DIR)


def policy_files(prep: Prepared) -> dict[str, dict]:
    """The code of the run's policies that lives outside the package (a policy a script, notebook or `exec`
    registers), by policy label -> {"path", "sha256"}: code_sha256 covers only the package, so without these an
    edited policy would leave a sweep's cache keys, and the results' record of what ran, as they were. A class
    with a source file is hashed by that file (not the modules it imports); one without (a notebook cell, `exec`)
    by its methods' code. Empty for the built-in policies (their results and cache keys stay as they were)."""
    out = {}
    for policy in prep.policies:
        classes = [type(policy)]
        prefill = prep.prefill_for.get(policy.label)
        if prefill is not None:
            classes.append(type(prefill))
        parts = sorted({part for cls in classes for part in _outside_code(cls)})
        if parts:
            h = hashlib.sha256()
            for name, data in parts:
                h.update(name.encode())
                h.update(data)
            out[policy.label] = {"path": os.pathsep.join(name for name, _ in parts), "sha256": h.hexdigest()}
    return out


def _outside_code(cls: type) -> list[tuple[str, bytes]]:
    """(name, bytes) of `cls` and its bases outside the package: a source file's path and contents, or for a class
    without one its qualified name and its functions' code (`_code_bytes`)."""
    out = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            path = Path(inspect.getsourcefile(klass) or "").resolve()
        except TypeError:  # defined where no file is: hash what it runs
            path = None
        if path is not None and path.is_file():
            if PACKAGE_DIR not in path.parents and STDLIB_DIR not in path.parents:  # (typing.Generic, abc.ABC, ...)
                out.append((str(path), path.read_bytes()))
            continue
        functions = sorted((name, f.__code__) for name, f in vars(klass).items() if hasattr(f, "__code__"))
        out.append((f"<{klass.__module__}.{klass.__qualname__}>",
                    b"".join(name.encode() + _code_bytes(code) for name, code in functions)))
    return out


def _code_bytes(code) -> bytes:
    """A code object's instructions, names and constants, nested code included, as bytes that are the same in
    every process for the same source (marshal's output is not: it depends on reference counts)."""
    parts = [code.co_code, repr((code.co_names, code.co_varnames, code.co_freevars)).encode()]
    parts += [_code_bytes(c) if hasattr(c, "co_code") else _const_bytes(c) for c in code.co_consts]
    return b"\0".join(parts)


def _const_bytes(const) -> bytes:
    """A constant's repr; a frozenset's (`x in {"a", "b"}`) in sorted order, as its own follows the string hash
    seed of the process."""
    if isinstance(const, frozenset):
        return repr(sorted(const, key=repr)).encode()
    return repr(const).encode()


def input_files(hw: HardwareConfig) -> dict[str, dict]:
    """The files a config names beside its trace that a run reads: each command-level memory's DRAM standard
    (a built-in name or a path) and the model's config.json, by dotted key -> {"path", "sha256"}. The trace has
    its own sha256."""
    out = {}
    for key, d in memory_tiers(hw).values():
        if d.timing_model == "command-level" and d.standard:
            try:
                path, digest = standard_file_sha256(d.standard)
            except InputError as exc:
                raise InputError(f"{key}.standard: {exc}") from None
            out[f"{key}.standard"] = {"path": path, "sha256": digest}
    if hw.model.config:  # the model's shape: a config.json edited between two sweeps is another input
        raw = read_input(hw.model.config, "model.config: config.json", hf_config.CONFIG_MAX_BYTES)
        out["model.config"] = {"path": hw.model.config, "sha256": hashlib.sha256(raw).hexdigest()}
    if hw.workload.arrivals.file:  # a served run's requests: an edited file is another input
        from chipsim.serve.arrivals import ARRIVALS_MAX_BYTES

        raw = read_input(hw.workload.arrivals.file, "workload.arrivals.file", ARRIVALS_MAX_BYTES)
        out["workload.arrivals.file"] = {"path": hw.workload.arrivals.file, "sha256": hashlib.sha256(raw).hexdigest()}
    return out


def prepare(config_path: str, overrides=(), policy_specs=(), trace_path: str | None = None) -> Prepared:
    """Everything that can fail on bad input happens here, before any simulation starts."""
    if trace_path:
        # written as YAML so that a path with '#', ': ' or quotes reads back as itself
        overrides = list(overrides) + [f"workload.trace={yaml_text('workload.trace', os.path.abspath(trace_path))}"]
    config = load_config(config_path, overrides)
    check_op_keys(config.hw)
    check_policy_config(config.policies)
    specs = list(policy_specs) or list(config.hw.run.policies)
    policies, prefill_for = _policies(config, specs)  # a bad spec is refused before any work
    _check_rates(config.hw)
    served = serve_prep.is_served(config.hw)
    sizes, longest = serve_prep.longest_request(config.hw) if served else (None, 0)
    workload = build_workload(config.hw, longest if served else final_context(config.hw))
    request = build_request(config.hw, workload) if is_request(config.hw) else None
    # the arrays this run reads are checked now (from the trace cache: read and their sha256 checked), the
    # predictor outputs the trace carries when it was first unpacked
    every = [*policies, *prefill_for.values()]
    needed = set(trace_format.CORE_ARRAYS).union(*({s.name for s in p.trace_arrays} for p in every))
    trace = trace_format.load(config.trace_path, needed=sorted(needed))
    trace.check_matches(workload.model)
    if request is not None:
        _check_request_fits(config, workload, trace, request, list(prefill_for.values()))
    batch = None
    if is_batch(config.hw):  # the trace re-ordered so that each step's tokens are consecutive
        check_batch_fits(config.hw, trace)
        batch = build_batch(config.hw, workload, trace.num_tokens)
        trace = interleave(trace, batch.batch, batch.steps)
    spec = None
    if is_speculative(config.hw):
        tokens = min(config.hw.workload.max_tokens or trace.num_tokens, trace.num_tokens)
        spec = build_speculative(config.hw, workload, trace["token_ids"], tokens)
    plan = serve_prep.serve_plan(config.hw, workload, trace, sizes) if sizes is not None else None
    _check_time_fits(config, workload, trace, policies, request, batch, spec, plan)
    steps = _several_token_steps(trace, batch, spec)
    for policy in every:
        trace_format.check_arrays(trace, policy.trace_arrays, f"policy {policy.label}")
        _check_policy(config, workload, trace, policy)
        if steps is not None:
            _check_steps_policy(config, workload, policy, *steps)
        if plan is not None:
            _check_served_policy(config, workload, policy)
    labels = [p.label for p in policies]
    if len(set(labels)) != len(labels):
        duplicate = next(label for label in labels if labels.count(label) > 1)
        raise InputError(f"--policy {duplicate}: given twice")
    costs = serve_prep.served_costs(config.hw, workload) if plan is not None else None
    return Prepared(config, workload, trace, policies, _notes(config, trace, policies), request, prefill_for, batch,
                    spec, plan, costs)


def _policies(config: Config, specs: list[str]) -> tuple[list[Policy], dict[str, Policy]]:
    """The decode policies the specs name and, for a request, each one's prefill policy (by its label)."""
    if is_request(config.hw):
        pairs = [make_request_policies(spec, config.policies, config.hw.run.prefill_policy) for spec in specs]
        return [decode for _, decode in pairs], {decode.label: prefill for prefill, decode in pairs}
    policies = []
    for spec in specs:
        if split_request_spec(spec) and config.hw.workload.requests:
            raise InputError(f"--policy {spec}: in a served run (workload.requests) one policy runs every step, "
                             "prompt chunks and decode tokens of several requests together; name one decode policy")
        if split_request_spec(spec):
            raise InputError(f"--policy {spec}: PREFILL+DECODE needs a request (workload.prompt_tokens > 0)")
        policy = make_policy(spec, config.policies)
        if policy.phase != "decode":
            raise InputError(f"--policy {spec}: a prefill policy runs a request's prompt (workload.prompt_tokens > 0) "
                             "before a decode policy")
        policies.append(policy)
    return policies, {}


def _check_request_fits(config: Config, workload: DecodeWorkload, trace: Trace, request: RequestWorkload,
                        policies: list[Policy]) -> None:
    """A request reads P + O - 1 trace tokens, and every layer of every prefill chunk needs the union of its tokens'
    experts in the buffer at once (a chunk runs each of them over all its tokens)."""
    hw = config.hw
    w = hw.workload
    needed = trace_tokens_needed(hw)
    if needed > trace.num_tokens:
        raise InputError(f"workload.prompt_tokens: a request of {w.prompt_tokens} prompt + {w.output_tokens} output "
                         f"tokens reads {needed} trace tokens; {trace.path} has {trace.num_tokens}")
    routed = trace["routed_ids"]
    widest, where = 0, (0, 0)
    for chunk in request.chunks:
        ids = routed[chunk.offset:chunk.offset + chunk.tokens]
        for layer in range(ids.shape[1]):
            n = len(set(ids[:, layer, :].ravel().tolist()))
            if n > widest:
                widest, where = n, (chunk.offset, layer)
    for policy in policies:
        slots = workload.buffer_bytes // policy.expert_format(workload, hw).slot_bytes
        if slots < widest:
            raise InputError(
                f"expert_buffer.capacity_mib: holds {slots} experts in policy {policy.label}'s format, fewer than the "
                f"{widest} that the prefill chunk at prompt token {where[0]} routes to in MoE layer {where[1]}; "
                "use smaller chunks (workload.prefill_chunk_tokens) or a larger buffer")


def _notes(config: Config, trace: Trace, policies: list[Policy]) -> list[str]:
    """What a run does other than what was asked, in words: a trace shorter than workload.max_tokens, and
    warm-up periods that leave few measured tokens."""
    wl = config.hw.workload
    tokens = min(wl.max_tokens or trace.num_tokens, trace.num_tokens)
    if wl.batch > 1:  # the steps of a batch run (its trace holds every sequence's window)
        tokens = trace.num_tokens // wl.batch
    notes = []
    request = is_request(config.hw)
    if wl.requests:
        s = wl.scheduler
        notes.append(f"{wl.requests} requests served ({s.kind} scheduler, up to {s.max_sequences} sequences and "
                     f"{s.max_step_tokens} tokens a step), one policy for every step: workload.context_length, "
                     "max_tokens and warmup_tokens are not read")
        request = True
    elif request:
        notes.append(f"a request of {wl.prompt_tokens} prompt and {wl.output_tokens} output tokens (trace tokens "
                     f"0..{trace_tokens_needed(config.hw) - 1}): workload.context_length, max_tokens and "
                     "warmup_tokens are not read")
    if wl.max_tokens > trace.num_tokens and not request:
        notes.append(f"workload.max_tokens {wl.max_tokens} exceeds the {trace.num_tokens} tokens of trace "
                     f"{trace.path}: replaying {trace.num_tokens}")
    machine = roles(config.hw)
    if machine.in_place:  # what each policy does there, once per distinct answer
        said: dict[str, list[str]] = {}
        for policy in policies:
            said.setdefault(policy.in_place, []).append(policy.label)
        for text, labels in said.items():
            notes.append(f"experts read in place from {machine.expert_store}: {', '.join(labels)}: {text}")
    for policy in policies if not request else ():
        warmup = max(wl.warmup_tokens, policy.warmup_tokens())
        measured = tokens - min(warmup, tokens - 1)
        if warmup and measured < warmup:
            notes.append(f"policy {policy.label}: {warmup} warm-up tokens of {tokens} replayed leave {measured} "
                         f"measured token{'s' if measured != 1 else ''} in the means (raise workload.max_tokens)")
    return notes


# Simulated time is integer picoseconds in int64 arrays and SimPy's heap: a run must end before 2^62 ps (53 days)
MAX_SIM_PS = 1 << 62


def _check_rates(hw) -> None:
    """Every rate the simulator divides by must be at least one byte per second once derived (a DRAM's
    timing can leave almost nothing of its peak)."""
    for name, (key, d) in memory_tiers(hw).items():
        timing = memory_timing(hw, name)
        if gbps_to_bytes_per_s(timing.effective_gbps) < 1:
            raise InputError(f"{key}: its timing keys leave {timing.effective_gbps:.3g} GB/s of its "
                             f"{timing.peak_gbps:.3g} GB/s peak, less than one byte per second")


def _several_token_steps(trace: Trace, batch: BatchWorkload | None, spec: SpecWorkload | None
                         ) -> tuple[str, list[tuple[int, int]], tuple[int, int, int]] | None:
    """A run whose steps are several tokens: what makes them so, each step's (first token, tokens) and the widest
    union of experts a step's MoE layer routes to (widest_union); None for one token a step."""
    if batch is not None:
        what, spans = f"workload.batch {batch.batch}", [(i * batch.batch, batch.batch) for i in range(batch.steps)]
    elif spec is not None:
        what, spans = "workload.speculative", [(s.first, s.tokens) for s in spec.steps]
    else:
        return None
    return what, spans, widest_union(trace["routed_ids"], spans)


def _check_steps_policy(config: Config, workload: DecodeWorkload, policy: Policy, what: str,
                        spans: list[tuple[int, int]], widest: tuple[int, int, int]) -> None:
    """A policy runs steps of several tokens (`spans`: each step's first token and count) when it says how
    (Policy.batch_support) and its experts compute as stored (a GEMM over several tokens of another format, FloE's
    compressed experts, is not costed); and the `widest` step's union of experts must fit its buffer at once."""
    slots = _several_tokens_slots(config, workload, policy, what)
    experts, step, layer = widest
    if slots < experts:
        raise InputError(
            f"expert_buffer.capacity_mib: holds {slots} experts in policy {policy.label}'s format, fewer than the "
            f"{experts} that the {spans[step][1]} tokens of step {step} route to in MoE layer {layer} ({what}); "
            "use fewer tokens a step or a larger buffer")


def _several_tokens_slots(config: Config, workload: DecodeWorkload, policy: Policy, what: str) -> int:
    """The buffer slots of a policy that runs steps of several tokens (`what` makes them so), refused in one line
    unless it says how (Policy.batch_support) and its experts compute as stored."""
    if not policy.batch_support:
        raise InputError(f"--policy {policy.label}: runs one token a step, not {what}: {policy.batch_refusal}")
    stored = workload.expert_format()
    fmt = policy.expert_format(workload, config.hw)
    if (fmt.compute_ps, fmt.macs, fmt.hbm_bytes) != (stored.compute_ps, stored.macs, stored.hbm_bytes):
        raise InputError(f"--policy {policy.label}: its experts compute in another format than stored; a GEMM of "
                         f"that format over several tokens is not costed ({what})")
    return workload.buffer_bytes // fmt.slot_bytes


def _check_served_policy(config: Config, workload: DecodeWorkload, policy: Policy) -> None:
    """A served run's policy runs steps of several tokens (Policy.batch_support), its experts as stored, and its
    buffer holds the most experts a step's MoE layer can route to (max_step_tokens x top-k, at most all)."""
    slots = _several_tokens_slots(config, workload, policy, "workload.requests (steps of several requests)")
    widest = serve_prep.widest_step_union(config.hw, workload)
    if slots < widest:
        raise InputError(
            f"expert_buffer.capacity_mib: holds {slots} experts in policy {policy.label}'s format; a step of up to "
            f"{config.hw.workload.scheduler.max_step_tokens} tokens (workload.scheduler.max_step_tokens) can route to "
            f"{widest} in one MoE layer; use fewer tokens a step or a larger buffer")


def widest_union(routed: np.ndarray, spans: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(experts, step, MoE layer) of the widest union of routed experts over steps of `spans` (first token,
    tokens) of consecutive tokens."""
    widest = (0, 0, 0)
    for i, (first, tokens) in enumerate(spans):
        ids = np.asarray(routed[first:first + tokens], dtype=np.int64)
        marks = np.zeros((ids.shape[1], int(ids.max()) + 1), dtype=bool)
        np.put_along_axis(marks, ids.transpose(1, 0, 2).reshape(ids.shape[1], -1), True, axis=1)
        sizes = marks.sum(axis=1)
        layer = int(sizes.argmax())
        if sizes[layer] > widest[0]:
            widest = (int(sizes[layer]), i, layer)
    return widest


def _check_time_fits(config: Config, workload: DecodeWorkload, trace: Trace, policies: list[Policy],
                     request: RequestWorkload | None = None, batch: BatchWorkload | None = None,
                     spec: SpecWorkload | None = None, plan: ServePlan | None = None) -> None:
    """An upper bound on the run's simulated time (every operation, expert fetch and host-CPU expert one
    after another) must fit the simulator's integer picoseconds, whatever the keys say."""
    hw = config.hw
    path = fetch_path_timing(hw)
    copy = copy_timing(hw, path)
    bandwidth = gbps_to_bytes_per_s(copy.bandwidth_gbps)
    ops = workload.token_head.duration_ps + sum(
        op.duration_ps for layer in workload.layers for op in (layer.attention, layer.router, layer.dense,
                                                               layer.combine) if op is not None)
    fetch = max(fmt.compute_ps + ns_to_ps(copy.setup_ns) * len(fmt.part_bytes) + ns_to_ps(copy.latency_ns)
                + transfer_ps(fmt.fetch_bytes, bandwidth)
                for fmt in (p.expert_format(workload, hw) for p in policies))
    m = workload.model
    per_token = ops + m.num_moe_layers * (m.top_k * (fetch + host_timing(hw, workload).total_ps)
                                          + ns_to_ps(hw.host_frontend.routing_readback_ns))
    tokens = min(hw.workload.max_tokens or trace.num_tokens, trace.num_tokens)
    total = per_token * tokens
    if batch is not None:  # every step: each token's mixer, each of its experts fetched and run over every token
        tokens = batch.steps * batch.batch
        total = per_token * tokens * batch.batch
    if spec is not None:  # every verify step as a batch of its tokens, and its draft's wait
        tokens = sum(s.tokens for s in spec.steps)
        total = per_token * tokens * (hw.workload.speculative.draft_tokens + 1) + spec.draft_ps * len(spec.steps)
    if request is not None:  # its prefill chunks (each expert over all of a chunk's tokens), then its decode steps
        total = per_token * request.output_tokens
        for chunk in request.chunks:
            chunk_ops = chunk.head.duration_ps + sum(op.duration_ps for layer in chunk.layers for op in (
                layer.mixer, layer.router, layer.dense, layer.combine) if op is not None)
            total += chunk_ops + m.num_moe_layers * m.num_experts * (fetch + request.expert(chunk.tokens).duration_ps)
    if plan is not None:  # every token of every request as a decode token is, after its request's arrival
        sizes = plan.sizes
        tokens = int((sizes.prompt + sizes.output - 1).sum())
        last = int(sizes.arrival_ps[-1]) if sizes.arrival_ps is not None else 0
        a = hw.workload.arrivals
        if a.closed_users:  # each user's requests one after another: its think times, 50 times their mean at most
            last = int(a.think_ms * 1e9 * 50 * -(-sizes.count // a.closed_users))
        total = per_token * tokens + last
    if total >= MAX_SIM_PS:
        keys = "workload.arrivals, workload.requests, " if plan is not None else ""
        raise InputError(f"config: a decode step could take up to {per_token / PS_PER_S:.3g} s of simulated time, "
                         f"so {tokens} tokens could pass the {MAX_SIM_PS / PS_PER_S / 86400:.0f} days of integer "
                         f"picoseconds the simulator keeps; check {keys}the clock, latency and bandwidth keys")


def provenance(prep: Prepared) -> dict:
    """Where a run's results come from: the config and trace (paths and sha256), whether the trace is
    synthetic, the other files the config names (`input_files`), and the simulator code's sha256 and version.
    results.json, sweep.json and timelines carry it."""
    return {
        "config": prep.config.path,
        "config_sha256": prep.config.sha256(),
        "trace": prep.trace.path,
        "trace_sha256": prep.trace.sha256,
        "trace_synthetic": prep.trace.synthetic,
        "input_files": input_files(prep.config.hw),
        "code_sha256": code_sha256(),
        "chipsim_version": __version__,
        **({"policy_files": files} if (files := policy_files(prep)) else {}),
    }


def _check_policy(config: Config, workload: DecodeWorkload, trace: Trace, policy: Policy) -> None:
    """Let a policy reject the config before anything runs: set it up on a throwaway copy (its on_run_start
    checks buffer sizes, HBM room for resident surrogates, ...)."""
    probe = copy.deepcopy(policy)
    probe.on_run_start(Simulation(config.hw, workload, trace, probe, max_tokens=1,
                                  core=core_for(config.hw.run.engine)).context)


# a run of at least this many tokens shows a per-token bar on a terminal (when policies run one after another)
TOKEN_BAR_MIN = 4096


def simulate(prep: Prepared, policy: Policy, record_events: bool = False, record_tokens: int = 0,
             progress: bool = False, observers: Sequence[Observer] = ()) -> SimResult:
    """Run `policy` on the prepared config and trace; `observers` watch the engine (chipsim.sim.observe), and with
    `progress` a long run on a terminal shows a per-token bar."""
    bar = _TokenBar(policy.label) if progress and sys.stderr.isatty() else None
    sim = Simulation(prep.config.hw, prep.workload, prep.trace, policy, max_tokens=prep.config.hw.workload.max_tokens,
                     record_events=record_events, record_tokens=record_tokens, core=core_for(prep.config.hw.run.engine),
                     observers=list(observers) + ([bar] if bar is not None else []),
                     request=prep.request, prefill_policy=prep.prefill_for.get(policy.label), batch=prep.batch,
                     speculative=prep.speculative, served=new_server(prep))
    try:
        return sim.run()
    finally:
        if bar is not None:
            bar.close()


def new_server(prep: Prepared):
    """A fresh server of the prepared requests for one policy's run (None: not a served run)."""
    if prep.served is None:
        return None
    return serve_prep.new_server(prep.config.hw, prep.served, prep.served_costs, prep.trace,
                                 prep.workload.model.num_moe_layers)


class _TokenBar(Observer):
    """A per-token progress bar (tqdm, on stderr) for a run of at least TOKEN_BAR_MIN tokens; nothing for a shorter
    one."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar = None

    def attach(self, sim) -> None:
        if sim.num_tokens >= TOKEN_BAR_MIN and sim.served is None:  # (a served run's steps are not known ahead)
            from tqdm import tqdm

            self.bar = tqdm(total=sim.num_tokens, desc=self.label, unit="token", file=sys.stderr, leave=False)

    def token_end(self, t: int, start: int, end: int) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summarize_result(prep: Prepared, result: SimResult, policy: Policy) -> dict:
    table = EnergyTable.from_config(prep.config.hw)
    warmup = max(prep.config.hw.workload.warmup_tokens, policy.warmup_tokens())
    hw = prep.config.hw
    link = package_link(hw)
    row = summarize(result, table, prep.workload.model.top_k, warmup,
                    link_gbps=components(hw)[link].gbps if link else None, link=link)
    if result.served is not None:
        from chipsim.serve.metrics import SERVED_COLUMNS, per_request, served_summary

        served = served_summary(result, table, prep.slo)
        row.update({key: served[key] for key in SERVED_COLUMNS})
        row["served"] = dict(served, per_request={k: v.tolist() for k, v in per_request(result.served).items()},
                             arrival_ms=(result.served.arrival_ps / 1e9).tolist(),
                             window=result.served.window.tolist())
    return row


_WORKER_PREP: Prepared | None = None


def _run_one(prep: Prepared, policy: Policy, timeline_tokens: int | None = None,
             progress: bool = False) -> tuple[dict, dict | None]:
    """A policy's summary row and, when `timeline_tokens` is given, its timeline of that many tokens (0: all)."""
    if timeline_tokens is None:
        return summarize_result(prep, simulate(prep, policy, progress=progress), policy), None
    result = simulate(prep, policy, record_events=True, record_tokens=timeline_tokens, progress=progress)
    return summarize_result(prep, result, policy), result.timeline.run_data(policy.label)


def _worker_run(index: int, timeline_tokens: int | None = None) -> tuple[dict, dict | None]:
    prep = _WORKER_PREP
    return _run_one(prep, prep.policies[index], timeline_tokens)


def run_policies(prep: Prepared, jobs: int = 0) -> list[dict]:
    """One summary row per policy, in the order given; independent policies run on separate cores."""
    return [row for row, _ in run_policies_with_timelines(prep, jobs)]


class _NoBar:
    """A progress bar that shows nothing: a run with one policy, or not on a terminal, never imports tqdm."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass


def _progress(total: int, show: bool):
    if not (show and total > 1 and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="run", unit="policy", file=sys.stderr,
                disable=not (show and total > 1 and sys.stderr.isatty()))


def run_policies_with_timelines(prep: Prepared, jobs: int = 0, timeline_tokens: int | None = None,
                                progress: bool = False) -> list[tuple[dict, dict | None]]:
    """(summary row, timeline data) per policy, in the order given; timeline data (RecordedTimeline.run_data,
    drawn by chipsim.analysis.timeline) only when `timeline_tokens` is given: the first that many tokens, 0
    for all. Recording leaves the rows as they are. `progress`: a bar of finished policies on stderr when it
    is a terminal."""
    global _WORKER_PREP
    n = len(prep.policies)
    jobs = min(jobs or os.cpu_count() or 1, n)  # never more workers than policies
    if jobs <= 1:
        out = []
        with _progress(n, progress) as bar:
            for policy in prep.policies:
                out.append(_run_one(prep, policy, timeline_tokens, progress))
                bar.update(1)
        return out
    from concurrent.futures import as_completed

    from chipsim.pool import worker_pool  # multiprocessing's import only where there are workers

    _WORKER_PREP = prep  # inherited by forked workers: nothing is pickled but an index
    try:
        # longest first (policies moving each expert as several transfers cost the most), one at a time,
        # so the two cores finish together; results come back in the order given
        order = sorted(range(n), key=lambda i: (-len(prep.policies[i].expert_format(prep.workload, prep.config.hw).part_bytes), i))
        rows = {}
        with worker_pool(jobs) as pool:
            futures = {pool.submit(_worker_run, i, timeline_tokens): i for i in order}
            with _progress(n, progress) as bar:  # its monitor thread starts after the workers are forked
                for fut in as_completed(futures):
                    rows[futures[fut]] = fut.result()
                    bar.update(1)
        return [rows[i] for i in range(n)]
    finally:
        _WORKER_PREP = None
