"""BadSampleCounter: how many samples ``data.on_bad_sample=skip`` dropped (short training batches)."""

from __future__ import annotations

import pytorch_lightning as pl

from trainer.callbacks.epoch_timer import batch_size_of


class BadSampleCounter(pl.Callback):
    def __init__(self) -> None:
        self.skipped = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        datamodule = trainer.datamodule
        if datamodule is not None and hasattr(datamodule, "expected_batch_size"):
            self.skipped += max(0, datamodule.expected_batch_size(batch_idx) - batch_size_of(batch))
