"""The H200's energy table from single-op microbenchmarks alone (validation/energy/probe_energy.py's windows; no
decode step is fitted):

- idle (W): the board with nothing to run right after a load, its clocks still up, as between a decode step's
  kernels (the `idle_warm` windows);
- PCIe (pJ per bit): the slope of the board's power over the rate of the host-to-device copies (back to back and
  paced by the host: four rates, least squares); the intercept is the board's power with the copy engine idle;
- HBM (pJ per bit) and a multiply-accumulate (pJ): the GEMV's and the GEMM's power above idle, each the sum of
  its bytes read from HBM times the energy of a bit and its MACs times the energy of a MAC. Two operations with
  very different bytes per MAC (the GEMV ~2, the GEMM ~1/2,700 of operands) give two equations in the two unknowns.

What the board's counter sees is the GPU's: the host's memory and CPU are outside it (chipsim's `lpddr5x` and
`host_cpu` in the H200 configs), so a comparison with the simulator takes the same part of its energy.
"""

from __future__ import annotations

from dataclasses import dataclass

from chipsim.errors import InputError


@dataclass(frozen=True)
class EnergyFit:
    idle_w: float  # the board, nothing running, clocks up
    idle_cold_w: float  # the board before any work (clocks down): for the record
    copy_idle_w: float  # the copies' line at zero rate
    pcie_pj_per_bit: float  # host-to-device copy, per bit moved
    hbm_pj_per_bit: float  # per bit read by the GEMV and the GEMM
    mac_pj: float  # per BF16 multiply-accumulate
    copy_rates_gbps: tuple[float, ...]  # each copy window's rate, for the record
    copy_residuals_w: tuple[float, ...]  # measured less fitted power, per copy window


def _rate(window: dict, per_call: str) -> float:
    """Bytes or MACs per second over one window."""
    return window[per_call] * window["calls"] / window["seconds"]


def _windows(probe: dict, kind: str) -> list[dict]:
    rows = [w for w in probe.get("windows", []) if w.get("kind") == kind]
    if not rows:
        raise InputError(f"energy probe: no '{kind}' window (validation/energy/probe_energy.py writes them)")
    return rows


def _power(window: dict) -> float:
    return window["energy_j"] / window["seconds"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def derive(probe: dict) -> EnergyFit:
    """The energy table from a probe's windows (see the module doc)."""
    idle = _mean([_power(w) for w in _windows(probe, "idle_warm")])
    cold = _mean([_power(w) for w in _windows(probe, "idle_cold")])
    copies = _windows(probe, "h2d_copy")
    xs = [_rate(w, "bytes_per_call") for w in copies]
    ys = [_power(w) for w in copies]
    if max(xs) - min(xs) <= 0.1 * max(xs):
        raise InputError("energy probe: the copy windows need rates at least 10 % apart to fit a slope")
    mx, my = _mean(xs), _mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)  # J per byte
    intercept = my - slope * mx
    # GEMV and GEMM: power above idle = bytes/s * J/byte + MACs/s * J/MAC
    rows = []
    for kind in ("gemv", "gemm"):
        ws = _windows(probe, kind)
        rows.append((_mean([_rate(w, "bytes_per_call") for w in ws]), _mean([_rate(w, "macs_per_call") for w in ws]),
                     _mean([_power(w) for w in ws]) - idle))
    (b1, m1, p1), (b2, m2, p2) = rows
    det = b1 * m2 - b2 * m1
    if abs(det) <= 1e-9 * abs(b1 * m2):
        raise InputError("energy probe: the GEMV and the GEMM have the same bytes per MAC; HBM and MAC energy "
                         "cannot be told apart")
    per_byte = (p1 * m2 - p2 * m1) / det
    per_mac = (b1 * p2 - b2 * p1) / det
    return EnergyFit(idle_w=idle, idle_cold_w=cold, copy_idle_w=intercept, pcie_pj_per_bit=slope / 8 * 1e12,
                     hbm_pj_per_bit=per_byte / 8 * 1e12, mac_pj=per_mac * 1e12,
                     copy_rates_gbps=tuple(x / 1e9 for x in xs),
                     copy_residuals_w=tuple(y - (intercept + slope * x) for x, y in zip(xs, ys)))
