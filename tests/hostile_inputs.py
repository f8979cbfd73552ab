"""A hostile user's run: hundreds of bad inputs against `chipsim`, each classified by what came back.

    python tests/hostile_inputs.py [--list] [--only SUBSTRING]

Every case runs `chipsim.cli.main` in this process (with a time limit) in a fresh temporary directory and is
counted as

    ok         exit 0; with --json, valid JSON with no NaN or infinity (for an input that is wrong by
               construction, a corrupt trace or an unwritable output, exit 0 counts as bad: silently accepted)
    clean      exit 2 with exactly one stderr line `chipsim: error: ...`, and nothing written
    traceback  an exception escaped, or a traceback was printed
    bad        anything else: exit 0 with non-finite JSON, a several-line error, a file left behind, a hang

and the counts are printed. The fuzz tests in
tests/test_fuzz.py assert the same classification on generated inputs in CI; this script is the wider,
slower sweep a person runs by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import stat
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chipsim.cli import main  # noqa: E402
from helpers import thor_keys  # noqa: E402  (tests/helpers.py)
from chipsim.policies import REGISTRY  # noqa: E402

THOR = os.path.join(ROOT, "hwconfigs", "thor.yaml")
TRACE = os.path.join(ROOT, "traces", "real-granite-3b.npz")
GRANITE_1B = os.path.join(ROOT, "validation", "h200-pcie5-granite-1b.json")  # a measurement file hwcompare reads
R = ["run", THOR, "--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1"]
VALUES = ["0", "-1", "1.0e-300", "1.0e-10", "0.0005", "1.0e+18", "1.0e+308", ".nan", ".inf", "-.inf", "abc",
          "true", "1e9", "[1, 2]", "''"]
TIME_LIMIT_S = 30


def _finite(obj) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_case(argv: list[str], setup=None, json_out: bool = False, must_reject: bool = False) -> tuple[str, str]:
    """(class, detail) of one invocation, run in a fresh temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        cache_home = os.environ.get("CHIPSIM_CACHE_DIR")  # a case may give itself a cache of its own
        os.chdir(tmp)
        try:
            if setup is not None:
                argv = setup(tmp, list(argv))
            before = set(_walk(tmp))
            out, err = io.StringIO(), io.StringIO()
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(TIME_LIMIT_S)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = main(argv)
            except _Timeout:
                return "bad", "hang"
            except SystemExit as exc:  # argparse's own exit on a usage error
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:  # noqa: BLE001 - this is what we count
                return "traceback", f"{type(exc).__name__}: {exc}".splitlines()[0][:160] + " | " + \
                    traceback.extract_tb(exc.__traceback__)[-1].filename.replace(ROOT, "")
            finally:
                signal.alarm(0)
            text = err.getvalue()
            if "Traceback" in text:
                return "traceback", text.strip().splitlines()[-1][:160]
            if code == 0:
                if must_reject:
                    return "bad", "exit 0: a wrong input was accepted"
                if json_out:
                    try:
                        rows = json.loads(out.getvalue())
                    except ValueError:
                        return "bad", "exit 0, stdout not JSON"
                    if not _finite(rows):
                        return "bad", "exit 0 with NaN or infinity in the JSON"
                expected = COLD_RESULTS.pop(tmp, None)
                if expected is not None and _result_of(expected[0], out.getvalue()) != expected[1]:
                    return "bad", "exit 0 with results other than a cold cache's: silently wrong"
                return "ok", ""
            lines = text.strip().splitlines()
            left = set(_walk(tmp)) - before
            if code == 2 and len(lines) == 1 and lines[0].startswith("chipsim: error: ") and not left:
                return "clean", lines[0][:160]
            return "bad", f"exit {code}, {len(lines)} stderr lines, left {sorted(left)[:3]}: {text.strip()[:160]}"
        finally:
            os.chdir(cwd)
            if cache_home is None:
                os.environ.pop("CHIPSIM_CACHE_DIR", None)
            else:
                os.environ["CHIPSIM_CACHE_DIR"] = cache_home


def _walk(root: str):
    for folder, _, files in os.walk(root):
        for name in files:
            yield os.path.relpath(os.path.join(folder, name), root)


# ---------------------------------------------------------------------------------------------- the cases
def _write(tmp: str, name: str, text: str) -> str:
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _config_case(text: str):
    def setup(tmp, argv):
        argv[1] = _write(tmp, "c.yaml", text)
        return argv
    return setup


def _trace_case(edit):
    """A copy of the bundled trace, edited (arrays, meta) and saved without validation."""
    def setup(tmp, argv):
        import numpy as np

        with np.load(TRACE) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
        edit(arrays, meta)
        path = os.path.join(tmp, "t.npz")
        np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
        return argv + ["--trace", path]
    return setup


def _special_trace(kind: str):
    def setup(tmp, argv):
        path = os.path.join(tmp, "t.npz")
        if kind in ("fifo", "dir", "devzero"):
            path = _special_path(tmp, kind, "t.npz")
        elif kind == "truncated":
            with open(TRACE, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data[: len(data) // 3])
        elif kind == "empty":
            open(path, "wb").close()
        return argv + ["--trace", path]
    return setup


def _output_case(kind: str):
    def setup(tmp, argv):
        if kind == "out-file":
            return argv + ["--out", _write(tmp, "f", "x")]
        if kind == "out-readonly":
            d = os.path.join(tmp, "ro")
            os.mkdir(d)
            os.chmod(d, 0o500)
            # root writes through permissions: a folder of a file system that refuses new files stands in
            return argv + ["--out", "/sys/chipsim-out" if os.geteuid() == 0 else d]
        if kind == "timeline-fifo":
            p = os.path.join(tmp, "fifo")
            os.mkfifo(p)
            return argv + ["--timeline", p]
        if kind == "timeline-symlink":
            target = _write(tmp, "precious", "keep me")
            link = os.path.join(tmp, "link.json")
            os.symlink(target, link)
            return argv + ["--timeline", link]
        if kind == "timeline-dir":
            return argv + ["--timeline", tmp]
        if kind == "timeline-is-out":
            return argv + ["--out", os.path.join(tmp, "o"), "--timeline", os.path.join(tmp, "o", "results.csv")]
        if kind == "timeline-missing-dir":
            return argv + ["--timeline", os.path.join(tmp, "no", "t.json")]
        if kind == "results-csv-fifo":
            d = os.path.join(tmp, "o")
            os.mkdir(d)
            os.mkfifo(os.path.join(d, "results.csv"))
            return argv + ["--out", d]
        raise ValueError(kind)
    return setup


# ---------------------------------------------------------------------------------------------- issue 37's categories
# One function per category of inputs the suite first missed (each a list of cases() tuples).

def _quietly(argv: list[str]) -> str:
    """Run `argv`; its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    return out.getvalue()


# a case's folder -> (where its result is: "stdout" or a file's path, what a cold cache gives): run_case compares
COLD_RESULTS: dict[str, tuple[str, str]] = {}


def _result_of(where: str, stdout: str) -> str:
    if where == "stdout":
        return stdout
    with open(where, encoding="utf-8") as f:
        return f.read()


def _garble(path: str, how: str) -> None:
    """Corrupt one cache entry in place."""
    with open(path, encoding="utf-8") as f:
        entry = json.load(f)
    payload = entry.get("payload", entry)
    leaves = payload.get("row") or payload.get("ops") or payload  # a sweep's row, a table's ops, a calibration
    if "ops" in payload:
        leaves = next(iter(leaves.values()))
    change = {"halved": lambda v: v / 2, "nan": lambda v: math.nan, "string": str, "negative": lambda v: -v - 1,
              "checksum-fixed-negative": lambda v: -v - 1}.get(how)
    if change is not None:
        for k, v in leaves.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "policy":
                leaves[k] = change(v)
        if how == "checksum-fixed-negative" and "payload" in entry:
            from chipsim import cache

            entry["sha256"] = cache.digest(entry["payload"])
        text = json.dumps(entry)
    elif how == "truncated":
        text = json.dumps(entry)[:50]
    elif how == "binary":
        text = "\x00\xff garbage"
    elif how == "old-format":
        text = json.dumps(payload)
    elif how == "list":
        text = "[1, 2, 3]"
    else:
        text = None
    os.unlink(path)
    if text is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dir":
        os.mkdir(path)
    elif how == "symlink-devzero":
        os.symlink("/dev/zero", path)
    elif how == "huge":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # sparse
    else:
        raise ValueError(how)


CACHE_DAMAGE = ("halved", "nan", "string", "negative", "checksum-fixed-negative", "truncated", "binary",
                "old-format", "list", "fifo", "dir", "symlink-devzero", "huge")


def _cache_case(kind: str, how: str, warm: list[str] | None = None):
    """Run once (warming the cache; `warm`: another command does), garble every entry of `kind`, and hand back the
    same command: it must run as with a cold cache (exit 0, finite JSON), with notes. The in-process memos are
    dropped, as in a new run."""
    def setup(tmp, argv):
        from chipsim.tilesim import op_cache
        from chipsim.dramsim import calibrate
        from chipsim.files import cache_dir

        # a cache of the case's own: only the entries this command makes are garbled (run_case restores the sweep's)
        os.environ["CHIPSIM_CACHE_DIR"] = os.path.join(tmp, "cache-home")
        for _ in range(2):
            calibrate.calibrate.cache_clear()
            op_cache._TABLES.clear()
            if kind != "sweep":
                cold = _quietly(warm or argv)
                if warm is None:  # the damaged cache must give what the cold one gave
                    COLD_RESULTS[tmp] = ("stdout", cold)
        folder = cache_dir(kind) if kind != "sweep" else os.path.join(tmp, "s", "cache")
        if kind == "sweep":
            _quietly(argv)
            results = os.path.join(tmp, "s", "results.csv")
            COLD_RESULTS[tmp] = (results, _result_of(results, ""))
        calibrate.calibrate.cache_clear()  # the case's run starts from the damaged files, as a new process would
        op_cache._TABLES.clear()
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json") and os.path.isfile(os.path.join(folder, name)):
                _garble(os.path.join(folder, name), how)
        return argv
    return setup


def _cases_caches() -> list:
    """Corrupt, garbled, special-file and foreign cache entries (DRAM calibrations, operation tables, sweeps)."""
    cycle = os.path.join(ROOT, "hwconfigs", "thor.yaml")
    run = ["--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1", "--json"]
    commands = {"dram": ["run", THOR, *run], "compute": ["run", cycle, *run],
                "sweep": ["sweep", THOR, "--grid", "dma.engines=1,2", "--policy", "no-prefetch", "--set",
                          "workload.max_tokens=4", "--jobs", "1", "--out", "s", "--quiet"]}
    out = []
    for kind, argv in commands.items():
        for how in CACHE_DAMAGE:
            out.append((f"cache: {kind} entry {how}", argv, _cache_case(kind, how), kind != "sweep", False))
    out += [("cache: info with damaged entries", ["cache", "info"], _cache_case("dram", "fifo", commands["dram"]),
             False, False),
            ("cache: clear an unknown kind", ["cache", "clear", "nope"], None, False, True),
            ("cache: info sweep without --sweep", ["cache", "info", "sweep"], None, False, True),
            ("cache: --sweep missing folder", ["cache", "info", "--sweep", "nowhere"], None, False, True),
            ("cache: no action", ["cache"], None, False, True)]
    return out


HBM3 = os.path.join(ROOT, "chipsim", "dramsim", "standards", "hbm3.yaml")


def _standard_case(kind: str, sweep_first: bool = False):
    """memory.hbm.standard names a copy of hbm3.yaml in the case's folder, then `kind` happens to it (after a
    first sweep into s/ when `sweep_first`: the rerun must read the file as it is now)."""
    def setup(tmp, argv):
        path = os.path.join(tmp, "std.yaml")
        with open(HBM3, encoding="utf-8") as f:
            _write(tmp, "std.yaml", f.read())
        argv = argv + ["--set", f"memory.hbm.standard={path}"]
        if sweep_first:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(argv) == 0
        os.remove(path)
        if kind == "edited":  # nCCDS 2 -> 6: a slower HBM (a fresh folder gives a longer token than the cached one)
            with open(HBM3, encoding="utf-8") as f:
                _write(tmp, "std.yaml", f.read().replace("    nCCDS: 2\n", "    nCCDS: 6\n"))
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            os.mkdir(path)
        elif kind == "empty":
            _write(tmp, "std.yaml", "")
        elif kind == "devzero":
            argv[-1] = "memory.hbm.standard=/dev/zero"
        elif kind != "deleted":
            raise ValueError(kind)
        return argv
    return setup


def _cases_provenance_packaging() -> list:
    """Files chipsim reads at run time edited between runs; what the code hash must cover."""
    sweep = ["sweep", THOR, "--grid", "workload.max_tokens=2", "--policy", "no-prefetch", "--set",
             "memory.lpddr5x.timing_model=closed-form", "--out", "s", "--jobs", "1", "--quiet"]
    out = [("provenance: sweep rerun after its DRAM standard was edited", sweep, _standard_case("edited", True),
            False, False),
           ("provenance: sweep rerun after its DRAM standard was deleted", sweep, _standard_case("deleted", True),
            False, True),
           ("provenance: sweep rerun after its DRAM standard became a FIFO", sweep, _standard_case("fifo", True),
            False, True)]
    for kind in ("fifo", "dir", "empty", "devzero", "deleted"):
        out.append((f"provenance: run, DRAM standard {kind}", R, _standard_case(kind), False, True))
    return out


def _boundary_policy(name: str, act):
    """A setup registering, in this process, a test-only policy `name` whose on_layer_start and on_route call
    `act(ctx, t, layer, routed)` (routed None at the layer's start), and naming it with --policy. The registry is
    global: the hostile-* policies stay registered for the rest of this sweep (a process of its own)."""
    def setup(tmp, argv):
        from chipsim.policies.base import Policy

        if name not in REGISTRY:
            class Hostile(Policy):
                def on_layer_start(self, ctx, t, layer):
                    act(ctx, t, layer, None)

                def on_route(self, ctx, t, layer, routed):
                    plan = act(ctx, t, layer, routed)
                    return plan if plan is not None else super().on_route(ctx, t, layer, routed)

            Hostile.name = name
            REGISTRY[name] = Hostile
        return argv + ["--policy", name]
    return setup


def _cases_policy_boundary() -> list:
    """Policies that hand the simulator odd expert ids, or read routing they could not know yet (tests/
    test_policy_boundary.py holds the detailed checks; these go through the whole CLI)."""
    import numpy as np

    from chipsim.policies.base import LayerPlan

    base = ["run", THOR, "--set", "workload.max_tokens=4", "--jobs", "1", "--json"]
    out = []
    ids = {"30.0": 30.0, "'3'": "3", "None": None, "True": True, "-1": -1, "40": 40, "np.float64(3)": np.float64(3),
           "np.uint8(200)": np.uint8(200), "[3]": [3], "a 1-element array": np.array([3])}
    for text, value in ids.items():
        act = (lambda value: lambda ctx, t, layer, routed: None if routed is not None else ctx.prefetch(layer, value))(value)
        out.append((f"policy: prefetch(layer, {text})", base, _boundary_policy(f"hostile-prefetch-{text}", act), True,
                    True))
    for text, value in {"np.uint8(30)": np.uint8(30), "np.int64(30)": np.int64(30), "np.int32(30)": np.int32(30)}.items():
        act = (lambda value: lambda ctx, t, layer, routed: None if routed is not None else ctx.prefetch(layer, value))(value)
        out.append((f"policy: prefetch(layer, {text}) (taken)", base, _boundary_policy(f"hostile-prefetch-{text}", act),
                    True, False))
    misuses = {
        "trace_routed of the next layer at routing": lambda ctx, t, layer, routed: routed is not None and layer + 1 <
        ctx.num_moe_layers and ctx.trace_routed(t, layer + 1) and None,
        "trace_routed of this layer before routing": lambda ctx, t, layer, routed: ctx.trace_routed(t, layer) and None,
        "trace_routed of the next token": lambda ctx, t, layer, routed: t + 1 < ctx.num_tokens and ctx.trace_routed(
            t + 1, 0) and None,
        "trace_array('routed_ids') whole": lambda ctx, t, layer, routed: ctx.trace_array("routed_ids") is None,
        "trace_array('router_rank') whole": lambda ctx, t, layer, routed: ctx.trace_array("router_rank") is None,
        "trace_row('routed_weights') before routing": lambda ctx, t, layer, routed: ctx.trace_row(
            "routed_weights", t, layer) and None,
        "LayerPlan.execute with a float": lambda ctx, t, layer, routed: routed and LayerPlan(
            execute=[float(e) for e in routed]),
        "LayerPlan.execute an expert the model lacks": lambda ctx, t, layer, routed: routed and LayerPlan(
            execute=routed + [40]),
        "LayerPlan not returned": lambda ctx, t, layer, routed: routed and "all of them",
        "evict(layer, '0')": lambda ctx, t, layer, routed: ctx.evict(layer, "0"),
        "cancel_unneeded with strings": lambda ctx, t, layer, routed: ctx.cancel_unneeded(layer, ["1", "2"]),
        "least_recently_used protect floats": lambda ctx, t, layer, routed: ctx.least_recently_used(
            1, [(layer, [0.0])]),
        "last_use of a key not in the buffer": lambda ctx, t, layer, routed: ctx.last_use((layer, 0)) and None,
    }
    for text, act in misuses.items():
        out.append((f"policy: {text}", base, _boundary_policy(f"hostile-{text}", act), True, True))
    two_workers = ["run", THOR, "--set", "workload.max_tokens=4", "--jobs", "2", "--policy", "no-prefetch"]
    act = lambda ctx, t, layer, routed: ctx.prefetch(layer, 3.5)  # noqa: E731
    out.append(("policy: prefetch(layer, 3.5) in a worker (--jobs 2)", two_workers,
                _boundary_policy("hostile-worker-prefetch", act), False, True))
    return out


def _special_path(tmp: str, kind: str, name: str) -> str:
    """A path in `tmp` (or a device) that is `kind`: fifo, devzero, devnull, dir, huge (a sparse 5 GiB file), a
    link to thor.yaml or to the bundled trace, or a copy of the built-in hbm3 standard."""
    path = os.path.join(tmp, name)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(5 << 30)
    elif kind in ("link-thor", "link-trace"):
        os.symlink(THOR if kind == "link-thor" else TRACE, path)
    elif kind == "hbm3-copy":
        import shutil

        shutil.copy(os.path.join(ROOT, "chipsim", "dramsim", "standards", "hbm3.yaml"), path)
    else:
        return {"devzero": "/dev/zero", "devnull": "/dev/null"}[kind]
    return path


def _path_case(kind: str, name: str, argv_of):
    """Set up a special path, then the command line `argv_of(tmp, path)`."""
    def setup(tmp, argv):
        return argv_of(tmp, _special_path(tmp, kind, name))
    return setup


def _config_naming(text_of):
    """A config c.yaml in tmp whose text names the path: `text_of(path)`."""
    def argv_of(tmp, path):
        return ["run", _write(tmp, "c.yaml", text_of(path))] + R[2:]
    return argv_of


PATH_KINDS = ("fifo", "devzero", "devnull", "dir", "huge")
DEEP = "x: " + "[" * 2000 + "]" * 2000 + "\n"
BOMB = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9))


def _cases_paths() -> list:
    """Every file chipsim reads as a FIFO, a device, a directory, a huge file, a symlink; duplicate keys, deep
    nesting."""
    out = []
    readers = {
        "config": ("c.yaml", lambda tmp, p: ["run", p] + R[2:]),
        "base": ("b.yaml", _config_naming(lambda p: f"base: {p}\n")),
        "standard": ("s.yaml", _config_naming(lambda p: f"base: {THOR}\nmemory:\n  hbm:\n    standard: {p}\n")),
        "workload.trace": ("t.npz", _config_naming(lambda p: f"base: {THOR}\nworkload:\n  trace: {p}\n")),
        "--trace": ("t.npz", lambda tmp, p: R + ["--trace", p]),
        "inspect": ("t.npz", lambda tmp, p: ["inspect", p]),
        "experiment": ("e.yaml", lambda tmp, p: ["reproduce", p, "--out", os.path.join(tmp, "o")]),
        "dram standard": ("s.yaml", lambda tmp, p: ["dram", p, "--requests", "100"]),
        "dram --validate": ("r.json", lambda tmp, p: ["dram", "--validate", p]),
        "hwcompare": ("m.json", lambda tmp, p: ["hwcompare", p]),
        "trace --text": ("x.txt", lambda tmp, p: ["trace", tmp, "--text", p, "--out", os.path.join(tmp, "t.npz")]),
    }
    for reader, (name, argv_of) in readers.items():
        for kind in PATH_KINDS:
            out.append((f"paths: {reader} {kind}", ["run"], _path_case(kind, name, argv_of), False, True))
    # what must keep working: a link to a good config or trace, a standard file beside the config
    out.append(("paths: config link", ["run"], _path_case("link-thor", "l.yaml", readers["config"][1]), False, False))
    out.append(("paths: --trace link", ["run"], _path_case("link-trace", "l.npz", readers["--trace"][1]), False, False))
    out.append(("paths: standard relative", ["run"], _path_case("hbm3-copy", "s.yaml", _config_naming(
        lambda p: f"base: {THOR}\nmemory:\n  hbm:\n    standard: ./s.yaml\n")), False, False))
    for odd in ("t #1.npz", "a: b.npz"):  # --trace travels as a --set value: must read back as written
        out.append((f"paths: --trace named {odd!r}", ["run"], _path_case("link-trace", odd, readers["--trace"][1]),
                    False, False))
    yaml_texts = {
        "duplicate top-level key": f"base: {THOR}\ncompute:\n  arrays: 4\ncompute:\n  arrays: 2\n",
        "duplicate nested key": f"base: {THOR}\ncompute:\n  arrays: 4\n  arrays: 2\n",
        "duplicate base": f"base: {THOR}\nbase: {THOR}\n",
        "deep nesting": DEEP, "alias bomb": BOMB, "recursive alias": "x: &a [*a]\n",
    }
    for name, text in yaml_texts.items():
        out.append((f"paths: yaml {name}", ["run", "X"] + R[2:], _config_case(text), False, True))
    for name, value in {"duplicate key": "{x: 1, x: 2}", "deep nesting": DEEP[3:-1],
                        "alias bomb": "{" + BOMB.replace("\n", ", ") + "}"}.items():
        out.append((f"paths: --set {name}", R + ["--set", f"compute.op_times_ns={value}"], None, False, True))
    return out


EXPERIMENT = (f"title: t\npaper: p\nconfig: {THOR}\ngrid: {{dma.engines: [1, 2]}}\npolicies: [no-prefetch]\n"
              "overrides: [workload.max_tokens=3]\n")
EXPERIMENT_PLOT = {"kind": "line", "x": "dma.engines", "y": "latency_ms_per_token", "xlabel": "engines",
                   "ylabel": "y (ms)"}
EXPERIMENT_ROW = "{what: a, paper: 1, metric: latency_ms_per_token, where: {policy: no-prefetch}, why: w}"


def _experiment_case(plot: dict, more: str = ""):
    """`chipsim reproduce` of a small experiment (thor, two points, no-prefetch, 3 tokens) with one field changed."""
    def setup(tmp, argv):
        fields = ", ".join(f"{k}: {v}" for k, v in {**EXPERIMENT_PLOT, **plot}.items())
        _write(tmp, "bad.yaml", EXPERIMENT + f"plot: {{{fields}}}\n" + more)
        return ["reproduce", "bad", "--experiments", tmp, "--out", os.path.join(tmp, "o"), "--quiet", "--jobs", "1"]
    return setup


def _cases_experiments() -> list:
    """An experiment file's plot and compare fields: each bad one refused in one line before anything runs."""
    plots = {f"plot.{k} {v}": {k: v} for k, v in (
        ("x", "nosuch"), ("y", "nosuch"), ("series", "nosuch"), ("annotate", "nosuch"), ("title", "[1, 2]"),
        ("secondary_x", "3"), ("ylim", "abc"), ("ylim", "[.nan, 1]"), ("ylim", "[5, 1]"), ("yfactor", ".inf"),
        ("yfactor", "true"), ("where", "{nosuch: 1}"), ("where", "{policy: apex}"),
        ("normalize", "{column: policy, value: no-prefetch}"))}
    plots.update({"bar normalize 3": {"kind": "bar", "normalize": "3"},
                  "bar normalize nosuch": {"kind": "bar", "normalize": "{column: nosuch, value: 1}"},
                  "bar normalize apex": {"kind": "bar", "normalize": "{column: policy, value: apex}"},
                  "stack nosuch": {"kind": "stacked_bar", "stack": "{nosuch: a}"},
                  "per_layer nosuchfield": {"kind": "per_layer", "y": "nosuchfield"}})
    out = [(f"experiment: {name}", [], _experiment_case(plot), False, True) for name, plot in plots.items()]
    rows = {"metric nosuch": ("metric: latency_ms_per_token", "metric: nosuch"),
            "vs nosuch": ("why: w", "vs: nosuch, why: w"), "where 3": ("where: {policy: no-prefetch}", "where: 3"),
            "where nosuch": ("{policy: no-prefetch}", "{nosuch: 1}"), "paper .nan": ("paper: 1", "paper: .nan"),
            "paper reversed": ("paper: 1", "paper: [5, 1]")}
    for name, (old, new) in rows.items():
        row = EXPERIMENT_ROW.replace(old, new)
        out.append((f"experiment: compare {name}", [], _experiment_case({}, f"compare: [{row}]\n"), False, True))
    return out


def _edited_standard_case(key: str, name: str, old: str, new: str):
    """A copy of a built-in DRAM standard with one line changed, given to memory.<m>.standard."""
    def setup(tmp, argv):
        with open(os.path.join(ROOT, "chipsim", "dramsim", "standards", f"{name}.yaml"), encoding="utf-8") as f:
            text = f.read()
        assert old in text
        return argv + ["--set", f"{key}={_write(tmp, 's.yaml', text.replace(old, new))}"]
    return setup


def _physics_trace(edit):
    """_trace_case for a meta edit: `edit(meta, tokens)`."""
    return _trace_case(lambda a, m: edit(m, int(a["routed_ids"].shape[0])))


def _cases_physics() -> list:
    """Numbers that pass their key's type and bounds but break physics (DRAM timings, tiles, PCIe sizes,
    operation keys, trace metadata) and CLI options."""
    cycle = os.path.join(ROOT, "hwconfigs", "thor.yaml")
    cxl = os.path.join(ROOT, "hwconfigs", "thor-cxl.yaml")
    rc = ["run", cycle, "--policy", "no-prefetch", "--set", "workload.max_tokens=4", "--jobs", "1"]
    rp = ["run", os.path.join(ROOT, "hwconfigs", "phone-ufs.yaml")] + rc[2:]
    out = []
    sets = {  # name -> (argv, --set values)
        "pcie payload 100": (R, ["links.pcie.max_payload_bytes=100"]),
        "pcie payload 64": (R, ["links.pcie.max_payload_bytes=64"]),
        "pcie read request 768": (R, ["links.pcie.max_read_request_bytes=768"]),
        "cxl link as pcie link layer, 64 B": (R[:1] + [cxl] + R[2:], [
            "links.extra.cxl.timing_model=link-layer", "links.extra.cxl.encoding=flit",
            "links.extra.cxl.max_read_request_bytes=512", "links.extra.cxl.read_tags=768"]),
        "hbm with an lpddr5 standard": (R, ["memory.hbm.standard=lpddr5"]),
        "lpddr5x with an hbm3 standard": (R, ["memory.lpddr5x.standard=hbm3"]),
        "tile of 0.1 byte": (rc, ["compute.operand_tile_kib=0.0001"]),
        "request larger than a tile": (rc, ["compute.hbm_request_bytes=65537"]),
        "tiles larger than the sram": (rc, ["compute.operand_tile_kib=1025"]),
        "op_times_ns typo": (R, ['compute.op_times_ns={"matvec r1536 o1024 b314572": 5}']),
        "op_times_ns foreign width": (R, ['compute.op_times_ns={"matvec r1537 o1024 b3147776": 5}']),
        "op_times_ns malformed": (R, ['compute.op_times_ns={"matvec r1536 o1024": 5}']),
        "op_energy_pj unknown kind": (R, ['compute.op_energy_pj={"conv n1": 5}']),
        "flash queue depth 0": (rp, ["memory.ufs.queue_depth=0"]),
        "flash read command not whole pages": (rp, ["memory.ufs.io_bytes=20000"]),
        "flash read command below a page": (rp, ["memory.ufs.io_bytes=4096"]),
        "flash tR 0": (rp, ["memory.ufs.page_read_us=0"]),
        "flash as the operand memory": (rp, ["roles.operand_memory=ufs"]),
        "flash as the host memory": (rp, ["roles.host_memory=ufs"]),
        "flash with a DRAM key": (rp, ["memory.ufs.channels=4"]),
        "flash as a thor fetch path's store": (R, ["memory.lpddr5x={capacity_gib: 64, interface_gbps: 4, "
                                                   "internal_gbps: 4, page_read_us: 50, page_bytes: 16384, io_bytes: "
                                                   "16384, queue_depth: 0, command_overhead_us: 10, "
                                                   "read_energy_pj_per_bit: 50, idle_power_w: 0.1}"]),
    }
    for name, (argv, values) in sets.items():
        out.append((f"physics: {name}", argv + ["--json"] + [a for v in values for a in ("--set", v)], None, True,
                    True))
    standards = {
        "standard tck 0": ("memory.hbm.standard", "hbm3", "    tck_ps: 625", "    tck_ps: 0"),
        "standard nBL 0": ("memory.hbm.standard", "hbm3", "    nBL: 2", "    nBL: 0"),
        "standard nRFC above nREFI": ("memory.hbm.standard", "hbm3", "    nREFI: 6240", "    nREFI: 400"),
        "standard latency below zero": ("memory.lpddr5x.standard", "lpddr5", "    nCWL: 9", "    nCWL: 40"),
    }
    for name, (key, std, old, new) in standards.items():
        out.append((f"physics: {name}", R + ["--json"], _edited_standard_case(key, std, old, new), True, True))
    traces = {
        "trace_tokens disagrees": lambda m, t: m["provenance"].__setitem__("trace_tokens", t + 1),
        "trace_tokens a string": lambda m, t: m["provenance"].__setitem__("trace_tokens", str(t)),
        "top_k above num_experts": lambda m, t: m["model"].__setitem__("top_k", m["model"]["num_experts"] + 1),
        "no MoE layer": lambda m, t: m["model"].__setitem__("first_dense_layers", m["model"]["num_layers"]),
    }
    for name, edit in traces.items():
        out.append((f"physics: trace {name}", R + ["--json"], _physics_trace(edit), True, True))
    dram = ["dram", "hbm3", "--requests", "100"]
    cli = {
        "dram --seed -1": dram + ["--seed", "-1"], "dram --requests 10^12": ["dram", "hbm3", "--requests", "10" * 6],
        "dram --channels 100000": dram + ["--channels", "100000"], "dram --streams 100000": dram + ["--streams", "100000"],
        "dram --read-buffer 10^9": dram + ["--read-buffer", "1000000000"],
        "dram --write-buffer 0": dram + ["--write-buffer", "0"],
        "calibrate --window 10^9": ["calibrate", cycle, "--window", "512,1000000000"],
        "calibrate --window 1_000": ["calibrate", cycle, "--window", "1_000"],
        "policy parameter twice": R[:2] + ["--policy", "apex:tau=0.9,tau=0.6"] + R[4:],
        "sweep scheduler unreachable": ["sweep", THOR, "--grid", "dma.engines=1", "--policy", "no-prefetch", "--set",
                                        "workload.max_tokens=4", "--out", "s", "--backend", "dask", "--scheduler",
                                        "nope://x", "--quiet", "--jobs", "1"],
    }
    for name, argv in cli.items():
        out.append((f"physics: cli {name}", argv, None, False, True))
    return out


def cases() -> list[tuple[str, list[str], object, bool, bool]]:
    """(name, argv, setup, json_out, must_reject)."""
    out = []
    numeric = [(k, t) for k, t in thor_keys() if t in ("int", "float")]
    for key, _ in numeric:
        for v in VALUES:
            out.append((f"--set {key}={v}", R + ["--json", "--set", f"{key}={v}"], None, True, False))
    for name, cls in sorted(REGISTRY.items()):
        for param in cls.param_specs():
            for v in ("-1", "1.0e+308", ".nan", "abc", "2.5", "true", "[1]"):
                out.append((f"--policy {name}:{param}={v}", ["run", THOR, "--policy", f"{name}:{param}={v}", "--set",
                                                              "workload.max_tokens=4", "--jobs", "1", "--json"], None, True, False))
    for key in ("model.name", "workload.trace", "run.policies", "dma.demand_first", "compute.op_times_ns"):
        for v in ("''", "1", "[a]", "{a: b}", "nonexistent", "true"):
            out.append((f"--set {key}={v}", R + ["--json", "--set", f"{key}={v}"], None, True, False))
    configs = {
        "empty config": "", "list config": "- a\n", "malformed": "a: [\n", "unknown key": f"base: {THOR}\nfoo: 1\n",
        "unknown nested key": f"base: {THOR}\ncompute:\n  foo: 1\n", "section not a mapping": f"base: {THOR}\ncompute: 3\n",
        "base loop": "base: c.yaml\n", "base missing": "base: nowhere.yaml\n", "base not a string": "base: [1]\n",
        "policies not a mapping": f"base: {THOR}\npolicies: 3\n", "policy unknown": f"base: {THOR}\npolicies:\n  zzz: {{}}\n",
        "binary": "\x00\x01\x02", "tab indentation": f"base: {THOR}\ncompute:\n\tarrays: 2\n",
        "warmup above max_tokens": f"base: {THOR}\nworkload:\n  warmup_tokens: 8\n  max_tokens: 4\n",
        "hbm overflow": f"base: {THOR}\nexpert_buffer:\n  capacity_mib: 100000\n",
        "buffer below top-k": f"base: {THOR}\nexpert_buffer:\n  capacity_mib: 1\n",
        "trfc above trefi": f"base: {THOR}\nmemory:\n  hbm:\n    trfc_ns: 5000\n",
        "trace for another model": f"base: {THOR}\nmodel:\n  name: deepseek-v2-lite\n",
    }
    for name, text in configs.items():
        out.append((f"config: {name}", ["run", "X", "--policy", "no-prefetch", "--json", "--jobs", "1"],
                    _config_case(text), True, True))
    out.append(("config: missing file", ["run", "/nonexistent.yaml"], None, False, True))
    out.append(("config: a directory", ["run", ROOT], None, False, True))
    import numpy as np

    edits = {
        "NaN router weights": lambda a, m: a["routed_weights"].__setitem__((0, 0, 0), np.float16("nan")),
        "negative router weights": lambda a, m: a["routed_weights"].__setitem__((0, 0, 0), -1),
        "inf router prob": lambda a, m: a["router_rank_prob"].__setitem__((0, 0, 0), np.float16("inf")),
        "NaN draft confidence": lambda a, m: a["draft_conf"].__setitem__((0, 0, 0), np.float16("nan")),
        "draft confidence 2": lambda a, m: a["draft_conf"].__setitem__((0, 0, 0), 2),
        "negative counts": lambda a, m: a["train_expert_counts"].__setitem__((0, 0), -5),
        "provenance not a dict": lambda a, m: m.__setitem__("provenance", "x"),
        "provenance description a list": lambda a, m: m.__setitem__("provenance", {"description": [1]}),
        "synthetic a string": lambda a, m: m.__setitem__("synthetic", "no"),
        "schema_version 1.0": lambda a, m: m.__setitem__("schema_version", 1.0),
        "schema_version true": lambda a, m: m.__setitem__("schema_version", True),
        "model counts floats": lambda a, m: m["model"].__setitem__("top_k", 8.5),
        "model counts strings": lambda a, m: m["model"].__setitem__("top_k", "8"),
        "quality a list": lambda a, m: m.__setitem__("quality", [1]),
        "meta a list": lambda a, m: m.clear() or m.update({"x": 1}),
        "routed ids float": lambda a, m: a.__setitem__("routed_ids", a["routed_ids"].astype(np.float32)),
        "routed ids 3-d wrong": lambda a, m: a.__setitem__("routed_ids", a["routed_ids"][:, :, :4]),
        "object array": lambda a, m: a.__setitem__("token_ids", a["token_ids"].astype("U3")),
        "no routed ids": lambda a, m: a.pop("routed_ids"),
    }
    for name, edit in edits.items():
        for policy in ("no-prefetch", "adapmoe", "spice"):
            out.append((f"trace: {name} ({policy})", ["run", THOR, "--policy", policy, "--set", "workload.max_tokens=8",
                                                      "--json", "--jobs", "1"], _trace_case(edit), True, True))
    for kind in ("fifo", "dir", "truncated", "empty", "devzero"):
        out.append((f"trace file: {kind}", R, _special_trace(kind), False, True))
    for kind in ("out-file", "out-readonly", "timeline-fifo", "timeline-symlink", "timeline-dir", "timeline-is-out",
                 "timeline-missing-dir", "results-csv-fifo"):
        out.append((f"output: {kind}", R, _output_case(kind), False, True))
    misc = {
        "--jobs -1": R + ["--jobs", "-1"], "--jobs abc": R + ["--jobs", "abc"],
        "--timeline-tokens -1": R + ["--timeline", "t.json", "--timeline-tokens", "-1"],
        "policy twice": R + ["--policy", "no-prefetch"], "unknown policy": ["run", THOR, "--policy", "nope"],
        "empty policy": ["run", THOR, "--policy", ""], "policy param no value": ["run", THOR, "--policy", "apex:tau"],
        "--set no equals": R + ["--set", "compute.arrays"], "--set empty key": R + ["--set", "=3"],
        "--set section as value": R + ["--set", "compute=3"], "--set into a number": R + ["--set", "compute.arrays.x=1"],
        "sweep no grid values": ["sweep", THOR, "--grid", "dma.engines=", "--out", "s"],
        "sweep bad key": ["sweep", THOR, "--grid", "nope.x=1", "--out", "s"],
        "sweep jobs -1": ["sweep", THOR, "--grid", "dma.engines=1", "--out", "s", "--jobs", "-1"],
        "reproduce unknown": ["reproduce", "nope"], "plot missing dir": ["plot", "nowhere"],
        "inspect missing": ["inspect", "nowhere.npz"], "inspect a config": ["inspect", THOR],
        "hwcompare missing": ["hwcompare", "nowhere.json"], "no command": [],
        "hwcompare --held-out unknown": ["hwcompare", GRANITE_1B, "--held-out", "nope"],
        "hwcompare --cycle-level alone": ["hwcompare", GRANITE_1B, "--cycle-level", THOR],
        "hwcompare --json missing folder": ["hwcompare", GRANITE_1B, "--json", "nowhere/rows.json"],
    }
    for name, argv in misc.items():
        out.append((f"cli: {name}", argv, None, False, True))
    for more in (_cases_caches, _cases_provenance_packaging, _cases_policy_boundary, _cases_paths, _cases_physics,
                 _cases_experiments):
        out.extend(more())
    return out


def main_(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true", help="print every non-ok case and its detail")
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    import resource

    # a runaway read (a trace from /dev/zero) ends in MemoryError here rather than in the OOM killer
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    counts = {"ok": 0, "clean": 0, "traceback": 0, "bad": 0}
    todo = [c for c in cases() if not args.only or args.only in c[0]]
    with tempfile.TemporaryDirectory(prefix="chipsim-hostile-cache-") as cache:
        os.environ["CHIPSIM_CACHE_DIR"] = cache  # never the user's cache: the cases garble entries
        for name, argv_, setup, json_out, must_reject in todo:
            kind, detail = run_case(argv_, setup, json_out, must_reject)
            counts[kind] += 1
            if args.list and kind in ("traceback", "bad"):
                print(f"{kind:9} {name}: {detail}")
    print(f"{len(todo)} inputs: {counts['ok']} ok, {counts['clean']} clean errors, "
          f"{counts['traceback']} tracebacks, {counts['bad']} bad")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
