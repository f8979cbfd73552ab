"""Parameter sweeps: the cross product of config-key grids × policies, run in parallel, cached by content.

`run_sweep` (and `chipsim sweep`) takes a config, a grid {dotted.key: [values]} and policies, and

1. builds every point of the cross product (grid order: the first key varies slowest) and `prepare()`s each
   one before anything runs, so a bad key or value is an `InputError` naming the grid key and value, and
   nothing is written;
2. gives each (point, policy) a content address: sha256 of the resolved config dict, the trace file's
   sha256, the simulator code's sha256 and the policy label. A result already in `DIR/cache/<hash>.json`
   is reused; the rest are simulated, one task per (point, policy), on a local process pool
   (`backend="process"`) or on a Dask distributed cluster (`backend="dask"`: an existing one at `scheduler`,
   or a `LocalCluster` on 127.0.0.1);
3. writes `DIR/results.csv` (one row per point and policy, in grid order then policy order: a column per
   swept key, `point_id`, then `report.csv_columns`: the `chipsim run --out` columns and every other scalar
   field of the `--json` rows) and `DIR/sweep.json` (grid, config and code hashes,
   the trace hash of every point, every row in full, per-layer breakdowns included). Both are
   deterministic: the same inputs give the same bytes, whichever backend ran them and whether rows were
   simulated or reused.

Workers re-read the config and trace from the paths given (a remote Dask cluster needs them at the same
paths) and report the hashes they saw; a mismatch with what was validated here is an error, never a
silently mislabelled cache entry.
"""

from __future__ import annotations

import contextlib
import signal
import hashlib
import itertools
import json
import operator
import os
import sys
import time

import pandas as pd

from chipsim import __version__, cache, runner
from chipsim.analysis.report import CSV_COLUMNS, _json_safe, csv_cell, csv_columns, to_csv, to_json
from chipsim.errors import InputError
from chipsim.files import check_output_dir, write_atomic
from chipsim.pool import worker_pool
from chipsim.hw.config import load_config, memory_tiers, parse_set, yaml_text
from chipsim.hw.paths import memory_timing
from chipsim.runner import prepare, provenance, simulate, summarize_result

BACKENDS = ("process", "dask")


# ---------------------------------------------------------------------------------------------- grid input
def _split_values(text: str) -> list[str]:
    """'16,64,[a, b],"x,y"' -> ['16', '64', '[a, b]', '"x,y"']: commas inside brackets or quotes stay."""
    out, cur, depth, quote = [], [], 0, None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            cur.append(ch)
        elif ch in "[{":
            depth += 1
            cur.append(ch)
        elif ch in "]}":
            depth -= 1
            cur.append(ch)
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [v.strip() for v in out]


def parse_grid_arg(text: str) -> tuple[str, list]:
    """'links.pcie.bandwidth_gbps=16,64,256' -> ('links.pcie.bandwidth_gbps', [16, 64, 256]); each value is
    read like a `--set` value (a YAML scalar)."""
    if "=" not in text:
        raise InputError(f"--grid {text}: expected KEY=V1,V2,...")
    key, _, values = text.partition("=")
    key = key.strip()
    if not key or not all(key.split(".")):
        raise InputError(f"--grid {text}: empty part in key '{key}'")
    if not values.strip():
        raise InputError(f"--grid {text}: no values (expected KEY=V1,V2,...)")
    parsed = []
    for item in _split_values(values):
        if not item:
            raise InputError(f"--grid {text}: empty value in the list")
        parsed.append(parse_set(f"{key}={item}")[1])
    return key, parsed


def parse_grid_args(texts) -> dict[str, list]:
    grid: dict[str, list] = {}
    for text in texts or ():
        key, values = parse_grid_arg(text)
        if key in grid:
            raise InputError(f"--grid {key}: given twice")
        grid[key] = values
    return grid


def _plain(value):
    """numpy scalars and arrays (a grid built with numpy) -> plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _check_grid(grid) -> dict[str, list]:
    if grid is None:
        return {}
    if not isinstance(grid, dict):
        raise InputError("grid: expected a mapping {dotted.key: [values]}")
    out = {}
    for key, values in grid.items():
        if not isinstance(key, str) or not key or not all(key.split(".")):
            raise InputError(f"--grid {key!r}: expected a dotted config key")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise InputError(f"--grid {key}={values!r}: expected a list of values")
        values = [_plain(v) for v in values]
        if not values:
            raise InputError(f"--grid {key}=: no values")
        for i, v in enumerate(values):
            if v in values[:i]:
                raise InputError(f"--grid {key}={csv_cell(v)}: value given twice")
        out[key] = values
    return out


def _assignment(key: str, value) -> str:
    if key == "workload.trace" and isinstance(value, str):
        value = os.path.abspath(value)  # relative to the caller's directory, as with --set; workers may differ
    return f"{key}={yaml_text(key, value)}"


def _absolute_overrides(overrides) -> list[str]:
    out = []
    for text in overrides or ():
        parts, value = parse_set(text)
        if parts == ["workload", "trace"] and isinstance(value, str):
            text = f"workload.trace={yaml_text('workload.trace', os.path.abspath(value))}"
        out.append(text)
    return out


# ---------------------------------------------------------------------------------------------- tasks
def _json_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _normalize(row: dict) -> dict:
    """A row as it reads back from JSON: fresh and cached rows are then the same objects, bit for bit."""
    return json.loads(json.dumps(_json_safe(row), sort_keys=True, default=_json_default))


def _run_task(task: dict) -> dict:
    """Simulate one (point, policy). Runs in a worker: everything it needs is in `task` (paths, not objects)."""
    prep = prepare(task["config"], task["overrides"], [task["policy_spec"]])
    policy = prep.policies[0]
    row = summarize_result(prep, simulate(prep, policy), policy)
    prov = provenance(prep)
    return {"row": _normalize(row), "label": policy.label, "inputs_sha256": _inputs_sha256(prov["input_files"]),
            **{k: prov[k] for k in ("config_sha256", "trace_sha256", "code_sha256")}}


def _calibrate(task: dict) -> None:
    """A point's memories calibrated by the command-level DRAM model (cached on disk by chipsim.dramsim.calibrate),
    in a worker; a point that is bad input is left to `_prepare_points`, which names the problem."""
    try:
        hw = load_config(task["config"], task["overrides"]).hw
        for name in memory_tiers(hw):
            memory_timing(hw, name)
    except InputError:
        pass


def _inputs_sha256(input_files: dict) -> dict:
    """The contents of the files a config names (runner.input_files: its DRAM standards), dotted key -> sha256."""
    return {key: f["sha256"] for key, f in input_files.items()}


def _task_key(config_raw: dict, trace_sha: str, inputs_sha: dict, code_sha: str, label: str) -> str:
    """A result's cache key: everything that changes it (the config, the contents of the trace and of the other
    files the config names, the code, the policy)."""
    blob = json.dumps({"config": config_raw, "trace_sha256": trace_sha, "inputs_sha256": inputs_sha,
                       "code_sha256": code_sha, "policy": label}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def check_row(entry, label: str | None = None) -> None:
    """A cached sweep result is usable: its inputs name the policy `label` (when given) as its row does, the row
    has every CSV column, each a finite number >= 0 (or null: undefined for the run) but the policy and the expert
    link's name, and no number anywhere in it is NaN or infinite; raises cache.BadEntry."""
    cache.mapping(entry, "entry", ["inputs", "row"])
    inputs = cache.mapping(entry["inputs"], "inputs", ["config_sha256", "trace_sha256", "inputs_sha256", "code_sha256",
                                                     "policy"])
    row = cache.mapping(entry["row"], "row")
    if label is not None and inputs["policy"] != label:
        raise cache.BadEntry(f"inputs.policy: {str(inputs['policy'])[:40]!r}, expected {label!r}")
    if row.get("policy") != inputs["policy"]:
        raise cache.BadEntry(f"row.policy: {str(row.get('policy'))[:40]!r}, expected {inputs['policy']!r}")
    for column in CSV_COLUMNS[1:]:
        if column not in row:
            raise cache.BadEntry(f"row.{column}: missing")
        if column == "expert_link":  # a component's name ("" where experts cross no link)
            if not isinstance(row[column], str) or len(row[column]) > 64:
                raise cache.BadEntry(f"row.{column}: not a component name")
        elif row[column] is not None:
            cache.number(row[column], f"row.{column}", low=0)
    _check_finite(row, "row")


def _check_finite(value, where: str) -> None:
    if isinstance(value, float):
        cache.number(value, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")


def _read_cache(path: str, key: str, label: str) -> dict | None:
    """The cached row of (point, policy) `key`, or None: absent, or not usable (noted), so simulated again."""
    entry = cache.read(path, "sweep", key, lambda e: check_row(e, label))
    return None if entry is None else entry["row"]


# ---------------------------------------------------------------------------------------------- validation
def _point_error(config_path, base_overrides, policies, point: dict, exc: InputError) -> InputError:
    """Name the grid key and value that made a point fail (or the combination, or the base config)."""
    specs = list(policies or ())

    def error_of(assignments):
        try:
            prepare(config_path, base_overrides + assignments, specs)
        except InputError as e:
            return str(e)
        return None

    base_error = None
    base_checked = False
    for key, value in point.items():
        err = error_of([_assignment(key, value)])
        if err is None:
            continue
        if not base_checked:
            base_error, base_checked = error_of([]), True
        if err != base_error:
            return InputError(f"--grid {key}={csv_cell(value)}: {err}")
    if not base_checked:
        base_error = error_of([])
    if base_error is not None and base_error == str(exc):
        return exc  # the config, --set or --policy itself
    where = ", ".join(f"{k}={csv_cell(v)}" for k, v in point.items())
    return InputError(f"--grid point {where}: {exc}")


def _cost_hint(prep, policy) -> float:
    """Relative run time, to start the longest tasks first: tokens × MoE layers × transfers per expert
    (policies moving each expert as several transfers cost the most, as in `runner.run_policies`)."""
    try:
        tokens = prep.config.hw.workload.max_tokens or prep.trace.num_tokens
        tokens = min(tokens, prep.trace.num_tokens)
        parts = len(policy.expert_format(prep.workload, prep.config.hw).part_bytes)
        return float(tokens * prep.trace.num_moe_layers * parts)
    except Exception:  # only an ordering hint: never a reason to fail
        return 0.0


def _prepare_points(config_path, base_overrides, policies, grid):
    points = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    notes: list[str] = []  # each point's prepare() notes, once each
    code_sha = runner.code_sha256()  # through the module: a test may stand in another code hash
    prepared = []
    for point_id, point in enumerate(points):
        overrides = base_overrides + [_assignment(k, v) for k, v in point.items()]
        try:
            prep = prepare(config_path, overrides, list(policies or ()))
        except InputError as exc:
            raise _point_error(config_path, base_overrides, policies, point, exc) from None
        specs = list(policies) if policies else list(prep.config.hw.run.policies)
        prov = provenance(prep)
        inputs_sha = _inputs_sha256(prov["input_files"])
        outside = prov.get("policy_files", {})  # a policy file of the user's: its edits are new keys too
        entries = []
        for spec, policy in zip(specs, prep.policies):
            key_code = code_sha + (":" + outside[policy.label]["sha256"] if policy.label in outside else "")
            entries.append({
                "label": policy.label,
                "cost": _cost_hint(prep, policy),
                "key": _task_key(prep.config.raw, prep.trace.sha256, inputs_sha, key_code, policy.label),
                "task": {"config": config_path, "overrides": overrides, "policy_spec": spec},
            })
        notes.extend(n for n in prep.notes if n not in notes)
        prepared.append({"point_id": point_id, "values": point,
                         **{k: prov[k] for k in ("config_sha256", "trace", "trace_sha256", "trace_synthetic",
                                                 "input_files")},
                         **({"policy_files": outside} if outside else {}),
                         "entries": entries})
    return prepared, code_sha, notes


# ---------------------------------------------------------------------------------------------- backends
def _progress_bar(total: int, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="sweep", unit="run", file=sys.stderr,
                disable=not (progress and total and sys.stderr.isatty()))


def _run_process(tasks: dict, jobs: int, on_done, progress: bool) -> None:
    """Run here (one worker) or on a pool of forked processes (they inherit the loaded modules and traces;
    unlike spawn or forkserver, they never re-import the caller's __main__, so an unguarded script works).
    As in `runner.run_policies`, Python starts every forked worker at the first submit, before any thread of
    the pool's own, and the progress bar (a monitor thread) is made only after that."""
    if jobs <= 1 or len(tasks) == 1:
        with _progress_bar(len(tasks), progress) as bar:
            for key, task in tasks.items():
                on_done(key, _run_task(task))
                bar.update(1)
        return
    from concurrent.futures import as_completed

    with worker_pool(jobs) as pool:  # on an interrupt or a failed task the workers are stopped at once
        futures = {pool.submit(_run_task, task): key for key, task in tasks.items()}
        with _progress_bar(len(tasks), progress) as bar:
            for fut in as_completed(futures):
                on_done(futures[fut], fut.result())
                bar.update(1)


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except Exception:  # psutil.Error: gone, or not ours to read
        return []


def _run_dask(tasks: dict, jobs: int, scheduler: str | None, on_done, progress: bool) -> None:
    try:
        import logging

        import psutil  # a dependency of distributed
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InputError("--backend dask needs dask.distributed: pip install -e '.[dist]'") from None
    with contextlib.ExitStack() as stack:
        local_processes = []
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            except (OSError, TimeoutError, ValueError) as exc:
                raise InputError(f"--scheduler {scheduler}: cannot connect ({type(exc).__name__}: {exc})") from None
        else:
            # loopback only, no dashboard: nothing of this listens beyond this machine. SIGINT is blocked while the
            # cluster starts: its threads inherit the mask, and so does every worker process they start (now or
            # on a restart). A Ctrl-C on the terminal reaches the whole process group and only this process
            # answers it (the workers' own handlers would print tracebacks as they die).
            before = set(psutil.Process().children(recursive=True))
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                cluster = stack.enter_context(LocalCluster(
                    n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                    dashboard_address=None, silence_logs=logging.CRITICAL))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            # multiprocessing's resource tracker stays: killed, a new one would be started at exit and complain
            local_processes = [p for p in psutil.Process().children(recursive=True)
                               if p not in before and "resource_tracker" not in " ".join(_cmdline(p))]
            client = stack.enter_context(Client(cluster))
        futures = {client.submit(_run_task, task, key=f"chipsim-sweep-{key}", pure=False): key
                   for key, task in tasks.items()}
        try:
            with _progress_bar(len(tasks), progress) as bar:
                for fut in as_completed(list(futures)):
                    on_done(futures[fut], fut.result())
                    bar.update(1)
        except BaseException:
            # Ctrl-C or a failed task: our local workers hold nothing to save; stop them at once (a graceful close
            # of busy workers takes seconds), then close the cluster with SIGINT ignored, so that a second Ctrl-C
            # cannot break the close half-way, nor reach a process it starts
            if local_processes:
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    for nanny in cluster.workers.values():
                        nanny.auto_restart = False
                    for proc in local_processes:
                        with contextlib.suppress(psutil.Error):
                            proc.kill()
                    psutil.wait_procs(local_processes, timeout=1.0)
                    stack.close()
                finally:
                    signal.signal(signal.SIGINT, previous)
            raise


# ---------------------------------------------------------------------------------------------- outputs
# ---------------------------------------------------------------------------------------------- API
def run_sweep(config_path: str, grid: dict[str, list], policies: list[str] | None, out_dir: str,
              overrides=(), jobs=0, backend="process", scheduler=None, progress=True,
              cache_dir: str | None = None) -> pd.DataFrame:
    """Run every (point of the grid's cross product, policy) and return the results table.

    config_path: base config (YAML); grid: {dotted config key (any, incl. `policies.<name>.<param>` and
    `workload.trace`): [values]}; policies: specs as for `chipsim run --policy` (None: each point's
    `run.policies`); out_dir: gets results.csv, sweep.json and cache/; overrides: `--set` strings applied
    before the grid; jobs: parallel workers (0: os.cpu_count()); backend: "process" or "dask" (scheduler:
    address of an existing Dask scheduler; None: a LocalCluster on 127.0.0.1); progress: a tqdm bar on
    stderr when it is a terminal; cache_dir: where results are cached by content (default DIR/cache; sweeps
    that share one reuse each other's points, as `chipsim reproduce`'s experiments do).

    Returns the table of results.csv (same columns and order); `df.attrs` holds `simulated` and `reused`
    (distinct (point, policy) results computed now / taken from DIR/cache) and `points`.
    Raises InputError (one line) on any bad input before anything is simulated or written.
    """
    t0 = time.perf_counter()
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    if scheduler and backend != "dask":
        raise InputError(f"--scheduler {scheduler}: needs --backend dask")
    if isinstance(policies, str):
        policies = [policies]
    if policies is not None and not policies:
        policies = None
    try:
        jobs = operator.index(jobs) if not isinstance(jobs, bool) else -1
    except TypeError:
        jobs = -1
    if jobs < 0:
        raise InputError("--jobs: expected a whole number >= 0 (0: one worker per core)")
    if not out_dir:
        raise InputError("--out: a directory is required")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"--out {out_dir}: exists and is not a directory")
    grid = _check_grid(grid)
    config_path = os.path.abspath(config_path)
    base_overrides = _absolute_overrides(overrides)

    return _sweep(config_path, grid, policies, out_dir, base_overrides, jobs, backend, scheduler, progress, t0,
                  cache_dir or os.path.join(out_dir, "cache"))


def _new_dirs(path: str) -> list[str]:
    """The folders os.makedirs(path) would create, deepest first."""
    out = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        out.append(path)
        path = os.path.dirname(path)
    return out


def _remove_if_empty(dirs: list[str]) -> None:
    """Remove each of `dirs` (deepest first) that is empty: what a failed sweep made and left nothing in."""
    for d in dirs:
        with contextlib.suppress(OSError):
            os.rmdir(d)


@contextlib.contextmanager
def _sweep_lock(out_dir: str):
    """One sweep at a time writes a directory: a second (another grid, or the same one) is refused, rather
    than the two overwriting each other's results.csv and sweep.json. The lock (an flock on
    DIR/.sweep.lock) goes with the process, however it ends. A sweep that fails (an error, Ctrl-C) removes
    the lock file and the folders it created, unless they hold results."""
    import fcntl

    new_dirs = _new_dirs(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    lock_path = os.path.join(out_dir, ".sweep.lock")
    new_lock = not os.path.exists(lock_path)
    with open(lock_path, "a", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"--out {out_dir}: another chipsim sweep is writing there; wait for it to end "
                             "or choose another directory") from None
        try:
            yield
        except BaseException:
            if new_lock:  # still held: no other sweep can have taken it
                with contextlib.suppress(OSError):
                    os.unlink(lock_path)
            _remove_if_empty(new_dirs)
            raise


class _Pending:
    """The (point, policy) results a sweep needs and cache_dir does not hold yet, with what each must match."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict] = {}  # key -> task (paths, not objects)
        self.costs: dict[str, float] = {}
        self.labels: dict[str, str] = {}
        self.expected: dict[str, tuple] = {}  # key -> (config, trace, named files sha256)

    def add(self, points: list[dict], cache_dir: str, results: dict[str, dict]) -> None:
        """Every entry of `points` goes into `results` (from the cache) or here (to simulate), once per key."""
        for point in points:
            for entry in point["entries"]:
                key = entry["key"]
                if key in results or key in self.tasks:
                    continue
                cached = _read_cache(cache.entry_path(cache_dir, key), key, entry["label"])
                if cached is not None:
                    results[key] = cached
                else:
                    self.tasks[key] = entry["task"]
                    self.costs[key] = entry["cost"]
                    self.labels[key] = entry["label"]
                    self.expected[key] = (point["config_sha256"], point["trace_sha256"],
                                          _inputs_sha256(point["input_files"]))

    def run(self, cache_dir: str, code_sha: str, jobs: int, backend: str, scheduler, progress: bool,
            results: dict[str, dict]) -> None:
        """Simulate them (longest first), each result checked against what was planned, cached and put in
        `results`."""
        if not self.tasks:
            return

        def on_done(key: str, out: dict) -> None:
            config_sha, trace_sha, inputs_sha = self.expected[key]
            if out["code_sha256"] != code_sha:
                raise InputError(f"--backend {backend}: a worker runs different chipsim code (sha256 "
                                 f"{out['code_sha256'][:12]}, here {code_sha[:12]}): install the same version "
                                 "everywhere")
            if (out["config_sha256"] != config_sha or out["trace_sha256"] != trace_sha
                    or out["inputs_sha256"] != inputs_sha or out["label"] != self.labels[key]):
                raise InputError(f"{self.tasks[key]['config']}: config, trace or a file it names changed (or differs "
                                 "on a worker) while the sweep ran; run it again")
            row = out["row"]
            entry = {"inputs": {"config_sha256": config_sha, "trace_sha256": trace_sha, "inputs_sha256": inputs_sha,
                                "code_sha256": code_sha, "policy": self.labels[key]}, "row": row}
            # as results.json writes it: an undefined value (NaN) is null
            cache.write(cache.entry_path(cache_dir, key), "sweep", key, _json_safe(entry))
            results[key] = row

        workers = min(jobs or os.cpu_count() or 1, len(self.tasks))
        # longest first, so the workers finish together (the order of the outputs is fixed elsewhere, not by this)
        ordered = dict(sorted(self.tasks.items(), key=lambda kv: -self.costs[kv[0]]))
        if backend == "dask":
            _run_dask(ordered, workers, scheduler, on_done, progress)
        else:
            _run_process(ordered, workers, on_done, progress)


def fill_cache(sweeps: list[tuple[str, dict, list[str] | None, list[str]]], cache_dir: str, jobs: int = 0,
               progress: bool = True, rows_out: list | None = None) -> int:
    """Simulate what several sweeps (config path, grid, policies, overrides) need and cache_dir lacks, all in one
    pool (a point two of them share once), so that running each sweep then only reads the cache: the workers
    stay busy from the first task to the last instead of idling at the end of every sweep. The points' DRAM
    calibrations run first, in a pool of their own, rather than one by one where the points are prepared.
    Returns the number of results simulated. Bad input raises InputError, as run_sweep. `rows_out`, where given,
    gets one list per sweep of its rows as its sweep.json will hold them ({"point_id", "values", ...the result})."""
    code_sha = runner.code_sha256()
    normal = [(os.path.abspath(config_path), _check_grid(grid), list(policies) if policies else None,
               _absolute_overrides(overrides)) for config_path, grid, policies, overrides in sweeps]
    # the points' DRAM calibrations first, in the pool too: preparing a point (below, here) runs any it lacks
    calibrations = {}
    for config_path, grid, _, overrides in normal:
        for combo in itertools.product(*grid.values()):
            task = {"config": config_path, "overrides": overrides + [_assignment(k, v) for k, v in zip(grid, combo)]}
            calibrations[json.dumps(task, sort_keys=True)] = task
    if len(calibrations) > 1 and jobs != 1:
        with worker_pool(min(jobs or os.cpu_count() or 1, len(calibrations))) as pool:
            list(pool.map(_calibrate, calibrations.values()))
    pending = _Pending()
    results: dict[str, dict] = {}
    planned = []
    for config_path, grid, policies, overrides in normal:
        points, _, _ = _prepare_points(config_path, overrides, policies, grid)
        pending.add(points, cache_dir, results)
        planned.append(points)
    os.makedirs(cache_dir, exist_ok=True)
    pending.run(cache_dir, code_sha, jobs, "process", None, progress, results)
    if rows_out is not None:
        rows_out += [[{"point_id": point["point_id"], "values": point["values"], **results[entry["key"]]}
                      for point in points for entry in point["entries"]] for points in planned]
    return len(pending.tasks)


def _sweep(config_path, grid, policies, out_dir, base_overrides, jobs, backend, scheduler, progress, t0, cache_dir):
    points, code_sha, notes = _prepare_points(config_path, base_overrides, policies, grid)
    check_output_dir(out_dir, ("results.csv", "sweep.json"), "--out")
    with _sweep_lock(out_dir):
        try:
            base_sha = load_config(config_path, base_overrides).sha256()
        except InputError:
            base_sha = None  # only the grid makes it valid (e.g. it sweeps the trace)

        # everything checked: from here on files are written
        new_cache_dirs = _new_dirs(cache_dir)
        os.makedirs(cache_dir, exist_ok=True)
        results: dict[str, dict] = {}
        pending = _Pending()
        pending.add(points, cache_dir, results)
        reused = len(results)
        try:
            pending.run(cache_dir, code_sha, jobs, backend, scheduler, progress, results)
        except BaseException:
            _remove_if_empty(new_cache_dirs)  # a backend that never started leaves no empty cache behind
            raise

        ordered = [(point, entry, results[entry["key"]]) for point in points for entry in point["entries"]]
        columns = list(grid) + ["point_id"] + csv_columns([row for _, _, row in ordered])
        table_rows, json_rows = [], []
        for point, entry, row in ordered:
            table_rows.append({**point["values"], "point_id": point["point_id"], **row})
            json_rows.append({"point_id": point["point_id"], "values": point["values"], "cache_key": entry["key"],
                              **row})
        info = {
            "config": config_path,
            "config_sha256": base_sha,
            "overrides": base_overrides,
            "grid": grid,
            "policies": list(policies) if policies else None,
            "code_sha256": code_sha,
            "chipsim_version": __version__,
            "columns": columns,
            "points": [{k: v for k, v in p.items() if k != "entries"} | {"policies": [e["label"] for e in p["entries"]]}
                       for p in points],
            "results": json_rows,
        }
        write_atomic(os.path.join(out_dir, "sweep.json"), to_json(info))
        write_atomic(os.path.join(out_dir, "results.csv"), to_csv(table_rows, columns))

        df = pd.DataFrame([{c: r.get(c) for c in columns} for r in table_rows], columns=columns)
        df.attrs.update({"simulated": len(pending.tasks), "reused": reused, "points": len(points), "notes": notes,
                         "rows": len(table_rows), "seconds": time.perf_counter() - t0})
        return df
