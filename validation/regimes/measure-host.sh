#!/bin/bash
# Issue #44 item 2: experts computed on the host CPU, replayed for real beside the GPU's work, and 8-bit experts, in
# device commands from the repository root with the device's own torch; simpy comes from .whl/ when the device lacks
# it:
#
#     bash validation/regimes/measure-host.sh OUT [STEPS]      (STEPS: any of probe frontend config host frontend-replays qkernel qtimes quant;
#                                                              default all; GPU=h100 or h200, default h100)
#     DRY_RUN=1 bash validation/regimes/measure-host.sh OUT    (the same steps on this machine's CPU, 3 tokens)
#
# probe:   one Granite-3B expert on the host CPU (every CPU but one: THREADS below) and an empty host job's round
#          trip, each alone (python -m chipsim.hwreplay.host_cpu)        -> $PROBES/$GPU-host-cpu-expert.json;
#          one Phi-mini-MoE expert the same way, its rate written into hwconfigs/$GPU-pcie5-phi-mini-moe.yaml
#                                                                          -> $PROBES/$GPU-host-cpu-expert-phi.json
# frontend: the host's front-end costs, each alone: pageable and pinned copies, a pageable copy beside a kernel, the
#          host's time per copy, kernel and graph launch, a routing read-back, the launch queue's run-ahead, the host
#          DRAM's read rate alone and beside copies (python -m chipsim.hwreplay.host_frontend)
#                                                                          -> $PROBES/$GPU-host-frontend.json
# config:  hwconfigs/$GPU-pcie5.yaml written again by the command in its header with --host-cpu that file: the
#          host_cpu keys measured (cores, memory_bandwidth_gbps, dispatch_overhead_ns)
# host:    Fiddler (a static half of the buffer's experts placed, the rest on the CPU) and CG-MoE (an LRU cache whose
#          misses go to the cheaper of a fetch and the CPU) at context 1,024, each plan replayed once unmeasured and
#          twice measured (--graphs --warm-replay), Granite-3B and Phi-mini-MoE
#                                                                          -> OUT/host/, OUT/host-phi/
# frontend-replays: the host front-end's software, each plan simulated with the config's measured host_frontend keys
#          and replayed as that software runs: the host reading each layer's routing back before it enqueues what
#          follows (routing: host), experts copied from pageable memory (expert_memory: pageable), and both; on-demand
#          and ProMoE, Granite-3B at context 1,024, once unmeasured and twice measured (FRONTEND_VARIANTS: which of
#          readback, pageable, both; default all)
#                                                                          -> OUT/frontend-{readback,pageable,both}/
# qkernel: the 8-bit kernel (and the 4-bit one) against its reference     -> OUT/q8-check.json, OUT/q4-check.json
# qtimes:  the 4- and 8-bit expert matvec shapes the config lacks, timed alone, then the config written again with
#          them (--op-times-extra)                                        -> $PROBES/$GPU-op-times-q{4,8}.json
# quant:   4- and 8-bit experts, a quarter of them in the GPU buffer, LRU and ProMoE, one graph per run of compute,
#          stalls timed, the host issuing raw CUDA calls (--enqueue cudart) -> OUT/q8/, OUT/q4/
# Afterwards, on any machine: commit the probe files, the config and the replays (validation/$GPU/README.md) and
# regenerate VALIDATION.md with README's hwcompare command. All output also goes to OUT/measure.log.
set -uo pipefail
OUT=${1:?usage: measure-host.sh OUT [probe] [frontend] [config] [host] [frontend-replays] [qkernel] [qtimes] [quant]}
shift
WHAT=" ${*:-probe frontend config host frontend-replays qkernel qtimes quant} "
GPU_DEFAULT=h100
source validation/regimes/device-env.sh  # OUT, LOG, simpy, PYTHONPATH, pynvml, GPU, CFG, PROBES; the card
DEVICE=cuda
REPEATS=2
TOKENS=()
POOL=2
# every CPU but one computes (the config's host_cpu.cores): the thread that feeds the GPU and the board's energy
# meter keep one. With all 16 of the H100 host's CPUs computing, a first run's tokens ranged 35-98 ms as the
# CPUs' threads waited for one descheduled (validation/h100/README.md)
THREADS=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
if [[ -n "${DRY_RUN:-}" ]]; then  # the CPU: 3 tokens, one measured replay, the configs and probes in OUT
  DEVICE=cpu
  REPEATS=1
  TOKENS=(--set workload.max_tokens=3 --set workload.warmup_tokens=1)
  POOL=0.1
  dry_run_configs $GPU-pcie5.yaml $GPU-pcie5-phi-mini-moe.yaml
fi
GRANITE=$CFG/$GPU-pcie5.yaml
PHI=$CFG/$GPU-pcie5-phi-mini-moe.yaml
R="python -m chipsim.hwreplay.run --contexts 1024 --repeats $REPEATS --device $DEVICE --warm-replay"
[[ $DEVICE == cuda ]] && R="$R --graphs"
step() { [[ "$WHAT" == *" $1 "* ]]; }
# rewrite the config by its header's command with `$1 $2` added (or run again as it is where it has them)
rewrite() {
  local command
  command=$(sed -n 3p "$GRANITE" | sed 's/^#   //')
  [[ "$command" == *"$1 $2"* ]] || command="$command $1 $2"
  $command --out "$GRANITE" >> "$LOG" 2>&1
}
echo "measure-host: $GPU on $DEVICE, $(date -u +%FT%TZ)" | tee -a "$LOG"
if step probe; then
  P="python -m chipsim.hwreplay.host_cpu --device $DEVICE --pool-gib $POOL --threads $THREADS"
  timeout -k 5 120 $P "$GRANITE" --out "$PROBES/$GPU-host-cpu-expert.json" >> "$LOG" 2>&1
  PROBED=$?
  echo "probe granite-3b: exit $PROBED ($(date -u +%T))" | tee -a "$LOG"
  timeout -k 5 120 $P "$PHI" --shape-config "$PHI" --out "$PROBES/$GPU-host-cpu-expert-phi.json" >> "$LOG" 2>&1
  echo "probe phi-mini-moe (its config's rate written): exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step frontend && [[ $DEVICE == cpu ]]; then
  echo "frontend: skipped (every part times CUDA copies, launches or events)" | tee -a "$LOG"
elif step frontend; then
  timeout -k 5 240 python -m chipsim.hwreplay.host_frontend --threads $THREADS --out "$PROBES/$GPU-host-frontend.json" \
      >> "$LOG" 2>&1
  echo "frontend: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step config; then
  if [[ ${PROBED:-0} != 0 ]]; then
    echo "config: this run's probe failed; the config is left as it is" | tee -a "$LOG"
  elif [[ -f $PROBES/$GPU-host-cpu-expert.json ]]; then
    rewrite --host-cpu "$PROBES/$GPU-host-cpu-expert.json"
    echo "config: exit $? ($(date -u +%T))" | tee -a "$LOG"
    if [[ -f $PROBES/$GPU-host-frontend.json ]]; then
      rewrite --host-frontend "$PROBES/$GPU-host-frontend.json"
      echo "config with host_frontend: exit $? ($(date -u +%T))" | tee -a "$LOG"
    fi
  else
    echo "config: the probe file is missing; the replays plan with the config as it is" | tee -a "$LOG"
  fi
fi
if step host; then
  H="--policy fiddler:slots=170 --policy cg-moe"  # 170 of the buffer's 341 Granite slots; Phi: 68 of 136
  timeout -k 5 200 $R "$GRANITE" $H "${TOKENS[@]}" --out "$OUT/host" >> "$LOG" 2>&1
  echo "host granite-3b: exit $? ($(date -u +%T))" | tee -a "$LOG"
  timeout -k 5 240 $R "$PHI" --policy fiddler:slots=68 --policy cg-moe "${TOKENS[@]}" --out "$OUT/host-phi" >> "$LOG" 2>&1
  echo "host phi-mini-moe: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step frontend-replays; then
  if ! grep -q '^host_frontend:' "$GRANITE"; then
    echo "frontend-replays: $GRANITE has no measured host_frontend block (steps frontend and config first)" | tee -a "$LOG"
  else
    F="--policy no-prefetch --policy promoe"
    for v in "readback:--set host_frontend.routing=host" "pageable:--set host_frontend.expert_memory=pageable" \
        "both:--set host_frontend.routing=host --set host_frontend.expert_memory=pageable"; do
      name=${v%%:*}
      [[ " ${FRONTEND_VARIANTS:-readback pageable both} " == *" $name "* ]] || continue
      timeout -k 5 200 $R "$GRANITE" $F ${v#*:} "${TOKENS[@]}" --out "$OUT/frontend-$name" >> "$LOG" 2>&1
      echo "frontend-replays $name: exit $? ($(date -u +%T))" | tee -a "$LOG"
    done
  fi
fi
if step qkernel; then
  for b in 8 4; do
    timeout -k 5 60 python validation/compute/check_q4.py --bits $b "$GRANITE" > "$OUT/q$b-check.json" 2>> "$LOG"
    echo "q$b kernel check: exit $? ($(date -u +%T))" | tee -a "$LOG"
  done
fi
if step qtimes && [[ $DEVICE == cpu ]]; then
  echo "qtimes: skipped (the decode microbenchmark times CUDA graphs; on a CPU the replays plan with the array model)" \
      | tee -a "$LOG"
elif step qtimes; then
  for b in 8 4; do  # a format whose shapes the config has timed already keeps its file: nothing is written
    timeout -k 5 120 python -m chipsim.hwreplay.microbench --gemv cublas --device $DEVICE --shapes-from "$GRANITE" \
        --set model.expert_bits=$b --contexts 1024 --missing-from "$GRANITE" --out "$OUT/new-op-times-q$b.json" \
        >> "$LOG" 2>&1
    echo "q$b op times: exit $? ($(date -u +%T))" | tee -a "$LOG"
    if python -c "import json, sys; sys.exit(not json.load(open(sys.argv[1]))['op_times'])" "$OUT/new-op-times-q$b.json" \
        2>/dev/null; then
      # new shapes join the file's earlier ones (a config rewritten from the new alone would lose those)
      python -c "import json, os, sys
new, old = sys.argv[1:]
d = json.load(open(new))
if os.path.exists(old):
    keep = json.load(open(old))
    keys = {r['key'] for r in keep['op_times']}
    keep['op_times'] += [r for r in d['op_times'] if r['key'] not in keys]
    d = keep
json.dump(d, open(old, 'w'), indent=1)" "$OUT/new-op-times-q$b.json" "$PROBES/$GPU-op-times-q$b.json"
      rewrite --op-times-extra "$PROBES/$GPU-op-times-q$b.json" && echo "config: q$b shapes added ($(date -u +%T))" \
          | tee -a "$LOG"
    else
      echo "config: no q$b shape missing (or none timed); $PROBES/$GPU-op-times-q$b.json left as it was" | tee -a "$LOG"
    fi
  done
fi
if step quant; then
  # the host issuing raw CUDA runtime calls (165-567 copies a token through PyTorch would pace it), its pace alone
  # timed over 16 tokens on an idle GPU, as the H200's 4-bit regimes
  Q="--segments --stalls --enqueue cudart --dispatch-tokens 16 --policy lru --policy promoe"
  [[ $DEVICE == cuda ]] || Q="--policy lru --policy promoe"  # segments and cudart need graphs
  timeout -k 5 150 $R "$GRANITE" $Q --set model.expert_bits=8 --set expert_buffer.capacity_mib=768 "${TOKENS[@]}" \
      --out "$OUT/q8" >> "$LOG" 2>&1
  echo "q8 granite quarter: exit $? ($(date -u +%T))" | tee -a "$LOG"
  timeout -k 5 150 $R "$GRANITE" $Q --set model.expert_bits=4 --set expert_buffer.capacity_mib=384 "${TOKENS[@]}" \
      --out "$OUT/q4" >> "$LOG" 2>&1
  echo "q4 granite quarter: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if [[ -z "${DRY_RUN:-}" ]]; then  # what came out of the device's copy of the repository, beside the replays
  cp -f $PROBES/$GPU-host-cpu-expert*.json $PROBES/$GPU-host-frontend.json $PROBES/$GPU-op-times-q8.json $PROBES/$GPU-op-times-q4.json "$GRANITE" \
      "$PHI" "$OUT/" 2>/dev/null
fi
