"""NaNGuard (``on_nan=stop``): stop at the first non-finite training loss instead of training on garbage.

Reading the loss on the host every step would force a device sync per step on a GPU. So the check
is kept on the device: each loss (each micro-batch's, under gradient accumulation) is copied into a
window of the losses since the last check (one small copy, the guard's only work on most steps).
Every ``log_every_n_steps`` steps, or when the window is full, the window is checked at once (a few
kernels, no sync) into a record of the first bad loss so far, which is copied to the host without
waiting (``HostReads``) and looked at once it has arrived, a few steps later. At epoch end and
before every checkpoint save the window so far is checked and the record read outright, so a NaN
never reaches a checkpoint. The same path runs on a CPU (where the copy arrives at once), so the
CPU suite runs what a GPU runs. The message names the first bad step and the last good checkpoint.
``on_nan=off`` removes the check.

With ``on_nan=skip`` the built-in classifier skips the step instead (its training_step returns
None, so Lightning does no backward and no optimizer step; deciding that needs the value on the
host, one sync per step on a GPU), and this callback counts the skipped steps. fp16 AMP's loss
scaler already skips steps whose gradients overflow.
"""

from __future__ import annotations

import logging
import os
from collections import deque

import pytorch_lightning as pl
import torch

from trainer.callbacks.host_reads import HostReads
from trainer.errors import TrainingStopped
from trainer.launch.checkpoint_files import checkpoint_candidates

log = logging.getLogger(__name__)


class NaNGuard(pl.Callback):
    def __init__(self, mode: str, checkpoint_dir: str | None) -> None:
        self.mode = mode
        self.checkpoint_dir = checkpoint_dir
        self.skipped = 0
        self._window: torch.Tensor | None = None  # on the device: the losses since the last check
        self._filled = 0
        self._calls = 0  # losses seen; the record counts them, the host maps them to steps
        self._steps: list = []  # the global step of each loss since the last clean read (from call _base)
        self._base = 0
        self._pushed: deque = deque()  # (push, losses seen by then): a clean record lets go of their steps
        self._first_bad: torch.Tensor | None = None  # on the device: -1, or the call of the first non-finite loss
        self._bad_value: torch.Tensor | None = None
        self._reads = HostReads()
        self._pushes = 0
        self._arrived_bad_value = (0, float("nan"))  # (which push, value)

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        if self.mode != "stop":
            return
        loss = loss.detach().reshape(())  # a one-element loss of any shape (a view)
        every = max(1, trainer.log_every_n_steps)
        window = self._window
        if window is None or window.numel() != every or window.dtype != loss.dtype or window.device != loss.device:
            self._check_window()
            self._window = torch.empty(every, dtype=loss.dtype, device=loss.device)
            if self._first_bad is None:
                self._first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
                self._bad_value = torch.zeros((), dtype=torch.float64, device=loss.device)
        self._window[self._filled].copy_(loss)  # the one kernel of most steps
        self._filled += 1
        self._calls += 1
        self._steps.append(trainer.global_step)
        if self._filled == every or (trainer.global_step + 1) % every == 0:
            self._check_window()
            self._pushes += 1  # a pair: the value arrives before its call (pushed first, read in order)
            self._pushed.append((self._pushes, self._calls))
            self._reads.push(("bad_value", self._pushes), self._bad_value)
            self._reads.push(("first_bad", self._pushes), self._first_bad)
        self._look_at(self._reads.ready())  # copies asked for earlier that have arrived

    def _check_window(self) -> None:
        """Fold the window's losses into the record (a few kernels on the device; no sync) and empty it."""
        if not self._filled:
            return
        losses = self._window[: self._filled]
        bad = ~torch.isfinite(losses)
        first = bad.to(torch.uint8).argmax()  # the first bad loss, where there is one
        newly_bad = bad.any() & (self._first_bad < 0)
        start = self._calls - self._filled  # the window's first call
        self._first_bad = torch.where(newly_bad, first + start, self._first_bad)
        value = losses.gather(0, first.view(1)).view(())  # not losses[first]: that reads the index on the host
        self._bad_value = torch.where(newly_bad, value.to(torch.float64), self._bad_value)
        self._filled = 0

    def _look_at(self, values) -> None:
        """Stop with the first bad loss a record that arrived shows (its own pair's value, if not dropped)."""
        for (tag, push), value in values:
            if tag == "bad_value":
                self._arrived_bad_value = (push, value)
            elif value >= 0:  # stopped with the values that arrived: reading the device here would wait for it
                arrived, bad = self._arrived_bad_value
                self._stop(self._steps[int(value) - self._base], bad if arrived == push else float("nan"))
            else:  # clean up to this push: its losses' steps will never be named
                self._forget_until(push)

    def _forget_until(self, push: int) -> None:
        while self._pushed and self._pushed[0][0] <= push:
            _, seen = self._pushed.popleft()
            del self._steps[: seen - self._base]
            self._base = seen

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.mode == "skip" and not outputs:  # training_step returned None: no backward, no step
            self.skipped += 1
            log.warning("on_nan=skip: skipped step at global step %d (non-finite loss)", trainer.global_step)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._raise_if_bad(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._raise_if_bad(trainer)

    def _raise_if_bad(self, trainer) -> None:
        """Check the window so far and read the record outright (a device sync): at epoch end and
        before a checkpoint save only."""
        if self._first_bad is None:
            return
        self._check_window()
        list(self._reads.drain())  # the copies in flight: their news is in the record read now
        call = int(self._first_bad)
        if call >= 0:
            self._stop(self._steps[call - self._base], float(self._bad_value))
        self._base, self._steps = self._calls, []  # all clean so far: no step before here will be named
        self._pushed.clear()

    def _stop(self, step: int, value: float) -> None:
        raise TrainingStopped(
            f"non-finite training loss ({value}) at step {step}; stopped instead of training on "
            f"garbage (on_nan=stop). Last good checkpoint: {self._last_good()}. Try a lower optim.lr, gradient "
            "clipping (trainer.gradient_clip_val=1.0), amp_dtype=bf16, or on_nan=skip."
        )

    def _last_good(self) -> str:
        if self.checkpoint_dir and os.path.isdir(self.checkpoint_dir):
            found = checkpoint_candidates(os.path.dirname(self.checkpoint_dir))
            if found:
                return str(found[0])
        return "none saved yet"
