#!/usr/bin/env bash
# The input-pipeline A/B on the built-in real-JPEG data (CPU, ~4 min): loader workers, decoders,
# in-memory cache and the packed format, one table in scripts/results/builtin_pipeline/.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
base=multirun/data-results-$(date +%Y%m%d-%H%M%S)
mkdir -p "$base"
common=(data=builtin data.image_size=64 data.batch_size=32 model.width=16 trainer.max_epochs=3 trainer.limit_val_batches=4 checkpoint.enabled=false)
"$py" train.py -m hydra.sweep.dir=$base/workers_decoder "${common[@]}" data.num_workers=0,1 data.decoder=pil,torchvision,turbo > $base.workers.log 2>&1 || true
"$py" train.py -m hydra.sweep.dir=$base/cache "${common[@]}" data.num_workers=1 data.persistent_workers=true data.decoder=turbo data.cache_in_memory=true > $base.cache.log 2>&1 || true
root=$("$py" -c "from trainer.data.builtin import ensure_builtin; print(ensure_builtin(None, 100, 160))")
rm -rf "$base/packed-data"
"$py" -m trainer.pack "$root" "$base/packed-data" --size 72  # train/ and val/ keep their split
"$py" train.py -m hydra.sweep.dir=$base/packed data=packed data.root=$base/packed-data data.image_size=64 data.batch_size=32 model.width=16 trainer.max_epochs=3 trainer.limit_val_batches=4 checkpoint.enabled=false data.num_workers=0,1 > $base.packed.log 2>&1 || true
"$py" -m trainer.report $base/workers_decoder $base/cache $base/packed --out scripts/results/builtin_pipeline
