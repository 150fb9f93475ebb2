"""``python -m trainer.pack SRC DST``: convert an image folder into one packed, pre-resized uint8 array.

Why: decoding a JPEG and resizing it costs far more CPU than training a small model on it. For
datasets of small images, decoding once and storing fixed-size uint8 pixels in a memory-mapped
array (``images.u8``, N x H x W x 3) turns every later epoch's input pipeline into a memory read:
no decode, no resize, page-cache friendly, random access (so shuffling is global, not per shard),
and a map-style dataset, so Lightning's DistributedSampler and the DataLoader's workers split it
with no sample seen twice or skipped. ``data=packed data.root=DST`` trains from it.

    python -m trainer.pack ~/data/imagenette/train packed/imagenette-64 --size 64

Layout of DST: ``images.npy`` (uint8, N x H x W x 3, opened memory-mapped), ``labels.npy``
(int64), ``meta.json`` (count, size, classes, source, a checksum of the arrays). Written to a temp
dir, then renamed, so an interrupted pack leaves nothing half-written behind. For a dataset with
train/ and val/ folders, pack each: ``SRC/train DST/train`` and ``SRC/val DST/val``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

FORMAT = 1


def pack(src: str, dst: str, size: int) -> dict:
    import numpy as np
    from PIL import Image
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(src)
    if not len(dataset):
        raise SystemExit(f"error: no images found in {src} (expected {src}/<class>/<image>)")
    dst_path = Path(dst)
    if (dst_path / "meta.json").exists():
        raise SystemExit(f"error: {dst} already holds a packed dataset; remove it first (nothing was changed)")
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pack-", dir=dst_path.parent))
    try:
        n = len(dataset)
        images = np.lib.format.open_memmap(tmp / "images.npy", mode="w+", dtype=np.uint8, shape=(n, size, size, 3))
        labels = np.empty(n, dtype=np.int64)
        for i, (path, label) in enumerate(dataset.samples):
            with Image.open(path) as im:
                im = im.convert("RGB")
                # resize the short side, then center-crop: the same framing as the val transform
                scale = size / min(im.size)
                im = im.resize((max(size, round(im.width * scale)), max(size, round(im.height * scale))), Image.BILINEAR)
                left, top = (im.width - size) // 2, (im.height - size) // 2
                images[i] = np.asarray(im.crop((left, top, left + size, top + size)))
            labels[i] = label
        images.flush()
        np.save(tmp / "labels.npy", labels)
        digest = hashlib.sha256()
        for name in ("images.npy", "labels.npy"):
            with open(tmp / name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        meta = {"format": FORMAT, "count": n, "size": size, "classes": dataset.classes, "source": os.path.abspath(src), "sha256": digest.hexdigest()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if dst_path.exists():  # an empty or interrupted earlier attempt (a finished one was refused above)
            shutil.rmtree(dst_path)
        os.replace(tmp, dst_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="an image folder: SRC/<class>/<image>")
    parser.add_argument("dst", help="where to write the packed dataset")
    parser.add_argument("--size", type=int, default=64, help="pixels per side (images are resized and center-cropped)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.src):
        print(f"error: {args.src} is not a folder", file=sys.stderr)
        return 2
    meta = pack(args.src, args.dst, args.size)
    print(f"packed {meta['count']} images of {len(meta['classes'])} classes at {meta['size']}px into {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
