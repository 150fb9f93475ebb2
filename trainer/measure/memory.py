"""Peak memory of this run, not of the whole interpreter.

On CUDA: ``torch.cuda.max_memory_allocated`` after a reset at fit start. On CPU (Linux): the
kernel's resident-set high-water mark (VmHWM), reset by writing 5 to /proc/self/clear_refs at fit
start, minus the RSS at that moment, so a sweep's second job in the same process does not inherit
the first job's peak and the interpreter's own footprint is not counted. Where the reset is not
allowed, the process-lifetime ``ru_maxrss`` is the fallback (and said so in metrics.json).
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
from typing import Optional

import psutil
import pytorch_lightning as pl
import torch


def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def mem_available_mb() -> float:
    """The machine's available memory (MemAvailable), 4 GiB where /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 4096.0


def rss_mb() -> Optional[float]:
    try:
        return psutil.Process().memory_info().rss / 2**20
    except psutil.Error:
        return None


def _release_free_memory() -> None:
    """Hand memory that is free but still held by the allocator back to the OS (glibc malloc_trim).

    Without it, a sweep's second job in the same process reuses the first job's freed memory,
    its RSS does not grow, and its peak would read as near zero.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_cpu_peak() -> bool:
    """Reset the RSS high-water mark; False where the kernel does not allow it."""
    _release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_peak_mb() -> float:
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


class PeakMemory(pl.Callback):
    """Measure the peak memory of a stretch of work: ``start()`` then ``peak_mb()``.

    As a Lightning callback it measures the fit (start at fit start) and, under DDP/FSDP, takes the
    maximum over ranks at the end of training (``result_mb``).
    """

    def __init__(self, accelerator: str) -> None:
        self.accelerator = accelerator
        self.baseline_mb = 0.0
        self.method = ""
        self.result_mb: Optional[float] = None
        # CUDA: the caching allocator's peak reservation, which is what fills the device (allocated
        # plus cached blocks and fragmentation); the "memory full" verdict is judged on it
        self.reserved_mb: Optional[float] = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.start()

    def on_train_end(self, trainer, pl_module) -> None:
        peak = self.peak_mb()
        reserved = torch.cuda.max_memory_reserved() / 2**20 if self.accelerator == "cuda" else None
        if trainer.world_size > 1:

            def max_over_ranks(value: float) -> float:
                return float(
                    trainer.strategy.reduce(torch.tensor(value, device=trainer.strategy.root_device), reduce_op="max")
                )

            peak = max_over_ranks(peak)
            reserved = max_over_ranks(reserved) if reserved is not None else None
            self.method += "; max over ranks"
        self.result_mb = round(peak, 1)
        self.reserved_mb = round(reserved, 1) if reserved is not None else None

    def start(self) -> None:
        if self.accelerator == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.method = "cuda max_memory_allocated"
        elif reset_cpu_peak():
            self.baseline_mb = rss_mb() or 0.0
            self.method = "process peak RSS over the run (VmHWM reset at fit start) minus RSS at fit start"
        else:
            self.method = "process peak RSS since start (ru_maxrss; the peak could not be reset)"

    def peak_mb(self) -> float:
        if self.accelerator == "cuda":
            return round(torch.cuda.max_memory_allocated() / 2**20, 1)
        return round(max(0.0, cpu_peak_mb() - self.baseline_mb), 1)
