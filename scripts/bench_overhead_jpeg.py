"""The trainer against a plain PyTorch loop on real JPEGs read by 0, 1 and 2 loader workers.

Why this exists: ``bench_overhead.py`` compares the two on synthetic data without workers, where the
loader costs nothing. Real training decodes files in loader worker processes, which share the cores
with the training step's own threads, so that is where a framework can lose time that synthetic
data never shows (a thread it starts, a worker setting, work done per step). This runs the image-
folder case the way a user would, on the same files, with the same ``torch.utils.data.DataLoader``
settings on both sides: torchvision ResNet-18 at ``--size`` px, batch ``--batch``, SGD with a per-step
cosine schedule, no augmentation (resize + center crop + normalize: the trainer's
``data.augment=false`` transforms, ``trainer.data.folder.transforms_for``), PIL decode, shuffled
batches with drop_last, torch's default worker settings (not persistent, prefetch 2, no pinning),
no validation, no checkpoints.

How it measures (as bench_overhead.py): each side runs as its own process for ``--short-epochs`` and
``--long-epochs`` epochs, timed from outside; the per-epoch cost is the slope between the two, which
cancels start-up and the first epoch. Sides alternate inside each repeat (which goes first flips),
worker counts are interleaved, one untimed run of each comes first (file cache). While a run goes,
its process tree's CPU times are read every ``--poll`` seconds (psutil): the training process's main
thread, its other threads (torch's intra-op pool and any thread the framework starts) and its
loader workers, so the per-epoch CPU of each part has a slope too: where a difference in wall time
comes from, not only that it exists.

How to read it: per worker count, ``ratio = trainer slope / plain slope``, the median over repeats
with a bootstrap 95% interval and the three-way conclusion against 3% (within, over, cannot
conclude); then the CPU split per epoch of both sides.

    python scripts/bench_overhead_jpeg.py --folder DIR          # DIR/train/<class>/*.jpg (DIR/val unused)
    python scripts/bench_overhead_jpeg.py --repeats 1 --short-epochs 1 --long-epochs 2 --workers 1   # does it run?

Without ``--folder`` it uses the built-in JPEGs (``data=builtin``: generated once into the cache).
Results: ``--out`` (default scripts/results/bench_overhead_jpeg.json) holds every raw run and the
machine (``trainer.measure.hardware.machine_record``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_overhead import (  # noqa: E402
    BUSY_LOAD,
    LR,
    MOMENTUM,
    SEED,
    TARGET_RATIO,
    WEIGHT_DECAY,
    bootstrap_median_interval,
    conclusion,
    load_average,
    plain_training,
)

DEFAULT_OUT = ROOT / "scripts" / "results" / "bench_overhead_jpeg.json"
PARTS = ("main_thread", "other_threads", "workers")


# ---------------------------------------------------------------------------------------------
# the plain loop (this script with --plain, in its own process)


def plain_loop(folder: str, workers: int, epochs: int, size: int, batch: int) -> dict:
    """What a user writes by hand: ImageFolder, the same transforms, the same DataLoader settings."""
    import torch
    import torchvision
    from torch.utils.data import DataLoader

    from trainer.data.folder import transforms_for

    torch.manual_seed(SEED)
    data = torchvision.datasets.ImageFolder(os.path.join(folder, "train"), transform=transforms_for(size, True, False))
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
    model = torchvision.models.resnet18(num_classes=len(data.classes))
    return {"train_loss": plain_training(model, loader, epochs), "steps_per_epoch": len(loader)}


def plain_command(folder: str, workers: int, epochs: int, args) -> list:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--plain",
        "--folder",
        folder,
        "--workers",
        str(workers),
        "--epochs",
        str(epochs),
        "--size",
        str(args.size),
        "--batch",
        str(args.batch),
    ]


def trainer_command(folder: str, workers: int, epochs: int, run_dir: str, args) -> list:
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"hydra.run.dir={run_dir}",
        "model=resnet18",
        f"seed={SEED}",
        "data=imagefolder",
        f"data.root={folder}",
        "data.augment=false",
        "data.decoder=pil",
        f"data.image_size={args.size}",
        f"data.batch_size={args.batch}",
        f"data.num_workers={workers}",
        "data.drop_last=true",
        f"trainer.max_epochs={epochs}",
        "trainer.limit_train_batches=1.0",
        "trainer.limit_val_batches=0",
        "checkpoint.enabled=false",
        "optim.name=sgd",
        f"optim.lr={LR}",
        f"optim.momentum={MOMENTUM}",
        f"optim.weight_decay={WEIGHT_DECAY}",
        "optim.nesterov=false",
        "sched.name=cosine",
        "sched.warmup_epochs=0",
        "loss.label_smoothing=0.0",
    ]


# ---------------------------------------------------------------------------------------------
# one timed run, its process tree's CPU read while it goes


def _cpu_reading(proc) -> dict:
    """CPU seconds so far of the training process's main thread and its other threads, and of each
    child (loader worker) by pid: workers come and go (not persistent), so each keeps its last reading."""
    import psutil

    try:
        threads = proc.threads()
        own = proc.cpu_times()  # the whole process: every thread, also those that have ended since
        children = proc.children(recursive=True)
    except psutil.Error:
        return {}
    workers = {}
    for child in children:
        try:
            times = child.cpu_times()
            workers[child.pid] = times.user + times.system
        except psutil.Error:
            pass
    main = sum(t.user_time + t.system_time for t in threads if t.id == proc.pid)
    return {
        "main_thread": main,
        # the process's total less its main thread, not the sum over the threads alive now: a thread
        # that ended between two readings (a pool torch rebuilt, a short-lived helper) keeps its CPU
        "other_threads": max(0.0, own.user + own.system - main),
        "workers": workers,
        "threads": len(threads),
    }


def timed_run(side: str, folder: str, workers: int, epochs: int, work_dir: str, args) -> dict:
    import psutil

    run_dir = tempfile.mkdtemp(prefix="trainer-", dir=work_dir)
    cmd = (
        plain_command(folder, workers, epochs, args)
        if side == "plain"
        else trainer_command(folder, workers, epochs, run_dir, args)
    )
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watched, last, workers_seen = psutil.Process(proc.pid), {}, {}
    while proc.poll() is None:
        reading = _cpu_reading(watched)
        if reading:
            workers_seen.update(reading["workers"])
            last = reading
        try:
            proc.wait(timeout=args.poll)  # returns at the exit itself: the wall time is not rounded to a poll
        except subprocess.TimeoutExpired:
            pass
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"error: the {side} run failed (exit {proc.returncode}): {' '.join(cmd)}\n{(out + err)[-3000:]}")
    if side == "plain":
        result = json.loads(out.strip().splitlines()[-1])
        loss, steps = result["train_loss"], result["steps_per_epoch"]
    else:
        metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
        loss = metrics.get("train_loss")
        steps = (metrics.get("epochs") or [{}])[-1].get("steps")
    shutil.rmtree(run_dir, ignore_errors=True)
    cpu = {k: round(last.get(k, 0.0), 3) for k in ("main_thread", "other_threads")}
    cpu["workers"] = round(sum(workers_seen.values()), 3)
    return {
        "side": side,
        "workers": workers,
        "epochs": epochs,
        "wall_s": round(wall, 4),
        "cpu_s": cpu,
        "threads": last.get("threads"),
        "steps_per_epoch": steps,
        "train_loss": loss,
        "command": cmd,
    }


# ---------------------------------------------------------------------------------------------
# the benchmark


def builtin_folder() -> str:
    """The built-in JPEGs (made once into the trainer's cache), as the trainer's data=builtin has them."""
    from trainer.data.builtin import ensure_builtin
    from trainer.paths import default_cache_dir

    return ensure_builtin(default_cache_dir(), images_per_class=140, stored_size=40)


def benchmark(args) -> dict:
    folder = os.path.abspath(args.folder) if args.folder else builtin_folder()
    span = args.long_epochs - args.short_epochs
    work_dir = tempfile.mkdtemp(prefix="bench_overhead_jpeg-")
    load_before = load_average()
    print(
        f"ResNet-18, {args.size} px, batch {args.batch}, {folder}: workers {args.workers}, {args.repeats} repeat(s) "
        f"of plain and trainer at {args.short_epochs} and {args.long_epochs} epochs (load average {load_before})",
        flush=True,
    )
    runs, repeats = [], []
    try:
        for w in args.workers:
            for side in ("plain", "trainer"):  # untimed: the file cache, first-run-only work
                timed_run(side, folder, w, args.short_epochs, work_dir, args)
        for r in range(1, args.repeats + 1):
            for w in args.workers:
                order = ("plain", "trainer") if (r + w) % 2 else ("trainer", "plain")
                got = {}
                for epochs in (args.short_epochs, args.long_epochs):
                    for side in order:
                        run = timed_run(side, folder, w, epochs, work_dir, args)
                        runs.append({"repeat": r, **run})
                        got[side, epochs] = run
                        print(
                            f"  repeat {r}, {w} worker(s): {side:7s} {epochs} epoch(s) {run['wall_s']:7.2f} s wall "
                            f"(CPU: main {run['cpu_s']['main_thread']:.1f} s, other threads {run['cpu_s']['other_threads']:.1f} s, "
                            f"workers {run['cpu_s']['workers']:.1f} s; {run['threads']} threads)",
                            flush=True,
                        )
                slope = {
                    s: (got[s, args.long_epochs]["wall_s"] - got[s, args.short_epochs]["wall_s"]) / span for s in order
                }
                cpu = {
                    s: {
                        p: round(
                            (got[s, args.long_epochs]["cpu_s"][p] - got[s, args.short_epochs]["cpu_s"][p]) / span, 4
                        )
                        for p in PARTS
                    }
                    for s in order
                }
                repeats.append(
                    {
                        "repeat": r,
                        "workers": w,
                        "plain_slope_s": round(slope["plain"], 4),
                        "trainer_slope_s": round(slope["trainer"], 4),
                        "ratio": round(slope["trainer"] / slope["plain"], 4),
                        "plain_cpu_per_epoch_s": cpu["plain"],
                        "trainer_cpu_per_epoch_s": cpu["trainer"],
                    }
                )
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return summarize(args, folder, runs, repeats, load_before)


def summarize(args, folder: str, runs: list, repeats: list, load_before) -> dict:
    from trainer.measure.hardware import machine_record

    per_workers = {}
    for w in args.workers:
        mine = [r for r in repeats if r["workers"] == w]
        ratios = [r["ratio"] for r in mine]
        median = statistics.median(ratios)
        interval = bootstrap_median_interval(ratios) if len(ratios) > 1 else (median, median)
        per_workers[str(w)] = {
            "median_ratio": round(median, 4),
            "ratio_interval_95": [round(interval[0], 4), round(interval[1], 4)],
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "conclusion": conclusion(interval, TARGET_RATIO),
            "median_plain_slope_s": round(statistics.median(r["plain_slope_s"] for r in mine), 4),
            "median_trainer_slope_s": round(statistics.median(r["trainer_slope_s"] for r in mine), 4),
            "median_cpu_per_epoch_s": {
                side: {p: round(statistics.median(r[f"{side}_cpu_per_epoch_s"][p] for r in mine), 3) for p in PARTS}
                for side in ("plain", "trainer")
            },
            "threads": {
                side: sorted({x["threads"] for x in runs if x["side"] == side and x["workers"] == w})
                for side in ("plain", "trainer")
            },
            "last_train_loss": {
                side: next(x["train_loss"] for x in reversed(runs) if x["side"] == side and x["workers"] == w)
                for side in ("plain", "trainer")
            },
        }
    warnings = []
    if load_before and load_before[0] > BUSY_LOAD:
        warnings.append(
            f"the machine was busy before the start (1-minute load average {load_before[0]}): the ratios are unreliable"
        )
    if any(min(r["plain_slope_s"], r["trainer_slope_s"]) <= 0 for r in repeats):
        warnings.append("a long run was not slower than its short run: use more --long-epochs")
    steps = {x["steps_per_epoch"] for x in runs}
    if len(steps) > 1:
        warnings.append(f"the two sides trained different steps per epoch: {sorted(steps)}")
    import torch

    return {
        "what": "per-epoch wall-time slope of train.py vs a plain PyTorch loop on real JPEGs with loader workers "
        "(scripts/bench_overhead_jpeg.py)",
        "settings": {
            "folder": folder,
            "model": "torchvision.models.resnet18 (random init)",
            "image_size": args.size,
            "batch_size": args.batch,
            "steps_per_epoch": sorted(steps),
            "loader": "shuffle, drop_last, not persistent, prefetch_factor 2, no pinned memory",
            "transforms": "PIL decode, resize + center crop, float, normalize (data.augment=false)",
            "workers": args.workers,
            "short_epochs": args.short_epochs,
            "long_epochs": args.long_epochs,
            "repeats": args.repeats,
        },
        "machine": {
            **machine_record(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "load_average_before": load_before,
            "load_average_after": load_average(),
        },
        "by_workers": per_workers,
        "repeats": repeats,
        "runs": runs,
        "warnings": warnings,
    }


def print_table(result: dict) -> None:
    print(f"\n{'workers':>7}  {'plain s/epoch':>13}  {'trainer s/epoch':>15}  {'ratio [95%]':>20}  conclusion")
    for w, s in result["by_workers"].items():
        lo, hi = s["ratio_interval_95"]
        print(
            f"{w:>7}  {s['median_plain_slope_s']:>13.3f}  {s['median_trainer_slope_s']:>15.3f}  "
            f"{s['median_ratio']:>6.3f} [{lo:.3f}-{hi:.3f}]  {s['conclusion']}"
        )
    print(
        "\nCPU seconds per epoch (median slope): main thread / other threads of the training process / loader workers"
    )
    for w, s in result["by_workers"].items():
        cpu = s["median_cpu_per_epoch_s"]
        print(
            f"{w:>7}  plain   {cpu['plain']['main_thread']:.2f} / {cpu['plain']['other_threads']:.2f} / {cpu['plain']['workers']:.2f}"
            f"   trainer {cpu['trainer']['main_thread']:.2f} / {cpu['trainer']['other_threads']:.2f} / {cpu['trainer']['workers']:.2f}"
            f"   threads: plain {s['threads']['plain']}, trainer {s['threads']['trainer']}"
        )
    for warning in result["warnings"]:
        print(f"WARNING: {warning}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--folder", help="an image folder with train/<class>/*.jpg (default: the built-in JPEGs)")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--short-epochs", type=int, default=1)
    p.add_argument("--long-epochs", type=int, default=3)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--poll", type=float, default=0.5, help="seconds between CPU readings of a running side")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.long_epochs <= args.short_epochs or min(args.repeats, args.short_epochs) < 1:
        p.error("need --repeats >= 1 and --long-epochs > --short-epochs >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plain:
        print(json.dumps(plain_loop(args.folder, args.workers[0], args.epochs, args.size, args.batch)))
        return
    result = benchmark(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
