"""Mixup and cutmix: each training batch mixed with itself in reverse order, the labels becoming soft
targets (``data.mixup_alpha``, ``data.cutmix_alpha``).

The algorithms of torchvision's ``v2.MixUp`` and ``v2.CutMix`` (the same Beta draw, the same box
rule and area-corrected lambda), and, with both on, an even choice per batch as torchvision's
reference script and timm make. Two things differ from calling those classes, each for a reason:

- **The draws come from a generator of this batch's own** (``random.Random`` seeded by seed, rank,
  epoch and batch index), not from torch's global RNG: the global RNGs are shared with the loader's
  prefetch thread, which seeds and restores them around each sample (``SeededSamples``), so draws
  made there would interleave with it. Seeded so, a resumed run mixes its remaining batches as the
  uninterrupted run did, and each DDP rank mixes differently, as each rank's own RNG would.
- **Each image is paired with the one at the mirror position of the batch** (timm's rule, which
  DeiT and "ResNet strikes back" trained with), not its neighbour (torchvision's roll by one): with
  repeated augmentation and fewer processes than repeats, the copies of a sample sit next to each
  other in a batch, and a neighbour would often be the same image.

The built-in classifier calls it at the top of its training step: on the device, after the transfer
and after ``gpu_normalize``'s conversion (mixing needs float images). The draws are Python numbers
and the one-hot targets are made with the class count given: nothing waits for the device.
"""

from __future__ import annotations

import math
import random
from typing import Optional

import torch
import torch.nn.functional as F


class BatchMixing:
    """Mixes a training batch ``(images, labels)`` into ``(mixed images, soft targets (N, classes))``."""

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> None:
        if mixup_alpha <= 0 and cutmix_alpha <= 0:
            raise ValueError("BatchMixing needs mixup_alpha or cutmix_alpha above 0")
        self.mixup_alpha, self.cutmix_alpha, self.num_classes = mixup_alpha, cutmix_alpha, num_classes

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seed: int):
        rng = random.Random(seed)
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or rng.random() < 0.5)
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = rng.betavariate(alpha, alpha)
        paired = images.flip(0)
        if cutmix:
            height, width = images.shape[-2:]
            cx, cy = rng.randrange(width), rng.randrange(height)  # the box's centre, as torch.randint draws it
            half = 0.5 * math.sqrt(1.0 - lam)
            half_w, half_h = int(half * width), int(half * height)
            x1, y1 = max(cx - half_w, 0), max(cy - half_h, 0)
            x2, y2 = min(cx + half_w, width), min(cy + half_h, height)
            mixed = images.clone()
            mixed[..., y1:y2, x1:x2] = paired[..., y1:y2, x1:x2]
            lam = 1.0 - (x2 - x1) * (y2 - y1) / (width * height)  # the share of the image still its own
        else:
            mixed = images * lam + paired * (1.0 - lam)
        targets = labels if labels.ndim == 2 else F.one_hot(labels, self.num_classes)
        targets = targets.float()
        return mixed, targets * lam + targets.flip(0) * (1.0 - lam)


def batch_mixing(data_cfg, num_classes: int) -> Optional[BatchMixing]:
    """The configured mixing, or None when both alphas are 0."""
    mixup, cutmix = float(data_cfg.get("mixup_alpha", 0.0)), float(data_cfg.get("cutmix_alpha", 0.0))
    if mixup <= 0 and cutmix <= 0:
        return None
    return BatchMixing(mixup, cutmix, num_classes)
