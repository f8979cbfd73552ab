"""A replay's activity record (chipsim.hwreplay.activity) beside the simulator and the config's keys, case by case:

    python -m chipsim.hwreplay.compare_activity RESULT.json [RESULT.json ...]   (decode replays run with --activity)

Per token over all of a replay's tokens, warm-up included (the record has no token marks): the token's time untraced
(the measured replay's CUDA events), traced, and simulated (the plan as replayed); the compute stream's busy time, its
waits for copies beside the simulator's stall, its other gaps; the hand-off's median beside compute.copy_wait_ns; the
copies' own fit beside links.<expert link>.bandwidth_gbps and dma.setup_ns.
"""

from __future__ import annotations

from chipsim.errors import InputError, OneLineParser, run_module_main


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

    files = [(p, read_json(p, "hwreplay result")) for p in a.results]
    for p, meas in files:
        if not isinstance(meas, dict) or not isinstance(meas.get("cases"), list):
            raise InputError(f"hwreplay result {p}: not a chipsim hwreplay measurement file (no cases list)")
        if not any(c.get("activity") for c in meas["cases"]):
            raise InputError(f"hwreplay result {p}: no case was replayed with --activity")
    for p, meas in files:
        print(f"{p} ({meas.get('device', '?')})")
        print("\n".join(case_lines(meas, _config_keys(meas, p))))
    return 0


if __name__ == "__main__":
    run_module_main(main)
