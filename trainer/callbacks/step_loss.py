"""StepLoss: the training loss every ``trainer.log_every_n_steps`` steps, as ``train/loss``, without a host sync.

Why not ``self.log("train/loss", loss, on_step=True)``: Lightning turns step values into Python
floats (``.item()``) when it writes them, every ``log_every_n_steps`` steps, and on a GPU that waits
for every queued kernel, inside the step loop. Here the loss each such step returned is copied to
the host without waiting (``HostReads``) and written once the copy has arrived, a few steps later,
under its own step number; what is still in flight at the end of the epoch is written then. The
epoch's mean loss (``train/loss_epoch``) stays Lightning's, reduced once per epoch.

For the built-in classifier (``ImageClassifier``); a LightningModule of your own logs what it logs.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from trainer.callbacks.host_reads import HostReads


class StepLoss(pl.Callback):
    def __init__(self) -> None:
        self.reads = HostReads()
        self._last_step = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = trainer.log_every_n_steps
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step = trainer.global_step  # the optimizer steps taken: the x axis Lightning's own step metrics use
        if every and isinstance(loss, torch.Tensor) and step != self._last_step and step % every == 0:
            self._last_step = step
            # Lightning hands over the loss it backpropagated: divided by accumulate's micro-batch count
            self.reads.push(step, loss.detach() * trainer.accumulate_grad_batches)
        self._write(trainer, self.reads.ready())

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._write(trainer, self.reads.drain())

    @staticmethod
    def _write(trainer, values) -> None:
        for step, value in values:
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics({"train/loss": value}, step=step)
