"""What this machine can do: accelerator, device name and count, native bf16/fp16 support.

Used at start-up for the one-line banner, to resolve ``amp_dtype=auto``, to refuse impossible
combinations (``strategy=fsdp`` without a GPU), and to warn where a flag will be slower here
(bf16 autocast on a CPU without AVX512-BF16/AMX runs ~30x slower than fp32 on this project's
build machines).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Optional


@dataclass(frozen=True)
class Hardware:
    accelerator: str  # "cuda" or "cpu"
    name: str
    count: int
    cpu_cores: int
    bf16_native: bool  # bf16 math runs at full speed (CUDA sm80+, or a CPU with AVX512-BF16/AMX)
    fp16: bool  # fp16 autocast with loss scaling is available (CUDA only)
    capability: str = ""  # CUDA compute capability, e.g. "9.0"
    cpu_quota: Optional[float] = None  # the cgroup's CPU quota in cores where it allows fewer than the affinity mask

    def as_dict(self) -> dict:
        return asdict(self)


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def usable_cores() -> int:
    """CPU cores this run can keep busy: its affinity mask cut to its cgroup's CPU quota (see sysstats)."""
    from .sysstats import usable_cores as from_affinity_and_quota

    return from_affinity_and_quota()


@lru_cache(maxsize=None)
def detect(accelerator: str = "auto") -> Hardware:
    import torch

    from . import sysstats

    cpus, limit = sysstats.allowed_cpus(), sysstats.cgroup_cpu_limit()  # read once for both
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
        name=_cpu_name(),
        count=1,
        cpu_cores=cores,
        bf16_native=bool(flags & {"avx512_bf16", "amx_bf16"}),
        fp16=False,
        cpu_quota=quota,
    )
