"""``data.device_prefetch``: the next batches are fetched and put on the GPU by a thread, on a side CUDA stream, while the step computes.

Without it, Lightning fetches each batch and moves it to the device right before its step, on the
compute stream: the host waits for the loader, then for the copy (or the nvJPEG decode), and only
then queues the step. Here a producer thread per loader iteration does both ahead of time:

- it takes the next host batch from the ``DataLoader`` (its workers and pin-memory thread as usual)
  and hands it to ``transfer`` (a copy from pinned memory, or ``data.decoder=nvjpeg``'s decode and
  transforms) under ``torch.cuda.stream(side)``, then records an event on that stream;
- the batch waits in a small queue (``depth``); the step loop takes it, makes the compute stream
  wait for its event (the GPU waits, the host does not), and ``record_stream``-s every tensor on the
  compute stream, so the caching allocator does not reuse its memory while a step still reads it.
  That needs every tensor of the batch in sight: ``tensors_in`` walks what Lightning's own move
  walks (mappings, sequences, namedtuples, dataclasses) and refuses an object that hides its
  tensors behind a ``.to()`` method of its own.

``side`` is one stream per device for the whole process (``side_stream``), not one per iteration:
the caching allocator reuses a freed block only for allocations on the stream it was allocated on,
so a fresh stream per epoch (torch hands them out round-robin from a pool) left every epoch's
batches, and nvJPEG's output buffers, reserved and unusable by the next epoch, and the memory
readings (``peak_memory_reserved_mb``, the doctor's) grew with the epochs. One per device rather
than one per loader: the validation loader's freed blocks serve training, and the next job of a
local sweep (the same process) reuses the same blocks.

Why a thread and not just one batch ahead in the same thread: torchvision's batched nvJPEG decode
ends in a ``cudaStreamSynchronize`` of its decoder stream, so decoding batch N+1 in the step loop
blocked the host before batch N was handed over, and the GPU ran out of queued work while the host
waited. In the producer thread that wait blocks nobody (the decode call releases the GIL).

Honest attribution (``StepClock``, whose docstring states the one definition of transfer): the
step loop's wait for the queue is split by what the producer was doing meanwhile: its fetching from
the loader is **data wait** (host time); its copying or decoding is **transfer** as far as the
device's steps waited for it, timed with CUDA events on the compute stream (the stream's idle time
while the host waited, for the copying share of that wait, and its stall on the batch's copy event),
read once per epoch. A producer that keeps ahead costs neither: the GPU never waited for the batch.

Randomness: with no loader workers the producer thread runs the dataset's random transforms ahead
of the step. The datamodule seeds them per sample (``seeding.SeededSamples``: a seed of data
seed, epoch and sample index, the process's RNG put back after each batch), so what a batch draws
does not depend on how far ahead the producer is, and a mid-epoch resume sees the crops the
uninterrupted run saw. While the producer fetches, the process's CPU generator holds the sample's
seed: a model that draws from the CPU's global RNG inside its step (the built-in models do not;
CUDA's generator is apart) makes its own draws depend on timing. Loader workers have a generator
each and avoid it. ``data.decoder=nvjpeg`` draws its training crops in the transfer, in this thread
with workers or without: those are seeded the same way, per epoch and batch of files
(``ImageDataModule.to_device``).

The loader stays a ``DataLoader`` (a subclass), so Lightning can still swap in its distributed
sampler, call ``set_epoch`` and take ``len``. On a device that is not CUDA the same thread runs
without streams (this is what the CPU tests exercise); the datamodule only uses it on CUDA.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from trainer.data.epoch_ahead import EpochAheadLoader
from trainer.errors import ConfigError


def tensors_in(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) batch: the containers Lightning's ``move_data_to_device`` walks
    (mappings, namedtuples and other sequences, dataclasses), all the way down.

    A tensor missed here gets no ``record_stream``, and the next copy may overwrite its memory while
    the step still reads it: a silent race. So an object that Lightning moves with its own ``.to()``
    (its tensors out of sight) is refused rather than guessed at.
    """
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from tensors_in(v)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for v in batch:
            yield from tensors_in(v)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from tensors_in(getattr(batch, field.name))
    elif callable(getattr(batch, "to", None)) and not isinstance(batch, type):
        kind = f"{type(batch).__module__}.{type(batch).__qualname__}"
        raise ConfigError(
            f"data.device_prefetch=true cannot hand out batches of type {kind}: it copies each batch to the GPU "
            "on a side stream and must mark every tensor in it as in use by the training step, so that the next "
            f"copy cannot reuse that memory while the step still reads it, and a {type(batch).__name__} is moved "
            "by its own .to() method, which keeps its tensors out of sight. Return tensors, or dicts, lists, "
            "tuples, namedtuples or dataclasses of them, from the dataset or collate_fn; or set "
            "data.device_prefetch=false."
        )


_STREAMS: Dict[Tuple[str, int], "torch.cuda.Stream"] = {}
_STREAMS_LOCK = threading.Lock()


def process_stream(purpose: str, device: torch.device) -> "torch.cuda.Stream":
    """The process's one stream for ``purpose`` on ``device``, made on first use and reused after:
    the caching allocator keeps blocks per stream, so a fresh stream each time would strand them."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        stream = _STREAMS.get((purpose, index))
        if stream is None:
            stream = _STREAMS[purpose, index] = torch.cuda.Stream(torch.device("cuda", index))
        return stream


def side_stream(device: torch.device) -> "torch.cuda.Stream":
    """The process's one copy stream for ``device``, reused by every loader and epoch (see the
    module's docstring)."""
    return process_stream("copy", device)


def _event(device: torch.device) -> "torch.cuda.Event":
    """A timing event recorded on ``device``'s current (compute) stream now; never waits."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Lightning's own move: ``non_blocking=True`` on CUDA."""
    return move_data_to_device(batch, device)


_END = object()
_LIVE: "weakref.WeakSet[_Producer]" = weakref.WeakSet()  # for close_all()


def close_all() -> None:
    """Stop every producer thread still running, drop the device batches it prepared and shut down
    its loader's worker processes.

    Called by the datamodule when a fit ends (``teardown``) and when it fails or is stopped
    (``on_exception``): a loop cut short leaves its iterator, and with it a thread and the
    loader's workers, behind. After a failure Lightning's own teardown, which would drop that
    iterator, may not run at all (it raises again after a CUDA error), and the error a local
    sweep keeps for its report holds the whole fit: its next job would run beside them.
    """
    for producer in list(_LIVE):
        producer.close(shutdown_workers=True)


class _Producer:
    """One iteration's thread: host batches in, device batches (with their copy's event and timing) out."""

    def __init__(
        self,
        host_batches: Iterator[Any],
        device: torch.device,
        transfer: Callable,
        depth: int,
        loader: Optional[DataLoader] = None,
    ) -> None:
        self.host_batches = host_batches
        self.loader = weakref.ref(loader) if loader is not None else None  # whose iterator this is
        self.device = device
        self.transfer = transfer
        self.queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trainer-device-prefetch", daemon=True)
        self.thread.start()
        _LIVE.add(self)

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        cuda = self.device.type == "cuda"
        try:
            side = None
            if cuda:
                torch.cuda.set_device(self.device)  # the current device is per thread
                side = side_stream(self.device)
            while not self.stop.is_set():
                t0 = time.perf_counter()
                host = next(self.host_batches, _END)
                t1 = time.perf_counter()
                if host is _END:
                    self._put(_END)
                    return
                ready = None
                if side is not None:
                    with torch.cuda.stream(side):
                        batch = self.transfer(host, self.device)
                        ready = torch.cuda.Event()
                        ready.record(side)
                else:
                    batch = self.transfer(host, self.device)
                # (fetch interval, copy/decode interval) of this batch, for the step loop's attribution
                if not self._put((batch, ready, (t0, t1), (t1, time.perf_counter()))):
                    return
        except BaseException as e:  # a loader or decode error belongs to the step loop
            self._put(e)

    def close(self, shutdown_workers: bool = False) -> None:
        """Stop the thread and wait for it (it may finish the fetch in flight first), then drop the
        batches it left in the queue (device memory). ``shutdown_workers``: also stop the loader's
        worker processes (not between epochs: persistent workers keep serving the next one)."""
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.queue.get_nowait()
            except queue.Empty:
                pass
            self.thread.join(timeout=0.1)
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if shutdown_workers:
            if isinstance(self.host_batches, _MultiProcessingDataLoaderIter):
                self.host_batches._shutdown_workers()
            loader = self.loader() if self.loader is not None else None
            if loader is not None and getattr(loader, "_iterator", None) is self.host_batches:
                loader._iterator = None  # persistent workers: the next iteration starts new ones


class PrefetchWaits:
    """What the step loop's waits for prefetched batches were made of, kept by the prefetching loader for
    whoever times the steps (the epoch timer's ``StepClock`` sets ``active`` inside a training epoch and
    reads them once per epoch): the data records, the timer reads, and nothing in the data calls the timer."""

    def __init__(self) -> None:
        self.active = False
        self.clear()

    def clear(self) -> None:
        self.copy_wait_s = 0.0  # host time the step loop waited while the producer thread copied or decoded
        # CUDA: (compute stream idle while the host waited, the copying share of that wait, stall on the copy)
        self.device_waits: List[Tuple[Tuple[Any, Any], float, Tuple[Any, Any]]] = []

    def add_host_wait(self, waited: Tuple[float, float], copying: Tuple[float, float]) -> float:
        """The step loop waited for a prefetched batch over ``waited`` while the thread copied or decoded
        it over ``copying`` (host clock): that overlap is not data wait. Returns its share of the wait."""
        copy_wait = max(0.0, min(waited[1], copying[1]) - max(waited[0], copying[0]))
        if self.active:
            self.copy_wait_s += copy_wait
        span = waited[1] - waited[0]
        return copy_wait / span if span > 0 else 0.0

    def add_device_wait(self, idle: tuple, copying_share: float, stall: tuple) -> None:
        """CUDA: events on the compute stream around the host's wait for a batch (``idle``) and around
        its wait for the batch's copy event (``stall``); read, after the epoch's synchronize, by the timer."""
        if self.active:
            self.device_waits.append((idle, copying_share, stall))


class DevicePrefetchLoader(EpochAheadLoader):
    """A DataLoader whose iterator yields batches already on ``device``, prepared by a producer thread.
    As a training loader (``follows``), its next epoch's workers start when this epoch ends (``epoch_ahead``);
    its producer thread starts at the next epoch's first batch, as always."""

    def __init__(
        self,
        *args,
        device: Optional[torch.device] = None,
        transfer: Optional[Callable[[Any, torch.device], Any]] = None,
        waits: Optional[PrefetchWaits] = None,
        depth: int = 2,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        # same names as the arguments: Lightning re-creates the loader from them (distributed sampler)
        self.device = torch.device(device or "cpu")
        self.transfer = transfer or move_to_device
        self.waits = waits  # where the step loop's waits are recorded for the step timer, or None
        self.depth = depth
        self._producer: Optional[_Producer] = None

    def __iter__(self):
        # the previous iteration's thread must let go of the loader's iterator before it is
        # reset (persistent workers reuse one iterator object)
        if self._producer is not None:
            self._producer.close()
            self._producer = None
        # the host iterator is made here (or was, when the last epoch ended), in the caller's thread, as a
        # plain DataLoader makes it (it draws its base seed from the global RNG); the thread starts at
        # the first batch asked for
        return _hand_out(self, self.host_iterator())


def _hand_out(loader: DevicePrefetchLoader, host_batches: Iterator[Any]) -> Iterator[Any]:
    """The step loop's side: take each prepared batch, attribute any wait, chain the streams.

    A generator, so the producer starts when the loop asks for its first batch, not when ``iter()``
    is called: Lightning makes the training iterator early (to count the steps for a scheduler),
    before it runs the sanity check inside ``isolate_rng()``. A thread started then drew its first
    random crops inside that block, and the restore at its end undid them, so batches repeated a
    crop or not depending on timing (a run was not reproducible; an in-process test caught it).
    """
    producer = _Producer(host_batches, loader.device, loader.transfer, loader.depth, loader)
    loader._producer = producer
    device, waits = loader.device, loader.waits
    last, handed = loader.batches_per_epoch(), 0
    try:
        while True:
            # the compute stream's clock when the host starts waiting (StepClock: transfer on the device's clock)
            idle_start = _event(device) if waits is not None and waits.active and device.type == "cuda" else None
            w0 = time.perf_counter()
            item = producer.queue.get()
            waited = (w0, time.perf_counter())
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            batch, ready, fetching, copying = item
            # walked on every device, so that a batch type this cannot protect is refused the same way
            # on the CPU (where the tests run this loader) as on the GPU
            tensors = list(tensors_in(batch))
            copying_share = waits.add_host_wait(waited, copying) if waits is not None else 0.0
            if ready is not None:
                compute = torch.cuda.current_stream(device)
                if idle_start is not None:
                    idle_end = _event(device)  # runs once the host is back: the GPU idled since idle_start, if at all
                    compute.wait_event(ready)  # the GPU waits for the copy, the host does not
                    waits.add_device_wait((idle_start, idle_end), copying_share, (idle_end, _event(device)))
                else:
                    compute.wait_event(ready)
                for t in tensors:
                    if t.device.type == "cuda":
                        t.record_stream(compute)
            handed += 1
            if handed == last and _ran_out(producer):
                # the last batch: the producer has let go of the host iterator, so the next epoch's
                # workers can start now, here in the step loop's thread (epoch_ahead)
                loader.epoch_ended()
                yield batch
                return
            yield batch
    finally:
        producer.close()


def _ran_out(producer: _Producer) -> bool:
    """After the epoch's last batch: whether the producer found its host iterator empty (it tries
    the next batch at once and gets nothing: no task is outstanding). A batch past the loader's
    length (a sampler longer than it said) or an error means no: the iteration goes on as it was."""
    producer.thread.join(timeout=10)  # a non-persistent iterator's end shuts its workers down first
    if producer.thread.is_alive():
        return False
    with producer.queue.mutex:  # looked at, and taken only if it is the end
        items = producer.queue.queue
        if items and items[0] is _END:
            items.popleft()
            return True
    return False
