"""Real image folders (JPEG, PNG, WebP, BMP, TIFF, ...) in torchvision's ImageFolder layout, split into train and val.

``root`` holds either ``train/`` and ``val/`` (or ``validation/``) subfolders, each with one folder
per class, or the class folders directly. Without a val folder, ``val_split`` of each class is held
out (seeded, so the split is the same in every run). ``trainer.data.layout`` says which folders
are splits and which are classes (hidden folders are skipped), the same for every format.
"""

from __future__ import annotations

import collections
import math
import os
import threading
from typing import Optional, Tuple

import torch
from torch.utils.data import Subset, default_collate
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2

from trainer.data.augment import CROP_RATIO, Augmentation, transforms_for
from trainer.data.decoders import DECODE_ERRORS, Loader, undecodable
from trainer.data.device_decode import BytesLoader
from trainer.data.layout import class_folders, find_class_folders, split_folders, walk
from trainer.data.storage import explain, is_remote, local_path, open_root
from trainer.errors import ConfigError, TrainingStopped

IMAGE_FILES = ", ".join(IMG_EXTENSIONS)  # what ImageFolder takes (and so every decoder: trainer.data.decoders)
CROP_SCALE = Augmentation().crop_scale  # RandomResizedCrop's range of area fractions (data.crop_min_scale's default)
VAL_RESIZE = (
    Augmentation().eval_resize_ratio
)  # validation: the short side resized to this x its size (data.eval_resize_ratio)


def crop_side_fraction(scale, ratio) -> float:
    """The smallest short side of a RandomResizedCrop crop, as a fraction of the image's short side.

    torchvision draws an area fraction s from ``scale`` and an aspect ratio r from ``ratio`` and
    takes a crop of w = sqrt(s A r) by h = sqrt(s A / r), A the image's area: its short side is
    sqrt(s A min(r, 1/r)), smallest at the least area and the most extreme ratio, and A is at
    least the short side squared (a square image is the worst case). With (0.35, 1) and (3/4, 4/3)
    that is 0.51 of the image's short side, not the 0.59 the area alone gives. When ten draws do
    not fit, it falls back to a center crop of the whole image clamped to the ratio range, whose
    short side is the image's (or 1/r0, r1 of it for a range that leaves out 1).
    """
    r0, r1 = ratio
    drawn = math.sqrt(scale[0] * min(r0, 1 / r0, r1, 1 / r1))
    return min(drawn, 1.0, 1 / r0, r1)


def needed_side(image_size: int, scale=CROP_SCALE, ratio=CROP_RATIO, val_side: Optional[int] = None) -> int:
    """The short side a decoded image needs so that neither transform upsamples: the smallest training
    crop (``crop_side_fraction`` of the side; ``scale=None`` where training does not crop) and
    validation's resize (``val_side``; None: ``VAL_RESIZE`` x image_size). data.decode_scale=auto
    decodes no smaller."""
    val = val_side if val_side is not None else int(round(image_size * VAL_RESIZE))
    if scale is None:
        return val
    return max(math.ceil(image_size / crop_side_fraction(scale, ratio)), val)


def crop_range(transform):
    """(scale, ratio) of the RandomResizedCrop in a transform as built, (None, None) without one:
    what needed_side must cover is what the transform really draws."""
    for step in getattr(transform, "transforms", [transform]):
        if isinstance(step, v2.RandomResizedCrop):
            return tuple(step.scale), tuple(step.ratio)
    return None, None


def decode_min_side(decode_scale: str, image_size: int, augment, keep_uint8: bool = False) -> Optional[int]:
    """data.decode_scale: the short side the decoder may reduce a JPEG to (None: full size), the same
    for every format that decodes encoded images (image folders, Parquet, WebDataset shards).
    ``augment``: an Augmentation (or data.augment's bool)."""
    if decode_scale != "auto":
        return None
    augment = Augmentation.coerce(augment)
    val_side = max(augment.eval_resize(image_size), int(round(image_size * augment.eval_resize_ratio)))
    return needed_side(
        image_size, *crop_range(transforms_for(image_size, True, augment, keep_uint8)), val_side=val_side
    )


def _no_transform(*args, **kwargs):
    return None


class _SkippedFiles(threading.local):
    """The files this thread's image folder skipped since its last batch was collated (the last few).

    A skipped sample reaches the collate as None (the convention every loader's collate shares), so
    the stop for a batch of nothing else names its files from here: a batch's samples are read and
    collated one after the other in the same thread (a loader worker, or the main process)."""

    def __init__(self) -> None:
        self.paths = collections.deque(maxlen=3)


_skipped = _SkippedFiles()


def _safe_image_folder_class():
    class SafeImageFolder(ImageFolder):
        """ImageFolder that turns an undecodable file into a clear stop, or a skipped sample.

        ``on_bad_sample=skip`` returns None for the sample; ``skip_none_collate`` drops it from the
        batch and ``BadSampleCounter`` counts the short batches. Hidden folders are not classes
        (``layout.is_class_folder``).
        """

        on_bad_sample = "skip"
        find_classes = staticmethod(find_class_folders)

        def __getitem__(self, index):
            try:
                return super().__getitem__(index)
            except DECODE_ERRORS as e:
                path = self.samples[index][0]
                _skipped.paths.append(path)
                return undecodable(self.on_bad_sample, path, f"{type(e).__name__}: {e}")

    return SafeImageFolder


def skip_none_collate(batch):
    """default_collate of the samples that decoded: ``data.on_bad_sample=skip`` left None for the others.

    A batch with none left stops the run (TrainingStopped, naming its files), as ``data.decoder=nvjpeg``
    stops: an empty batch cannot be trained or validated (default_collate fails on it), and skipping it
    would leave this rank one step short of the others, which DDP waits for without end.
    """
    skipped = list(_skipped.paths)[-len(batch) :]
    _skipped.paths.clear()
    kept = [b for b in batch if b is not None]
    if not kept:
        more = f" and {len(batch) - len(skipped)} more" if skipped and len(batch) > len(skipped) else ""
        named = ", ".join(skipped) + more if skipped else "a warning above names each"
        raise TrainingStopped(
            f"no image of a batch of {len(batch)} could be decoded ({named}): data.on_bad_sample=skip drops a bad "
            "image from its batch, but a batch needs at least one image that decodes. Remove or replace the files "
            "that do not decode."
        )
    return default_collate(kept)


def check_layout(path: str, key: str) -> None:
    """What ImageFolder would take silently but trains wrong: symlink loops, one class, loose images.

    ImageFolder walks class folders following symlinks, so a link back up the tree repeats the
    same images again and again; a single class folder trains a model that cannot be wrong; images
    directly in DIR are not a class. Hidden folders are skipped, not classes (``layout``): warned here.
    """
    entries = list(os.scandir(path))
    classes = class_folders((e.name for e in entries if e.is_dir()), where=f"'{key}' ({path})")
    loose = [e.name for e in entries if e.is_file() and e.name.lower().endswith(IMG_EXTENSIONS)]
    if loose and not classes:
        raise ConfigError(
            f"'{key}' ({path}) holds images ({loose[0]}, ...) but no class folders: the label of an image is the name of "
            "the folder it is in. Put them in one folder per class: DIR/<class>/<image>."
        )
    if len(classes) == 1:
        raise ConfigError(
            f"'{key}' ({path}) holds one class folder ({classes[0]}): a classifier needs at least 2 classes, "
            "one folder each (DIR/<class>/<image>)."
        )
    for _ in walk(path, key):  # refuses a symlink loop
        pass


def _image_folder(path: str, transform, key: str, on_bad_sample: str = "skip", loader=None):
    try:
        dataset = _safe_image_folder_class()(path, transform=transform, **({"loader": loader} if loader else {}))
        dataset.on_bad_sample = on_bad_sample
        return dataset
    except (FileNotFoundError, RuntimeError) as e:
        raise ConfigError(
            f"'{key}' points at {path}, which holds no images in class folders ({e}). "
            "Expected DIR/<class>/<image>.jpg, or DIR/train/<class>/... and DIR/val/<class>/...; "
            f"images may be {IMAGE_FILES}."
        ) from None


def _remote_image_folder(fs, path: str, transform, key: str, on_bad_sample: str, loader, root: str):
    """An image folder in an object store: the same classes, order and split as a local copy of it."""
    base = _safe_image_folder_class()

    class RemoteImageFolder(base):
        def find_classes(self, directory):
            try:
                entries = fs.ls(directory, detail=True)
            except Exception as e:  # noqa: BLE001
                raise explain(e, root, key) from None
            names = (e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory")
            classes = class_folders(names, where=f"'{key}' ({directory})")
            loose = [
                e["name"] for e in entries if e["type"] != "directory" and e["name"].lower().endswith(IMG_EXTENSIONS)
            ]
            if loose and not classes:
                raise ConfigError(
                    f"'{key}' ({root}) holds images ({loose[0]}, ...) but no class folders: the label of an image is the name of the folder it is in."
                )
            if len(classes) == 1:
                raise ConfigError(
                    f"'{key}' ({root}) holds one class folder ({classes[0]}): a classifier needs at least 2 classes, one folder each."
                )
            return classes, {c: i for i, c in enumerate(classes)}

        def make_dataset(self, directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
            samples = []
            for cls in sorted(class_to_idx):
                try:
                    # ImageFolder's order: folder by folder (sorted by path), each folder's files sorted; a
                    # sort of whole paths put a class's subfolders among its files, and so moved the split
                    files = sorted(fs.find(f"{directory}/{cls}"), key=lambda f: tuple(f.rsplit("/", 1)))
                except Exception as e:  # noqa: BLE001
                    raise explain(e, root, key) from None
                samples += [(f, class_to_idx[cls]) for f in files if f.lower().endswith(IMG_EXTENSIONS)]
            if not samples:
                raise ConfigError(f"'{key}' ({root}) holds no images in its class folders ({IMAGE_FILES}).")
            return samples

    dataset = RemoteImageFolder(path, transform=transform, loader=loader)
    dataset.on_bad_sample = on_bad_sample
    return dataset


class _LocalFolders:
    """Class-folder trees on this machine's disk (or a mounted one)."""

    fs = None

    def __init__(self, root: str, key: str, on_bad_sample: str) -> None:
        self.base, self.key, self.on_bad_sample = local_path(root), key, on_bad_sample
        if not os.path.isdir(self.base):
            raise ConfigError(
                f"'{key}' points at {self.base}, which does not exist or is not a folder. Set {key}=DIR to a folder of class subfolders of images."
            )

    def check(self, path: str) -> None:
        check_layout(path, self.key)

    def make(self, path: str, transform, loader):
        return _image_folder(path, transform, self.key, self.on_bad_sample, loader)


class _RemoteFolders:
    """Class-folder trees in an object store (an fsspec URL), read file by file."""

    def __init__(self, root: str, storage_options, key: str, on_bad_sample: str) -> None:
        self.fs, self.base = open_root(root, storage_options, key)
        self.root, self.key, self.on_bad_sample = root, key, on_bad_sample

    def check(self, path: str) -> None:
        pass  # no symlinks in an object store; the class checks run in find_classes

    def make(self, path: str, transform, loader):
        return _remote_image_folder(self.fs, path, transform, self.key, self.on_bad_sample, loader, self.root)


def build_image_folders(
    root: str,
    image_size: int,
    augment,
    val_split: float,
    seed: int,
    key: str = "data.root",
    on_bad_sample: str = "skip",
    decoder: str = "pil",
    cache_in_memory: bool = False,
    keep_uint8: bool = False,
    storage_options=None,
    decode_scale: str = "off",
) -> Tuple:
    """Return (train_dataset, val_dataset or None, class_names).

    ``root`` is a local folder or an fsspec URL (read directly, file by file). With
    ``decoder="nvjpeg"`` the datasets deliver encoded files and no transform runs in the loader:
    ``device_decode`` decodes and transforms each batch on the device.
    """
    if not root:
        raise ConfigError(
            f"'{key}' is not set. data=imagefolder needs data.root=DIR, a folder of class subfolders of images."
        )
    if is_remote(root):
        tree = _RemoteFolders(root, storage_options, key, on_bad_sample)
    else:
        tree = _LocalFolders(root, key, on_bad_sample)
    if decoder == "nvjpeg":
        loader, make_transform = BytesLoader(cache_in_memory, fs=tree.fs), _no_transform
    else:
        min_side = decode_min_side(decode_scale, image_size, augment, keep_uint8)
        loader, make_transform = Loader(decoder, cache_in_memory, fs=tree.fs, min_side=min_side), transforms_for

    def make(path: str, train: bool):
        return tree.make(path, make_transform(image_size, train, augment, keep_uint8), loader)

    train_dir, val_dir = split_folders(tree.base, tree.fs) or (tree.base, None)
    tree.check(train_dir)  # once: the train and val views below read the same folder
    train = make(train_dir, True)
    if val_dir is not None:
        tree.check(val_dir)
        val = make(val_dir, False)
        if val.classes != train.classes:
            raise ConfigError(f"'{key}': {train_dir} and {val_dir} have different class folders; they must match.")
        return train, val, train.classes
    if val_split <= 0:
        return train, None, train.classes
    train_idx, val_idx = split_per_class(train.targets, val_split, seed)
    return Subset(train, train_idx), Subset(make(train_dir, False), val_idx), train.classes


def split_per_class(targets, val_split: float, seed: int):
    """(train indices, val indices), both sorted: ``val_split`` of each class held out, seeded.

    A per-class split keeps every class in both halves. ``python -m trainer.pack`` (Parquet and
    WebDataset shards) and ``data=packed`` split with it too, over the same samples in the same
    order, so every format holds out the image folder's val images.
    """
    g = torch.Generator().manual_seed(seed)
    by_class: dict = {}
    for idx, target in enumerate(targets):
        by_class.setdefault(target, []).append(idx)
    train_idx, val_idx = [], []
    for idxs in by_class.values():
        perm = [idxs[i] for i in torch.randperm(len(idxs), generator=g).tolist()]
        n_val = int(round(len(perm) * val_split)) if len(perm) > 1 else 0
        val_idx += perm[:n_val]
        train_idx += perm[n_val:]
    return sorted(train_idx), sorted(val_idx)
