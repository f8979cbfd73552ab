"""Pinned host-to-device copies from memory the host's caches hold and from memory they do not (the device machine:
torch with CUDA).

The microbenchmark's copy sweep (chipsim.hwreplay.microbench copy_sweep, which sets links.pcie.bandwidth_gbps and
dma.setup_ns) copies the same 16 buffers again in every repeat: at 4 MiB and below they fit the host's last-level
cache, and a DMA read of a cached line is served from it. The replays copy each expert from a host store of
gigabytes that no cache holds. Here both, at the sizes the replays copy, 16 copies back to back on one stream behind
a spin (the host ahead), medians over `--repeats`:

- reused: the microbenchmark's way (16 buffers of the size, copied again each repeat);
- cold: every copy from a part of a `--store-gib` pinned buffer not read since the whole store was last swept;

with t = a + n/B fitted to each (µs per copy against bytes).

    python validation/compute/probe_copy_source.py > validation/h100/h100-copy-source.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

import torch

from chipsim.hwreplay.fits import fit_intercept_and_rate  # the microbenchmark's own t = a + N/B fit

MIB = 1 << 20
SIZES = (256 << 10, MIB, 1216512, 4 * MIB, 4718592, 16 * MIB)  # 1216512, 4718592: a Granite-3B expert, 4- and 16-bit
BACK_TO_BACK = 16


def timed_us(stream, pairs: list, spin_cycles: int) -> float:
    """GPU time per copy of `pairs` ((dst, src) views) back to back behind a spin."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(spin_cycles)
        a.record(stream)
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)
        b.record(stream)
    b.synchronize()
    return 1e3 * a.elapsed_time(b) / len(pairs)


def measure(size: int, store: torch.Tensor, dst: torch.Tensor, stream, repeats: int, spin: int, cursor: list) -> dict:
    reused_src = torch.empty(size * BACK_TO_BACK, dtype=torch.uint8, pin_memory=True).fill_(1)
    reused = [(dst[i * size:(i + 1) * size], reused_src[i * size:(i + 1) * size]) for i in range(BACK_TO_BACK)]
    parts = store.numel() // size
    times = {"reused": [], "cold": []}
    for r in range(2 + repeats):
        cold = []
        for i in range(BACK_TO_BACK):  # the store's parts in turn: each read once per sweep of the whole store
            p = cursor[0] % parts
            cursor[0] += 1
            cold.append((dst[i * size:(i + 1) * size], store[p * size:(p + 1) * size]))
        for mode, pairs in (("reused", reused), ("cold", cold)):
            t = timed_us(stream, pairs, spin)
            if r >= 2:
                times[mode].append(t)
    return {"bytes": size, **{f"{m}_us": round(statistics.median(t), 3) for m, t in times.items()}}


def _llc() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return "; ".join(line.strip() for line in out.splitlines() if "L3" in line or "Model name" in line)
    except (OSError, subprocess.SubprocessError):
        return "lscpu not available"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--store-gib", type=int, default=4)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_copy_source: needs a CUDA GPU")
    store = torch.empty(a.store_gib << 30, dtype=torch.uint8, pin_memory=True).fill_(1)
    dst = torch.empty(BACK_TO_BACK * max(SIZES), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    from chipsim.hwreplay.gpu_sleep import sleep_cycles_per_ms

    spin = int(2 * sleep_cycles_per_ms(torch.device("cuda")))  # 2 ms: the host enqueues 16 copies meanwhile
    cursor = [0]
    rows = [measure(s, store, dst, stream, a.repeats, spin, cursor) for s in SIZES]
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": _llc(),
                      "store_gib": a.store_gib, "back_to_back": BACK_TO_BACK, "repeats": a.repeats, "copies": rows,
                      "fit": {m: fit_intercept_and_rate([r["bytes"] for r in rows], [r[f"{m}_us"] for r in rows])
                              for m in ("reused", "cold")}},
                     indent=1))


if __name__ == "__main__":
    main()
