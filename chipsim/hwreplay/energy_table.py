"""A GPU's energy table from single-op microbenchmarks alone (validation/energy/probe_energy.py's windows; no
decode step is fitted):

- idle (W): the board with a CUDA context and nothing to run, its clocks up (the `idle_cold` and `idle_settled`
  windows, both at the board's resting temperature; `idle_warm` starts right after the GEMM, up to 20 °C warmer,
  and is kept for the record);
- the SMs busy (W), a byte read from HBM (pJ per bit) and a multiply-accumulate (pJ): three kernels that keep every
  SM busy, a chain of small GEMVs (3 MiB each, as a decode step's), a large GEMV and a GEMM, each give one
  equation: power above idle = busy + bytes per second × energy per byte + MACs per second × energy per MAC
  (with a GEMM clock probe, probe_gemm_clock.py, the GEMM's equation comes from its GEMMs paced below the power cap,
  per second of GEMM time, each window less its own idle power: the SM clock the cap would pull down stays up);
- PCIe (pJ per bit): the slope of the board's power over the rate of the host-to-device copies (back to back and
  paced by the host: four rates, least squares); the intercept is the board's power with the copy engine idle;
- with a `gemv_mid` window (GEMVs of 16 MiB, between the small and the large GEMV's rates), four equations for the
  three unknowns, solved by least squares: its residuals (`kernel_residuals_w`) say whether one line of busy power
  and HBM energy holds across rates;
- a check, not fitted: tiny kernels (1,000 adds of 1,024 elements, one block each) keep one SM at a time busy;
  their power above idle should be near zero.

The simulator's part that the board's counter sees: every ledger entry but the host's (`BOARD_EXCLUDES`).

What the board's counter sees is the GPU's: the host's memory and CPU are outside it (chipsim's `lpddr5x` and
`host_cpu` in the H200 configs), so a comparison with the simulator takes the same part of its energy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chipsim.errors import InputError

# ledger entries outside the board: the host DRAM holding the pinned experts and the host CPU
BOARD_EXCLUDES = ("lpddr5x", "static_lpddr5x", "host_cpu")


def board_mj(entries: dict) -> float:
    """A token's simulated energy that the GPU board's counter would see ({ledger entry: mJ} -> mJ)."""
    return sum(v for k, v in entries.items() if k not in BOARD_EXCLUDES)


@dataclass(frozen=True)
class EnergyFit:
    idle_w: float  # the board, nothing running, clocks up, at its resting temperature
    idle_warm_w: float  # the same right after the GEMM (for the record)
    busy_w: float  # every SM running a kernel, above idle
    hbm_pj_per_bit: float  # per bit read from HBM into the SMs
    mac_pj: float  # per BF16 multiply-accumulate
    pcie_pj_per_bit: float  # host-to-device copy, per bit moved (the copy's HBM write included)
    copy_idle_w: float  # the copies' line at zero rate
    copy_rates_gbps: tuple[float, ...]  # each copy window's rate, for the record
    copy_residuals_w: tuple[float, ...]  # measured less fitted power, per copy window
    tiny_above_idle_w: float  # the check: one-block kernels back to back
    kernel_residuals_w: tuple[tuple[str, float], ...] = ()  # each kernel window's measured less solved power, W


def _rate(window: dict, per_call: str) -> float:
    """Bytes or MACs per second over one window."""
    return window[per_call] * window["calls"] / window["seconds"]


def _windows(probe: dict, kind: str) -> list[dict]:
    windows = probe.get("windows") if isinstance(probe, dict) else None
    if not isinstance(windows, list):
        raise InputError("energy probe: no windows list (validation/energy/probe_energy.py writes one)")
    rows = [w for w in windows if isinstance(w, dict) and w.get("kind") == kind]
    if not rows:
        raise InputError(f"energy probe: no '{kind}' window (validation/energy/probe_energy.py writes them)")
    return rows


def _has_window(probe: dict, kind: str) -> bool:
    try:
        return bool(_windows(probe, kind))
    except InputError:
        return False


def _power(window: dict) -> float:
    return window["energy_j"] / window["seconds"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _paced_gemm_row(gemm_clock: dict) -> tuple[list[float], float]:
    """validation/energy/probe_gemm_clock.py's paced windows (the host idle between calls, so the power cap never
    pulls the SM clock down) as one row of the solve, per second of GEMM time (calls x a call's GEMM time): what the
    SMs draw at the clock a GEMM between other work runs at."""
    try:
        n = gemm_clock["shape"][0]
        per_call, call_s = gemm_clock["gemms_per_call"], gemm_clock["call_seconds"]
        ws = [w for w in gemm_clock["windows"] if w["gap_calls"] > 0]
        rows = [(w["calls"] * call_s, above_idle_j(w), w["calls"] * per_call * 3 * n * n * 2, w["macs"]) for w in ws]
    except (KeyError, TypeError, IndexError) as exc:
        raise InputError(f"GEMM clock probe: not probe_gemm_clock.py's output ({exc!r})") from None
    if not rows:
        raise InputError("GEMM clock probe: no paced window (gap_calls > 0)")
    busy_s = sum(r[0] for r in rows)
    if busy_s <= 0:
        raise InputError("GEMM clock probe: its paced windows ran no GEMM time (calls x call_seconds is 0)")
    return [1.0, sum(r[2] for r in rows) / busy_s, sum(r[3] for r in rows) / busy_s], sum(r[1] for r in rows) / busy_s


def derive(probe: dict, gemm_clock: dict | None = None) -> EnergyFit:
    """The energy table from a probe's windows (see the module doc); with `gemm_clock` (probe_gemm_clock.py), the
    GEMM's equation from its paced windows at the full SM clock instead of the back-to-back window at the cap's."""
    idle = _mean([_power(w) for w in _windows(probe, "idle_cold") + _windows(probe, "idle_settled")])
    warm = _mean([_power(w) for w in _windows(probe, "idle_warm")])
    copies = _windows(probe, "h2d_copy")
    xs = [_rate(w, "bytes_per_call") for w in copies]
    ys = [_power(w) for w in copies]
    if max(xs) - min(xs) <= 0.1 * max(xs):
        raise InputError("energy probe: the copy windows need rates at least 10 % apart to fit a slope")
    mx, my = _mean(xs), _mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)  # J per byte
    intercept = my - slope * mx
    # small GEMVs, a large GEMV, a GEMM: power above idle = busy + bytes/s * J/byte + MACs/s * J/MAC
    a, b = [], []
    kinds = ("gemv_small", "gemv") + (("gemv_mid",) if _has_window(probe, "gemv_mid")
                                      else ()) + (() if gemm_clock else ("gemm",))
    for kind in kinds:
        ws = _windows(probe, kind)
        a.append([1.0, _mean([_rate(w, "bytes_per_call") for w in ws]), _mean([_rate(w, "macs_per_call") for w in ws])])
        b.append(_mean([_power(w) for w in ws]) - idle)
    if gemm_clock:
        row, above_w = _paced_gemm_row(gemm_clock)
        a.append(row)
        b.append(above_w)
    scaled = np.array(a) / np.array(a).max(axis=0)  # columns of ~1: the condition number says what the data can
    if np.linalg.cond(scaled) > 1e6:                # tell apart, not the units
        raise InputError("energy probe: the three kernels' bytes and MACs per second are too alike to tell busy "
                         "power, HBM and MAC energy apart")
    if len(b) == 3:
        busy, per_byte, per_mac = np.linalg.solve(np.array(a), np.array(b))
    else:  # a middle-rate GEMV as well: least squares, and the residuals say whether one line holds them all
        busy, per_byte, per_mac = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)[0]
    residuals = tuple((kind, float(y - (busy * r[0] + per_byte * r[1] + per_mac * r[2])))
                      for kind, r, y in zip(kinds + (("gemm_paced",) if gemm_clock else ()), a, b))
    tiny = _mean([_power(w) for w in _windows(probe, "tiny_kernels")]) - idle
    return EnergyFit(idle_w=idle, idle_warm_w=warm, busy_w=float(busy), hbm_pj_per_bit=float(per_byte) / 8 * 1e12,
                     mac_pj=float(per_mac) * 1e12, pcie_pj_per_bit=slope / 8 * 1e12, copy_idle_w=intercept,
                     copy_rates_gbps=tuple(x / 1e9 for x in xs),
                     copy_residuals_w=tuple(y - (intercept + slope * x) for x, y in zip(xs, ys)),
                     tiny_above_idle_w=tiny, kernel_residuals_w=residuals)


def above_idle_j(window: dict) -> float:
    """A window read by chipsim.hwreplay.nvml.Meter: its energy above the board's idle power it recorded, J."""
    return float(window["energy_j"]) - float(window["idle_w"]) * float(window["seconds"])


def op_energy_rows(probe: dict) -> list[dict]:
    """validation/energy/probe_op_energy.py's windows as each kernel shape's energy above idle: (its window's power
    less the idle windows' mean) × the window's seconds / the kernels it ran; nJ per kernel, µs per kernel."""
    idle = _mean([_power(w) for w in _windows(probe, "idle")])
    rows = []
    for w in _windows(probe, "op"):
        kernels = w["kernels_per_call"] * w["calls"]
        rows.append({"key": w["key"], "users": w.get("users", []), "power_w": _power(w), "idle_w": idle,
                     "us_per_kernel": 1e6 * w["seconds"] / kernels,
                     "nj_per_kernel": 1e9 * (_power(w) - idle) * w["seconds"] / kernels})
    return rows


def modelled_op_energy_nj(hw, key: str, groups: int = 1) -> float:
    """What the config's energy table charges one operation alone, above the static power: its operand bytes over
    HBM and UCIe and through SRAM, its MACs, SFU and lane operations, and clock power over its time (or, with
    compute.clock_power_by_occupancy, over the share of the arrays it occupies). nJ."""
    from chipsim.hw.compute_formula import ArrayModel
    from chipsim.sim.energy import EnergyTable

    op = ArrayModel(hw).op_for_key(key, groups)
    t = EnergyTable.from_config(hw)
    bits = 8 * (op.hbm_read_bytes + op.hbm_write_bytes - op.unpriced_bytes)
    pj = (op.profiled_pj + bits * (t.pj_per_bit["hbm"] + t.pj_per_bit["ucie"])
          + bits * (t.pj_per_action["sram_read_bit"] + t.pj_per_action["sram_write_bit"])
          + op.macs * t.pj_per_action["mac"] + op.sfu_ops * t.pj_per_action["sfu_op"]
          + op.vector_ops * t.pj_per_action["vector_op"]
          + (op.occupied_ps if t.clock_by_occupancy else op.duration_ps) * t.clock_w)  # W × ps = pJ
    return pj / 1e3
