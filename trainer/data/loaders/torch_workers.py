"""The torch loader: a DataLoader whose workers read, decode and transform each sample on the host,
collate a batch, and hand it over (pinned with ``data.pin_memory``; copied one batch ahead on a side
stream with ``data.device_prefetch``: ``trainer.data.prefetch``).

It serves every format but DALI's and device-resident synthetic images: image folders, the built-in
set, CIFAR-10, packed arrays, Parquet and WebDataset (whose ``BlockSampler`` deals blocks to ranks and
workers itself) and a user's own Dataset.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional

from omegaconf import OmegaConf
from torch.utils.data import DataLoader, IterableDataset

from trainer.data.epoch_ahead import EpochAheadLoader
from trainer.data.folder import skip_none_collate
from trainer.data.loaders.base import Loaders
from trainer.data.prefetch import DevicePrefetchLoader
from trainer.data.sampler import RepeatedSamples
from trainer.data.seeding import SeededSamples
from trainer.data.shards import BlockImages, BlockSampler
from trainer.errors import ConfigError


def custom_collate(batch, dataset: str):
    """data=custom's batches: the user's Dataset decides each sample's shape, and samples of different
    shapes cannot be stacked into one batch (default_collate's RuntimeError, a traceback): one
    paragraph naming the dataset instead."""
    try:
        return skip_none_collate(batch)
    except RuntimeError as e:
        if "stack expects each tensor to be equal size" not in str(e):
            raise
        raise ConfigError(
            f"'{dataset}' gives samples of different shapes in one batch ({str(e).splitlines()[0]}): a batch stacks "
            "its images, so the dataset must return every image at one size. Resize and crop in the dataset "
            "(e.g. torchvision.transforms.v2.Resize(S) then v2.CenterCrop(S)), or use data=imagefolder, which does."
        ) from None


class TorchLoaders(Loaders):
    name = "torch"

    def collate(self, train: bool):
        """How a batch is put together from samples (None: the DataLoader's default)."""
        if self.setup.cfg.name == "synthetic":
            return None
        if self.setup.cfg.name == "custom":
            key = "data.dataset" if train or not self.setup.cfg.get("val_dataset") else "data.val_dataset"
            target = OmegaConf.select(self.setup.cfg, f"{key.split('.', 1)[1]}._target_")
            return functools.partial(custom_collate, dataset=f"{key}._target_={target}")
        return skip_none_collate

    def plan(self) -> Dict[str, int]:
        plan = super().plan()
        if self.setup.cfg.name in ("parquet", "webdataset"):  # BlockSampler deals whole batches to workers
            plan["loader_workers"] = max(1, self.setup.workers)
        return plan

    def train(self, dataset) -> DataLoader:
        sampler = self._block_sampler(dataset, train=True)
        if sampler is None:
            sampler = self.training_order(len(dataset))
            if self.setup.repeats > 1:
                dataset = RepeatedSamples(dataset, self.setup.repeats)
        if self.setup.workers == 0 and self.setup.cfg.name != "synthetic" and not isinstance(dataset, IterableDataset):
            # transforms drawn in this process from a seed of (epoch, sample): the same after a resume
            # (with workers, seeding.py seeds each worker's draws); synthetic images draw nothing
            dataset = SeededSamples(dataset, self.setup.seed, functools.partial(self.epoch_now, sampler))
        return self._data_loader(dataset, sampler, train=True)

    def val(self, dataset) -> DataLoader:
        sampler = self._block_sampler(dataset, train=False)
        if sampler is None and not isinstance(dataset, IterableDataset):
            stop = self.step_limit_samples(len(dataset), train=False)
            if stop is not None:
                # every rank's first samples: Lightning's unshuffled DistributedSampler deals them as before
                from trainer.data.sampler import FirstSamples

                dataset = FirstSamples(dataset, stop * self.world)
        return self._data_loader(dataset, sampler, train=False)

    def _data_loader(self, dataset, sampler, train: bool) -> DataLoader:
        c, workers = self.setup.cfg, self.setup.workers
        kwargs = dict(
            batch_size=c.batch_size,
            sampler=sampler,
            collate_fn=self.collate(train),
            drop_last=train and c.drop_last,
            num_workers=workers,
            pin_memory=c.pin_memory,
            persistent_workers=c.persistent_workers and workers > 0,
            prefetch_factor=c.prefetch_factor if workers > 0 else None,
        )
        if train:  # its next epoch's workers start when this epoch ends (epoch_ahead)
            kwargs["follows"] = self.next_epoch
        device = self.prefetch_device()
        if device is None:
            return EpochAheadLoader(dataset, **kwargs) if train else DataLoader(dataset, **kwargs)

        kwargs["pin_memory"] = kwargs["pin_memory"] or device.type == "cuda"  # an asynchronous copy needs it
        return DevicePrefetchLoader(
            dataset, device=device, transfer=self.to_device, waits=self.setup.prefetch_waits, **kwargs
        )

    def next_epoch(self) -> Optional[int]:
        """The epoch that follows the one being trained, or None where the fit ends with it (its epoch or
        step limit, or a stop already decided)."""
        trainer = self.trainer
        if trainer is None or not hasattr(trainer, "fit_loop") or trainer.should_stop:
            return None
        if getattr(trainer, "reload_dataloaders_every_n_epochs", 0):  # a new loader may come: none made ahead
            return None
        upcoming = trainer.current_epoch + 1
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= upcoming:
            return None
        if trainer.max_steps not in (None, -1) and trainer.global_step + 1 >= trainer.max_steps:
            return None
        return upcoming

    def prefetch_device(self):
        """The device data.device_prefetch copies to, or None when it is off (or not on CUDA)."""
        if not self.setup.cfg.get("device_prefetch") or self.setup.accelerator != "cuda" or self.trainer is None:
            return None
        return self.trainer.strategy.root_device

    def _block_sampler(self, dataset, train: bool):
        """data=parquet / webdataset: each rank and loader worker reads its own blocks (``shards``)."""
        if not isinstance(dataset, BlockImages):
            return None
        c = self.setup.cfg
        sampler = BlockSampler(
            dataset.sizes, self.setup.seed, train, c.batch_size, self.setup.workers, c.shuffle_window
        )
        if train:
            self._order = sampler
            self._resume_into(sampler)
        sampler.stop = self.step_limit_samples(sum(dataset.sizes), train)
        return sampler
