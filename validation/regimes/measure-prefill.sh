#!/bin/bash
# Issue #42 item 6: a request's prefill on the H200 (TTFT and energy), in one device command from the repository
# root with the device's own torch (2.11, CUDA); simpy comes from .whl/ when the device lacks it:
#
#     bash validation/regimes/measure-prefill.sh OUT [STEPS]      (STEPS: any of optimes config replay; default all)
#     DRY_RUN=1 bash validation/regimes/measure-prefill.sh OUT    (the same steps on this machine's CPU, tiny prompts)
#
# Two models whose real traces hold a prompt of 4,096 (and the one output token the replay stops after):
# phi-mini-moe (traces/real-phi-mini-moe.npz, 8,192 tokens; hwconfigs/h200-pcie5-phi-mini-moe.yaml) and gpt-oss-20b
# (traces/real-gpt-oss-20b.npz, 6,144 tokens; hwconfigs/h200-pcie5-gpt-oss-20b.yaml), prompts 256, 1,024 and 4,096,
# each prompt one chunk, prefill policies on-demand and layer-ahead.
#
# optimes: every kernel shape of those prefill chunks that hwconfigs/h200-pcie5.yaml has not timed (each GEMM over a
#          chunk's tokens and over each expert's routed tokens, the attention kernels, the elementwise work), each
#          alone in one CUDA graph, the GEMMs and attention first
#                                               -> validation/compute/h200-op-times-prefill-{phi,gpt-oss}.json
# config:  hwconfigs/h200-pcie5.yaml written again by the command in its header with those two files added
#          (--op-times-extra): the plans the replays run are the ones the committed config will give
# replay:  each (model, prompt, policy) replayed once unmeasured, then twice with the board's energy read around it
#          (chipsim hwreplay --prompts ... --graphs)    -> OUT/prefill/h200-pcie5-{phi-mini-moe,gpt-oss-20b}.json
# The probe files and the config are copied to OUT as well. Afterwards, on any machine: commit them and the replays
# (validation/regimes/README.md) and `chipsim hwcompare --prefill-regime NAME validation/regimes/prefill`. All output
# also goes to OUT/measure.log.
set -uo pipefail
OUT=${1:?usage: measure-prefill.sh OUT [optimes] [config] [replay]}
shift
WHAT=" ${*:-optimes config replay} "
GPU_DEFAULT=h200
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
mkdir -p "$OUT/prefill"
PROMPTS=256,1024,4096
DEVICE=cuda
LIMITS=(100 100 120 150)  # seconds: each probe, the phi-mini-moe replays, the gpt-oss-20b replays (7.8 min at most)
SETS=()
if [[ -n "${DRY_RUN:-}" ]]; then  # the CPU: the smallest prompts, a buffer this machine holds, the configs in OUT
  PROMPTS=16,32
  DEVICE=cpu
  LIMITS=(600 600 900 900)
  SETS=(--set expert_buffer.capacity_mib=2048)
  dry_run_configs $GPU-pcie5.yaml $GPU-pcie5-phi-mini-moe.yaml $GPU-pcie5-gpt-oss-20b.yaml
fi
PHI=$CFG/$GPU-pcie5-phi-mini-moe.yaml
OSS=$CFG/$GPU-pcie5-gpt-oss-20b.yaml
step() { [[ "$WHAT" == *" $1 "* ]]; }
echo "measure-prefill: prompts $PROMPTS on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
if step optimes; then
  for pair in "phi:$PHI" "gpt-oss:$OSS"; do
    name=${pair%%:*}
    timeout -k 5 "${LIMITS[0]}" python -m chipsim.hwreplay.microbench --gemv cublas --prompts $PROMPTS --device $DEVICE \
        --shapes-from "${pair#*:}" --missing-from "$CFG/$GPU-pcie5.yaml" --out "$PROBES/$GPU-op-times-prefill-$name.json" \
        >> "$LOG" 2>&1
    echo "optimes $name: exit $? ($(date -u +%T))" | tee -a "$LOG"
  done
fi
if step config; then
  EXTRA="--op-times-extra $PROBES/$GPU-op-times-prefill-phi.json --op-times-extra $PROBES/$GPU-op-times-prefill-gpt-oss.json"
  COMMAND=$(sed -n 3p "$CFG/$GPU-pcie5.yaml" | sed 's/^#   //')  # the config's own command (its header's third line)
  if [[ "$COMMAND" == *$GPU-op-times-prefill* ]]; then
    echo "config: its command has the prefill shapes already; left as it is" | tee -a "$LOG"
  elif [[ -f $PROBES/$GPU-op-times-prefill-phi.json && -f $PROBES/$GPU-op-times-prefill-gpt-oss.json ]]; then
    $COMMAND $EXTRA --out "$CFG/$GPU-pcie5.yaml" >> "$LOG" 2>&1
    echo "config: exit $? ($(date -u +%T))" | tee -a "$LOG"
  else
    echo "config: a probe file is missing; the replays plan with the config as it is" | tee -a "$LOG"
  fi
fi
if step replay; then
  R="python -m chipsim.hwreplay.run --prompts $PROMPTS --policy on-demand --policy layer-ahead --repeats 2 --device $DEVICE"
  [[ $DEVICE == cuda ]] && R="$R --graphs"
  timeout -k 5 "${LIMITS[2]}" $R "${SETS[@]}" $PHI --out "$OUT/prefill" >> "$LOG" 2>&1
  echo "replay phi-mini-moe: exit $? ($(date -u +%T))" | tee -a "$LOG"
  timeout -k 5 "${LIMITS[3]}" $R "${SETS[@]}" $OSS --out "$OUT/prefill" >> "$LOG" 2>&1
  echo "replay gpt-oss-20b: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if [[ -z "${DRY_RUN:-}" ]]; then  # what came out of the device's copy of the repository, beside the replays
  cp -f $PROBES/$GPU-op-times-prefill-*.json "$CFG/$GPU-pcie5.yaml" "$OUT/" 2>/dev/null
fi
