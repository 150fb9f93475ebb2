"""Write a recipe's RESULTS.md from the benchmark sweeps that scripts/gpu_check.sh ran.

    python scripts/gpu_results.py --recipe resnet50 --sweeps OUT/resnet50/synthetic OUT/resnet50/jpeg --out recipes/resnet50

Each sweep dir is a `train.py -m ... +bench=ROW,...` sweep (its A/B report already written by the
sweep) with a `command.txt` holding the exact command. RESULTS.md gets: where it ran (device,
driver, torch, CUDA, Lightning, date, commit), one compact table per sweep (the `bench` row, batch,
epoch time, samples/s, speedup over the all-off baseline, data-wait share, peak memory, val_acc
and the doctor's verdict), the headline numbers against the issue's targets, the commands, and the
chart of each sweep copied beside it as `<sweep>.png`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer import report  # noqa: E402

# what each sweep name measures (gpu_check.sh's tables)
TABLES = {
    "synthetic": "Synthetic {size} px images kept on the device (`data.device_resident=true`): no input pipeline at all, the model's ceiling.",
    "jpeg": "The built-in real JPEGs at {size} px (`data=builtin`), decoded and augmented every step: the honest end-to-end number.",
}
# published anchors and our aims (issue 8)
TARGETS = {
    "resnet50": {"synthetic_samples_per_s": 4000, "jpeg_speedup": 10.0},
    "vit": {"jpeg_speedup": 10.0},
}
ANCHORS = (
    "Published anchors: ResNet-50 training on one A100 runs at about 938 img/s in TF32 and 2,470 img/s with AMP "
    "(NVIDIA DeepLearningExamples); torch.compile's published training speed-up on A100 is about 1.43x "
    "(geometric mean over 163 models)."
)
COLUMNS = ["bench", "batch", "epoch_time_s", "samples_per_s", "speedup", "data_wait_fraction", "peak_memory_mb", "val_acc", "bottleneck", "status", "notes"]


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "none (no NVIDIA driver on this machine)"


def environment(jobs: List[report.Job]) -> Dict[str, str]:
    import pytorch_lightning as pl
    import torch

    device = next((j.metrics.get("device") for j in jobs if j.metrics.get("device")), None) or {}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "device": f"{device.get('name', '?')} ({device.get('accelerator', '?')}, {device.get('count', 1)} device)",
        "driver": _driver(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "lightning": pl.__version__,
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit or "?",
    }


def compact_rows(jobs: List[report.Job]) -> List[dict]:
    _, rows, _ = report.build_rows(jobs)
    out = []
    for job, row in zip(jobs, rows):
        out.append({
            "bench": job.settings.get("bench", row["job"]),
            "batch": job.metrics.get("batch_size"),
            **{k: row.get(k) for k in COLUMNS if k not in ("bench", "batch")},
        })
    return out


def _row(rows: List[dict], bench: str) -> Optional[dict]:
    return next((r for r in rows if r["bench"] == bench and r["status"] == "ok"), None)


def headline(recipe: str, name: str, rows: List[dict]) -> List[str]:
    lines = []
    base, every = _row(rows, "baseline"), _row(rows, "all")
    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"]]
    if ok:
        best = max(ok, key=lambda r: r["samples_per_s"])
        lines.append(f"fastest row: `{best['bench']}` at {best['samples_per_s']:.0f} samples/s ({report._fmt(best['speedup'], 'speedup')} over the baseline)")
    if base and every:
        lines.append(f"all on vs all off: {every['samples_per_s']:.0f} vs {base['samples_per_s']:.0f} samples/s, {report._fmt(every['speedup'], 'speedup')}; the doctor says `{every['bottleneck']}` with everything on")
    target = TARGETS.get(recipe, {})
    if name == "synthetic" and "synthetic_samples_per_s" in target and ok:
        goal = target["synthetic_samples_per_s"]
        got = max(r["samples_per_s"] for r in ok)
        lines.append(f"target {goal:,} img/s on synthetic data: {'reached' if got >= goal else 'not reached'} ({got:,.0f} img/s)")
    if name == "jpeg" and "jpeg_speedup" in target and every and every["speedup"]:
        goal = target["jpeg_speedup"]
        lines.append(f"target {goal:.0f}x end-to-end over the all-off baseline: {'reached' if every['speedup'] >= goal else 'not reached'} ({every['speedup']:.2f}x)")
    failed = [r["bench"] for r in rows if r["status"] != "ok"]
    if failed:
        lines.append(f"rows that failed: {', '.join(failed)} (their errors are in the table)")
    return lines


def write(recipe: str, sweeps: List[Path], out: Path, dry_run: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    all_jobs = []
    sections = []
    for sweep in sweeps:
        jobs = report.load_jobs([str(sweep)])
        if not jobs:
            raise SystemExit(f"no metrics.json under {sweep}: did the sweep run?")
        all_jobs += jobs
        name = sweep.name
        rows = compact_rows(jobs)
        chart = sweep / "ab_report.png"
        if chart.exists():
            shutil.copyfile(chart, out / f"{name}.png")
        command = (sweep / "command.txt").read_text().strip() if (sweep / "command.txt").exists() else "(not recorded)"
        size = (jobs[0].metrics.get("data") or {}).get("image_size", "?")
        parts = [f"## {name}", "", TABLES.get(name, "").format(size=size), ""]
        parts += [f"- {line}" for line in headline(recipe, name, rows)] + [""]
        parts += [report.to_markdown(COLUMNS, rows), ""]
        if chart.exists():
            parts += [f"![{name}]({name}.png)", ""]
        parts += ["Command:", "", "```bash", command, "```", ""]
        sections.append("\n".join(parts))
    env = environment(all_jobs)
    kind = "CPU DRY RUN (tiny model, few steps): checks the suite, measures nothing about the recipe" if dry_run else "measured"
    header = [
        f"# {recipe}: A/B results ({kind})",
        "",
        "Written by `scripts/gpu_check.sh` (through `scripts/gpu_results.py`); do not edit by hand.",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
        "Each row is one `+bench=NAME` config (`configs/bench/`) on top of the recipe: `baseline` has every optimization off "
        "(fp32, no loader workers); the others switch one thing on; `all` switches everything on. A fixed number of steps per "
        "epoch; epoch 0 is warm-up and not counted; epoch_time_s is the median of the others. speedup is against `baseline` "
        "(from samples/s where batch sizes differ). The full reports (every flag column, spread, CSV) are in the sweep dirs.",
        "",
        ANCHORS,
        "",
    ]
    path = out / "RESULTS.md"
    path.write_text("\n".join(header) + "\n" + "\n".join(sections))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", required=True)
    p.add_argument("--sweeps", nargs="+", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    path = write(args.recipe, args.sweeps, args.out, args.dry_run)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
