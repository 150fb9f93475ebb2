"""Normalization of uint8 image batches, wherever they are (``data.gpu_normalize``, device-resident
synthetic data, ``data.decoder=nvjpeg``).

With ``data.gpu_normalize=true`` the loader ships uint8 pixels (4x fewer bytes than float32 across
the host-device bus, and no float math in the workers) and the batch is converted and normalized on
the device: by the datamodule's ``on_after_batch_transfer``, or, for the built-in classifier, at the
start of its network's forward (``switches.model_transforms.ModelInput``), inside the compiled graph
with ``compile=true``, where it fuses with the first layer's casts.

One pass over the batch: ``x * (1 / std) + (-mean / std)`` as a single ``addcmul`` reads the uint8
pixels and writes the float32 result once, in the memory format asked for (channels_last: no second
copy). ``(x.float() - mean) / std`` took three passes over a float32 batch (154 MB at 256 x 224 px).

The constants live on each device once: building them per batch with ``torch.tensor(list,
device="cuda")`` is a copy from pageable host memory, which makes the host wait for every kernel
already queued (a device sync per batch, in the step loop).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# x * SCALE + SHIFT per channel == (x / 255 - mean) / std
SCALE = tuple(1 / (s * 255) for s in IMAGENET_STD)
SHIFT = tuple(-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))

# device -> (SCALE, SHIFT) as 1 x 3 x 1 x 1 tensors on that device
_CONSTANTS: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}


def model_input(x: torch.Tensor) -> torch.Tensor:
    """A batch as the model takes it: uint8 pixels (gpu_normalize, nvjpeg) normalized, float as it is."""
    return normalize_uint8(x) if x.dtype == torch.uint8 else x


def _constants(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    if torch.compiler.is_compiling():
        # inside a compiled graph the constants are the graph's own, made once when it compiles; the
        # per-device cache below would be a dict that dynamo guards on, and its first insertion a recompile
        return (
            torch.tensor(SCALE, device=device).view(1, -1, 1, 1),
            torch.tensor(SHIFT, device=device).view(1, -1, 1, 1),
        )
    if device not in _CONSTANTS:
        # built on the host and copied once per device and process: the only blocking copy here
        scale, shift = torch.tensor(SCALE).view(1, -1, 1, 1), torch.tensor(SHIFT).view(1, -1, 1, 1)
        _CONSTANTS[device] = (scale.to(device), shift.to(device))
    return _CONSTANTS[device]


def normalize_uint8(x: torch.Tensor, memory_format: Optional[torch.memory_format] = None) -> torch.Tensor:
    """uint8 N x C x H x W (0..255) -> float32, ImageNet-normalized, on x's device, in one pass.

    ``memory_format``: the result's layout (``torch.channels_last`` for an NHWC model); None keeps x's.
    """
    scale, shift = _constants(x.device)
    if memory_format is None or x.ndim != 4:
        return torch.addcmul(shift, x, scale)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device, memory_format=memory_format)
    return torch.addcmul(shift, x, scale, out=out)
