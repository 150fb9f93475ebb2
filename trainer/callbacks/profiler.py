"""ProfilerCallback (``profile=true``): a ``torch.profiler`` trace of a few scheduled training steps.

Why not Lightning's ``PyTorchProfiler``: its trace file names contain ``[`` and ``]``, which break
torch-tb-profiler on GPU traces, and it also wraps every hook in record_functions. This callback
steps the profiler once per training batch, writes traces with a clean per-rank worker name into
``<run dir>/profiler/`` (so ``tensorboard --logdir <run dir>`` shows them in the PyTorch Profiler
tab, and the ``.pt.trace.json`` files open in Perfetto), prints the top operators at the end, and
keeps the numbers of ``profiler/summary.html`` (``trainer.callbacks.profile_page``), a page that needs no network.
With ``profiler.memory_snapshot=true`` on CUDA it also records the caching allocator's history and
dumps ``memory_snapshot_rank<N>.pickle`` for PyTorch's memory_viz.
"""

from __future__ import annotations

import logging
import os

import pytorch_lightning as pl
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from trainer.callbacks import profile_page

log = logging.getLogger(__name__)


class ProfilerCallback(pl.Callback):
    def __init__(self, out_dir: str, cfg) -> None:
        self.out_dir = out_dir
        self.cfg = cfg
        self.prof: torch.profiler.profile | None = None
        self.traces: list = []
        self.h2d_share: float | None = None  # host-to-device copies / all device time in the trace (CUDA)

    def on_train_start(self, trainer, pl_module) -> None:
        c = self.cfg
        activities = [ProfilerActivity.CPU]
        if trainer.strategy.root_device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        os.makedirs(self.out_dir, exist_ok=True)
        handler = tensorboard_trace_handler(self.out_dir, worker_name=f"rank{trainer.global_rank}")

        def on_ready(prof):
            handler(prof)
            self.traces = sorted(f for f in os.listdir(self.out_dir) if f.endswith(".pt.trace.json"))

        skip_first = clear_of_validation(c, _boundary(trainer))
        if skip_first != c.skip_first:
            log.info(
                "profile: steps %d-%d recorded (profiler.skip_first %d, not %d): the window reached a validation or an "
                "epoch's end, whose time the profiled steps would have counted",
                skip_first + c.wait + c.warmup,
                skip_first + c.wait + c.warmup + c.active - 1,
                skip_first,
                c.skip_first,
            )
        self.prof = profile(
            activities=activities,
            schedule=schedule(skip_first=skip_first, wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat),
            on_trace_ready=on_ready,
            profile_memory=c.memory,
            with_stack=c.with_stack,
            record_shapes=c.record_shapes,
        )
        self.prof.__enter__()
        self._snapshot = c.memory_snapshot and trainer.strategy.root_device.type == "cuda"
        if c.memory_snapshot and not self._snapshot:
            log.warning(
                "profiler.memory_snapshot=true needs CUDA (it records the CUDA caching allocator): skipped on %s",
                trainer.strategy.root_device.type,
            )
        if self._snapshot:
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.prof is not None:
            self.prof.step()

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop(trainer)

    def _stop(self, trainer) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        if getattr(self, "_snapshot", False):
            path = os.path.join(self.out_dir, f"memory_snapshot_rank{trainer.global_rank}.pickle")
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None)
            log.info("CUDA memory snapshot: %s (drag it into https://pytorch.org/memory_viz)", path)
        if not self.traces:
            log.warning(
                "profile=true recorded no trace: the run had fewer training steps than the schedule needs "
                "(profiler.skip_first + wait + warmup + active = %d).",
                self.cfg.skip_first + self.cfg.wait + self.cfg.warmup + self.cfg.active,
            )
            return
        if trainer.strategy.root_device.type == "cuda":
            try:
                self.h2d_share = h2d_share(prof.key_averages())
            except Exception as e:  # a convenience for the doctor; the trace files are the product
                log.warning("could not read the copy share from the profile: %s", e)
        if trainer.is_global_zero:
            try:  # the offline page's numbers (the page itself is written when the doctor has spoken)
                profile_page.save(profile_page.summarize(prof, trainer.strategy.root_device.type), self.out_dir)
            except Exception as e:  # a convenience; the trace files are the product
                log.warning("could not summarize the profile for summary.html: %s", e)
            sort = "self_cuda_time_total" if trainer.strategy.root_device.type == "cuda" else "self_cpu_time_total"
            try:
                table = prof.key_averages().table(sort_by=sort, row_limit=10)
                log.info("top operators (%s):\n%s", sort, table)
            except Exception as e:  # the summary is a convenience; the trace files are the product
                log.warning("could not summarize the profile: %s", e)
            log.info("profiler traces in %s: tensorboard --logdir %s", self.out_dir, os.path.dirname(self.out_dir))


def _boundary(trainer) -> int:
    """Training batches between two points where the loop leaves them (a validation, an epoch's end)."""
    counts = (trainer.num_training_batches, trainer.val_check_batch)  # (either may be inf: none)
    return min((b for b in counts if isinstance(b, int) and b > 0), default=0)


def clear_of_validation(cfg, boundary: int) -> int:
    """``profiler.skip_first``, moved on where the recorded steps would hold a validation or an epoch's end.

    The profiler's steps end at each training batch's end, so the step after the batch that ends an
    epoch (or a validation interval) also holds that validation, the epoch-end hooks and checkpointing:
    counted as a training step, it showed the page seconds per step of another kind of work. The
    window's start moves to the first place where its recorded steps (``active``, after ``wait`` and
    ``warmup``) fit between two such points; where they cannot (``active`` >= the points' distance) or
    the window repeats, it stays and the page's per-step times include them."""
    if not boundary or cfg.repeat != 1 or cfg.active >= boundary:
        return cfg.skip_first
    first = cfg.skip_first + cfg.wait + cfg.warmup  # the first recorded step (step 0: the first batch)
    while any(j > 0 and j % boundary == 0 for j in range(first, first + cfg.active)):
        first += 1
    return first - cfg.wait - cfg.warmup


def _device_time(event) -> float:
    """An event's own device time where it is device work (a kernel, a memcpy), else 0.

    As torch's own profiler table counts it: CPU ops also carry the time of the kernels they
    launched, and user annotations (``ProfilerStep#N``) span whole steps on the device timeline;
    counting those too would count every kernel two or three times.
    """
    device_type = getattr(event, "device_type", None)
    if device_type == DeviceType.CPU:
        # the legacy (non-Kineto) profiler keeps kernel time on CPU events only
        return event.self_device_time_total if getattr(event, "is_legacy", False) else 0.0
    if getattr(event, "is_user_annotation", False):
        return 0.0
    return getattr(event, "self_device_time_total", 0.0)


def h2d_share(events) -> float | None:
    """Share of device time spent in host-to-device copies, from ``prof.key_averages()``."""
    total = sum(_device_time(e) for e in events)
    copies = sum(_device_time(e) for e in events if "HtoD" in e.key)
    return round(copies / total, 4) if total else None
