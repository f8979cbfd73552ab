#!/bin/bash
# One trained trace on the lent GPU, in one device command (from the repository root, on a machine with CUDA torch):
#
#     bash traces/train-on-device.sh SHAPE MINUTES OUT [train.py options...]
#
# The text set travels as .data/text-v1.tar.xz (`tar cJf .data/text-v1.tar.xz .data/text-v1` after
# `python -m chipsim.tracegen.textdata --out .data/text-v1`), the wheels the machine lacks (transformers 5.17.0 and
# its dependencies, simpy) as .whl/; both are ignored by git, so the device command carries them
# (carry: [".data/text-v1.tar.xz", ".whl"]). Everything the run writes, its log included, comes back as OUT/SHAPE.tar.
# DRY_RUN=1: the same on the CPU with --tiny (a pipeline check, not a result).
set -uo pipefail
SHAPE=${1:?usage: train-on-device.sh SHAPE MINUTES OUT [options]}
MINUTES=${2:?minutes}
OUT=${3:?out}
shift 3
mkdir -p "$OUT/$SHAPE"
if [ ! -f .data/text-v1/train.npy ]; then
  tar xJf .data/text-v1.tar.xz || { echo "train-on-device: no .data/text-v1 and no .data/text-v1.tar.xz"; exit 2; }
fi
if [ -d .whl ]; then
  pip install -q --no-index --find-links .whl transformers==5.17.0 simpy 2>&1 | grep -v -i warning
fi
EXTRA=()
[ "${DRY_RUN:-0}" = 1 ] && EXTRA=(--tiny --device cpu)
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
      'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" | tee "$OUT/$SHAPE/software.txt"
timeout -k 10 580 python -m chipsim.tracegen.train --shape "$SHAPE" --data .data/text-v1 --out "$OUT/$SHAPE" \
    --minutes "$MINUTES" --seed 0 "${EXTRA[@]}" "$@" 2>&1 | tee "$OUT/$SHAPE/train.log"
rc=${PIPESTATUS[0]}
echo "train: exit $rc" | tee -a "$OUT/$SHAPE/train.log"
tar cf "$OUT/$SHAPE.tar" -C "$OUT" "$SHAPE" && rm -rf "${OUT:?}/$SHAPE"
exit "$rc"
