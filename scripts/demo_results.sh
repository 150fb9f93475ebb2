#!/usr/bin/env bash
# The README's demo sweep, measured on this machine as it is and with its CPU limited to AVX2 (what
# an AVX2-only laptop or cloud VM runs: oneDNN and ATen kernels capped at AVX2, and the trainer told
# the CPU has no AVX512-BF16/AMX), into scripts/results/demo/{native,avx2}/. Do not use this
# limitation for runs that compile: torch.compile'd models trained under ONEDNN_MAX_CPU_ISA below
# the CPU's own ISA were seen to get a NaN loss at the first step or abort with a double free (the
# demo does not compile). Kernels Inductor compiled and cached under the capped ISA were also seen
# reused, and crashing, by later uncapped runs: give such a run its own TORCHINDUCTOR_CACHE_DIR.
#   scripts/demo_results.sh        # about 1.5 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEMO=(train.py -m data=builtin data.image_size=32 trainer.max_epochs=6 data.decoder=pil,turbo channels_last=false,true)
out=scripts/results/demo
tmp=$(mktemp -d)
"$PY" "${DEMO[@]}" "hydra.sweep.dir=$tmp/native"
ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 TRAINER_CPU_FLAGS="fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c" \
  "$PY" "${DEMO[@]}" "hydra.sweep.dir=$tmp/avx2"
for kind in native avx2; do
  mkdir -p "$out/$kind"
  cp "$tmp/$kind"/ab_report.{md,csv,png} "$out/$kind/"
done
echo "wrote $out/native and $out/avx2"
