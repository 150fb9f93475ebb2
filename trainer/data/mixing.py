"""Mixup and cutmix: each training batch mixed with itself rolled by one, the labels becoming soft
targets (``data.mixup_alpha``, ``data.cutmix_alpha``).

torchvision's own ``v2.MixUp`` and ``v2.CutMix``, chosen between per batch by ``v2.RandomChoice``
(equal odds) as torchvision's reference script does when both are on. The built-in classifier
calls them at the top of its training step: on the device, after the transfer and after
``gpu_normalize``'s conversion (mixing needs float images), and with the step's batch index, which
seeds them: (seed, epoch, batch index), so a resumed run mixes its remaining batches as the
uninterrupted run did. Their draws (the Beta's lambda, cutmix's box, the choice) are CPU random
numbers read as Python values, and the one-hot targets are made with the class count given: nothing
waits for the device.
"""

from __future__ import annotations

from typing import Optional

import torch


class BatchMixing:
    """Mixes a training batch ``(images, labels)`` into ``(mixed images, soft targets (N, classes))``."""

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> None:
        from torchvision.transforms import v2

        ops = []
        if mixup_alpha > 0:
            ops.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha > 0:
            ops.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        if not ops:
            raise ValueError("BatchMixing needs mixup_alpha or cutmix_alpha above 0")
        self.mix = ops[0] if len(ops) == 1 else v2.RandomChoice(ops)
        self.num_classes = num_classes

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seed: int):
        from .datamodule import own_rngs, seed_rngs

        with own_rngs():
            seed_rngs(seed)
            return self.mix(images, labels)


def batch_mixing(data_cfg, num_classes: int) -> Optional[BatchMixing]:
    """The configured mixing, or None when both alphas are 0."""
    mixup, cutmix = float(data_cfg.get("mixup_alpha", 0.0)), float(data_cfg.get("cutmix_alpha", 0.0))
    if mixup <= 0 and cutmix <= 0:
        return None
    return BatchMixing(mixup, cutmix, num_classes)
