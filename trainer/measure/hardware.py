"""What this machine can do: accelerator, device name and count, native bf16/fp16 support.

Used at start-up for the one-line banner, to resolve ``amp_dtype=auto``, to refuse impossible
combinations (``strategy=fsdp`` without a GPU), and to warn where a flag will be slower here
(bf16 autocast on a CPU without AVX512-BF16/AMX runs ~30x slower than fp32 on this project's
build machines).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Optional

from trainer.measure import sysstats
from trainer.measure.sysstats import usable_cores as from_affinity_and_quota


@dataclass(frozen=True)
class Hardware:
    accelerator: str  # "cuda" or "cpu"
    name: str
    count: int
    cpu_cores: int
    bf16_native: bool  # bf16 math runs at full speed (CUDA sm80+, or a CPU with AVX512-BF16/AMX)
    fp16: bool  # fp16 autocast with loss scaling is available (CUDA only)
    capability: str = ""  # CUDA compute capability, e.g. "9.0"
    # the CPU quota in cores (the cgroup's, or the Slurm job's allocation here) where it allows fewer than the affinity mask
    cpu_quota: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def _cpu_flags() -> set:
    """The CPU's feature flags; ``TRAINER_CPU_FLAGS="avx2 fma"`` makes the trainer treat this CPU as one
    with only those (to see what it says and decides on another CPU kind; the kernels that run do not change)."""
    if os.environ.get("TRAINER_CPU_FLAGS") is not None:
        return set(os.environ["TRAINER_CPU_FLAGS"].split())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_kind() -> str:
    """The CPU kind a benchmark's numbers belong to, by what bf16 and wide vector math cost on it:
    native bf16 (AVX512-BF16 or AMX), AVX512 without bf16 (bf16 emulated), AVX2 only, or other."""
    flags = _cpu_flags()
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "AVX512-BF16/AMX"
    if "avx512f" in flags:
        return "AVX512 without BF16"
    return "AVX2 only" if "avx2" in flags else "other"


def machine_record() -> dict:
    """The machine a benchmark ran on, as its results' machine.json holds it."""
    return {"cpu": cpu_name(), "cpu_kind": cpu_kind(), "cores": os.cpu_count()}


def usable_cores() -> int:
    """CPU cores this run can keep busy: its affinity mask cut to its cgroup's CPU quota and its Slurm
    job's allocation on this node (see sysstats)."""
    return from_affinity_and_quota()


def cores_per_process(cores: int, processes_per_node: int = 1) -> int:
    """Each of a node's processes' share of its ``cores``.

    A rank Slurm started as one task of several (srun) has its task's CPUs: where Slurm binds tasks to
    their CPUs (task/affinity, task/cgroup) its affinity mask is already its own task's alone, and
    dividing that again by the ranks per node left each rank a quarter of its CPUs with 4 ranks (2 of
    8: one loader worker)."""
    task = sysstats.slurm_task_cpus()
    if task is not None:
        return min(cores, task)
    return cores // max(1, processes_per_node)


def workers_per_process(cores: int, processes_per_node: int = 1) -> int:
    """The loader workers each of a node's processes can have: its share of the cores less one for the
    process itself, at most 16 (``data.auto_workers`` picks this; the doctor suggests it)."""
    return max(0, min(16, cores_per_process(cores, processes_per_node) - 1))


def bf16_slowdown(module, image_size: int) -> float:
    """How many times slower a training step of ``module`` runs under bf16 autocast than in fp32 on
    this CPU: a short probe (batch 2 at ``image_size``, forward and backward, the better of 2 after
    a warm-up each; a second or two where bf16 is emulated). The weights are left as they were."""
    import torch  # lazy: keeps torch out of the doctor, the tuner's own process and the built-in set's cutting processes

    saved = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.randn(2, 3, image_size, image_size)
    was_training = module.training
    module.train()

    def step(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            module(x).float().sum().backward()
        return time.perf_counter() - start

    try:
        times = {}
        for bf16 in (False, True):
            step(bf16)
            times[bf16] = min(step(bf16) for _ in range(2))
    finally:
        module.zero_grad(set_to_none=True)
        module.load_state_dict(saved)
        module.train(was_training)
    return times[True] / max(times[False], 1e-6)


@lru_cache(maxsize=None)
def detect(accelerator: str = "auto") -> Hardware:
    import torch  # lazy: keeps torch out of the doctor, the tuner's own process and the built-in set's cutting processes

    cpus, limit = sysstats.allowed_cpus(), sysstats.cpu_limit()  # read once for both
    cores = sysstats.usable_cores(cpus, limit)
    quota = sysstats.quota_limit(cpus, limit)
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return Hardware(
            accelerator="cuda",
            name=torch.cuda.get_device_name(0),
            count=torch.cuda.device_count(),
            cpu_cores=cores,
            # torch's default counts emulated bf16 as supported (a V100 or T4 says yes): ask for native only
            bf16_native=torch.cuda.is_bf16_supported(including_emulation=False),
            fp16=True,
            capability=f"{major}.{minor}",
            cpu_quota=quota,
        )
    flags = _cpu_flags()
    return Hardware(
        accelerator="cpu",
        name=cpu_name(),
        count=1,
        cpu_cores=cores,
        bf16_native=bool(flags & {"avx512_bf16", "amx_bf16"}),
        fp16=False,
        cpu_quota=quota,
    )
