"""Launch a multi-process job's ranks with torchrun, one Hydra job at a time.

Why not Lightning's own DDP launcher: it re-runs ``sys.argv`` in each child process, so under a
Hydra multirun (``-m``) every child starts a sweep of its own (lightning-hydra-template #393,
hydra #2070). Instead, the Hydra job (single run or one job of a sweep) starts
``python -m torch.distributed.run --nproc-per-node=N train.py <this job's overrides>
hydra.run.dir=<this job's dir>``: the ranks compose exactly this job's config as a single run,
in this job's dir; Lightning sees a torchelastic environment and launches nothing itself; rank 0
writes metrics.json; and the sweep goes on to its next job when the ranks exit. One code path
serves single runs and sweeps.

Already inside torchrun (LOCAL_RANK set), under SLURM with one task per rank, or for one process,
nothing is launched: the job runs in this process.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from typing import List

log = logging.getLogger(__name__)

DISTRIBUTED = ("ddp", "fsdp", "fsdp2")


def inside_launcher() -> bool:
    """True when some launcher (torchrun, SLURM srun, Lightning) already started this process as a rank."""
    if "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    return int(os.environ.get("SLURM_NTASKS", "1")) > 1


def processes_per_node(cfg) -> int:
    devices = cfg.devices
    if isinstance(devices, int) and devices > 0:
        return devices
    if cfg.accelerator != "cpu":
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.device_count()
        except Exception:
            pass
    return 1


def needs_launch(cfg) -> bool:
    return cfg.strategy in DISTRIBUTED and processes_per_node(cfg) > 1 and cfg.num_nodes == 1 and not inside_launcher()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cfg, out_dir: str, overrides: List[str]) -> int:
    """Run this job's ranks under torchrun on this node; return torchrun's exit code."""
    from .cli import ROOT

    nproc = processes_per_node(cfg)
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.run.dir", "hydra.sweep.dir", "hydra.job.num"))]
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nproc}", "--nnodes=1", f"--master-addr=127.0.0.1", f"--master-port={_free_port()}",
        str(ROOT / "train.py"), *kept, f"hydra.run.dir={out_dir}",
    ]
    log.info("launching %d ranks: %s", nproc, " ".join(cmd))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])))
    return subprocess.call(cmd, env=env)
