"""Image file -> pixels, by ``data.decoder``: the CPU cost that dominates real-data input pipelines.

- ``pil``: Pillow (the torchvision default; the baseline).
- ``torchvision``: ``torchvision.io.decode_image`` (libjpeg-turbo inside torchvision), straight to a
  uint8 tensor with no PIL image in between.
- ``turbo``: libjpeg-turbo through simplejpeg (``pip install simplejpeg``), with its fast DCT
  settings; PNG and other formats go through torchvision.
- ``nvjpeg``: batched GPU decoding with ``torchvision.io.decode_jpeg(device="cuda")``, see
  ``device_decode``; without CUDA it falls back to ``torchvision`` with a message.

Every decoder gives the same pixels for a file ImageFolder takes, so that the switch changes only
speed: a format torchvision cannot read (BMP, PPM/PGM, TIFF) is decoded by Pillow under every decoder
(``torchvision_reads``), and a 16-bit PNG or TIFF keeps its high byte under every decoder
(``eight_bit``; Pillow alone would clip a 16-bit grey image to white, torchvision would hand over
uint16 pixels that no batch of uint8 ones can join).

With ``data.decode_scale=auto`` a JPEG (a file, or a sample of a Parquet or WebDataset shard) stored
at least twice as large as the transforms need is decoded at 1/2, 1/4 or 1/8 of its size by
libjpeg's DCT scaling (PIL's ``draft``, simplejpeg's ``min_height``/``min_width``): the smallest
scale whose short side still has ``min_side`` pixels, so the crop and resize that follow see as many
pixels as they keep. torchvision's decoders have no such option yet (pytorch/vision#8986): with
``torchvision`` and ``nvjpeg`` it changes nothing, and says so.

With ``data.cache_in_memory`` the encoded bytes of each file are kept in RAM after the first read
(per loader worker; persistent workers keep them across epochs), so later epochs skip the disk.
"""

from __future__ import annotations

import importlib.util
import io
import logging
from typing import Optional

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.functional import pil_to_tensor

from trainer.data.storage import explain
from trainer.errors import TrainingStopped

log = logging.getLogger(__name__)


# what PIL, torchvision and simplejpeg raise for a corrupt or truncated image file
DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError)

REPLACE_THE_FILE = "Remove or replace the file, or set data.on_bad_sample=skip to skip such files and count them."


def undecodable(on_bad_sample: str, where: str, why: str, remedy: str = REPLACE_THE_FILE) -> None:
    """``data.on_bad_sample`` for an image that will not decode (``where``: its file or sample; ``why``:
    the decoder's error): ``stop`` raises TrainingStopped naming it, ``skip`` logs it and returns None
    (the caller drops the sample; the loaders count the short batches)."""
    if on_bad_sample == "stop":
        raise TrainingStopped(f"cannot decode {where} ({why}); stopped (data.on_bad_sample=stop). {remedy}") from None
    log.warning("skipping undecodable image %s (%s)", where, why)
    return None


SCALED_DECODERS = ("pil", "turbo")  # the decoders that can decode a JPEG at a reduced size


def resolve_decoder(name: str, accelerator: str) -> str:
    """The decoder that will really run here, with a message when it is not the one asked for."""
    if name == "turbo" and importlib.util.find_spec("simplejpeg") is None:
        log.warning(
            "data.decoder=turbo needs simplejpeg (pip install simplejpeg): using data.decoder=torchvision instead"
        )
        return "torchvision"
    if name == "nvjpeg" and accelerator != "cuda":
        log.warning("data.decoder=nvjpeg needs a CUDA GPU: using data.decoder=torchvision (CPU) instead")
        return "torchvision"
    return name


def torchvision_reads(data: bytes) -> bool:
    """Whether ``torchvision.io.decode_image`` reads this file's format, by its first bytes as torchvision
    tells them (JPEG, PNG, GIF, WebP). The others ImageFolder takes go to Pillow under every decoder:
    refused by torchvision, a readable BMP would be skipped as undecodable. A corrupt file still fails
    in whichever decoder it reaches (DECODE_ERRORS), so it is still a bad sample."""
    return (
        data[:3] == b"\xff\xd8\xff"
        or data[:4] in (b"\x89PNG", b"GIF8")
        or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")
    )


def eight_bit(image: torch.Tensor) -> torch.Tensor:
    """A uint16 image (torchvision's decode of a 16-bit PNG) as uint8: the high byte of each pixel, what
    Pillow keeps of a 16-bit colour PNG; a uint8 image as it is."""
    if image.dtype != torch.uint16:
        return image
    return (image.to(torch.int32) >> 8).to(torch.uint8)  # torch has no shift for uint16


def eight_bit_grey(image: Image.Image) -> Image.Image:
    """A 16-bit grey Pillow image (mode ``I;16``, or ``I`` as some Pillow versions open a 16-bit grey PNG) as
    8-bit grey, its high bytes: ``convert("RGB")`` would clip every value above 255 to white."""
    if image.mode.startswith("I;16") or (image.mode == "I" and image.format == "PNG"):
        return Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
    return image


class Loader:
    """A picklable ImageFolder loader: path -> PIL image or uint8 CHW tensor."""

    def __init__(self, decoder: str, cache_in_memory: bool = False, fs=None, min_side: Optional[int] = None) -> None:
        self.decoder = decoder
        self.min_side = min_side if decoder in SCALED_DECODERS else None  # data.decode_scale=auto
        self.cache = {} if cache_in_memory else None
        self.fs = fs  # an fsspec filesystem for a data.root URL; None: local files

    def _bytes(self, path: str) -> bytes:
        if self.cache is not None and path in self.cache:
            return self.cache[path]
        if self.fs is not None:
            try:
                data = self.fs.cat_file(path)
            except Exception as e:  # noqa: BLE001 - a storage failure is not an undecodable image
                raise explain(e, path, "data.root") from None
        else:
            with open(path, "rb") as f:
                data = f.read()
        if self.cache is not None:
            self.cache[path] = data
        return data

    def __call__(self, path: str):
        return self.decode(self._bytes(path))

    def decode(self, data: bytes):
        """Encoded image bytes -> PIL image (``pil``) or uint8 CHW tensor (the other decoders)."""
        if self.decoder == "pil":
            return self._pil(data)
        if not torchvision_reads(data):
            return pil_to_tensor(self._pil(data))
        if self.decoder == "turbo" and data[:2] == b"\xff\xd8":
            return self._simplejpeg(data)
        return eight_bit(decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB))

    def _pil(self, data: bytes) -> Image.Image:
        with Image.open(io.BytesIO(data)) as im:
            if self.min_side:
                im.draft("RGB", (self.min_side, self.min_side))  # JPEG only; a no-op for other formats
            return eight_bit_grey(im).convert("RGB")

    def _simplejpeg(self, data: bytes) -> torch.Tensor:
        import simplejpeg  # lazy: optional ([turbo] extra)

        sides = {}
        if self.min_side and min(simplejpeg.decode_jpeg_header(data)[:2]) >= 2 * self.min_side:
            # only where a smaller scale exists: asked for sizes, simplejpeg decodes about 8% slower at full scale
            sides = {"min_height": self.min_side, "min_width": self.min_side}
        array = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True, **sides)
        # CHW over the decoder's HWC pixels, not copied: the crop that follows is a view, and the
        # resize reads only the crop (uint8 channels-last is its fast path); a contiguous copy of
        # the whole decoded image cost about 15% of this decoder's time per image
        return torch.from_numpy(array).permute(2, 0, 1)
