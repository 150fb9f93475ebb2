"""Progressive resizing (``progressive_resize=true``): train at a low resolution early, at full size late.

FFCV and Composer train ResNet-50 this way: most epochs' steps cost (size / full size)^2 of a full
one, and the last epochs at full size recover the accuracy. It trades per-epoch cost for epochs, so
the report's time to target, not its epoch time, says whether it paid off.

The schedule (``schedule``): ``progressive.start_size`` (default half of ``data.image_size``) until
``progressive.start_epoch``, then linear growth to ``data.image_size``, reached at
``progressive.end_epoch`` (default: epoch ceil(0.8 x max_epochs) - 1, so the last fifth of the
epochs and one more run at full size, after Composer's finetune fraction); sizes are rounded down to multiples of ``progressive.bucket`` pixels, so a
compiled model meets a few known shapes, not one per epoch (the count is said before training).
Each training batch is resized on the device after the transfer (``resize_batch``, bilinear with
antialiasing), so it works for every data source, with ``channels_last``, ``compile`` and DDP;
validation always runs at full size.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch


def schedule(
    image_size: int,
    max_epochs: int,
    start_size: Optional[int] = None,
    start_epoch: int = 0,
    end_epoch: Optional[int] = None,
    bucket: int = 8,
) -> List[int]:
    """The training image size of each epoch 0 .. max_epochs - 1."""
    start = start_size if start_size is not None else image_size // 2
    end = end_epoch if end_epoch is not None else max(start_epoch, math.ceil(0.8 * max_epochs) - 1)
    sizes = []
    for epoch in range(max_epochs):
        if epoch >= end:
            sizes.append(image_size)
            continue
        grown = 0.0 if epoch <= start_epoch else (epoch - start_epoch) / max(1, end - start_epoch)
        size = start + (image_size - start) * min(1.0, grown)
        sizes.append(min(image_size, max(bucket, int(size // bucket) * bucket)))
    return sizes


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """A float NCHW batch at ``size`` x ``size`` (unchanged when it already is)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    channels_last = images.is_contiguous(memory_format=torch.channels_last)
    out = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out
