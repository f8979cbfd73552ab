#!/bin/bash
# The compute-bound H200 measurements, in one device command (from the repository root, torch with CUDA and
# Triton, simpy installed):
#
#     bash validation/compute-bound/measure.sh OUT
#
# 1. every kernel shape of the four validation configs' decode steps timed alone with the Triton GEMV of a
#    known structure (chipsim/hwreplay/triton_kernels.py), with its registers per thread -> OUT/h200-op-times-triton.json
# 2. the programs one SM holds at once, from the 8 x 512 kernel's registers (65,536 per SM, 128 threads per
#    program, allocated in units of 8 per thread; at most 16 programs of 4 warps)
# 3. Granite-3B at context 1,024 with nearly every expert cached on the GPU (a 5,376 MiB buffer for 5.62 GiB of
#    experts), LRU and ProMoE, each plan replayed twice, the host's own enqueue time checked on 8 tokens:
#    - with cuBLAS (torch.mv / torch.mm), the plan from hwconfigs/h200-pcie5.yaml (profiled kernels) -> OUT/cublas/
#    - with the Triton GEMV, the plan from hwconfigs/h200-cycle-level.yaml (no profiled kernels)   -> OUT/triton/
set -euo pipefail
OUT=${1:?usage: measure.sh OUT}
mkdir -p "$OUT"
CONFIGS="hwconfigs/h200-pcie5.yaml hwconfigs/h200-pcie5-granite-1b.yaml hwconfigs/h200-pcie5-phi-mini-moe.yaml hwconfigs/h200-pcie5-deepseek-v2-lite.yaml"
python -m chipsim.hwreplay.microbench --out "$OUT/h200-op-times-triton.json" --gemv triton --shapes-from $CONFIGS --contexts 512,1024,2048
PPA=$(python - "$OUT/h200-op-times-triton.json" <<'PY'
import json, sys
from chipsim.hw.compute_formula import parse_op_key
from chipsim.hwreplay.ops import key_groups
rows = json.load(open(sys.argv[1]))["op_times"]
# the 8 x 512 kernel: a plain matvec (no shared operand) of reduction >= 512
regs = max(r["registers_per_thread"] for r in rows if "registers_per_thread" in r and key_groups(r["key"]) == 1
           and parse_op_key(r["key"])[1]["reduction"] >= 512)
print(min(16, 65536 // (-(-regs // 8) * 8 * 128)))
PY
)
echo "programs per SM: $PPA"
COMMON="--graphs --set expert_buffer.capacity_mib=5376 --contexts 1024 --policy lru --policy promoe --repeats 2 --dispatch-tokens 8"
python -m chipsim.hwreplay.run hwconfigs/h200-pcie5.yaml $COMMON --out "$OUT/cublas"
python -m chipsim.hwreplay.run hwconfigs/h200-cycle-level.yaml $COMMON --gemv triton --set compute.programs_per_array=$PPA --out "$OUT/triton"
