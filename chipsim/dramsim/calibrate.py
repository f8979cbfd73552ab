"""The command-level DRAM model calibrates the event-level system model: for a memory of a config
(`memory.<name>.timing_model: command-level` with a `standard`), it runs the streams the system model meets and
turns them into the three figures the shared-resource model uses:

- efficiency: sequential reads with refresh (an operand stream, a DMA read, the host CPU's reads), bandwidth over
  the data-bus peak; the config's peak times it is the memory's effective bandwidth;
- turnaround: the extra capacity a written byte costs while reads run, from a sequential read stream beside a
  sequential write stream in another region, at the write share w the run produces (fetch writes beside operand
  reads; the two drift over each other's banks): reaching total T against C read-only gives
  (1 - w) T + w T (1 + turnaround) = C;
- shared efficiency: where a second reader shares the memory (the host CPU reading experts beside the DMA
  reading them), two sequential read streams at the share r of the second, bandwidth over the peak;
- access latency: the average read latency of a lone request (the first byte of a fetch or of an operand stream).

The standard is re-timed for the config first: its clock follows `data_rate_mtps`, parameters JEDEC defines in
ns scale with it (the others are clock counts), and the config's ns keys (tcl_ns, trcd_ns, ...) set theirs.
Results are cached by content hash (the re-timed standard, the streams, the controller and this model's code)
in $CHIPSIM_CACHE_DIR/dram (default ~/.cache/chipsim/dram), so each config calibrates once; an entry is checked
(chipsim.cache: checksum, inputs, `check_calibration`) before it is used, and calibrated again if it fails.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import fields
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from chipsim import cache
from chipsim.dramsim.controller import ControllerConfig, DramResult, simulate
from chipsim.dramsim.standard import Standard, load_standard, standard_file_sha256
from chipsim.dramsim.mapping import Mapping
from chipsim.dramsim.streams import requests, stream_mapping
from chipsim.errors import InputError
from chipsim.files import cache_dir

REFRESH_PERIODS = 12  # whole refresh intervals each stream is measured over (efficiency to 0.1 %, turnaround to ~2 %)
LONE_REQUESTS = 200
MAX_PARAM_CYCLES = 10_000_000  # a timing beyond this is no DRAM (and would take the model minutes)
CONTROLLER = ControllerConfig()  # a config's memory.<name> keys set the queues, watermarks and mapping
_CODE_FILES = ("controller.py", "standard.py", "streams.py", "mapping.py", "calibrate.py")


@dataclass(frozen=True)
class Calibration:
    efficiency: float  # sequential reads with refresh / data-bus peak
    turnaround: float
    access_latency_ns: float
    write_share: float
    read_gbps: float  # the model's sequential-read bandwidth (its own organisation)
    mixed_gbps: float
    peak_gbps: float
    loaded_read_latency_ns: float  # average read latency of the saturating read stream
    second_read_share: float  # the second reader's share of the shared-read streams (0: none measured)
    shared_efficiency: float  # two read streams at that share / data-bus peak (efficiency when there is none)

    def as_dict(self) -> dict:
        return asdict(self)


# the built-in memories' kinds: the family a standard's name must belong to (a memory.extra.<name> may take any)
MEMORY_KINDS = {"memory.hbm": ("HBM", "hbm3"), "memory.lpddr5x": ("LPDDR", "lpddr5")}


def _check_kind(std: Standard, key: str) -> None:
    """memory.hbm is an HBM and memory.lpddr5x an LPDDR: a standard of another family would time one memory by
    another's organisation and commands."""
    if key not in MEMORY_KINDS:
        return
    kind, example = MEMORY_KINDS[key]
    if not std.name.upper().startswith(kind):
        raise InputError(f"{key}.standard: {std.path} describes {std.name}, not an {kind} memory ({key} takes a "
                         f"standard whose name starts with {kind}, as {example}'s does)")


def controller_of(cfg) -> ControllerConfig:
    """The controller a config's memory describes: its queues and write-drain watermarks."""
    return replace(CONTROLLER, read_buffer=cfg.read_queue_entries, write_buffer=cfg.write_queue_entries,
                   write_high_watermark=cfg.write_high_watermark, write_low_watermark=cfg.write_low_watermark)


def _check_bus(cfg, std: Standard, key: str) -> None:
    """A memory's channel width and burst length are its standard's: another kind's standard (an HBM's 2 x 32-bit
    pseudo-channels and BL8 for a 16-bit LPDDR5X channel of BL16) would time one memory by another's bus."""
    bits = std.org.channel_width_bits
    for count in std.org.counts[1:std.data_level + 1]:
        bits *= count  # data-level nodes per channel (HBM's pseudo-channels) share the channel's pins
    for name, mine, theirs in (("channel_width_bits", cfg.channel_width_bits, bits),
                               ("burst_length", cfg.burst_length, std.org.burst_length)):
        if mine != theirs:
            raise InputError(f"{key}.{name}: {mine}, but {key}.standard {std.name} has {theirs} ({std.org_name}): a "
                             "standard of another kind of memory, or a key to correct")


def retimed_standard(cfg, key: str) -> Standard:
    """The config's standard, organisation and timing preset, re-timed to its data rate and ns keys."""
    try:
        template = load_standard(cfg.standard)
    except InputError as exc:
        raise InputError(f"{key}.standard: {exc}") from None
    _check_kind(template, key)  # the kind first: another kind's file lacks this one's presets
    _check_bus(cfg, template, key)
    try:
        base = load_standard(cfg.standard, cfg.organization or None, cfg.timing_preset or None)
    except InputError as exc:
        raise InputError(f"{key}.standard: {exc}") from None
    p = base.params
    beats_per_ck = base.org.burst_length / p["nBL"]
    tck_ps = round(beats_per_ck * 1e6 / cfg.data_rate_mtps)
    overrides = {"rate_mtps": int(round(cfg.data_rate_mtps)), "tck_ps": tck_ps}
    if tck_ps != base.tck_ps:
        for name in base.ns_params:
            overrides[name] = math.ceil(p[name] * base.tck_ps / tck_ps - 1e-9)
    _check_org_timings(cfg, base, key)
    for cfg_key, param in base.config_keys.items():
        overrides[param] = math.ceil(getattr(cfg, cfg_key) * 1000 / tck_ps - 1e-9)
    for param, value in overrides.items():
        if param not in ("rate_mtps", "tck_ps") and value > MAX_PARAM_CYCLES:
            raise InputError(f"{key}: {param} comes to {value} cycles of {tck_ps} ps, beyond the command-level model's "
                             f"{MAX_PARAM_CYCLES} (timing_model: closed-form takes any value)")
    p = {**p, **overrides}
    if "nREFI" in p and "nRFC" in p and p["nRFC"] >= p["nREFI"]:
        raise InputError(f"{key}: at {tck_ps} ps per cycle the refresh time nRFC ({p['nRFC']}) is not shorter than "
                         f"nREFI ({p['nREFI']})")
    try:
        return load_standard(base.path, base.org_name, base.timing_name, overrides)
    except InputError as exc:  # the preset re-timed breaks a rule of the standard (a latency below zero, ...)
        raise InputError(f"{key}: re-timed to {tck_ps} ps per cycle, {exc}") from None


def _check_org_timings(cfg, std: Standard, key: str) -> None:
    """A config that names its organisation takes that die density's timings (tRFC): its own ns key for one must
    agree, as a refresh time of another density would time one die by another's. (A config that names none uses
    the standard's first organisation as a template, and its ns keys describe its part.)"""
    if not cfg.organization:
        return
    by_density = dict(std.org.timings_ns)
    tck_ns = std.tck_ps / 1000
    for cfg_key, param in std.config_keys.items():  # the same cycles at the standard's clock are the same timing
        if param in by_density and math.ceil(getattr(cfg, cfg_key) / tck_ns - 1e-9) != \
                math.ceil(by_density[param] / tck_ns - 1e-9):
            raise InputError(f"{key}.{cfg_key}: {getattr(cfg, cfg_key):g} ns, but organisation {std.org_name} of "
                             f"{os.path.basename(std.path)} sets {by_density[param]:g} ns (its die density); give "
                             f"{by_density[param]:g} or the organisation of that density ({key}.organization)")


def _code_hash() -> str:
    return cache.sources_sha256(__file__, _CODE_FILES)


def _memory_spec(std: Standard, controller: ControllerConfig, mapping: Mapping) -> dict:
    """What every stream of a calibration depends on besides the shares: the re-timed standard (its file's contents
    too), the controller and the address mapping."""
    return {"standard": standard_file_sha256(std.path)[1], "org": std.org_name, "timing": std.timing_name,
            "params": std.params, "controller": asdict(controller),
            "mapping": [list(map(list, mapping.fields)), list(mapping.xor)]}


def cache_key(std: Standard, write_share: float, second_read_share: float = 0.0,
              controller: ControllerConfig = CONTROLLER, mapping: Mapping | None = None) -> str:
    mapping = mapping or stream_mapping(std)
    spec = {**_memory_spec(std, controller, mapping), "write_share": write_share,
            "second_read_share": second_read_share, "requests": [REFRESH_PERIODS, LONE_REQUESTS], "code": _code_hash()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


# The read stream and the lone requests do not depend on the shares: a process that calibrates one memory at several
# write shares (each link bandwidth of a sweep gives its own) simulates them once. Forgotten with calibrate.cache_clear.
_SHARE_FREE: dict[str, tuple[DramResult, DramResult]] = {}
_SHARE_FREE_MAX = 32


def _share_free_streams(std: Standard, controller: ControllerConfig, mapping: Mapping, count: int,
                        window: tuple[int, int]) -> tuple[DramResult, DramResult]:
    """(the sequential read stream with refresh over `window`, lone random reads far apart) of this memory."""
    key = json.dumps([_memory_spec(std, controller, mapping), count, window, LONE_REQUESTS], sort_keys=True)
    if key not in _SHARE_FREE:
        read = simulate(std, requests(std, count, seed=11, mapping=mapping), offers_per_cycle=4,
                        controller=replace(controller, refresh="all-bank"), window=window)
        # one request at a time, far apart: each finds its bank closed (random rows), nothing queued before it
        lone = simulate(std, requests(std, LONE_REQUESTS, kind="random", seed=11), interval=1000,
                        controller=replace(controller, refresh="off"))
        if len(_SHARE_FREE) >= _SHARE_FREE_MAX:
            _SHARE_FREE.clear()
        _SHARE_FREE[key] = (read, lone)
    return _SHARE_FREE[key]


def run_calibration(std: Standard, write_share: float, label: str = "", second_read_share: float = 0.0,
                    controller: ControllerConfig = CONTROLLER, mapping: Mapping | None = None) -> Calibration:
    from tqdm import tqdm

    mapping = mapping or stream_mapping(std)
    cfg = replace(controller, refresh="all-bank")
    # the streams are measured over whole refresh intervals (after the first), so refresh is counted exactly
    period = std.params["nREFI"]
    window = (period, period * (1 + REFRESH_PERIODS))
    count = int(REFRESH_PERIODS * period * std.peak_gbps(1) * std.tck_ps * 1e-3 / std.org.burst_bytes * 1.2) + 4000
    with tqdm(total=4 if second_read_share else 3, desc=f"calibrating {label or std.name} (command-level "
              f"{std.name})", unit="stream", file=sys.stderr, leave=False, disable=not sys.stderr.isatty()) as bar:
        read, lone = _share_free_streams(std, controller, mapping, count, window)
        bar.update(2)
        mixed = simulate(std, requests(std, count, streams=2, paces=(1 - write_share, write_share),
                                       write_streams=(1,), mapping=mapping), offers_per_cycle=4, controller=cfg,
                         window=window)
        bar.update(1)
        shared = read
        if second_read_share:
            shared = simulate(std, requests(std, count, streams=2, paces=(1 - second_read_share, second_read_share),
                                            mapping=mapping), offers_per_cycle=4, controller=cfg, window=window)
            bar.update(1)
    peak = std.peak_gbps(1)
    turnaround = max(0.0, (read.bandwidth_gbps / mixed.bandwidth_gbps - 1) / write_share)
    return Calibration(efficiency=read.bandwidth_gbps / peak, turnaround=turnaround,
                       access_latency_ns=lone.read_latency_avg_ns, write_share=write_share,
                       read_gbps=read.bandwidth_gbps, mixed_gbps=mixed.bandwidth_gbps, peak_gbps=peak,
                       loaded_read_latency_ns=read.read_latency_avg_ns, second_read_share=second_read_share,
                       shared_efficiency=shared.bandwidth_gbps / peak)


def calibrate(cfg, key: str, write_share: float, second_read_share: float = 0.0) -> Calibration:
    """The calibration of memory `cfg` (a DramConfig; `key` its dotted config section), from the cache or
    computed (a few seconds) and cached. `second_read_share` > 0 also measures two readers sharing it."""
    return _calibrate(cfg, key, write_share, second_read_share, _standard_sha256(cfg.standard, key))


def _standard_sha256(name_or_path: str, key: str) -> str:
    """The contents of the standard's file: a process that calibrated a memory before it was edited (a notebook,
    a sweep from Python) calibrates it again."""
    try:
        return standard_file_sha256(name_or_path)[1]
    except InputError as exc:
        raise InputError(f"{key}.standard: {exc}") from None


@lru_cache(maxsize=64)
def _calibrate(cfg, key: str, write_share: float, second_read_share: float, standard_sha256: str) -> Calibration:
    std = retimed_standard(cfg, key)
    write_share = round(min(0.5, max(0.05, write_share)), 3)
    second_read_share = round(min(0.5, max(0.05, second_read_share)), 3) if second_read_share else 0.0
    controller = controller_of(cfg)
    mapping = stream_mapping(std, 1, cfg.address_mapping, cfg.address_xor, key)
    digest = cache_key(std, write_share, second_read_share, controller, mapping)
    path = cache.entry_path(cache_dir("dram"), digest)
    payload = cache.read(path, "dram", digest, lambda p: check_calibration(p, write_share, second_read_share))
    if payload is not None:
        return Calibration(**payload)
    result = run_calibration(std, write_share, key, second_read_share, controller, mapping)
    cache.write(path, "dram", digest, result.as_dict())
    return result


def _forget_calibrations() -> None:
    """Forget the process's calibrations and streams: only the cache's files are left, as for a new process."""
    _calibrate.cache_clear()
    _SHARE_FREE.clear()


calibrate.cache_clear = _forget_calibrations  # type: ignore[attr-defined]


def check_calibration(payload, write_share: float | None = None, second_read_share: float | None = None) -> None:
    """A cached calibration is usable: every field a finite number in its range, consistent with itself and
    (when given) measured at these shares; raises cache.BadEntry."""
    cache.mapping(payload, "calibration", [f.name for f in fields(Calibration)])
    n = cache.number
    for name in ("efficiency", "shared_efficiency"):
        n(payload[name], name, low=0.0, low_open=True, high=1.0)
    for name in ("read_gbps", "mixed_gbps", "peak_gbps"):
        n(payload[name], name, low=0.0, low_open=True)
    for name in ("turnaround", "access_latency_ns", "loaded_read_latency_ns"):
        n(payload[name], name, low=0.0)
    n(payload["write_share"], "write_share", low=0.05, high=0.5)
    if payload["second_read_share"] != 0.0:
        n(payload["second_read_share"], "second_read_share", low=0.05, high=0.5)
    else:
        n(payload["second_read_share"], "second_read_share", low=0.0, high=0.0)
    if not math.isclose(payload["efficiency"], payload["read_gbps"] / payload["peak_gbps"], rel_tol=1e-9):
        raise cache.BadEntry("efficiency is not read_gbps / peak_gbps")
    for name, wanted in (("write_share", write_share), ("second_read_share", second_read_share)):
        if wanted is not None and payload[name] != wanted:
            raise cache.BadEntry(f"{name}: {payload[name]}, measured for {wanted}")
