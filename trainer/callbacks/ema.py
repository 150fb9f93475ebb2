"""EMA (``ema=true``): validate and save an exponential moving average of the weights.

Built on Lightning's ``EMAWeightAveraging``, which swaps the averaged weights in for validation,
saves them as the checkpoint's ``state_dict`` (the raw weights under ``current_model_state``) and
leaves them in the model when training ends. One part is replaced: torch's
``AveragedModel.update_parameters`` asks the device ``n_averaged == 0`` on every update, a host
sync in every step on a GPU. Here the update is one ``torch._foreach_lerp_`` per dtype group,
with the update count kept on the host (the first update copies, as torch's does).

Which weights a validation used and a checkpoint holds is said: ``validated_weights`` in
metrics.json, ``"weights": "ema"`` in the checkpoint.

A checkpoint saved at a step's end holds that step's update, whichever callback saves it: the stop's
save (SIGTERM, SIGUSR1, Ctrl-C) runs in a batch-end hook called before this one's and ends the run
there, and the average it saved lacked the last step, so a resumed run ended with another average
than one never stopped. The save brings the average up to date first (``on_save_checkpoint``), and
a resume restores it with its update count: the first update after it blends, never copies.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EMAWeightAveraging


class EMA(EMAWeightAveraging):
    def __init__(self, decay: float) -> None:
        super().__init__(decay=decay, use_buffers=True)
        self.decay = decay
        self.updates = 0  # on the host: no device read to decide the first update

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step_idx = trainer.global_step - 1
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            self._update(pl_module)
            self._latest_update_step = trainer.global_step

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        pass  # updates are per step (should_update(epoch_idx=...) is never true for this callback)

    @torch.no_grad()
    def _update(self, pl_module) -> None:
        average = self._average_model
        pairs = zip(
            itertools.chain(average.module.parameters(), average.module.buffers()),
            itertools.chain(pl_module.parameters(), pl_module.buffers()),
        )
        floats: Dict[Any, tuple] = {}
        for mine, theirs in pairs:
            if self.updates == 0 or not mine.dtype.is_floating_point:
                mine.copy_(theirs)  # the first update, and integer buffers (BatchNorm's step count), copy
            else:
                group = floats.setdefault((mine.device, mine.dtype), ([], []))
                group[0].append(mine)
                group[1].append(theirs.detach())
        for mine, theirs in floats.values():
            torch._foreach_lerp_(mine, theirs, 1.0 - self.decay)
        average.n_averaged.add_(1)  # kept for the checkpoint's averaging_state; never read back here
        self.updates += 1

    def _catch_up(self, trainer, pl_module) -> None:
        """The update of the step that just ended, if a callback called before this one's batch-end
        hook saves now. Only while training: during validation the model holds the average."""
        step = trainer.global_step
        if trainer.training and step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(pl_module)
            self._latest_update_step = step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        self._catch_up(trainer, pl_module)
        if self.state_key in checkpoint.get("callbacks", {}):
            checkpoint["callbacks"][self.state_key] = self.state_dict()  # taken before this hook, and the catch-up
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        checkpoint["weights"] = "ema"  # state_dict: the average; current_model_state: the raw weights

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "updates": self.updates}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.updates = state_dict.get("updates", self._latest_update_step)


class RawWeightsOfAnEmaCheckpoint(pl.Callback):
    """``ema=false`` resuming a checkpoint saved with ``ema=true``: Lightning loads its ``state_dict``, the
    average, and training went on from the average with the raw weights' optimizer state (its momentum),
    saying nothing. Training continues from the raw weights (``current_model_state``), as it would have
    with EMA on; the average is left behind with the switch."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        if checkpoint.get("weights") == "ema" and "current_model_state" in checkpoint:
            pl_module.load_state_dict(checkpoint["current_model_state"])
