#!/bin/bash
# Issue #43 item 5: a short Poisson run served on the H200 (per-step latency, the run's energy), in one device command
# from the repository root with the device's own torch (2.11, CUDA); simpy comes from .whl/ when the device lacks it:
#
#     bash validation/regimes/measure-served.sh OUT [STEPS]      (STEPS: any of optimes config replay; default all)
#     DRY_RUN=1 bash validation/regimes/measure-served.sh OUT    (the same steps on this machine's CPU, 4 small requests)
#
# Granite-3B (hwconfigs/h200-pcie5.yaml, traces/real-granite-3b.npz) serving 12 requests of 64 prompt and 8 output
# tokens arriving at 4 per second (Poisson, seed 0), the chunked (Sarathi) scheduler: steps of at most 48 tokens,
# prompt chunks of at most 32, decode tokens and prompt chunks of several requests in one step; policies no-prefetch
# and promoe (a prefetching one).
#
# optimes: every kernel shape of each policy's steps that hwconfigs/h200-pcie5.yaml has not timed (the GEMMs over
#          a step's tokens, each decode token's attention over its cache, each chunk's attention kernel, each
#          expert's GEMMs over the step's tokens routed to it, the elementwise work), each alone in one CUDA graph,
#          the GEMMs first                          -> validation/compute/h200-op-times-served.json
# config:  hwconfigs/h200-pcie5.yaml written again by the command in its header with that file added
#          (--op-times-extra); then, as the new times move the steps (a step's parts depend on when it starts), the
#          shapes the runs now take that are still untimed are probed and added the same way
#                                                   -> validation/compute/h200-op-times-served-2.json
# replay:  each policy's steps replayed once unmeasured, then twice with the board's energy read around each, the
#          simulated gaps between steps slept on the GPU
#          (chipsim hwreplay --served ... --graphs) -> OUT/served/h200-pcie5.json
# The probe files and the config are copied to OUT as well. Afterwards, on any machine: commit them and the replay
# (validation/regimes/README.md) and `chipsim hwcompare --served-regime NAME validation/regimes/served`. All output
# also goes to OUT/measure.log.
set -uo pipefail
OUT=${1:?usage: measure-served.sh OUT [optimes] [config] [replay]}
shift
WHAT=" ${*:-optimes config replay} "
GPU_DEFAULT=h200
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
mkdir -p "$OUT/served"
RUN=(--set workload.requests=12 --set workload.prompt_tokens=64 --set workload.output_tokens=8
     --set workload.arrivals.poisson_rps=4 --set workload.arrivals.seed=0 --set workload.scheduler.kind=chunked
     --set workload.scheduler.max_step_tokens=48 --set workload.prefill_chunk_tokens=32)
POLICIES=(--policy no-prefetch --policy promoe)
DEVICE=cuda
REPEATS=2
LIMITS=(60 200)  # seconds: each probe, the replays
if [[ -n "${DRY_RUN:-}" ]]; then  # the CPU: 4 requests of 16 + 3 tokens at 0.25/s (gaps between steps), one measured
  # replay, the config in OUT
  RUN=(--set workload.requests=4 --set workload.prompt_tokens=16 --set workload.output_tokens=3
       --set workload.arrivals.poisson_rps=0.25 --set workload.arrivals.seed=0 --set workload.scheduler.kind=chunked
       --set workload.scheduler.max_step_tokens=12 --set workload.prefill_chunk_tokens=8
       --set expert_buffer.capacity_mib=2048)
  DEVICE=cpu
  REPEATS=1
  LIMITS=(600 900)
  export OMP_NUM_THREADS=1
  dry_run_configs $GPU-pcie5.yaml
fi
GRANITE=$CFG/$GPU-pcie5.yaml
step() { [[ "$WHAT" == *" $1 "* ]]; }
echo "measure-served: ${RUN[*]} on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
probe() {  # probe FILE: the runs' shapes the config lacks, timed alone
  timeout -k 5 "${LIMITS[0]}" python -m chipsim.hwreplay.microbench --gemv cublas --served "${POLICIES[@]}" \
      --device $DEVICE --shapes-from "$GRANITE" --missing-from "$GRANITE" "${RUN[@]}" --out "$1" >> "$LOG" 2>&1
  local rc=$?
  echo "optimes $(basename "$1"): exit $rc ($(date -u +%T))" | tee -a "$LOG"
}
add_to_config() {  # add_to_config FILE: the config's own command (its header's third line) with FILE added
  local command
  command=$(sed -n 3p "$GRANITE" | sed 's/^#   //')
  if [[ "$command" == *$(basename "$1")* ]]; then
    echo "config: its command has $(basename "$1") already; left as it is" | tee -a "$LOG"
  elif [[ -f $1 ]]; then
    $command --op-times-extra "$1" --out "$GRANITE" >> "$LOG" 2>&1
    local rc=$?
    echo "config with $(basename "$1"): exit $rc ($(date -u +%T))" | tee -a "$LOG"
  else
    echo "config: $1 is missing; the replays plan with the config as it is" | tee -a "$LOG"
  fi
}
if step optimes; then
  probe "$PROBES/$GPU-op-times-served.json"
fi
if step config; then
  add_to_config "$PROBES/$GPU-op-times-served.json"
  if step optimes; then  # the shapes the new times' steps take that are still untimed
    probe "$PROBES/$GPU-op-times-served-2.json"
    add_to_config "$PROBES/$GPU-op-times-served-2.json"
  fi
fi
if step replay; then
  R="python -m chipsim.hwreplay.run --served ${POLICIES[*]} --repeats $REPEATS --device $DEVICE"
  [[ $DEVICE == cuda ]] && R="$R --graphs"
  timeout -k 5 "${LIMITS[1]}" $R "${RUN[@]}" "$GRANITE" --out "$OUT/served" >> "$LOG" 2>&1
  echo "replay granite-3b served: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if [[ -z "${DRY_RUN:-}" ]]; then  # what came out of the device's copy of the repository, beside the replays
  cp -f $PROBES/$GPU-op-times-served*.json "$CFG/$GPU-pcie5.yaml" "$OUT/" 2>/dev/null
fi
