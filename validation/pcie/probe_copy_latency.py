"""The two fixed costs of a host-to-device copy that are not in the PCIe protocol's bandwidth, each measured on its
own (the device machine, torch with CUDA; nothing here touches the 64 KiB - 16 MiB copy curve it predicts):

- the copy engine's cost per copy: tiny pinned copies (4 B ... 4 KiB) queued back to back on one stream, the same
  way the measured curve queues its copies (16 at a time) and also 256 at a time; host-to-device, device-to-host
  and device-to-device (no PCIe read: the engine's own cost);
- the PCIe read round trip: one GPU thread chasing pointers through pinned host memory (Triton kernel, every load
  a distinct line so no cache can answer), per dependent load; 'dense' lines share pages, 'spread' ones are each
  on their own 4 KiB page (GPU TLB misses included).

    python validation/pcie/probe_copy_latency.py > validation/pcie/h200-copy-latency.json
"""

import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # chipsim's Triton kernels


def tiny_copies(kind: str, sizes, back_to_back: int, reps: int = 15) -> list[dict]:
    """Per-copy time of `back_to_back` copies on one stream, timed as chipsim.hwreplay.microbench times the curve."""
    stream = torch.cuda.Stream()
    out = []
    for n in sizes:
        on_host = {"h2d": (True, False), "d2h": (False, True), "d2d": (False, False)}[kind]
        src = torch.empty(n * back_to_back, dtype=torch.uint8, pin_memory=on_host[0],
                          device="cpu" if on_host[0] else "cuda")
        dst = torch.empty(n * back_to_back, dtype=torch.uint8, pin_memory=on_host[1],
                          device="cpu" if on_host[1] else "cuda")

        def run():
            with torch.cuda.stream(stream):
                for i in range(back_to_back):
                    dst[i * n:(i + 1) * n].copy_(src[i * n:(i + 1) * n], non_blocking=True)
        run()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(5e7))  # the host gets ahead: no dispatch time in the measurement
            a.record(stream)
            run()
            b.record(stream)
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3 / back_to_back)
        out.append({"bytes": n, "back_to_back": back_to_back, "us_per_copy": round(statistics.median(ts), 3)})
    return out


def _chase_times(chase, words, out) -> dict:
    """Median µs of 2,000 and of 20,000 dependent loads through `words` (the difference: per-load latency)."""
    per = {}
    for steps in (2000, 20000):
        chase[(1,)](words, out, steps)
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            chase[(1,)](words, out, steps)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        per[steps] = statistics.median(ts)
    return per


def pointer_chase() -> dict:
    from chipsim.hwreplay.triton_kernels import chase

    res = {}
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    for name, stride_words, count in (("dense", 16, 40000), ("spread", 512, 40000)):  # 128 B or 4 KiB apart
        g = torch.Generator().manual_seed(1)
        order = torch.randperm(count, generator=g)
        words = torch.zeros(count * stride_words + 1, dtype=torch.int64).pin_memory()
        words[order * stride_words] = torch.roll(order, -1) * stride_words  # a single cycle through every line
        per = _chase_times(chase, words, out)
        res[name] = {"ns_per_dependent_load": round((per[20000] - per[2000]) * 1e3 / 18000, 1),
                     "us_2000_loads": round(per[2000], 3), "us_20000_loads": round(per[20000], 3),
                     "line_stride_bytes": stride_words * 8}
    # the same chase through 5 MB of GPU memory (L2 holds it): the SM's own load path, to subtract from the host figure
    dev = torch.zeros(40000 * 16 + 1, dtype=torch.int64, device="cuda")
    order = torch.randperm(40000, generator=torch.Generator().manual_seed(1))
    dev[(order * 16).cuda()] = (torch.roll(order, -1) * 16).cuda()
    per = _chase_times(chase, dev, out)
    res["gpu_memory"] = {"ns_per_dependent_load": round((per[20000] - per[2000]) * 1e3 / 18000, 1)}
    return res


def main() -> None:
    torch.cuda.init()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    tiny = (4, 64, 512, 4096)
    for kind in ("h2d", "d2h", "d2d"):
        out[f"{kind}_tiny_queued16"] = tiny_copies(kind, tiny, 16)
        out[f"{kind}_tiny_queued256"] = tiny_copies(kind, tiny, 256)
    try:
        out["pcie_read_pointer_chase"] = pointer_chase()
    except Exception as exc:  # Triton missing or host pointers refused: the copies above still stand
        out["pcie_read_pointer_chase"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    # the curve itself, in the same session, to show the machine was the one the committed curve came from
    out["h2d_pinned_queued16_same_session"] = tiny_copies("h2d", [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20], 16)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
