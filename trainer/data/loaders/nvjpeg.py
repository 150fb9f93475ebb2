"""``data.decoder=nvjpeg``: the torch loader's workers only read each file's bytes and join a batch's
files into one buffer (``device_decode.encoded_collate``); the batch is decoded, cropped, resized and
flipped on the device in its transfer (``device_decode.DeviceDecoder``).

The training crops and flips are drawn on the host in the transfer (after the loader workers, and
with data.device_prefetch in its thread ahead of the step) from a seed of the epoch and the batch's
files, as ``SeededSamples`` does for the transforms in the main process: a resumed run decodes the
crops the run it continues did.
"""

from __future__ import annotations

import functools
import zlib

import torch

from trainer.data.device_decode import DeviceDecoder, EncodedBatch, encoded_collate
from trainer.data.loaders.base import LoaderSetup
from trainer.data.loaders.torch_workers import TorchLoaders
from trainer.data.seeding import own_rngs, sample_seed, seed_rngs


class NvjpegLoaders(TorchLoaders):
    """The torch loader (its name in metrics.json), whose batches are decoded in their transfer."""

    def __init__(self, setup: LoaderSetup) -> None:
        super().__init__(setup)
        c = setup.cfg
        self.decoders = {
            train: DeviceDecoder(c.image_size, train, setup.augmentation, c.on_bad_sample, c.nvjpeg_library)
            for train in (True, False)
        }

    def collate(self, train: bool):
        return functools.partial(encoded_collate, train=train)

    def to_device(self, batch, device: torch.device):
        if not isinstance(batch, EncodedBatch):
            return super().to_device(batch, device)
        decode = self.decoders[batch.train]
        if not batch.train:
            return decode(batch, device)
        files = zlib.crc32("\0".join(batch.paths).encode())
        with own_rngs():
            seed_rngs(sample_seed(self.setup.seed, self.epoch_now(), files))
            return decode(batch, device)

    def example(self, samples: list, device: torch.device):
        return self.to_device(encoded_collate(samples), device)
