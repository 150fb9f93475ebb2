#!/usr/bin/env bash
# GPU verification suite: one command for a maintainer on any CUDA machine.
#
# Measured on one H100 (torch 2.11, 16 cores, 2026-11-28): the GPU-marked tests 154 s with
# --test-workers 8 (76 tests); a compiled ResNet-50 row at batch 512 pays 55 s of compile cold and 16 s
# for its first validation's evaluation graph (3-4 s each from a warm shared cache); the headline
# 106 s (start-up, pool, cold compile, two epochs); the ceiling about 220 s for two repeats of 40-step
# epochs. Everything at its defaults takes longer than 15 minutes. With a short GPU reservation, run
# it in parts of about 6 minutes each, for example:
#   scripts/gpu_check.sh --recipes resnet50 --test-workers 8 --tables none --headline
#   scripts/gpu_check.sh --recipes resnet50 --skip-tests --tables jpeg --packed --ceiling
#
#   scripts/gpu_check.sh                  # GPU tests, then both recipes' A/B tables -> recipes/<recipe>/RESULTS.md + results.json
#   scripts/gpu_check.sh --dry-run        # the same steps on CPU, tiny model, few steps, into a temp dir (CI runs this)
#
# Options (all optional):
#   --recipes "resnet50 vit"   which recipes to benchmark
#   --tables "synthetic jpeg"  synthetic: images kept on the GPU (the model's ceiling); jpeg: the built-in
#                              real JPEGs at 224 px, end to end; none: neither
#   --skip-tests / --skip-bench
#   --headline                 also the README's first command as written, `train.py +recipe=resnet50 amp=true
#                              compile=true` (two epochs), into <out>/headline: is it compute-bound?
#   --ceiling                  also the trainer against a hand-written loop on the same device-resident work
#                              (scripts/bench_ceiling.py: ResNet-50, bf16, channels_last, compile, fused SGD, batch
#                              256, 40- and 120-step epochs: its cost per step and per epoch; target 1.00x), into
#                              <out>/ceiling.json and scripts/results/bench_ceiling.json
#   --overhead                 also the trainer against a plain PyTorch loop where the host is the limit
#                              (scripts/bench_overhead.py: ResNet-18, 32 px, batch 256, 3 repeats; target 5%)
#   --overlap                  also nvJPEG beside a stand-in step, decoded five ways (in the step's thread, in
#                              a thread K batches per call, in a process of its own, in a thread through
#                              nvImageCodec): can the decode overlap the step? (scripts/bench_nvjpeg_overlap.py,
#                              into <out>/overlap.json and scripts/results/bench_nvjpeg_overlap.json)
#   --packed                   the jpeg table also trains its all-on row from the same images packed
#                              (python -m trainer.pack, uint8 at 224 px: no decode at all)
#   --test-workers N           run the GPU-marked tests in N pytest-xdist processes sharing the GPU
#                              (default 1: one at a time; the tests check behaviour, not speed)
#   --out DIR                  where sweeps and the log go (default runs/gpu_check/<date>); RESULTS.md and
#                              results.json go to recipes/<recipe>/ (under DIR with --dry-run)
#   --steps N                  training steps per epoch on synthetic data (default 20)
#   --jpeg-images N            training images of the JPEG table's set (default 30720: 60 batches of 512), trained
#                              in whole epochs; its validation set is a quarter of that
#   --baseline-steps N         the all-off JPEG baseline's steps per epoch (default 20 of 256: it runs about 400
#                              images/s, so a whole epoch would take minutes)
#   --synthetic-rows A,B / --jpeg-rows A,B   which bench rows each table runs (default: all of them,
#                              below); a shorter list when GPU time is scarce
#
# Steps, each timed in the log ($OUT/gpu_check.log):
# 1. the GPU-marked tests (`pytest -m gpu`: the GPU paths, and tests/gpu/test_sync_free.py, every bench
#    row of both recipes with torch's sync debug mode set to error on the steady steps). A failing test
#    is reported (and recorded in results.json) and the tables still run.
# 2. per recipe, one sweep per table, `python train.py -m +recipe=R +bench=ROW,ROW,...`, job after job
#    in one process (never parallel: timings must not compete); rows are configs/bench/*.yaml. Three
#    epochs per row: the first is warm-up. The JPEG table is its all-on rows (`all_turbo`: libjpeg-turbo
#    in the loader workers; `all`: nvJPEG on the GPU; `dali` where installed; `all_nvimgcodec`: nvJPEG
#    through nvImageCodec, where it is installed and CUDA is there) in whole epochs, beside
#    the all-off baseline (sweep jpeg_baseline, a step limit), the same all-on row from the packed
#    images (jpeg_packed, with --packed) and on device-resident synthetic images at the same batch
#    (jpeg_synthetic: what the model does when the input costs nothing). The compiled JPEG rows share
#    one compile cache (compile_cache=shared): their compile times are a warm cache's.
# 3. scripts/gpu_results.py writes each recipe's RESULTS.md and results.json, then prints a summary.
# Environment: PYTHON (default .venv/bin/python if present, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0 RUN_TESTS=1 RUN_BENCH=1
RECIPES="resnet50 vit" TABLES="synthetic jpeg" STEPS=20 JPEG_IMAGES=30720 BASELINE_STEPS=20 OUT=""
SYNTHETIC_ROWS_ARG="" JPEG_ROWS_ARG="" TEST_WORKERS=1 RUN_OVERHEAD=0 RUN_HEADLINE=0 RUN_CEILING=0 PACKED=0 RUN_OVERLAP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --skip-tests) RUN_TESTS=0 ;;
    --skip-bench) RUN_BENCH=0 ;;
    --recipes) RECIPES="$2"; shift ;;
    --tables) TABLES="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --jpeg-images) JPEG_IMAGES="$2"; shift ;;
    --baseline-steps) BASELINE_STEPS="$2"; shift ;;
    --headline) RUN_HEADLINE=1 ;;
    --ceiling) RUN_CEILING=1 ;;
    --packed) PACKED=1 ;;
    --overlap) RUN_OVERLAP=1 ;;
    --synthetic-rows) SYNTHETIC_ROWS_ARG="$2"; shift ;;
    --jpeg-rows) JPEG_ROWS_ARG="$2"; shift ;;
    --test-workers) TEST_WORKERS="$2"; shift ;;
    --overhead) RUN_OVERHEAD=1 ;;
    --out) OUT="$2"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 0 ;;  # the comment block above
    *) echo "gpu_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

if [ "$DRY_RUN" = 0 ] && ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check.sh: no CUDA GPU visible to torch here. Run it on a CUDA machine, or use --dry-run to check the suite on CPU." >&2
  exit 2
fi
if [ -z "$OUT" ]; then
  if [ "$DRY_RUN" = 1 ]; then OUT=$(mktemp -d -t gpu_check_dry.XXXXXX); else OUT="runs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)"; fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/gpu_check.log") 2>&1  # everything below also goes to the log
START=$SECONDS
stage() { echo "== [$((SECONDS - START)) s] $*"; }

TESTS_XML="$OUT/gpu_tests.xml"
if [ "$RUN_TESTS" = 1 ]; then
  stage "GPU-marked tests"
  # without CUDA (dry run) every test is skipped: this checks that they are collected and import
  XDIST=()
  if [ "$TEST_WORKERS" -gt 1 ]; then XDIST=(-n "$TEST_WORKERS"); fi
  "$PYTHON" -m pytest -m gpu -q -rs "${XDIST[@]}" --junitxml="$TESTS_XML" tests/gpu tests/test_readme.py \
    || echo "note: GPU tests failed (see above and $TESTS_XML); going on with the tables"
fi
if [ "$RUN_BENCH" = 0 ]; then
  stage "done (tests only)"
  exit 0
fi

# rows per table: one flag at a time against the all-off baseline, then everything
SYNTHETIC_ROWS="baseline,amp,channels_last,compile,tf32,big_batch,all"
JPEG_ROWS="all_turbo,all"
# NVIDIA DALI's row where it is installed (an optional extra: pip install 'trainer-switchboard[dali]')
if "$PYTHON" -c 'import nvidia.dali' >/dev/null 2>&1; then
  JPEG_ROWS="all_turbo,all,dali"
else
  echo "note: NVIDIA DALI is not installed here: the jpeg table has no dali row (pip install 'trainer-switchboard[dali]')"
fi
# nvJPEG through nvImageCodec (data.nvjpeg_library=nvimgcodec) where it is installed and decodes on the GPU
# (nvJPEG loads); not in a dry run: without CUDA the row decodes on the CPU as the all row does
if [ "$DRY_RUN" = 0 ]; then
  if "$PYTHON" -c 'import torch; from trainer.data.nvimgcodec_decode import BatchDecoder as B; B().prepare(torch.device("cuda", 0))' >/dev/null 2>&1; then
    JPEG_ROWS="$JPEG_ROWS,all_nvimgcodec"
  else
    echo "note: nvImageCodec does not decode on this GPU: the jpeg table has no all_nvimgcodec row (pip install 'trainer-switchboard[nvimgcodec]')"
  fi
fi
if [ -n "$SYNTHETIC_ROWS_ARG" ]; then SYNTHETIC_ROWS=$SYNTHETIC_ROWS_ARG; fi
if [ -n "$JPEG_ROWS_ARG" ]; then JPEG_ROWS=$JPEG_ROWS_ARG; fi
# The JPEG table trains whole epochs of a set of --jpeg-images training images (generated once per
# machine, one process per core), validating on all of its quarter as many, with the batch finder
# capped at 512. Whole epochs, not a step limit: an H100 run with 8 steps of 3,000 images measured
# mostly each epoch's first batch. The all-off baseline alone runs a step limit (no loader workers,
# so nothing is built past it).
EPOCHS=3 SIZE=224 STORED=256 PER_CLASS=$((JPEG_IMAGES / 10)) MAX_BATCH=512 DRY=() JPEG_LIMITS=() BASE_VAL=5
HEADLINE=("+recipe=resnet50" amp=true compile=true trainer.max_epochs=2)
CEILING=(--device cuda --repeats 1 --long-batches 120)  # 40- and 120-step epochs: per step, or per epoch?
if [ "$DRY_RUN" = 1 ]; then
  # the same sweeps, shrunk to a CPU: a tiny CNN on 32 px images, at most 3 steps per epoch, 2
  # epochs. The recipe's batch size stays (a command-line batch size would beat the bench rows'
  # data.batch_size=auto), so the data sets are made just large enough for it. The compile rows
  # capture their graphs with the aot_eager backend: a rehearsal's compile times mean nothing, and
  # Inductor's code generation on a CPU is what takes the time (it is tested in the suite itself).
  EPOCHS=2 SIZE=32 STORED=40 PER_CLASS=40 MAX_BATCH=16 STEPS=3 BASELINE_STEPS=3 BASE_VAL=2
  JPEG_LIMITS=(trainer.limit_train_batches=3 trainer.limit_val_batches=2)
  DRY=(accelerator=cpu model=tiny data.num_samples=768 data.val_samples=256 compile_backend=aot_eager)
  HEADLINE+=(scale=smoke "${DRY[@]}" trainer.limit_val_batches=2)
  CEILING=(--device cpu --model resnet18 --image-size 32 --batch-size 8 --batches 3 --epochs 2 --repeats 1 --backend aot_eager)
fi
COMMON=("trainer.max_epochs=$EPOCHS" checkpoint.enabled=false)
SYNTHETIC=(data.device_resident=true "data.image_size=$SIZE" "trainer.limit_train_batches=$STEPS" trainer.limit_val_batches=2)
BUILTIN=(data=builtin "data.image_size=$SIZE" "data.stored_size=$STORED" "data.images_per_class=$PER_CLASS")
JPEG=("${BUILTIN[@]}" "batch_finder.max_batch_size=$MAX_BATCH" compile_cache=shared "${JPEG_LIMITS[@]}")
JPEG_BASELINE=("${BUILTIN[@]}" "trainer.limit_train_batches=$BASELINE_STEPS" "trainer.limit_val_batches=$BASE_VAL")
# device-resident synthetic images, as many as the JPEG set's, at the same batch cap and flags
JPEG_SYNTHETIC=("data.num_samples=$((PER_CLASS * 10))" "data.val_samples=$((PER_CLASS * 10 / 4))" "data.image_size=$SIZE"
                "batch_finder.max_batch_size=$MAX_BATCH" compile_cache=shared "${JPEG_LIMITS[@]}")
# the compiled rows of the JPEG table share one compile cache, apart from any other on this machine
export TORCHINDUCTOR_CACHE_DIR="$OUT/inductor_cache"

sweep() {  # sweep RECIPE TABLE ROWS ARGS...: one train.py sweep into $OUT/RECIPE/TABLE
  local recipe=$1 table=$2 rows=$3
  shift 3
  local dir="$OUT/$recipe/$table"
  local cmd=("$PYTHON" train.py -m "+recipe=$recipe" "+bench=$rows" "${COMMON[@]}" "$@" "${DRY[@]}" "hydra.sweep.dir=$dir")
  stage "$recipe / $table: ${cmd[*]}"
  mkdir -p "$dir"
  printf '%q ' "${cmd[@]}" | sed 's/ $//' > "$dir/command.txt"
  # a failed row keeps its place in the report (status failed); the sweep's exit status says so
  "${cmd[@]}" || echo "note: a row of $recipe/$table failed; see its row in $dir/ab_report.md"
  sweeps+=("$dir")
}

status=0
results=()
page() {  # page RECIPE ARGS...: the recipe's RESULTS.md and results.json from this run
  local recipe=$1 dest="recipes/$1" flag=()
  shift
  if [ "$DRY_RUN" = 1 ]; then dest="$OUT/$recipe"; flag=(--dry-run); fi
  stage "$recipe: RESULTS.md and results.json"
  if "$PYTHON" scripts/gpu_results.py --recipe "$recipe" "$@" --out "$dest" --tests "$TESTS_XML" "${flag[@]}"; then
    results+=("$dest/results.json")
  else
    status=1  # its page was not written: the summary does not read the one left from before
  fi
}
RESNET50_SWEEPS=()
for recipe in $RECIPES; do
  sweeps=()
  for table in $TABLES; do
    case "$table" in
      none) ;;
      synthetic) sweep "$recipe" synthetic "$SYNTHETIC_ROWS" "${SYNTHETIC[@]}" ;;
      jpeg)
        sweep "$recipe" jpeg "$JPEG_ROWS" "${JPEG[@]}"
        sweep "$recipe" jpeg_baseline baseline "${JPEG_BASELINE[@]}"
        if [ "$PACKED" = 1 ]; then
          packed="$OUT/packed-$PER_CLASS"
          if [ ! -f "$packed/train/meta.json" ]; then
            root=$("$PYTHON" -c "from trainer.data.builtin import ensure_builtin as e; print(e(None, $PER_CLASS, $STORED))")
            stage "packing $root at $SIZE px into $packed"
            "$PYTHON" -m trainer.pack "$root" "$packed" --size "$SIZE" || echo "note: packing failed"
          fi
          sweep "$recipe" jpeg_packed all data=packed "data.root=$packed" "batch_finder.max_batch_size=$MAX_BATCH" \
            compile_cache=shared "${JPEG_LIMITS[@]}"
        fi
        sweep "$recipe" jpeg_synthetic all "${JPEG_SYNTHETIC[@]}"
        ;;
      *) echo "gpu_check.sh: unknown table '$table' (synthetic, jpeg, none)" >&2; exit 2 ;;
    esac
  done
  if [ "$recipe" = resnet50 ] && [ $((RUN_HEADLINE + RUN_CEILING)) -gt 0 ]; then
    RESNET50_SWEEPS=("${sweeps[@]}")  # its page is written after the headline and the ceiling, with them
  elif [ "${#sweeps[@]}" -gt 0 ]; then
    page "$recipe" --sweeps "${sweeps[@]}"
  fi
done
extra=()
if [ "$RUN_HEADLINE" = 1 ]; then
  # the README's first command as written (two epochs): synthetic images gathered on the device, so
  # the GPU should compute all the time (its own compile cache, as every job gets by default)
  stage "headline: python train.py ${HEADLINE[*]}"
  "$PYTHON" train.py "${HEADLINE[@]}" "hydra.run.dir=$OUT/headline" || { echo "note: the headline run failed"; status=1; }
  extra+=(--headline "$OUT/headline/metrics.json")
fi
benchmark() {  # benchmark NAME WHAT SCRIPT KEPT_AS ARGS...: a scripts/ benchmark into $OUT/NAME.json, kept in scripts/results/
  local name=$1 what=$2 script=$3 kept=$4
  shift 4
  stage "$name: $what ($script $*)"
  if "$PYTHON" "$script" "$@" --out "$OUT/$name.json"; then
    extra+=("--$name" "$OUT/$name.json")
    if [ "$DRY_RUN" = 0 ]; then cp "$OUT/$name.json" "scripts/results/$kept"; fi
  else
    echo "note: the $name benchmark failed (see above)"; status=1
  fi
}
if [ "$RUN_CEILING" = 1 ]; then
  benchmark ceiling "the trainer against a hand-written loop" scripts/bench_ceiling.py bench_ceiling.json "${CEILING[@]}"
fi
if [ "$RUN_OVERLAP" = 1 ]; then
  oargs=()
  if [ "$DRY_RUN" = 1 ]; then oargs=(--device cpu --batch 8 --steps 3 --step-ms 5 --ways compute,serial,thread-2,nvimgcodec-2); fi
  benchmark overlap "where the nvJPEG decode can overlap the step" scripts/bench_nvjpeg_overlap.py bench_nvjpeg_overlap.json "${oargs[@]}"
fi
if [ "$RUN_OVERHEAD" = 1 ]; then
  # the host-bound regime the framework's per-step Python shows in; a dry run checks the plumbing on a CPU
  oargs=(--device cuda --batch-size 256 --batches 400 --repeats 3)
  if [ "$DRY_RUN" = 1 ]; then oargs=(--device cpu --batch-size 8 --batches 3 --repeats 1 --short-epochs 1 --long-epochs 2); fi
  benchmark overhead "the trainer against a plain loop" scripts/bench_overhead.py bench_overhead_gpu.json "${oargs[@]}"
fi
if [ $((RUN_HEADLINE + RUN_CEILING)) -gt 0 ] && [[ " $RECIPES " == *" resnet50 "* ]]; then
  # resnet50's page with the headline and the ceiling beside its tables (the parts this run did not
  # measure are kept from the page before, each headed with the run that measured it)
  checks=()
  if [ "$RUN_HEADLINE" = 1 ]; then checks+=(--headline "$OUT/headline/metrics.json"); fi
  if [ "$RUN_CEILING" = 1 ]; then checks+=(--ceiling "$OUT/ceiling.json"); fi
  if [ "${#RESNET50_SWEEPS[@]}" -gt 0 ]; then checks+=(--sweeps "${RESNET50_SWEEPS[@]}"); fi
  page resnet50 "${checks[@]}"
fi
stage "summary"
"$PYTHON" scripts/gpu_results.py --summary "${results[@]}" --tests "$TESTS_XML" "${extra[@]}" || status=1
stage "done: sweeps and the log in $OUT"
exit $status
