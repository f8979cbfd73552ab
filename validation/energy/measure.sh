#!/bin/bash
# The H200 energy measurements, in one device command (from the repository root; torch with CUDA, nvidia-ml-py and
# simpy installed):
#
#     bash validation/energy/measure.sh OUT
#
# 1. single-op energy microbenchmarks (validation/energy/probe_energy.py): idle, host-to-device copies at four
#    rates, an HBM-bound GEMV, a compute-bound GEMM, each window twice          -> OUT/h200-energy-probe.json
# 2. PCIe-bound replays with the board's energy read around each: Granite-3B (h200-pcie5.yaml) and DeepSeek-V2-Lite
#    (held out), context 1,024, every policy of each config, each plan replayed twice    -> OUT/pcie/
# 3. compute-bound: Granite-3B with nearly every expert cached on the GPU (a 5,376 MiB buffer for 5.62 GiB of
#    experts), LRU and ProMoE, each plan replayed twice                                   -> OUT/cached/
set -euo pipefail
OUT=${1:?usage: measure.sh OUT}
mkdir -p "$OUT"
python validation/energy/probe_energy.py > "$OUT/h200-energy-probe.json"
python -m chipsim.hwreplay.run hwconfigs/h200-pcie5.yaml hwconfigs/h200-pcie5-deepseek-v2-lite.yaml --graphs \
    --contexts 1024 --repeats 2 --out "$OUT/pcie"
python -m chipsim.hwreplay.run hwconfigs/h200-pcie5.yaml --graphs --set expert_buffer.capacity_mib=5376 \
    --contexts 1024 --policy lru --policy promoe --repeats 2 --out "$OUT/cached"
