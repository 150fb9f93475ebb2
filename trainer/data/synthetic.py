"""In-memory synthetic images: no decode cost, deterministic per seed, and learnable.

Each class has a smooth random prototype; a sample is its class prototype plus per-sample noise,
so a model can reach well above chance and accuracy columns mean something even on synthetic data.
A fixed pool of distinct uint8 images is cycled through, so a full-size epoch does not need
gigabytes of RAM.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

POOL_SIZE = 1024


class SyntheticImages(Dataset):
    def __init__(self, num_samples: int, image_size: int, num_classes: int, seed: int, split: str = "train"):
        self.num_samples = num_samples
        g = torch.Generator().manual_seed(seed)
        # class prototypes: low-frequency patterns shared by train and val
        coarse = torch.rand(num_classes, 3, 4, 4, generator=g)
        protos = torch.nn.functional.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)
        g_split = torch.Generator().manual_seed(seed * 1000 + (0 if split == "train" else 1))
        pool = min(num_samples, POOL_SIZE)
        self.labels = torch.arange(pool) % num_classes
        noise = torch.randn(pool, 3, image_size, image_size, generator=g_split) * 0.25
        images = (protos[self.labels] + noise).clamp(0, 1)
        self.images = (images * 255).to(torch.uint8)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        i = index % len(self.images)
        x = self.images[i].float().div_(255.0).sub_(0.5).div_(0.25)
        return x, int(self.labels[i])
