"""The GPU-validation files' fields read as every input is: a field of the wrong kind, missing, not finite or out of
its range is one InputError, `FILE: dotted.field[i]: problem`, raised when the file is read, before any work.

The measurement files of chipsim hwreplay's decode replays (check_decode_measurement) and the microbenchmark files
(check_microbench, check_op_times) are checked here; each reader names what it reads of them."""

from __future__ import annotations

from chipsim.errors import InputError
from chipsim.values import NON_NEGATIVE, POSITIVE, Bounds, check_value
from chipsim.workload.models import MODELS
from chipsim.workload.op_keys import form_problem

MISSING = object()
WHOLE_POSITIVE = Bounds(minimum=1)


def kind_of(value) -> str:
    """A JSON value's kind for a message, never the whole value (a list may hold thousands of numbers)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if value is MISSING:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _at(where: str, name) -> str:
    if isinstance(name, int):
        return f"{where}[{name}]"
    return f"{where}.{name}" if where else name


def obj(source: str, value, where: str) -> dict:
    """`value` (the field `where` of `source`) as a JSON object."""
    if value is MISSING:
        raise InputError(f"{source}: {where}: missing")
    if not isinstance(value, dict):
        raise InputError(f"{source}: {where + ': ' if where else ''}expected a JSON object, got {kind_of(value)}")
    return value


def items(source: str, value, where: str, min_len: int = 1, what: str = "entries") -> list:
    """`value` as a JSON list of at least `min_len` entries."""
    if value is MISSING:
        raise InputError(f"{source}: {where}: missing")
    if not isinstance(value, list):
        raise InputError(f"{source}: {where}: expected a list of {what}, got {kind_of(value)}")
    if len(value) < min_len:
        need = "a non-empty list" if min_len == 1 else f"a list of at least {min_len}"
        raise InputError(f"{source}: {where}: expected {need} of {what}, got {len(value)}")
    return value


def objects(source: str, value, where: str, min_len: int = 1) -> list[dict]:
    """A JSON list of at least `min_len` objects."""
    rows = items(source, value, where, min_len, "objects")
    for i, row in enumerate(rows):
        obj(source, row, _at(where, i))
    return rows


def text(source: str, value, where: str) -> str:
    """A non-empty string of printable characters (it may land in a comment of a written config)."""
    value = check_value(f"{source}: {where}", value, str)
    if not value.isprintable():
        raise InputError(f"{source}: {where}: expected printable text, got {kind_of(value)}")
    return value


def field(source: str, data: dict, where: str, name: str, tp: type = float, bounds: Bounds = Bounds(),
          default=MISSING):
    """data[name] (data is the field `where` of `source`) read as `tp` within `bounds`; `default` where absent, or
    one line saying it is missing."""
    at = _at(where, name)
    if name not in data:
        if default is MISSING:
            raise InputError(f"{source}: {at}: missing")
        return default
    if tp is str:
        return text(source, data[name], at)
    if tp is list:
        names = check_value(f"{source}: {at}", data[name], list)
        for i, n in enumerate(names):
            text(source, n, _at(at, i))
        return names
    return check_value(f"{source}: {at}", data[name], tp, bounds)


def numbers(source: str, value, where: str, bounds: Bounds = POSITIVE, min_len: int = 1,
            what: str = "numbers") -> list[float]:
    """A JSON list of at least `min_len` finite numbers within `bounds`."""
    xs = items(source, value, where, min_len, what)
    return [check_value(f"{source}: {where}[{i}]", x, float, bounds) for i, x in enumerate(xs)]


# ------------------------------------------------------------------------- decode replays (chipsim hwreplay CONFIG)


def check_decode_measurement(meas: dict, path: str) -> None:
    """Every field of a decode replay's measurement file that chipsim hwcompare reads: the warm-up a whole number
    of tokens; each case's latencies (and every repeat's) finite, positive and more than the warm-up; its bytes,
    plan, energy windows, stalls, spans and host figures of the kinds and ranges the comparison divides by."""
    warm = field(path, meas, "", "warmup_tokens", int, NON_NEGATIVE)
    for name in ("model", "device", "torch", "config"):
        field(path, meas, "", name, str)
    for name in ("overrides", "config_pins"):
        for i, item in enumerate(items(path, meas.get(name, []), name, 0, "KEY=VALUE settings")):
            text(path, item, f"{name}[{i}]")
    shape = MODELS.get(meas["model"])  # a bundled model: its MoE layers bound the stalls' layer (else the plan does)
    for i, case in enumerate(objects(path, meas.get("cases", MISSING), "cases")):
        _check_case(path, case, f"cases[{i}]", warm, shape.num_moe_layers if shape else None)


def _latencies(path: str, value, where: str, warm: int) -> int:
    """A replay's per-token latencies: more than the `warm` warm-up tokens, each finite and positive (ms)."""
    xs = items(path, value, where, 0, "per-token latencies")
    if len(xs) <= warm:
        raise InputError(f"{path}: {where}: {len(xs)} tokens, not more than the {warm} warm-up tokens (warmup_tokens): "
                         "no measured token")
    return len(numbers(path, xs, where))


def _check_case(path: str, case: dict, at: str, warm: int, moe_layers: int | None) -> None:
    field(path, case, at, "context_length", int, WHOLE_POSITIVE)
    field(path, case, at, "policy", str)
    tokens = _latencies(path, case.get("latency_ms", MISSING), f"{at}.latency_ms", warm)
    for j, run in enumerate(items(path, case.get("repeat_latency_ms", []), f"{at}.repeat_latency_ms", 0, "replays")):
        _latencies(path, run, f"{at}.repeat_latency_ms[{j}]", warm)
    numbers(path, case.get("host_enqueue_ms", MISSING), f"{at}.host_enqueue_ms", NON_NEGATIVE, warm + 1)
    for name in ("host_dispatch_ms", "host_dispatch_ahead_ms"):
        numbers(path, case.get(name) or [], f"{at}.{name}", NON_NEGATIVE, 0)
    field(path, case, at, "copied_bytes", int, NON_NEGATIVE)
    plan = obj(path, case.get("plan", MISSING), f"{at}.plan")
    field(path, plan, f"{at}.plan", "fetch_bytes", int, NON_NEGATIVE)
    field(path, plan, f"{at}.plan", "digest", str)
    field(path, case, at, "copy_streams", int, WHOLE_POSITIVE, 1)
    field(path, case, at, "kernel_launch", str, default="eager")
    windows = [("energy", case.get("energy"))] + [
        (f"repeat_energy[{j}]", w) for j, w in enumerate(items(path, case.get("repeat_energy", []),
                                                               f"{at}.repeat_energy", 0, "energy windows"))]
    for name, window in windows:
        if window is not None:
            _check_energy_window(path, obj(path, window, f"{at}.{name}"), f"{at}.{name}")
    _check_stalls(path, case, at, tokens, moe_layers)
    _check_spans(path, case, at, warm)
    if field(path, case, at, "host_experts", int, NON_NEGATIVE, 0):
        for name in ("host_compute_us_median", "host_roundtrip_us_median"):
            field(path, case, at, name, float, POSITIVE)


def _check_spans(path: str, case: dict, at: str, warm: int) -> None:
    """--op-spans: one [ms inside compute steps, steps] pair per token, more than the warm-up's."""
    where = f"{at}.op_span_ms"
    spans = items(path, case.get("op_span_ms") or [], where, 0, "[ms, steps] pairs")
    if spans:
        items(path, spans, where, warm + 1, "[ms, steps] pairs")
    for j, span in enumerate(spans):
        if not isinstance(span, list) or len(span) != 2:
            raise InputError(f"{path}: {where}[{j}]: expected [ms, steps], got {kind_of(span)}")
        check_value(f"{path}: {where}[{j}][0]", span[0], float, NON_NEGATIVE)


def _check_energy_window(path: str, window: dict, at: str) -> None:
    """A replay's energy window (nvml.Meter): its joules and seconds positive, its powers at least 0."""
    if not window:
        return
    field(path, window, at, "energy_j", float, POSITIVE)
    field(path, window, at, "seconds", float, POSITIVE)
    field(path, window, at, "power_w", float, NON_NEGATIVE)
    field(path, window, at, "idle_w", float, NON_NEGATIVE, None)


def _check_stalls(path: str, case: dict, at: str, tokens: int, moe_layers: int | None) -> None:
    """--stalls: [token, MoE layer, ms] triples, the token one of the replay's, the layer one of the model's."""
    where = f"{at}.stall_ms"
    for j, row in enumerate(items(path, case.get("stall_ms", []), where, 0, "[token, layer, ms] triples")):
        row = items(path, row, f"{where}[{j}]", 3, "[token, layer, ms]")
        if len(row) != 3:
            raise InputError(f"{path}: {where}[{j}]: expected [token, layer, ms], got a list of {len(row)}")
        check_value(f"{path}: {where}[{j}][0]", row[0], int, Bounds(minimum=0, maximum=tokens - 1))
        check_value(f"{path}: {where}[{j}][1]", row[1], int,
                    Bounds(minimum=0, maximum=None if moe_layers is None else moe_layers - 1))
        check_value(f"{path}: {where}[{j}][2]", row[2], float, NON_NEGATIVE)


# ----------------------------------------------------------------------------- microbenchmarks (microbench --out)


FITS = ("gemv_fit", "h2d_pinned_queued16_fit", "h2d_pinned_single_fit")


def check_microbench(mb, source: str, kernel_launch: str | None = None, report: bool = False) -> dict:
    """The microbenchmark file's fields a config is written from (gpuconfig, `kernel_launch`: the tiny kernel's
    time the replay launches with is needed) or reported (`report`: hwcompare's table also shows the pageable copy,
    the eager chain and the queued copies' curve)."""
    mb = obj(source, mb, "")
    m = obj(source, mb.get("machine", MISSING), "machine")
    field(source, m, "machine", "gpu", str)
    field(source, m, "machine", "sm_count", int, WHOLE_POSITIVE)
    field(source, m, "machine", "gpu_memory_gib", float, POSITIVE)
    for name in ("torch", "cuda"):
        field(source, m, "machine", name, str)
    for name in ("host_cpu", "nvidia_smi"):
        field(source, m, "machine", name, str, default=None)
    field(source, m, "machine", "host_cpus", int, WHOLE_POSITIVE, None)
    field(source, m, "machine", "host_memory_gib", float, POSITIVE, None)
    for name in FITS:
        fit = obj(source, mb.get(name, MISSING), name)
        field(source, fit, name, "bandwidth_gbps", float, POSITIVE)
        field(source, fit, name, "intercept_us", float, NON_NEGATIVE)
    if mb["h2d_pinned_single_fit"]["intercept_us"] < mb["h2d_pinned_queued16_fit"]["intercept_us"]:
        raise InputError(f"{source}: h2d_pinned_single_fit.intercept_us: below h2d_pinned_queued16_fit's (a copy "
                         "alone cannot start sooner than one queued behind others; links.pcie.latency_ns is their "
                         "difference)")
    _check_launches(mb, source, kernel_launch, report)
    if report:
        for i, row in enumerate(objects(source, mb.get("h2d_pageable", MISSING), "h2d_pageable")):
            field(source, row, f"h2d_pageable[{i}]", "gbps", float, POSITIVE)
        for i, row in enumerate(objects(source, mb.get("h2d_pinned_queued16", MISSING), "h2d_pinned_queued16")):
            field(source, row, f"h2d_pinned_queued16[{i}]", "bytes", int, WHOLE_POSITIVE)
            field(source, row, f"h2d_pinned_queued16[{i}]", "us_per_copy", float, POSITIVE)
    check_op_times(mb, source, ("graph_us", "eager_us") if report else
                   ("eager_us" if kernel_launch == "eager" else "graph_us",) if kernel_launch else ())
    return mb


def _check_launches(mb: dict, source: str, kernel_launch: str | None, report: bool) -> None:
    """tiny_kernels and graph_launch: a number where one is given (a file may say why one was not measured), a number
    where the config or the report needs one."""
    tiny = obj(source, mb.get("tiny_kernels", MISSING), "tiny_kernels")
    field(source, tiny, "tiny_kernels", "gpu_us_per_kernel", float, POSITIVE)
    field(source, tiny, "tiny_kernels", "queued_kernels", int, WHOLE_POSITIVE, None)
    if report:
        field(source, tiny, "tiny_kernels", "eager_chain_us_per_kernel", float, POSITIVE)
    graph = kernel_launch == "graph"
    launch = obj(source, mb.get("graph_launch", {} if not graph else MISSING), "graph_launch")
    for data, where, name in ((tiny, "tiny_kernels", "graph_us_per_kernel"),
                              (launch, "graph_launch", "us_per_one_kernel_graph")):
        value = data.get(name, MISSING)
        if graph or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            field(source, data, where, name, float, POSITIVE)


def check_op_times(mb: dict, source: str, required: tuple = ()) -> list[dict]:
    """A microbenchmark file's op_times: each row's key written as op_key writes one and listed once, its users
    named, its times (`required`: those that must be there) finite and positive (0 only for a primitive fused into
    another kernel); op_times_from's names printable (they land in a config's comments)."""
    rows = objects(source, obj(source, mb, "").get("op_times", []), "op_times", 0)
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        at = f"op_times[{i}]"
        key = field(source, row, at, "key", str)
        problem = form_problem(key)
        if problem:
            raise InputError(f"{source}: {at}.key: {key!r}: {problem}")
        if key in first:
            raise InputError(f"{source}: {at}.key: {key!r} is listed twice (first at op_times[{first[key]}])")
        first[key] = i
        field(source, row, at, "users", list)
        for name in ("eager_us", "graph_us"):
            if name in row or name in required:
                field(source, row, at, name, float, NON_NEGATIVE if row.get("fused") else POSITIVE)
        field(source, row, at, "kernel_us", float, POSITIVE, None)
    _check_printable(source, mb.get("op_times_from", {}), "op_times_from")
    return rows


def _check_printable(source: str, value, where: str) -> None:
    """Every string under `value` printable (no line break to end a config comment early)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_printable(source, v, _at(where, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_printable(source, v, _at(where, i))
    elif isinstance(value, str):
        text(source, value, where)


# ------------------------------------------------------------------ kernels' energy alone (probe_op_energy.py)


def check_op_energy(probe, source: str) -> dict:
    """validation/energy/probe_op_energy.py's windows: idle ones and one per kernel shape (its key, calls and kernels
    per call), each window's energy and seconds finite and positive; a shape fused into others (no window of its own)
    named by its key."""
    probe = obj(source, probe, "")
    windows = objects(source, probe.get("windows", MISSING), "windows")
    kinds = set()
    for i, w in enumerate(windows):
        at = f"windows[{i}]"
        kind = field(source, w, at, "kind", str)
        kinds.add(kind)
        if kind in ("idle", "op"):
            field(source, w, at, "energy_j", float, POSITIVE)
            field(source, w, at, "seconds", float, POSITIVE)
        if kind in ("op", "fused"):
            key = field(source, w, at, "key", str)
            if form_problem(key):
                raise InputError(f"{source}: {at}.key: {key!r}: {form_problem(key)}")
            for j, user in enumerate(items(source, w.get("users", []), f"{at}.users", 0, "names")):
                text(source, user, f"{at}.users[{j}]")
        if kind == "op":
            field(source, w, at, "calls", int, WHOLE_POSITIVE)
            field(source, w, at, "kernels_per_call", int, WHOLE_POSITIVE)
    for need in ("idle", "op"):
        if need not in kinds:
            raise InputError(f"{source}: windows: no '{need}' window (validation/energy/probe_op_energy.py writes "
                             "them)")
    return probe


def check_gemv_probe(probe, source: str) -> dict:
    """validation/compute/probe_sm.py --gemv: each GEMV shape's key, its programs and both kernels' times."""
    probe = obj(source, probe, "")
    for i, row in enumerate(objects(source, probe.get("gemv_in_graph", MISSING), "gemv_in_graph")):
        at = f"gemv_in_graph[{i}]"
        key = field(source, row, at, "key", str)
        if not key.startswith("matvec ") or form_problem(key):
            raise InputError(f"{source}: {at}.key: {key!r}: not of the form 'matvec rR oO bB'")
        field(source, row, at, "programs", int, WHOLE_POSITIVE)
        for name in ("triton_us", "cublas_us"):
            field(source, row, at, name, float, POSITIVE)
    return probe
