"""Seeds of the data's randomness: a sample's augmentation draws are a function of (seed, epoch, index).

``sample_seed`` mixes the three into one 64-bit seed; ``own_rngs`` and ``seed_rngs`` give a block of
code the process's RNGs and put them back after; ``SeededSamples`` applies both per sample to a
training set read without loader workers. The model uses the same mix for its own per-batch draws
(mixup/cutmix), so they too are the same after a resume.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch
from torch.utils.data import Dataset

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed of (data seed, epoch, sample index), well mixed: neighbouring samples and epochs
    get unrelated random streams."""
    h = _splitmix64(seed & _MASK64)
    h = _splitmix64(h ^ (epoch & _MASK64))
    return _splitmix64(h ^ (index & _MASK64))


@contextlib.contextmanager
def own_rngs():
    """Inside the block the process's RNGs (torch's CPU generator, ``random``, numpy's) are the
    block's to seed with ``seed_rngs``; after it they are as they were."""
    cpu = torch.default_generator
    saved = cpu.get_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        cpu.set_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def seed_rngs(seed: int) -> None:
    torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that reseeds the CUDA generators too
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


class SeededSamples(Dataset):
    """The training set with no loader workers: each sample's random augmentation is drawn from a
    seed of (data seed, epoch, sample index), and the process's RNGs (torch's CPU generator,
    ``random``, numpy's) are put back as they were after each batch.

    Why: the transforms draw from those global RNGs. In the main process their draws used to follow
    the process's stream, so what a batch drew depended on everything drawn before it: a mid-epoch
    resume restored the stream at the checkpoint, but the resumed fit made a new loader iterator
    (which draws its base seed) before its first batch, and with ``data.device_prefetch`` the
    producer thread had drawn for the batches it prepared ahead, so the resumed run trained on
    other crops than the run it continued. A seed per sample makes a batch's draws a function of
    the data alone: the same after a resume, with or without the prefetch thread, however far
    ahead it is. Putting the RNGs back keeps the model's own CPU draws apart from the data's.
    Loader workers each have their own RNGs and are left as they are.
    """

    def __init__(self, dataset, seed: int, epoch_of) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch_of = epoch_of  # () -> the epoch being trained (read at each batch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):
        # everything else is the dataset's (classes, sizes, ...); "dataset" itself is not, while unpickling
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitems__(self, indices):
        """One batch (the DataLoader's batched fetch): the RNGs are saved and put back once per batch."""
        epoch = int(self.epoch_of())
        samples = []
        with own_rngs():
            for index in indices:
                seed_rngs(sample_seed(self.seed, epoch, int(index)))
                samples.append(self.dataset[index])
        return samples

    def __getitem__(self, index):
        return self.__getitems__([index])[0]
