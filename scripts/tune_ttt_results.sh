#!/usr/bin/env bash
# The tuner judged by time to accuracy on the built-in real JPEGs: python -m trainer.tune with
# tune.objective=time_to_target on the small CNN at 32 px (the setting of scripts/ttt_results.sh:
# loader in the main process, the baseline's 10 epochs set the target, its best val_acc - 0.01),
# candidates decode_scale, channels_last, progressive_resize and ema; into
# scripts/results/tune_time_to_target/ (tune_report.md/.csv/.png, best.yaml, machine.json).
#   scripts/tune_ttt_results.sh        # about 4 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=scripts/results/tune_time_to_target
tmp=$(mktemp -d)
"$PY" -m trainer.tune data=builtin data.image_size=32 data.num_workers=0 tune.verify_epochs=10 \
  tune.objective=time_to_target "tune.only=[decode_scale,channels_last,progressive_resize,ema]" "hydra.run.dir=$tmp/tune"
mkdir -p "$out"
cp "$tmp/tune"/tune_report.{md,csv,png} "$tmp/tune/best.yaml" "$out/"
"$PY" - "$out/machine.json" <<'PY'
import json, sys
sys.path.insert(0, ".")
from trainer.measure.hardware import machine_record
json.dump(machine_record(), open(sys.argv[1], "w"), indent=1)
PY
echo "wrote $out"
