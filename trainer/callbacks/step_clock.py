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

**Transfer, one definition for every row**: the time the device's step work waited for its batch
to be copied or decoded, on the clock of the device that runs the steps. On CUDA that is the
compute stream's clock, read with CUDA events once per epoch (after the epoch's one synchronize):

- without ``data.device_prefetch``, the copy and the device-side transforms run on the compute
  stream itself, in line with the steps: their time there (events around ``batch_to_device``). A
  host thread blocked on a pageable copy, which is waiting for the previous step's kernels, is not
  counted;
- with it, a thread copies (and decodes) on a side stream while the steps run, and the steps wait
  for a batch in two ways: the compute stream idles while the host waits for the thread to hand
  the batch over, and it stalls on the batch's copy event. Both are timed with events on the
  compute stream (``add_device_wait``); of the idle part, the share of the host's wait during which
  the thread was copying or decoding counts (the rest of that wait was the loader's: data wait). A
  host wait while the GPU still had queued work idles nothing and costs nothing.

On the CPU the device's clock is the host's: transfer is the host time of ``batch_to_device``, or
the copying share of the step loop's wait for a prefetched batch. Data wait is host time blocked
on the loader in every case (the SPEC's ``data_wait_fraction``), less the part of a prefetched
batch's wait that was copying (``add_prefetch_wait``). Only actions inside a training epoch and
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
        self.prefetch_copy_wait_s = 0.0  # host time the step loop waited while the prefetch thread copied
        self._events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        # prefetch on CUDA: (compute stream idle while the host waited, copying share of that wait, stall on the copy)
        self._waits: List[Tuple[Tuple[torch.cuda.Event, torch.cuda.Event], float, Tuple[torch.cuda.Event, ...]]] = []
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
    def add_prefetch_wait(self, waited: Tuple[float, float], copying: Tuple[float, float]) -> float:
        """The step loop waited for a prefetched batch over ``waited`` while the thread copied or decoded
        it over ``copying`` (host clock): that overlap is not data wait. Returns its share of the wait."""
        copy_wait = max(0.0, min(waited[1], copying[1]) - max(waited[0], copying[0]))
        if self.active:
            self.prefetch_copy_wait_s += copy_wait
        span = waited[1] - waited[0]
        return copy_wait / span if span > 0 else 0.0

    def add_device_wait(self, idle: tuple, copying_share: float, stall: tuple) -> None:
        """CUDA, prefetch: events on the compute stream around the host's wait for a batch (``idle``) and
        around its wait for the batch's copy event (``stall``); read at epoch end."""
        if self.active:
            self._waits.append((idle, copying_share, stall))

    # ---- read by EpochTimer once per epoch, after the device was synchronized
    def data_wait_s(self) -> float:
        return max(0.0, self.fetch_s - self.prefetch_copy_wait_s)

    def transfer_s(self) -> float:
        """See the module docstring: the device's clock (CUDA events) on CUDA, the host's on the CPU."""
        if self.cuda_device is None:
            return self.transfer_host_s + self.prefetch_copy_wait_s
        in_line = sum(a.elapsed_time(b) for a, b in self._events)
        waited = sum(
            share * idle[0].elapsed_time(idle[1]) + stall[0].elapsed_time(stall[1])
            for idle, share, stall in self._waits
        )
        return (in_line + waited) / 1000.0
