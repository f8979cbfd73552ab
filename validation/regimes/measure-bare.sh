#!/bin/bash
# Issue #44 item 1: the regimes' token latencies as a program without timing events runs them, beside the lease's own
# link and step costs, in one device command from the repository root with the device's own torch (simpy from .whl/
# when the device lacks it):
#
#     GPU=h100 bash validation/regimes/measure-bare.sh OUT [STEPS]   (STEPS: any of link step q4 q8 cached stalls keyed
#                                                                     activity long dma; default all; GPU=h100 or
#                                                                     h200, default h100)
#     DRY_RUN=1 bash validation/regimes/measure-bare.sh OUT          (the replays on this machine's CPU, 3 tokens)
#
# Why: a CUDA event with timing, recorded on the compute stream, costs the GPU about 1-1.3 µs alone and 5-6.5 µs while
# a copy is in flight (validation/compute/probe_step_costs.py), and the replays' --stalls put two around every wait for
# a copy; the link's copy rate differs between leases by a few per cent (probe_copy_source.py).
#
# link:   pinned copies from host memory that the caches hold and from memory they do not, 256 KiB-16 MiB
#         (validation/compute/probe_copy_source.py)                      -> OUT/$GPU-copy-source.json
# step:   one compute step of each kind (an expert, the weighted sum, attention and router, and a whole layer as one
#         graph, as --segments launches it) back to back, beside copies, after a wait, with and without timing
#         events, 16- and 4-bit experts (validation/compute/probe_step_costs.py) -> OUT/$GPU-step-costs{,-q4}.json
# q4, q8: 4- and 8-bit experts, a quarter of them in the GPU buffer, LRU and ProMoE, one graph per run of compute, no
#         --stalls                                                       -> OUT/q4/, OUT/q8/
# cached: the experts cached (context 1,024), LRU and ProMoE, no --stalls -> OUT/cached/
# stalls: q4 again with --stalls (the timing events' own cost on the same lease) -> OUT/q4-stalls/
# keyed:  q4's ProMoE again, planned with compute.in_sequence_ns from this lease's step files and, where link ran
#         first, the lease's own link (its cold fit; both by validation/regimes/lease_sets.py, after step): ProMoE
#         decides by the steps' and copies' times, so this is the like-for-like replay for comparing with everything
#         the lease measured set (the file's overrides; hwcompare needs no +KEY=VALUE)   -> OUT/q4-keyed/
# activity: q4's plans and the cached LRU plan replayed once unmeasured and once measured, then once more under the
#         GPU's activity record (run --activity: every kernel's and copy's start and end from CUPTI, no event on any
#         stream): where a token's time goes on the GPU against the simulator
#         (python -m chipsim.hwreplay.compare_activity FILE)
#                                                           -> OUT/q4-activity/, OUT/cached-activity/
# long:   long context: the attention shapes at 8,192 and 32,768 that the config lacks, each timed alone as the profile
#         times every shape (microbench --gemv cublas --missing-from; none on a config that has them), then the
#         experts cached at those contexts, LRU and ProMoE -> OUT/$GPU-op-times-long.json, OUT/long/
#         (afterwards: the config written again by its header's command with --op-times-extra that file)
# dma:    thor.yaml's DMA semantics (two copy engines, demand first, prefetches paused at 256 KiB chunk boundaries
#         while a demand is live, abandoned at routing stopped), the PCIe-bound buffer, static-4, APEX, ProMoE and
#         LRU, one graph per op group (a segment ends at every copy synchronisation, and the copy schedule has many)
#                                                                         -> OUT/dma/
# Each replayed once unmeasured and three times measured (--warm-replay --repeats 3). Afterwards, on any machine:
# commit the files (validation/$GPU/README.md) and compare with the link keys the lease's copies give
# (hwcompare --regime NAME FILE+links.pcie.bandwidth_gbps=B+dma.setup_ns=S: the cold fit of OUT/$GPU-copy-source.json).
set -uo pipefail
OUT=${1:?usage: measure-bare.sh OUT [link] [step] [q4] [q8] [cached] [stalls] [keyed] [activity] [long] [dma]}
shift
WHAT=" ${*:-link step q4 q8 cached stalls keyed activity long dma} "
GPU_DEFAULT=h100
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
DEVICE=cuda
REPEATS=3
TOKENS=()
G="--graphs --segments"
DMA_LAUNCH="--graphs"
if [[ -n "${DRY_RUN:-}" ]]; then
  DEVICE=cpu
  REPEATS=1
  TOKENS=(--set workload.max_tokens=3 --set workload.warmup_tokens=1)
  G=""
  DMA_LAUNCH=""
fi
CFG=hwconfigs/$GPU-pcie5.yaml
R="python -m chipsim.hwreplay.run $CFG --contexts 1024 --repeats $REPEATS --device $DEVICE --warm-replay"
step() { [[ "$WHAT" == *" $1 "* ]]; }
echo "measure-bare: $GPU on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
probe() {  # step, output name, probe script and its options: a GPU probe (skipped on the CPU), its JSON into OUT
  local name=$1 file=$2
  shift 2
  if [[ $DEVICE == cpu ]]; then
    echo "$name: skipped (it times CUDA copies and kernels)" | tee -a "$LOG"
    return
  fi
  timeout -k 5 120 python "$@" > "$OUT/$GPU-$file.json" 2>> "$LOG"
  echo "$name: exit $? ($(date -u +%T))" | tee -a "$LOG"
}
replay() {  # name, then the replay's own options (TIMEOUT: seconds, default 150; LAUNCH: default $G; a later
  local name=$1  # --contexts wins over R's)
  shift
  timeout -k 5 "${TIMEOUT:-150}" $R ${LAUNCH-$G} "$@" "${TOKENS[@]}" --out "$OUT/$name" >> "$LOG" 2>&1
  echo "replay $name: exit $? ($(date -u +%T))" | tee -a "$LOG"
}
POLICIES="--policy lru --policy promoe"
Q4="--set model.expert_bits=4 --set expert_buffer.capacity_mib=384 $POLICIES"
if step link; then probe link copy-source validation/compute/probe_copy_source.py; fi
if step step; then
  probe step step-costs validation/compute/probe_step_costs.py --config "$CFG"
  probe "step (4-bit)" step-costs-q4 validation/compute/probe_step_costs.py --config "$CFG" --set model.expert_bits=4
fi
if step q4; then replay q4 $Q4; fi
if step q8; then replay q8 --set model.expert_bits=8 --set expert_buffer.capacity_mib=768 $POLICIES; fi
if step cached; then replay cached --set expert_buffer.capacity_mib=5376 $POLICIES; fi
if step keyed; then
  STEP_FILES=("$OUT/$GPU-step-costs.json" "$OUT/$GPU-step-costs-q4.json")
  LINK=()
  [[ -f $OUT/$GPU-copy-source.json ]] && LINK=(--copy-source "$OUT/$GPU-copy-source.json")
  KEY=""
  [[ -f ${STEP_FILES[0]} && -f ${STEP_FILES[1]} ]] \
    && KEY=$(python validation/regimes/lease_sets.py "${STEP_FILES[@]}" "${LINK[@]}" 2>> "$LOG")
  if [[ -n "$KEY" ]]; then
    echo "keyed: $KEY" | tee -a "$LOG"
    replay q4-keyed --set model.expert_bits=4 --set expert_buffer.capacity_mib=384 --policy promoe $KEY
  else
    echo "keyed: skipped (no step files from this lease, or lease_sets.py refused them: run step first)" | tee -a "$LOG"
  fi
fi
if step activity; then  # the record of ~10^5 kernels a plan takes its export and reading: a longer timeout
  TIMEOUT=240 replay q4-activity --activity --repeats 1 $Q4
  TIMEOUT=180 replay cached-activity --activity --repeats 1 --set expert_buffer.capacity_mib=5376 --policy lru
fi
if step long; then
  MISSING=$(python -c "import sys; from chipsim.hwreplay.microbench import decode_shapes
print(len(decode_shapes([sys.argv[1]], [8192, 32768], [], [sys.argv[1]])))" "$CFG" 2>> "$LOG")
  if [[ $DEVICE == cuda && ${MISSING:-0} != 0 ]]; then
    timeout -k 5 120 python -m chipsim.hwreplay.microbench --gemv cublas --shapes-from "$CFG" --contexts 8192,32768 \
        --missing-from "$CFG" --out "$OUT/$GPU-op-times-long.json" >> "$LOG" 2>&1
    echo "long op times: exit $? ($(date -u +%T))" | tee -a "$LOG"
  else
    echo "long op times: skipped (on a CPU, or the config has every shape: ${MISSING:-none} missing)" | tee -a "$LOG"
  fi
  TIMEOUT=200 replay long --contexts 8192,32768 --set expert_buffer.capacity_mib=5376 $POLICIES
fi
if step dma; then
  DMA="--set dma.engines=2 --set dma.demand_first=true --set dma.demand_preempts_prefetch=true"
  DMA="$DMA --set dma.cancel_in_flight=true --policy static-4 --policy apex --policy promoe --policy lru"
  LAUNCH=$DMA_LAUNCH TIMEOUT=200 replay dma $DMA
fi
if step stalls; then
  S="--stalls"
  [[ $DEVICE == cuda ]] || S=""
  replay q4-stalls $S $Q4
fi
