# Sourced by the measure-*.sh scripts with OUT (the output folder) and GPU_DEFAULT (the card GPU names unless set) set:
# OUT made and absolute, its log OUT/measure.log (LOG); the device's Python as the replays need it (simpy from the
# carried wheel in .whl/ when the device has none; the repository on PYTHONPATH), and a line in the log if pynvml is
# missing (the replays then read no energy); GPU, the configs' folder (CFG) and the probe files' (PROBES); on a device
# (no DRY_RUN) the card checked to be GPU's, or exit 3.
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/measure.log"
if ! python -c "import simpy" 2>/dev/null; then  # the device has no simpy: the carried wheel
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python -c "import pynvml" 2>/dev/null || echo "no pynvml (nvidia-ml-py): the replays read no energy" | tee -a "$LOG"
# require_card: the card nvidia-smi names is the one GPU names (chipsim.hwreplay.gpuconfig.GPUS), or a line and false,
# so no script writes one GPU's timings under another's name
require_card() {
  local card slug
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  slug=$(python -c "import sys; from chipsim.hwreplay.gpuconfig import GPUS; f = GPUS.get(sys.argv[1]); print(f.slug if f else '')" "$card")
  if [[ "$slug" != "$GPU" ]]; then
    echo "the card is '${card:-none}' (slug '${slug:-none}'), not GPU=$GPU: nothing measured" | tee -a "$LOG"
    return 1
  fi
}
# probes_dir: where GPU's probe files go unless PROBES says (the H200's came first, into validation/compute)
probes_dir() { if [[ $GPU == h200 ]]; then echo validation/compute; else echo "validation/$GPU"; fi; }
GPU=${GPU:-$GPU_DEFAULT}          # the lent GPU: its configs are hwconfigs/$GPU-pcie5*.yaml
CFG=hwconfigs                     # the configs the steps read and the config steps write
[[ -n "${DRY_RUN:-}" ]] || require_card || exit 3
PROBES=${PROBES:-$(probes_dir)}   # where the probe files go
# dry_run_configs FILE...: a CPU dry run reads and writes copies of these hwconfigs/ files in OUT/hwconfigs, and its
# probe files go to OUT, so that nothing in the repository changes
dry_run_configs() {
  CFG=$OUT/hwconfigs
  PROBES=$OUT
  mkdir -p "$CFG"
  local f
  for f in "$@"; do cp "hwconfigs/$f" "$CFG/"; done
  ln -sfn "$PWD/traces" "$OUT/traces"  # the configs' ../traces/
}
