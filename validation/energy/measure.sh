#!/bin/bash
# The H200 energy and compute-bound measurements, in one device command on one board (from the repository root;
# torch with CUDA, nvidia-ml-py and simpy installed):
#
#     bash validation/energy/measure.sh OUT
#
# 1. single-op energy microbenchmarks (validation/energy/probe_energy.py): idle, host-to-device copies at four
#    rates, tiny kernels, small and large GEMVs, a GEMM, each window twice                -> OUT/h200-energy-probe.json
# 2. compute-bound, Granite-3B: nearly every expert cached on the GPU (a 5,376 MiB buffer for 5.62 GiB of
#    experts), LRU and ProMoE at contexts 1,024, 8,192 and 32,768; one CUDA graph per run of compute between copy
#    synchronisations (--segments; the config's per-group launch gap is then 0); per-layer stalls timed
#                                                                                          -> OUT/cached/
# 3. the same for DeepSeek-V2-Lite (held out): a 26,112 MiB buffer for 26.81 GiB of experts, contexts 1,024, 8,192
#                                                                                          -> OUT/cached-ds/
# 4. PCIe-bound, Granite-3B at context 1,024 as in VALIDATION.md's first table (a 1,536 MiB buffer, one graph per
#    op group), LRU and ProMoE, per-layer stalls timed                                     -> OUT/pcie/
# Every replay is run twice; the board's energy is read around each. Each step has its own time limit, and
# writes its log beside its results.
set -uo pipefail
OUT=${1:?usage: measure.sh OUT}
mkdir -p "$OUT"
R="python -m chipsim.hwreplay.run"
SEG="--graphs --segments --stalls --set compute.op_group_launch_ns=0 --repeats 2 --policy lru --policy promoe"
timeout -k 5 200 python validation/energy/probe_energy.py > "$OUT/h200-energy-probe.json" 2> "$OUT/probe.log"
echo "probe: exit $?"
timeout -k 5 200 $R hwconfigs/h200-pcie5.yaml $SEG --set expert_buffer.capacity_mib=5376 --contexts 1024,8192,32768 \
    --out "$OUT/cached" > "$OUT/cached.log" 2>&1
echo "cached: exit $?"
timeout -k 5 150 $R hwconfigs/h200-pcie5-deepseek-v2-lite.yaml $SEG --set expert_buffer.capacity_mib=26112 \
    --contexts 1024,8192 --out "$OUT/cached-ds" > "$OUT/cached-ds.log" 2>&1
echo "cached-ds: exit $?"
timeout -k 5 100 $R hwconfigs/h200-pcie5.yaml --graphs --stalls --repeats 2 --policy lru --policy promoe \
    --contexts 1024 --out "$OUT/pcie" > "$OUT/pcie.log" 2>&1
echo "pcie: exit $?"
