"""``stop_at_acc``: stop training after the first validated epoch whose val_acc reaches a threshold.

The tuner's time-to-target probes run on it (``tune.objective=time_to_target``), and a user can set
it on any run. It replaces Lightning's ``EarlyStopping(stopping_threshold=...)``, which stops only
when the value is strictly above the threshold (``torch.gt`` on the float32 metric): accuracies are
k/N and targets round numbers (the report's ``auto`` target is the best minus 0.01), so an epoch
that meets the target exactly is common, and there EarlyStopping trained on while the report and
the tuner counted the target as reached. This callback reads the value metrics.json records (under
either name a model logs, ``val/acc`` or ``val_acc``, rounded the same way) and decides with the
comparison the report uses (``time_to_target.reaches``). With several ranks that value is the mean
over ranks (``rank_scalars``): a user's module that logs val_acc without ``sync_dist`` holds a
different value on each rank, and a rank deciding on its own would stop the run on a number that
metrics.json does not record; the run says so once.
"""

from __future__ import annotations

import logging
from typing import Optional

import pytorch_lightning as pl

from trainer.callbacks.epoch_timer import rank_scalars
from trainer.measure.time_to_target import reaches

log = logging.getLogger(__name__)


class StopAtAccuracy(pl.Callback):
    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.stopped_epoch: Optional[int] = None  # the epoch whose validation reached it
        self._said_no_acc = False
        self._said_unsynced = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.stopped_epoch is not None:
            return
        # every rank gets the same number, the mean over ranks that metrics.json records, and so
        # makes the same decision; one all-gather and one host read per validation
        acc, per_rank = rank_scalars(trainer)
        acc, per_rank = acc.get("val_acc"), per_rank.get("val_acc", [])
        if acc is None and not self._said_no_acc:
            self._said_no_acc = True
            log.warning(
                "stop_at_acc=%g: the validation logged no val/acc or val_acc, so training runs every epoch",
                self.threshold,
            )
        if len(set(per_rank)) > 1 and not self._said_unsynced:
            self._said_unsynced = True
            if trainer.is_global_zero:
                log.warning(
                    "val_acc differs across ranks (%s): the model logs it without sync_dist=True, so each rank holds "
                    "the accuracy of its own share of the validation set. stop_at_acc=%g decides on the mean over "
                    "ranks, the value metrics.json records; log it with self.log(..., sync_dist=True) to make it the "
                    "whole set's on every rank.",
                    ", ".join(f"{v:g}" for v in per_rank),
                    self.threshold,
                )
        if reaches(acc, self.threshold):
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True
            log.info(
                "stop_at_acc=%g reached at epoch %d (val_acc %s): training stops",
                self.threshold,
                trainer.current_epoch,
                acc,
            )
