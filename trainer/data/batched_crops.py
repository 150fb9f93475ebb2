"""Crop, resize and flip a whole batch of decoded images at once, on whatever device holds them.

Why it exists: ``data.decoder=nvjpeg`` decodes a batch in one call, and then ran torchvision's v2
``RandomResizedCrop`` + flip image by image on the GPU: a few kernels and a few hundred microseconds
of Python per image, in one thread, which at 512 images a batch kept the GPU waiting for its data.
Here the crop parameters of the whole batch are drawn at once on the host (torchvision's rule,
vectorized), and the images are resampled by one ``roi_align`` call per distinct image size (one
call for a set stored at one size): a bilinear crop-and-resize whose adaptive sampling averages
``ceil(crop side / output side)`` bilinear samples per output pixel in each direction where the crop
shrinks. That is not torchvision's resize: where the crop shrinks, its box of samples is a narrower
filter than ``antialias=True``'s triangle, so fine detail aliases more; at the crop's edges it
interpolates with the pixels just outside the crop (torchvision clamps to the crop); on smooth
images the two agree to about a level. The flip and the conversion back to uint8 are one batched
operation each. Nothing here reads a device value on the host.

Randomness: ``random_resized_boxes`` and the flips draw from torch's CPU generator, which the caller
seeds per batch (``ImageDataModule.to_device``), as the per-image transforms drew from it.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)


def random_resized_boxes(
    sizes: Sequence[Tuple[int, int]], scale: Tuple[float, float], ratio: Tuple[float, float], tries: int = 10
) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop.get_params`` for every image at once: (N, 4) float64 rows of
    (top, left, height, width) in pixels. Up to ``tries`` draws of an area fraction in ``scale`` and
    a log-uniform aspect ratio in ``ratio`` per image, the first that fits wins; where none fits, the
    largest centre crop within the ratio range."""
    hw = torch.tensor(sizes, dtype=torch.float64).view(-1, 2)
    n = hw.shape[0]
    H, W = hw[:, :1], hw[:, 1:]
    target = H * W * torch.empty(n, tries, dtype=torch.float64).uniform_(scale[0], scale[1])
    aspect = torch.exp(torch.empty(n, tries, dtype=torch.float64).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    first = fits.to(torch.int8).argmax(1, keepdim=True)  # the first draw that fits (0 where none does)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    H, W = H.squeeze(1), W.squeeze(1)
    # no draw fits: the whole image, cut to the nearest allowed aspect ratio, centred
    in_ratio = W / H
    fall_w = torch.where(in_ratio < ratio[0], W, torch.where(in_ratio > ratio[1], torch.round(H * ratio[1]), W))
    fall_h = torch.where(in_ratio < ratio[0], torch.round(W / ratio[0]), H)
    found = fits.any(1)
    w, h = torch.where(found, w, fall_w), torch.where(found, h, fall_h)
    u = torch.rand(n, 2, dtype=torch.float64)
    top = torch.where(found, torch.floor(u[:, 0] * (H - h + 1)), torch.floor((H - h) / 2))
    left = torch.where(found, torch.floor(u[:, 1] * (W - w + 1)), torch.floor((W - w) / 2))
    return torch.stack([top, left, h, w], 1)


def center_boxes(sizes: Sequence[Tuple[int, int]], resize: int, crop: int) -> torch.Tensor:
    """torchvision's ``Resize(resize)`` (the short side) then ``CenterCrop(crop)``, as the source region
    each output covers: (N, 4) float64 rows of (top, left, height, width)."""
    rows = []
    for height, width in sizes:
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(resize * long / short)  # torchvision truncates the long side
        new_h, new_w = (resize, new_long) if height <= width else (new_long, resize)
        sy, sx = height / new_h, width / new_w
        top, left = round((new_h - crop) / 2), round((new_w - crop) / 2)
        rows.append((top * sy, left * sx, crop * sy, crop * sx))
    return torch.tensor(rows, dtype=torch.float64).view(-1, 4)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without making the host wait: on CUDA copied from pinned
    memory (pinned here unless it is already), without blocking; a copy from pageable memory would
    make the host wait for everything queued on the stream."""
    if device.type == "cuda":
        return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    return t.to(device)


def resized_crops(images: List[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 CHW images (on one device, any sizes) -> uint8 N x C x size x size: each image's box
    (top, left, height, width; host float64) resampled to ``size`` and mirrored where ``flips``.

    Images of one size are stacked and resampled together (one ``roi_align`` call per distinct
    size), then put back in the batch's order with one gather.
    """
    device = images[0].device
    groups: dict = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    order = [i for members in groups.values() for i in members]
    parts = []
    for members in groups.values():
        stacked = torch.stack([images[i] for i in members]).float()
        b = boxes[members]
        # roi_align's rows: (image index, x1, y1, x2, y2) in pixel edges (aligned=True: pixel centres at +0.5)
        rois = torch.stack(
            [torch.arange(len(members), dtype=torch.float64), b[:, 1], b[:, 0], b[:, 1] + b[:, 3], b[:, 0] + b[:, 2]], 1
        )
        # the native op, not torchvision.ops.roi_align: under torch.use_deterministic_algorithms (Lightning's
        # trainer.deterministic) that wrapper runs a Python version on CUDA which, with an adaptive
        # sampling ratio, samples every pixel of the image for each output pixel; the native forward is
        # deterministic already
        parts.append(
            torch.ops.torchvision.roi_align(stacked, to_device(rois.float(), device), 1.0, size, size, -1, True)
        )
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    if order != sorted(order):  # back to the batch's order
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        out = out[to_device(inverse, device)]
    if bool(flips.any()):  # a host tensor: no device read
        mirror = to_device(flips.view(-1, 1, 1, 1), device)
        out = torch.where(mirror, out.flip(3), out)
    return out.round_().clamp_(0, 255).to(torch.uint8)
