"""Scaling benchmark: samples/s of the same training at 1 and 2 processes (and more where there are devices).

Why it exists: data parallelism only pays when the per-process work outweighs gradient
synchronization. This runs ``train.py`` with ``strategy=auto devices=1`` and with
``strategy=ddp devices=N`` at the same per-process batch, ``--repeats`` times alternating, and
reports the median steady-epoch samples/s (summed over ranks) and the scaling efficiency
(samples/s at N / (N x samples/s at 1)). On a 2-core CPU expect little gain: the point is the
harness. On GPUs, add ``--strategies ddp fsdp`` and ``--recipe vit`` to compare FSDP with DDP
(throughput and peak memory per rank).

    python scripts/bench_scaling.py                       # CPU: tiny CNN, 1 vs 2 processes
    python scripts/bench_scaling.py --recipe vit --devices 1 2 4 8 --strategies ddp fsdp   # a GPU node
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_once(overrides, workdir: Path) -> dict:
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    cmd = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "checkpoint.enabled=false", *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    metrics_path = run_dir / "metrics.json"
    if proc.returncode != 0 or not metrics_path.exists():
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(metrics_path.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="a recipe (default: the tiny CNN)")
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    p.add_argument("--strategies", nargs="+", default=["ddp"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument(
        "--extra",
        nargs="*",
        default=[
            "data.num_samples=4096",
            "data.image_size=32",
            "trainer.max_epochs=3",
            "data.val_samples=0",
            "trainer.limit_val_batches=0",
        ],
    )
    p.add_argument("--out", default=str(ROOT / "scripts" / "results" / "bench_scaling.json"))
    args = p.parse_args(argv)

    base = ([f"+recipe={args.recipe}"] if args.recipe else []) + [f"data.batch_size={args.batch_size}", *args.extra]
    configs = [("auto", 1)] + [(s, n) for s in args.strategies for n in args.devices if n > 1]
    results = {f"{s}x{n}": [] for s, n in configs}
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.repeats):
            for s, n in configs if r % 2 == 0 else list(reversed(configs)):
                m = run_once(base + [f"strategy={s}", f"devices={n}"], Path(work))
                results[f"{s}x{n}"].append(
                    {
                        "samples_per_s": m["samples_per_s"],
                        "peak_memory_mb": m["peak_memory_mb"],
                        "world_size": m["device"]["count"],
                    }
                )
                print(
                    f"repeat {r + 1}: strategy={s} devices={n}: {m['samples_per_s']:.1f} samples/s, peak {m['peak_memory_mb']} MB",
                    flush=True,
                )
    single = statistics.median(x["samples_per_s"] for x in results["autox1"])
    summary = {}
    print("\nconfig        samples/s  efficiency  peak MB/rank")
    for key, runs in results.items():
        sps = statistics.median(x["samples_per_s"] for x in runs)
        world = runs[0]["world_size"]
        eff = sps / (world * single)
        summary[key] = {
            "samples_per_s": sps,
            "efficiency": round(eff, 3),
            "peak_memory_mb": statistics.median(x["peak_memory_mb"] for x in runs),
            "runs": runs,
        }
        print(f"{key:12s} {sps:10.1f} {eff:10.2f} {summary[key]['peak_memory_mb']:12.0f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import platform

    import torch

    out.write_text(
        json.dumps(
            {
                "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                "settings": vars(args),
                "summary": summary,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
