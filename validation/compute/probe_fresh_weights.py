"""A GEMV over weights a copy has just written, against the same over weights long in HBM (the device machine: torch
with CUDA). In the PCIe-bound replays an expert's kernels, run right after its copy lands, took about 20 µs where
the same kernels back to back over cached experts take about 13 (hwreplay --op-spans); probe_handoff.py's hand-off
read weights the cache held, so it could not tell. Here 64 expert-sized weights (Granite-3B's gate and up, 1536 x
1024 BF16, 3 MiB each, 192 MiB in all: more than the L2 cache) are each read by one cuBLAS GEMV, timed with CUDA
events right around it:

- resident: the 64 GEMVs back to back behind a spin (µs per GEMV);
- after_copy_fresh: each GEMV after a host-to-device copy of its own weights has landed (the copy on another
  stream, the compute stream waiting for its event): a just-written matrix read;
- after_copy_other: the same, but the copy writes a scratch buffer the GEMV does not read: a GEMV after a wait for a
  copy, over weights long in HBM;
- after_sync: each GEMV launched alone once the GPU is idle (the host synchronises first; the span then holds the
  kernel's launch from the host too).

    python validation/compute/probe_fresh_weights.py > validation/h100/h100-fresh-weights.json
"""

import argparse
import json
import statistics

import torch

ROWS, COLS, N = 1024, 1536, 64


def _median_us(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median_us": round(statistics.median(s), 3), "p10": round(s[len(s) // 10], 3),
            "p90": round(s[9 * len(s) // 10], 3), "n": len(s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    cs, xs = torch.cuda.Stream(), torch.cuda.Stream()
    ws = [torch.randn(ROWS, COLS, dtype=torch.bfloat16, device=dev) for _ in range(N)]
    hosts = [w.cpu().pin_memory() for w in ws]
    scratch = torch.empty(ROWS, COLS, dtype=torch.bfloat16, device=dev)
    v = torch.randn(COLS, dtype=torch.bfloat16, device=dev)
    o = torch.empty(ROWS, dtype=torch.bfloat16, device=dev)
    for w in ws:
        torch.mv(w, v, out=o)
    torch.cuda.synchronize()

    def ev():
        return torch.cuda.Event(enable_timing=True)

    resident = []
    for _ in range(a.repeats):
        b, e = ev(), ev()
        with torch.cuda.stream(cs):
            torch.cuda._sleep(400_000)
            b.record(cs)
            for w in ws:
                torch.mv(w, v, out=o)
            e.record(cs)
        torch.cuda.synchronize()
        resident.append(b.elapsed_time(e) * 1e3 / N)

    def after_copy(fresh: bool) -> list[float]:
        out = []
        for _ in range(a.repeats):
            marks = []
            torch.cuda.synchronize()
            with torch.cuda.stream(cs):
                torch.cuda._sleep(4_000_000)  # ~2 ms: the host enqueues everything while the GPU spins
            for w, h in zip(ws, hosts):
                landed, b, e = torch.cuda.Event(), ev(), ev()
                with torch.cuda.stream(xs):
                    xs.wait_stream(cs)  # each copy after the previous GEMV: one at a time, as a demand fetch
                    (w if fresh else scratch).copy_(h, non_blocking=True)
                    landed.record(xs)
                with torch.cuda.stream(cs):
                    cs.wait_event(landed)
                    b.record(cs)
                    torch.mv(w, v, out=o)
                    e.record(cs)
                marks.append((b, e))
            torch.cuda.synchronize()
            out += [b.elapsed_time(e) * 1e3 for b, e in marks]
        return out

    after_sync = []
    for _ in range(a.repeats):
        for w in ws:
            b, e = ev(), ev()
            torch.cuda.synchronize()
            with torch.cuda.stream(cs):
                b.record(cs)
                torch.mv(w, v, out=o)
                e.record(cs)
            e.synchronize()
            after_sync.append(b.elapsed_time(e) * 1e3)
    print(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                      "gemv": f"torch.mv (cuBLAS), {ROWS} x {COLS} bf16, {N} matrices in turn",
                      "resident_back_to_back": {"us_per_gemv": round(statistics.median(resident), 3),
                                                "repeats": a.repeats},
                      "after_copy_fresh": _median_us(after_copy(True)),
                      "after_copy_other": _median_us(after_copy(False)),
                      "after_sync": _median_us(after_sync)}, indent=1))


if __name__ == "__main__":
    main()
