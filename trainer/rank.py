"""Which process of a multi-process run this is, before Lightning is there to say.

torchrun sets ``RANK``; ``srun`` with several tasks sets ``SLURM_PROCID`` (Lightning's
SLURMEnvironment reads the same). Logging, the saved config and the console need it at start-up;
the run dirs and the trackers need which run of a requeued Slurm job this is (``restart_count``).
"""

import os
from typing import Optional


def world_size() -> int:
    """How many processes the run has: the process group's size once it exists, else what torchrun set."""
    import torch.distributed as dist  # lazy: no torch before a job starts (trainer/__init__.py)

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 1


def is_launched_rank() -> bool:
    """True in a process torchrun started (ours for strategy=ddp/fsdp/fsdp2 on one node, or the user's).

    Such a rank runs in the dir of the process that launched it, which checked that dir and owns
    the sweep around it. (A rank srun started is a job of its own: ``launch.inside_launcher``.)
    """
    return "LOCAL_RANK" in os.environ


def env_count(name: str, environ=None) -> Optional[int]:
    """The environment variable ``name`` as a count of CPUs, threads or tasks: a positive whole number,
    else None (unset, or not one)."""
    try:
        n = int((os.environ if environ is None else environ).get(name, ""))
    except ValueError:
        return None
    return n if n > 0 else None


def srun_task(environ=None) -> bool:
    """Whether srun started this process as one of a job step's several tasks (not the batch script's
    or salloc's own shell, where ``SLURM_NTASKS`` is set too)."""
    env = os.environ if environ is None else environ
    return env.get("SLURM_STEP_ID") is not None and (env_count("SLURM_STEP_NUM_TASKS", env) or 1) > 1


def srun_rank(environ=None) -> bool:
    """Whether this process is a rank srun started, one per task: one of a step's several tasks, and not
    a rank of a torchrun in that task (whose ranks share their task's CPUs and are torchrun's)."""
    env = os.environ if environ is None else environ
    return srun_task(env) and "TORCHELASTIC_RUN_ID" not in env


def global_rank() -> int:
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key)
        if value is not None and (key == "RANK" or int(os.environ.get("SLURM_NTASKS", "1")) > 1):
            try:
                return int(value)
            except ValueError:
                continue
    return 0


def restart_count() -> int:
    """How many times Slurm has requeued this job (0 for a first run, or outside Slurm)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0
