"""How the ranks of a multi-process run agree on one step to stop at, with no host wait per step.

A stop signal (``trainer.launch.stopping``) reaches each rank on its own clock: Slurm signals each node's
step, a cloud scheduler's SIGTERM reaches the nodes seconds apart, Ctrl-C reaches one node's
terminal. A rank that saved as soon as *it* was signalled met the checkpoint's barrier while the
others, not yet signalled, entered the next step's gradient all-reduce: the job hung. So a rank
only *proposes* a stop, and every rank stops at the step they agree on.

The agreement (``StopAgreement.decide``, once per training batch): each rank starts an all-reduce
(MAX) of its request, the signal's number or 0, with ``async_op=True``, and reads the result of the
all-reduce it started at the previous batch. That result is the same number on every rank and is
read at the same batch on every rank, so all ranks stop at the same step, one or two steps after
the first signal. The all-reduce runs over a gloo group of its own on a CPU tensor: no GPU takes
part (an NCCL run's gradients stay on NCCL), so reading it never makes the host wait for the
device. It waits for the other ranks only when one is more than a step behind, which the next
gradient all-reduce would make it wait for anyway; ``blocked_reads`` counts those reads.

``take_over_from_lightning`` turns off what Lightning 2.6 does for the same purpose, for this
trainer only, and says why:

- ``_TrainingEpochLoop._broadcast_sigterm_tensor`` (Lightning PR #20825) broadcasts a flag from
  rank 0 and reads it with ``.item()`` before every training step when ``world_size > 1``: a
  host-GPU sync per step in every multi-GPU run (Lightning issue #21487), and it only hears rank
  0's signal;
- ``_SignalConnector.register_signal_handlers`` installs, inside ``fit``, a SIGTERM handler in
  front of ours that raises Lightning's ``SIGTERMException`` at its own check points (inside
  validation among them, where ``ema=true`` holds the averaged weights in the model) and
  broadcasts from inside the signal handler, a collective only the signalled rank enters.

Both are private names of Lightning's: if an upgrade renames them, ``take_over_from_lightning``
raises at start-up rather than let a run silently pay the per-step sync or hang on a stop
(``tests/test_distributed_stop.py`` also counts the broadcasts of a 2-rank run).
"""

from __future__ import annotations

import logging
import signal
from typing import Any, Optional

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.trainer.connectors.signal_connector import _SignalConnector

log = logging.getLogger(__name__)


class StopAgreement:
    """One fit's agreement on the stop step (see the module docstring); trivial with one process."""

    def __init__(self) -> None:
        self.group: Any = None  # the gloo group of the ranks, or None with one process
        self.blocked_reads = 0  # reads that found the previous batch's all-reduce not yet complete
        self.rounds = 0  # all-reduces started
        self._pending: Optional[tuple] = None  # (work, tensor) of the previous batch's all-reduce

    def setup(self) -> None:
        """Create the ranks' gloo group (a collective: every rank calls it at the same point of ``fit``)."""
        if self.group is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.group = dist.new_group(backend="gloo")

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def decide(self, requested: Optional[str]) -> Optional[str]:
        """This rank's request (a signal name or None) in; the signal every rank stops on now, or None."""
        if not self.distributed:
            return requested

        if self._pending is not None:
            agreed = self._read()
            if agreed:
                return signal.Signals(agreed).name
        proposal = torch.tensor([int(signal.Signals[requested]) if requested else 0], dtype=torch.int32)
        work = dist.all_reduce(proposal, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, proposal)
        self.rounds += 1
        return None

    def _read(self) -> int:
        work, proposal = self._pending
        self._pending = None
        if not work.is_completed():
            self.blocked_reads += 1
        work.wait()
        return int(proposal[0])  # a CPU tensor: no device is read

    def close(self) -> None:
        """Complete the all-reduce still in flight (training ended): every rank started it, so it finishes."""
        if self._pending is not None:
            try:
                self._read()
            except Exception as e:  # a peer already gone (its failure is reported on its own)
                log.debug("stop agreement: the last all-reduce did not complete: %s", e)
        self._pending = None


def take_over_from_lightning(trainer) -> None:
    """Turn off Lightning's own stop-signal handling for ``trainer`` (see the module docstring for why)."""
    connector = getattr(trainer, "_signal_connector", None)
    missing = [
        name
        for name, there in (
            ("_TrainingEpochLoop._broadcast_sigterm_tensor", hasattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor")),
            ("_SignalConnector.register_signal_handlers", hasattr(_SignalConnector, "register_signal_handlers")),
            ("Trainer._signal_connector", isinstance(connector, _SignalConnector)),
        )
        if not there
    ]
    if missing:
        raise RuntimeError(
            f"pytorch-lightning {pl.__version__} no longer has {', '.join(missing)}, which the trainer turns off "
            "so that ranks agree on a stop without a host sync per step (trainer/launch/stop_agreement.py). "
            "Use pytorch-lightning 2.6 (pyproject.toml pins it), or update trainer/launch/stop_agreement.py."
        )
    # the stop signals stay ours for the whole fit (trainer.launch.stopping); Lightning's teardown then has
    # nothing of its own to restore
    connector.register_signal_handlers = _no_lightning_handlers(connector)
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = _no_broadcast


def _no_lightning_handlers(connector):
    def register_signal_handlers() -> None:
        connector.received_sigterm = False
        connector._original_handlers = {}

    return register_signal_handlers


def _no_broadcast() -> None:
    """In place of Lightning's per-step broadcast: ``StopAgreement`` decides at the step's end."""
