"""Slurm requeue: a job that Slurm (or submitit, or our batch script) requeued resumes by itself.

A requeued job runs again with the command line it was submitted with: neither ``scontrol
requeue``, nor submitit's requeue of a preempted or timed-out job, nor ``sbatch --requeue`` adds
``ckpt_path=last``. Slurm says that a run is a rerun (``SLURM_RESTART_COUNT`` >= 1), and the run
dir is the same (the sweep job's, or the batch script's ``outputs/slurm-<job id>``), so the rerun
resumes from that dir's newest checkpoint, or starts over in it when the first run was stopped
before it saved one; either way it continues the first run's tracker runs (trainer/tracking/).
Nothing else may reuse a dir that holds a run (see trainer/launch/run_dirs.py).

A submitit job that starts the job's processes itself (``runtime.allocator``'s relaunch, or torchrun's
ranks with ``hydra.launcher.tasks_per_node=1``) stops them first and then lets submitit requeue it
(``submitit_stop_handler``, ``hand_launched_job_to_submitit``).

``grace_s``: how long Slurm lets a stopped job save, for the ranks' stop window (``checkpoint.stop_grace_s``).
``srun_ranks_environment``: where srun's tasks are the ranks, Lightning is told so.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from typing import Optional

from omegaconf import open_dict

from trainer.errors import ConfigError
from trainer.launch import stopping
from trainer.launch.processes import ALLOCATOR_RELAUNCHED_ENV
from trainer.launch.stopping import PREEMPTED_EXIT_CODE
from trainer.launch.torchrun import LAUNCHED_RANKS_ENV
from trainer.rank import restart_count, srun_rank

log = logging.getLogger(__name__)


def resume_if_requeued(cfg, out_dir: str) -> bool:
    """On a requeued Slurm job: set ``ckpt_path=last`` when the run dir holds a checkpoint. Returns
    whether this is a requeued rerun (which may then also start over in its own dir)."""
    restarts = restart_count()
    if not restarts:
        return False
    # here, not at the top: a launcher that trains nothing does not import torch
    from trainer.launch.checkpoint_files import checkpoint_candidates

    if checkpoint_candidates(out_dir):
        # its own progress, also when it was first started from a given ckpt_path=<file>: else
        # every requeue would start from that file again
        with open_dict(cfg):
            cfg.ckpt_path = "last"
        log.warning("requeued by Slurm (restart %d): resuming from the newest checkpoint in %s", restarts, out_dir)
    elif not cfg.get("ckpt_path"):
        log.warning(
            "requeued by Slurm (restart %d) before a checkpoint was saved: starting over in %s", restarts, out_dir
        )
    return True


def grace_s() -> Optional[int]:
    """Seconds Slurm may leave this job between its first stop signal and SIGKILL, where scontrol says:
    KillWait (a cancelled job, the time limit), plus the job's partition's GraceTime, which a
    preemption adds before that SIGTERM, KillWait and SIGKILL. None outside a Slurm job, or where
    scontrol does not answer."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    asked = [(["scontrol", "show", "config"], r"^KillWait\s*=\s*(\d+)")]
    if os.environ.get("SLURM_JOB_PARTITION"):
        asked.append((["scontrol", "show", "-o", "partition", os.environ["SLURM_JOB_PARTITION"]], r"\bGraceTime=(\d+)"))
    found = []
    for cmd, pattern in asked:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(pattern, out, re.MULTILINE)
        if match:
            found.append(int(match.group(1)))
    return sum(found) if found else None


def requeue_pending() -> bool:
    """Whether Slurm has requeued this job while it still runs: its controller counts one more
    restart than this attempt was started with (a cancelled job does not; both are COMPLETING at
    SIGTERM time). True where scontrol cannot say: the rerun then finds last.ckpt anyway."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", os.environ.get("SLURM_JOB_ID", "")],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        restarts = next(int(f.split("=", 1)[1]) for f in out.split() if f.startswith("Restarts="))
    except (OSError, subprocess.TimeoutExpired, StopIteration, ValueError):
        return True
    return restarts > restart_count()


def leave_for_requeue(result) -> None:
    """A submitit job stopped by SIGTERM (``scontrol requeue``, a preemption past its grace time):
    last.ckpt is saved. If Slurm is requeueing the job, returning would make submitit write this
    attempt's result, which ends the sweep's wait before the requeued job has run; so the process
    leaves without one (as submitit's own SIGTERM handling intends), and the requeued job's result
    is the one the sweep gets. A cancelled job returns: its failed row is its result."""
    if not (
        result.get("preempted")
        and os.environ.get("SUBMITIT_EXECUTOR") == "slurm"
        and "SIGTERM" in str(result.get("error"))
    ):
        return
    if os.environ.get(LAUNCHED_RANKS_ENV) or os.environ.get(ALLOCATOR_RELAUNCHED_ENV):
        return  # a process the job's own process started: that one leaves (hand_launched_job_to_submitit)
    if not requeue_pending():
        return  # scancel: no rerun comes, so this attempt's result (a failed row) is the job's
    log.warning(
        "preempted: Slurm requeues this job and it resumes from last.ckpt; leaving without a result for this attempt"
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)


def submitit_stop_handler():
    """submitit's handler of its time-limit and preemption signal (SIGUSR2) where this process is a
    submitit Slurm job (Hydra's Slurm launcher) that installed one, else None.

    Such a job that starts the job's processes itself keeps the signal from them, which would end
    them unsaved (Python's default for SIGUSR2), and passes its own stop on instead
    (``trainer.launch.processes.launch``): submitit's handler requeues the job at once, so it may run
    only once they have saved (``hand_launched_job_to_submitit``)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or stopping.SUBMITIT_SIGNAL is None:
        return None
    handler = signal.getsignal(stopping.SUBMITIT_SIGNAL)
    return handler if callable(handler) else None


def hand_launched_job_to_submitit(code: int) -> None:
    """After the processes a submitit job launched stopped on a signal it passed on (``code``: theirs):
    SIGUSR2 goes to submitit's handler now, which requeues the job and exits (as a job training in its
    own process does once it saved: ``PreemptionCallback``); a SIGTERM stop that saved leaves for the
    requeue (``leave_for_requeue``). Anything else returns: the job's result is its processes'."""
    name = stopping.requested()
    handler = submitit_stop_handler()
    if handler is not None and name == signal.Signals(stopping.SUBMITIT_SIGNAL).name:
        log.warning("the job's processes stopped (exit status %d); submitit requeues the job", code)
        handler(stopping.SUBMITIT_SIGNAL, None)  # requeues, then sys.exit
    elif name == "SIGTERM" and code == PREEMPTED_EXIT_CODE:
        leave_for_requeue({"preempted": True, "error": "stopped by SIGTERM"})


def srun_ranks_environment():
    """Lightning's ``SLURMEnvironment`` for a rank srun started as one of a job step's several tasks (not
    through torchrun), else None (Lightning chooses).

    Given, not left for Lightning to find: Lightning ignores Slurm in a job named ``interactive`` or
    ``bash`` (salloc's and an interactive shell's), and every task of ``srun --ntasks-per-node=2 python
    train.py strategy=ddp devices=2`` there started two processes of its own: four ranks in two runs,
    both writing the run dir's metrics.json. A step of ``--ntasks`` (``-n``) tasks without
    ``--ntasks-per-node`` stops here in one paragraph (Lightning's own check raised a traceback).
    """
    if not srun_rank():
        return None
    if "SLURM_NTASKS_PER_NODE" not in os.environ:
        tasks = os.environ.get("SLURM_NTASKS", "?")
        raise ConfigError(
            f"srun started {tasks} tasks with --ntasks (-n) but no --ntasks-per-node: Lightning places one rank "
            "per device on each node and needs it. Use --ntasks-per-node=<devices> (with --nodes=<num_nodes>) "
            "in sbatch or srun, e.g. srun --nodes=1 --ntasks-per-node=2 python train.py strategy=ddp devices=2."
        )
    from lightning_fabric.plugins.environments import SLURMEnvironment  # lazy: no torch in a launcher

    return SLURMEnvironment()
