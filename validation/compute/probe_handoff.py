"""The hand-off between the replay's copy stream and its compute stream, timed alone (the device machine: torch with
CUDA). The simulator starts a copy the moment its issue point is reached and an expert the moment its last byte
lands; on the GPU each of those is a cross-stream event wait, which takes some microseconds. Timed with CUDA
events (their clock is the GPU's, common to every stream), each `--repeats` times, medians printed:

- copy_to_compute: the compute stream blocked on an event recorded after an 8 MiB host-to-device copy; from that
  event to one recorded on the compute stream right after its wait (an expert waiting for its bytes);
- compute_to_copy: the copy stream blocked on an event recorded after a kernel (~20 µs) on the compute stream;
  from that event to one recorded on the copy stream right after its wait (a demand copy issued at routing);
- same_stream: two events recorded back to back on one stream (what a record itself costs, to subtract).

    python validation/compute/probe_handoff.py > validation/compute/h200-handoff.json
"""

import argparse
import json
import statistics

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_handoff: needs a CUDA GPU")
    dev = torch.device("cuda")
    cs, xs = torch.cuda.Stream(), torch.cuda.Stream()
    host = torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(8 << 20, dtype=torch.uint8, device=dev)
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev)  # 32 MiB: a ~10-20 µs GEMV
    v = torch.randn(4096, dtype=torch.bfloat16, device=dev)
    tiny = torch.zeros(1, device=dev)

    def ev():
        return torch.cuda.Event(enable_timing=True)

    out = {"copy_to_compute_us": [], "compute_to_copy_us": [], "same_stream_us": []}
    for _ in range(3 + a.repeats):
        torch.cuda.synchronize()
        # copy -> compute: the compute stream waits while the copy runs
        done, resumed = ev(), ev()
        with torch.cuda.stream(xs):
            dst.copy_(host, non_blocking=True)
            done.record(xs)
        with torch.cuda.stream(cs):
            cs.wait_event(done)
            resumed.record(cs)
            tiny.add_(1)
        # compute -> copy: the copy stream waits while the kernel runs
        ran, started = ev(), ev()
        with torch.cuda.stream(cs):
            torch.mv(w, v)
            ran.record(cs)
        with torch.cuda.stream(xs):
            xs.wait_event(ran)
            started.record(xs)
            dst[:4].copy_(host[:4], non_blocking=True)
        # two records back to back on one stream
        first, second = ev(), ev()
        with torch.cuda.stream(cs):
            first.record(cs)
            second.record(cs)
        torch.cuda.synchronize()
        out["copy_to_compute_us"].append(1e3 * done.elapsed_time(resumed))
        out["compute_to_copy_us"].append(1e3 * ran.elapsed_time(started))
        out["same_stream_us"].append(1e3 * first.elapsed_time(second))
    summary = {k: {"median": round(statistics.median(v[3:]), 3), "p10": round(sorted(v[3:])[len(v[3:]) // 10], 3),
                   "p90": round(sorted(v[3:])[9 * len(v[3:]) // 10], 3)} for k, v in out.items()}
    print(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "repeats": a.repeats,
                      "summary": summary, "samples_us": {k: [round(x, 3) for x in v[3:]] for k, v in out.items()}},
                     indent=1))


if __name__ == "__main__":
    main()
