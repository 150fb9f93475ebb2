"""``data.loader=dali``: NVIDIA DALI's pipeline (``trainer.data.dali``) over the files the torch loader
would read, in the torch loader's order for this rank (``Loaders.training_order``: the same samples
per rank, ``data.repeated_augment`` as there, and a resume that continues inside this rank's share)."""

from __future__ import annotations

from typing import List

import torch
from torch.utils.data import DistributedSampler

from trainer.data.dali import DaliLoader
from trainer.data.loaders.base import Loaders, LoaderSetup
from trainer.data.seeding import sample_seed


class DaliLoaders(Loaders):
    name = "dali"

    def __init__(self, setup: LoaderSetup, train_samples: list, val_samples: list) -> None:
        super().__init__(setup)
        self.samples = {True: train_samples, False: val_samples}  # (path, label), in the data sets' index order

    def describe(self):
        # DALI decodes on the CPU, or mixed: nvJPEG on the GPU
        return {**super().describe(), "decoder": "dali-mixed" if self.setup.accelerator == "cuda" else "dali-cpu"}

    def train(self, dataset):
        n = len(self.samples[True])
        dealt = self.training_order(n)  # the epoch's permutation, repeats, this rank's share, a resume's skip

        def order_of(epoch: int) -> List[int]:
            dealt.set_epoch(epoch)
            return [i % n for i in dealt]  # a repeated draw i + k x n is sample i

        return self._loader(order_of, len(dealt), train=True)

    def val(self, dataset):
        n = len(self.samples[False])
        stop = self.step_limit_samples(n, train=False)
        # as Lightning deals the torch loader's validation: not shuffled, padded to even shares
        dealt = DistributedSampler(range(n), num_replicas=self.world, rank=self.rank, shuffle=False)
        return self._loader(
            lambda epoch: list(dealt)[:stop], len(dealt) if stop is None else min(stop, len(dealt)), False
        )

    def _loader(self, order_of, per_epoch: int, train: bool):
        if self.trainer is not None:
            device = self.trainer.strategy.root_device
        else:  # used on its own: the accelerator's current device
            cuda = self.setup.accelerator == "cuda"
            device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        c, rank = self.setup.cfg, self.rank
        return DaliLoader(
            self.samples[train],
            order_of,
            self.epoch_now,
            per_epoch,  # this rank's samples in an epoch
            # the crops of (seed, epoch, rank): an epoch's are the same after a resume
            seed_of=lambda epoch: sample_seed(self.setup.seed, epoch, rank) & 0x7FFFFFFF,
            train=train,
            batch_size=c.batch_size,
            image_size=c.image_size,
            augmentation=self.setup.augmentation,
            threads=self.setup.workers,
            device_id=(device.index or 0) if device.type == "cuda" else None,
            keep_uint8=bool(c.gpu_normalize),
            channels_last=self.setup.channels_last,
            drop_last=train and c.drop_last,
        )
