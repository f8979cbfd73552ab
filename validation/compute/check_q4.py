"""The 4-bit (or 8-bit) expert kernel against its reference, on the device: for every such matvec shape of the
validation configs' experts, chipsim.hwreplay.triton_kernels.gemv_q4 (gemv_q8) on random packed weights, scales
and inputs against the dequantised matrix times the vector in FP32 (chipsim.hwreplay.harness.dequantise_q4,
dequantise_q8). Prints one JSON row per shape with the largest error relative to the result's largest magnitude,
and exits 1 if one is above 1 %.

    python validation/compute/check_q4.py > OUT/q4-check.json
    python validation/compute/check_q4.py --bits 8 hwconfigs/h100-pcie5.yaml > OUT/q8-check.json
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from chipsim.hw.config import load_config  # noqa: E402
from chipsim.hwreplay.harness import dequantise_q4, dequantise_q8, kernel_call, quant_views  # noqa: E402
from chipsim.hwreplay.ops import primitive_ops  # noqa: E402

CONFIGS = ("hwconfigs/h200-pcie5.yaml", "hwconfigs/h200-pcie5-deepseek-v2-lite.yaml")


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    bits = 4
    if args[:1] == ["--bits"]:
        bits, args = int(args[1]), args[2:]
    configs = args or CONFIGS
    dequantise = dequantise_q4 if bits == 4 else dequantise_q8
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a dry run of the script (reference against itself)
    worst = 0.0
    for path in configs:
        hw = load_config(path, [f"model.expert_bits={bits}"]).hw
        for p in primitive_ops(hw)["expert"]:
            if p.kind != "matvec":
                continue
            buf = torch.randint(0, 256, (p.weight_bytes,), dtype=torch.uint8, device=dev)
            packed, scales = quant_views(buf, p)
            scales.copy_(torch.rand(scales.shape, device=dev) * 0.02 + 0.01)
            x = torch.randn(p.reduction, dtype=torch.bfloat16, device=dev)
            out = torch.empty(p.outputs, dtype=torch.bfloat16, device=dev)
            fn, args, kwargs = kernel_call(p, (packed, scales), x, None, None, out)
            fn(*args, **kwargs)
            ref = dequantise(packed, scales).float() @ x.float()
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            worst = max(worst, err)
            print(json.dumps({"model": hw.model.name, "name": p.name, "key": p.key, "kernel": fn.__name__,
                              "max_error_of_largest": round(err, 6)}), flush=True)
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    raise SystemExit(main())
