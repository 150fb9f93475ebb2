"""Normalization of uint8 image batches, wherever they are (``data.gpu_normalize``).

With ``data.gpu_normalize=true`` the loader ships uint8 pixels (4x fewer bytes than float32 across
the host-device bus, and no float math in the workers) and the datamodule's ``on_after_batch_transfer``
converts and normalizes the batch on the device.

The mean and std live on each device once: building them per batch with ``torch.tensor(list,
device="cuda")`` is a copy from pageable host memory, which makes the host wait for every kernel
already queued (a device sync per batch, in the step loop).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# device -> (mean * 255, std * 255), shaped 1 x 3 x 1 x 1, on that device
_CONSTANTS: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}


def model_input(x: torch.Tensor) -> torch.Tensor:
    """A batch as the model takes it: uint8 pixels (gpu_normalize, nvjpeg) normalized, float as it is."""
    return normalize_uint8(x) if x.dtype == torch.uint8 else x


def _constants(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    if device not in _CONSTANTS:
        # built on the host and copied once per device and process: the only blocking copy here
        mean = torch.tensor(IMAGENET_MEAN).view(1, -1, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD).view(1, -1, 1, 1) * 255
        _CONSTANTS[device] = (mean.to(device), std.to(device))
    return _CONSTANTS[device]


def normalize_uint8(x: torch.Tensor) -> torch.Tensor:
    """uint8 N x C x H x W (0..255) -> float32, ImageNet-normalized, on x's device."""
    mean, std = _constants(x.device)
    return (x.float() - mean) / std
