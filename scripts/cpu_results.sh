#!/usr/bin/env bash
# Re-create the CPU measurements quoted in scripts/results/README.md (a quiet 2-core machine, ~12 min).
# Each sweep's A/B report is copied into scripts/results/<name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=scripts/results
stamp=$(date +%Y%m%d-%H%M%S)
sweep() {  # name, overrides...
  local name=$1; shift
  local dir=multirun/cpu-results-$stamp/$name
  "$py" train.py -m "hydra.sweep.dir=$dir" "$@" > "$dir.log" 2>&1 || true
  mkdir -p "$out/$name"
  cp "$dir"/ab_report.* "$out/$name/"
  echo "== $name"; cat "$out/$name/ab_report.md"
}
mkdir -p multirun/cpu-results-$stamp
# 1. the README's demo sweep
sweep resnet50_smoke_amp_channels_last +recipe=resnet50 scale=smoke amp=false,true channels_last=false,true checkpoint.enabled=false
# 2. the same configuration twice (run-to-run spread vs the spread the report shows)
sweep resnet50_smoke_repeat_a +recipe=resnet50 scale=smoke checkpoint.enabled=false
sweep resnet50_smoke_repeat_b +recipe=resnet50 scale=smoke checkpoint.enabled=false
"$py" -m trainer.report multirun/cpu-results-$stamp/resnet50_smoke_repeat_a multirun/cpu-results-$stamp/resnet50_smoke_repeat_b --out "$out/resnet50_smoke_repeat"
# 3. fit more: activation checkpointing x batch-size search, ViT smoke, a 400 MB step budget
sweep vit_smoke_ac_batch +recipe=vit scale=smoke activation_checkpointing=false,true data.batch_size=32,auto batch_finder.memory_budget_mb=400 batch_finder.max_batch_size=256 checkpoint.enabled=false
# 4. measurement overhead: profiler (outside its active window) and system monitor
sweep resnet50_smoke_profile_monitor +recipe=resnet50 scale=smoke profile=false,true monitor.enabled=false,true monitor.interval_s=1 trainer.max_epochs=5 trainer.limit_train_batches=16 checkpoint.enabled=false
# 5. scaling harness: 1 vs 2 processes (DDP, gloo)
"$py" scripts/bench_scaling.py --out "$out/bench_scaling.json"
