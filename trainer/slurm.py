"""Slurm requeue: a job that Slurm (or submitit, or our batch script) requeued resumes by itself.

A requeued job runs again with the command line it was submitted with: neither ``scontrol
requeue``, nor submitit's requeue of a preempted or timed-out job, nor ``sbatch --requeue`` adds
``ckpt_path=last``. Slurm says that a run is a rerun (``SLURM_RESTART_COUNT`` >= 1), and the run
dir is the same (the sweep job's, or the batch script's ``outputs/slurm-<job id>``), so the rerun
resumes from that dir's newest checkpoint, or starts over in it when the first run was stopped
before it saved one. Nothing else may reuse a dir that holds a run (see trainer/outputs.py).
"""

from __future__ import annotations

import logging
import os
import sys
from omegaconf import open_dict

log = logging.getLogger(__name__)


def restart_count() -> int:
    """How many times Slurm has requeued this job (0 for a first run, or outside Slurm)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_if_requeued(cfg, out_dir: str) -> bool:
    """On a requeued Slurm job: set ``ckpt_path=last`` when the run dir holds a checkpoint. Returns
    whether this is a requeued rerun (which may then also start over in its own dir)."""
    from .checkpointing import checkpoint_candidates

    restarts = restart_count()
    if not restarts:
        return False
    if cfg.get("ckpt_path"):
        return True  # the user chose what to resume from
    if checkpoint_candidates(out_dir):
        with open_dict(cfg):
            cfg.ckpt_path = "last"
        log.warning("requeued by Slurm (restart %d): resuming from the newest checkpoint in %s", restarts, out_dir)
    else:
        log.warning("requeued by Slurm (restart %d) before a checkpoint was saved: starting over in %s", restarts, out_dir)
    return True


def leave_for_requeue(result) -> None:
    """A submitit job stopped by SIGTERM (``scontrol requeue``, a preemption past its grace time):
    last.ckpt is saved and Slurm is requeueing or cancelling the job. Returning would make submitit
    write this attempt's result, which ends the sweep's wait before the requeued job has run; so
    the process leaves without one (as submitit's own SIGTERM handling intends), and the requeued
    job's result is the one the sweep gets."""
    from .checkpointing import PREEMPTED_EXIT_CODE

    if not (result.get("preempted") and os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SIGTERM" in str(result.get("error"))):
        return
    log.warning("preempted: Slurm requeues this job and it resumes from last.ckpt (or it was cancelled); leaving without a result")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)
