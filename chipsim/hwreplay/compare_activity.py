"""A replay's activity record (chipsim.hwreplay.activity) beside the simulator and the config's keys, case by case:

    python -m chipsim.hwreplay.compare_activity RESULT.json [RESULT.json ...]   (decode replays run with --activity)

Per token over all of a replay's tokens, warm-up included (the record has no token marks): the token's time untraced
(the measured replay's CUDA events), traced, and simulated (the plan as replayed); the compute stream's busy time, its
waits for copies beside the simulator's stall, its other gaps; the hand-off's median beside compute.copy_wait_ns; the
copies' own fit beside links.<expert link>.bandwidth_gbps and dma.setup_ns.
"""

from __future__ import annotations

from chipsim.errors import InputError, OneLineParser, run_module_main
from chipsim.hwreplay.checks import MISSING, WHOLE_POSITIVE, field, numbers, obj, objects
from chipsim.values import NON_NEGATIVE, POSITIVE

# the record's per-token figures (ms) every traced case has, and those of a record with kernels (a GPU's)
PER_TOKEN = ("latency_ms_per_token", "sim_latency_ms_per_token")
RECORD_PER_TOKEN = ("span_ms_per_token", "compute_busy_ms_per_token", "sim_busy_ms_per_token",
                    "compute_waits_for_copies_ms_per_token", "sim_stall_ms_per_token",
                    "compute_other_gaps_ms_per_token")


def case_lines(meas: dict, config_keys: dict) -> list[str]:
    """One block per case replayed with --activity: the record beside the untraced replay and the simulator."""
    out = []
    for case in meas.get("cases", []):
        a = case.get("activity")
        if not a:
            continue
        untraced = sum(case["latency_ms"]) / len(case["latency_ms"])
        out.append(f"{meas['model']} @{case['context_length']} {case['policy']}: ms a token over all "
                   f"{len(case['latency_ms'])} tokens: untraced {untraced:.3f}, traced {a['latency_ms_per_token']:.3f}, "
                   f"simulated {a['sim_latency_ms_per_token']:.3f}")
        if not a.get("kernels"):
            out.append("  no kernel in the record (a CPU dry run)")
            continue
        out += _record_lines(a, config_keys)
    return out


def _record_lines(a: dict, keys: dict) -> list[str]:
    h, c = a.get("handoff", {}), a["copies"]
    fit = c.get("fit") or {}
    model_us = lambda n: (keys["setup_ns"] + n / keys["bandwidth_gbps"]) / 1e3  # noqa: E731  (1 GB/s = 1 B/ns)
    lines = [f"  record: {'complete' if a['complete'] else 'INCOMPLETE (copies missing: the profiler buffer filled)'}"
             f", {a['kernels'] / a['tokens']:.0f} kernels a token, first to last "
             f"{a['span_ms_per_token']:.3f} ms a token (the traced replay's events: {a['latency_ms_per_token']:.3f})",
             f"  compute busy {a['compute_busy_ms_per_token']:.3f} (simulated arrays busy {a['sim_busy_ms_per_token']:.3f}),"
             f" gaps a copy ended in {a['compute_waits_for_copies_ms_per_token']:.3f} (simulated stall "
             f"{a['sim_stall_ms_per_token']:.3f}), other gaps {a['compute_other_gaps_ms_per_token']:.3f}; hand-off "
             f"median {h.get('median_us', 'n/a')} us (compute.copy_wait_ns {keys['copy_wait_ns']:.0f} ns)",
             f"  copies {c['n']} on {c['streams']} stream(s), {c['alone']} with the link to themselves, busy "
             f"{c['busy_ms_per_token']:.3f} ms a token; a copy's start after a kernel median "
             f"{a['copy_start_after_kernel'].get('median_us', 'n/a')} us, after a copy "
             f"{a['copy_after_copy'].get('median_us', 'n/a')} us"]
    lines += [f"  copies of {b['bytes']} B alone: median {b['median_us']} us over {b['n']} (the config's link: "
              f"{model_us(b['bytes']):.3f} us = dma.setup_ns {keys['setup_ns']:.0f} + bytes at "
              f"{keys['bandwidth_gbps']:.3f} GB/s)" for b in c["by_size"]]
    if fit:
        lines.append(f"  their fit: {fit['bandwidth_gbps']} GB/s + {fit['intercept_us']} us")
    return lines


def check_result(meas, path: str) -> dict:
    """A result file's fields the report reads, each case with a record checked (one line naming the field):
    finite numbers, at least 0 (a count of tokens or a latency positive), of the kinds the lines divide and print."""
    label = f"hwreplay result {path}"
    meas = obj(label, meas, "")
    cases = objects(label, meas.get("cases", MISSING), "cases")
    for name in ("model", "config"):
        field(label, meas, "", name, str)
    traced = 0
    for i, case in enumerate(cases):
        if case.get("activity"):
            _check_traced_case(label, case, f"cases[{i}]")
            traced += 1
    if not traced:
        raise InputError(f"{label}: no case was replayed with --activity")
    return meas


def _check_traced_case(label: str, case: dict, at: str) -> None:
    field(label, case, at, "context_length", int, WHOLE_POSITIVE)
    field(label, case, at, "policy", str)
    numbers(label, case.get("latency_ms", MISSING), f"{at}.latency_ms", POSITIVE)
    where = f"{at}.activity"
    a = obj(label, case["activity"], where)
    for name in PER_TOKEN:
        field(label, a, where, name, float, NON_NEGATIVE)
    if not field(label, a, where, "kernels", int, NON_NEGATIVE):
        return  # a CPU dry run's record: nothing more is read
    field(label, a, where, "tokens", int, WHOLE_POSITIVE)
    field(label, a, where, "complete", bool)
    for name in RECORD_PER_TOKEN:
        field(label, a, where, name, float, NON_NEGATIVE)
    for name in ("handoff", "copy_start_after_kernel", "copy_after_copy"):
        spread = obj(label, a.get(name, {} if name == "handoff" else MISSING), f"{where}.{name}")
        field(label, spread, f"{where}.{name}", "median_us", float, NON_NEGATIVE, None)
    _check_copies(label, obj(label, a.get("copies", MISSING), f"{where}.copies"), f"{where}.copies")


def _check_copies(label: str, c: dict, where: str) -> None:
    for name in ("n", "streams", "alone"):
        field(label, c, where, name, int, NON_NEGATIVE)
    field(label, c, where, "busy_ms_per_token", float, NON_NEGATIVE)
    for j, size in enumerate(objects(label, c.get("by_size", MISSING), f"{where}.by_size", 0)):
        field(label, size, f"{where}.by_size[{j}]", "bytes", int, WHOLE_POSITIVE)
        field(label, size, f"{where}.by_size[{j}]", "median_us", float, NON_NEGATIVE)
        field(label, size, f"{where}.by_size[{j}]", "n", int, NON_NEGATIVE)
    fit = obj(label, c.get("fit") or {}, f"{where}.fit")
    if fit:
        field(label, fit, f"{where}.fit", "bandwidth_gbps", float, POSITIVE)
        field(label, fit, f"{where}.fit", "intercept_us", float)


def _config_keys(meas: dict, path: str) -> dict:
    from chipsim.hw.config import load_config
    from chipsim.hw.machine import roles
    from chipsim.hwreplay.compare import _resolve, replayed_overrides

    hw = load_config(_resolve(meas["config"], path), replayed_overrides(meas)).hw
    link = hw.links[roles(hw).expert_link]  # the host-to-GPU copy's link, at the data rate the simulator moves bytes
    return {"copy_wait_ns": hw.compute.copy_wait_ns, "setup_ns": hw.dma.setup_ns, "bandwidth_gbps": link.data_gbps}


def main(argv=None) -> int:
    from chipsim.files import read_json

    ap = OneLineParser(prog="python -m chipsim.hwreplay.compare_activity", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", metavar="RESULT.json", help="hwreplay result files (run --activity)")
    a = ap.parse_args(argv)

    files = [(p, check_result(read_json(p, "hwreplay result"), p)) for p in a.results]
    # every file's lines before the first is printed: a bad config of a later file leaves no half report
    blocks = [[f"{p} ({meas.get('device', '?')})", *case_lines(meas, _config_keys(meas, p))] for p, meas in files]
    for block in blocks:
        print("\n".join(block))
    return 0


if __name__ == "__main__":
    run_module_main(main)
