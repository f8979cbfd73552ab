#!/bin/bash
# A lent Hopper GPU's config from single-op probes alone, in one device command from the repository root with the
# device's own torch (CUDA) and nvidia-ml-py; simpy comes from .whl/ when the device lacks it:
#
#     GPU=h100 PROBES=validation/h100 bash validation/calibrate-gpu.sh OUT [STEPS]   (default: all five, in order)
#
# GPU is the slug chipsim.hwreplay.gpuconfig.GPUS gives the card nvidia-smi names (h200, h100): the script stops
# (exit 3) on any other card, so a config is never written under another GPU's name. In this order, each with its
# own time limit and its output in OUT/calibrate.log:
#   energy   the board's energy table (validation/energy/probe_energy.py: idle, copies, tiny kernels, GEMVs, a
#            GEMM), first, while the board is at its resting temperature          -> PROBES/$GPU-energy-probe.json
#            and the GEMM paced below the power cap, at the full SM clock, whose MAC the table takes
#            (validation/energy/probe_gemm_clock.py)                              -> PROBES/$GPU-gemm-clock.json
#   micro    copies, the GEMV fit, tiny kernels, graph launches and every decode-step kernel shape of the models
#            the regimes replay whose decode the harness can run, Granite-3B and Phi-mini-MoE (gpt-oss-20b has
#            sliding-window layers: its prefill shapes are timed by measure-prefill.sh), at contexts 512-2,048
#            (chipsim.hwreplay.microbench; the shapes are the models', the H200 configs only name them)
#                                                                                  -> PROBES/$GPU-microbench.json
#   handoff  the copy/compute hand-off (validation/compute/probe_handoff.py)      -> PROBES/$GPU-handoff.json
#   gaps     a CUDA graph launched after another (validation/compute/probe_launch_gaps.py) -> PROBES/$GPU-launch-gaps.json
#   config   hwconfigs/$GPU-pcie5.yaml (python -m chipsim.hwreplay.gpuconfig; the command is in its header)
# The files are copied to OUT too. Nothing here runs a model end to end, so no number can be fitted to one; the
# per-kernel energy table (validation/energy/probe_op_energy.py) is not measured here: every kernel's energy comes
# from the per-action table the energy probe gives. Afterwards the regimes' scripts run with the same GPU and
# PROBES (validation/regimes/measure-{prefill,batch,served}.sh).
set -uo pipefail
OUT=${1:?usage: GPU=h100 PROBES=DIR calibrate-gpu.sh OUT [energy] [micro] [handoff] [gaps] [config]}
shift
WHAT=" ${*:-energy micro handoff gaps config} "
for s in $WHAT; do
  [[ " energy micro handoff gaps config " == *" $s "* ]] || { echo "calibrate: unknown step '$s'"; exit 2; }
done
step() { [[ "$WHAT" == *" $1 "* ]]; }
GPU=${GPU:?set GPU to the card slug, e.g. h100}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/calibrate.log"
source validation/regimes/device-env.sh  # simpy, PYTHONPATH, pynvml, require_card
require_card || exit 3
PROBES=${PROBES:-$(probes_dir)}
mkdir -p "$PROBES"
echo "calibrate: $GPU, $(date -u +%FT%TZ)" | tee -a "$LOG"
DECODE="hwconfigs/h200-pcie5.yaml hwconfigs/h200-pcie5-phi-mini-moe.yaml"
if step energy; then
  timeout -k 5 200 python validation/energy/probe_energy.py > "$PROBES/$GPU-energy-probe.json" 2>> "$LOG"
  echo "energy: exit $? ($(date -u +%T))" | tee -a "$LOG"
  timeout -k 5 60 python validation/energy/probe_gemm_clock.py > "$PROBES/$GPU-gemm-clock.json" 2>> "$LOG"
  echo "gemm clock: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step micro; then
  timeout -k 5 150 python -m chipsim.hwreplay.microbench --out "$PROBES/$GPU-microbench.json" --shapes-from $DECODE >> "$LOG" 2>&1
  echo "micro: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step handoff; then
  timeout -k 5 60 python validation/compute/probe_handoff.py > "$PROBES/$GPU-handoff.json" 2>> "$LOG"
  echo "handoff: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
if step gaps; then
  timeout -k 5 90 python validation/compute/probe_launch_gaps.py > "$PROBES/$GPU-launch-gaps.json" 2>> "$LOG"
  echo "gaps: exit $? ($(date -u +%T))" | tee -a "$LOG"
fi
step config || exit 0
ARGS=(--out "hwconfigs/$GPU-pcie5.yaml" --kernel-launch graph)
whole() { python -c "import json, sys; json.load(open(sys.argv[1]))" "$1" 2>/dev/null; }  # a file that came out whole
for name in energy-probe handoff launch-gaps; do
  whole "$PROBES/$GPU-$name.json" && ARGS+=("--$name" "$PROBES/$GPU-$name.json")
done
if whole "$PROBES/$GPU-energy-probe.json" && whole "$PROBES/$GPU-gemm-clock.json"; then  # the MAC at the full clock
  ARGS+=(--gemm-clock "$PROBES/$GPU-gemm-clock.json")
fi
python -m chipsim.hwreplay.gpuconfig "$PROBES/$GPU-microbench.json" "${ARGS[@]}" >> "$LOG" 2>&1
status=$?
echo "config: exit $status ($(date -u +%T))" | tee -a "$LOG"
cp -f "$PROBES/$GPU"-*.json "hwconfigs/$GPU-pcie5.yaml" "$OUT/" 2>/dev/null
exit $status
