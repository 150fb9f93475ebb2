"""Readings of the machine a run is on, each scoped to what the run can use.

The system monitor and the doctor compare what this run's processes use with what is available to
them. Both sides must be about the same CPUs and the same GPU, or a container on a big host reads
as "other processes are busy" and a rank on cuda:3 reports GPU 0. psutil reads the processes and
counters; the pieces psutil does not have are here: the CPU quota (a container's cgroup, a Slurm job's allocation),
which disks to count, and which NVML device is a rank's ``cuda:<i>``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import psutil

from trainer.rank import env_count, srun_rank, srun_task


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this host (one we may not signal counts as running).

    Used before taking over what a process left behind: a sweep's plan, a pack's temp dir."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Block devices stacked on other block devices (their reads are counted again in the disk below),
# or living in memory. Partitions do not appear in /sys/block at all.
_NOT_A_DISK = ("loop", "ram", "zram", "dm-", "md")


def allowed_cpus() -> List[int]:
    """The CPUs this process may run on (its affinity mask: taskset, cpusets of containers and Slurm)."""
    try:
        return sorted(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):  # no affinity support (macOS)
        return list(range(psutil.cpu_count() or 1))


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """The CPU quota of this process's cgroup and its ancestors, in cores (None: no quota).

    cgroup v2: ``cpu.max`` holds ``"<quota> <period>"`` or ``"max <period>"``; v1: ``cpu.cfs_quota_us``
    (-1: none) and ``cpu.cfs_period_us`` under the ``cpu`` controller. Docker's ``--cpus`` and
    Kubernetes CPU limits set these; the kernel then throttles the run to that many cores' time
    whatever the affinity mask allows.
    """
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return None
    limits: List[float] = []
    for _, controllers, path in (parts for parts in lines if len(parts) == 3):
        if controllers == "":  # v2 unified hierarchy
            for d in _self_and_ancestors(root, path):
                quota = (_read(os.path.join(d, "cpu.max")) or "max").split()
                if quota[0] != "max":
                    limits += _ratio(quota[0], quota[1] if len(quota) > 1 else None)
        elif "cpu" in controllers.split(","):
            base = (
                os.path.join(root, controllers)
                if os.path.isdir(os.path.join(root, controllers))
                else os.path.join(root, "cpu")
            )
            for d in _self_and_ancestors(base, path):
                limits += _ratio(
                    _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
                )
    return min(limits) if limits else None


def slurm_cpu_limit(environ=None) -> Optional[float]:
    """The CPUs Slurm allocated to this job on this node (``SLURM_CPUS_ON_NODE``; None outside a job).

    Where Slurm binds a job to its CPUs (task/affinity, task/cgroup) the affinity mask says so
    already. Where it does not, every job on a node sees all of its cores, and two one-CPU jobs
    sharing two cores each ran two intra-op threads: their spinning OpenMP threads slowed both 15 to
    75 times over (a tiny CNN's epoch 0.35 s alone, 5.5-27 s in each of the two jobs).
    """
    cpus = env_count("SLURM_CPUS_ON_NODE", environ)
    return float(cpus) if cpus is not None else None


def slurm_task_cpus(environ=None) -> Optional[int]:
    """The CPUs of this process's own Slurm task (``SLURM_CPUS_PER_TASK``) where srun started it as one
    of a job step's several tasks (one rank per task) and not through torchrun (whose ranks share
    their task's CPUs); None otherwise, also in the batch script's or salloc's own shell."""
    return env_count("SLURM_CPUS_PER_TASK", environ) if srun_rank(environ) else None


def cpu_limit() -> Optional[float]:
    """The cores this process's CPU time is bounded to, in cores (None: no bound but the affinity
    mask): the tighter of its cgroup's quota and its Slurm job's allocation on this node."""
    limits = [x for x in (cgroup_cpu_limit(), slurm_cpu_limit()) if x is not None]
    return min(limits) if limits else None


def _ratio(quota: Optional[str], period: Optional[str]) -> List[float]:
    """[quota / period] in cores, or [] for no quota (v1's -1) or an unreadable file."""
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return []
    return [q / p] if q > 0 and p > 0 else []


def quota_limit(cpus: List[int], limit: Optional[float]) -> Optional[float]:
    """The quota ``limit`` (``cpu_limit``'s) when it allows fewer cores than the affinity mask ``cpus`` (else None: it limits nothing)."""
    return limit if limit is not None and limit < len(cpus) else None


def _self_and_ancestors(root: str, path: str) -> Iterable[str]:
    """``root/a/b``, ``root/a``, ``root``: a cgroup's limits include its ancestors'. Inside a
    container the namespace root is the container's own cgroup (path "/")."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), -1, -1):
        d = os.path.join(root, *parts[:i])
        if os.path.isdir(d):
            yield d


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def usable_cores(cpus: Optional[List[int]] = None, limit: Optional[float] = None, detect_limit: bool = True) -> int:
    """Cores this run can keep busy: the affinity mask, cut to the cgroup quota and the Slurm job's
    allocation (``cpu_limit``; rounded down, at least 1)."""
    n = len(cpus if cpus is not None else allowed_cpus()) or 1
    if limit is None and detect_limit:
        limit = cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.floor(limit + 1e-6)))
    return n


def online_cpus(path: str = "/sys/devices/system/cpu/online") -> Optional[List[int]]:
    """The online CPUs' numbers (``0-3,6,8-9``), None where the file cannot be read."""
    text = _read(path)
    if not text:
        return None
    cpus: List[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cpus += range(int(first), int(last or first) + 1)
    except ValueError:
        return None
    return cpus


class CpuBusy:
    """Busy time of the allowed CPUs between two readings, in cores (host-wide time of CPUs this
    process may not use is someone else's business, not competition)."""

    def __init__(self, cpus: Optional[List[int]] = None) -> None:
        self.cpus = cpus if cpus is not None else allowed_cpus()
        self._last = self._read()

    def _read(self) -> Optional[tuple]:
        try:
            per_cpu = psutil.cpu_times(percpu=True)
        except (psutil.Error, OSError):
            return None
        # psutil lists the online CPUs in order: with some offline, list position is not the CPU number
        online = online_cpus()
        position = (
            {cpu: i for i, cpu in enumerate(online)}
            if online and len(online) == len(per_cpu)
            else {i: i for i in range(len(per_cpu))}
        )
        busy = total = 0.0
        for cpu in self.cpus:
            if cpu in position:
                t = per_cpu[position[cpu]]
                idle = t.idle + getattr(t, "iowait", 0.0)
                all_ = sum(t)
                # guest time is already inside user time on Linux: psutil's fields add it twice
                all_ -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
                busy += all_ - idle
                total += all_
        return busy, total

    def cores(self) -> Optional[float]:
        """Busy cores since the last call (None the first time or where unreadable)."""
        now = self._read()
        last, self._last = self._last, now
        if not now or not last or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1]) * len(self.cpus)


class ProcessTree:
    """CPU time and disk reads of a run's processes.

    The tree is this process and all its descendants (DataLoader workers). When this process is
    one of several ranks started by a launcher, it is the launcher's whole tree on this node: under
    torchrun (``TORCHELASTIC_RUN_ID``) the elastic agent's, under ``srun`` with several tasks the
    step daemon's (slurmstepd). So the other ranks of a multi-process run on this node count as
    this run, not as "other processes". Exited children count through their parent's reaped times.
    """

    def __init__(self, root: Optional[psutil.Process] = None) -> None:
        me = psutil.Process()
        if root is None and (os.environ.get("TORCHELASTIC_RUN_ID") or srun_task()):
            try:
                root = me.parent()
            except psutil.Error:
                root = None
        self.root = root or me
        self._me = me

    def processes(self) -> List[psutil.Process]:
        try:
            return [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return [self.root]

    def cpu_seconds(self, processes: Optional[List[psutil.Process]] = None) -> float:
        """CPU seconds of the tree (of ``processes``, a listing already taken, if given)."""
        return self.cpu_seconds_split(processes)[0]

    def cpu_seconds_split(self, processes: Optional[List[psutil.Process]] = None) -> Tuple[float, Optional[float]]:
        """(CPU seconds of the tree, of this process's own threads without its children), both from one
        reading of each process: the tree's rest is then the loader workers. Read apart, the busy training
        process's time ran on between the two reads, so with no workers at all the two could differ (by
        0.06 cores in a suite run of 50 ms windows). Own is None under a launcher, whose tree holds other
        ranks."""
        total, own = 0.0, None
        for p in processes if processes is not None else self.processes():
            try:
                t = p.cpu_times()
            except psutil.Error:  # exited between listing and reading: its parent reaps its time
                continue
            total += t.user + t.system + t.children_user + t.children_system
            if p.pid == self._me.pid and self.root.pid == self._me.pid:
                own = t.user + t.system
        return total, own

    def count(self) -> int:
        return len(self.processes())


def counted_disks(names: Iterable[str], sys_block: str = "/sys/block") -> Set[str]:
    """Whole physical disks only: partitions (not in /sys/block), device-mapper/RAID devices and
    loop/ram disks would count the same bytes twice or count memory."""
    return {n for n in names if os.path.exists(os.path.join(sys_block, n)) and not n.startswith(_NOT_A_DISK)}


def disk_read_bytes() -> Optional[int]:
    """Bytes read from this machine's physical disks so far (all processes: the page cache hides
    re-reads, so this is what really came off the disks)."""
    try:
        counters = psutil.disk_io_counters(perdisk=True) or {}
    except (psutil.Error, OSError, RuntimeError):
        return None
    disks = counted_disks(counters)
    return sum(counters[d].read_bytes for d in disks) if disks else None


# ---- GPUs: NVML numbers every GPU of the machine in PCI order and ignores CUDA_VISIBLE_DEVICES;
# CUDA numbers only the visible ones (in its own order unless CUDA_DEVICE_ORDER=PCI_BUS_ID).


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handle(
    nvml, cuda_index: int, uuid: Optional[str] = None, visible: Optional[str] = None, pci_bus_id: Optional[str] = None
):
    """The NVML handle of the GPU that torch calls ``cuda:<cuda_index>``.

    Exact whatever the ordering: by the device's UUID when torch gives it (a GPU's or a MIG
    slice's), else by its PCI bus id. Else through ``CUDA_VISIBLE_DEVICES``: its N-th entry is an
    NVML index (the same GPU only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, CUDA's own order being
    fastest first) or a (prefix of a) UUID. Raises LookupError when the device cannot be found.
    """
    if uuid:
        bare = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
        for candidate in (f"GPU-{bare}", f"MIG-{bare}"):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(candidate)
            except Exception:
                continue
    if pci_bus_id:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        except Exception:
            pass  # fall back to the visible-devices mapping
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()] if visible is not None else None
    if entries is None:
        return nvml.nvmlDeviceGetHandleByIndex(cuda_index)
    if cuda_index >= len(entries):
        raise LookupError(f"cuda:{cuda_index} is not among CUDA_VISIBLE_DEVICES={visible}")
    entry = entries[cuda_index]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    wanted = entry if entry.startswith(("GPU-", "MIG-")) else f"GPU-{entry}"
    matches = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if _text(nvml.nvmlDeviceGetUUID(handle)).startswith(wanted):
            matches.append(handle)
    if len(matches) != 1:
        raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} NVML devices")
    return matches[0]


class GpuReader:
    """NVML readings of one GPU (the rank's own), plus this process's reserved memory on it."""

    def __init__(self, cuda_index: int, nvml=None) -> None:
        import torch  # lazy: no torch before a job starts (trainer/__init__.py)

        self.cuda_index = cuda_index
        self.nvml = nvml
        self.handle = None
        self.note: Optional[str] = None
        if self.nvml is None:
            try:
                import pynvml  # lazy: optional ([gpu] extra)

                pynvml.nvmlInit()
                self.nvml = pynvml
            except Exception as e:  # no nvidia-ml-py, or no NVIDIA driver
                self.note = (
                    f"no NVML ({type(e).__name__}); install nvidia-ml-py for GPU utilization, power and temperature"
                )
                return
        uuid = pci = None
        try:
            props = torch.cuda.get_device_properties(cuda_index)
            uuid = str(props.uuid)
            pci = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"  # NVML's busId form
        except Exception:
            pass
        try:
            self.handle = nvml_handle(self.nvml, cuda_index, uuid, os.environ.get("CUDA_VISIBLE_DEVICES"), pci)
        except Exception as e:
            self.note = f"no NVML device for cuda:{cuda_index} ({e})"

    def read(self) -> Dict[str, float]:
        import torch  # lazy: no torch before a job starts (trainer/__init__.py)

        out: Dict[str, float] = {}
        try:
            out["gpu/reserved_mb"] = torch.cuda.memory_reserved(self.cuda_index) / 2**20
        except Exception:
            pass
        if self.handle is None:
            return out
        nv, h = self.nvml, self.handle
        for key, read in (
            ("gpu/util", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            ("gpu/mem_used_mb", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
            ("gpu/mem_total_mb", lambda: nv.nvmlDeviceGetMemoryInfo(h).total / 2**20),
            ("gpu/power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
            ("gpu/temp_c", lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        ):
            try:
                out[key] = read()
            except Exception:  # a reading this GPU or driver does not support
                pass
        return out
