"""EpochTimer: wall time of each training epoch, its samples, and how long it waited for data.

Why not Lightning's ``Timer``/``ThroughputMonitor``: Timer measures whole stages (validation
included) and ThroughputMonitor synchronizes the device every step. Here the device is
synchronized only at epoch boundaries (and around validation, whose time is reported apart and
taken out of the training epoch), so the measurement does not slow what it measures.

Data wait is the gap between the end of one training step and the start of the next: Lightning
fetches the next batch (and moves it to the device) in that gap, so with a fast input pipeline it
is close to zero, and with a slow one it is most of the epoch.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Dict, List

import pytorch_lightning as pl
import torch

log = logging.getLogger(__name__)


def _sync(trainer: pl.Trainer) -> None:
    if trainer.strategy.root_device.type == "cuda":
        torch.cuda.synchronize(trainer.strategy.root_device)


def _batch_size(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0


class EpochTimer(pl.Callback):
    def __init__(self, previous: List[Dict[str, Any]] | None = None) -> None:
        # a resumed run: the epochs its metrics.json already holds; those at or after the epoch the
        # resumed run starts with are dropped (they did not reach a checkpoint)
        self.previous: List[Dict[str, Any]] = previous or []
        self.epochs: List[Dict[str, Any]] = []
        self.step_times: List[float] = []  # per-step compute time of the current epoch (host view)
        self.first_step_s: float | None = None
        self._fresh = True  # the first epoch this process runs is warm-up (also after a resume)
        self._reset()

    def _reset(self) -> None:
        self._t0 = self._last_end = self._step_start = 0.0
        self._wait = self._val = 0.0
        self._samples = self._steps = 0
        self._val_t0: float | None = None

    # ---- training epoch boundaries
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._reset()
        _sync(trainer)
        self._t0 = self._last_end = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        self._wait += now - self._last_end
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self._step_start
        self._samples += _batch_size(batch)
        self._steps += 1
        self._last_end = now

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        _sync(trainer)
        self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._val_t0 is None:
            return
        _sync(trainer)
        self._val += time.perf_counter() - self._val_t0
        self._val_t0 = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        _sync(trainer)
        samples = self._samples
        if trainer.world_size > 1:
            # the epoch ends when the slowest rank ends (rank 0 reads the clock after the barrier);
            # samples are summed over ranks, once per epoch
            trainer.strategy.barrier("epoch_timer")
            samples = int(trainer.strategy.reduce(torch.tensor(float(samples), device=trainer.strategy.root_device), reduce_op="sum"))
        elapsed = time.perf_counter() - self._t0 - self._val
        epoch = {
            "epoch": trainer.current_epoch,
            "time_s": round(elapsed, 4),
            "samples": samples,
            "samples_per_s": round(samples / elapsed, 2) if elapsed > 0 else 0.0,
            "data_wait_s": round(self._wait, 4),
            "steps": self._steps,
            "val_time_s": round(self._val, 4),
            "warmup": self._fresh,  # the first epoch pays for compile, autotune, worker start-up
        }
        if isinstance(trainer.num_training_batches, int) and self._steps < trainer.num_training_batches:
            epoch["partial"] = True  # stopped early (preemption) or resumed mid-epoch: not a full epoch
        if self._fresh and self.previous:
            self.epochs = [e for e in self.previous if e["epoch"] < epoch["epoch"]]
        self._fresh = False
        self.epochs.append(epoch)
        if trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics(
                {"perf/epoch_time_s": elapsed, "perf/samples_per_s": epoch["samples_per_s"], "perf/data_wait_fraction": self._wait / elapsed if elapsed else 0.0},
                step=trainer.current_epoch,
            )
        if trainer.is_global_zero:
            log.info(
                "epoch %d: %.3f s train, %.1f samples/s, data wait %.0f%%, val %.2f s%s",
                epoch["epoch"], elapsed, epoch["samples_per_s"], 100 * self._wait / elapsed if elapsed else 0, self._val,
                " (warm-up)" if epoch["warmup"] else "",
            )

    # ---- summary
    def summary(self, compiled: bool = False) -> Dict[str, Any]:
        """Medians over the steady epochs (all epochs when only one ran), as metrics.json wants them.

        With ``compiled``, ``compile_time_s`` is the first step's time beyond a steady step's: the
        first forward and backward are where torch.compile traces and generates code.
        """
        full = [e for e in self.epochs if not e.get("partial")]
        steady = [e for e in full if not e["warmup"]] or full
        if not steady:
            return {"epoch_time_s": None, "samples_per_s": None, "data_wait_fraction": None}
        total_time = sum(e["time_s"] for e in steady)
        median_time = statistics.median(e["time_s"] for e in steady)
        steps = max(1, statistics.median(e["steps"] for e in steady))
        compile_time = None
        if compiled and self.first_step_s is not None:
            compile_time = round(max(0.0, self.first_step_s - median_time / steps), 3)
        return {
            "epoch_time_s": round(median_time, 4),
            "samples_per_s": round(statistics.median(e["samples_per_s"] for e in steady), 2),
            "data_wait_fraction": round(sum(e["data_wait_s"] for e in steady) / total_time, 4) if total_time else None,
            "steady_epochs": len([e for e in full if not e["warmup"]]),
            "first_step_s": round(self.first_step_s, 4) if self.first_step_s is not None else None,
            "compile_time_s": compile_time,
            "val_time_s": round(statistics.median(e["val_time_s"] for e in steady), 4),
        }
