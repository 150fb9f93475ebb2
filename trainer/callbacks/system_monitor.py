"""SystemMonitor: CPU, memory, disk and GPU readings every few seconds, into TensorBoard and the doctor.

Why not Lightning's ``DeviceStatsMonitor``: it reads the stats on every step (on CUDA it calls
``torch.cuda.memory_stats`` each batch) and has no CPU utilization, disk or NVML readings. Here a
reading is taken at a step boundary only when ``monitor.interval_s`` seconds have passed since the
last one, so a step costs one ``time.monotonic()`` call. Readings come from /proc (no psutil) and,
on NVIDIA GPUs, from NVML (nvidia-ml-py), silently absent where there is none.

Logged tags (TensorBoard, x axis = global step): ``system/cpu_busy_cores``, ``system/cpu_util``,
``system/process_cpu_cores`` (this run: main process and loader workers), ``system/rss_mb``, ``system/disk_read_mb_s``, ``system/load_avg``,
and per GPU ``gpu0/util``, ``gpu0/mem_used_mb``, ``gpu0/power_w``, ``gpu0/temp_c``. The averages
over the run feed the bottleneck doctor.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Dict, List, Optional

import pytorch_lightning as pl

from ..memory import rss_mb


def _read_cpu_times() -> Optional[tuple]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def _read_disk_read_bytes() -> Optional[int]:
    """Bytes read from block devices by the whole machine (sectors x 512, /proc/diskstats)."""
    try:
        total = 0
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                name = fields[2]
                if name.startswith(("loop", "ram")) or (name[-1].isdigit() and not name.startswith("nvme") and name[:-1] and name[-2].isalpha()):
                    continue  # skip partitions of sdX/vdX (counted in the disk) and loop devices
                total += int(fields[5]) * 512
        return total
    except (OSError, ValueError, IndexError):
        return None


def _process_tree_cpu_seconds() -> float:
    """CPU seconds of this process plus its children (DataLoader workers), live and exited."""
    total = time.process_time()
    t = os.times()
    total += t.children_user + t.children_system  # children already reaped
    me = str(os.getpid())
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:  # ppid
                total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    except OSError:
        pass
    return total


def _nvml_handles():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return None, []


class SystemMonitor(pl.Callback):
    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: List[Dict[str, float]] = []
        self._last_t = 0.0
        self._last_cpu = None
        self._last_proc_cpu = 0.0
        self._last_disk = None
        self._nvml, self._gpus = None, []

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.strategy.root_device.type == "cuda":
            self._nvml, self._gpus = _nvml_handles()
        self._baseline()

    def _baseline(self) -> None:
        self._last_t = time.monotonic()
        self._last_cpu = _read_cpu_times()
        self._last_proc_cpu = _process_tree_cpu_seconds()
        self._last_disk = _read_disk_read_bytes()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if time.monotonic() - self._last_t >= self.interval_s:
            self.sample(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if time.monotonic() - self._last_t >= min(1.0, self.interval_s):
            self.sample(trainer)  # short runs still get a reading per epoch

    def sample(self, trainer=None) -> Dict[str, float]:
        now = time.monotonic()
        dt = max(1e-6, now - self._last_t)
        reading: Dict[str, float] = {}
        cpu = _read_cpu_times()
        cores = os.cpu_count() or 1
        if cpu and self._last_cpu:
            busy, total = cpu[0] - self._last_cpu[0], cpu[1] - self._last_cpu[1]
            if total > 0:
                reading["cpu_util"] = busy / total
                reading["cpu_busy_cores"] = busy / total * cores
        proc_cpu = _process_tree_cpu_seconds()
        reading["process_cpu_cores"] = max(0.0, proc_cpu - self._last_proc_cpu) / dt  # this run: main process + loader workers
        reading["rss_mb"] = rss_mb() or 0.0
        disk = _read_disk_read_bytes()
        if disk is not None and self._last_disk is not None:
            reading["disk_read_mb_s"] = (disk - self._last_disk) / dt / 2**20
        reading["load_avg"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        for i, handle in enumerate(self._gpus):
            try:
                nv = self._nvml
                reading[f"gpu{i}/util"] = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                reading[f"gpu{i}/mem_used_mb"] = nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                reading[f"gpu{i}/mem_total_mb"] = nv.nvmlDeviceGetMemoryInfo(handle).total / 2**20
                reading[f"gpu{i}/power_w"] = nv.nvmlDeviceGetPowerUsage(handle) / 1000
                reading[f"gpu{i}/temp_c"] = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
            except Exception:
                pass
        self.samples.append(reading)
        self._baseline()
        if trainer is not None and trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics({(k if "/" in k else f"system/{k}"): v for k, v in reading.items()}, step=trainer.global_step)
        return reading

    def averages(self) -> Dict[str, float]:
        keys = {k for s in self.samples for k in s}
        return {k: round(statistics.mean(s[k] for s in self.samples if k in s), 4) for k in sorted(keys)}

