"""``stop_at_acc``: stop training after the first validated epoch whose val_acc reaches a threshold.

The tuner's time-to-target probes run on it (``tune.objective=time_to_target``), and a user can set
it on any run. It replaces Lightning's ``EarlyStopping(stopping_threshold=...)``, which stops only
when the value is strictly above the threshold (``torch.gt`` on the float32 metric): accuracies are
k/N and targets round numbers (the report's ``auto`` target is the best minus 0.01), so an epoch
that meets the target exactly is common, and there EarlyStopping trained on while the report and
the tuner counted the target as reached. This callback reads the value metrics.json records (under
either name a model logs, ``val/acc`` or ``val_acc``, rounded the same way) and decides with the
comparison the report uses (``time_to_target.reaches``).
"""

from __future__ import annotations

import logging
from typing import Optional

import pytorch_lightning as pl

from ..time_to_target import reaches
from .epoch_timer import validation_scalars

log = logging.getLogger(__name__)


class StopAtAccuracy(pl.Callback):
    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.stopped_epoch: Optional[int] = None  # the epoch whose validation reached it
        self._said_no_acc = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.stopped_epoch is not None:
            return
        acc = validation_scalars(trainer).get("val_acc")  # one host read per validation, as the epoch timer's
        if acc is None and not self._said_no_acc:
            self._said_no_acc = True
            log.warning(
                "stop_at_acc=%g: the validation logged no val/acc or val_acc, so training runs every epoch",
                self.threshold,
            )
        # any rank that reached it stops them all (each rank's value is the same where the model syncs it)
        if trainer.strategy.reduce_boolean_decision(reaches(acc, self.threshold), all=False):
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True
            log.info(
                "stop_at_acc=%g reached at epoch %d (val_acc %s): training stops",
                self.threshold,
                trainer.current_epoch,
                acc,
            )
