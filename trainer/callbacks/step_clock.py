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
  compute stream (recorded by the loader, read here); of the idle part, the share of the host's
  wait during which the thread was copying or decoding counts (the rest of that wait was the
  loader's: data wait). A host wait while the GPU still had queued work idles nothing and costs
  nothing.

On the CPU the device's clock is the host's: transfer is the host time of ``batch_to_device``, or
the copying share of the step loop's wait for a prefetched batch. Data wait is host time blocked
on the loader in every case (the SPEC's ``data_wait_fraction``), less the part of a prefetched
batch's wait that was copying (the loader records its waits in ``data.prefetch.PrefetchWaits``,
which the clock reads). Only actions inside a training epoch and outside validation count
(``active``, passed on to those waits).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
from pytorch_lightning.profilers import Profiler

if TYPE_CHECKING:
    from trainer.data.prefetch import PrefetchWaits

FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"
TRANSFER_SUFFIX = ".batch_to_device"


def _is_transfer(action_name: str) -> bool:
    """The strategy's batch_to_device (not the LightningModule/DataModule hooks nested inside it)."""
    return action_name.startswith("[Strategy]") and action_name.endswith(TRANSFER_SUFFIX)


class StepClock(Profiler):
    def __init__(self) -> None:
        super().__init__()
        self.prefetch: Optional["PrefetchWaits"] = None  # the prefetching loader's waits (``reads``)
        self.active = False  # set by EpochTimer: inside a training epoch, not in validation
        self.cuda_device: Optional[torch.device] = None
        self.reset()

    def reads(self, prefetch: "PrefetchWaits") -> None:
        """Count the prefetching loader's waits too (data.device_prefetch): the loader records them."""
        self.prefetch = prefetch
        prefetch.active = self._active

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value
        if self.prefetch is not None:
            self.prefetch.active = value

    def reset(self) -> None:
        self.fetch_s = 0.0
        self.transfer_host_s = 0.0
        self._events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        if self.prefetch is not None:
            self.prefetch.clear()
        self._fetch_t0: Optional[float] = None
        self._transfer_t0: Optional[float] = None
        self._event0: Optional[torch.cuda.Event] = None

    # ---- Lightning's Profiler interface: called for every hook; anything else returns at once
    def start(self, action_name: str) -> None:
        if not self._active:  # the attribute, not the property: this runs for every Lightning hook
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

    # ---- read by EpochTimer once per epoch, after the device was synchronized
    def _prefetch_copy_wait_s(self) -> float:
        """Host time the step loop waited for a prefetched batch while the thread copied or decoded it."""
        return self.prefetch.copy_wait_s if self.prefetch is not None else 0.0

    def data_wait_s(self) -> float:
        return max(0.0, self.fetch_s - self._prefetch_copy_wait_s())

    def transfer_s(self) -> float:
        """See the module docstring: the device's clock (CUDA events) on CUDA, the host's on the CPU."""
        if self.cuda_device is None:
            return self.transfer_host_s + self._prefetch_copy_wait_s()
        in_line = sum(a.elapsed_time(b) for a, b in self._events)
        device_waits = self.prefetch.device_waits if self.prefetch is not None else []
        waited = sum(
            share * idle[0].elapsed_time(idle[1]) + stall[0].elapsed_time(stall[1])
            for idle, share, stall in device_waits
        )
        return (in_line + waited) / 1000.0
