"""``data=packed``: train from a ``python -m trainer.pack`` array (pre-resized uint8 pixels, memory-mapped).

A sample is a memory read: no file open, no decode, no resize. With a ``data.root`` URL (an
object store), a sample is one ranged read of its row of ``images.npy`` (or use ``data.cache`` to
copy the arrays to local disk once and memory-map them there). Augmentation (random crop with
padding, horizontal flip) and normalization run on the uint8 tensor; with ``data.gpu_normalize``
the sample stays uint8 and the conversion happens on the device. Map-style, so shuffling is
global and DistributedSampler/loader workers split it exactly.

The crop is this format's own: the image folder's RandomResizedCrop (``data.crop_min_scale``) does
not apply, and validation sees the stored square (the short side resized, then center-cropped, at
pack time) resized to the eval size. The split is the image folder's: without a packed val array,
``data.val_split`` of each class is held out with ``folder.split_per_class`` over the same images
in the same order, so the held-out images are the ones ``data=imagefolder`` holds out.
"""

from __future__ import annotations

import io
import json
import os
from typing import Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from trainer.data.augment import Augmentation, uint8_train_steps
from trainer.data.folder import split_per_class
from trainer.data.gpu_transforms import normalize_uint8
from trainer.data.layout import TRAIN_SPLIT, find_val_split
from trainer.data.storage import explain, is_remote, local_path, open_root
from trainer.errors import ConfigError


class RemoteRows:
    """``images.npy`` in an object store: row ``i`` is one ranged GET of its bytes (no download of the whole array)."""

    def __init__(self, fs, path: str) -> None:
        with fs.open(path, "rb", block_size=1 << 16) as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if fortran or dtype != np.uint8:
            raise ConfigError(f"{path} is not a packed uint8 array (python -m trainer.pack writes one).")
        self.fs, self.path, self.shape, self.dtype = fs, path, shape, dtype
        self.row = int(np.prod(shape[1:]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int):
        start = self.offset + int(i) * self.row
        try:
            data = self.fs.cat_file(self.path, start=start, end=start + self.row)
        except Exception as e:  # noqa: BLE001
            raise explain(e, self.path, "data.root") from None
        return np.frombuffer(data, dtype=np.uint8).reshape(self.shape[1:])


class PackedImages(Dataset):
    def __init__(self, root: str, image_size: int, train: bool, augment, keep_uint8: bool, fs=None):
        meta_path = f"{root}/meta.json"
        if fs is not None:
            if not fs.isfile(meta_path):
                raise ConfigError(
                    f"'data.root' ({root}) is not a packed dataset (no meta.json). Create one with: python -m trainer.pack SRC DST, then upload DST."
                )
        elif not os.path.isfile(meta_path):
            raise ConfigError(
                f"'data.root' ({root}) is not a packed dataset (no meta.json). Create one with: python -m trainer.pack SRC {root}"
            )
        try:
            if fs is not None:
                self.meta = json.loads(fs.cat_file(meta_path))
                self.images = RemoteRows(fs, f"{root}/images.npy")
                self.labels = np.load(io.BytesIO(fs.cat_file(f"{root}/labels.npy")))
            else:
                with open(meta_path) as f:
                    self.meta = json.load(f)
                self.images = np.load(os.path.join(root, "images.npy"), mmap_mode="r")
                self.labels = np.load(os.path.join(root, "labels.npy"))
            self.size = self.meta["size"]
            self.meta["classes"]
            if len(self.images) != len(self.labels):
                raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        except (FileNotFoundError, ValueError, KeyError, TypeError, EOFError) as e:
            raise ConfigError(
                f"'data.root' ({root}) is not a readable packed dataset: meta.json, images.npy or labels.npy is missing, "
                f"truncated or not what python -m trainer.pack writes ({type(e).__name__}: {str(e)[:160]}). Pack it again: "
                "python -m trainer.pack SRC DST."
            ) from None
        except OSError as e:  # there but not readable: permissions, the storage's credentials, the network
            raise ConfigError(
                f"'data.root' ({root}): its packed dataset cannot be read ({type(e).__name__}: {str(e)[:160]}). Check the "
                "path's permissions, or data.storage_options and credentials for a remote store."
            ) from None
        self.train, self.augment, self.keep_uint8 = train, Augmentation.coerce(augment), keep_uint8
        # the stored squares are resized whole: to the training size, or validation's (data.eval_image_size)
        self.image_size = image_size if train else self.augment.eval_size(image_size)
        # the policy and random erasing after this format's own crop + flip (augment.py)
        self.extra_steps = uint8_train_steps(self.augment) if train else None

    @property
    def classes(self):
        return self.meta["classes"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        x = torch.from_numpy(self.images[index].copy()).permute(2, 0, 1)  # uint8 CHW
        if self.train and self.augment.crop_flip:
            pad = max(1, self.size // 8)
            x = torch.nn.functional.pad(
                x, (pad, pad, pad, pad), mode="reflect" if x.dtype.is_floating_point else "constant"
            )
            i, j = torch.randint(0, 2 * pad + 1, (2,)).tolist()
            x = x[:, i : i + self.size, j : j + self.size]
            if torch.rand(()) < 0.5:
                x = x.flip(2)
        if self.image_size != self.size:
            x = torch.nn.functional.interpolate(
                x[None].float(), size=(self.image_size, self.image_size), mode="bilinear", antialias=True
            )[0]
            x = x.round().clamp(0, 255).to(torch.uint8)
        if self.extra_steps is not None:
            x = self.extra_steps(x)
        if not self.keep_uint8:
            x = normalize_uint8(x[None])[0]
        return x, int(self.labels[index])


def build_packed(
    root: str, image_size: int, augment, val_split: float, seed: int, keep_uint8: bool, storage_options=None
) -> Tuple[Dataset, Optional[Dataset], list]:
    fs = None
    if is_remote(root):
        fs, root = open_root(root, storage_options)
        isfile = fs.isfile
    else:
        if not root or not os.path.isdir(local_path(root)):
            raise ConfigError(
                f"'data.root' ({root}) does not exist. data=packed needs a folder made by: python -m trainer.pack SRC DST"
            )
        root, isfile = local_path(root), os.path.isfile
    train_root, val_root = _split_roots(root, isfile)
    train = PackedImages(train_root, image_size, True, augment, keep_uint8, fs)
    if val_root is not None:
        return train, PackedImages(val_root, image_size, False, augment, keep_uint8, fs), train.classes
    if val_split <= 0:
        return train, None, train.classes
    # the image folder's rule over the same images in the same order: the held-out images are imagefolder's
    train_idx, val_idx = split_per_class(train.labels.tolist(), val_split, seed)
    val = PackedImages(train_root, image_size, False, augment, keep_uint8, fs)
    return Subset(train, train_idx), Subset(val, val_idx), train.classes


def _split_roots(root: str, isfile) -> Tuple[str, Optional[str]]:
    """(training array's folder, validation's or None): ``DST/train`` and ``DST/val`` (or any of the
    split names ``trainer.data.layout`` reads) where ``trainer.pack`` kept a split, else ``DST``."""
    if not isfile(f"{root}/{TRAIN_SPLIT}/meta.json"):
        return root, None
    return f"{root}/{TRAIN_SPLIT}", find_val_split(f"{root}/{{}}", lambda folder: isfile(f"{folder}/meta.json"))
