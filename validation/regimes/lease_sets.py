"""The --set options that plan a replay with what one lease measured (measure-bare.sh's keyed step): each op group's
kernels in sequence (compute.in_sequence_ns from probe_step_costs.py's files, as `gpuconfig --step-costs` writes it)
and, given probe_copy_source.py's file, the link's cold fit (links.pcie.bandwidth_gbps, dma.setup_ns).

    python validation/regimes/lease_sets.py STEP_COSTS.json... [--copy-source COPY_SOURCE.json]

Prints the options on one line; a missing or foreign file is one line on stderr and exit 2.
"""
import argparse
import sys

from chipsim.errors import InputError
from chipsim.files import read_json
from chipsim.hwreplay.gpuconfig import in_sequence_ns


def lease_sets(step_costs: list[str], copy_source: str | None) -> list[str]:
    ns, _ = in_sequence_ns([(p, read_json(p, "step-cost file")) for p in step_costs])
    sets = [f"compute.in_sequence_ns.{group}={value}" for group, value in ns.items()]
    if copy_source:
        try:
            cold = read_json(copy_source, "copy-source file")["fit"]["cold"]
            rate, setup_us = float(cold["bandwidth_gbps"]), float(cold["intercept_us"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{copy_source}: not probe_copy_source.py's output (no fit.cold)")
        sets += [f"links.pcie.bandwidth_gbps={rate}", f"dma.setup_ns={round(1e3 * setup_us)}"]
    return sets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step_costs", nargs="+", help="probe_step_costs.py's files from the lease")
    parser.add_argument("--copy-source", help="probe_copy_source.py's file from the lease")
    args = parser.parse_args(argv)
    try:
        print(" ".join(f"--set {s}" for s in lease_sets(args.step_costs, args.copy_source)))
    except InputError as e:
        print(f"lease_sets: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
