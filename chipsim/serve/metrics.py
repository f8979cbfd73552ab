"""What a served run reports (workload.requests): per request, TTFT (arrival to its first output token: queueing,
prefill and the steps it shared), TPOT (its later tokens' mean interval), queueing delay (arrival to the start of
the first step it ran in) and end-to-end time; their p50/p90/p99 over the requests; throughput over the run's span
(first arrival to last finish); SLO attainment; energy per request and per output token, the chip's idle time
between steps counted at its static power; and Little's law: the mean number of requests in the system counted as
arrivals and finishes happened, against throughput times mean latency."""

from __future__ import annotations

import numpy as np

from chipsim.errors import InputError
from chipsim.sim.energy import EnergyTable
from chipsim.sim.metrics import PJ_PER_MJ, per_token_energy_pj
from chipsim.sim.record import ServedRecord, SimResult
from chipsim.units import PS_PER_MS


# the columns a served run's row carries (results table, results.csv, sweeps)
SERVED_COLUMNS = ("requests", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p90",
                  "tpot_ms_p99", "queue_ms_p50", "queue_ms_p99", "e2e_ms_mean", "requests_per_s", "tokens_per_s",
                  "energy_mj_per_request", "energy_mj_per_output_token", "slo_attainment")

SLO_KEYS = ("ttft_ms", "tpot_ms")


def parse_slo(text: str | None) -> dict[str, float]:
    """--slo ttft_ms=…,tpot_ms=… (either or both) as a mapping; one line naming what is wrong."""
    if text is None:
        return {}
    out: dict[str, float] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in SLO_KEYS or not eq:
            raise InputError(f"--slo {text}: expected ttft_ms=VALUE and/or tpot_ms=VALUE, comma-separated")
        try:
            limit = float(value)
        except ValueError:
            raise InputError(f"--slo {text}: {key}={value!r} is not a number of milliseconds") from None
        if not np.isfinite(limit) or limit <= 0 or key in out:
            raise InputError(f"--slo {text}: {key} must be given once, a positive number of milliseconds")
        out[key] = limit
    return out


def per_request(served: ServedRecord) -> dict[str, np.ndarray]:
    """Each request's times in ms: ttft, tpot (NaN for a request of one output token), queue, e2e."""
    arrival = served.arrival_ps
    ttft = (served.first_token_ps - arrival) / PS_PER_MS
    later = served.output_tokens - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(later > 0, (served.finish_ps - served.first_token_ps) / PS_PER_MS / np.maximum(later, 1),
                        np.nan)
    return {"ttft_ms": ttft, "tpot_ms": tpot, "queue_ms": (served.scheduled_ps - arrival) / PS_PER_MS,
            "e2e_ms": (served.finish_ps - arrival) / PS_PER_MS}


def _pct(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else float("nan")


def served_summary(result: SimResult, table: EnergyTable, slo: dict[str, float] | None = None) -> dict:
    served = result.served
    assert served is not None
    times = per_request(served)
    n = int(served.arrival_ps.size)
    outputs = int(served.output_tokens.sum())
    span_ps = int(served.finish_ps.max() - served.arrival_ps.min())
    steps_pj = sum(float(v.sum()) for v in per_token_energy_pj(result, table).values())
    idle_w = sum(table.static_w.values()) + (0.0 if table.clock_gated else table.clock_w)
    idle_pj = served.idle_ps * idle_w  # W x ps = pJ
    energy_mj = (steps_pj + idle_pj) / PJ_PER_MJ
    e2e_ms = times["e2e_ms"]
    throughput = n / (span_ps / PS_PER_MS / 1e3)
    row = {
        "requests": n,
        "scheduler": served.scheduler,
        **{f"ttft_ms_p{q}": _pct(times["ttft_ms"], q) for q in (50, 90, 99)},
        **{f"tpot_ms_p{q}": _pct(times["tpot_ms"], q) for q in (50, 90, 99)},
        "queue_ms_p50": _pct(times["queue_ms"], 50),
        "queue_ms_p99": _pct(times["queue_ms"], 99),
        "e2e_ms_mean": float(e2e_ms.mean()),
        "requests_per_s": throughput,
        "tokens_per_s": outputs / (span_ps / PS_PER_MS / 1e3),
        "energy_mj_per_request": energy_mj / n,
        "energy_mj_per_output_token": energy_mj / outputs,
        "slo_attainment": slo_attainment(times, slo) if slo else None,
        "span_ms": span_ps / PS_PER_MS,
        "steps": int(served.step_tokens.size),
        "tokens_per_step_mean": float(served.step_tokens.mean()),
        "idle_ms": served.idle_ps / PS_PER_MS,
        "energy_mj": energy_mj,
        "energy_idle_gaps_mj": idle_pj / PJ_PER_MJ,
        # Little's law: the time-average of requests in the system, counted as they came and went, against
        # throughput x mean time in the system from each request's own times
        "mean_in_system": served.area_ps / span_ps,
        "littles_law_in_system": throughput * float(e2e_ms.mean()) / 1e3,
    }
    if slo:
        row["slo"] = dict(slo)
    return row


def slo_attainment(times: dict[str, np.ndarray], slo: dict[str, float]) -> float:
    """The share of requests meeting every SLO given (a request of one output token meets any TPOT SLO)."""
    ok = np.ones(times["ttft_ms"].size, dtype=bool)
    if "ttft_ms" in slo:
        ok &= times["ttft_ms"] <= slo["ttft_ms"]
    if "tpot_ms" in slo:
        tpot = times["tpot_ms"]
        ok &= np.isnan(tpot) | (tpot <= slo["tpot_ms"])
    return float(ok.mean())
