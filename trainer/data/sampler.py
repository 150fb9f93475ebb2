"""EpochShuffleSampler: shuffling that is a pure function of (seed, epoch), and can skip ahead.

Why not ``shuffle=True``: the DataLoader's RandomSampler draws from the global RNG, so a resumed run
would see a different order than the run it continues. Here epoch ``e`` is always the same
permutation, Lightning calls ``set_epoch`` every epoch, and after a mid-epoch resume the sampler
skips the batches the interrupted run already trained on (the loader object's ``state_dict`` tells it
how many: ``trainer.data.loaders``).

``repeats`` > 1 (``data.repeated_augment``, DeiT's repeated augmentation): each sample of the epoch's
permutation is taken ``repeats`` times in a row and the epoch is cut back to ``length`` draws, so an
epoch is as long as without it and covers about 1/repeats of the samples. The k-th repeat of sample
``i`` is drawn as index ``i + k x length`` (``RepeatedSamples`` maps it back to ``i``), so that each
repeat gets its own augmentation seed. Under DDP the draws are dealt to the ranks in turn (rank r
takes draws r, r + world, ...: ``deal_to_ranks``), so the repeats of a sample land on different
ranks, as DeiT's ``RASampler`` does; Lightning's own wrapping would shuffle the draws again first
and scatter the repeats.

``stop`` (``trainer.limit_train_batches`` given as a number of batches; a fraction is left to
Lightning, which takes it of the loader's length): an epoch cut short after that many draws. Lightning stops
taking batches at its limit, but a loader's persistent workers keep building the ones queued past it,
and the next epoch's iterator waits for them to be drained (torch's ``_MultiProcessingDataLoaderIter
._reset``): work thrown away in every epoch, which made a short epoch with workers look slower than
it is (the tuner's probes). The epoch's first draws are the same; there are just no more of them.
``FirstSamples`` does the same for validation.
"""

from __future__ import annotations

import itertools
import os
from typing import Iterator, Optional

import torch
from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import Dataset, Sampler


class EpochShuffleSampler(Sampler[int]):
    def __init__(self, length: int, seed: int, repeats: int = 1, stop: Optional[int] = None) -> None:
        self.length = length
        self.seed = seed
        self.repeats = repeats
        self.stop = stop  # draws per epoch, where a step limit cuts the epoch short; None: all
        self.epoch = 0
        self.skip = {}  # epoch -> samples to skip once (mid-epoch resume)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.length, generator=g)
        if self.repeats > 1:
            copies = torch.arange(self.repeats).repeat(self.length) * self.length
            order = (order.repeat_interleave(self.repeats) + copies)[: self.length]
        order = order.tolist()
        start = self.skip.pop(self.epoch, 0)
        return iter(order[start : self.stop])

    def __len__(self) -> int:
        return self.length if self.stop is None else min(self.length, self.stop)


class RepeatedSamples(Dataset):
    """The training set as ``EpochShuffleSampler(repeats=...)`` draws from it: index ``i + k x n`` is
    sample ``i`` (its k-th repeat in the epoch)."""

    def __init__(self, dataset, repeats: int) -> None:
        self.dataset = dataset
        self.n = len(dataset)
        self.repeats = repeats

    def __len__(self) -> int:
        return self.n * self.repeats

    def __getattr__(self, name):  # the wrapped set's attributes (classes, targets, ...), not its methods' hooks
        if name in ("dataset", "n", "repeats") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int):
        return self.dataset[index % self.n]

    def __getitems__(self, indices):  # the DataLoader's batched fetch, where the wrapped set has one (a Subset)
        fetch = getattr(self.dataset, "__getitems__", None)
        wrapped = [int(i) % self.n for i in indices]
        return fetch(wrapped) if fetch is not None else [self.dataset[i] for i in wrapped]


class FirstSamples(Dataset):
    """The first ``n`` samples of a data set (validation under a step limit), its attributes as the
    whole set's (``classes``, ``targets``, ...), as a model or callback may read them."""

    def __init__(self, dataset, n: int) -> None:
        self.dataset = dataset
        self.n = min(n, len(dataset))

    def __len__(self) -> int:
        return self.n

    def __getattr__(self, name):
        if name in ("dataset", "n") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.dataset[index]

    def __getitems__(self, indices):
        fetch = getattr(self.dataset, "__getitems__", None)
        return fetch(list(indices)) if fetch is not None else [self.dataset[i] for i in indices]


class FirstDrawsOfShare(DistributedSamplerWrapper):
    """Lightning's ``DistributedSamplerWrapper``, stopped after this rank's first ``stop`` draws, and
    skipping, once, the first draws of this rank's share that a resumed run already trained
    (``skip``: epoch -> draws)."""

    def __init__(self, sampler, stop: Optional[int], **kwargs) -> None:
        super().__init__(sampler, **kwargs)
        self.stop = stop
        self.skip = {}

    def __iter__(self):
        start = self.skip.pop(self.epoch, 0)
        return itertools.islice(super().__iter__(), start, self.stop)

    def __len__(self) -> int:
        return super().__len__() if self.stop is None else min(self.stop, super().__len__())


def deal_to_ranks(
    sampler: EpochShuffleSampler, rank: int, world: int, stop: Optional[int] = None, distributed: Optional[bool] = None
):
    """The training sampler under DDP, as this rank draws from it: Lightning's own
    ``DistributedSamplerWrapper`` with the arguments Lightning gives a training loader's (shuffled by
    PL_GLOBAL_SEED and the epoch, then dealt in turn), except with repeats over several ranks, which
    are dealt in turn without that shuffle so that a sample's repeats go to different ranks. Lightning
    leaves a sampler that is already distributed as it is, and its set_epoch reaches ours. ``stop``:
    this rank's first draws only (a step limit; see the module docstring), the same ones Lightning's
    wrapper deals it. ``distributed``: whether Lightning deals the training sampler (a distributed
    strategy, even of one process: it wraps the sampler then too); default: more than one rank."""
    if not (world > 1 if distributed is None else distributed):
        sampler.stop = stop
        return sampler

    seed = int(os.getenv("PL_GLOBAL_SEED", 0))  # pytorch_lightning's _get_distributed_sampler
    shuffle = sampler.repeats == 1 or world == 1
    return FirstDrawsOfShare(sampler, stop, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
