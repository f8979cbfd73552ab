#!/bin/bash
# Every regime again with the energy counter read by chipsim.hwreplay.nvml.Meter (from a counter step after idle
# to a step after idle, less the idle power over the idle part) and the replay's host issuing raw CUDA runtime
# calls (--enqueue cudart), in device commands on one lease (from the repository root; torch with CUDA and Triton,
# nvidia-ml-py and simpy installed):
#
#     bash validation/regimes/measure-settled.sh OUT [STEPS]
#
# STEPS (default all, in this order):
#   counter  the counter's step interval and delay, and naive against settled windows  -> OUT/h200-energy-counter.json
#   smoke    a 24-token --enqueue cudart replay (4-bit, a quarter cached, LRU); if it fails the later steps run with
#            the PyTorch front-end                                                       -> OUT/smoke/
#   probe    the single-op energy probe (the energy table's source)                     -> OUT/h200-energy-probe.json
#   cached   compute-bound and long context, Granite-3B (5,376 MiB buffer: 1,024, 8,192, 32,768) -> OUT/cached/
#            and DeepSeek-V2-Lite (26,112 MiB: 1,024, 8,192)                             -> OUT/cached-ds/
#   pcie     PCIe-bound, Granite-3B at 1,024 (the config's 1,536 MiB buffer)             -> OUT/pcie/
#   q4       4-bit experts, a quarter cached (384 / 1,792 MiB) and nearly all (1,344 / 6,656 MiB), the host alone
#            timed over 16 tokens                                          -> OUT/q4/, OUT/q4-ds/, OUT/q4-cached/, OUT/q4-ds-cached/
#   dma      thor's DMA semantics on two copy engines, static-4, APEX, ProMoE, LRU      -> OUT/dma/, OUT/dma-ds/
#   openergy each decode-step kernel shape's energy alone (BF16; the 4-bit experts' shapes: README)  -> OUT/h200-op-energy.json
#   step     a token's kernels together (one graph; one graph per op group) against the same kernels alone, for
#            energy, Granite-3B and DeepSeek-V2-Lite at 1,024 (validation/energy/probe_step_energy.py) -> OUT/step-*.json
#   handoff  the copy/compute streams' hand-off, copy spans and copies under compute, each timed alone
#            (validation/compute/probe_handoff.py)                                      -> OUT/h200-handoff.json
#   gaps     what a CUDA graph launched after another adds over its kernels in one chain
#            (validation/compute/probe_launch_gaps.py)                                  -> OUT/h200-launch-gaps.json
# The device returns at most 8 files: run it into a scratch folder and pack that, e.g.
#     bash validation/regimes/measure-settled.sh /tmp/m probe step handoff; tar czf $OUT/results.tgz -C /tmp/m .
# Every replay is run twice (LRU and ProMoE unless said). Each step has its own time limit and log.
set -uo pipefail
OUT=${1:?usage: measure-settled.sh OUT [counter] [smoke] [probe] [cached] [pcie] [q4] [dma] [openergy] [step] [handoff] [gaps]}
shift
WHAT=" ${*:-counter smoke probe cached pcie q4 dma openergy step handoff gaps} "
mkdir -p "$OUT"
R="python -m chipsim.hwreplay.run"
G=hwconfigs/h200-pcie5.yaml
D=hwconfigs/h200-pcie5-deepseek-v2-lite.yaml
ENQ="--enqueue cudart"
step() { [[ "$WHAT" == *" $1 "* ]]; }
if step counter; then
  timeout -k 5 90 python validation/energy/probe_counter.py > "$OUT/h200-energy-counter.json" 2> "$OUT/counter.log"
  echo "counter: exit $?"
fi
if step smoke; then
  timeout -k 5 120 $R $G --graphs --segments --stalls $ENQ --policy lru --contexts 1024 --set model.expert_bits=4 \
      --set expert_buffer.capacity_mib=384 --set workload.max_tokens=24 --dispatch-tokens 4 --out "$OUT/smoke" \
      > "$OUT/smoke.log" 2>&1
  rc=$?
  echo "smoke (cudart): exit $rc"
  [ $rc -eq 0 ] || ENQ=""
fi
if step probe; then
  timeout -k 5 240 python validation/energy/probe_energy.py > "$OUT/h200-energy-probe.json" 2> "$OUT/probe.log"
  echo "probe: exit $?"
fi
SEG="--graphs --segments --stalls --repeats 2 --policy lru --policy promoe $ENQ"
if step cached; then
  timeout -k 5 200 $R $G $SEG --set expert_buffer.capacity_mib=5376 --contexts 1024,8192,32768 \
      --out "$OUT/cached" > "$OUT/cached.log" 2>&1
  echo "cached: exit $?"
  timeout -k 5 180 $R $D $SEG --set expert_buffer.capacity_mib=26112 --contexts 1024,8192 \
      --out "$OUT/cached-ds" > "$OUT/cached-ds.log" 2>&1
  echo "cached-ds: exit $?"
fi
if step pcie; then
  timeout -k 5 100 $R $G --graphs --stalls --repeats 2 --policy lru --policy promoe $ENQ --contexts 1024 \
      --out "$OUT/pcie" > "$OUT/pcie.log" 2>&1
  echo "pcie: exit $?"
fi
if step q4; then
  Q="$SEG --contexts 1024 --set model.expert_bits=4 --dispatch-tokens 16"
  timeout -k 5 150 $R $G $Q --set expert_buffer.capacity_mib=384 --out "$OUT/q4" > "$OUT/q4.log" 2>&1
  echo "q4 granite quarter: exit $?"
  timeout -k 5 150 $R $D $Q --set expert_buffer.capacity_mib=1792 --out "$OUT/q4-ds" > "$OUT/q4-ds.log" 2>&1
  echo "q4 deepseek quarter: exit $?"
  timeout -k 5 120 $R $G $Q --set expert_buffer.capacity_mib=1344 --out "$OUT/q4-cached" > "$OUT/q4-cached.log" 2>&1
  echo "q4 granite cached: exit $?"
  timeout -k 5 120 $R $D $Q --set expert_buffer.capacity_mib=6656 --out "$OUT/q4-ds-cached" > "$OUT/q4-ds-cached.log" 2>&1
  echo "q4 deepseek cached: exit $?"
fi
if step dma; then
  S="--graphs --stalls --repeats 2 --contexts 1024 --policy static-4 --policy apex --policy promoe --policy lru $ENQ"
  S="$S --set dma.engines=2 --set dma.demand_first=true --set dma.demand_preempts_prefetch=true --set dma.cancel_in_flight=true"
  timeout -k 5 200 $R $G $S --out "$OUT/dma" > "$OUT/dma.log" 2>&1
  echo "dma granite: exit $?"
  timeout -k 5 280 $R $D $S --out "$OUT/dma-ds" > "$OUT/dma-ds.log" 2>&1
  echo "dma deepseek: exit $?"
fi
if step openergy; then
  timeout -k 5 300 python validation/energy/probe_op_energy.py --shapes-from $G $D --contexts 1024,8192,32768 \
      > "$OUT/h200-op-energy.json" 2> "$OUT/op-energy.log"
  echo "op energy: exit $?"
fi
if step step; then
  timeout -k 5 150 python validation/energy/probe_step_energy.py $G --context 1024 > "$OUT/step-granite.json" 2> "$OUT/step-granite.log"
  echo "step energy granite: exit $?"
  timeout -k 5 150 python validation/energy/probe_step_energy.py $D --context 1024 > "$OUT/step-deepseek.json" 2> "$OUT/step-deepseek.log"
  echo "step energy deepseek: exit $?"
fi
if step handoff; then
  timeout -k 5 60 python validation/compute/probe_handoff.py > "$OUT/h200-handoff.json" 2> "$OUT/handoff.log"
  echo "handoff: exit $?"
fi
if step gaps; then
  timeout -k 5 120 python validation/compute/probe_launch_gaps.py > "$OUT/h200-launch-gaps.json" 2> "$OUT/launch-gaps.log"
  echo "launch gaps: exit $?"
fi
