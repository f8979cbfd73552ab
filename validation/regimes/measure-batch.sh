#!/bin/bash
# Issue #43 item 5: a batch's decode steps on the H200 (per-step latency and energy), in one device command from the
# repository root with the device's own torch (2.11, CUDA); simpy comes from .whl/ when the device lacks it:
#
#     bash validation/regimes/measure-batch.sh OUT [STEPS]      (STEPS: any of optimes config replay; default all)
#     DRY_RUN=1 bash validation/regimes/measure-batch.sh OUT    (the same steps on this machine's CPU, 2 decode steps)
#
# Granite-3B (hwconfigs/h200-pcie5.yaml, traces/real-granite-3b.npz) decoding B = 4 sequences together, 16 steps of
# one token each at the config's context (1,024), policies no-prefetch and static-4 (a prefetching one).
#
# optimes: every kernel shape of that batch step that hwconfigs/h200-pcie5.yaml has not timed (the GEMMs of 4 rows,
#          each expert's GEMMs over 2, 3 and 4 tokens, the elementwise work over 4 tokens), each alone in one CUDA
#          graph, the GEMMs first                   -> validation/compute/h200-op-times-batch.json
# config:  hwconfigs/h200-pcie5.yaml written again by the command in its header with that file added
#          (--op-times-extra): the plans the replays run are the ones the committed config will give
# replay:  each policy's plan replayed once unmeasured, then twice with the board's energy read around it
#          (chipsim hwreplay --batch 4 --steps 16 ... --graphs)   -> OUT/batch/h200-pcie5.json
# The probe file and the config are copied to OUT as well. Afterwards, on any machine: commit them and the replay
# (validation/regimes/README.md) and `chipsim hwcompare --batch-regime NAME validation/regimes/batch`. All output
# also goes to OUT/measure.log.
set -uo pipefail
OUT=${1:?usage: measure-batch.sh OUT [optimes] [config] [replay]}
shift
WHAT=" ${*:-optimes config replay} "
GPU_DEFAULT=h200
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
mkdir -p "$OUT/batch"
BATCH=4
STEPS=16
DEVICE=cuda
REPEATS=2
LIMITS=(100 240)  # seconds: the probe, the replays (5.7 min at most with the config's second)
if [[ -n "${DRY_RUN:-}" ]]; then  # the CPU: 2 steps, one measured replay, the config in OUT, one thread (fast GEMVs)
  STEPS=2
  DEVICE=cpu
  REPEATS=1
  LIMITS=(600 900)
  export OMP_NUM_THREADS=1
  dry_run_configs $GPU-pcie5.yaml
fi
GRANITE=$CFG/$GPU-pcie5.yaml
step() { [[ "$WHAT" == *" $1 "* ]]; }
echo "measure-batch: B $BATCH, $STEPS steps on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
if step optimes; then
  timeout -k 5 "${LIMITS[0]}" python -m chipsim.hwreplay.microbench --gemv cublas --batch $BATCH --steps $STEPS \
      --device $DEVICE --shapes-from "$GRANITE" --missing-from "$GRANITE" --out "$PROBES/$GPU-op-times-batch.json" \
      >> "$LOG" 2>&1
  echo "optimes: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step config; then
  COMMAND=$(sed -n 3p "$GRANITE" | sed 's/^#   //')  # the config's own command (its header's third line)
  if [[ "$COMMAND" == *$GPU-op-times-batch* ]]; then
    echo "config: its command has the batch shapes already; left as it is" | tee -a "$LOG"
  elif [[ -f $PROBES/$GPU-op-times-batch.json ]]; then
    $COMMAND --op-times-extra "$PROBES/$GPU-op-times-batch.json" --out "$GRANITE" >> "$LOG" 2>&1
    echo "config: exit $? ($(date -u +%T))" | tee -a "$LOG"
  else
    echo "config: the probe file is missing; the replays plan with the config as it is" | tee -a "$LOG"
  fi
fi
if step replay; then
  R="python -m chipsim.hwreplay.run --batch $BATCH --steps $STEPS --policy no-prefetch --policy static-4"
  R="$R --repeats $REPEATS --device $DEVICE"
  [[ $DEVICE == cuda ]] && R="$R --graphs"
  timeout -k 5 "${LIMITS[1]}" $R "$GRANITE" --out "$OUT/batch" >> "$LOG" 2>&1
  echo "replay granite-3b: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if [[ -z "${DRY_RUN:-}" ]]; then  # what came out of the device's copy of the repository, beside the replays
  cp -f $PROBES/$GPU-op-times-batch.json "$CFG/$GPU-pcie5.yaml" "$OUT/" 2>/dev/null
fi
