#!/bin/bash
# Issue #41's held-out shape and issue #40's real memory, on the H200, in one device command (from the repository
# root; torch with CUDA and Triton, nvidia-ml-py and simpy installed):
#
#     bash validation/regimes/measure-heldout.sh OUT [STEPS]   (STEPS: any of hbm optimes pcie cached; default all)
#
# hbm:     the GPU's own HBM3e streamed by kernels of known access pattern (validation/dram/probe_hbm.py)
#                                                                                    -> OUT/h200-hbm-streams.json
# optimes: Qwen3-30B-A3B's decode-step kernel shapes that hwconfigs/h200-pcie5.yaml has not timed, each timed alone
#          (a diagnostic only: the replays below are simulated with the config as committed, where those shapes
#          fall back to the array model; nothing is added to the config)     -> OUT/h200-op-times-qwen3.json
# pcie:    Qwen3-30B-A3B (BF16 experts, 9.44 MB each, 58 GB in pinned host memory) at context 1,024 with the
#          config's GPU buffer of a quarter of its experts (13,824 MiB): PCIe-bound, LRU and ProMoE
#                                                                                    -> OUT/pcie/
# cached:  the same with a buffer of 95 % of its experts (52,224 MiB of 55,296), one CUDA graph per run of compute
#          between copy synchronisations                                             -> OUT/cached/
# Every replay is run twice; the board's energy is read around each. All output goes to OUT/measure.log too.
set -uo pipefail
OUT=${1:?usage: measure-heldout.sh OUT [hbm] [optimes] [pcie] [cached]}
shift
WHAT=" ${*:-hbm optimes pcie cached} "
mkdir -p "$OUT"
R="python -m chipsim.hwreplay.run"
G=hwconfigs/h200-pcie5.yaml
Q=hwconfigs/h200-pcie5-qwen3-30b-a3b.yaml
LOG="$OUT/measure.log"
step() { [[ "$WHAT" == *" $1 "* ]]; }
if step hbm; then
  timeout -k 5 150 python validation/dram/probe_hbm.py --out "$OUT/h200-hbm-streams.json" >> "$LOG" 2>&1
  echo "hbm: exit $?" | tee -a "$LOG"
fi
if step optimes; then
  timeout -k 5 150 python -m chipsim.hwreplay.microbench --out "$OUT/h200-op-times-qwen3.json" --gemv cublas \
      --shapes-from $Q --contexts 1024 --missing-from $G >> "$LOG" 2>&1
  echo "optimes: exit $?" | tee -a "$LOG"
fi
S="--stalls --repeats 2 --policy lru --policy promoe --enqueue cudart --contexts 1024"
if step pcie; then
  timeout -k 5 200 $R $Q --graphs $S --out "$OUT/pcie" >> "$LOG" 2>&1
  echo "pcie: exit $?" | tee -a "$LOG"
fi
if step cached; then
  timeout -k 5 200 $R $Q --graphs --segments $S --set expert_buffer.capacity_mib=52224 --out "$OUT/cached" >> "$LOG" 2>&1
  echo "cached: exit $?" | tee -a "$LOG"
fi
