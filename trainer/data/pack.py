"""``python -m trainer.pack SRC DST [--format npy|parquet|webdataset]``: convert an image folder into a packed dataset.

``--format npy`` (the default) writes one pre-resized uint8 array; ``parquet`` and ``webdataset``
keep each image's encoded file as it is and write shards (Parquet files of row groups, or tar
shards) for data that is too big for one array; see the end of this docstring.

Why: decoding a JPEG and resizing it costs far more CPU than training a small model on it. For
datasets of small images, decoding once and storing fixed-size uint8 pixels in a memory-mapped
array (``images.u8``, N x H x W x 3) turns every later epoch's input pipeline into a memory read:
no decode, no resize, page-cache friendly, random access (so shuffling is global, not per shard),
and a map-style dataset, so Lightning's DistributedSampler and the DataLoader's workers split it
with no sample seen twice or skipped. ``data=packed data.root=DST`` trains from it.

    python -m trainer.pack ~/data/imagenette packed/imagenette-64 --size 64

Layout of DST: ``images.npy`` (uint8, N x H x W x 3, opened memory-mapped), ``labels.npy``
(int64), ``meta.json`` (count, size, classes, source, a checksum of the arrays). A source laid out
as ``SRC/train/<class>`` and ``SRC/val/<class>`` (or ``validation/``) keeps its split: ``DST/train``
and ``DST/val``, with the val labels numbered by the train classes. Without a val split, the whole
of it is packed and ``data=packed`` holds out ``data.val_split`` of each class when it trains, the
images ``data=imagefolder`` holds out. The source's folders are read as ``trainer.data.layout``
says, the same for every format (hidden folders are not classes).

``--format parquet``: ``DST/train/train-00000-of-0000N.parquet`` (and ``DST/val/...``), columns
``image`` (struct of the file's ``bytes`` and its ``path``) and ``label`` (int64), class names in the
``huggingface`` schema metadata: Hugging Face's own layout, so ``datasets`` reads it too.
``--format webdataset``: ``DST/train/shard-000000.tar`` (``<key>.jpg`` + ``<key>.cls`` per sample,
written by WebDataset's TarWriter) and ``DST/train.json``, the ``wids`` index (shards and their
sample counts, plus the class names). For both, samples are written in a seeded shuffled order
(shards mix classes), ``--shard-samples`` per file, and a source with no val folder (class folders,
or ``SRC/train/`` alone) is split per class with ``--val-split`` and ``--seed``: the same rule and
defaults as ``data=imagefolder``, so the val images are the ones the image folder validates on.

It never destroys what it did not create: DST must not exist or be an empty folder, and may not be
SRC or lie inside it. Everything is written to a temp dir beside DST (marked as ours, with our
PID), then renamed into place, so an interrupted pack leaves no half-written DST; the only thing a
later pack removes is such a temp dir whose packing process is gone.

why longer: one command with three output formats that share the source walk, the split and the
all-or-nothing write; each format's writer is a short function.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from trainer.data.layout import find_class_folders, split_folders
from trainer.measure.sysstats import process_alive

FORMAT = 1
TEMP_PREFIX = ".pack-"
MARKER = ".trainer-pack-in-progress"  # inside our temp dir: "host pid" of the packing process


class PackError(Exception):
    """Bad input for pack: the message is the whole answer (no traceback)."""


def check_destination(src: Path, dst: Path) -> None:
    """Refuse anything that could overwrite or delete what the user has."""
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r or src_r in dst_r.parents:
        raise PackError(
            f"DST ({dst}) is {'SRC itself' if dst_r == src_r else 'inside SRC'} ({src}): "
            "packing would mix its output into the images it reads. Choose a DST outside SRC."
        )
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise PackError(f"DST ({dst}) exists and is not a folder; nothing was changed. Choose a new path.")
    if dst.is_dir() and any(dst.iterdir()):
        what = "a packed dataset" if (dst / "meta.json").exists() or (dst / "train" / "meta.json").exists() else "files"
        raise PackError(
            f"DST ({dst}) already holds {what}; pack writes only to a new or empty folder, "
            "and nothing was changed. Choose a new path, or remove it yourself first."
        )


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Temp dirs of earlier packs that were killed: ours (marker inside) and their process is gone."""
    for tmp in parent.glob(TEMP_PREFIX + "*"):
        marker = tmp / MARKER
        try:
            host, pid = marker.read_text().split()
            pid = int(pid)
        except (OSError, ValueError):
            continue  # not ours (no readable marker): never touched
        if host == socket.gethostname() and not process_alive(pid):  # another host's pack may still be running
            shutil.rmtree(tmp, ignore_errors=True)


def _image_folder(path: Path):
    """torchvision's ImageFolder of ``path``, its classes found as every format finds them (hidden folders
    skipped: ``trainer.data.layout``); no images is a PackError."""
    from torchvision.datasets import ImageFolder  # lazy: keeps torch out of python -m trainer.pack's start-up

    class ClassFolders(ImageFolder):
        def find_classes(self, directory):
            return find_class_folders(directory, warn=True)

    try:
        dataset = ClassFolders(str(path))
    except (FileNotFoundError, OSError) as e:
        raise PackError(f"no images found in {path} (expected {path}/<class>/<image>): {e}") from None
    if not len(dataset):
        raise PackError(f"no images found in {path} (expected {path}/<class>/<image>)")
    return dataset


def _numbered_as_train(classes, class_to_idx: Dict[str, int], path: Path) -> list:
    """A val folder's class index -> the train split's index of the same class (every val class must be a train class)."""
    unknown = [c for c in classes if c not in class_to_idx]
    if unknown:
        raise PackError(
            f"{path} has classes that the train split does not: {', '.join(unknown[:5])}. The val classes must be train classes."
        )
    return [class_to_idx[c] for c in classes]


def _pack_one(src: Path, out: Path, size: int, class_to_idx: Optional[Dict[str, int]] = None) -> dict:
    """Pack one class-folder tree into ``out`` (a new folder inside our temp dir)."""
    # lazy: keeps numpy and PIL out of python -m trainer.pack's start-up
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    from trainer.data.decoders import eight_bit_grey  # lazy, as above (torch: the image folder's already)

    dataset = _image_folder(src)
    classes = dataset.classes
    targets = list(range(len(classes)))
    if class_to_idx is not None:  # val: number classes as train does
        targets = _numbered_as_train(classes, class_to_idx, src)
        classes = sorted(class_to_idx, key=class_to_idx.get)
    out.mkdir(parents=True)
    n = len(dataset)
    images = np.lib.format.open_memmap(out / "images.npy", mode="w+", dtype=np.uint8, shape=(n, size, size, 3))
    labels = np.empty(n, dtype=np.int64)
    for i, (path, label) in enumerate(dataset.samples):
        try:
            with Image.open(path) as im:
                im = eight_bit_grey(im).convert("RGB")  # a 16-bit grey PNG: its high bytes, as every decoder
                # resize the short side, then center-crop: the same framing as the val transform
                scale = size / min(im.size)
                im = im.resize(
                    (max(size, round(im.width * scale)), max(size, round(im.height * scale))), Image.BILINEAR
                )
                left, top = (im.width - size) // 2, (im.height - size) // 2
                images[i] = np.asarray(im.crop((left, top, left + size, top + size)))
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise PackError(
                f"cannot decode {path}: {e}. Remove or replace the file and pack again (nothing was written to DST)."
            ) from None
        labels[i] = targets[label]
    images.flush()
    del images
    np.save(out / "labels.npy", labels)
    digest = hashlib.sha256()
    for name in ("images.npy", "labels.npy"):
        with open(out / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    meta = {
        "format": FORMAT,
        "count": n,
        "size": size,
        "classes": classes,
        "source": os.path.abspath(src),
        "sha256": digest.hexdigest(),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _samples(src: Path, layout, val_split: float, seed: int):
    """(classes, {"train": [(path, label)], "val": [...]}) of an image folder, split as data=imagefolder splits it
    (``layout``: its ``split_folders``)."""
    from trainer.data.folder import split_per_class  # lazy: keeps torch out of python -m trainer.pack's start-up

    train_dir, val_dir = layout or (str(src), None)
    if val_dir is not None:
        train, val = _image_folder(Path(train_dir)), _image_folder(Path(val_dir))
        targets = _numbered_as_train(val.classes, train.class_to_idx, Path(val_dir))
        return train.classes, {"train": list(train.samples), "val": [(p, targets[t]) for p, t in val.samples]}
    full = _image_folder(Path(train_dir))
    train_idx, val_idx = split_per_class(full.targets, val_split, seed)
    splits = {"train": [full.samples[i] for i in train_idx]}
    if val_idx:
        splits["val"] = [full.samples[i] for i in val_idx]
    return full.classes, splits


def _read_checked(path: str) -> bytes:
    """The file's bytes, once PIL has checked that they are an image (a corrupt file stops the pack)."""
    from PIL import Image, UnidentifiedImageError  # lazy: keeps PIL out of python -m trainer.pack's start-up

    data = Path(path).read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise PackError(
            f"cannot decode {path}: {e}. Remove or replace the file and pack again (nothing was written to DST)."
        ) from None
    return data


def _write_shards(
    fmt: str, classes, splits, out: Path, shard_samples: int, group_rows: int, seed: int, src: Path
) -> dict:
    out.mkdir(parents=True)
    counts = {}
    for split, samples in splits.items():
        order = list(samples)
        random.Random(seed).shuffle(order)  # shards mix classes, as published datasets do
        chunks = [order[i : i + shard_samples] for i in range(0, len(order), shard_samples)]
        (out / split).mkdir()
        shardlist = []
        for n, chunk in enumerate(chunks):
            if fmt == "parquet":
                path = out / split / f"{split}-{n:05d}-of-{len(chunks):05d}.parquet"
                _write_parquet(path, chunk, classes, group_rows, src)
            else:
                path = out / split / f"shard-{n:06d}.tar"
                _write_tar(path, chunk, n * shard_samples)
                shardlist.append(
                    {"url": f"{split}/{path.name}", "nsamples": len(chunk), "filesize": path.stat().st_size}
                )
        if fmt == "webdataset":  # the wids index: WebDataset's own ShardListDataset reads it too
            index = {"wids_version": 1, "name": f"{src.name}-{split}", "shardlist": shardlist, "classes": list(classes)}
            (out / f"{split}.json").write_text(json.dumps(index, indent=1))
        counts[split] = len(samples)
    return {
        "format": fmt,
        "count": counts["train"],
        "classes": list(classes),
        "source": os.path.abspath(src),
        "splits": counts,
    }


def _write_parquet(path: Path, chunk, classes, group_rows: int, src: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PackError("--format parquet needs pyarrow: pip install pyarrow") from None
    images = [{"bytes": _read_checked(p), "path": os.path.relpath(p, src)} for p, _ in chunk]
    features = {"image": {"_type": "Image"}, "label": {"names": list(classes), "_type": "ClassLabel"}}
    schema = pa.schema(
        [("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())],
        metadata={"huggingface": json.dumps({"info": {"features": features}})},
    )
    table = pa.Table.from_pydict({"image": images, "label": [int(t) for _, t in chunk]}, schema=schema)
    pq.write_table(table, path, row_group_size=group_rows)


def _write_tar(path: Path, chunk, first_key: int) -> None:
    try:
        import webdataset as wds
    except ImportError:
        raise PackError("--format webdataset needs webdataset: pip install webdataset") from None
    with wds.TarWriter(str(path)) as sink:
        for i, (p, label) in enumerate(chunk):
            ext = Path(p).suffix.lower().lstrip(".") or "jpg"
            sink.write({"__key__": f"{first_key + i:08d}", ext: _read_checked(p), "cls": int(label)})


def pack(
    src: str,
    dst: str,
    size: int = 64,
    fmt: str = "npy",
    shard_samples: int = 1000,
    group_rows: int = 100,
    val_split: float = 0.2,
    seed: int = 42,
) -> dict:
    """Pack ``src`` into the new folder ``dst``; return its meta (for a split: train's, with ``splits``)."""
    src_path, dst_path = Path(src), Path(dst)
    if not src_path.is_dir():
        raise PackError(f"SRC ({src}) is not a folder.")
    check_destination(src_path, dst_path)
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(dst_path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=dst_path.parent))
    try:
        (tmp / MARKER).write_text(f"{socket.gethostname()} {os.getpid()}")
        staged = tmp / "data"
        layout = split_folders(str(src_path))
        if fmt != "npy":
            classes, splits = _samples(src_path, layout, val_split, seed)
            meta = _write_shards(fmt, classes, splits, staged, shard_samples, group_rows, seed, src_path)
        elif layout:
            train_dir, val_dir = layout
            meta = _pack_one(Path(train_dir), staged / "train", size)
            splits = {"train": meta["count"]}
            if val_dir is not None:  # else data=packed holds out data.val_split of DST/train, as imagefolder would
                val = _pack_one(Path(val_dir), staged / "val", size, {c: i for i, c in enumerate(meta["classes"])})
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "src", help="an image folder: SRC/<class>/<image>, or SRC/train/<class>/... and SRC/val/<class>/..."
    )
    parser.add_argument("dst", help="where to write the packed dataset: a new or empty folder outside SRC")
    parser.add_argument(
        "--format",
        choices=("npy", "parquet", "webdataset"),
        default="npy",
        help="npy: one pre-resized uint8 array (data=packed); parquet / webdataset: shards of the encoded files (data=parquet, data=webdataset)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        help="npy only: pixels per side (images are resized and center-cropped; default 64)",
    )
    parser.add_argument("--shard-samples", type=int, default=1000, help="parquet / webdataset: samples per file")
    parser.add_argument(
        "--group-rows", type=int, default=100, help="parquet: rows per row group (the unit a loader reads)"
    )
    parser.add_argument(
        "--val-split",
        type=float,
        default=0.2,
        help="parquet / webdataset, for a source with no val folder: fraction of each class held out",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=42,
        help="parquet / webdataset: the split and the shuffled order (42: data=imagefolder's default seed)",
    )
    return parser


def _problem(args) -> Optional[str]:
    """What is wrong with the arguments, in one sentence (None: nothing)."""
    problem = None
    if args.size is not None and args.format != "npy":
        problem = (
            f"--size applies to --format npy only: {args.format} keeps each image's "
            "encoded file as it is (resizing happens when training, at data.image_size)."
        )
    elif args.size is not None and args.size < 1:
        problem = f"--size must be a positive number of pixels, not {args.size}."
    elif args.shard_samples < 1 or args.group_rows < 1:
        problem = "--shard-samples and --group-rows must be positive numbers of samples."
    elif not 0.0 <= args.val_split < 1.0:
        problem = f"--val-split must be a fraction in [0, 1), not {args.val_split}."
    return problem


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    problem = _problem(args)
    if problem:
        print(f"\nerror: {problem}\n", file=sys.stderr)
        return 2
    try:
        meta = pack(
            args.src,
            args.dst,
            args.size or 64,
            args.format,
            args.shard_samples,
            args.group_rows,
            args.val_split,
            args.seed,
        )
    except PackError as e:
        print(f"\nerror: {e}\n", file=sys.stderr)
        return 2
    split = " (" + ", ".join(f"{k} {v}" for k, v in meta["splits"].items()) + ")" if "splits" in meta else ""
    count = sum(meta["splits"].values()) if "splits" in meta else meta["count"]
    what = f"at {meta['size']}px" if args.format == "npy" else f"as {args.format} shards"
    print(f"packed {count} images{split} of {len(meta['classes'])} classes {what} into {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
