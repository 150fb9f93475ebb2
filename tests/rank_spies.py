"""Models for tests of multi-process jobs and stops: a failure planted on one rank only, and a stop
signal sent once, to the rank itself or to the ``train.py`` that launched the ranks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from spies import ProbeLightningModule, ProbeNet, SignalNet


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class RankFailNet(ProbeNet):
    """ProbeNet failing at init on ``fail_rank`` only (the others build and train), with ProbeNet's own
    message: one rank of a job that fails while the others run on."""

    def __init__(self, num_classes: int = 10, width: int = 8, fail_rank: int = 1):
        super().__init__(num_classes, width, fail_when="init" if _rank() == fail_rank else None)


def launcher_pid() -> int:
    """The process that started this rank's torchrun agent: ``train.py`` for a job it launched
    (``trainer.launch.processes``: train.py -> python -m trainer.torchrun -> rank)."""
    stat = Path(f"/proc/{os.getppid()}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid


class StopSignalNet(SignalNet):
    """SignalNet whose signal goes ``to`` this rank (``self``) or to the job's launcher (``launcher``:
    the ``train.py`` a user or a scheduler signals), and, with ``once`` (a file path), only by the
    first process that reaches that forward: a rerun of the same command is not signalled again."""

    def __init__(
        self,
        num_classes: int = 10,
        width: int = 8,
        signal_name: str = "SIGTERM",
        at=(3,),
        to: str = "self",
        once: str | None = None,
    ):
        super().__init__(num_classes, width, signal_name, at)
        assert to in ("self", "launcher"), to
        self.to, self.once = to, once

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.forwards += 1
            rank = _rank()
            if rank < len(self.at) and self.forwards == self.at[rank] and self._first():
                os.kill(launcher_pid() if self.to == "launcher" else os.getpid(), signal.Signals[self.signal_name])
        return ProbeNet.forward(self, x)

    def _first(self) -> bool:
        if self.once is None:
            return True
        try:
            with open(self.once, "x"):
                return True
        except FileExistsError:
            return False


class LabelRecorder(ProbeLightningModule):
    """A user's LightningModule that appends each training batch's labels to
    ``record_dir/rank{R}_epoch{E}.txt``: with one image per class, the samples each rank read."""

    def __init__(self, num_classes: int = 10, record_dir: str = "."):
        super().__init__(num_classes)
        self.record_dir = Path(record_dir)

    def training_step(self, batch, batch_idx):
        self.record_dir.mkdir(parents=True, exist_ok=True)
        with open(self.record_dir / f"rank{_rank()}_epoch{self.current_epoch}.txt", "a") as f:
            f.write(" ".join(str(int(y)) for y in batch[1].tolist()) + "\n")
        return super().training_step(batch, batch_idx)
