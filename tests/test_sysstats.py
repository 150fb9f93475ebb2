"""System readings scoped to what a run can use: its CPUs (affinity, cgroup quota), its process
tree (loader workers, local ranks), its own GPU (NVML index mapping), its steady epochs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import clean_env

from trainer.callbacks import SystemMonitor
from trainer.measure import sysstats

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin a competitor away")


@needs_two_cpus
@pytest.mark.whole_machine  # pins a competitor to the other core
def test_under_a_restricted_affinity_cores_and_busy_time_are_those_cpus_only():
    """A process pinned to one CPU, with a competitor busy on another: one usable core, and the
    competitor is not "other processes" on this run's CPU (host-wide readings said it was)."""
    cpus = sorted(os.sched_getaffinity(0))
    burner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time; os.sched_setaffinity(0, {{{cpus[1]}}}); t=time.time()\nwhile time.time()-t<20: pass",
        ]
    )
    try:
        code = f"""
import os, time
os.sched_setaffinity(0, {{{cpus[0]}}})
from trainer.measure import sysstats, hardware
busy, tree = sysstats.CpuBusy(), sysstats.ProcessTree()
c0 = tree.cpu_seconds(); busy.cores(); t0 = time.monotonic()
while time.monotonic() - t0 < 1.5: pass
own = (tree.cpu_seconds() - c0) / (time.monotonic() - t0)
print(sysstats.usable_cores(), hardware.detect().cpu_cores, sysstats.allowed_cpus(), round(busy.cores(), 3), round(own, 3))
"""
        time.sleep(0.3)  # the competitor is spinning
        r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        head, busy, own = r.stdout.strip().rsplit(" ", 2)
        busy, own = float(busy), float(own)
        assert head == f"1 1 [{cpus[0]}]", head  # usable cores, the hardware's cores, the allowed CPUs
        assert busy <= 1.05, busy  # one CPU cannot be more than one core busy
        assert busy - own < 0.3, (busy, own)  # the competitor on the other CPU is not counted against us
    finally:
        burner.kill()
        burner.wait()


def test_cgroup_quota_v2_and_v1_and_a_slurm_allocation_cut_the_usable_cores(tmp_path, monkeypatch):
    v2 = tmp_path / "v2"
    (v2 / "outer" / "job").mkdir(parents=True)
    (v2 / "outer" / "cpu.max").write_text("150000 100000\n")  # the parent limits to 1.5 cores
    (v2 / "outer" / "job" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cgroup2").write_text("0::/outer/job\n")
    assert sysstats.cgroup_cpu_limit(str(tmp_path / "cgroup2"), str(v2)) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "slurm" / "job_7").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "slurm" / "job_7" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu,cpuacct" / "slurm" / "job_7" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cgroup1").write_text("4:memory:/slurm/job_7\n3:cpu,cpuacct:/slurm/job_7\n")
    assert sysstats.cgroup_cpu_limit(str(tmp_path / "cgroup1"), str(v1)) == 4.0
    (tmp_path / "none").write_text("0::/\n")
    assert sysstats.cgroup_cpu_limit(str(tmp_path / "none"), str(tmp_path / "empty")) is None
    assert sysstats.usable_cores(cpus=list(range(16)), limit=1.5) == 1
    assert sysstats.usable_cores(cpus=list(range(16)), limit=4.0) == 4
    assert sysstats.usable_cores(cpus=[0, 1], limit=8.0) == 2
    assert sysstats.usable_cores(cpus=[0, 1, 2], detect_limit=False) == 3
    (v2 / "outer" / "cpu.max").write_text("garbage\n")  # unreadable: no quota, no crash
    assert sysstats.cgroup_cpu_limit(str(tmp_path / "cgroup2"), str(v2)) is None
    # a Slurm job's CPUs on this node, on a cluster that does not bind jobs to them (the affinity mask
    # is the whole node): the threads and loader workers of a 1-CPU job keep to one core
    assert sysstats.slurm_cpu_limit({}) is None and sysstats.slurm_cpu_limit({"SLURM_CPUS_ON_NODE": "x"}) is None
    assert sysstats.slurm_cpu_limit({"SLURM_CPUS_ON_NODE": "3"}) == 3.0
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "3")
    monkeypatch.setattr(sysstats, "cgroup_cpu_limit", lambda: None)  # this machine's own quota, if any, aside
    assert sysstats.cpu_limit() == 3.0 and sysstats.usable_cores(cpus=list(range(16))) == 3
    monkeypatch.setattr(sysstats, "cgroup_cpu_limit", lambda: 2.0)  # the tighter of the two
    assert sysstats.cpu_limit() == 2.0 and sysstats.usable_cores(cpus=list(range(16))) == 2


def test_a_rank_srun_started_as_one_of_several_tasks_has_its_tasks_cpus(monkeypatch):
    """srun with 4 tasks of 8 CPUs on a node: each rank's share is its task's 8 CPUs, whether Slurm binds
    the task to them (its mask: 8 CPUs, which divided again by 4 ranks left 2) or not (the node's 32
    allocated CPUs over 4 ranks). The ranks of a torchrun (one task) share their task's CPUs."""
    from trainer.measure import hardware

    srun = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_CPUS_PER_TASK": "8"}
    assert sysstats.slurm_task_cpus(srun) == 8
    assert sysstats.slurm_task_cpus({**srun, "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert sysstats.slurm_task_cpus({**srun, "TORCHELASTIC_RUN_ID": "x"}) is None
    assert sysstats.slurm_task_cpus({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}) is None
    # the batch script's (or salloc's) own shell of a 4-task job is no task of a step
    assert sysstats.slurm_task_cpus({"SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "8"}) is None
    for key in (*srun, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    assert hardware.cores_per_process(8, 4) == 2  # outside Slurm: the node's cores over its processes
    for key, value in srun.items():
        monkeypatch.setenv(key, value)
    assert hardware.cores_per_process(8, 4) == 8 and hardware.cores_per_process(32, 4) == 8
    assert hardware.workers_per_process(8, 4) == 7


def test_busy_time_is_read_from_the_right_cpus_when_some_are_offline(tmp_path, monkeypatch):
    (tmp_path / "online").write_text("0-1,3\n")
    assert sysstats.online_cpus(str(tmp_path / "online")) == [0, 1, 3]
    from collections import namedtuple

    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    times = {
        "now": [T(0, 0, 0, 100, 0, 0, 0, 0, 0, 0), T(0, 0, 0, 100, 0, 0, 0, 0, 0, 0), T(50, 0, 0, 50, 0, 0, 0, 0, 0, 0)]
    }
    monkeypatch.setattr(sysstats.psutil, "cpu_times", lambda percpu: times["now"])
    monkeypatch.setattr(sysstats, "online_cpus", lambda: [0, 1, 3])  # CPU 2 is offline: psutil lists 0, 1, 3
    busy = sysstats.CpuBusy(cpus=[3])
    times["now"] = [
        T(0, 0, 0, 200, 0, 0, 0, 0, 0, 0),
        T(0, 0, 0, 200, 0, 0, 0, 0, 0, 0),
        T(150, 0, 0, 50, 0, 0, 0, 0, 0, 0),
    ]
    assert busy.cores() == 1.0  # CPU 3 (third in psutil's list) was busy all the time; 0 and 1 idle


class _Burn:
    """A dataset whose every item costs CPU time in the loader worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        t = time.process_time()
        while time.process_time() - t < 0.15:
            pass
        return i


def test_the_process_tree_holds_the_loader_workers_and_their_cpu():
    import psutil
    import torch

    tree, me = sysstats.ProcessTree(), psutil.Process()
    loader = torch.utils.data.DataLoader(_Burn(), batch_size=1, num_workers=2, persistent_workers=True)
    mine0, tree0 = sum(me.cpu_times()[:2]), tree.cpu_seconds()
    it = iter(loader)
    next(it)
    assert tree.count() >= 3  # this process and two workers
    list(it)
    mine, total = sum(me.cpu_times()[:2]) - mine0, tree.cpu_seconds() - tree0
    assert total - mine >= 8 * 0.15 * 0.8, (total, mine)  # the workers' burn is in the tree's time
    del it, loader


def test_under_torchrun_or_srun_the_tree_is_the_launchers_every_local_rank():
    code = "import os; from trainer.measure import sysstats; print(sysstats.ProcessTree().root.pid == os.getppid(), sysstats.ProcessTree().root.pid)"
    r = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(TORCHELASTIC_RUN_ID="x"), capture_output=True, text=True, timeout=60
    )
    assert r.stdout.split()[0] == "True", r.stderr
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.split()[0] == "True", r.stderr
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.split()[0] == "False", r.stderr  # a single-task step: its own tree
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.stdout.split()[0] == "False", r.stderr


def test_only_whole_physical_disks_are_counted(tmp_path):
    for name in ("sda", "nvme0n1", "dm-0", "loop0", "md0"):
        (tmp_path / name).mkdir()
    names = ["sda", "sda1", "sda2", "nvme0n1", "nvme0n1p1", "dm-0", "loop0", "md0"]
    assert sysstats.counted_disks(names, str(tmp_path)) == {"sda", "nvme0n1"}


class FakeNVML:
    """NVML's numbering: every GPU of the machine, PCI order, CUDA_VISIBLE_DEVICES ignored."""

    NVML_TEMPERATURE_GPU = 0

    class _Util:
        def __init__(self, gpu):
            self.gpu = gpu

    class _Mem:
        def __init__(self, used, total):
            self.used, self.total = used, total

    def __init__(self, uuids):
        self.uuids = uuids
        self.buses = [f"00000000:{0x10 * (i + 1):02X}:00.0" for i in range(len(uuids))]

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.uuids):
            raise ValueError("NVML_ERROR_INVALID_ARGUMENT")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise ValueError("NVML_ERROR_NOT_FOUND")
        return self.uuids.index(uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        if bus_id not in self.buses:
            raise ValueError("NVML_ERROR_NOT_FOUND")
        return self.buses.index(bus_id)

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._Util(10 * handle)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Mem(handle * 2**30, 80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000 + handle

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 40 + handle


UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-cccc3333", "GPU-cccc4444", "MIG-dddd5555"]


def test_a_ranks_gpu_is_found_in_nvmls_numbering():
    nv = FakeNVML(UUIDS)
    assert sysstats.nvml_handle(nv, 1, visible=None) == 1  # nothing hidden: the same numbers
    assert sysstats.nvml_handle(nv, 1, visible="2,3") == 3  # cuda:1 is the second visible GPU
    assert sysstats.nvml_handle(nv, 0, visible="GPU-bbbb") == 1  # a UUID prefix
    assert sysstats.nvml_handle(nv, 0, visible="bbbb2222") == 1
    assert sysstats.nvml_handle(nv, 0, uuid="cccc4444", visible="0,1") == 3  # torch's UUID beats any ordering
    assert sysstats.nvml_handle(nv, 0, uuid="dddd5555") == 4  # a MIG slice's UUID
    assert sysstats.nvml_handle(nv, 0, uuid="ffff", pci_bus_id="00000000:30:00.0") == 2  # else the PCI bus id
    with pytest.raises(LookupError):
        sysstats.nvml_handle(nv, 0, visible="GPU-cccc")  # ambiguous prefix
    with pytest.raises(LookupError):
        sysstats.nvml_handle(nv, 2, visible="0,1")


def test_the_gpu_reader_reads_the_ranks_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    reader = sysstats.GpuReader(1, nvml=FakeNVML(UUIDS))
    reading = reader.read()
    assert reader.note is None and reading["gpu/util"] == 30.0 and reading["gpu/temp_c"] == 43.0
    assert reading["gpu/mem_used_mb"] == 3 * 1024 and reading["gpu/power_w"] == pytest.approx(100.003)


def test_the_monitor_averages_the_steady_epochs_only():
    monitor = SystemMonitor(interval_s=60)
    samples = [
        {"epoch": 0.0, "cpu_busy_cores": 2.0},
        {"epoch": 1.0, "cpu_busy_cores": 1.0},
        {"epoch": 2.0, "cpu_busy_cores": 0.5},
    ]
    monitor.samples = samples
    assert monitor.averages({1, 2}) == {"cpu_busy_cores": 0.75}
    assert monitor.averages({7}) == monitor.averages() == {"cpu_busy_cores": round(3.5 / 3, 4)}  # none there: all
    # weighted by the time each reading covers: a 0.1 s tail of an epoch barely counts
    monitor.samples = [
        {"epoch": 1.0, "window_s": 4.9, "cpu_busy_cores": 1.0},
        {"epoch": 1.0, "window_s": 0.1, "cpu_busy_cores": 2.0},
    ]
    assert monitor.averages({1}) == {"cpu_busy_cores": round((4.9 + 0.2) / 5, 4)}


def test_a_run_takes_one_reading_per_epoch_when_the_interval_is_longer(train, monkeypatch):
    """Each epoch's window closes before validation and opens again after it (a baseline at each
    epoch's start): an epoch shorter than the interval still gets its reading, so the steady epochs
    have readings of their own, and none covers a validation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    baselines, real_baseline = [], SystemMonitor._baseline
    monkeypatch.setattr(SystemMonitor, "_baseline", lambda self: baselines.append(1) or real_baseline(self))
    m, out = train("monitor.interval_s=30", "data.num_samples=1024", "trainer.max_epochs=3")
    assert len(baselines) == 1 + 3  # when built, then after each validation, at the next epoch's start
    events = EventAccumulator(str(out))
    events.Reload()
    assert len(events.Scalars("system/cpu_busy_cores")) == 3
    assert len(events.Scalars("system/processes")) == 3
    assert m["diagnosis"]["evidence"]["process_cpu_cores"] is not None


@pytest.mark.parametrize(
    "flags, kind",
    [
        ("avx2 avx512f avx512_bf16", "AVX512-BF16/AMX"),
        ("avx2 amx_bf16", "AVX512-BF16/AMX"),
        ("avx2 avx512f avx512_vnni", "AVX512 without BF16"),
        ("avx2 fma", "AVX2 only"),
        ("neon", "other"),
    ],
)
def test_the_cpu_kind_a_benchmark_records_follows_the_cpus_flags(monkeypatch, flags, kind):
    from trainer.measure import hardware

    monkeypatch.setenv("TRAINER_CPU_FLAGS", flags)
    assert hardware.cpu_kind() == kind and hardware.machine_record()["cpu_kind"] == kind
    hardware.detect.cache_clear()  # detect() reads the flags once per process
    try:
        assert hardware.detect("cpu").bf16_native is (kind == "AVX512-BF16/AMX")
    finally:
        hardware.detect.cache_clear()  # the next test reads this machine's own flags
