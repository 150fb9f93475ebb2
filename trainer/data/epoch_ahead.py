"""The next epoch's loader workers start while this epoch ends and validation runs.

A DataLoader's workers build the first batches of an epoch only once its iterator is made, and
Lightning makes it at the start of the epoch, after validation: the GPU then waits for a whole
batch built by one worker (each batch is one worker's), 1.08 s of each 3.8 s epoch of ResNet-50 on
an H100 with batches of 512 JPEGs and 15 workers. Here the training loader makes its next epoch's
iterator as soon as it hands over its last batch, so the workers build the next epoch's first
batches during the last step and the validation, with cores the validation loader leaves idle.
Lightning takes as many batches as the loader's length and never asks past the last one, so the
loader counts them: when it hands over its last batch, its iterator has received everything the
sampler sent (no task is outstanding), and the next one can be made (a persistent one is reset).
The sampler is moved on to the next epoch first; Lightning's ``set_epoch`` at the epoch's start
then sets the epoch it already has.

It happens only where it cannot change what trains: with loader workers (in the training process
the next epoch's transforms would draw from the process's RNG during validation), and when another
epoch follows (``follows``: the trainer's epoch and step limits). An epoch cut short by a fraction
of batches never reaches its last batch, and the next starts as before.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterator, Optional

from torch.utils.data import DataLoader

_AHEAD: "weakref.WeakSet[EpochAheadLoader]" = weakref.WeakSet()


def drop_all() -> None:
    """Let go of every iterator made ahead (and the workers of a non-persistent one): a fit that
    ends or fails before the epoch that was to use it."""
    for loader in list(_AHEAD):
        loader.drop_ahead()


class EpochAheadLoader(DataLoader):
    """A training DataLoader that makes its next epoch's iterator when this epoch's last batch is taken."""

    def __init__(self, *args, follows: Optional[Callable[[], Optional[int]]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        # same name as the argument: Lightning re-creates a loader from its arguments
        self.follows = follows  # -> the epoch that follows this one, or None
        self._ahead: Optional[Iterator] = None

    def host_iterator(self) -> Iterator:
        """This epoch's iterator: the one made ahead, else a new one."""
        ahead, self._ahead = self._ahead, None
        return ahead if ahead is not None else DataLoader.__iter__(self)

    def batches_per_epoch(self) -> Optional[int]:
        """The batches an epoch hands over (None where the loader has no length)."""
        try:
            return len(self)
        except TypeError:
            return None

    def epoch_ended(self) -> None:
        """Called in the training process's main thread once the epoch's last batch was received."""
        upcoming = self.follows() if self.follows is not None and self.num_workers > 0 else None
        if upcoming is None:
            return
        samplers = (self.sampler, getattr(self.batch_sampler, "sampler", None))
        for sampler in {id(s): s for s in samplers if s is not None}.values():
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(upcoming)
        self._ahead = DataLoader.__iter__(self)
        _AHEAD.add(self)

    def drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        shutdown = getattr(ahead, "_shutdown_workers", None)
        if ahead is not None and shutdown is not None and not self.persistent_workers:
            shutdown()

    def __iter__(self):
        return self._through(self.host_iterator())

    def _through(self, batches: Iterator):
        last = self.batches_per_epoch()
        for i, batch in enumerate(batches):
            if i + 1 == last:  # the last: nothing more is asked of this iterator (persistent: reset now)
                self.epoch_ended()
                yield batch
                return
            yield batch
