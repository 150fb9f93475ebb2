"""What ``data=parquet`` and ``data=webdataset`` share: samples stored in blocks (Parquet row groups,
WebDataset tar shards) that are cheap to read whole and dear to read one sample at a time.

``BlockImages`` is a map-style dataset over the blocks: sample ``i`` lives in one block, and each
process keeps the few blocks it is reading in a small LRU, so a block is read (from disk or an
object store) once per pass, not once per sample.

``BlockSampler`` decides who reads what, and is what makes these formats safe under DDP:

- epoch ``e``'s order is a pure function of (seed, e): the blocks are permuted, the rows of each
  block permuted, then samples are shuffled within windows of ``data.shuffle_window`` consecutive
  samples (so a batch mixes several blocks while a process only ever holds a window's blocks);
- each rank takes one contiguous slice of that order (padded by wrapping, as DistributedSampler
  does, so every rank has the same number of batches: unequal batches per rank hang DDP), so ranks
  read disjoint blocks, and every sample is read exactly once per epoch when the count divides;
- within a rank, each loader worker gets a contiguous run of whole batches, emitted in the order
  the DataLoader hands batches to workers (batch k to worker k mod W), so a worker reads only its
  own blocks;
- it skips the batches a mid-epoch checkpoint already trained (``skip``), on every rank: the
  position is the same on all ranks, and the order does not depend on anything else.

It subclasses DistributedSampler only so that Lightning leaves it in place (Lightning wraps any
other sampler in one that re-shards and re-shuffles); rank and world size are read when an epoch
starts, from the process group Lightning set up.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import OrderedDict
from typing import Callable, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from trainer.data.decoders import DECODE_ERRORS, undecodable
from trainer.data.layout import TRAIN_SPLIT, VAL_SPLITS, find_val_split
from trainer.data.storage import explain
from trainer.errors import ConfigError
from trainer.rank import world_size

log = logging.getLogger(__name__)


class BlockImages(Dataset):
    """Map-style images stored in blocks; ``load_block(b)`` -> list of (encoded bytes, label)."""

    def __init__(
        self,
        sizes: Sequence[int],
        load_block: Callable,
        classes: List[str],
        transform,
        decode: Callable,
        on_bad_sample: str = "skip",
        keep_blocks: int = 2,
        where: Callable[[int], str] = str,
    ) -> None:
        self.sizes = [int(s) for s in sizes]
        self.starts = [0]
        for s in self.sizes:
            self.starts.append(self.starts[-1] + s)
        self.load_block = load_block
        self.classes = classes
        self.transform = transform
        self.decode = decode
        self.on_bad_sample = on_bad_sample
        self.keep_blocks = max(2, keep_blocks)
        self.where = where  # block index -> "file, row group 3" for messages
        self._blocks: OrderedDict = OrderedDict()  # per process: never pickled into workers

    @classmethod
    def from_reader(
        cls,
        reader,
        sizes: Sequence[int],
        classes: List[str],
        transform,
        decode: Callable,
        on_bad_sample: str,
        window: int,
    ):
        """Over a block reader (Parquet's RowGroups, WebDataset's TarShards): it loads the blocks and names them in
        messages; a process keeps the blocks one shuffle window spans."""
        return cls(
            sizes, reader, classes, transform, decode, on_bad_sample, block_capacity(sizes, window), reader.where
        )

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_blocks"] = OrderedDict()
        return state

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, index: int):
        block = bisect.bisect_right(self.starts, index) - 1
        return block, index - self.starts[block]

    def _block(self, block: int):
        rows = self._blocks.get(block)
        if rows is None:
            rows = self.load_block(block)
            if len(rows) != self.sizes[block]:
                raise ConfigError(
                    f"{self.where(block)} holds {len(rows)} samples, not the {self.sizes[block]} its index says; the dataset changed after it was indexed."
                )
            self._blocks[block] = rows
            while len(self._blocks) > self.keep_blocks:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(block)
        return rows

    def __getitem__(self, index: int):
        block, row = self.locate(index)
        data, label = self._block(block)[row]
        try:
            image = self.decode(data)
        except DECODE_ERRORS as e:
            return undecodable(
                self.on_bad_sample,
                f"sample {row} of {self.where(block)}",
                f"{type(e).__name__}: {e}",
                "Set data.on_bad_sample=skip to skip such samples and count them.",
            )
        return (self.transform(image) if self.transform is not None else image), int(label)


def require_root(root: Optional[str], name: str, holding: str) -> None:
    """data=parquet / data=webdataset need data.root; say what it must hold and how to make it."""
    if not root:
        raise ConfigError(
            f"'data.root' is not set. data={name} needs data.root=DIR_OR_URL holding "
            f"{holding} (python -m trainer.pack SRC DST --format {name} makes them)."
        )


def block_capacity(sizes: Sequence[int], window: int) -> int:
    """Blocks a process holds at once: as many as one shuffle window can touch."""
    covered, count = 0, 0
    for size in sorted(sizes):  # the most blocks a window can span: the smallest ones, back to back
        if covered >= window:
            break
        covered += max(1, size)
        count += 1
    return min(64, max(2, count + 2))  # + a block cut at each end of the window


class BlockSampler(DistributedSampler):
    def __init__(
        self,
        sizes: Sequence[int],
        seed: int,
        shuffle: bool,
        batch_size: int,
        workers: int,
        window: int,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
    ) -> None:
        # DistributedSampler.__init__ is not called: it needs the process group, which Lightning
        # creates after the loader is defined; rank and world size are read in __iter__.
        self.sizes = [int(s) for s in sizes]
        self.seed = seed
        self.shuffle = shuffle
        self.batch_size = int(batch_size)
        self.workers = max(1, int(workers))
        self.window = max(1, int(window))
        self._replicas, self._rank = num_replicas, rank
        self.epoch = 0
        self.drop_last = False
        self.skip = {}  # epoch -> samples to skip once (mid-epoch resume)
        self.stop = None  # samples per epoch, where a step limit cuts it short (see sampler.py); None: all

    @property
    def num_replicas(self) -> int:
        if self._replicas is not None:
            return self._replicas

        return world_size()

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @property
    def num_samples(self) -> int:
        return math.ceil(sum(self.sizes) / self.num_replicas)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_order(self) -> torch.Tensor:
        """All sample indices of this epoch, in the order the ranks split."""
        starts = torch.tensor([0] + self.sizes).cumsum(0)
        if not self.shuffle:
            return torch.arange(int(starts[-1]))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        parts = [
            starts[b] + torch.randperm(self.sizes[b], generator=g)
            for b in torch.randperm(len(self.sizes), generator=g).tolist()
        ]
        order = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
        for s in range(0, len(order), self.window):  # mix neighbouring blocks
            chunk = order[s : s + self.window]
            order[s : s + self.window] = chunk[torch.randperm(len(chunk), generator=g)]
        return order

    def rank_indices(self) -> List[int]:
        order = self.epoch_order()
        n, world = self.num_samples, self.num_replicas
        if len(order) and len(order) < n * world:  # pad by wrapping: every rank gets n samples
            order = torch.cat([order] * math.ceil(n * world / len(order)))[: n * world]
        return order[self.rank * n : (self.rank + 1) * n].tolist()

    def worker_order(self, indices: List[int]) -> List[int]:
        """Whole batches, a contiguous run per loader worker, in the order the DataLoader hands them out."""
        b, w = self.batch_size, self.workers
        full = len(indices) // b
        batches = [indices[k * b : (k + 1) * b] for k in range(full)]
        per, extra = divmod(full, w)
        runs, start = [], 0
        for i in range(w):
            count = per + (1 if i < extra else 0)
            runs.append(batches[start : start + count])
            start += count
        out = []
        for r in range(per + (1 if extra else 0)):
            for run in runs:
                if r < len(run):
                    out += run[r]
        return out + indices[full * b :]  # the short last batch (if any) comes last

    def __iter__(self) -> Iterator[int]:
        order = self.worker_order(self.rank_indices())
        start = self.skip.pop(self.epoch, 0)
        return iter(order[start : self.stop])

    def __len__(self) -> int:
        return self.num_samples if self.stop is None else min(self.num_samples, self.stop)


def split_blocks(sizes: Sequence[int], val_split: float, seed: int):
    """(train blocks, val blocks): for a dataset with no val split of its own, whole blocks are held out (seeded)."""
    n = len(sizes)
    if val_split <= 0:
        return list(range(n)), []
    if n < 2:
        log.warning(
            "data.val_split=%g: the dataset is one block (row group or shard), which cannot be split; training without validation",
            val_split,
        )
        return list(range(n)), []
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    n_val = min(n - 1, max(1, round(n * val_split)))
    held = sum(sizes[b] for b in perm[:n_val]) / max(1, sum(sizes))
    if abs(held - val_split) > 0.1:
        log.warning(
            "data.val_split=%g: whole blocks are held out, so validation gets %.0f%% of the samples (%d of %d blocks)",
            val_split,
            100 * held,
            n_val,
            n,
        )
    return sorted(perm[n_val:]), sorted(perm[:n_val])


def find_split_files(fs, root: str, suffix: str, key: str = "data.root"):
    """{"train": [files], "val": [files] or None} under ``root``, in the layouts datasets are published in.

    ``root/train/`` and ``root/val/`` (or ``validation/``: ``layout.VAL_SPLITS``, the image folder's
    names too) folders; else files whose names start with ``train`` and ``val``/``validation`` anywhere
    below root (``data/train-00000-of-00004.parquet``); else every file is training data (val: None).
    """

    def files(path):
        try:
            return sorted(f for f in fs.find(path) if f.endswith(suffix))
        except Exception as e:  # noqa: BLE001
            raise explain(e, root, key) from None

    if fs.isdir(f"{root}/{TRAIN_SPLIT}"):
        val_dir = find_val_split(f"{root}/{{}}", fs.isdir)
        return {"train": files(f"{root}/{TRAIN_SPLIT}"), "val": files(val_dir) if val_dir else None}
    everything = files(root)
    name = lambda f: f.rsplit("/", 1)[-1]  # noqa: E731
    train = [f for f in everything if name(f).startswith(TRAIN_SPLIT)]
    val = [f for f in everything if name(f).startswith(VAL_SPLITS)]
    if train:
        return {"train": train, "val": val or None}
    return {"train": everything, "val": None}
