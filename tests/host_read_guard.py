"""The sync-free step loop, checked on a CPU: every host read of a tensor raises inside steady steps.

On a GPU, reading a device tensor on the host (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``,
``.numpy()``, ``.cpu()``) waits for every kernel queued before it; ``tests/gpu/test_sync_free.py``
catches that with torch's sync debug mode, on a GPU only. On a CPU nothing waits, so nothing would
catch a per-step ``loss.item()`` that a later GPU run pays for. ``HostReadGuard`` makes those reads
raise, from the first step of the second epoch until that epoch's steps are done (before its
validation and its once-per-epoch reads), in the step loop's thread: the steps, every callback's
batch hooks, the next fetch and transfer. What may read there, and why, is named in
``ALLOWED_CALLERS`` and ``ALLOWED_INSIDE``: reads of tensors that live on the host on a GPU too.

The trainer takes the same code path on a CPU as on a GPU where it reads values (``HostReads``,
``NaNGuard``), so what passes here is what runs there.
"""

from __future__ import annotations

import sys
import threading

import pytorch_lightning as pl
import torch

READS = ("item", "__float__", "__int__", "__index__", "__bool__", "tolist", "numpy", "cpu")

# the code that may read in the steps, and why. ``caller``: (path fragment, function name or None) of
# the frame that made the read; ``inside``: a path fragment of any frame of the read's stack. The
# optimizer is allowed only as the caller: Lightning runs the whole training step inside
# ``optimizer.step(closure)``, so anywhere in the stack it would allow every read of the step.
ALLOWED_CALLERS = {
    ("torch/optim/", None): "optimizers' step counters: host tensors unless capturable",
    (
        "trainer/callbacks/host_reads.py",
        "_reclaim",
    ): "HostReads reads its own host buffer, filled by non-blocking copies",
}
ALLOWED_INSIDE = {
    "torch/utils/data/": "the loader's fetch: decoding and augmenting on the host, host tensors on a GPU too",
}


class HostReadInStep(RuntimeError):
    pass


class HostReadGuard(pl.Callback):
    """Give it first among the callbacks, so that it is armed before and disarmed after every other one's step hooks."""

    def __init__(self) -> None:
        self.checked_steps = 0
        self._armed = False
        self._thread = None
        self._originals = {}

    def on_fit_start(self, trainer, pl_module) -> None:
        for name in READS:
            original = getattr(torch.Tensor, name)
            self._originals[name] = original
            setattr(torch.Tensor, name, self._guarded(name, original))

    def _guarded(self, name, original):
        guard = self

        def read(tensor, *args, **kwargs):
            if guard._armed and threading.get_ident() == guard._thread and not _allowed():
                guard._armed = False  # the error's own formatting may read tensors
                raise HostReadInStep(
                    f"Tensor.{name} inside a steady training step, called from {_caller()} (on a GPU the host "
                    "would wait for the device here)"
                )
            return original(tensor, *args, **kwargs)

        return read

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0:
            self._armed, self._thread = True, threading.get_ident()
        if self._armed:
            self.checked_steps += 1

    def _off(self, *args, **kwargs) -> None:
        self._armed = False

    on_validation_start = on_train_epoch_end = on_exception = _off

    def on_fit_end(self, trainer, pl_module) -> None:
        self.restore()

    def restore(self) -> None:
        self._armed = False
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals.clear()


def _allowed() -> bool:
    caller = sys._getframe(2)
    path = caller.f_code.co_filename.replace("\\", "/")
    if any(fragment in path and name in (None, caller.f_code.co_name) for fragment, name in ALLOWED_CALLERS):
        return True
    frame = caller
    while frame is not None:
        if any(fragment in frame.f_code.co_filename.replace("\\", "/") for fragment in ALLOWED_INSIDE):
            return True
        frame = frame.f_back
    return False


def _caller() -> str:
    """Where the read came from: the innermost frame outside torch's own Python files."""
    frame = sys._getframe(2)
    while frame is not None and "/torch/" in frame.f_code.co_filename.replace("\\", "/"):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})" if frame else "?"
