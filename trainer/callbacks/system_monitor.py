"""SystemMonitor: CPU, memory, disk and GPU readings every few seconds, into TensorBoard and the doctor.

Why not Lightning's ``DeviceStatsMonitor``: it reads the stats on every step (on CUDA it calls
``torch.cuda.memory_stats`` each batch) and has no CPU utilization, disk or NVML readings. Here a
reading is taken at a step boundary only when ``monitor.interval_s`` seconds have passed since the
last one, so a step costs one ``time.monotonic()`` call. The readings come from psutil and NVML
through ``trainer.measure.sysstats``, scoped to what the run can use: busy time of the CPUs in its
affinity mask, its own process tree (loader workers, and under torchrun every local rank), the
rank's own GPU.

Every reading covers training time of one epoch only: the window restarts at each epoch's start
and closes before validation, and each reading records its epoch, so the doctor averages over the
same steady epochs that data wait is measured on.

Logged tags (TensorBoard, x axis = global step): ``system/cpu_busy_cores``, ``system/cpu_util``,
``system/process_cpu_cores`` (this run's processes), ``system/main_process_cpu_cores`` (the training
process alone, without its loader workers; not under a launcher), ``system/processes``, ``system/rss_mb``,
``system/disk_read_mb_s``, ``system/load_avg``, and for the rank's GPU ``gpu/util``,
``gpu/mem_used_mb``, ``gpu/reserved_mb``, ``gpu/power_w``, ``gpu/temp_c``.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Collection, Dict, List, Optional

import pytorch_lightning as pl

from trainer import tracking
from trainer.measure import sysstats
from trainer.measure.memory import rss_mb

log = logging.getLogger(__name__)

_MIN_WINDOW_S = 0.05  # shorter windows are all noise
_BOOKKEEPING = ("epoch", "window_s")  # what a reading records about itself, not a measurement


class SystemMonitor(pl.Callback):
    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: List[Dict[str, float]] = []
        self._cpus = sysstats.allowed_cpus()
        self._busy = sysstats.CpuBusy(self._cpus)
        self._tree = sysstats.ProcessTree()
        self._gpu: Optional[sysstats.GpuReader] = None
        self._epoch = 0
        self._open = False
        self._just_closed = False  # the last epoch's window closed at its end (Lightning validates before that)
        self._baseline()

    def on_train_start(self, trainer, pl_module) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            self._gpu = sysstats.GpuReader(device.index or 0)
            if self._gpu.note:
                log.info("system monitor: %s", self._gpu.note)

    def _baseline(self) -> None:
        self._last_t = time.monotonic()
        self._busy.cores()  # restart the CPU window
        self._last_proc_cpu, self._last_own_cpu = self._tree.cpu_seconds_split()
        self._last_disk = sysstats.disk_read_bytes()

    # ---- windows: training time of one epoch
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._epoch = trainer.current_epoch
        self._open = True
        if not self._just_closed:  # else the last reading (at most _MIN_WINDOW_S of training ago) is the baseline: no
            self._baseline()  # second walk of the process tree (1.7 ms) while the GPU waits for the first step
        self._just_closed = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._open and time.monotonic() - self._last_t >= self.interval_s:
            self.sample(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._open and not trainer.sanity_checking:
            self._close(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._open:
            self._close(trainer)
            self._just_closed = True

    def _close(self, trainer) -> None:
        """End the epoch's window: a last reading unless it would cover almost no time."""
        self._open = False
        if time.monotonic() - self._last_t >= _MIN_WINDOW_S:
            self.sample(trainer)

    def sample(self, trainer=None) -> Dict[str, float]:
        now = time.monotonic()
        dt = max(1e-6, now - self._last_t)
        reading: Dict[str, float] = {"epoch": float(self._epoch), "window_s": dt}
        busy = self._busy.cores()
        if busy is not None:
            reading["cpu_busy_cores"] = busy
            reading["cpu_util"] = busy / len(self._cpus)
        processes = self._tree.processes()  # one walk of the tree for both readings
        proc_cpu, own_cpu = self._tree.cpu_seconds_split(processes)
        reading["process_cpu_cores"] = max(0.0, proc_cpu - self._last_proc_cpu) / dt
        if own_cpu is not None and self._last_own_cpu is not None:
            # the training process alone; the rest of process_cpu_cores is its loader workers
            reading["main_process_cpu_cores"] = max(0.0, own_cpu - self._last_own_cpu) / dt
        reading["processes"] = float(len(processes))
        reading["rss_mb"] = rss_mb() or 0.0
        disk = sysstats.disk_read_bytes()
        if disk is not None and self._last_disk is not None:
            reading["disk_read_mb_s"] = max(0, disk - self._last_disk) / dt / 2**20
        reading["load_avg"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if self._gpu is not None:
            reading.update(self._gpu.read())
        self.samples.append(reading)
        self._last_t, self._last_proc_cpu, self._last_disk = time.monotonic(), proc_cpu, disk
        self._last_own_cpu = own_cpu
        if trainer is not None:
            logged = {(k if "/" in k else f"system/{k}"): v for k, v in reading.items() if k not in _BOOKKEEPING}
            tracking.log_metrics(trainer, logged, step=trainer.global_step)
        return reading

    def averages(self, epochs: Optional[Collection[int]] = None) -> Dict[str, float]:
        """Time-weighted means over the readings of ``epochs`` (the steady ones); over all readings
        when none of them has one. Weighted by each reading's window, so an epoch's short last
        window (and its coarse CPU-time ticks) counts for the little time it covers."""
        chosen = [s for s in self.samples if epochs is None or int(s["epoch"]) in epochs] or self.samples
        keys = {k for s in chosen for k in s if k not in _BOOKKEEPING}
        out = {}
        for k in sorted(keys):
            pairs = [(s[k], s.get("window_s", 1.0)) for s in chosen if k in s]
            weight = sum(w for _, w in pairs)
            out[k] = round(
                sum(v * w for v, w in pairs) / weight if weight > 0 else statistics.mean(v for v, _ in pairs), 4
            )
        return out
