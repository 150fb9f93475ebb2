"""``data.decoder=nvjpeg``: JPEG files are decoded on the GPU, a whole batch per call, then cropped,
flipped and resized there, a whole batch at a time.

Loader workers only read each file's bytes (no decode, no resize), and the collate function (in the
worker) joins a batch's files into one byte buffer with offsets: one tensor crosses from the worker
to the main process per batch, not one per image (each tensor is a shared-memory handle of its own
to pass and open). The buffer is pinned once. The batch's files go to the device through
torchvision's batched ``decode_jpeg(list, device="cuda")`` (nvJPEG), given views into that buffer;
``batched_crops`` then crops, resizes and flips the decoded batch in a few batched operations (one
resample per distinct image size), and the uint8 batch is normalized on the device (by the built-in
classifier's network, or the datamodule's ``on_after_batch_transfer``), as with
``data.gpu_normalize``. Files that are not JPEG (PNG, ...) are decoded in the workers and join the
batch already decoded. An automatic policy (``data.augment_policy``) and random erasing, where
asked for, still run image by image after the batched crop.

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
nothing else runs and nothing but the decoder's outputs is allocated), and the caller's stream waits
for it on the device (``wait_stream``; torchvision makes the host wait for its own decode stream).
The decoded images are read only by the batched crop, on the caller's stream; instead of a
``record_stream`` per image (a call each), the decoder keeps the last two batches' decoded images
alive, each until an event recorded after its crop has passed, or marks them used by the crop's
stream when it lets go of them earlier (``_Held``): their blocks go back to the decode stream's
pool only once nothing queued still reads them.

What the decode costs the host: on an H100 (torchvision 0.26) the call mostly returns only once the
work already queued on the device has run, on whatever stream it was queued. A decode of 64 JPEGs of
224 px takes 4.6 ms alone; called while 214 ms of matrix products were queued, it returned after
214 ms in 5 of 5 tries, with them on the default stream or on a stream of their own. So in the
prefetch thread the next batch's decode starts only when the GPU has caught up with the steps queued
before it, and decoding does not overlap the step: the JPEG table's ``all`` row spends 18% of its
time on it (``recipes/resnet50/RESULTS.md``). Two ways around it are measured by
``scripts/bench_nvjpeg_overlap.py``: a decode in a process of its own (its own CUDA context, whose
waits do not see this one's work; not built into the loader), and ``data.nvjpeg_library=nvimgcodec``,
the same nvJPEG through NVIDIA's nvImageCodec, ordered on the caller's stream (``nvimgcodec_decode``).

Everything here also runs with ``device="cpu"`` (torchvision's CPU decoder): that is how it is
tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional

import torch
import torchvision.io
from torchvision.io import ImageReadMode

from trainer.data.augment import CROP_RATIO, Augmentation, uint8_train_steps
from trainer.data.batched_crops import center_boxes, random_resized_boxes, resized_crops, to_device
from trainer.data.decoders import Loader, undecodable
from trainer.data.nvimgcodec_decode import BatchDecoder
from trainer.data.prefetch import process_stream
from trainer.errors import TrainingStopped

JPEG_MAGIC = b"\xff\xd8"


def decode_stream(device: torch.device) -> "torch.cuda.Stream":
    """The process's one stream for ``device`` that is current while nvJPEG decodes (see the module's
    docstring): only the decoder's output tensors are allocated on it, and no kernel runs on it."""
    return process_stream("nvjpeg decode", device)


@contextlib.contextmanager
def _decoding_on(device: torch.device):
    """Decode with ``decode_stream`` current; afterwards the caller's stream waits for it (on the
    device). The caller keeps the decoded images alive until its own stream is done with them."""
    if device.type != "cuda":
        yield
        return
    consumer = torch.cuda.current_stream(device)
    private = decode_stream(device)
    with torch.cuda.stream(private):
        yield
    consumer.wait_stream(private)  # torchvision made the decode stream wait for its own: chained on the device


class _Held:
    """Batches' decoded images, each kept alive until the caller's stream has passed the batched crop
    that read them (an event recorded after it), so that the decode stream's pool cannot hand their
    blocks to a later decode while that crop is still queued (see the module's docstring). The last
    ``depth`` batches are held; one let go before its crop has run (the host queued steps far ahead)
    is ``record_stream``-ed onto the stream that reads it instead, so its blocks are freed only once
    that stream passes this point: the host never waits here."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth
        self.held: list = []  # (event, images, the stream that reads them), oldest first

    def release(self) -> None:
        """Before the next decode: let go of all but the newest ``depth - 1`` batches."""
        while len(self.held) >= self.depth:
            event, images, stream = self.held.pop(0)
            if not event.query():  # its crop still queued: the allocator waits for the stream, not the host
                for image in images:
                    image.record_stream(stream)

    def hold(self, images: list, device: torch.device) -> None:
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            event = torch.cuda.Event()
            event.record(stream)
            self.held.append((event, images, stream))


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
    """One batch before decoding: every JPEG file's bytes in one buffer (``data``, with ``offsets``:
    file k is ``data[offsets[k]:offsets[k + 1]]``, sample ``jpeg_at[k]`` of the batch), the images
    decoded in the worker (``decoded``: (position, uint8 CHW) pairs, for files that are not JPEG),
    the labels and the paths."""

    __slots__ = ("data", "offsets", "jpeg_at", "decoded", "labels", "paths", "train")

    def __init__(self, data, offsets, jpeg_at, decoded, labels, paths, train: bool) -> None:
        self.data, self.offsets, self.jpeg_at, self.decoded = data, offsets, jpeg_at, decoded
        self.labels, self.paths, self.train = labels, paths, train

    def __len__(self) -> int:
        return len(self.paths)

    def files(self) -> List[torch.Tensor]:
        """Each JPEG file's bytes: views into the one buffer (no copy)."""
        bounds = self.offsets.tolist()  # a host tensor
        return [self.data[bounds[k] : bounds[k + 1]] for k in range(len(bounds) - 1)]

    def pin_memory(self) -> "EncodedBatch":
        """The DataLoader's pin-memory thread calls this: the byte buffer (nvJPEG copies from it), the
        labels and the worker-decoded images cross to the GPU from pinned memory, once per batch."""
        decoded = [(i, t.pin_memory()) for i, t in self.decoded]
        return EncodedBatch(
            self.data.pin_memory(),
            self.offsets,
            self.jpeg_at,
            decoded,
            self.labels.pin_memory(),
            self.paths,
            self.train,
        )


def encoded_collate(samples, train: bool = True) -> EncodedBatch:
    """The loader's collate_fn (with ``functools.partial`` for ``train``, which picks the transforms):
    joins the batch's JPEG bytes into one buffer, in the worker."""
    samples = [s for s in samples if s is not None]
    jpeg_at = [i for i, s in enumerate(samples) if s[0][0].ndim == 1]
    files = [samples[i][0][0] for i in jpeg_at]
    offsets = torch.zeros(len(files) + 1, dtype=torch.int64)
    if files:
        offsets[1:] = torch.tensor([len(f) for f in files]).cumsum(0)
    data = torch.cat(files) if files else torch.empty(0, dtype=torch.uint8)
    decoded = [(i, s[0][0]) for i, s in enumerate(samples) if s[0][0].ndim != 1]
    labels = torch.tensor([int(s[1]) for s in samples])
    return EncodedBatch(data, offsets, jpeg_at, decoded, labels, [s[0][1] for s in samples], train)


class DeviceDecoder:
    """EncodedBatch -> (uint8 N x 3 x S x S on ``device``, labels on ``device``).

    Training: torchvision's random-resized crop (``augment.crop_scale``, its aspect ratios) and a
    horizontal flip at random, or with ``data.augment=false`` a resize and centre crop; validation:
    the resize and centre crop at the eval size (``Augmentation.eval_resize``/``eval_size``). Then the
    policy and random erasing where asked for (``augment.uint8_train_steps``, per image).
    """

    def __init__(
        self, image_size: int, train: bool, augment, on_bad_sample: str = "skip", library: str = "torchvision"
    ) -> None:
        self.augment = Augmentation.coerce(augment)
        self.train = train
        self.size = image_size if train else self.augment.eval_size(image_size)
        self.image_size = image_size
        self.extra_steps = uint8_train_steps(self.augment) if train else None
        self.on_bad_sample = on_bad_sample
        self._held = _Held()
        # data.nvjpeg_library=nvimgcodec: its decodes are ordered on the caller's stream, which the crop
        # reads on, so its images need neither decode_stream nor _Held (see nvimgcodec_decode)
        self._codec = BatchDecoder() if library == "nvimgcodec" else None

    def _decode_one(self, item: torch.Tensor, path: str, device: torch.device) -> Optional[torch.Tensor]:
        try:
            with _decoding_on(device):
                return torchvision.io.decode_jpeg(item, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as e:
            return undecodable(self.on_bad_sample, path, f"nvJPEG: {str(e).splitlines()[0]}")

    def decode(self, batch: EncodedBatch, device: torch.device) -> List[Optional[torch.Tensor]]:
        images: List[Optional[torch.Tensor]] = [None] * len(batch)
        for i, image in batch.decoded:
            images[i] = image.to(device, non_blocking=True)
        files = batch.files()
        if files and self._codec is not None:  # one batched call; None for a file it could not decode
            decoded = self._codec(files, device, [batch.paths[i] for i in batch.jpeg_at])
            for i, image in zip(batch.jpeg_at, decoded):
                images[i] = (
                    image if image is not None else undecodable(self.on_bad_sample, batch.paths[i], "nvImageCodec")
                )
        elif files:
            try:  # one batched call: nvJPEG decodes the whole batch on the device
                with _decoding_on(device):
                    decoded = torchvision.io.decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:  # a bad file fails the whole call: find it, one file at a time
                decoded = [self._decode_one(f, batch.paths[i], device) for f, i in zip(files, batch.jpeg_at)]
            for i, image in zip(batch.jpeg_at, decoded):
                images[i] = image
        return images

    def boxes(self, sizes) -> torch.Tensor:
        """Each image's source region (top, left, height, width), drawn or fixed as the transforms say."""
        if self.train and self.augment.crop_flip:
            return random_resized_boxes(sizes, self.augment.crop_scale, CROP_RATIO)
        if self.train:
            return center_boxes(sizes, int(round(self.image_size * self.augment.eval_resize_ratio)), self.size)
        return center_boxes(sizes, self.augment.eval_resize(self.image_size), self.size)

    def __call__(self, batch: EncodedBatch, device: torch.device):
        self._held.release()  # older batches' decoded images, once their crop has run
        images = self.decode(batch, device)
        keep = [i for i, im in enumerate(images) if im is not None]
        if not keep:
            raise TrainingStopped(
                f"no image of a batch could be decoded ({', '.join(batch.paths[:3])}, ...): check the files under data.root."
            )
        kept = [images[i] for i in keep]
        boxes = self.boxes([tuple(im.shape[-2:]) for im in kept])
        flips = (
            torch.rand(len(kept)) < 0.5
            if self.train and self.augment.crop_flip
            else torch.zeros(len(kept), dtype=torch.bool)
        )
        x = resized_crops(kept, boxes, flips, self.size)
        if self._codec is None:
            self._held.hold(kept, device)
        if self.extra_steps is not None:
            x = torch.stack([self.extra_steps(image) for image in x])
        y = batch.labels[keep] if len(keep) < len(images) else batch.labels
        return x, to_device(y, device)
