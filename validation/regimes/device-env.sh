# Sourced by the measure-*.sh scripts after LOG is set: the device's Python as the replays need it (simpy from the
# carried wheel in .whl/ when the device has none; the repository on PYTHONPATH), and a line in the log if pynvml is
# missing (the replays then read no energy).
if ! python -c "import simpy" 2>/dev/null; then  # the device has no simpy: the carried wheel
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python -c "import pynvml" 2>/dev/null || echo "no pynvml (nvidia-ml-py): the replays read no energy" | tee -a "$LOG"
