"""Single-op microbenchmarks of the H200's SM array in the terms of chipsim's cycle-level compute model (the
device machine, torch with CUDA and Triton; nothing here runs a model or a decode step):

- HBM read latency: one thread chasing pointers through 1 GiB of GPU memory (every load a distinct 128 B line,
  L2 flushed by writing 256 MB before each run), and through 4 MB (L2 hits), per dependent load;
- what one SM streams: a Triton kernel of k programs (k <= 132: one per SM), each summing its own contiguous
  chunk of BF16 weights with 16-byte-per-thread loads; bytes / time per program is one array's stream rate, and
  rate x HBM latency the bytes it keeps in flight (Little's law); k = 132 and a large grid give the whole chip's;
- an empty Triton kernel's time inside a CUDA graph (the fixed cost of a kernel on this launch path).

    python validation/compute/probe_sm.py > validation/compute/h200-sm-probe.json
    python validation/compute/probe_sm.py --gemv > validation/compute/h200-gemv-probe.json

--gemv: the decode steps' worst-modelled GEMV shapes, each as a chain in one CUDA graph, by the Triton kernel of a
known structure (chipsim/hwreplay/triton_kernels.py: outputs / rows-per-program programs) beside torch.mv (cuBLAS): whether the machine or the
library's kernel choice sets a small GEMV's time.
"""

import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from chipsim.hwreplay import triton_kernels  # noqa: E402  (the pointer chase, and the GEMV the replay runs with --gemv triton)


@triton.jit
def _stream(w, out, chunk, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * chunk
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, chunk, BLOCK):
        acc += tl.load(w + base + off + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def _empty(out):
    tl.store(out, 1.0)


def _events(fn, reps=7, flush=None):
    """Median µs of fn (CUDA events); `flush` runs before each timing, outside it."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if flush is not None:
            flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def chase_ns(total_bytes: int, count: int = 40000, stride: int = 128) -> float:
    words_per_line = stride // 8
    lines = total_bytes // stride
    g = torch.Generator().manual_seed(1)
    pick = torch.randperm(lines, generator=g)[:count]  # distinct lines spread over the whole buffer
    buf = torch.zeros(lines * words_per_line + 1, dtype=torch.int64, device="cuda")
    nxt = torch.roll(pick, -1)
    buf[(pick * words_per_line).cuda()] = (nxt * words_per_line).cuda()
    buf[0] = int(pick[0]) * words_per_line
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # 256 MB written between runs: L2 is cold
    flush = scratch.zero_ if total_bytes > (64 << 20) else None
    t = {s: _events(lambda s=s: triton_kernels.chase[(1,)](buf, out, s), flush=flush) for s in (2000, 20000)}
    return (t[20000] - t[2000]) * 1e3 / 18000


def stream(programs: int, chunk_elems: int, block: int = 4096, warps: int = 8) -> dict:
    rotate = max(2, (2 << 30) // (programs * chunk_elems * 2))  # weights rotate through > 2 GiB: no L2 help
    ws = [torch.randn(programs * chunk_elems, dtype=torch.bfloat16, device="cuda") for _ in range(min(rotate, 16))]
    out = torch.empty(programs, dtype=torch.float32, device="cuda")

    def run():
        for w in ws:
            _stream[(programs,)](w, out, chunk_elems, BLOCK=block, num_warps=warps)
    us = _events(run) / len(ws)
    nbytes = programs * chunk_elems * 2
    return {"programs": programs, "bytes_per_program": chunk_elems * 2, "us": round(us, 3),
            "gbps_total": round(nbytes / us / 1e3, 1), "gbps_per_program": round(nbytes / programs / us / 1e3, 2)}


def empty_kernel_in_graph_us(n: int = 400) -> float:
    out = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _empty[(1,)](out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(n):
            _empty[(1,)](out)
    return _events(g.replay) / n


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    res = {"gpu": torch.cuda.get_device_name(), "sm_count": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__}
    res["hbm_latency_ns"] = round(chase_ns(1 << 30), 1)
    res["l2_latency_ns"] = round(chase_ns(4 << 20, count=20000), 1)
    sm = props.multi_processor_count
    rows = []
    for k in (1, 2, 8, 33, 66, sm):
        rows.append(stream(k, 8 << 20))  # 16 MiB per program: the ramp is negligible
    rows.append(stream(4 * sm, 2 << 20))
    res["stream"] = rows
    # short streams over every SM (a batch-1 GEMV's size): where the fixed costs show
    res["short_stream"] = [stream(p, n) for p in (sm, 4 * sm) for n in (4096, 16384, 65536)]
    res["empty_triton_kernel_in_graph_us"] = round(empty_kernel_in_graph_us(), 3)
    print(json.dumps(res, indent=1))




def gemv_in_graph(reduction: int, outputs: int, rows_per_program: int, chain: int = 200) -> dict:
    """A chain of GEMVs over weights rotating through > 2 GiB, captured in one CUDA graph: our Triton kernel
    (outputs / rows_per_program programs, a known structure) beside torch.mv (cuBLAS), per kernel."""
    count = max(2, min(chain, (2 << 30) // (reduction * outputs * 2)))
    ws = [torch.randn(outputs, reduction, dtype=torch.bfloat16, device="cuda") for _ in range(count)]
    x = torch.randn(reduction, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(outputs, dtype=torch.bfloat16, device="cuda")
    out = {"key": f"matvec r{reduction} o{outputs} b{reduction * outputs * 2}",
           "programs": triton.cdiv(outputs, rows_per_program)}
    for name, call in (("triton", lambda w: triton_kernels.gemv(w, x, y, rows_per_program)),
                       ("cublas", lambda w: torch.mv(w, x, out=y))):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for w in ws[:2]:
                call(w)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for i in range(chain):
                call(ws[i % count])
        out[f"{name}_us"] = round(_events(g.replay) / chain, 3)
    return out


def gemv_main() -> None:
    shapes = [(1536, 1024), (1024, 1024), (2048, 1536), (512, 1024), (1536, 2560), (4096, 4096), (1536, 49155)]
    res = {"gemv_in_graph": [gemv_in_graph(r, o, rows) for r, o in shapes for rows in (8, 32)]}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    import sys

    gemv_main() if sys.argv[1:] == ["--gemv"] else main()
