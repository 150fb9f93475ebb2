"""StepClock: how long each training step was blocked on the data loader, and how long its batch took to reach the device.

A Lightning ``Profiler`` and not a callback gap, because Lightning already brackets exactly these two
things with profiler actions, and nothing else:

- ``[_TrainingEpochLoop].train_dataloader_next``: the loader's ``__next__`` (the data fetcher's own
  hook point). Time here is **data wait**: the step could not start because no batch was ready.
- ``[Strategy]<Name>.batch_to_device``: ``transfer_batch_to_device`` plus ``on_after_batch_transfer``
  (copy to the device, nvJPEG decode, uint8 -> float normalize). Time here is **transfer**.
  (``on_before_batch_transfer`` runs on the host before this action: it counts as the rest.)

The gap between one batch's end and the next batch's start, which the timer used before, also holds
every later callback's batch-end work (checkpoint saves, profiler export), Lightning's logging and
the transfer itself (which, from pageable memory, waits for the GPU to finish the previous step), so
compute landed in "data wait" and the doctor prescribed loader workers for compute-bound runs.

On CUDA the transfer is timed with CUDA events on the compute stream (read once per epoch, after the
epoch's one synchronize), so a host thread blocked on a pageable copy -- which is waiting for the
previous step's kernels -- is not counted as transfer. On CPU it is host time.

``data.device_prefetch`` copies (and decodes) batches in a thread of its own; the step loop's wait
for a batch is split there by what that thread was doing (``add_prefetch_transfer``: the copying
part moves from data wait to transfer), and the compute stream's stalls on a batch not yet copied
are timed with CUDA events (``add_device_transfer``). Only actions inside a training epoch and
outside validation count (``active``).
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

import torch
from pytorch_lightning.profilers import Profiler

FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
TRANSFER_SUFFIX = ".batch_to_device"


def _is_transfer(action_name: str) -> bool:
    """The strategy's batch_to_device (not the LightningModule/DataModule hooks nested inside it)."""
    return action_name.startswith("[Strategy]") and action_name.endswith(TRANSFER_SUFFIX)


class StepClock(Profiler):
    def __init__(self) -> None:
        super().__init__()
        self.active = False  # set by EpochTimer: inside a training epoch, not in validation
        self.cuda_device: Optional[torch.device] = None
        self.reset()

    def reset(self) -> None:
        self.fetch_s = 0.0
        self.transfer_host_s = 0.0
        self.prefetch_transfer_s = 0.0
        self._events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._fetch_t0: Optional[float] = None
        self._transfer_t0: Optional[float] = None
        self._event0: Optional[torch.cuda.Event] = None

    # ---- Lightning's Profiler interface: called for every hook; anything else returns at once
    def start(self, action_name: str) -> None:
        if not self.active:
            return
        if action_name == FETCH_ACTION:
            self._fetch_t0 = time.perf_counter()
        elif _is_transfer(action_name):
            if self.cuda_device is not None:
                self._event0 = torch.cuda.Event(enable_timing=True)
                self._event0.record(torch.cuda.current_stream(self.cuda_device))
            self._transfer_t0 = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if action_name == FETCH_ACTION and self._fetch_t0 is not None:
            self.fetch_s += time.perf_counter() - self._fetch_t0
            self._fetch_t0 = None
        elif self._transfer_t0 is not None and _is_transfer(action_name):
            self.transfer_host_s += time.perf_counter() - self._transfer_t0
            self._transfer_t0 = None
            if self._event0 is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record(torch.cuda.current_stream(self.cuda_device))
                self._events.append((self._event0, end))
                self._event0 = None

    def summary(self) -> str:
        return ""  # nothing to print at teardown: the numbers go into metrics.json via EpochTimer

    # ---- fed by data.device_prefetch (trainer.data.prefetch), whose copies happen off the step loop
    def add_prefetch_transfer(self, seconds: float) -> None:
        """Host time the step loop waited for a batch while it was being copied or decoded (the rest of its wait is data wait)."""
        if self.active:
            self.prefetch_transfer_s += seconds

    def add_device_transfer(self, start: "torch.cuda.Event", end: "torch.cuda.Event") -> None:
        """A stretch of the compute stream spent waiting for a prefetched batch's copy (read at epoch end)."""
        if self.active:
            self._events.append((start, end))

    # ---- read by EpochTimer once per epoch, after the device was synchronized
    def data_wait_s(self) -> float:
        return max(0.0, self.fetch_s - self.prefetch_transfer_s)

    def transfer_s(self) -> float:
        if self.cuda_device is not None and self._events:
            device_s = sum(a.elapsed_time(b) for a, b in self._events) / 1000.0
            return device_s + self.prefetch_transfer_s
        return self.transfer_host_s + self.prefetch_transfer_s
