#!/usr/bin/env bash
# Where an epoch's time goes on the built-in real JPEGs: data wait (blocked in the loader), transfer
# (batch to device + device-side prep) and the rest, for 0 vs 1 loader workers and pinned vs
# pageable memory, each configuration run twice (repeats=2, interleaved). CPU, about 3 minutes on
# 2 cores; the table lands in scripts/results/data_wait_split/ (on a CPU pin_memory has no device to
# pin for, so its rows measure the flag's cost only: run it on a GPU machine for the real split).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
sweep=multirun/data-wait-split-$(date +%Y%m%d-%H%M%S)
out=${OUT:-scripts/results/data_wait_split}
mkdir -p multirun
"$py" train.py -m hydra.sweep.dir="$sweep" data=builtin data.image_size=64 data.batch_size=32 model.width=16 \
  trainer.max_epochs=4 trainer.limit_val_batches=4 checkpoint.enabled=false \
  data.num_workers=0,1 data.pin_memory=false,true repeats=2 "$@" > "$sweep.log" 2>&1
"$py" -m trainer.report "$sweep" --out "$out"
"$py" - "$out" "$sweep" <<'PY'
import json, pathlib, platform, sys
out, sweep = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for m in sorted(sweep.rglob("metrics.json")):
    r = json.loads(m.read_text())
    steady = [e for e in r["epochs"] if not e["warmup"] and not e.get("partial")]
    t = sum(e["time_s"] for e in steady)
    rows.append({
        "job": m.parent.name, "num_workers": r["flags"]["data.num_workers"], "pin_memory": "data.pin_memory=true" in [o.lower() for o in r["overrides"]],
        "epoch_time_s": r["epoch_time_s"], "data_wait_fraction": r["data_wait_fraction"], "transfer_fraction": r["transfer_fraction"],
        "rest_fraction": round(1 - (sum(e["data_wait_s"] + e["transfer_s"] for e in steady) / t), 4) if t else None,
        "bottleneck": (r.get("diagnosis") or {}).get("bottleneck"),
    })
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
(out / "split.json").write_text(json.dumps({"machine": {"cpu": cpu, "cores": __import__("os").cpu_count()}, "jobs": rows}, indent=2) + "\n")
for r in rows:
    print(r)
PY
