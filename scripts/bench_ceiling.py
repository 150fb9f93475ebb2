"""The trainer against a hand-written PyTorch loop at the model's ceiling: is the framework free?

Why this exists: ``scripts/bench_overhead.py`` measures the framework's per-step Python against a
plain loop where the host is the limit (small models, fp32). This one asks the question a GPU user
asks: with every model-side flag on and no input pipeline at all, does ``train.py`` train as fast as
the loop a careful engineer writes by hand? Both sides do the same work, written out:

- data: the synthetic set's uint8 pool (``trainer.data.synthetic.SyntheticImages``, same seed) kept
  on the device; each batch one gather by a host-shuffled index copied from pinned memory, then
  normalized in one pass (the plain loop inside its compiled model, as the trainer's network does);
- model: torchvision ResNet-50 (``--model``), channels_last weights and inputs, ``torch.compile``;
- precision: bf16 autocast (``--no-amp``: fp32), TF32 off both sides;
- optimizer: fused SGD (momentum 0.9, weight decay on weights only, the trainer's param groups), a
  per-step cosine schedule without warm-up, gradients set to None, plain cross-entropy;
- no validation, no checkpoints; the trainer's defaults for everything else (its epoch timer,
  logging, the progress bar as a non-terminal user gets it).

How it measures: each side runs in its own process (the plain loop is this script with ``--plain``),
for ``--epochs`` epochs of ``--batches`` steps; the device is synchronized at each epoch's end only
(as the trainer's epoch timer does), and a side's speed is the median images/s of its epochs after
the first (the first compiles). The sides alternate, and which goes first flips from one repeat to
the next (plain, trainer, trainer, plain, ...), so drift hits both alike. All runs share one
Inductor cache directory (the trainer with ``compile_cache=shared``), so only the first run compiles
cold. Per repeat, ``ratio = trainer images/s / plain images/s``: 1.00 is parity, above 1 the trainer
is faster. The summary is the median ratio with its min-max.

    python scripts/bench_ceiling.py --device cuda                 # one GPU: ResNet-50, 224 px, batch 256
    python scripts/bench_ceiling.py --device cuda --long-batches 120   # also: per step, or per epoch?
    python scripts/bench_ceiling.py --device cpu --model resnet18 --image-size 32 --batch-size 8 \\
        --batches 3 --epochs 2 --repeats 1 --backend aot_eager     # does it run? (a CPU rehearsal)

A short epoch magnifies what a side pays once per epoch (its start, its end). ``--long-batches N``
runs each side again at N steps per epoch, in the same repeat, and splits each side's epoch into a
cost per step (the slope between the two lengths) and a fixed cost per epoch (the intercept): on one
H100 the trainer's 40-step epochs were 0.991x the plain loop's, and whether that is per step or per
epoch decides what to change.

Results go to ``--out`` (default scripts/results/bench_ceiling.json): each run's epochs, the ratios,
their median and spread, the settings and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "scripts" / "results" / "bench_ceiling.json"
SEED = 42
NUM_CLASSES = 10
LR = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-5


def plain_loop(args) -> dict:
    """The hand-written side: returns each epoch's seconds and the last epoch's mean loss."""
    import torch
    import torch.nn.functional as F
    import torchvision
    from torch import nn

    sys.path.insert(0, str(ROOT))
    from trainer.data.gpu_transforms import normalize_uint8
    from trainer.data.synthetic import SyntheticImages

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(SEED)
    device = torch.device(args.device)
    samples = args.batches * args.batch_size
    pool = SyntheticImages(samples, args.image_size, NUM_CLASSES, SEED, "train", keep_uint8=True)
    images, labels = pool.images.to(device), pool.labels.to(device)
    model = getattr(torchvision.models, args.model)(num_classes=NUM_CLASSES).to(device)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)

    class Normalized(nn.Module):  # the normalization inside the compiled graph, as the trainer's network has it
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(normalize_uint8(x, layout))

    net = Normalized(model)
    if args.compile:
        net = torch.compile(net, backend=args.backend)
    decay = [p for p in model.parameters() if p.ndim > 1]
    other = [p for p in model.parameters() if p.ndim <= 1]  # biases and norm weights, as the trainer groups them
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": other, "weight_decay": 0.0}]
    optimizer = torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM, nesterov=False, fused=True)
    total = args.epochs * args.batches
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total))))
    )
    generator = torch.Generator().manual_seed(SEED)
    seconds, last_loss = [], None
    model.train()
    for _ in range(args.epochs):
        order = torch.randperm(samples, generator=generator)
        loss_sum = torch.zeros((), device=device)
        start = time.perf_counter()
        for b in range(args.batches):
            idx = order[b * args.batch_size : (b + 1) * args.batch_size] % len(images)
            if device.type == "cuda":
                idx = idx.pin_memory().to(device, non_blocking=True)
            x, y = images[idx], labels[idx]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.detach()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # once per epoch, as the trainer's epoch timer does
        seconds.append(time.perf_counter() - start)
        last_loss = round(float(loss_sum) / args.batches, 5)
    return {"epoch_s": seconds, "train_loss": last_loss}


def trainer_command(args, run_dir: str) -> list:
    """``train.py`` with the same work written out; everything not listed stays at its default."""
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"hydra.run.dir={run_dir}",
        f"model._target_=torchvision.models.{args.model}",
        "~model.width",
        f"seed={SEED}",
        "data=synthetic",
        "data.device_resident=true",
        f"data.num_samples={args.batches * args.batch_size}",
        "data.val_samples=0",
        f"data.image_size={args.image_size}",
        f"data.batch_size={args.batch_size}",
        f"data.num_classes={NUM_CLASSES}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.limit_val_batches=0",
        "checkpoint.enabled=false",
        f"accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"amp={str(args.amp).lower()}",
        "amp_dtype=bf16",
        f"channels_last={str(args.channels_last).lower()}",
        f"compile={str(args.compile).lower()}",
        f"compile_backend={args.backend}",
        "compile_cache=shared",
        "tf32=false",
        "cudnn_benchmark=false",
        "optim.name=sgd",
        "optim.fused=true",
        f"optim.lr={LR}",
        f"optim.momentum={MOMENTUM}",
        f"optim.weight_decay={WEIGHT_DECAY}",
        "optim.nesterov=false",
        "lr_scaling=none",
        "sched.name=cosine",
        "sched.warmup_epochs=0",
        "loss.label_smoothing=0.0",
    ]


def images_per_s(epoch_s: list, samples: int) -> float:
    """The median images/s of the epochs after the first (the first compiles)."""
    steady = epoch_s[1:] or epoch_s
    return statistics.median(samples / s for s in steady)


def run_side(side: str, args, work_dir: str, env: dict) -> dict:
    samples = args.batches * args.batch_size
    run_dir = tempfile.mkdtemp(prefix=f"{side}-", dir=work_dir)
    if side == "plain":
        cmd = [sys.executable, str(Path(__file__).resolve()), "--plain", *args.argv]
    else:
        cmd = trainer_command(args, run_dir)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        sys.exit(f"error: the {side} run failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    if side == "plain":
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        epoch_s, loss = out["epoch_s"], out["train_loss"]
    else:
        metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
        epochs = metrics.get("epochs", [])
        if [e.get("steps") for e in epochs] != [args.batches] * args.epochs:
            sys.exit(f"error: the trainer run did not train {args.epochs} epoch(s) of {args.batches} steps: {epochs}")
        epoch_s, loss = [e["time_s"] for e in epochs], metrics.get("train_loss")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "side": side,
        "epoch_s": [round(s, 4) for s in epoch_s],
        "images_per_s": round(images_per_s(epoch_s, samples), 1),
        "train_loss": loss,
        "wall_s": round(wall, 2),
    }


def machine() -> dict:
    import torch

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def with_batches(args, batches: int):
    """The same settings at another number of steps per epoch (the plain side reads them from argv, which
    loses --long-batches: one run has one length)."""
    longer = argparse.Namespace(**vars(args))
    longer.batches, longer.long_batches = batches, 0
    argv, i = list(args.argv), 0
    while i < len(argv):
        if argv[i] in ("--batches", "--long-batches"):
            del argv[i : i + 2]
        elif argv[i].startswith(("--batches=", "--long-batches=")):
            del argv[i]
        else:
            i += 1
    longer.argv = [*argv, "--batches", str(batches)]
    return longer


def step_and_fixed(short_run: dict, long_run: dict, short: int, long: int) -> Tuple[float, float]:
    """(seconds per step, seconds per epoch outside its steps) from one side's epochs at two lengths: the
    slope and the intercept of its epoch time (the medians of the epochs after the first)."""
    t_short = statistics.median(short_run["epoch_s"][1:] or short_run["epoch_s"])
    t_long = statistics.median(long_run["epoch_s"][1:] or long_run["epoch_s"])
    step = (t_long - t_short) / (long - short)
    return step, t_short - short * step


def split_per_step(runs: list, args) -> dict:
    """With --long-batches: each repeat's per-step ratio (plain's step time over the trainer's: above 1
    the trainer's step is faster) and each side's fixed cost per epoch, medians and ranges."""
    ratios, fixed = [], {"plain": [], "trainer": []}
    steps = {"plain": [], "trainer": []}
    for r in sorted({x["repeat"] for x in runs}):
        per_side = {}
        for side in ("plain", "trainer"):
            short = next(x for x in runs if x["repeat"] == r and x["side"] == side and x["batches"] == args.batches)
            long = next(x for x in runs if x["repeat"] == r and x["side"] == side and x["batches"] == args.long_batches)
            per_side[side] = step_and_fixed(short, long, args.batches, args.long_batches)
            steps[side].append(per_side[side][0])
            fixed[side].append(per_side[side][1])
        ratios.append(round(per_side["plain"][0] / per_side["trainer"][0], 4))
    return {
        "steps_per_epoch": [args.batches, args.long_batches],
        "per_step_ratios": ratios,
        "per_step_median_ratio": round(statistics.median(ratios), 4),
        **{f"{side}_step_ms": round(1e3 * statistics.median(v), 3) for side, v in steps.items()},
        **{f"{side}_fixed_ms_per_epoch": round(1e3 * statistics.median(v), 1) for side, v in fixed.items()},
    }


def benchmark(args) -> dict:
    work_dir = tempfile.mkdtemp(prefix="bench_ceiling-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(work_dir, "inductor_cache")}
    lengths = [args] + ([with_batches(args, args.long_batches)] if args.long_batches else [])
    runs, ratios = [], []
    try:
        for r in range(1, args.repeats + 1):
            order = ("plain", "trainer") if r % 2 else ("trainer", "plain")
            pair = {}
            for side in order:
                for settings in lengths:
                    run = run_side(side, settings, work_dir, env)
                    runs.append({"repeat": r, "batches": settings.batches, **run})
                    if settings is args:
                        pair[side] = run["images_per_s"]
                    print(
                        f"  repeat {r}: {side:7s} {settings.batches:4d} steps {run['images_per_s']:9.1f} images/s "
                        f"(epochs {run['epoch_s']} s, {run['wall_s']:.0f} s with start-up and compile)",
                        flush=True,
                    )
            ratios.append(round(pair["trainer"] / pair["plain"], 4))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    plain = [x["images_per_s"] for x in runs if x["side"] == "plain" and x["batches"] == args.batches]
    trainer = [x["images_per_s"] for x in runs if x["side"] == "trainer" and x["batches"] == args.batches]
    split = split_per_step(runs, args) if args.long_batches else None
    return {
        "what": "train.py vs a hand-written loop on the same device-resident work (scripts/bench_ceiling.py)",
        "settings": {
            "model": args.model,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "batches_per_epoch": args.batches,
            "epochs": args.epochs,
            "amp": "bf16" if args.amp else "fp32",
            "channels_last": args.channels_last,
            "compile": args.backend if args.compile else False,
            "optimizer": "fused SGD, momentum 0.9, cosine per step",
            "device": args.device,
            "repeats": args.repeats,
        },
        "machine": machine(),
        "runs": runs,
        "ratios": ratios,
        "median_ratio": round(statistics.median(ratios), 4),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "plain_images_per_s": round(statistics.median(plain), 1),
        "trainer_images_per_s": round(statistics.median(trainer), 1),
        "target_ratio": args.target,
        "met": statistics.median(ratios) >= args.target,
        **({"per_step": split} if split else {}),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--model", default="resnet50", help="a torchvision.models constructor (default resnet50)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=40, help="steps per epoch (default 40)")
    p.add_argument(
        "--long-batches",
        type=int,
        default=0,
        help="also run each side at this many steps per epoch, to split its epoch into a cost per step and a "
        "fixed cost per epoch (slope and intercept; default off)",
    )
    p.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is not counted (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="plain/trainer pairs (default 2)")
    p.add_argument("--no-amp", dest="amp", action="store_false", help="fp32 instead of bf16 autocast")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager for a CPU rehearsal)")
    p.add_argument("--target", type=float, default=1.0, help="the ratio the trainer is to reach (default 1.00)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # internal: run the plain loop once
    args = p.parse_args(argv)
    if args.long_batches and args.long_batches <= args.batches:
        p.error(
            f"--long-batches ({args.long_batches}) must be more than --batches ({args.batches}): it is the longer epoch"
        )
    args.argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--plain"]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plain:
        print(json.dumps(plain_loop(args)))
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: --device cuda, but torch sees no CUDA GPU here")
    print(
        f"{args.model}, {args.image_size} px, batch {args.batch_size}, {args.batches} steps x {args.epochs} epochs, "
        f"{args.repeats} repeat(s) of plain and trainer on {args.device}",
        flush=True,
    )
    result = benchmark(args)
    print(
        f"trainer / plain: median {result['median_ratio']:.3f} (min-max {result['ratio_min']:.3f}-{result['ratio_max']:.3f}); "
        f"plain {result['plain_images_per_s']:.0f} images/s, trainer {result['trainer_images_per_s']:.0f}; "
        f"target {args.target:.2f}: {'met' if result['met'] else 'not met'}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result.get("per_step"):
        split = result["per_step"]
        print(
            f"per step (from {split['steps_per_epoch'][0]}- and {split['steps_per_epoch'][1]}-step epochs): plain/trainer "
            f"{split['per_step_median_ratio']:.3f} (plain {split['plain_step_ms']} ms, trainer {split['trainer_step_ms']} ms); "
            f"fixed per epoch: plain {split['plain_fixed_ms_per_epoch']} ms, trainer {split['trainer_fixed_ms_per_epoch']} ms"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
