"""The interface every loader object keeps, and what they share: this rank's training order and the
position a resume continues from.

A loader object (``torch_workers``, ``nvjpeg``, ``device_resident``, ``dali``) makes the iterables
Lightning asks the datamodule for, moves a batch to the device, says what it is for metrics.json,
and saves and restores where inside an epoch it stopped (``state_dict`` / ``load_state_dict``,
kept in the checkpoint through the datamodule's own Lightning hooks). The datamodule builds the data
sets and calls these methods; it never branches on which loader it has.

**The training order** is the same for every loader: ``EpochShuffleSampler``'s permutation of
(seed, epoch), dealt to the ranks by Lightning's own ``DistributedSamplerWrapper`` under a
distributed strategy (``sampler.deal_to_ranks``; dealt here rather than by Lightning, also for one
process, so that a DALI row and a torch row of the A/B table read the same samples in the same
order, and so that a resume can skip inside this rank's share).

**A resume** skips, in each rank's own share, the batches that rank trained before the checkpoint
(the fit loop's count at the moment the checkpoint was saved): the resumed run trains exactly the
samples the uninterrupted run would have, on one rank or several. Where the plan the order depends
on (processes, batch size, and for the block formats loader workers) changed since the checkpoint,
the rest of that epoch follows the new plan, and a warning says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional

import torch

from trainer.data.augment import Augmentation
from trainer.data.prefetch import move_to_device
from trainer.data.sampler import EpochShuffleSampler, deal_to_ranks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoaderSetup:
    """What a loader object is built from, fixed before the first epoch."""

    cfg: Any  # the ``data`` config section (DictConfig): batch size, pinning, prefetch, step-limit keys
    seed: int
    workers: int  # loader workers (or DALI's threads): data.num_workers, or data.auto_workers' count
    repeats: int  # data.repeated_augment: draws of each sample per epoch
    augmentation: Augmentation
    accelerator: str
    decoder: Optional[str]  # what decodes the training images (None: nothing is decoded)
    channels_last: bool = False  # the model's memory format (DALI hands such batches over as NHWC)
    prefetch_waits: Any = None  # data.prefetch.PrefetchWaits: the prefetching loader's waits, read by the step timer


class Loaders:
    """One way of making batches, for the train and val loaders of a fit (see the module docstring)."""

    name = "torch"  # metrics.json ``loader``

    def __init__(self, setup: LoaderSetup) -> None:
        self.setup = setup
        self.trainer = None  # the fit's Trainer, once Lightning asks for a loader (None: used on its own)
        self._resume: Optional[tuple] = None  # a checkpoint's (epoch, batches this rank trained in it)
        self._saved_plan = None  # and the plan it was saved with
        self._plan_said = False
        self._order = None  # the training sampler last handed out (a resume restored later goes into it)

    # -- what the datamodule calls ------------------------------------------------------------------
    def train(self, dataset) -> Iterable:
        raise NotImplementedError

    def val(self, dataset) -> Iterable:
        raise NotImplementedError

    def to_device(self, batch, device: torch.device):
        """A host batch -> the device (non_blocking where the memory is pinned)."""
        return move_to_device(batch, device)

    def example(self, samples: list, device: torch.device):
        """``samples`` of the training set as one batch on ``device``, as the loader hands them over."""
        images = torch.stack([s[0] for s in samples]).to(device)
        return images, torch.tensor([int(s[1]) for s in samples], device=device)

    def describe(self) -> Dict[str, Any]:
        """The loader in metrics.json: which one, what decodes, with how many workers (or threads)."""
        return {"loader": self.name, "decoder": self.setup.decoder, "num_workers": self.setup.workers}

    def plan(self) -> Dict[str, int]:
        """What this rank's share of an epoch depends on besides (seed, epoch)."""
        return {"processes": self.world, "batch_size": self.setup.cfg.batch_size}

    def state_dict(self) -> Dict[str, Any]:
        """Where the fit stands: (the epoch a resume trains first, the batches this rank already trained
        in it), and the plan. Saved at an epoch's last step or after it, that is the next epoch, whole
        (Lightning resumes there)."""
        epoch, batches = 0, 0
        trainer = self.trainer
        if trainer is not None and hasattr(trainer, "fit_loop"):
            loop = trainer.fit_loop
            epoch = loop.epoch_progress.current.processed
            batches = loop.epoch_loop.batch_progress.current.processed
            if batches >= trainer.num_training_batches:  # the epoch's batches are all trained
                epoch, batches = loop.epoch_progress.current.started, 0  # started: incremented as each epoch starts
        return {"loader": self.name, "position": [int(epoch), int(batches)], "plan": self.plan()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """A checkpoint's position. Restored before Lightning asks for the loaders, or (FSDP restores
        after setting up, and the optimizers' set-up may already have asked) into the training order
        already handed out, before its first iteration."""
        epoch, batches = state.get("position", (0, 0))
        self._resume = (int(epoch), int(batches))
        self._saved_plan = state.get("plan")
        if self._order is not None:
            self._resume_into(self._order)

    # -- shared by the loaders ----------------------------------------------------------------------
    @property
    def world(self) -> int:
        return getattr(self.trainer, "world_size", 1) if self.trainer is not None else 1

    @property
    def rank(self) -> int:
        return getattr(self.trainer, "global_rank", 0) if self.trainer is not None else 0

    @property
    def distributed(self) -> bool:
        """Whether the training order is dealt to ranks: a distributed strategy, even of one process
        (Lightning would wrap the sampler then too)."""
        if self.trainer is None:
            return False
        return self.world > 1 or getattr(self.trainer, "distributed_sampler_kwargs", None) is not None

    def epoch_now(self, sampler=None) -> int:
        """The epoch being trained: the fit's, else the sampler's when the loader is used on its own."""
        if self.trainer is not None:
            return self.trainer.current_epoch
        return getattr(sampler, "epoch", 0)

    def start_epoch(self) -> int:
        """The epoch a loader made now starts in. On a restart Lightning makes the loader's iterator
        before it calls ``set_epoch``, and loader workers draw indices at once, so the sampler starts
        there: the fit loop's epoch, or a resume's while the fit loop has not passed it (Lightning may
        ask for the training loader before it restores its loops: ``estimated_stepping_batches``, from
        a scheduler's set-up)."""
        loop = getattr(self.trainer, "fit_loop", None)
        if loop is not None:
            live = int(loop.epoch_progress.current.processed)
        else:
            live = int(getattr(self.trainer, "current_epoch", 0) or 0) if self.trainer is not None else 0
        if self._resume is not None and live <= self._resume[0]:
            return self._resume[0]
        return live

    def resume_skip(self, epoch: int) -> int:
        """Samples of ``epoch`` this rank trained before the checkpoint a resume continues (0 if none).
        Kept for every loader made for that epoch (Lightning may make it again: a reload); the sampler
        skips them once, at the epoch's iteration."""
        if self._resume is None or self._resume[0] != epoch or not self._resume[1]:
            return 0
        saved, now = self._saved_plan, self.plan()
        if saved and saved != now and not self._plan_said:
            self._plan_said = True
            log.warning(
                "resuming mid-epoch %d with %s, not %s as when the checkpoint was saved: the rest of this epoch "
                "follows the new plan, so some of its samples may be seen twice or not at all (later epochs are exact)",
                epoch,
                _plan_text(now),
                _plan_text(saved),
            )
        return self._resume[1] * self.setup.cfg.batch_size

    def _resume_into(self, order) -> None:
        """Start ``order`` (a training sampler) at the resumed epoch, skipping what was trained in it."""
        epoch = self.start_epoch()
        order.set_epoch(epoch)
        skip = self.resume_skip(epoch)
        if skip:
            order.skip[epoch] = skip

    def step_limit_samples(self, samples: int, train: bool) -> Optional[int]:
        """``trainer.limit_train_batches`` / ``limit_val_batches`` as the samples each rank's loader is to
        draw of an epoch of ``samples`` (over every rank), where a number of batches cuts the epoch
        short; None where the whole epoch runs. A loader that draws only those is what keeps persistent
        workers from building batches past the limit that the next epoch must drain (sampler.py's
        docstring). A fraction (a float) is left to Lightning: it takes that fraction of the loader's
        length, which a shorter loader would change."""
        cfg = self.setup.cfg
        if self.trainer is None or not isinstance(cfg.batch_size, int):
            return None
        limit = self.trainer.limit_train_batches if train else self.trainer.limit_val_batches
        if not isinstance(limit, int) or isinstance(limit, bool):
            return None
        size = cfg.batch_size
        per_rank = -(-samples // self.world)  # padded to even shares, as Lightning deals them
        batches = per_rank // size if train and cfg.drop_last else -(-per_rank // size)
        return limit * size if 0 < limit < batches else None

    def training_order(self, length: int):
        """This rank's sampler over a training set of ``length`` draws: the epoch's permutation, dealt
        to the ranks, cut at a step limit, starting where a resume continues (module docstring)."""
        sampler = EpochShuffleSampler(length, self.setup.seed, self.setup.repeats)
        stop = self.step_limit_samples(length, train=True)
        self._order = deal_to_ranks(sampler, self.rank, self.world, stop, self.distributed)
        self._resume_into(self._order)
        return self._order


def _plan_text(plan: Dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in plan.items())
