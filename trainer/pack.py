"""``python -m trainer.pack SRC DST``: convert an image folder into one packed, pre-resized uint8 array.

Why: decoding a JPEG and resizing it costs far more CPU than training a small model on it. For
datasets of small images, decoding once and storing fixed-size uint8 pixels in a memory-mapped
array (``images.u8``, N x H x W x 3) turns every later epoch's input pipeline into a memory read:
no decode, no resize, page-cache friendly, random access (so shuffling is global, not per shard),
and a map-style dataset, so Lightning's DistributedSampler and the DataLoader's workers split it
with no sample seen twice or skipped. ``data=packed data.root=DST`` trains from it.

    python -m trainer.pack ~/data/imagenette packed/imagenette-64 --size 64

Layout of DST: ``images.npy`` (uint8, N x H x W x 3, opened memory-mapped), ``labels.npy``
(int64), ``meta.json`` (count, size, classes, source, a checksum of the arrays). A source laid out
as ``SRC/train/<class>`` and ``SRC/val/<class>`` keeps its split: ``DST/train`` and ``DST/val``,
with the val labels numbered by the train classes.

It never destroys what it did not create: DST must not exist or be an empty folder, and may not be
SRC or lie inside it. Everything is written to a temp dir beside DST (marked as ours, with our
PID), then renamed into place, so an interrupted pack leaves no half-written DST; the only thing a
later pack removes is such a temp dir whose packing process is gone.
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
from typing import Dict, Optional

FORMAT = 1
TEMP_PREFIX = ".pack-"
MARKER = ".trainer-pack-in-progress"  # inside our temp dir: "host pid" of the packing process


class PackError(Exception):
    """Bad input for pack: the message is the whole answer (no traceback)."""


def is_split_layout(src: Path) -> bool:
    """SRC/train/<class>/... (and SRC/val/<class>/... where there is one), not a class called "train"."""
    train = src / "train"
    return train.is_dir() and any(p.is_dir() for p in train.iterdir())


def check_destination(src: Path, dst: Path) -> None:
    """Refuse anything that could overwrite or delete what the user has."""
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r or src_r in dst_r.parents:
        raise PackError(f"DST ({dst}) is {'SRC itself' if dst_r == src_r else 'inside SRC'} ({src}): packing would mix its output into the images it reads. Choose a DST outside SRC.")
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise PackError(f"DST ({dst}) exists and is not a folder; nothing was changed. Choose a new path.")
    if dst.is_dir() and any(dst.iterdir()):
        what = "a packed dataset" if (dst / "meta.json").exists() or (dst / "train" / "meta.json").exists() else "files"
        raise PackError(f"DST ({dst}) already holds {what}; pack writes only to a new or empty folder, and nothing was changed. Choose a new path, or remove it yourself first.")


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Temp dirs of earlier packs that were killed: ours (marker inside) and their process is gone."""
    import socket

    for tmp in parent.glob(TEMP_PREFIX + "*"):
        marker = tmp / MARKER
        try:
            host, pid = marker.read_text().split()
            pid = int(pid)
        except (OSError, ValueError):
            continue  # not ours (no readable marker): never touched
        if host == socket.gethostname() and not _alive(pid):  # another host's pack may still be running
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pack_one(src: Path, out: Path, size: int, class_to_idx: Optional[Dict[str, int]] = None) -> dict:
    """Pack one class-folder tree into ``out`` (a new folder inside our temp dir)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError
    from torchvision.datasets import ImageFolder

    try:
        dataset = ImageFolder(str(src))
    except (FileNotFoundError, OSError) as e:
        raise PackError(f"no images found in {src} (expected {src}/<class>/<image>): {e}") from None
    if not len(dataset):
        raise PackError(f"no images found in {src} (expected {src}/<class>/<image>)")
    classes = dataset.classes
    targets = list(range(len(classes)))
    if class_to_idx is not None:  # val: number classes as train does
        unknown = [c for c in classes if c not in class_to_idx]
        if unknown:
            raise PackError(f"{src} has classes that the train split does not: {', '.join(unknown[:5])}. The val classes must be train classes.")
        targets = [class_to_idx[c] for c in classes]
        classes = sorted(class_to_idx, key=class_to_idx.get)
    out.mkdir(parents=True)
    n = len(dataset)
    images = np.lib.format.open_memmap(out / "images.npy", mode="w+", dtype=np.uint8, shape=(n, size, size, 3))
    labels = np.empty(n, dtype=np.int64)
    for i, (path, label) in enumerate(dataset.samples):
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                # resize the short side, then center-crop: the same framing as the val transform
                scale = size / min(im.size)
                im = im.resize((max(size, round(im.width * scale)), max(size, round(im.height * scale))), Image.BILINEAR)
                left, top = (im.width - size) // 2, (im.height - size) // 2
                images[i] = np.asarray(im.crop((left, top, left + size, top + size)))
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise PackError(f"cannot decode {path}: {e}. Remove or replace the file and pack again (nothing was written to DST).") from None
        labels[i] = targets[label]
    images.flush()
    del images
    np.save(out / "labels.npy", labels)
    digest = hashlib.sha256()
    for name in ("images.npy", "labels.npy"):
        with open(out / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    meta = {"format": FORMAT, "count": n, "size": size, "classes": classes, "source": os.path.abspath(src), "sha256": digest.hexdigest()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def pack(src: str, dst: str, size: int) -> dict:
    """Pack ``src`` into the new folder ``dst``; return its meta (for a split: train's, with ``splits``)."""
    src_path, dst_path = Path(src), Path(dst)
    if not src_path.is_dir():
        raise PackError(f"SRC ({src}) is not a folder.")
    check_destination(src_path, dst_path)
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(dst_path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=dst_path.parent))
    try:
        import socket

        (tmp / MARKER).write_text(f"{socket.gethostname()} {os.getpid()}")
        staged = tmp / "data"
        if is_split_layout(src_path):
            meta = _pack_one(src_path / "train", staged / "train", size)
            splits = {"train": meta["count"]}
            if (src_path / "val").is_dir():
                val = _pack_one(src_path / "val", staged / "val", size, {c: i for i, c in enumerate(meta["classes"])})
                splits["val"] = val["count"]
            meta = dict(meta, splits=splits)
        else:
            meta = _pack_one(src_path, staged, size)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o777 & ~umask)  # an ordinary folder's mode (the temp dir around it is private)
        check_destination(src_path, dst_path)  # again: nothing may have appeared there meanwhile
        try:
            if dst_path.is_dir():
                dst_path.rmdir()  # empty (checked just above): rmdir refuses anything else
            os.replace(staged, dst_path)
        except OSError as e:
            raise PackError(
                f"could not move the packed data into DST ({dst_path}): {e.strerror or e} (is DST a mount point, or on another "
                "file system than its parent?). Nothing was written to DST; pack into a new folder inside it instead."
            ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="an image folder: SRC/<class>/<image>, or SRC/train/<class>/... and SRC/val/<class>/...")
    parser.add_argument("dst", help="where to write the packed dataset: a new or empty folder outside SRC")
    parser.add_argument("--size", type=int, default=64, help="pixels per side (images are resized and center-cropped)")
    args = parser.parse_args(argv)
    if args.size < 1:
        print(f"\nerror: --size must be a positive number of pixels, not {args.size}.\n", file=sys.stderr)
        return 2
    try:
        meta = pack(args.src, args.dst, args.size)
    except PackError as e:
        print(f"\nerror: {e}\n", file=sys.stderr)
        return 2
    split = " (" + ", ".join(f"{k} {v}" for k, v in meta["splits"].items()) + ")" if "splits" in meta else ""
    count = sum(meta["splits"].values()) if "splits" in meta else meta["count"]
    print(f"packed {count} images{split} of {len(meta['classes'])} classes at {meta['size']}px into {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
