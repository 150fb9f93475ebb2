"""Reading small device values on the host without making the host wait: ``HostReads``.

``float(loss)`` or ``loss.item()`` on a CUDA tensor blocks the host until every kernel queued
before it has run; in the step loop that drains the queue the host had built up, and the GPU idles
while the host queues the next step. Here each value is copied, non-blocking, into a slot of a
pinned host buffer allocated once, with a CUDA event recorded after the copy; ``ready()`` hands
back the values whose event has passed (``Event.query()`` never blocks), ``drain()`` waits for the
rest (once per epoch, where the epoch timer synchronizes anyway). On a CPU the same path runs (an
ordinary host buffer, no events: a copy has arrived at once), so the CPU suite checks what runs on
a GPU (``tests/host_read_guard.py``).

A value is dropped (``dropped`` counts them) only if all slots still hold copies in flight, which
needs ``slots`` reads queued faster than the device runs them.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterator, List, Optional, Tuple

import torch


class HostReads:
    def __init__(self, slots: int = 64) -> None:
        self.slots = slots
        self.dropped = 0
        self._buffer: Optional[torch.Tensor] = None  # float64, one value per slot (pinned on CUDA)
        self._free: List[int] = []
        self._pending: Deque[Tuple[Any, int, Optional[torch.cuda.Event]]] = deque()
        self._values: Deque[Tuple[Any, float]] = deque()

    def push(self, tag: Any, value: torch.Tensor) -> None:
        """Ask for ``value`` (a 0-d tensor) on the host, labelled ``tag``.

        The same path on every device, so that the CPU suite runs what a GPU runs: the value is
        copied into a slot of the host buffer (non-blocking on CUDA, with an event after it) and read
        from there once it has arrived; on a CPU it has arrived at once."""
        value = value.detach()
        cuda = value.device.type == "cuda"
        if self._buffer is None:
            self._buffer = torch.empty(self.slots, dtype=torch.float64, pin_memory=cuda)
            self._free = list(range(self.slots))
        if not self._free:
            self._reclaim()
        if not self._free:
            self.dropped += 1
            return
        slot = self._free.pop()
        self._buffer[slot].copy_(value.to(torch.float64), non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(value.device))
        self._pending.append((tag, slot, event))

    def _reclaim(self) -> None:
        """Move copies that have arrived to the ready values (in order; never blocks). The one place
        values are read: from the host buffer, never from the device."""
        while self._pending and (self._pending[0][2] is None or self._pending[0][2].query()):
            tag, slot, _ = self._pending.popleft()
            self._values.append((tag, float(self._buffer[slot])))
            self._free.append(slot)

    def ready(self) -> Iterator[Tuple[Any, float]]:
        """The values that have arrived, oldest first; never waits for the device."""
        self._reclaim()
        while self._values:
            yield self._values.popleft()

    def drain(self) -> Iterator[Tuple[Any, float]]:
        """Every value asked for, waiting for the copies still in flight (a device sync: at epoch end only)."""
        for _, _, event in self._pending:
            if event is not None:
                event.synchronize()
        return self.ready()
