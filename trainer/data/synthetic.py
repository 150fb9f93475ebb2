"""In-memory synthetic images: no decode cost, deterministic per seed, and learnable.

Each class has a smooth random prototype; a sample is its class prototype plus per-sample noise,
so a model can reach well above chance and accuracy columns mean something even on synthetic data.
A fixed pool of distinct uint8 images is cycled through, so a full-size epoch does not need
gigabytes of RAM.

``data.device_resident=true`` (``data=synthetic``'s default) keeps that pool on the training device
and builds each batch there with one gather of uint8 pixels (``DeviceResidentImages``): no
per-sample collate, no host-to-device copy, and the normalization on the device (by the built-in
classifier's network, inside its compiled graph). That is the model's ceiling, what the GPU does
when the input pipeline costs nothing, and what ``python train.py +recipe=resnet50 amp=true
compile=true`` measures. ``data.device_resident=false`` builds batches on the host, as a loader of
real data would: the setting for measuring loader workers, pinning or prefetch on synthetic data.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from trainer.data.gpu_transforms import normalize_uint8

POOL_SIZE = 1024


class SyntheticImages(Dataset):
    def __init__(
        self,
        num_samples: int,
        image_size: int,
        num_classes: int,
        seed: int,
        split: str = "train",
        keep_uint8: bool = False,
    ):
        self.num_samples = num_samples
        self.keep_uint8 = keep_uint8  # data.gpu_normalize: uint8 out, normalized on the device
        g = torch.Generator().manual_seed(seed)
        # class prototypes: low-frequency patterns shared by train and val
        coarse = torch.rand(num_classes, 3, 4, 4, generator=g)
        protos = torch.nn.functional.interpolate(
            coarse, size=(image_size, image_size), mode="bilinear", align_corners=False
        )
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
        if self.keep_uint8:
            return self.images[i], int(self.labels[i])
        x = normalize_uint8(self.images[i][None])[0]
        return x, int(self.labels[i])


class DeviceResidentImages(Dataset):
    """A SyntheticImages pool moved to ``device``; the DataLoader fetches whole batches by index.

    ``__getitems__`` (the DataLoader's batched fetch) gathers one uint8 batch on the device; use it
    with ``collate_fn=batch_as_is`` and no workers. The indices cross to the device from pinned
    memory, without blocking the host, so the host can queue steps ahead of the GPU. The batch stays
    uint8 (a quarter of float32's bytes to gather): the datamodule's ``on_after_batch_transfer`` or
    the built-in classifier's network normalizes it, in one pass.
    """

    def __init__(self, source: SyntheticImages, device) -> None:
        self.num_samples = source.num_samples
        self.device = torch.device(device)
        self.images = source.images.to(self.device)
        self.labels = source.labels.to(self.device)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices):
        idx = torch.tensor(indices, dtype=torch.long) % len(self.images)
        if self.device.type == "cuda":
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        return self.images[idx], self.labels[idx]


def batch_as_is(batch):
    """collate_fn for DeviceResidentImages: ``__getitems__`` already returned the batch."""
    return batch
