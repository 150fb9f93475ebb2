"""What a step limit costs with persistent loader workers, per batch.

An epoch cut short by ``trainer.limit_train_batches`` against a whole epoch of as many batches, same
model, batch and workers.

The tuner's probes and ``scale=smoke`` train short epochs under a step limit. If the loader's workers
built batches past the limit, the next epoch would wait for them to be drained and a limited epoch
would cost more per batch than a whole one; the two should cost the same. Runs the two configurations
interleaved (``--repeats``, default 3), ``--epochs`` each (the first is warm-up, the per-run epoch time
is the median of the rest, as the report's), and writes each run's epoch time and the ratio of the
medians to ``--out`` (JSON) and stdout.

    python scripts/bench_step_limit.py --workers 2 --out scripts/results/step_limit.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batches", type=int, default=8, help="training batches per epoch in both configurations")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    per_class = a.batches * a.batch_size // 10  # data=builtin: 10 classes
    common = [
        "data=builtin",
        "model=tiny",
        "data.image_size=64",
        f"data.batch_size={a.batch_size}",
        f"data.num_workers={a.workers}",
        "data.persistent_workers=true",
        "trainer.limit_val_batches=0",
        f"trainer.max_epochs={a.epochs}",
        "checkpoint.enabled=false",
    ]
    rows = {
        # a set four times larger, its epochs cut at --batches
        "step_limit": [f"data.images_per_class={4 * per_class}", f"trainer.limit_train_batches={a.batches}"],
        "whole_epoch": [f"data.images_per_class={per_class}"],
    }
    times = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for name, extra in rows.items():
                run_dir = Path(tmp) / f"{name}-{r}"
                subprocess.run(
                    [sys.executable, str(ROOT / "train.py"), *common, *extra, f"hydra.run.dir={run_dir}"],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                )
                metrics = json.loads((run_dir / "metrics.json").read_text())
                times[name].append(metrics["epoch_time_s"])
    from trainer.measure.hardware import cpu_kind

    result = {
        "what": __doc__.splitlines()[0],
        "cpu_kind": cpu_kind(),
        "settings": vars(a) | {"out": str(a.out) if a.out else None},
        "epoch_time_s": times,
        "median_epoch_time_s": {name: statistics.median(t) for name, t in times.items()},
    }
    result["step_limit_over_whole_epoch"] = round(
        result["median_epoch_time_s"]["step_limit"] / result["median_epoch_time_s"]["whole_epoch"], 3
    )
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
