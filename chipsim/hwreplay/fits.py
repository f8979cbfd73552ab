"""Least-squares fits of measured times (no torch: the GPU probes and the records read anywhere share them)."""

import numpy as np


def fit_intercept_and_rate(sizes_bytes, times_us) -> dict:
    """Least squares t = a + N / B; B in GB/s (1e9 B/s), a in µs."""
    x = np.asarray(sizes_bytes, dtype=np.float64)
    y = np.asarray(times_us, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    return {"bandwidth_gbps": round(1e-3 / slope, 3), "intercept_us": round(float(intercept), 3),
            "max_rel_residual": round(float(np.max(np.abs(resid) / y)), 4)}
