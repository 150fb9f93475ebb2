"""``data=packed``: train from a ``python -m trainer.pack`` array (pre-resized uint8 pixels, memory-mapped).

A sample is a memory read: no file open, no decode, no resize. Augmentation (random crop with
padding, horizontal flip) and normalization run on the uint8 tensor; with ``data.gpu_normalize``
the sample stays uint8 and the conversion happens on the device. Map-style, so shuffling is
global and DistributedSampler/loader workers split it exactly.
"""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

import torch
from torch.utils.data import Dataset, Subset

from ..errors import ConfigError
from .gpu_transforms import normalize_uint8


class PackedImages(Dataset):
    def __init__(self, root: str, image_size: int, train: bool, augment: bool, keep_uint8: bool):
        import numpy as np

        meta_path = os.path.join(root, "meta.json")
        if not os.path.isfile(meta_path):
            raise ConfigError(f"'data.root' ({root}) is not a packed dataset (no meta.json). Create one with: python -m trainer.pack SRC {root}")
        self.meta = json.load(open(meta_path))
        self.images = np.load(os.path.join(root, "images.npy"), mmap_mode="r")
        self.labels = np.load(os.path.join(root, "labels.npy"))
        self.size = self.meta["size"]
        self.image_size = image_size
        self.train, self.augment, self.keep_uint8 = train, augment, keep_uint8

    @property
    def classes(self):
        return self.meta["classes"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        x = torch.from_numpy(self.images[index].copy()).permute(2, 0, 1)  # uint8 CHW
        if self.train and self.augment:
            pad = max(1, self.size // 8)
            x = torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="reflect" if x.dtype.is_floating_point else "constant")
            i, j = torch.randint(0, 2 * pad + 1, (2,)).tolist()
            x = x[:, i : i + self.size, j : j + self.size]
            if torch.rand(()) < 0.5:
                x = x.flip(2)
        if self.image_size != self.size:
            x = torch.nn.functional.interpolate(x[None].float(), size=(self.image_size, self.image_size), mode="bilinear", antialias=True)[0]
            x = x.round().clamp(0, 255).to(torch.uint8)
        if not self.keep_uint8:
            x = normalize_uint8(x[None])[0]
        return x, int(self.labels[index])


def build_packed(root: str, image_size: int, augment: bool, val_split: float, seed: int, keep_uint8: bool) -> Tuple[Dataset, Optional[Dataset], list]:
    if not root or not os.path.isdir(os.path.expanduser(root)):
        raise ConfigError(f"'data.root' ({root}) does not exist. data=packed needs a folder made by: python -m trainer.pack SRC DST")
    root = os.path.expanduser(root)
    if os.path.isfile(os.path.join(root, "train", "meta.json")):
        train = PackedImages(os.path.join(root, "train"), image_size, True, augment, keep_uint8)
        val_dir = os.path.join(root, "val")
        val = PackedImages(val_dir, image_size, False, augment, keep_uint8) if os.path.isfile(os.path.join(val_dir, "meta.json")) else None
        return train, val, train.classes
    train_all = PackedImages(root, image_size, True, augment, keep_uint8)
    if val_split <= 0:
        return train_all, None, train_all.classes
    val_all = PackedImages(root, image_size, False, augment, keep_uint8)
    perm = torch.randperm(len(train_all), generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = int(round(len(perm) * val_split))
    return Subset(train_all, sorted(perm[n_val:])), Subset(val_all, sorted(perm[:n_val])), train_all.classes
