"""The 4-bit expert kernel against its reference, on the device: for every 4-bit matvec shape of the validation
configs' experts, chipsim.hwreplay.triton_kernels.gemv_q4 on random packed weights, scales and inputs against
the dequantised matrix times the vector in FP32 (chipsim.hwreplay.harness.dequantise_q4). Prints one JSON row per
shape with the largest error relative to the result's largest magnitude, and exits 1 if one is above 1 %.

    python validation/compute/check_q4.py > OUT/q4-check.json
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from chipsim.hw.config import load_config  # noqa: E402
from chipsim.hwreplay.harness import dequantise_q4, kernel_call, q4_views  # noqa: E402
from chipsim.hwreplay.ops import primitive_ops  # noqa: E402

CONFIGS = ("hwconfigs/h200-pcie5.yaml", "hwconfigs/h200-pcie5-deepseek-v2-lite.yaml")


def main() -> int:
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a dry run of the script (reference against itself)
    worst = 0.0
    for path in CONFIGS:
        hw = load_config(path, ["model.expert_bits=4"]).hw
        for p in primitive_ops(hw)["expert"]:
            if p.kind != "matvec":
                continue
            buf = torch.randint(0, 256, (p.weight_bytes,), dtype=torch.uint8, device=dev)
            packed, scales = q4_views(buf, p)
            scales.copy_(torch.rand(scales.shape, device=dev) * 0.02 + 0.01)
            x = torch.randn(p.reduction, dtype=torch.bfloat16, device=dev)
            out = torch.empty(p.outputs, dtype=torch.bfloat16, device=dev)
            fn, args, kwargs = kernel_call(p, (packed, scales), x, None, None, out)
            fn(*args, **kwargs)
            ref = dequantise_q4(packed, scales).float() @ x.float()
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            worst = max(worst, err)
            print(json.dumps({"model": hw.model.name, "name": p.name, "key": p.key, "kernel": fn.__name__,
                              "max_error_of_largest": round(err, 6)}), flush=True)
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    raise SystemExit(main())
