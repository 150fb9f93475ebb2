#!/usr/bin/env bash
# Time to accuracy on the built-in real JPEGs: the speed-ups that trade per-epoch cost for epochs,
# beside the baseline, each row with 3 seeds (interleaved: all rows, then the next seed; a seed sweep,
# not repeats=3, because repeats rerun the same seed and would learn identically), into
# scripts/results/time_to_target/.
# The small CNN at 32 px crops (images stored at 160 px), batch 32, 10 epochs, loader in the main
# process (on 2 cores a worker competes with training), target = the baseline's best val_acc - 0.01.
#   scripts/ttt_results.sh        # about 5 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=scripts/results/time_to_target
tmp=$(mktemp -d)
"$PY" train.py -m seed=1,2,3 +bench=none,progressive,decode_scale,batch2x,ema \
  data=builtin data.image_size=32 data.num_workers=0 trainer.max_epochs=10 "hydra.sweep.dir=$tmp/sweep"
mkdir -p "$out"
cp "$tmp/sweep"/ab_report.{md,csv,png} "$out/"
"$PY" - "$tmp/sweep" "$out/machine.json" <<'PY'
import json, sys
sys.path.insert(0, ".")
from trainer.measure.hardware import machine_record
json.dump(machine_record(), open(sys.argv[2], "w"), indent=1)
PY
echo "wrote $out"
