"""Normalization of uint8 image batches, wherever they are (``data.gpu_normalize``).

With ``data.gpu_normalize=true`` the loader ships uint8 pixels (4x fewer bytes than float32 across
the host-device bus, and no float math in the workers) and the datamodule's ``on_after_batch_transfer``
converts and normalizes the batch on the device.
"""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def model_input(x: torch.Tensor) -> torch.Tensor:
    """A batch as the model takes it: uint8 pixels (gpu_normalize, nvjpeg) normalized, float as it is."""
    return normalize_uint8(x) if x.dtype == torch.uint8 else x


def normalize_uint8(x: torch.Tensor) -> torch.Tensor:
    """uint8 N x C x H x W (0..255) -> float32, ImageNet-normalized, on x's device."""
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, -1, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, -1, 1, 1) * 255
    return (x.float() - mean) / std
