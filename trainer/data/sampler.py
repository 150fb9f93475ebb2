"""EpochShuffleSampler: shuffling that is a pure function of (seed, epoch), and can skip ahead.

Why not ``shuffle=True``: the DataLoader's RandomSampler draws from the global RNG, so a resumed run
would see a different order than the run it continues. Here epoch ``e`` is always the same
permutation, Lightning calls ``set_epoch`` every epoch, and after a mid-epoch resume the sampler
skips the batches the interrupted run already trained on (``ResumableState`` tells it how many).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.epoch = 0
        self.skip = {}  # epoch -> samples to skip once (mid-epoch resume)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.length, generator=g).tolist()
        start = self.skip.pop(self.epoch, 0)
        return iter(order[start:])

    def __len__(self) -> int:
        return self.length
