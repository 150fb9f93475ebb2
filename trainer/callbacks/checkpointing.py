"""Resume that continues where it stopped, and a stop that saves first: the checkpointing callbacks.

- ``ResumableState``: saves and restores the RNG states (torch, CUDA, numpy, python) with the
  checkpoint, so augmentation and dropout continue as if never interrupted (the position inside
  the epoch is the datamodule's: ``trainer.data.loaders``).
- ``PreemptionCallback``: SIGTERM/SIGUSR1 (what SLURM and cloud schedulers send) and Ctrl-C save
  last.ckpt at a training-step boundary (with several ranks, the one step they agree on:
  ``trainer.launch.stop_agreement``) and stop cleanly; ``trainer.cli`` then exits with
  ``PREEMPTED_EXIT_CODE`` (a local sweep stops as a whole: ``trainer.sweep``).
- ``checkpoint_callbacks``: Lightning's ModelCheckpoint as the config asks.

The files themselves (atomic writes, safe loads, which checkpoint a resume takes) are
``trainer.launch.checkpoint_files``.
"""

from __future__ import annotations

import logging
import random
import signal
from datetime import timedelta
from typing import Any, Dict, List, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from trainer.launch import stopping
from trainer.launch.stop_agreement import StopAgreement, take_over_from_lightning
from trainer.launch.stopping import PREEMPTED_EXIT_CODE  # noqa: F401  (the run's exit code after a stop: resume with ckpt_path=last)

log = logging.getLogger(__name__)


class ResumableState(pl.Callback):
    """What Lightning does not save: the RNG states.

    Lightning saves weights, optimizer, scheduler, AMP scaler and loop counters; the datamodule saves
    where inside the epoch its loader stands (``trainer.data.loaders``). This adds the RNG states
    (torch, CUDA, numpy, python), so that augmentation and dropout continue as if never interrupted.
    """

    def state_dict(self) -> Dict[str, Any]:
        state = {
            "torch": torch.get_rng_state(),
            "python": _plain(random.getstate()),
            "numpy": _plain(np.random.get_state()),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(_tuples(state["python"]))
        np.random.set_state(_tuples(state["numpy"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def _plain(value):
    """RNG states as tensors/lists/ints only, so they load under weights_only.

    numpy's state holds its MT19937 key as a uint32 array; it is saved as int64. torch saves a uint32
    tensor's storage untyped, and Lightning's loader of a full FSDP checkpoint
    (``lightning_fabric.utilities.load._lazy_load``) takes a tensor's dtype from its storage's type:
    resuming failed with "'UntypedStorage' object has no attribute 'dtype'".
    """
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.astype(np.int64))
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _tuples(value):
    """What ``_plain`` saved, back as the tuples and arrays ``random``/``numpy`` take (the key saved as
    int64, or as uint32 by older checkpoints)."""
    if isinstance(value, torch.Tensor):
        return (
            value.numpy().astype(np.uint32)
            if value.dtype == torch.int64 or value.dtype == torch.int32
            else value.numpy()
        )
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


class PreemptionCallback(pl.Callback):
    """Checkpoint at a training-step boundary after SIGTERM, SIGUSR1 or Ctrl-C (``trainer.launch.stopping``),
    then stop at once (the run's status says preempted; exit code 75).

    With several ranks, every rank stops at the one step they agree on (``trainer.launch.stop_agreement``),
    whichever rank was signalled and when, and they save last.ckpt together. Lightning's own SIGTERM
    handling (its per-step broadcast, its handler that raises at its own check points) is turned off
    for the fit: a signal during validation or between epochs waits for the next training step's end.
    torchrun's agent kills the ranks if they take longer than it allows: ``checkpoint.stop_grace_s``
    where the trainer launched them (``trainer.launch.torchrun``), else its ``--shutdown-timeout`` (30 s).

    SIGUSR2 too where the process already handles it in Python: submitit's jobs do (Hydra's Slurm
    launcher), it is their preemption/time-limit signal. That handler (submitit's) runs after the
    checkpoint is saved: submitit then requeues the job and exits, and the requeued job resumes
    from last.ckpt (trainer/launch/slurm.py).
    """

    CHAINED_ONLY = tuple(s for s in (getattr(signal, "SIGUSR2", None),) if s is not None)

    def __init__(self, last_path: str) -> None:
        self.last_path = last_path
        self.saved_at_step: Optional[int] = None
        self.exit_requested = False  # a chained handler (submitit's) asked the process to exit
        self.agreement = StopAgreement()
        self._agreed: Optional[str] = None  # the signal the ranks agreed to stop on
        self._chained: Optional[str] = None  # a SIGUSR2 for submitit
        self._signum: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._installed = False

    @property
    def received(self) -> Optional[str]:
        """The signal that stopped the run (the agreed one: possibly another rank's), if one did."""
        return self._agreed or self._chained or stopping.requested()

    def _handler(self, signum, frame) -> None:
        self._chained = signal.Signals(signum).name
        self._signum = signum

    def setup(self, trainer, pl_module, stage) -> None:
        take_over_from_lightning(trainer)  # before fit installs Lightning's handlers

    def on_fit_start(self, trainer, pl_module) -> None:
        # ours for the whole fit (Lightning's are turned off); from here a stop waits for a step boundary
        self._installed = stopping.install()
        stopping.stop_during_setup(False)
        for s in self.CHAINED_ONLY:
            try:
                if not callable(signal.getsignal(s)):
                    continue  # nobody in this process listens for it: leave its default
                self._previous[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        self.agreement.setup()

    def _save(self, trainer) -> None:
        trainer.save_checkpoint(self.last_path)  # every rank: the strategy decides who writes
        self.saved_at_step = trainer.global_step
        log.warning(
            "%s received: saved %s at step %d; stopping. Resume with ckpt_path=last.",
            self.received,
            self.last_path,
            trainer.global_step,
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.saved_at_step is not None:
            return
        self._agreed = self.agreement.decide(self._chained or stopping.requested())
        if not self._agreed:
            return
        self._save(trainer)
        # only the signals we listen to for someone else; Lightning's own SIGTERM/SIGUSR1 handlers
        # (its SIGTERM exception, its Slurm auto-requeue with an hpc checkpoint) stay off
        previous = self._previous.get(self._signum) if self._chained else None
        if callable(previous):
            try:
                previous(self._signum, None)  # e.g. submitit: requeue this job, then exit
            except SystemExit:
                self.exit_requested = True
                raise
        # Stop now: ending the epoch instead (should_stop) would run the epoch-end checkpoint, which
        # records the cut-short epoch as finished, and the resumed run would skip the rest of it.
        # Lightning's SIGTERMException is a SystemExit that its loop lets through; trainer.run reads
        # saved_at_step to tell it from a crash.
        from pytorch_lightning.utilities.exceptions import SIGTERMException

        raise SIGTERMException(0)

    def on_train_end(self, trainer, pl_module) -> None:
        self.agreement.close()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        # one process, stopped by a SystemExit from elsewhere after a signal (submitit's handler
        # exiting): still saved here, at a step boundary. Several ranks save only where they agreed.
        if (
            self.received
            and self.saved_at_step is None
            and isinstance(exception, SystemExit)
            and not self.agreement.distributed
        ):
            self._save(trainer)
        self._restore()

    def _restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
        if self._installed:
            stopping.uninstall()
            self._installed = False


def checkpoint_callbacks(cfg, dirpath: str) -> List[pl.Callback]:
    """ModelCheckpoint callbacks for the ``checkpoint.*`` keys (Lightning allows one trigger per callback).

    Periodic checkpoints are ranked by step, so ``keep_last_k`` keeps the newest k; every one of
    them also refreshes last.ckpt.
    """
    # every callback refreshes the one last.ckpt (no "last-v1.ckpt" versions): it is always the newest state
    common = dict(
        dirpath=dirpath, save_weights_only=cfg.save_weights_only, save_last=True, enable_version_counter=False
    )
    periodic = dict(common, monitor="step", mode="max", save_top_k=cfg.keep_last_k)
    callbacks: List[pl.Callback] = []
    if cfg.every_n_epochs:
        callbacks.append(
            ModelCheckpoint(
                filename="epoch{epoch:03d}-step{step:07d}",
                every_n_epochs=cfg.every_n_epochs,
                auto_insert_metric_name=False,
                **periodic,
            )
        )
    if cfg.every_n_steps:
        callbacks.append(
            ModelCheckpoint(
                filename="step{step:07d}",
                every_n_train_steps=cfg.every_n_steps,
                auto_insert_metric_name=False,
                **periodic,
            )
        )
    if cfg.every_n_minutes:
        callbacks.append(
            ModelCheckpoint(
                filename="time-step{step:07d}",
                train_time_interval=timedelta(minutes=cfg.every_n_minutes),
                auto_insert_metric_name=False,
                **periodic,
            )
        )
    if cfg.monitor:
        callbacks.append(
            ModelCheckpoint(
                filename="best-epoch{epoch:03d}-step{step:07d}",
                monitor=cfg.monitor,
                mode=cfg.mode,
                save_top_k=1,
                auto_insert_metric_name=False,
                **common,
            )
        )
    if not callbacks:  # last.ckpt is always kept
        callbacks.append(ModelCheckpoint(save_top_k=0, **common))
    return callbacks
