"""Which kernels the library launches for each GEMV shape of the profile, and how (the device machine, torch with
CUDA; chipsim and its requirements importable): for every matrix-vector shape of the four validation configs'
decode steps, the kernel_call the replay uses (chipsim.hwreplay.harness) run once under torch.profiler, and the
CUDA kernels it launched with their grid, block, registers and shared memory (CUPTI, via the profiler's trace).
This is the mapping of an operation onto the SMs; it times nothing.

    python validation/compute/probe_kernels.py > validation/compute/h200-kernel-mapping.json
"""

import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.getcwd())
from chipsim.hwreplay.harness import kernel_call, weight_shape  # noqa: E402
from chipsim.hwreplay.microbench import decode_shapes  # noqa: E402

CONFIGS = ["hwconfigs/h200-pcie5.yaml", "hwconfigs/h200-pcie5-granite-1b.yaml", "hwconfigs/h200-pcie5-phi-mini-moe.yaml",
           "hwconfigs/h200-pcie5-deepseek-v2-lite.yaml"]


def kernels_of(fn, args, kwargs) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    fn(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    out = []
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") != "kernel":
            continue
        a = ev.get("args", {})
        out.append({"name": ev.get("name", "")[:120], "grid": a.get("grid"), "block": a.get("block"),
                    "registers_per_thread": a.get("registers per thread"), "shared_memory": a.get("shared memory"),
                    "occupancy_pct": a.get("est. achieved occupancy %"), "us": ev.get("dur")})
    return out


def main() -> None:
    shapes = [(p, users) for p, users in decode_shapes(CONFIGS, [512, 1024, 2048]) if p.kind == "matvec"]
    widest = max(p.reduction * p.groups for p, _ in shapes)
    longest = max(p.outputs for p, _ in shapes)
    x = torch.randn(widest, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(longest + widest, dtype=torch.bfloat16, device="cuda")
    rows = []
    for p, users in shapes:
        r, red = weight_shape(p)
        w = torch.randn(r, red, dtype=torch.bfloat16, device="cuda")
        fn, args, kwargs = kernel_call(p, w, x, None, None, out)
        rows.append({"key": p.key, "users": users, "groups": p.groups, "kernels": kernels_of(fn, args, kwargs)})
        del w
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "shapes": rows}, indent=1))


if __name__ == "__main__":
    main()
