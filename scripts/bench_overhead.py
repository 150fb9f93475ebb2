"""How much does the framework cost per epoch, compared with a plain PyTorch loop?

Why this exists: every switch in the trainer is only worth measuring if the trainer itself does not
slow what it measures. This script trains the same model on the same data with the same optimizer
twice: (a) with a plain hand-written PyTorch loop and (b) through ``train.py`` (Hydra + Lightning,
logging, the epoch timer, the progress bar as a non-terminal user gets it). The target: on CPU,
ResNet-18 at 32 px and batch 32, the trainer costs at most 3% more per epoch than the plain loop.

How it measures: both sides run as separate subprocesses (the plain loop is this script with
``--plain``), so both pay process start-up, and neither times itself. Each side is run twice, for
``--short-epochs`` and ``--long-epochs`` epochs, timed from outside with a wall clock; the
per-epoch cost is the slope

    slope = (T_long - T_short) / (long_epochs - short_epochs)

which cancels start-up (imports, Hydra, building the model and data) and the first epoch's warm-up,
and leaves what a steady epoch costs. One untimed run of each side comes first, so the file cache
is warm for everyone. In each repeat the plain and trainer runs alternate, and which side goes
first flips from one repeat to the next, so slow drift in the machine's speed hits both sides alike.

How to read it: per repeat, ``ratio = trainer_slope / plain_slope``; 1.00 means no overhead,
1.03 means the trainer costs 3% more per epoch. The summary is the median ratio over the repeats
with a bootstrap 95% interval, and a conclusion: within 3% only if the whole interval is at or
below 1.03, over 3% only if it is all above, otherwise "cannot conclude" (the measurement cannot
resolve 3% on this machine now). Beside the wall-time slopes, each side's CPU-time slope (user +
kernel, from the child's rusage) gives a second ratio that other processes disturb less, and the
kernel's share of each side's CPU time is reported (a large one means page faults or thread
wake-ups, not training). Other processes (the JSON records the load average before and after) and
a wandering VM widen the interval; more ``--repeats`` narrow the median best; longer runs
(``--batches``, ``--long-epochs``) shrink start-up jitter.
Both sides' last-epoch mean training loss is printed as a check that they trained the same thing:
same initial weights and data, so they should be close (not equal: the trainer's sampler shuffles
in its own order).

    python scripts/bench_overhead.py      # the full benchmark: 9 repeats, 80 batches, 1 vs 4 epochs (~12 min on 2 cores)
    python scripts/bench_overhead.py --repeats 1 --batches 5 --short-epochs 1 --long-epochs 2   # does it run? (~30 s)
    python scripts/bench_overhead.py --device cuda --batch-size 256 --batches 400   # on a GPU: the host-bound regime, target 5%

With ``--device cuda`` both sides train on the GPU with the same settings written out (fp32 without
TF32, no cudnn.benchmark, pageable batches copied as Lightning copies them, no prefetch): the
per-step cost of the framework's Python (hooks, logging, the epoch timer) against the GPU's step,
which for ResNet-18 at 32 px and batch 256 is a few milliseconds. The target there is 5%
(``--target``).

Results go to ``--out`` (default scripts/results/bench_overhead.json): every raw wall time and
command, the slopes, the ratios, their median and spread, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "scripts" / "results" / "bench_overhead.json"
TARGET_RATIO = 1.03  # the trainer may cost at most 3% more per epoch than the plain loop (on a GPU: 1.05)
BUSY_LOAD = 0.5  # a 1-minute load average above this before the start: something else is running

# What both sides train. The trainer gets all of these on its command line, so a change to the
# config defaults cannot make the two sides drift apart; they match the schema defaults (trainer/config/) today.
SEED = 42
IMAGE_SIZE = 32
BATCH_SIZE = 32  # --batch-size
DEVICE = "cpu"  # --device
NUM_CLASSES = 10
LR = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-5


# ---------------------------------------------------------------------------------------------
# the plain PyTorch loop: what a user would write by hand (run in its own process by --plain)


def plain_loop(epochs: int, batches: int) -> dict:
    """Train like ``train.py`` would, without the framework; return the last epoch's mean loss.

    Mirrors the trainer's recipe: synthetic data from the same class and seed, torchvision
    ResNet-18 (random init), SGD with weight decay on weights only (trainer/models/optimizers.py's param
    groups, torch's default implementation as with optim.fused=auto), a per-step cosine schedule with
    no warm-up, gradients set to None, plain cross-entropy, shuffled batches with drop_last, no
    workers, no validation, no checkpoints.
    """
    import torch
    import torchvision
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(ROOT))
    from trainer.data.synthetic import SyntheticImages

    torch.manual_seed(SEED)
    data = SyntheticImages(batches * BATCH_SIZE, IMAGE_SIZE, NUM_CLASSES, SEED, "train")
    loader = DataLoader(data, batch_size=BATCH_SIZE, shuffle=True, drop_last=True, num_workers=0)
    model = torchvision.models.resnet18(num_classes=NUM_CLASSES)
    if (
        DEVICE == "cuda"
    ):  # as the trainer's tf32=false cudnn_benchmark=false set them (torch's own default lets cuDNN use TF32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
    return {"train_loss": plain_training(model.to(DEVICE), loader, epochs)}


def plain_training(model, loader, epochs: int) -> float:
    """The trainer's recipe by hand: SGD with weight decay on weights only (trainer/models/optimizers.py's
    param groups, torch's default implementation as with optim.fused=auto), a per-step cosine
    schedule with no warm-up, gradients set to None, plain cross-entropy. Returns the last epoch's
    mean training loss (rounded to 5 decimals)."""
    import torch
    import torch.nn.functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},  # biases, norm weights
    ]
    optimizer = torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM, nesterov=False)
    total_steps = epochs * len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total_steps))))
    )

    device = next(model.parameters()).device
    model.train()
    for _ in range(epochs):
        loss_sum = torch.zeros((), device=device)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # as Lightning moves a batch
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.detach()
    return round(float(loss_sum) / len(loader), 5)


# ---------------------------------------------------------------------------------------------
# the two sides as subprocesses, timed from outside


def plain_command(epochs: int, batches: int) -> list:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--plain",
        "--epochs",
        str(epochs),
        "--batches",
        str(batches),
        "--device",
        DEVICE,
        "--batch-size",
        str(BATCH_SIZE),
    ]


def trainer_command(epochs: int, batches: int, run_dir: str) -> list:
    """``train.py`` with the same settings; everything not listed stays at its default."""
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"hydra.run.dir={run_dir}",
        "model._target_=torchvision.models.resnet18",
        "~model.width",  # num_classes follows data.num_classes
        f"seed={SEED}",
        "data=synthetic",
        f"data.num_samples={batches * BATCH_SIZE}",
        "data.val_samples=0",
        f"data.image_size={IMAGE_SIZE}",
        f"data.batch_size={BATCH_SIZE}",
        f"data.num_classes={NUM_CLASSES}",
        "data.num_workers=0",
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
        *GPU_SETTINGS[DEVICE],
    ]


# on a GPU, what the plain loop does, written out (the CPU's defaults already are)
GPU_SETTINGS = {
    "cpu": [],
    "cuda": [
        "accelerator=gpu",
        "amp=false",
        "tf32=false",
        "cudnn_benchmark=false",
        "channels_last=false",
        "compile=false",
        "data.pin_memory=false",
        "data.device_prefetch=false",
        "data.device_resident=false",
        "data.gpu_normalize=false",
    ],
}


def trainer_mismatches(metrics: dict, epochs: int, batches: int) -> list:
    """What the trainer's metrics.json says it ran, where that differs from the plain loop's settings."""
    problems = []
    steps = [e.get("steps") for e in metrics.get("epochs", [])]
    if steps != [batches] * epochs:
        problems.append(f"steps per epoch {steps}, expected {epochs} epoch(s) of {batches}")
    if metrics.get("batch_size", BATCH_SIZE) != BATCH_SIZE:
        problems.append(f"batch size {metrics['batch_size']}, expected {BATCH_SIZE}")
    if not math.isclose(metrics.get("lr", LR), LR):  # e.g. an lr scaling rule switched on by default
        problems.append(f"lr {metrics['lr']}, expected {LR}")
    return problems


def timed_run(side: str, epochs: int, batches: int, work_dir: str) -> dict:
    """Run one side as a subprocess (output captured: not a terminal); return its wall time."""
    run_dir = tempfile.mkdtemp(prefix="trainer-", dir=work_dir)  # the trainer's hydra.run.dir
    cmd = plain_command(epochs, batches) if side == "plain" else trainer_command(epochs, batches, run_dir)
    user_start, sys_start = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - start
    user_end, sys_end = _children_cpu_s()
    user, system = user_end - user_start, sys_end - sys_start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        sys.exit(f"error: the {side} run failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    if side == "plain":
        loss = json.loads(proc.stdout.strip().splitlines()[-1])["train_loss"]
    else:
        metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
        problems = trainer_mismatches(metrics, epochs, batches)
        if problems:
            sys.exit(
                f"error: the trainer run did not train what the plain loop trains: {'; '.join(problems)}\n{' '.join(cmd)}"
            )
        loss = metrics.get("train_loss")
    shutil.rmtree(run_dir, ignore_errors=True)
    # cpu_s / wall_s near the core count means the run had the machine to itself while training;
    # sys_s is the kernel's share (page faults of freed-and-remapped tensors, thread wake-ups)
    return {
        "side": side,
        "epochs": epochs,
        "wall_s": round(wall, 4),
        "cpu_s": round(user + system, 3),
        "sys_s": round(system, 3),
        "train_loss": loss,
        "command": cmd,
    }


def _children_cpu_s() -> tuple:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def bootstrap_median_interval(values: list, resamples: int = 4000, seed: int = 0) -> tuple:
    """95% interval of the median of ``values`` by bootstrap (seeded: the same data gives the same interval)."""
    import random

    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def conclusion(interval: tuple, target: float) -> str:
    """What the interval of the median ratio lets us say about the target."""
    lo, hi = interval
    if hi <= target:
        return (
            f"within {100 * (target - 1):.0f}%: the whole 95% interval ({lo:.3f}-{hi:.3f}) is at or below {target:.2f}"
        )
    if lo > target:
        return f"OVER {100 * (target - 1):.0f}%: the whole 95% interval ({lo:.3f}-{hi:.3f}) is above {target:.2f}"
    return (
        f"cannot conclude: the 95% interval ({lo:.3f}-{hi:.3f}) spans {target:.2f}, wider than the {100 * (target - 1):.0f}% asked about; "
        "rerun on a quieter machine or with more --repeats"
    )


# ---------------------------------------------------------------------------------------------
# the benchmark


def machine_info() -> dict:
    import torch
    import torchvision

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def load_average() -> list | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def benchmark(args) -> dict:
    span = args.long_epochs - args.short_epochs
    work_dir = tempfile.mkdtemp(prefix="bench_overhead-")
    load_before = load_average()
    print(
        f"ResNet-18, {IMAGE_SIZE} px, batch {BATCH_SIZE}, {args.batches} batches/epoch: "
        f"{args.repeats} repeat(s) of plain and trainer at {args.short_epochs} and {args.long_epochs} epochs "
        f"(load average {load_before})",
        flush=True,
    )
    runs, repeats = [], []
    try:
        for side in ("plain", "trainer"):  # untimed: warms the file cache and anything else first-run-only
            timed_run(side, args.short_epochs, args.batches, work_dir)
        for r in range(1, args.repeats + 1):
            order = ("plain", "trainer") if r % 2 else ("trainer", "plain")
            wall, cpus = {}, {}
            for epochs in (args.short_epochs, args.long_epochs):
                for side in order:
                    run = timed_run(side, epochs, args.batches, work_dir)
                    runs.append({"repeat": r, **run})
                    wall[side, epochs], cpus[side, epochs] = run["wall_s"], run["cpu_s"]
                    print(
                        f"  repeat {r}: {side:7s} {epochs:2d} epoch(s) {run['wall_s']:8.2f} s wall, {run['cpu_s']:8.2f} s CPU "
                        f"({run['sys_s']:.2f} s of it in the kernel)",
                        flush=True,
                    )
            slope = {s: (wall[s, args.long_epochs] - wall[s, args.short_epochs]) / span for s in order}
            cpu = {s: (cpus[s, args.long_epochs] - cpus[s, args.short_epochs]) / span for s in order}
            repeats.append(
                {
                    "repeat": r,
                    "plain_slope_s": round(slope["plain"], 4),
                    "trainer_slope_s": round(slope["trainer"], 4),
                    "ratio": round(slope["trainer"] / slope["plain"], 4),
                    "plain_cpu_slope_s": round(cpu["plain"], 4),
                    "trainer_cpu_slope_s": round(cpu["trainer"], 4),
                    "cpu_ratio": round(cpu["trainer"] / cpu["plain"], 4) if cpu["plain"] > 0 else None,
                }
            )
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    warnings = []
    if load_before and load_before[0] > BUSY_LOAD:
        warnings.append(
            f"the machine was busy before the start (1-minute load average {load_before[0]}): "
            "other processes share the cores, so the slopes and ratios are unreliable; rerun on a quiet machine"
        )
    if any(min(r["plain_slope_s"], r["trainer_slope_s"]) <= 0 for r in repeats):
        warnings.append(
            "a long run was not measurably slower than its short run (slope <= 0): the epochs are too short "
            "against start-up jitter, so the ratios mean nothing; use more --batches or --long-epochs"
        )
    ratios = [r["ratio"] for r in repeats]
    median = statistics.median(ratios)
    interval = bootstrap_median_interval(ratios) if len(ratios) > 1 else (median, median)
    cpu_ratios = [r["cpu_ratio"] for r in repeats if r["cpu_ratio"]]
    sys_share = {
        side: round(
            sum(x["sys_s"] for x in runs if x["side"] == side)
            / max(1e-9, sum(x["cpu_s"] for x in runs if x["side"] == side)),
            3,
        )
        for side in ("plain", "trainer")
    }
    last = {
        side: next(run["train_loss"] for run in reversed(runs) if run["side"] == side) for side in ("plain", "trainer")
    }
    return {
        "what": "per-epoch wall-time slope of train.py vs a plain PyTorch loop (scripts/bench_overhead.py)",
        "settings": {
            "model": "torchvision.models.resnet18 (random init)",
            "data": "synthetic",
            "seed": SEED,
            "image_size": IMAGE_SIZE,
            "batch_size": BATCH_SIZE,
            "device": DEVICE,
            "num_classes": NUM_CLASSES,
            "optimizer": {
                "name": "sgd",
                "lr": LR,
                "momentum": MOMENTUM,
                "weight_decay": WEIGHT_DECAY,
                "schedule": "cosine, per step",
            },
            "batches_per_epoch": args.batches,
            "short_epochs": args.short_epochs,
            "long_epochs": args.long_epochs,
            "repeats": args.repeats,
        },
        "machine": {**machine_info(), "load_average_before": load_before, "load_average_after": load_average()},
        "runs": runs,
        "repeats": repeats,
        "median_ratio": round(median, 4),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_interval_95": [round(interval[0], 4), round(interval[1], 4)],
        "conclusion": conclusion(interval, args.target),
        "median_cpu_ratio": round(statistics.median(cpu_ratios), 4) if cpu_ratios else None,
        "cpu_ratio_min": min(cpu_ratios) if cpu_ratios else None,
        "cpu_ratio_max": max(cpu_ratios) if cpu_ratios else None,
        "kernel_share_of_cpu": sys_share,
        "median_plain_slope_s": round(statistics.median(r["plain_slope_s"] for r in repeats), 4),
        "median_trainer_slope_s": round(statistics.median(r["trainer_slope_s"] for r in repeats), 4),
        "overhead_pct": round(100 * (median - 1), 2),
        "target_ratio": args.target,
        "within_target": interval[1] <= args.target,
        "last_train_loss": last,
        "warnings": warnings,
    }


def print_table(result: dict) -> None:
    print(f"\n{'repeat':>6}  {'plain s/epoch':>13}  {'trainer s/epoch':>15}  {'ratio':>6}  {'CPU ratio':>9}")
    for r in result["repeats"]:
        cpu = f"{r['cpu_ratio']:.3f}" if r.get("cpu_ratio") else "-"
        print(
            f"{r['repeat']:>6}  {r['plain_slope_s']:>13.3f}  {r['trainer_slope_s']:>15.3f}  {r['ratio']:>6.3f}  {cpu:>9}"
        )
    lo, hi = result["ratio_interval_95"]
    print(
        f"\nmedian ratio {result['median_ratio']:.3f} (95% interval {lo:.3f}-{hi:.3f}, min-max {result['ratio_min']:.3f}-{result['ratio_max']:.3f}): "
        f"the trainer costs {result['overhead_pct']:+.1f}% per epoch; {result['conclusion']}"
    )
    if result.get("median_cpu_ratio"):
        print(
            f"per-epoch CPU time ratio {result['median_cpu_ratio']:.3f} (min-max {result['cpu_ratio_min']:.3f}-{result['cpu_ratio_max']:.3f}); "
            f"kernel share of CPU time: plain {result['kernel_share_of_cpu']['plain']:.0%}, trainer {result['kernel_share_of_cpu']['trainer']:.0%}"
        )
    print(
        f"median per-epoch cost: plain {result['median_plain_slope_s']:.3f} s, trainer {result['median_trainer_slope_s']:.3f} s; "
        f"last-epoch train loss: plain {result['last_train_loss']['plain']}, trainer {result['last_train_loss']['trainer']}"
    )
    for warning in result["warnings"]:
        print(f"WARNING: {warning}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=9, help="plain/trainer pairs of slopes to measure (default 9)")
    p.add_argument("--batches", type=int, default=80, help="training batches per epoch (default 80)")
    p.add_argument("--short-epochs", type=int, default=1, help="epochs of the short run (default 1)")
    p.add_argument("--long-epochs", type=int, default=4, help="epochs of the long run (default 4)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both sides train (default cpu)")
    p.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help=f"batch size of both sides (default {BATCH_SIZE})"
    )
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="the ratio the interval is judged against (default 1.03, on cuda 1.05)",
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"results JSON (default {DEFAULT_OUT.relative_to(ROOT)})"
    )
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # internal: run the plain loop once
    p.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)  # internal: with --plain
    args = p.parse_args(argv)
    if min(args.repeats, args.batches, args.short_epochs, args.epochs) < 1:
        p.error("--repeats, --batches and --short-epochs must be >= 1")
    if args.long_epochs <= args.short_epochs:
        p.error("--long-epochs must be larger than --short-epochs")
    if args.target is None:
        args.target = 1.05 if args.device == "cuda" else TARGET_RATIO
    return args


def main(argv=None) -> None:
    global BATCH_SIZE, DEVICE
    args = parse_args(argv)
    BATCH_SIZE, DEVICE = args.batch_size, args.device  # both sides, and the plain loop's own process
    if DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: --device cuda, but torch sees no CUDA GPU here")
    if args.plain:
        print(json.dumps(plain_loop(args.epochs, args.batches)))
        return
    result = benchmark(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
