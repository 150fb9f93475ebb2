"""Models for tests of multi-process jobs and stops: a failure planted on one rank only, and a stop
signal sent once, to the rank itself or to the ``train.py`` that launched the ranks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from spies import ProbeNet, SignalNet


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class RankFailNet(ProbeNet):
    """ProbeNet failing at init on ``fail_rank`` only (the others build and train), with ProbeNet's own
    message: one rank of a job that fails while the others run on."""

    def __init__(self, num_classes: int = 10, width: int = 8, fail_rank: int = 1):
        super().__init__(num_classes, width, fail_when="init" if _rank() == fail_rank else None)


def launcher_pid() -> int:
    """The process that started this rank's torchrun agent: ``train.py`` for a job it launched
    (``trainer.launch``: train.py -> python -m trainer.torchrun -> rank)."""
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
