"""The `chipsim` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import threading

from chipsim import __version__
from chipsim.errors import InputError, OneLineParser


def _cmd_run(args) -> int:
    from chipsim.analysis import report
    from chipsim.hw.paths import fetch_path_timing
    from chipsim.runner import prepare, provenance, run_policies_with_timelines

    if args.timeline_tokens < 0:
        raise InputError(f"--timeline-tokens {args.timeline_tokens}: must be 0 (all tokens) or more")
    _check_jobs(args.jobs)
    _check_outputs(args.out, args.timeline)
    overrides = list(args.set or ()) + ([f"run.engine={args.engine}"] if args.engine else [])
    from chipsim.serve.metrics import parse_slo

    slo = parse_slo(args.slo)
    prep = prepare(args.config, overrides, args.policy or (), args.trace)
    if slo and prep.served is None:
        raise InputError(f"--slo {args.slo}: needs a served run (workload.requests > 0)")
    prep.slo = slo
    notes = list(prep.notes)
    if args.timeline is not None:
        from chipsim.analysis import timeline

        recorded = args.timeline_tokens or prep.config.hw.workload.max_tokens or prep.trace.num_tokens
        recorded = min(recorded, prep.trace.num_tokens)
        size = timeline.estimate_bytes(recorded, len(prep.policies), prep.workload.model)
        if size > 50e6:
            runs = f"{len(prep.policies)} polic{'y' if len(prep.policies) == 1 else 'ies'}"
            notes.append(f"--timeline records {recorded} tokens of {runs}: about "
                         f"{size / 1e6:.0f} MB of trace events (and several times that in memory while it is built); "
                         "--timeline-tokens N keeps the first N")
    for note in notes:
        print(f"chipsim: note: {note}", file=sys.stderr)
    profiled = None
    if args.profile:
        if args.timeline is not None:
            raise InputError("--profile and --timeline: give one of them (a recorded timeline slows the profile)")
        from chipsim.analysis.profile import profile_run
        from chipsim.runner import simulate, summarize_result

        runs, profiled = [], ([], [], [])
        for policy in prep.policies:
            result, wall, parts = profile_run(lambda observers, policy=policy: simulate(prep, policy,
                                                                                       observers=observers))
            runs.append((summarize_result(prep, result, policy), None))
            for store, value in zip(profiled, (policy.label, wall, parts)):
                store.append(value)
    else:
        runs = run_policies_with_timelines(prep, jobs=args.jobs, progress=True,
                                           timeline_tokens=args.timeline_tokens if args.timeline is not None else None)
    rows = [row for row, _ in runs]
    prov = provenance(prep)
    if args.timeline is not None:
        other = {k: prov[k] for k in ("chipsim_version", "config", "trace", "trace_sha256", "trace_synthetic")}
        other.update(timeline_tokens=args.timeline_tokens or "all",
                     time_unit="ts and dur in microseconds, rounded to whole nanoseconds from integer picoseconds")
        timeline.write(args.timeline, timeline.build_trace([tl for _, tl in runs], other))
    if args.json:
        sys.stdout.write(report.to_json(report.json_rows(rows)))
    else:
        for line in report.header_lines(prep, fetch_path_timing(prep.config.hw)):
            print(line)
        print()
        for line in report.table_preface(prep, rows):
            print(line)
        print(report.format_table(rows))
        quality = report.quality_lines(rows)
        if quality:
            print()
            print("\n".join(quality))
        if prep.trace.synthetic:
            print("\nSYNTHETIC trace: routing and predictions come from a generator, not a model.")
    if profiled is not None:
        from chipsim.analysis.profile import format_profile

        print(("\n" if not args.json else "") + format_profile(*profiled), file=sys.stderr if args.json else sys.stdout)
    if args.out:
        run_info = dict(prov, config_resolved=prep.config.raw, trace_provenance=prep.trace.meta.get("provenance", {}),
                        policies=[p.label for p in prep.policies])
        report.write_outputs(args.out, rows, run_info)
    return 0


RUN_FILES = ("results.csv", "results.json")


def _check_outputs(out: str | None, timeline_path: str | None) -> None:
    """Every output of `chipsim run` can be written, and no two are one file, before anything runs."""
    from chipsim.files import check_output_dir, check_output_file, same_file

    if out is not None and timeline_path is not None and any(
            same_file(timeline_path, p) for p in [out] + [os.path.join(out, name) for name in RUN_FILES]):
        raise InputError(f"--timeline {timeline_path}: is --out {out} or one of its files")
    if out is not None:
        check_output_dir(out, RUN_FILES, "--out")
    if timeline_path is not None:
        check_output_file(timeline_path, "--timeline")


def _check_jobs(jobs: int) -> None:
    if jobs < 0:
        raise InputError(f"--jobs {jobs}: expected a whole number >= 0 (0: one worker per core)")


def _cmd_sweep(args) -> int:
    from chipsim.analysis.sweep import parse_grid_args, run_sweep

    df = run_sweep(args.config, parse_grid_args(args.grid), args.policy, args.out, overrides=args.set or (),
                   jobs=args.jobs, backend=args.backend, scheduler=args.scheduler, progress=not args.quiet)
    a = df.attrs
    for note in a["notes"]:
        print(f"chipsim: note: {note}", file=sys.stderr)
    print(f"{a['rows']} rows ({a['points']} points); {a['simulated']} simulated, {a['reused']} reused from "
          f"{os.path.join(args.out, 'cache')}; {a['seconds']:.1f} s")
    print(f"wrote {os.path.join(args.out, 'results.csv')} and {os.path.join(args.out, 'sweep.json')}")
    return 0


def _write_report(experiments, out_dir: str, report_path: str) -> None:
    from chipsim.analysis.reproduction import write_report

    write_report(experiments, out_dir, report_path)
    print(f"wrote {report_path}")


def _cmd_reproduce(args) -> int:
    import json
    import time

    from chipsim.analysis import experiments as ex
    from chipsim.analysis import plots
    from chipsim.files import write_atomic

    _check_jobs(args.jobs)
    names = args.names or ex.list_experiments(args.experiments)
    if not names:
        raise InputError(f"{args.experiments or ex.EXPERIMENTS_DIR}: no experiments/*.yaml")
    loaded = [ex.load_experiment(ex.find_experiment(n, args.experiments)) for n in names]  # all checked first
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise InputError(f"--out {args.out}: exists and is not a directory")
    if args.report:
        _check_report_path(args.report)
    timings = {}
    t_all = time.perf_counter()
    # every experiment's results in one pool first (the experiments then only read them from the cache)
    frames = {}
    simulated = ex.simulate_experiments(loaded, args.out, jobs=args.jobs, extra_overrides=args.set or (),
                                        progress=not args.quiet, frames=frames)
    simulate_seconds = time.perf_counter() - t_all
    for exp in loaded:  # what only the results tell, for every experiment before any of them is written
        _check_results(exp, frames.pop(exp["name"]), exp["source"])
    print(f"simulated {simulated} results for {len(loaded)} experiments: {simulate_seconds:.1f} s")
    for exp in loaded:
        seconds = ex.run_experiment(exp, args.out, jobs=args.jobs, extra_overrides=args.set or (),
                                    progress=not args.quiet)
        files = plots.draw(ex.saved_experiment(args.out, exp["name"]), args.out)
        timings[exp["name"]] = round(seconds, 2)
        print(f"{exp['name']}: {seconds:.1f} s; {', '.join(files)}")
    write_atomic(os.path.join(args.out, "timings.json"),
                 json.dumps({"simulate_seconds": round(simulate_seconds, 2), "seconds": timings,
                             "total_seconds": round(time.perf_counter() - t_all, 2)}, indent=1)
                 + "\n", what="--out")
    _write_report([ex.saved_experiment(args.out, e["name"]) for e in loaded], args.out,
                  args.report or os.path.join(args.out, "REPRODUCTION.md"))
    return 0


def _check_report_path(report: str) -> None:
    """Before any work: REPRODUCTION.md can be written at `report` (its folder made where missing, as it will be)."""
    from chipsim.files import check_output_dir

    check_output_dir(os.path.dirname(os.path.abspath(report)), [os.path.basename(report)], "--report")


def _check_results(exp: dict, frame, label: str, out_dir: str | None = None) -> None:
    """What only an experiment's results tell, before any figure or report is written: each column it names is
    in them, its plot draws something, its compare rows fill (`frame`: load_results' (DataFrame, rows); `label`:
    the file the experiment came from). With `out_dir`, its saved results.csv files are read and checked too."""
    from chipsim.analysis import experiments as ex
    from chipsim.analysis import plots, reproduction

    df, rows = frame
    ex.check_results(exp, df, label)
    plots.check(exp, df, rows, label)
    reproduction.compare_rows(exp, df, label)
    if out_dir is not None:
        reproduction.load_csv_results(exp, out_dir)


def _cmd_plot(args) -> int:
    from chipsim.analysis import experiments as ex
    from chipsim.analysis import plots

    saved = ex.saved_experiments(args.dir)  # each experiment.json checked as load_experiment checks its file
    report = args.report or os.path.join(args.dir, "REPRODUCTION.md")
    _check_report_path(report)
    for exp in saved:  # every experiment's saved results read and checked before any figure is drawn
        _check_results(exp, ex.load_results(exp, args.dir), os.path.join(args.dir, exp["name"], "experiment.json"),
                       args.dir)
    for exp in saved:
        print(", ".join(plots.draw(exp, args.dir)))
    _write_report(saved, args.dir, report)
    return 0


def _cmd_report(args) -> int:
    from chipsim.analysis.html_report import write_report

    print(f"wrote {write_report(args.dir, args.out)}")
    return 0


def _cmd_models(args) -> int:
    from chipsim.workload import model_report
    from chipsim.workload.models import MODELS, resolve

    if not args.model:
        print(model_report.table())
        return 0
    if args.context < 1:
        raise InputError(f"--context: {args.context} tokens; give a positive number")
    if args.model in MODELS:
        print(model_report.describe_bundled(args.model, args.expert_format, args.context))
    else:
        print(model_report.describe(resolve(args.model), args.expert_format, args.context))
    return 0


MODELS_EPILOG = (  # paragraphs, wrapped when the parser is built
    "A model is data. To simulate your own, no code: point a config at its Hugging Face config.json "
    "(`model.config: path/to/config.json`, or `--set model.config=...`), or write its fields inline under "
    "`model.shape:`. To bundle it, add a YAML file to chipsim/workload/shapes/ (name, source, unconfirmed, published, "
    "config: the config.json fields) like the files there; tests/test_models.py then holds its parameter count to "
    "the published one.",
    "Architectures read (model_type): {architectures}. A new architecture whose layers chipsim already costs needs a "
    "reader in chipsim/workload/hf_config.py (its field names); a new kind of layer also needs its costing in "
    "chipsim/workload/decode.py and its weights in chipsim/workload/shape.py.",
)


def _cmd_keys(args) -> int:
    from chipsim.hw.config import iter_keys
    from chipsim.policies import REGISTRY
    from chipsim.values import key_doc

    for key, type_name, doc in iter_keys():
        print(f"{key:40} {type_name:6} {doc}")
    for name, cls in sorted(REGISTRY.items()):  # policy parameters: `policies.<name>.<param>` in a config
        for param, p in cls.param_specs().items():
            print(f"{f'policies.{name}.{param}':40} {p.type.__name__:6} "
                  f"{key_doc(p.doc, p.bounds, p.default, optional=True)}")
    return 0


def _cmd_policies(args) -> int:
    from chipsim.policies import REGISTRY

    for name, cls in sorted(REGISTRY.items()):
        print(f"{name:14} {cls.summary}")
        for key, p in cls.param_specs().items():
            allowed = p.bounds.describe()
            print(f"{'':14}   policies.{name}.{key} ({p.type.__name__}, default {p.default}"
                  f"{', ' + allowed if allowed else ''}): {p.doc}")
        if cls.trace_arrays:
            print(f"{'':14}   reads trace arrays: {', '.join(spec.name for spec in cls.trace_arrays)}")
        print(f"{'':14}   experts read in place: {cls.in_place}")
        if cls.phase == "decode":
            print(f"{'':14}   several sequences (workload.batch > 1): {cls.batch_support or 'runs one sequence only'}")
    return 0


def _cmd_inspect(args) -> int:
    import json

    from chipsim.trace import format as tf
    from chipsim.trace.stats import format_report, trace_stats

    stats = trace_stats(tf.load(args.trace))
    print(json.dumps(stats, indent=1, ensure_ascii=False) if args.json else format_report(stats))
    return 0


def _int_list(text: str, option: str, maximum: int | None = None, what: str = "") -> list[int]:
    """'512,1024,2048' -> [512, 1024, 2048] (plain digits only: not '1_000', '+5' or other scripts' digits),
    each from 1 to `maximum` (`what` names that bound); anything else is one line naming the option."""
    items = text.split(",")
    if not all(item.isascii() and item.isdigit() for item in items):
        raise InputError(f"{option}: expected whole numbers separated by commas, got {text!r}")
    values = [int(v) for v in items]
    if min(values) < 1:
        raise InputError(f"{option}: every value must be at least 1, got {text!r}")
    if maximum is not None and max(values) > maximum:
        raise InputError(f"{option}: {max(values)} is above {what} ({maximum})")
    return values


def _cmd_calibrate(args) -> int:
    """Every operation of the decode step, analytic and cycle-level side by side."""
    import json

    from chipsim.workload.op_table import format_table, op_table
    from chipsim.hw.config import load_config

    if args.window:
        from chipsim.workload.op_table import apex_window, window_lines

        from chipsim.hw.config import WorkloadConfig, field_bounds

        contexts = _int_list(args.window, "--window", int(field_bounds(WorkloadConfig, "context_length").maximum),
                             "the largest workload.context_length")
        rows = apex_window(args.config, contexts, args.set or [])
        print(json.dumps(rows, indent=1) if args.json else "\n".join(window_lines(rows)))
        return 0
    hw = load_config(args.config, args.set or []).hw
    rows = op_table(hw)
    if args.out:
        from chipsim.files import write_atomic

        write_atomic(args.out, json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    if not args.json:
        from chipsim.tilesim.op_cache import OpCache
        from chipsim.hw.compute_formula import ArrayModel

        table = OpCache.of(ArrayModel(hw).tiles)
        print(f"\ntable cached as {table.path} ({len(table.results)} operation shapes); chipsim run reuses it")
    return 0


MAX_DRAM_REQUESTS = 10_000_000  # about 240 B of Python tuples a request: 2.4 GB at this many
MAX_SEED = (1 << 64) - 1  # a 64-bit seed (NumPy takes any non-negative integer)


def _cmd_dram(args) -> int:
    """Run one request stream through the command-level DRAM model, or (--validate) every validation point
    beside Ramulator 2.1's committed results, or (--point) one of them."""
    import json

    from chipsim.dramsim import validate
    from chipsim.dramsim.standard import builtin_standards

    if args.validate:
        rows = validate.compare(args.validate)
        print(json.dumps(rows, indent=1) if args.json else validate.format_rows(rows))
        return 0 if all(r["within_target"] for r in rows) else 1
    if args.probe:
        from chipsim.dramsim import probe_check

        cfg, key = _probed_memory(args)
        rows = probe_check.compare(args.probe, cfg, key)
        print(json.dumps(rows, indent=1) if args.json else probe_check.format_rows(rows))
        return 0 if all(r["within_target"] for r in rows) else 1
    if args.point:
        _apply_point(args)
    if not args.standard:
        raise InputError(f"chipsim dram: give a standard ({', '.join(builtin_standards())} or a YAML path), --point "
                         "or --validate")
    std, reqs, cfg, warmup = _dram_inputs(args)
    from chipsim.dramsim.controller import simulate

    result = simulate(std, reqs, channels=args.channels, offers_per_cycle=args.offers_per_cycle, controller=cfg,
                      warmup=warmup)
    out = {"standard": std.name, "organization": std.org_name, "timing": std.timing_name, "stream": args.stream,
           "read_share": args.read_share, "channels": args.channels, "streams": args.streams,
           "peak_gbps": std.peak_gbps(args.channels), **result.as_dict()}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{std.name} {std.org_name} {std.timing_name}, {args.channels} channel(s), {args.stream} x{args.streams}, "
              f"read share {args.read_share:g}, {args.page} page, refresh {args.refresh}, queues "
              f"{cfg.read_buffer}/{cfg.write_buffer}, mapping {args.mapping}{' xor ' + args.xor if args.xor else ''}")
        print(f"bandwidth {result.bandwidth_gbps:.2f} GB/s of {out['peak_gbps']:.2f} peak "
              f"({100 * result.bandwidth_gbps / out['peak_gbps']:.1f} %); read latency avg "
              f"{result.read_latency_avg_ns:.1f} ns, p99 {result.read_latency_p99_ns:.1f} ns; row hits "
              f"{result.row_hits}, misses {result.row_misses}, conflicts {result.row_conflicts}, refreshes "
              f"{result.refreshes}")
    return 0


def _probed_memory(args):
    """--probe's memory: --config's --memory (default: its operand memory), a command-level DRAM."""
    from chipsim.hw.config import load_config
    from chipsim.hw.machine import roles

    if not args.config:
        raise InputError("chipsim dram --probe: give --config CONFIG (the memory description to check)")
    hw = load_config(args.config).hw
    name = args.memory or roles(hw).operand_memory
    if name not in hw.memory or getattr(hw.memory[name], "timing_model", "") != "command-level":
        raise InputError(f"chipsim dram --memory {name}: not a command-level memory of {args.config}")
    return hw.memory[name], hw.memory.key_of[name]


def _apply_point(args) -> None:
    """--point NAME: the validation point's stream, controller and front end, as `chipsim dram --validate` runs it
    (its options, printed, reproduce it)."""
    from chipsim.dramsim import points, validate

    named = {p["name"]: p for p in points.POINTS}
    if args.point not in named:
        raise InputError(f"chipsim dram --point {args.point}: not a validation point (chipsim dram --validate lists "
                         "them)")
    p = named[args.point]
    ctrl = validate.point_controller(p)
    args.standard, args.stream, args.read_share = p["standard"], p["kind"], p["read_share"]
    args.channels, args.streams, args.requests, args.seed = p["channels"], p["streams"], points.REQUESTS, points.SEED
    args.refresh, args.page, args.read_buffer, args.write_buffer = ctrl.refresh, ctrl.page_policy, ctrl.read_buffer, \
        ctrl.write_buffer
    args.mapping, args.xor = p.get("mapping", "interleaved"), p.get("xor", "")
    args.offers_per_cycle, args.warmup = validate.OFFERS_PER_CYCLE[p["standard"]], 0
    print(f"# chipsim dram {args.standard} --stream {args.stream} --read-share {args.read_share:g} --channels "
          f"{args.channels} --streams {args.streams} --requests {args.requests} --seed {args.seed} --refresh "
          f"{args.refresh} --page {args.page} --read-buffer {args.read_buffer} --write-buffer {args.write_buffer} "
          f"--mapping {args.mapping}{' --xor ' + args.xor if args.xor else ''} --offers-per-cycle "
          f"{args.offers_per_cycle} --warmup 0", file=sys.stderr)


def _kernel_streams(kernel: str | None, streams: int) -> tuple[int, tuple]:
    """--kernel read | KrNw (chipsim.dramsim.probe_check.kernel_streams), otherwise --streams."""
    from chipsim.dramsim.probe_check import kernel_streams

    return kernel_streams(kernel, "chipsim dram --kernel") if kernel else (streams, ())


def _dram_inputs(args):
    """The standard, the requests, the controller and the warm-up of `chipsim dram`'s options, each checked."""
    from chipsim.dramsim.controller import ControllerConfig
    from chipsim.dramsim.standard import load_standard
    from chipsim.dramsim.streams import requests, stream_mapping
    from chipsim.hw.config import DramConfig, field_bounds

    std = load_standard(args.standard, args.org, args.timing)
    max_channels = int(field_bounds(DramConfig, "channels").maximum)
    max_queue = int(field_bounds(DramConfig, "read_queue_entries").maximum)
    warmup = min(args.requests // 10, 2000) if args.warmup is None else args.warmup
    # what the request list holds, what a config's memory may have, and what the organisation gives each stream
    for name, value, low, high, why in (
            ("--requests", args.requests, 1, MAX_DRAM_REQUESTS, "the request list is held in memory"),
            ("--channels", args.channels, 1, max_channels, "as memory.<m>.channels"),
            ("--streams", args.streams, 1, std.org.rows, "each stream needs a row of its own"),
            ("--read-buffer", args.read_buffer, 1, max_queue, "as memory.<m>.read_queue_entries"),
            ("--write-buffer", args.write_buffer, 1, max_queue, "as memory.<m>.write_queue_entries"),
            ("--offers-per-cycle", args.offers_per_cycle, 1, 64, "requests the front end offers per clock"),
            ("--warmup", warmup, 0, args.requests - 1, "requests left out of the statistics"),
            ("--seed", args.seed, 0, MAX_SEED, "a seed of NumPy's generator is a non-negative integer")):
        if not low <= value <= high:
            raise InputError(f"chipsim dram: {name} must be within {low} ... {high} ({why}), got {value}")
    for name, value in (("--read-share", args.read_share), ("--write-high-watermark", args.write_high_watermark),
                        ("--write-low-watermark", args.write_low_watermark)):
        if not 0.0 <= value <= 1.0:
            raise InputError(f"chipsim dram: {name} must be within 0 ... 1, got {value}")
    if args.write_low_watermark >= args.write_high_watermark:
        raise InputError("chipsim dram: --write-low-watermark must be below --write-high-watermark")
    if args.refresh == "per-bank" and "nREFIpb" not in std.params:  # (else the run would silently never refresh)
        raise InputError(f"chipsim dram: --refresh per-bank: {std.name} {std.timing_name} has no per-bank refresh "
                         "(its timing preset has no nREFIpb)")
    mapping = stream_mapping(std, args.channels, args.mapping, args.xor, names=("chipsim dram --mapping",
                                                                                "chipsim dram --xor"))
    streams, write_streams = _kernel_streams(args.kernel, args.streams)
    reqs = requests(std, args.requests, kind=args.stream, read_share=args.read_share, channels=args.channels,
                    streams=streams, seed=args.seed, mapping=mapping, write_streams=write_streams)
    cfg = ControllerConfig(read_buffer=args.read_buffer, write_buffer=args.write_buffer, page_policy=args.page,
                           refresh=args.refresh, write_high_watermark=args.write_high_watermark,
                           write_low_watermark=args.write_low_watermark)
    return std, reqs, cfg, warmup


CACHE_KINDS = ("dram", "compute", "trace", "sweep")


def _cache_folders(args) -> dict[str, str]:
    """Kind -> folder of the caches `chipsim cache` acts on: the kinds named (default: all there are)."""
    from chipsim.files import cache_dir

    for kind in args.kinds:
        if kind not in CACHE_KINDS:
            raise InputError(f"chipsim cache {args.action}: unknown kind {kind!r} (expected {', '.join(CACHE_KINDS)})")
    if args.sweep is not None and not os.path.isdir(args.sweep):
        raise InputError(f"--sweep {args.sweep}: not a directory (a sweep's or reproduce's --out)")
    if "sweep" in args.kinds and args.sweep is None:
        raise InputError(f"chipsim cache {args.action} sweep: needs --sweep DIR (a sweep's or reproduce's --out)")
    kinds = args.kinds or [k for k in CACHE_KINDS if k != "sweep" or args.sweep is not None]
    folders = {"dram": cache_dir("dram"), "compute": cache_dir("compute"), "trace": cache_dir("trace"),
               "sweep": os.path.join(args.sweep or "", "cache")}
    return {kind: folders[kind] for kind in CACHE_KINDS if kind in kinds}


def _cmd_cache(args) -> int:
    """Where the caches are, how many entries each holds and how many fail their check; or empty them."""
    from chipsim import cache
    from chipsim.analysis.sweep import check_row
    from chipsim.tilesim.op_cache import check_table
    from chipsim.dramsim.calibrate import check_calibration
    from chipsim.files import cache_dir
    from chipsim.trace.unpacked import check_entry

    folders = _cache_folders(args)
    if args.action == "clear":
        for kind, folder in folders.items():
            files, size = cache.clear(folder)
            print(f"removed {files} {kind} entr{'y' if files == 1 else 'ies'} ({size} bytes) from {folder}")
        return 0
    checks = {"dram": check_calibration, "compute": check_table, "trace": check_entry, "sweep": check_row}
    where = "$CHIPSIM_CACHE_DIR" if os.environ.get("CHIPSIM_CACHE_DIR") else "the default; $CHIPSIM_CACHE_DIR moves it"
    print(f"cache: {os.path.dirname(cache_dir('dram'))} ({where})")
    print(f"{'kind':8} {'entries':>7} {'bytes':>10} {'failing':>7}  folder")
    problems = []
    for kind, folder in folders.items():
        s = cache.survey(folder, kind, checks[kind])
        print(f"{kind:8} {s['entries']:>7} {s['bytes']:>10} {s['failing']:>7}  {folder}")
        problems += [f"  {kind} {name}: {why}" for name, why in s["problems"]]
    if problems:
        print("failing entries (recomputed when next needed; `chipsim cache clear` removes them):")
        print("\n".join(problems))
    return 0


def _add_cache_parser(sub) -> None:
    cache_cmd = sub.add_parser("cache", help="where the computed-once caches live and what they hold (info), or "
                                             "empty them (clear)")
    cache_cmd.add_argument("action", choices=("info", "clear"))
    cache_cmd.add_argument("kinds", nargs="*", metavar="KIND",
                           help="dram, compute, trace (in $CHIPSIM_CACHE_DIR), sweep (needs --sweep); default: all")
    cache_cmd.add_argument("--sweep", metavar="DIR", help="also the results cache of this sweep's or reproduce's "
                                                          "--out (DIR/cache)")
    cache_cmd.set_defaults(func=_cmd_cache)


def _add_run_parser(sub) -> None:
    """`chipsim run CONFIG`: replay a trace with policies."""
    run = sub.add_parser("run", help="replay a trace with one or more policies and report latency, energy, EDP")
    run.add_argument("config", help="hardware/run YAML, e.g. hwconfigs/thor.yaml")
    run.add_argument("--policy", action="append", metavar="SPEC",
                     help="policy to run (repeatable): name, static-N, or name:param=value,...")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    run.add_argument("--trace", metavar="PATH", help="replay this trace instead of workload.trace")
    run.add_argument("--json", action="store_true", help="print a JSON list, one object per policy")
    run.add_argument("--out", metavar="DIR", help="write results.csv and results.json into DIR (a served run: also "
                                                 "requests-POLICY.csv, one line per request; an earlier run's "
                                                 "requests-*.csv there are removed)")
    run.add_argument("--slo", metavar="ttft_ms=MS,tpot_ms=MS",
                     help="a served run's SLO: the share of requests meeting it is reported (either or both)")
    run.add_argument("--jobs", type=int, default=0, help="processes for independent policies (default: cores)")
    run.add_argument("--timeline", metavar="FILE",
                     help="write a Chrome/Perfetto trace-event JSON of the runs (open in ui.perfetto.dev)")
    run.add_argument("--timeline-tokens", type=int, default=8, metavar="N",
                     help="tokens the timeline covers, from the first (default 8; 0: all; a request's prefill chunks "
                          "count as one each); the table covers all")
    run.add_argument("--profile", action="store_true",
                     help="run each policy once under cProfile, in this process, and print where the time goes "
                          "(SimPy events, transfers, DMA queue, engine, policy hooks)")
    run.add_argument("--engine", choices=("fast", "reference"),
                     help="event engine (default: the config's run.engine, fast): reference is the engine of record, "
                          "with identical results")
    run.set_defaults(func=_cmd_run)


def _cmd_check(args) -> int:
    """`chipsim check CONFIG`: every check a run makes (config, machine roles, trace, policies), then the machine
    it would build; nothing is simulated."""
    from chipsim.analysis import report
    from chipsim.hw.paths import fetch_path_timing
    from chipsim.runner import prepare

    prep = prepare(args.config, list(args.set or ()), args.policy or (), args.trace)
    for note in prep.notes:
        print(f"chipsim: note: {note}", file=sys.stderr)
    print("\n".join(report.header_lines(prep, fetch_path_timing(prep.config.hw))))
    labels = ", ".join(p.label for p in prep.policies)
    print(f"check:  ok ({len(prep.policies)} polic{'y' if len(prep.policies) == 1 else 'ies'}: {labels}); "
          "nothing simulated")
    return 0


def _add_check_parser(sub) -> None:
    """`chipsim check CONFIG`: validate a machine and its run without simulating."""
    check = sub.add_parser("check", help="check a config (machine, roles, trace, policies) and print the machine it "
                                         "builds, without simulating")
    check.add_argument("config", help="hardware/run YAML, e.g. hwconfigs/thor.yaml")
    check.add_argument("--policy", action="append", metavar="SPEC", help="policy to check (repeatable)")
    check.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    check.add_argument("--trace", metavar="PATH", help="check this trace instead of workload.trace")
    check.set_defaults(func=_cmd_check)


def _add_sweep_parser(sub) -> None:
    """`chipsim sweep CONFIG --grid ...`: the cross product of config-key grids x policies."""
    sweep = sub.add_parser("sweep", help="run the cross product of config-key grids x policies; results.csv, cached")
    sweep.add_argument("config", help="hardware/run YAML, e.g. hwconfigs/thor.yaml")
    sweep.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                       help="a config key and its values (repeatable; the sweep is the cross product)")
    sweep.add_argument("--policy", action="append", metavar="SPEC", help="policy to run at every point (repeatable)")
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key at every point")
    sweep.add_argument("--out", required=True, metavar="DIR", help="write results.csv, sweep.json and cache/ into DIR")
    sweep.add_argument("--jobs", type=int, default=0, help="parallel workers (default: cores)")
    sweep.add_argument("--backend", default="process", choices=("process", "dask"),
                       help="process pool here, or a Dask distributed cluster (pip install -e '.[dist]')")
    sweep.add_argument("--scheduler", metavar="ADDRESS",
                       help="Dask scheduler, e.g. tcp://127.0.0.1:8786 (default: a LocalCluster on 127.0.0.1)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.set_defaults(func=_cmd_sweep)


def _add_reproduce_parser(sub) -> None:
    """`chipsim reproduce [NAME...]`: run experiments/*.yaml and write REPRODUCTION.md."""
    reproduce = sub.add_parser("reproduce", help="run experiments/*.yaml (the papers' figures and tables), draw "
                                                 "them and write REPRODUCTION.md")
    reproduce.add_argument("names", nargs="*", metavar="NAME",
                           help="experiments to run (stems of experiments/*.yaml, or .yaml paths; default: all)")
    reproduce.add_argument("--out", default="results/reproduce", metavar="DIR",
                           help="results, figures and REPRODUCTION.md go here (default results/reproduce)")
    reproduce.add_argument("--jobs", type=int, default=0, help="parallel workers (default: cores)")
    reproduce.add_argument("--set", action="append", metavar="KEY=VALUE",
                           help="override a config key in every experiment (after the experiment's own overrides)")
    reproduce.add_argument("--report", metavar="FILE", help="write REPRODUCTION.md here (default DIR/REPRODUCTION.md)")
    reproduce.add_argument("--experiments", metavar="DIR", help="where the experiment files are (default experiments/)")
    reproduce.add_argument("--quiet", action="store_true", help="no progress bar")
    reproduce.set_defaults(func=_cmd_reproduce)


def _add_plot_parser(sub) -> None:
    """`chipsim plot DIR`: redraw a reproduce DIR's figures from its saved results."""
    plot = sub.add_parser("plot", help="redraw the figures (and REPRODUCTION.md) of a reproduce DIR from its "
                                       "saved results, without simulating")
    plot.add_argument("dir", metavar="DIR", help="an output directory of chipsim reproduce")
    plot.add_argument("--report", metavar="FILE", help="write REPRODUCTION.md here (default DIR/REPRODUCTION.md)")
    plot.set_defaults(func=_cmd_plot)


def _add_report_parser(sub) -> None:
    """`chipsim report DIR`: one self-contained HTML page of a run or sweep directory."""
    report = sub.add_parser("report", help="write one self-contained HTML page (table, interactive figures) of a "
                                           "run or sweep directory; opens from disk, no server or network")
    report.add_argument("dir", metavar="DIR", help="a `chipsim run --out` folder (results.json) or a `chipsim sweep "
                                                   "--out` folder (sweep.json)")
    report.add_argument("--out", metavar="FILE", help="write the page here (default DIR/report.html)")
    report.set_defaults(func=_cmd_report)


def _add_calibrate_parser(sub) -> None:
    """`chipsim calibrate CONFIG`: the analytic array model against the cycle-level tile loop."""
    calibrate = sub.add_parser("calibrate", help="cost every operation of the config's decode step by the analytic "
                                                 "array model and the cycle-level tile loop, side by side")
    calibrate.add_argument("config", help="a config with compute.timing: cycle-level, e.g. hwconfigs/thor.yaml")
    calibrate.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    calibrate.add_argument("--json", action="store_true", help="print the table as JSON")
    calibrate.add_argument("--out", metavar="FILE", help="also write the table as JSON into FILE")
    calibrate.add_argument("--window", metavar="CONTEXTS", help="instead, per MoE layer at these contexts (e.g. "
                           "512,1024,2048): attention, router, one expert and the top-k experts' load (the APEX window)")
    calibrate.set_defaults(func=_cmd_calibrate)


def _add_dram_parser(sub) -> None:
    """`chipsim dram [STANDARD]`: a request stream through the command-level DRAM model, or --validate."""
    dram = sub.add_parser("dram", help="run a request stream through the command-level DRAM model (bandwidth, "
                                       "read latency), or --validate it against Ramulator 2.1's reference")
    dram.add_argument("standard", nargs="?",
                      help="a built-in standard (chipsim/dramsim/standards/: ddr4, ddr5, gddr6, "
                      "gddr7, hbm2, hbm3, lpddr5) or a standard YAML")
    dram.add_argument("--org", help="organisation preset (default: the standard's first)")
    dram.add_argument("--timing", help="timing preset (default: the standard's first)")
    dram.add_argument("--stream", default="sequential", choices=("sequential", "random"))
    dram.add_argument("--read-share", type=float, default=1.0, help="probability that a request reads (default 1)")
    dram.add_argument("--channels", type=int, default=1)
    dram.add_argument("--streams", type=int, default=1, help="sequential streams interleaved (default 1)")
    dram.add_argument("--requests", type=int, default=30000)
    dram.add_argument("--refresh", default="all-bank", choices=("all-bank", "per-bank", "off"))
    dram.add_argument("--page", default="open", choices=("open", "closed", "capped"),
                      help="open rows stay open; closed: precharged once no queued request hits them; capped: "
                           "closed after 4 accesses (Ramulator 2.1's ClosedCAP)")
    dram.add_argument("--read-buffer", type=int, default=32, help="read queue entries (default 32)")
    dram.add_argument("--write-buffer", type=int, default=32, help="write queue entries (default 32)")
    dram.add_argument("--write-high-watermark", type=float, default=0.8, help="drain writes above this share of "
                      "the write queue (default 0.8)")
    dram.add_argument("--write-low-watermark", type=float, default=0.2, help="back to reads below it (default 0.2)")
    dram.add_argument("--mapping", default="interleaved", help="address mapping: interleaved, RoBaRaCoCh, MOP4CL or "
                      "a comma-separated field order from the least significant (chipsim/dramsim/mapping.py)")
    dram.add_argument("--xor", default="", help="levels whose index is XORed with the row (e.g. bankgroup,bank)")
    dram.add_argument("--offers-per-cycle", type=int, default=4, help="requests the front end offers per clock "
                      "(default 4)")
    dram.add_argument("--warmup", type=int, help="completed requests left out of the statistics (default: a tenth, "
                      "at most 2,000)")
    dram.add_argument("--seed", type=int, default=1)
    dram.add_argument("--kernel", help="streams of a GPU kernel: read (one array read) or KrNw (K arrays read and N "
                      "written, in turn: 6r1w, 1r1w = copy), as validation/dram/probe_hbm.py runs them")
    dram.add_argument("--probe", metavar="JSON", help="a streaming probe of a real memory "
                      "(validation/dram/probe_hbm.py) beside --config's memory description; exit 1 beyond 3 %%")
    dram.add_argument("--config", help="with --probe: the config whose memory is checked")
    dram.add_argument("--memory", help="with --probe: which memory of the config (default: its operand memory)")
    dram.add_argument("--point", help="run one validation point exactly as --validate does (prints its options)")
    dram.add_argument("--json", action="store_true", help="print one JSON object")
    dram.add_argument("--validate", nargs="?", const="validation/dram/ramulator.json", metavar="REF",
                      help="compare every validation point with Ramulator 2.1's results (default "
                           "validation/dram/ramulator.json); exit 1 if a point misses the target")
    dram.set_defaults(func=_cmd_dram)


def _add_inspect_parser(sub) -> None:
    """`chipsim inspect TRACE`: a trace's provenance and routing statistics."""
    inspect = sub.add_parser("inspect", help="print a trace's provenance and routing statistics")
    inspect.add_argument("trace", help="trace file, e.g. traces/real-granite-3b.npz")
    inspect.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    inspect.set_defaults(func=_cmd_inspect)


def _add_models_parser(sub) -> None:
    from chipsim.hw.expert_formats import FORMATS
    from chipsim.workload.hf_config import supported

    p = sub.add_parser("models", help="list the bundled model shapes, or show what chipsim derives from one (a "
                                      "bundled name or a config.json)",
                       epilog="\n\n".join(textwrap.fill(text.format(architectures=supported()), 110)
                                           for text in MODELS_EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="a bundled name, or a path to a Hugging Face config.json")
    p.add_argument("--expert-format", default="", choices=list(FORMATS),
                   help="the weight format the experts' bytes are shown in (default: as the checkpoint ships them, "
                        "else bf16)")
    p.add_argument("--context", type=int, default=4096, help="tokens the cache size is shown at (default 4096)")
    p.set_defaults(func=_cmd_models)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="chipsim", description="Discrete-event simulator of an edge chiplet MoE accelerator.")
    parser.add_argument("--version", action="version", version=f"chipsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_run_parser(sub)
    _add_check_parser(sub)
    _add_sweep_parser(sub)
    _add_reproduce_parser(sub)
    _add_plot_parser(sub)
    _add_report_parser(sub)
    _add_models_parser(sub)
    sub.add_parser("keys", help="list every config key with its unit and meaning").set_defaults(func=_cmd_keys)
    sub.add_parser("policies", help="list policies and their parameters").set_defaults(func=_cmd_policies)
    sub.add_parser("trace", help="record a trace from a local Hugging Face MoE checkpoint over a text file "
                                 "(needs torch; `chipsim trace --help` for its options)")
    sub.add_parser("hwreplay", help="replay policies' decisions on a CUDA GPU and measure per-token latency "
                                    "(needs torch with CUDA; `chipsim hwreplay --help`)")
    sub.add_parser("hwcompare", help="simulated vs measured latency and bytes of hwreplay measurements; writes "
                                     "VALIDATION.md (`chipsim hwcompare --help`)")
    _add_calibrate_parser(sub)
    _add_dram_parser(sub)
    _add_cache_parser(sub)
    _add_inspect_parser(sub)
    return parser


def _cmd_trace(argv: list[str]) -> int:
    """`chipsim trace MODEL_DIR --text FILE --out PATH ...`: record a trace from a local HF checkpoint (torch
    imported only after the options are read and checked)."""
    from chipsim.tracegen import checkpoint

    try:
        return checkpoint.main(argv)
    except (OSError, ValueError) as exc:
        raise InputError(f"chipsim trace: {type(exc).__name__}: {exc}") from None


def _cmd_hwreplay(argv: list[str]) -> int:
    """`chipsim hwreplay CONFIG... --contexts 512,2048 --out DIR`: real replay on a CUDA GPU (torch imported
    only after the options are read, so --help and option errors work without it)."""
    from chipsim.hwreplay import run

    return run.main(argv)


def _profile_without_compiled_engine(argv: list[str], specs: list[str] | None) -> int | None:
    """cProfile sees no time inside the engine compiled by mypyc: `run --profile` then runs the same command in a
    fresh process whose engine is loaded from its .py files (CHIPSIM_PURE_PYTHON=1; the results are the same). The
    process runs the same program (the chipsim script, `-m chipsim.cli`, or a user's script that registers policies
    of its own and calls main), so the policies it defines exist there too."""
    import subprocess

    import chipsim.sim

    if not chipsim.sim.BUILD.startswith("compiled"):
        return None
    child = subprocess.run([sys.executable, *_this_program(specs), *argv], capture_output=True, text=True,
                           env=dict(os.environ, CHIPSIM_PURE_PYTHON="1"))
    sys.stdout.write(child.stdout)
    sys.stderr.write(child.stderr)
    return child.returncode


def _this_program(specs: list[str] | None) -> list[str]:
    """The interpreter arguments that start this command again with the same policies: chipsim's own module where
    every policy it runs is chipsim's (`specs`: its --policy values; none given, every registered policy counts),
    else the script that registered the others (run as `python SCRIPT`)."""
    from chipsim.policies import REGISTRY

    named = {part.partition(":")[0].strip() for spec in specs or [] for part in spec.split("+")}
    outside = sorted(name for name, cls in REGISTRY.items()
                     if not cls.__module__.startswith("chipsim.") and (not specs or name in named))
    if not outside:
        return ["-m", "chipsim.cli"]
    if getattr(sys.modules.get("__main__"), "__spec__", None) is None and sys.argv and os.path.isfile(sys.argv[0]):
        return [sys.argv[0]]
    raise InputError(f"--profile: policies {', '.join(outside)} are not chipsim's and this program cannot be run "
                     "again to profile them with the engine as Python; set CHIPSIM_PURE_PYTHON=1 to profile here")


class _FirstCtrlC:
    """SIGINT handler for the length of one command: the first Ctrl-C raises KeyboardInterrupt and turns
    SIGINT off at once, so a second press (the terminal signals the whole group; people press twice) cannot
    interrupt the pool's teardown or the interpreter's exit; later calls (a handler put back) do nothing."""

    def __init__(self):
        self.pressed = False

    def __call__(self, signum, frame):
        if self.pressed:
            return
        self.pressed = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    on_ctrl_c = _FirstCtrlC()
    previous = _install_sigint(on_ctrl_c)
    try:
        return _main(argv)
    finally:
        if not on_ctrl_c.pressed and previous is not None:
            signal.signal(signal.SIGINT, previous)  # a caller's own handler (pytest's) comes back


def _install_sigint(handler):
    """Install `handler` for SIGINT where Python allows it (the main thread); returns the one it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)


def _main(argv) -> int:
    parser = build_parser()
    try:
        if argv[:1] == ["trace"]:  # its options belong to the recorder (torch is imported only here)
            return _cmd_trace(argv[1:])
        if argv[:1] == ["hwreplay"]:
            return _cmd_hwreplay(argv[1:])
        if argv[:1] == ["hwcompare"]:
            from chipsim.hwreplay import compare

            return compare.main(argv[1:])
        args = parser.parse_args(argv)
        if args.func is _cmd_run and args.profile:
            rc = _profile_without_compiled_engine(argv, args.policy)
            if rc is not None:
                return rc
        return args.func(args)
    except InputError as exc:
        print(f"chipsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _install_sigint(signal.SIG_IGN)  # a second Ctrl-C while exiting changes nothing
        print("chipsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `chipsim keys | head -1`: the reader has gone; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would complain again
        return 141


if __name__ == "__main__":
    sys.exit(main())
