#!/bin/bash
# 4-bit experts and the DMA semantics thor relies on, on the H200, in one device command (from the repository root;
# torch with CUDA and Triton, nvidia-ml-py and simpy installed):
#
#     bash validation/regimes/measure-q4-dma.sh OUT [STEPS]   (STEPS: any of q4-kernel q4 energy dma; default all)
#
# q4-kernel:
#      1. the 4-bit kernel against its reference                                           -> OUT/q4-check.json
#      2. every new kernel shape of the 4-bit experts timed alone, as the other shapes were
#         (microbench --gemv cublas; the 4-bit matvecs run triton_kernels.gemv_q4)       -> validation/compute/h200-op-times-q4.json
#      3. hwconfigs/h200-pcie5.yaml written again with those shapes added (gpuconfig; the command is in its header)
# q4:  4. 4-bit experts, Granite-3B and DeepSeek-V2-Lite at context 1,024: a GPU buffer of a quarter of the experts
#         (as the PCIe-bound cases) and of nearly all of them (cached), LRU and ProMoE, one CUDA graph per run of
#         compute between copy synchronisations, per-layer stalls                         -> OUT/q4/, OUT/q4-ds/
# energy: 5. each decode-step kernel shape's energy alone (validation/energy/probe_op_energy.py) -> OUT/h200-op-energy.json
# dma: 6. the DMA semantics of thor.yaml on two copy engines (dma.engines 2, demand first, prefetches paused at
#         256 KiB chunk boundaries while a demand is live, prefetches abandoned at routing stopped at the next one),
#         Granite-3B and DeepSeek-V2-Lite at context 1,024 with the PCIe-bound cases' buffers, static-4, APEX,
#         ProMoE and LRU                                                                 -> OUT/dma/, OUT/dma-ds/
# Every replay is run twice; the board's energy is read around each. Each step has its own time limit and log.
set -uo pipefail
OUT=${1:?usage: measure-q4-dma.sh OUT [q4-kernel] [q4] [energy] [dma]}
shift
WHAT=" ${*:-q4-kernel q4 energy dma} "
mkdir -p "$OUT"
R="python -m chipsim.hwreplay.run"
G=hwconfigs/h200-pcie5.yaml
D=hwconfigs/h200-pcie5-deepseek-v2-lite.yaml
if [[ "$WHAT" == *" q4-kernel "* ]]; then
  timeout -k 5 120 python validation/compute/check_q4.py > "$OUT/q4-check.json" 2> "$OUT/q4-check.log"
  echo "q4 check: exit $?"
  timeout -k 5 200 python -m chipsim.hwreplay.microbench --out validation/compute/h200-op-times-q4.json --gemv cublas \
      --shapes-from $G $D --set model.expert_bits=4 --contexts 1024 --missing-from $G > "$OUT/op-times-q4.log" 2>&1
  echo "q4 op times: exit $?"
  cp validation/compute/h200-op-times-q4.json "$OUT/"
  python -m chipsim.hwreplay.gpuconfig validation/h200-microbench.json --out $G --kernel-launch graph \
      --op-times-extra validation/compute/h200-op-times-long.json --op-times-extra validation/compute/h200-op-times-q4.json \
      --energy-probe validation/energy/h200-energy-probe.json > "$OUT/gpuconfig.log" 2>&1
  echo "config: exit $?"
  cp $G "$OUT/"
fi
if [[ "$WHAT" == *" q4 "* ]]; then
  Q="--graphs --segments --stalls --repeats 2 --policy lru --policy promoe --contexts 1024 --set model.expert_bits=4"
  timeout -k 5 200 $R $G $Q --set expert_buffer.capacity_mib=384 --out "$OUT/q4" > "$OUT/q4.log" 2>&1
  echo "q4 granite quarter: exit $?"
  timeout -k 5 150 $R $G $Q --set expert_buffer.capacity_mib=1344 --out "$OUT/q4-cached" > "$OUT/q4-cached.log" 2>&1
  echo "q4 granite cached: exit $?"
  timeout -k 5 200 $R $D $Q --set expert_buffer.capacity_mib=1792 --out "$OUT/q4-ds" > "$OUT/q4-ds.log" 2>&1
  echo "q4 deepseek quarter: exit $?"
  timeout -k 5 200 $R $D $Q --set expert_buffer.capacity_mib=6656 --out "$OUT/q4-ds-cached" > "$OUT/q4-ds-cached.log" 2>&1
  echo "q4 deepseek cached: exit $?"
fi
if [[ "$WHAT" == *" energy "* ]]; then
  timeout -k 5 200 python validation/energy/probe_op_energy.py --shapes-from $G $D --contexts 1024,8192,32768 \
      > "$OUT/h200-op-energy.json" 2> "$OUT/op-energy.log"
  echo "op energy: exit $?"
fi
if [[ "$WHAT" == *" dma "* ]]; then
  S="--graphs --stalls --repeats 2 --contexts 1024 --policy static-4 --policy apex --policy promoe --policy lru"
  S="$S --set dma.engines=2 --set dma.demand_first=true --set dma.demand_preempts_prefetch=true --set dma.cancel_in_flight=true"
  timeout -k 5 200 $R $G $S --out "$OUT/dma" > "$OUT/dma.log" 2>&1
  echo "dma granite: exit $?"
  timeout -k 5 280 $R $D $S --out "$OUT/dma-ds" > "$OUT/dma-ds.log" 2>&1
  echo "dma deepseek: exit $?"
fi
