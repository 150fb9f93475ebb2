"""EpochTimer: wall time of each training epoch, its samples, and where the time went.

Why not Lightning's ``Timer``/``ThroughputMonitor``: Timer measures whole stages (validation
included) and ThroughputMonitor synchronizes the device every step. Here the device is
synchronized only at epoch boundaries (and around validation, whose time is reported apart and
taken out of the training epoch), so the measurement does not slow what it measures.

Each epoch is split three ways (``StepClock`` says how each part is measured):
``data_wait_s`` (blocked in the loader's ``__next__``), ``transfer_s`` (batch to device plus
device-side decode/normalize) and the rest (the step itself, callbacks, logging). ``fixed_s`` is
the part of the epoch outside its steps: ``startup_s`` before the first step (the loader's
iterator, starting its workers unless they persist, the first fetch) and the time after the last
step; it does not grow with the number of steps (the tuner scales only the rest).

What a process pays before its first epoch starts is ``setup_s`` on that epoch's record: from the
start of ``fit`` (the model already on its device) to the epoch's first clock reading, that is the
compiler's warm-up, restoring a checkpoint, the sanity check's validation (and its compile), and
making the training loader's first iterator (starting its workers). Time to target counts it
(``time_to_target.with_elapsed``); epoch times do not.

``compile=true`` (``track_compiles``): a training step during which dynamo compiled a graph (its
graph counter grew: the first step, and each new input size of progressive_resize) is a compiling
step; its time beyond the epoch's median plain step is that epoch's ``compile_s``. Validation
compiles too: its first batch compiles the evaluation graph (eval mode, no grad), and a resumed
process compiles it again. A validation batch during which the counter grew is timed the same way,
beyond that validation's median plain batch (per batch rather than against a later validation's
time: the record of the epoch is written before any later validation runs, and the loader's
start-up stays out); it goes into the validation's entry (``compile_s``) and the epoch's
``val_compile_s``. ``compile_time_s`` sums both kinds, and time to target counts the validation's
share as training time (``time_to_target.with_elapsed``): a compiled run pays it before its first
accuracy is known.

History across resumes: ``previous`` holds the epochs the run dir's metrics.json already recorded;
``history()`` merges them with this process's epochs, one entry per epoch number (a full epoch
beats a partial one, a newer record beats an older one of the same kind). After a mid-epoch resume
Lightning does not call ``on_train_epoch_start``; that epoch is timed from its first batch in this
process and marked ``partial`` (and ``resumed``), so it never claims time it did not see and stays
out of the medians. The run writes its metrics.json journal after each epoch from these records
(``trainer.run.record.MetricsJournal``, the callback after this one).

why longer: one callback that sees every epoch's hooks; the timing, the resume history and the
per-epoch figures it hands the trackers are read from the same clocks.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytorch_lightning as pl
import torch

from trainer import tracking
from trainer.callbacks.step_clock import StepClock
from trainer.measure.flops import mfu
from trainer.measure.time_to_target import with_elapsed
from trainer.switches.model_transforms import compiled_graphs

log = logging.getLogger(__name__)


def _sync(trainer: pl.Trainer) -> None:
    if trainer.strategy.root_device.type == "cuda":
        torch.cuda.synchronize(trainer.strategy.root_device)


def batch_size_of(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    return 0


def _beyond_typical(compiling: List[float], plain: List[float]) -> float:
    """The compiling steps' time beyond the median plain step (all of it where none was plain)."""
    typical = statistics.median(plain) if plain else 0.0
    return sum(max(0.0, d - typical) for d in compiling)


def merge_epochs(previous: List[Dict[str, Any]], current: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One record per epoch number, in order: full beats partial; otherwise the newer record wins."""
    chosen: Dict[int, Dict[str, Any]] = {}
    for record in list(previous) + list(current):  # later = newer
        old = chosen.get(record["epoch"])
        if old is None or not (record.get("partial") and not old.get("partial")):
            chosen[record["epoch"]] = record
    return [chosen[k] for k in sorted(chosen)]


# what a validation logged, under ImageClassifier's names and the common flat ones a user's module may use
VALIDATION_KEYS = {"val_acc": ("val/acc", "val_acc"), "val_loss": ("val/loss", "val_loss")}


def validation_scalars(trainer) -> Dict[str, float]:
    """val_acc / val_loss of the validation that just ran, rounded as metrics.json records them.

    With several ranks, the mean over the ranks (see ``rank_scalars``; every rank must call it at
    the same point, as a collective)."""
    return rank_scalars(trainer)[0]


def rank_scalars(trainer) -> Tuple[Dict[str, float], Dict[str, List[float]]]:
    """(the mean over ranks, each rank's value) of val_acc / val_loss, rounded as metrics.json records them.

    A user's module that logs without ``sync_dist=True`` keeps each rank's own value in its
    ``callback_metrics``; ``stop_at_acc`` decides on the value metrics.json records, so both take the
    mean over ranks (equal shares of the validation set: the whole set's accuracy, what ``sync_dist``
    gives). Where the model syncs it every rank holds that mean already and it is unchanged. One
    all-gather and one host read per call.
    """
    found = [
        next((trainer.callback_metrics[n] for n in names if n in trainer.callback_metrics), None)
        for names in VALIDATION_KEYS.values()
    ]
    if trainer.world_size == 1:
        means = {f: round(float(v), 6) for f, v in zip(VALIDATION_KEYS, found) if v is not None}
        return means, {f: [v] for f, v in means.items()}
    device = trainer.strategy.root_device
    row = []  # per field: its value (0 where not logged), 1 where logged
    for value in found:
        logged = value is not None
        value = torch.as_tensor(value if logged else 0.0, device=device).detach().float().reshape(())
        row += [value, torch.tensor(float(logged), device=device)]
    table = trainer.strategy.all_gather(torch.stack(row)).reshape(trainer.world_size, -1).tolist()
    means, per_rank = {}, {}
    for i, field in enumerate(VALIDATION_KEYS):
        values = [r[2 * i] for r in table if r[2 * i + 1]]
        if values:
            means[field] = round(sum(values) / len(values), 6)
            per_rank[field] = [round(v, 6) for v in values]
    return means, per_rank


def _steady_tflops(steady: List[Dict[str, Any]], flops_per_sample, samples_per_s) -> Optional[float]:
    """Median of the epochs' own TFLOP/s where they all have one (progressive_resize: each epoch its
    own size), else the model's FLOPs at the median samples/s."""
    if steady and all(e.get("tflops") is not None for e in steady):
        return round(statistics.median(e["tflops"] for e in steady), 6)
    return round(flops_per_sample * samples_per_s / 1e12, 6) if flops_per_sample else None


class EpochTimer(pl.Callback):
    def __init__(self, previous: List[Dict[str, Any]] | None = None) -> None:
        self.previous: List[Dict[str, Any]] = previous or []
        self.clock = StepClock()  # pass as Trainer(profiler=...)
        self.epochs: List[Dict[str, Any]] = []  # this process's epochs
        self.first_step_s: float | None = None
        self.flops_per_sample: float | None = None  # set by run(): model FLOPs per training sample
        self.peak_flops: float | None = None  # set by run(): the device's peak FLOP/s (MFU per epoch), if known
        # progressive_resize (set by run()): the training size of an epoch, and the full size flops_per_sample is for
        self.train_size: Optional[Callable[[int], int]] = None
        self.full_size: int | None = None
        # samples the last validation saw, all ranks (the report judges accuracy differences by it)
        self.val_samples: int | None = None
        self.track_compiles = False  # set by run() with compile=true
        self._val_count = 0
        self._val_plain: List[float] = []  # this validation's batch durations, compile=true only
        self._val_compiling_batches: List[float] = []
        self._val_graphs_before = 0
        self._val_batch_t0 = 0.0
        self._fresh = True  # the first epoch this process runs is warm-up (also after a resume)
        self._fit_t0: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._t0: float | None = None
        self._step_start = 0.0
        self._val = 0.0
        self._samples = self._steps = 0
        self._val_t0: float | None = None
        self._mid_epoch_start = False
        self._startup = 0.0
        self._last_step_end: float | None = None
        self._val_at_last_step = 0.0
        self._validations: List[Dict[str, Any]] = []  # this epoch's validations, in order (report.val_per_epoch)
        self._val_train_s = 0.0  # training time of the epoch when the validation in flight began
        self._graphs_before = 0
        self._plain_steps: List[float] = []  # step durations, compile=true only
        self._compiling_steps: List[float] = []
        self._val_compile = 0.0  # the compile time of this epoch's validations
        self._val_compiling = 0  # their batches that compiled
        self.clock.reset()

    def _start(self, trainer) -> None:
        _sync(trainer)
        self._t0 = time.perf_counter()
        root = trainer.strategy.root_device
        self.clock.cuda_device = root if root.type == "cuda" else None
        self.clock.active = True

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_t0 = time.perf_counter()  # first among the callbacks: before the compiler's warm-up

    # ---- training epoch boundaries
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._reset()
        self._start(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._t0 is None:
            # resumed mid-epoch: Lightning skipped on_train_epoch_start, and this batch was already
            # fetched; time what this process saw of the epoch, from here
            self._reset()
            self._start(trainer)
            self._mid_epoch_start = True
            now = self._t0
        if self._steps == 0:
            # creating the loader's iterator (starting its workers unless they persist) and the first fetch
            self._startup = now - self._t0
        if self.track_compiles:
            self._graphs_before = compiled_graphs()
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self._step_start
        if self.track_compiles:
            compiled = compiled_graphs() > self._graphs_before
            (self._compiling_steps if compiled else self._plain_steps).append(now - self._step_start)
        self._samples += batch_size_of(batch)
        self._steps += 1
        self._last_step_end, self._val_at_last_step = now, self._val

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val_count = 0
        self._val_plain = []  # this validation's batch durations, compile=true only
        self._val_compiling_batches = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.track_compiles and self._val_t0 is not None:
            self._val_graphs_before = compiled_graphs()
            self._val_batch_t0 = time.perf_counter()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._val_count += batch_size_of(batch)
        if self.track_compiles and self._val_t0 is not None:
            compiled = compiled_graphs() > self._val_graphs_before
            took = time.perf_counter() - self._val_batch_t0
            (self._val_compiling_batches if compiled else self._val_plain).append(took)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self._val_count:
            # a DistributedSampler gives every rank the same number of samples
            self.val_samples = self._val_count * trainer.world_size

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or self._t0 is None:
            return
        _sync(trainer)
        self.clock.active = False
        self._val_t0 = time.perf_counter()
        self._val_train_s = self._val_t0 - self._t0 - self._val  # the epoch's training so far

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._val_t0 is None:
            return
        _sync(trainer)
        self._val += time.perf_counter() - self._val_t0
        self._val_t0 = None
        # the host reads the scalars here, once per validation (after the sync above)
        steps = trainer.num_training_batches if isinstance(trainer.num_training_batches, int) else None
        entry = {
            "step": self._steps,  # training steps of this epoch before it
            "fraction": round(self._steps / steps, 4) if steps else None,
            "train_s": round(self._val_train_s, 4),
            **validation_scalars(trainer),
        }
        if self._val_compiling_batches:
            compile_s = _beyond_typical(self._val_compiling_batches, self._val_plain)
            self._val_compile += compile_s
            self._val_compiling += len(self._val_compiling_batches)
            entry["compile_s"] = round(compile_s, 4)
        self._validations.append(entry)
        self.clock.active = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._t0 is None:
            return  # resumed at an epoch's end: no batch of it ran in this process
        # after the last step and outside validation (read before the sync: draining the device's
        # queue is the steps' compute, not a fixed cost)
        teardown = 0.0
        if self._last_step_end is not None:
            teardown = max(0.0, time.perf_counter() - self._last_step_end - (self._val - self._val_at_last_step))
        _sync(trainer)
        self.clock.active = False
        samples = self._samples
        if trainer.world_size > 1:
            # the epoch ends when the slowest rank ends (rank 0 reads the clock after the barrier);
            # samples are summed over ranks, once per epoch
            trainer.strategy.barrier("epoch_timer")
            samples = int(
                trainer.strategy.reduce(
                    torch.tensor(float(samples), device=trainer.strategy.root_device), reduce_op="sum"
                )
            )
        elapsed = time.perf_counter() - self._t0 - self._val
        wait, transfer = self.clock.data_wait_s(), self.clock.transfer_s()
        epoch = {
            "epoch": trainer.current_epoch,
            "time_s": round(elapsed, 4),
            "samples": samples,
            "samples_per_s": round(samples / elapsed, 2) if elapsed > 0 else 0.0,
            "data_wait_s": round(wait, 4),
            "transfer_s": round(transfer, 4),
            "startup_s": round(self._startup, 4),
            "fixed_s": round(self._startup + teardown, 4),
            "steps": self._steps,
            "val_time_s": round(self._val, 4),
            "warmup": self._fresh,  # the first epoch pays for compile, autotune, worker start-up
        }
        if self._fresh and self._fit_t0 is not None:
            epoch["setup_s"] = round(self._t0 - self._fit_t0, 4)  # this process's, before its first epoch
        epoch.update(self._compiles())
        stopped_early = isinstance(trainer.num_training_batches, int) and self._steps < trainer.num_training_batches
        epoch.update(self._validation_fields(stopped_early and not self._mid_epoch_start))
        if self._mid_epoch_start:
            epoch["resumed"] = True
        if self._mid_epoch_start or stopped_early:
            epoch["partial"] = True  # stopped early (preemption, stop_at_acc) or resumed mid-epoch: not a full epoch
        flops = self.flops_per_sample
        if self.train_size is not None:
            size = epoch["image_size"] = self.train_size(trainer.current_epoch)
            if flops:  # a convolution's or attention's cost grows with the pixels (a ViT cannot resize at all)
                flops *= (size / self.full_size) ** 2
        tflops = flops * epoch["samples_per_s"] / 1e12 if flops else None
        if tflops is not None:
            epoch["tflops"] = round(tflops, 6)
        self._fresh = False
        self._t0 = None
        self.epochs.append(epoch)
        self._publish(trainer, epoch, elapsed, wait, transfer, tflops)

    def _validation_fields(self, cut_short: bool) -> Dict[str, Any]:
        """The epoch's val_acc / val_loss (its last validation's), and every validation when it also
        validated within the epoch (report.val_per_epoch), or stopped before its end (``cut_short``:
        stop_at_acc after a validation within it), so that its time to target says where in the epoch
        that validation came, not the epoch's end."""
        if not self._validations:
            return {}
        last = self._validations[-1]
        fields = {k: last[k] for k in VALIDATION_KEYS if k in last}
        if len(self._validations) > 1 or last["step"] < self._steps or cut_short:
            fields["validations"] = list(self._validations)
        return fields

    def _compiles(self) -> Dict[str, Any]:
        """compile=true: this epoch's compiling steps and their time beyond its median plain step,
        and its validations' compiling batches, each beyond its validation's median plain batch."""
        fields: Dict[str, Any] = {}
        if self._compiling_steps:
            fields["compile_s"] = round(_beyond_typical(self._compiling_steps, self._plain_steps), 4)
            fields["compiling_steps"] = len(self._compiling_steps)
        if self._val_compiling:  # its validations' compiling batches (see the module docstring)
            fields["val_compile_s"] = round(self._val_compile, 4)
            fields["val_compiling_steps"] = self._val_compiling
        return fields

    def _publish(self, trainer, epoch: Dict[str, Any], elapsed: float, wait: float, transfer: float, tflops) -> None:
        """Rank 0: the epoch's scalars to every logger (trackers), its line to the log, the journal written."""
        scalars = {
            "perf/epoch_time_s": elapsed,
            "perf/samples_per_s": epoch["samples_per_s"],
            "perf/data_wait_fraction": wait / elapsed if elapsed else 0.0,
            "perf/transfer_fraction": transfer / elapsed if elapsed else 0.0,
        }
        if tflops is not None:
            scalars["perf/tflops"] = tflops
            utilization = mfu(tflops, self.peak_flops, trainer.world_size)
            if utilization is not None:
                scalars["perf/mfu"] = utilization
        tracking.log_epoch_metrics(trainer, scalars, epoch=trainer.current_epoch)
        tracking.flush(trainer)  # with the journal below: a kill loses at most the epoch in flight
        if trainer.is_global_zero:
            log.info(
                "epoch %d: %.3f s train, %.1f samples/s, data wait %.0f%%, transfer %.0f%%, val %.2f s%s%s",
                epoch["epoch"],
                elapsed,
                epoch["samples_per_s"],
                100 * wait / elapsed if elapsed else 0,
                100 * transfer / elapsed if elapsed else 0,
                self._val,
                " (warm-up)" if epoch["warmup"] else "",
                " (partial: resumed mid-epoch)" if self._mid_epoch_start else "",
            )

    # ---- summary
    def history(self) -> List[Dict[str, Any]]:
        """Every epoch of this run dir, earlier processes' included, once each, with the training and
        validation time elapsed since the run started (``time_to_target.with_elapsed``)."""
        return with_elapsed(merge_epochs(self.previous, self.epochs))

    def summary(self, compiled: bool = False) -> Dict[str, Any]:
        """Medians over the steady epochs (all full epochs when none is steady), as metrics.json wants them.

        With ``compiled``, ``compile_time_s`` is the time of this process's compiling steps beyond
        a plain step's (see the module docstring): the first step, where torch.compile traces and
        generates code, every later step that compiled again, and the validation batches that
        compiled (also alone, as ``val_compile_s``).
        """
        full = [e for e in self.history() if not e.get("partial")]
        steady = [e for e in full if not e["warmup"]] or full
        if not steady:
            return {"epoch_time_s": None, "samples_per_s": None, "data_wait_fraction": None, "transfer_fraction": None}
        total_time = sum(e["time_s"] for e in steady)
        median_time = statistics.median(e["time_s"] for e in steady)
        steps = max(1, statistics.median(e["steps"] for e in steady))
        compile_time = val_compile = None
        if compiled and any("compile_s" in e or "val_compile_s" in e for e in self.epochs):
            val_compile = round(sum(e.get("val_compile_s", 0.0) for e in self.epochs), 3)
            compile_time = round(sum(e.get("compile_s", 0.0) for e in self.epochs) + val_compile, 3)
        elif compiled and self.first_step_s is not None:  # no graph counter in this torch: the first step's
            compile_time = round(max(0.0, self.first_step_s - median_time / steps), 3)
        samples_per_s = statistics.median(e["samples_per_s"] for e in steady)

        def fraction(key: str) -> Optional[float]:
            if not total_time or any(key not in e for e in steady):
                return None
            return round(sum(e[key] for e in steady) / total_time, 4)

        return {
            "epoch_time_s": round(median_time, 4),
            "samples_per_s": round(samples_per_s, 2),
            "data_wait_fraction": fraction("data_wait_s"),
            "transfer_fraction": fraction("transfer_s"),
            "steady_epochs": len([e for e in full if not e["warmup"]]),
            "first_step_s": round(self.first_step_s, 4) if self.first_step_s is not None else None,
            "compile_time_s": compile_time,
            "val_compile_s": val_compile,
            "val_time_s": round(statistics.median(e["val_time_s"] for e in steady), 4),
            "flops_per_sample": self.flops_per_sample,
            "tflops": _steady_tflops(steady, self.flops_per_sample, samples_per_s),
        }
