"""``data.decoder=nvjpeg``: JPEG files are decoded on the GPU, a whole batch per call, then cropped,
flipped and resized there.

Loader workers only read each file's bytes (no decode, no resize): the CPU cost per image is a
file read. The batch's encoded files go to the device through torchvision's batched
``decode_jpeg(list, device="cuda")`` (nvJPEG); the same torchvision v2 transforms as the CPU path
then run on each decoded image on the device, and the stacked uint8 batch is normalized by the
datamodule's ``on_after_batch_transfer``, as with ``data.gpu_normalize``. Files that are not JPEG (PNG,
...) are decoded in the workers and join the batch already decoded.

Where nvJPEG may write: torchvision's CUDA decoder allocates its output tensors while the caller's
stream is current, then decodes on a private stream of its own that never waits for the caller's
stream (and nvJPEG's hardware engine writes its outputs without regard to stream order anyway). The
caching allocator hands out a block as soon as it is freed on the stream that owns it, since later
use on that stream is ordered after the earlier; so in the step loop the decoder was given blocks
that kernels already queued on the compute stream were still to read (the last step's activations),
and overwrote them: the fp32 ``data.decoder=nvjpeg`` row of the ResNet-50 table on an H100 died of a
NaN loss at its seventh step, while the same data decoded on the CPU trained. The upstream reports:
pytorch/vision#9606 (corrupted sums in 199 of 200 tries on an H100), meta-pytorch/torchcodec#1634.
So the decode runs with a stream of its own current (``decode_stream``, one per device, on which
nothing else runs and nothing but the decoder's outputs is allocated): a block in its pool was freed
only after every stream that read it had passed that point, because each decoded image is
``record_stream``-ed onto the stream that consumes it. The consumer also waits for the decode on the
device (``wait_stream``; torchvision already makes the host wait for its own decode stream, but never
for the compute stream, and that stays so).

Everything here also runs with ``device="cpu"`` (torchvision's CPU decoder): that is how it is
tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import logging
from typing import List, Optional

import torch

from trainer.data.decoders import Loader
from trainer.data.prefetch import process_stream

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8"


def decode_stream(device: torch.device) -> "torch.cuda.Stream":
    """The process's one stream for ``device`` that is current while nvJPEG decodes (see the module's
    docstring): only the decoder's output tensors are allocated on it, and no kernel runs on it."""
    return process_stream("nvjpeg decode", device)


@contextlib.contextmanager
def _decoding_on(device: torch.device, out: List[Optional[torch.Tensor]]):
    """Decode with ``decode_stream`` current; afterwards the caller's stream waits for it (on the
    device) and owns the decoded images (``record_stream``), so their blocks go back to the decode
    stream's pool only once the caller's stream is done with them."""
    if device.type != "cuda":
        yield
        return
    consumer = torch.cuda.current_stream(device)
    private = decode_stream(device)
    with torch.cuda.stream(private):
        yield
    consumer.wait_stream(private)  # torchvision made the decode stream wait for its own: chained on the device
    for image in out:
        if image is not None and image.is_cuda:
            image.record_stream(consumer)


class BytesLoader(Loader):
    """path -> (uint8 tensor, path): the file's bytes for a JPEG, else the decoded CHW image."""

    def __init__(self, cache_in_memory: bool = False, fs=None) -> None:
        super().__init__("torchvision", cache_in_memory, fs)

    def __call__(self, path: str):
        data = self._bytes(path)
        if data[:2] == JPEG_MAGIC:
            return torch.frombuffer(bytearray(data), dtype=torch.uint8), path
        return self.decode(data), path  # decoded here, on the CPU


class EncodedBatch:
    """One batch of encoded (or CPU-decoded) images, their labels and paths, before decoding."""

    __slots__ = ("items", "labels", "paths", "train")

    def __init__(self, items: List[torch.Tensor], labels: torch.Tensor, paths: List[str], train: bool) -> None:
        self.items, self.labels, self.paths, self.train = items, labels, paths, train

    def __len__(self) -> int:
        return len(self.items)

    def pin_memory(self) -> "EncodedBatch":
        """The DataLoader's pin-memory thread calls this: labels and CPU-decoded images (PNG) cross
        to the GPU from pinned memory, without the driver staging them; JPEG bytes go to nvJPEG as they are."""
        items = [t.pin_memory() if t.ndim == 3 else t for t in self.items]
        return EncodedBatch(items, self.labels.pin_memory(), self.paths, self.train)


def encoded_collate(samples, train: bool = True) -> EncodedBatch:
    """The loader's collate_fn (with ``functools.partial`` for ``train``, which picks the transforms)."""
    samples = [s for s in samples if s is not None]
    return EncodedBatch(
        [s[0][0] for s in samples], torch.tensor([int(s[1]) for s in samples]), [s[0][1] for s in samples], train
    )


class DeviceDecoder:
    """EncodedBatch -> (uint8 N x 3 x S x S on ``device``, labels on ``device``)."""

    def __init__(self, transform, on_bad_sample: str = "skip") -> None:
        self.transform = transform  # folder.transforms_for(..., keep_uint8=True): tensors on any device
        self.on_bad_sample = on_bad_sample

    def _decode_one(self, item: torch.Tensor, path: str, device: torch.device) -> Optional[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            out: List[Optional[torch.Tensor]] = []
            with _decoding_on(device, out):
                out.append(decode_jpeg(item, mode=ImageReadMode.RGB, device=device))
            return out[0]
        except RuntimeError as e:
            if self.on_bad_sample == "stop":
                from trainer.errors import TrainingStopped

                raise TrainingStopped(
                    f"cannot decode {path} (nvJPEG: {str(e).splitlines()[0]}); stopped (data.on_bad_sample=stop). "
                    "Remove or replace the file, or set data.on_bad_sample=skip to skip such files and count them."
                ) from None
            log.warning("skipping undecodable image %s (%s)", path, str(e).splitlines()[0])
            return None

    def decode(self, batch: EncodedBatch, device: torch.device) -> List[Optional[torch.Tensor]]:
        from torchvision.io import ImageReadMode, decode_jpeg

        jpeg = [i for i, t in enumerate(batch.items) if t.ndim == 1]
        images: List[Optional[torch.Tensor]] = [
            t.to(device, non_blocking=True) if t.ndim == 3 else None for t in batch.items
        ]
        if jpeg:
            try:  # one batched call: nvJPEG decodes the whole batch on the device
                decoded: List[Optional[torch.Tensor]] = []
                with _decoding_on(device, decoded):
                    decoded.extend(decode_jpeg([batch.items[i] for i in jpeg], mode=ImageReadMode.RGB, device=device))
            except RuntimeError:  # a bad file fails the whole call: find it, one file at a time
                decoded = [self._decode_one(batch.items[i], batch.paths[i], device) for i in jpeg]
            for i, image in zip(jpeg, decoded):
                images[i] = image
        return images

    def __call__(self, batch: EncodedBatch, device: torch.device):
        images = self.decode(batch, device)
        keep = [i for i, im in enumerate(images) if im is not None]
        if not keep:
            from trainer.errors import TrainingStopped

            raise TrainingStopped(
                f"no image of a batch could be decoded ({', '.join(batch.paths[:3])}, ...): check the files under data.root."
            )
        x = torch.stack([self.transform(images[i]) for i in keep])
        y = batch.labels[keep] if len(keep) < len(images) else batch.labels
        return x, y.to(device, non_blocking=True)
