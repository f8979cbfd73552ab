"""Stream a GPU's own memory (HBM3e on the H200) with kernels of a known access pattern: the measurement chipsim's
description of that memory is checked against (`chipsim dram --probe THIS.json --config CONFIG` runs the same
streams through the config's command-level model, chipsim.dramsim.probe_check).

    python validation/dram/probe_hbm.py --out validation/dram/h200-hbm-streams.json

Each kernel walks K read arrays and (but for the read-only kernel) one write array of FP32 elements, grid-stride:
program p handles blocks p, p + P, p + 2P, ... of BLOCK elements of every array, so the whole grid sweeps the
arrays front to back together (every array its own region, as chipsim's streams are). Kernels:
- read: one array read, a per-program sum written at the end (read-only; the sums are 0.0001 % of the bytes);
- kRw (k = 6, 3, 2, 1): k arrays read, their sum written to another (reads k / (k + 1): 86, 75, 67, 50 % of the
  bytes; 1r1w is a copy).
Bytes moved = elements x 4 x (reads + writes); bandwidth = bytes / the median of `--reps` timed runs (CUDA events),
after two warm-up runs. Arrays are 1 GiB each (far beyond the 50 MiB L2, which then holds no reuse). Beside the
kernels, torch's own copy (`y.copy_(x)`) and sum (`x.sum()`), and the machine's facts: GPU name, SM count, L2,
memory clock and bus width (NVML), from which the pin peak = clock x 2 x bus width / 8. NVML's energy counter
over each kernel's timed runs gives its average power.
"""

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

BLOCK = 2048  # FP32 elements per program per step: 8 KiB of each array
KERNELS = {"read": 1, "6r1w": 6, "3r1w": 3, "2r1w": 2, "1r1w": 1}


@triton.jit
def _read(x, sums, n, BLOCK: tl.constexpr):
    p, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(p * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(sums + p, tl.sum(acc, axis=0))


@triton.jit
def _mix(a0, a1, a2, a3, a4, a5, y, n, K: tl.constexpr, BLOCK: tl.constexpr):
    p, programs = tl.program_id(0), tl.num_programs(0)
    for start in range(p * BLOCK, n, programs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(a0 + offs, mask=m, other=0.0)
        if K > 1:
            v += tl.load(a1 + offs, mask=m, other=0.0)
        if K > 2:
            v += tl.load(a2 + offs, mask=m, other=0.0)
        if K > 3:
            v += tl.load(a3 + offs, mask=m, other=0.0)
            v += tl.load(a4 + offs, mask=m, other=0.0)
            v += tl.load(a5 + offs, mask=m, other=0.0)
        tl.store(y + offs, v, mask=m)


def _time_ms(fn, reps: int) -> list[float]:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _energy_mj(nvml, handle) -> int | None:
    try:
        return nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # counter not supported: power is left out
        return None


def machine(nvml, handle) -> dict:
    props = torch.cuda.get_device_properties(0)
    facts = {"gpu": props.name, "sm_count": props.multi_processor_count,
             "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1), "torch": torch.__version__,
             "triton": triton.__version__}
    if nvml is not None:
        clock = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
        bus = nvml.nvmlDeviceGetMemoryBusWidth(handle)
        facts.update(memory_clock_mhz=clock, memory_bus_width_bits=bus,
                     pin_peak_gbps=round(clock * 1e6 * 2 * bus / 8 / 1e9, 1))
    return facts


def run(elements: int, reps: int, programs_per_sm: int) -> dict:
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        nvml = handle = None
    facts = machine(nvml, handle)
    grid = (facts["sm_count"] * programs_per_sm,)
    arrays = [torch.rand(elements, device="cuda") for _ in range(7)]
    sums = torch.empty(grid[0], device="cuda")
    rows = []
    for name, k in KERNELS.items():
        if name == "read":
            fn, reads, writes = (lambda: _read[grid](arrays[0], sums, elements, BLOCK=BLOCK)), 1, 0
        else:
            srcs = (arrays[:k] + [arrays[0]] * 6)[:6]
            fn, reads, writes = (lambda srcs=srcs, k=k: _mix[grid](*srcs, arrays[6], elements, K=k, BLOCK=BLOCK)), k, 1
        rows.append(_row(name, fn, reads, writes, elements, reps, nvml, handle))
    x, y = arrays[0], arrays[6]
    rows.append(_row("torch-copy", lambda: y.copy_(x), 1, 1, elements, reps, nvml, handle))
    rows.append(_row("torch-sum", lambda: x.sum(), 1, 0, elements, reps, nvml, handle))
    peak = facts.get("pin_peak_gbps")
    for r in rows:
        r["share_of_pin_peak"] = round(r["bandwidth_gbps"] / peak, 4) if peak else None
    return {"machine": facts, "elements_per_array": elements, "bytes_per_element": 4, "block": BLOCK,
            "programs": grid[0], "reps": reps, "kernels": rows}


def _row(name, fn, reads, writes, elements, reps, nvml, handle) -> dict:
    e0 = _energy_mj(nvml, handle) if nvml is not None else None
    times = _time_ms(fn, reps)
    e1 = _energy_mj(nvml, handle) if nvml is not None else None
    ms = statistics.median(times)
    moved = elements * 4 * (reads + writes)
    row = {"kernel": name, "reads": reads, "writes": writes, "read_share": round(reads / (reads + writes), 4),
           "bytes": moved, "median_ms": round(ms, 4), "min_ms": round(min(times), 4), "max_ms": round(max(times), 4),
           "bandwidth_gbps": round(moved / (ms * 1e-3) / 1e9, 1)}
    if e0 is not None and e1 is not None:
        row["average_power_w"] = round((e1 - e0) / (sum(times) + 2 * ms), 1)  # mJ / ms, the warm-up runs included
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="validation/dram/h200-hbm-streams.json")
    parser.add_argument("--gib-per-array", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--programs-per-sm", type=int, default=8)
    args = parser.parse_args()
    elements = int(args.gib_per_array * 2**30) // 4 // BLOCK * BLOCK
    result = run(elements, args.reps, args.programs_per_sm)
    result["command"] = "python validation/dram/probe_hbm.py --out " + args.out
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for r in result["kernels"]:
        print(f"{r['kernel']:10} reads {r['read_share']:.2f}  {r['bandwidth_gbps']:8.1f} GB/s  "
              f"{r['share_of_pin_peak'] if r['share_of_pin_peak'] is not None else '-'} of the pin peak")


if __name__ == "__main__":
    main()
