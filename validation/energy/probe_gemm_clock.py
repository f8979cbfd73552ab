"""Does a BF16 MAC cost more at the full SM clock than at the clock the power cap holds a GEMM to? (the lent GPU,
torch with CUDA, nvidia-ml-py). The energy probe's GEMM window (probe_energy.py) runs 8192^3 GEMMs back to back, which
hold the board at its power limit with the SM clock pulled down (1,305 MHz on the H100, 1,440 on the H200); a
prefill's GEMMs run between other work, at the full clock. Each window here runs the same GEMMs, back to back or with
the host idle for `gap` times a call's GEMM time after each call, and reports the board's energy above idle per MAC
(read by chipsim.hwreplay.nvml.Meter) and the SM clock at the window's end. The idle gaps add nothing above idle (the
board's idle power is its power while it waits), so the per-MAC figures compare directly.

    python validation/energy/probe_gemm_clock.py > validation/h100/h100-gemm-clock.json
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from probe_energy import board, measured  # noqa: E402


def main() -> None:
    gpu = board("probe_gemm_clock")
    n, per_call = 8192, 4
    p, q = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))

    def gemms():
        for _ in range(per_call):
            torch.mm(p, q)
        torch.cuda.synchronize()
    for _ in range(3):
        gemms()
    t0 = time.perf_counter()
    for _ in range(5):
        gemms()
    call_s = (time.perf_counter() - t0) / 5
    macs = per_call * n**3
    rows = []
    for gap in (0, 1, 3, 0):  # back to back first and last: the cap's hold on the clock, before and after
        def run(gap=gap):
            gemms()
            if gap:
                time.sleep(gap * call_s)
        w = measured(gpu, run, 3.0)
        above_j = w["energy_j"] - w["idle_w"] * w["seconds"]
        row = {"gap_calls": gap, **w, "macs": w["calls"] * macs,
               "pj_per_mac_above_idle": round(1e12 * above_j / (w["calls"] * macs), 4)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"machine": {**gpu.describe(), "torch": torch.__version__}, "shape": [n, n, n],
                      "gemms_per_call": per_call, "call_seconds": round(call_s, 6), "windows": rows}, indent=1))


if __name__ == "__main__":
    main()
