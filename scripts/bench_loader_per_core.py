"""Images per core-second of the input pipeline alone: the product's loader against NVIDIA DALI's CPU
pipeline and a careful hand-written torchvision loop, on ImageNet-sized JPEGs.

Why it exists: on a machine with few cores per GPU, the loader's CPU cost per image decides the
epoch time. This measures that cost with the model out of the way: each pipeline decodes,
random-resized-crops (to ``--size``, scale 0.08-1 as the ImageNet recipes) and flips training
images into uint8 batches, on one core (the process pinned to it, one thread), for ``--batches``
batches after a warm-up pass. The pipelines take turns within each repeat (the order rotates), so
slow drift of a shared machine hits all of them alike; the summary is each one's median images/s
with its min-max, and the ratios of the medians.

- ``product`` rows: ``ImageDataModule``'s training loader as ``train.py`` builds it (``data=imagefolder``
  on the generated folder), no loader workers (the loading runs in this process, on the pinned
  core), with the keys each row names (``--product "data.decoder=turbo ..."``, repeatable);
- ``dali``: ``fn.readers.file`` + ``fn.decoders.image_random_crop`` (libjpeg-turbo, decoding only
  the crop's region) + ``fn.resize`` + ``fn.flip``, one thread, on the CPU (where DALI is installed);
- ``torchvision``: PIL decode, ``v2.RandomResizedCrop`` + ``v2.RandomHorizontalFlip`` on the PIL image,
  ``v2.PILToTensor``, stacked: what a careful user writes by hand.

The JPEGs (``--images``, default 512, about 500 x 375 px at quality 90, ImageNet's typical size) are
cut from the photos the built-in set uses, into a temp folder (or ``--folder``, kept).

    python scripts/bench_loader_per_core.py --out scripts/results/loader_per_core/<cpu kind>.json

``--save`` keeps the decoders' and DALI's per-core rates as this machine's (``trainer.measure.loader_rates``),
where the doctor reads them to say which loader would feed an input-bound GPU run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_folder(folder: Path, images: int, seed: int = 0) -> Path:
    """ImageNet-sized JPEGs in class folders: random crops of the built-in set's photos."""
    from PIL import Image

    from trainer.data.builtin import SOURCES, skimage_data_dir

    if (folder / "DONE").exists():
        return folder
    rng = random.Random(seed)
    photos = [(cls, Image.open(os.path.join(skimage_data_dir(), f)).convert("RGB")) for f, cls in SOURCES.items()]
    for k in range(images):
        cls, photo = photos[k % len(photos)]
        w, h = (500, 375) if rng.random() < 0.7 else (375, 500)
        scale = rng.uniform(0.6, 1.0)
        cw, ch = int(photo.width * scale), int(photo.height * scale)
        x0, y0 = rng.randint(0, photo.width - cw), rng.randint(0, photo.height - ch)
        out = folder / "train" / cls
        out.mkdir(parents=True, exist_ok=True)
        photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.BILINEAR).save(out / f"{k:05d}.jpg", quality=90)
    for cls, _ in photos:  # a validation folder, as data=imagefolder expects train/ and val/ together
        (folder / "val" / cls).mkdir(parents=True, exist_ok=True)
        os.link(next((folder / "train" / cls).iterdir()), folder / "val" / cls / "0.jpg")
    (folder / "DONE").touch()
    return folder


def product_batches(folder: Path, overrides: str, size: int, batch: int):
    from trainer.config.compose import compose_for_run
    from trainer.data import ImageDataModule

    args = [
        "data=imagefolder",
        f"data.root={folder}",
        f"data.image_size={size}",
        f"data.batch_size={batch}",
        "data.crop_min_scale=0.08",
        "data.num_workers=0",
        *shlex.split(overrides),
    ]
    cfg = compose_for_run(args)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    epoch = 0
    while True:
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch) if hasattr(loader.sampler, "set_epoch") else None
        yield from (x for x, _ in loader)
        epoch += 1


def torchvision_batches(folder: Path, size: int, batch: int):
    import torch
    from PIL import Image
    from torchvision.transforms import v2

    files = sorted(str(p) for p in (folder / "train").rglob("*.jpg"))
    transform = v2.Compose(
        [v2.RandomResizedCrop(size, scale=(0.08, 1.0), antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor()]
    )
    while True:
        random.shuffle(files)
        for start in range(0, len(files) - batch + 1, batch):
            images = []
            for path in files[start : start + batch]:
                with Image.open(path) as im:
                    images.append(transform(im.convert("RGB")))
            yield torch.stack(images)


def dali_batches(folder: Path, size: int, batch: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=0, prefetch_queue_depth=1)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=str(folder / "train"), random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3]
        )
        images = fn.resize(images, resize_x=size, resize_y=size, antialias=True)
        return fn.flip(images, horizontal=fn.random.coin_flip())

    p = pipe()
    p.build()
    while True:
        (out,) = p.run()
        yield out.as_array()


def rate(batches, count: int) -> float:
    n, start = 0, time.perf_counter()
    for _ in range(count):
        n += len(next(batches))
    return n / (time.perf_counter() - start)


def cpu_kind() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
        name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    except OSError:
        name = platform.processor()
    kind = (
        "AVX512-BF16"
        if "avx512_bf16" in flags
        else "AVX512"
        if "avx512f" in flags
        else "AVX2"
        if "avx2" in flags
        else "other"
    )
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        kind += f" (ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']})"
    return f"{name}, {kind}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--folder", type=Path, help="where the JPEGs are made (kept); default a temp folder")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=6, help="timed batches per pipeline and repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--core", type=int, default=None, help="the core to pin to (default: the last one allowed)")
    p.add_argument(
        "--product",
        action="append",
        help='overrides of one product row (repeatable; default: its defaults, and "data.decoder=turbo data.gpu_normalize=true")',
    )
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--save",
        action="store_true",
        help="keep the decoders' and DALI's rates as this machine's, where the doctor reads them (trainer.measure.loader_rates)",
    )
    args = p.parse_args(argv)

    import torch

    core = args.core if args.core is not None else sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    folder = make_folder(args.folder or Path(tempfile.mkdtemp(prefix="jpegs-")), args.images)
    rows = {
        f"product: {o or 'defaults'}": o for o in (args.product or ["", "data.decoder=turbo data.gpu_normalize=true"])
    }
    pipelines = {name: product_batches(folder, o, args.size, args.batch) for name, o in rows.items()}
    pipelines["torchvision (by hand)"] = torchvision_batches(folder, args.size, args.batch)
    try:
        import nvidia.dali  # noqa: F401

        pipelines["dali (cpu)"] = dali_batches(folder, args.size, args.batch)
    except ImportError:
        print("note: NVIDIA DALI is not installed: no dali row")
    names = list(pipelines)
    for name in names:  # warm-up: page cache, lazy imports, DALI's first run
        rate(pipelines[name], 2)
    rates = {name: [] for name in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            rates[name].append(rate(pipelines[name], args.batches))
        print(f"repeat {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}" for n in names), flush=True)
    medians = {n: statistics.median(v) for n, v in rates.items()}
    print(f"\nimages per core-second ({args.size} px crops of ~500 x 375 JPEGs, one core, {cpu_kind()}):")
    for n in names:
        print(f"  {n:55s} {medians[n]:7.0f}  (min-max {min(rates[n]):.0f}-{max(rates[n]):.0f})")
    for ref in ("dali (cpu)", "torchvision (by hand)"):
        if ref in medians:
            print(f"  against {ref}: " + ", ".join(f"{n} {medians[n] / medians[ref]:.2f}x" for n in names if n != ref))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "what": "images per core-second of the input pipeline alone (scripts/bench_loader_per_core.py)",
                    "cpu": cpu_kind(),
                    "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "settings": {k: str(v) for k, v in vars(args).items() if k != "out"},
                    "rates": rates,
                    "medians": medians,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {args.out}")
    if args.save:
        from trainer.measure import loader_rates

        per_core = {row_loader(rows[n]): medians[n] for n in rows if row_loader(rows[n])}
        if "dali (cpu)" in medians:
            per_core["dali"] = medians["dali (cpu)"]
        print(f"kept {per_core} in {loader_rates.save(per_core, args.size)}")
    return 0


def row_loader(overrides: str):
    """The decoder a product row measures alone (``pil``, ``turbo``, ...), or None for a row that changes
    more than the decoder (its rate is not the decoder's)."""
    keys = dict(o.split("=", 1) for o in shlex.split(overrides))
    keys.pop("data.gpu_normalize", None) if keys.get("data.gpu_normalize") == "true" else None
    if set(keys) - {"data.decoder"}:
        return None
    return keys.get("data.decoder", "pil")


if __name__ == "__main__":
    sys.exit(main())
