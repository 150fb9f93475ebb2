#!/usr/bin/env bash
# Open a run's profiler traces and scalars in TensorBoard (PyTorch Profiler tab), or print how to
# open them in Perfetto.   Usage: scripts/profile_view.sh RUN_DIR [PORT]
set -euo pipefail
run_dir=${1:?usage: scripts/profile_view.sh RUN_DIR [PORT]}
port=${2:-6006}
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
traces=$(ls "$run_dir"/profiler/*.pt.trace.json 2>/dev/null || true)
if [ -z "$traces" ]; then
  echo "no traces in $run_dir/profiler/ (run with profile=true)" >&2
else
  echo "traces (each also opens in https://ui.perfetto.dev via 'Open trace file', or chrome://tracing):"
  printf '  %s\n' $traces
fi
echo "TensorBoard: http://127.0.0.1:$port  (PYTORCH_PROFILER tab for traces, SCALARS for epoch time, samples/s, system stats)"
exec "$py" -m tensorboard.main --logdir "$run_dir" --host 127.0.0.1 --port "$port"
