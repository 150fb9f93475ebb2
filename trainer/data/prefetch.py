"""``data.device_prefetch``: copy batch N+1 to the GPU on a side CUDA stream while step N computes.

Without it, Lightning moves each batch right before its step, on the compute stream: the copy
(``non_blocking`` from pinned memory, so the host does not wait) still runs in line with the
kernels, so the GPU idles while the batch crosses the bus. This is the apex/timm prefetcher:

- the loader's iterator copies the next batch on its own stream, from pinned memory, as soon as the
  current one is handed out;
- before a batch is handed out the compute stream waits for that batch's copy (an event, so the
  host never blocks), and every tensor in it is ``record_stream``-ed on the compute stream, so the
  caching allocator does not give its memory back to the side stream while a step still reads it.

Lightning's ``batch_to_device`` then finds the batch already on the device and does nothing. The
loader stays a ``DataLoader`` (a subclass), so Lightning can still swap in its distributed sampler,
call ``set_epoch`` and take ``len``. The copy function is the datamodule's, so with
``data.decoder=nvjpeg`` the GPU decode of the next batch also runs on the side stream.

On a device that is not CUDA the iterator still runs one batch ahead but with no streams (this
is what the CPU tests exercise); the datamodule only uses it on CUDA and says so elsewhere.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from tensors_in(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from tensors_in(v)


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Lightning's own move: ``non_blocking=True`` on CUDA."""
    from lightning_fabric.utilities.apply_func import move_data_to_device

    return move_data_to_device(batch, device)


class DevicePrefetchLoader(DataLoader):
    """A DataLoader whose iterator yields batches already on ``device``, copied one step ahead."""

    def __init__(self, *args, device: Optional[torch.device] = None, transfer: Optional[Callable[[Any, torch.device], Any]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        # same names as the arguments: Lightning re-creates the loader from them (distributed sampler)
        self.device = torch.device(device or "cpu")
        self.transfer = transfer or move_to_device

    def __iter__(self):
        return _prefetch(super().__iter__(), self.device, self.transfer)


def _prefetch(host_batches: Iterator[Any], device: torch.device, transfer: Callable) -> Iterator[Any]:
    """Yield device batches; the copy of batch N+1 is issued before batch N is handed out.

    (Lightning does not fetch ahead from a loader with a length, so a batch is handed out right
    before its step: the wait below is for this step's batch only.)
    """
    side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def preload():
        host = next(host_batches, None)
        if host is None:
            return None
        if side is None:  # no streams: the copy is synchronous, one batch ahead
            return transfer(host, device), None
        with torch.cuda.stream(side):
            batch = transfer(host, device)
            ready = torch.cuda.Event()
            ready.record(side)
        return batch, ready

    pending = preload()
    while pending is not None:
        batch, ready = pending
        if side is not None:
            compute = torch.cuda.current_stream(device)
            compute.wait_event(ready)  # the GPU waits for the copy, the host does not
            for t in tensors_in(batch):
                if t.device.type == "cuda":
                    t.record_stream(compute)
        pending = preload()  # the next copy overlaps this step
        yield batch
