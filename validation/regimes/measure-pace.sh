#!/bin/bash
# Issue #44 item 1: the host's pace, in one device command from the repository root with the device's own torch
# (simpy from .whl/ when the device lacks it):
#
#     bash validation/regimes/measure-pace.sh OUT [STEPS]     (STEPS: any of frontend pace spans idle fresh; default all;
#                                                            GPU=h100 or h200, default h100)
#     DRY_RUN=1 bash validation/regimes/measure-pace.sh OUT   (the replays on this machine's CPU, 3 tokens)
#
# frontend: the host's front-end costs, each alone (python -m chipsim.hwreplay.host_frontend): the host's time per
#           copy, graph launch (1, 8, 32 kernels), event record and stream wait, the same copy and launch on other
#           memory each time (256 distinct graphs, distinct buffers), through PyTorch and as raw CUDA runtime calls,
#           with the GPU busy ahead and idle; the launch queue's run-ahead; the pageable copies and read-back
#                                                            -> OUT/$GPU-host-frontend-pace.json
# pace:     Granite-3B at context 1,024, each plan replayed once unmeasured and twice measured, then 16 of its tokens
#           enqueued again one at a time on an idle GPU and behind a sleeping kernel (--dispatch-tokens 16: the
#           host's own time per token), with the config as it is (write the probe's keys into it afterwards with
#           gpuconfig --host-pace):
#             cached-groups:  experts cached, one graph per op group, through PyTorch   -> OUT/cached-groups/
#             cached-seg:     experts cached, one graph per run of compute, PyTorch     -> OUT/cached-seg/
#             q4-torch:       4-bit experts, a quarter cached, segments, PyTorch        -> OUT/q4-torch/
#             q4-cudart:      the same through raw CUDA runtime calls                    -> OUT/q4-cudart/
#             pcie:           BF16 experts, PCIe-bound (LRU, ProMoE), one graph per op group, PyTorch -> OUT/pcie/
# spans:    the same plans as pace's cached-seg, q4-torch (LRU) and pcie (LRU and the oracle), each compute step timed
#           (--op-spans: an event before and after each): where a token's time goes, inside compute or between it
#                                                            -> OUT/spans-{cached-seg,q4-torch,pcie}/
# idle:     one expert's kernels after the GPU has idled 0-10,000 µs, and back to back (validation/compute/
#           probe_after_idle.py)                             -> OUT/$GPU-after-idle.json
# fresh:    a GEMV over weights a copy has just written, against weights long in HBM (validation/compute/
#           probe_fresh_weights.py)                          -> OUT/$GPU-fresh-weights.json
# Afterwards, on any machine: commit OUT's files (validation/$GPU/README.md says where) and compare the host's time
# per token the config's issue keys give with the replays' host_dispatch_ms. All output also goes to OUT/measure.log.
set -uo pipefail
OUT=${1:?usage: measure-pace.sh OUT [frontend] [pace] [spans] [idle] [fresh]}
shift
WHAT=" ${*:-frontend pace spans idle fresh} "
GPU_DEFAULT=h100
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
DEVICE=cuda
REPEATS=2
TOKENS=()
if [[ -n "${DRY_RUN:-}" ]]; then
  DEVICE=cpu
  REPEATS=1
  TOKENS=(--set workload.max_tokens=3 --set workload.warmup_tokens=1)
fi
CFG=hwconfigs/$GPU-pcie5.yaml
R="python -m chipsim.hwreplay.run $CFG --contexts 1024 --repeats $REPEATS --device $DEVICE --warm-replay"
D="--dispatch-tokens 16"
[[ $DEVICE == cuda ]] || D=""
G="--graphs"
[[ $DEVICE == cuda ]] || G=""
step() { [[ "$WHAT" == *" $1 "* ]]; }
echo "measure-pace: $GPU on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
if step frontend && [[ $DEVICE == cpu ]]; then
  echo "frontend: skipped (every part times CUDA copies, launches or events)" | tee -a "$LOG"
elif step frontend; then
  timeout -k 5 240 python -m chipsim.hwreplay.host_frontend --threads $(( $(nproc) - 1 )) \
      --out "$OUT/$GPU-host-frontend-pace.json" >> "$LOG" 2>&1
  echo "frontend: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
replay() {  # name, then the replay's own options
  local name=$1
  shift
  timeout -k 5 150 $R "$@" "${TOKENS[@]}" --out "$OUT/$name" >> "$LOG" 2>&1
  echo "pace $name: exit $? ($(date -u +%T))" | tee -a "$LOG"
}
if step pace; then
  CACHED="--set expert_buffer.capacity_mib=5376 --policy lru"
  Q4="--set model.expert_bits=4 --set expert_buffer.capacity_mib=384 --policy lru --policy promoe"
  SEG="--segments --stalls"
  [[ $DEVICE == cuda ]] || SEG=""
  replay cached-groups $G $D $CACHED
  replay cached-seg $G $SEG $D $CACHED
  replay q4-torch $G $SEG $D $Q4
  if [[ $DEVICE == cuda ]]; then
    replay q4-cudart $G $SEG --enqueue cudart $D $Q4
  fi
  replay pcie $G $D --policy lru --policy promoe
fi
if step spans; then  # one graph per run of compute where pace's replays had them (segments need graphs)
  S="--segments"
  [[ $DEVICE == cuda ]] || S=""
  replay spans-cached-seg $G $S --op-spans --set expert_buffer.capacity_mib=5376 --policy lru
  replay spans-q4-torch $G $S --op-spans --set model.expert_bits=4 --set expert_buffer.capacity_mib=384 --policy lru
  replay spans-pcie $G --op-spans --policy lru --policy oracle
fi
probe() {  # step, output name, probe script: a single-op GPU probe (skipped on the CPU), its JSON into OUT and the log
  if [[ $DEVICE == cpu ]]; then
    echo "$1: skipped (it times CUDA kernels)" | tee -a "$LOG"
    return
  fi
  timeout -k 5 120 python "validation/compute/$3" > "$OUT/$GPU-$2.json" 2>> "$LOG"
  echo "$1: exit $? ($(date -u +%T))" | tee -a "$LOG"
  cat "$OUT/$GPU-$2.json" >> "$LOG"
}
if step idle; then probe idle after-idle probe_after_idle.py; fi
if step fresh; then probe fresh fresh-weights probe_fresh_weights.py; fi
