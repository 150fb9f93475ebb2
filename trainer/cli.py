"""The Hydra entry point behind ``train.py`` and the ``trainer-train`` console script.

It checks the command line against the schema before Hydra composes (so a typo gets a one-paragraph
answer, not a Hydra stack), finishes the config (``trainer.config.compose``), runs the job here or
launches its ranks, and keeps a sweep going when one job fails (its metrics.json says why; the
exit code says that something failed).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import List, Optional

from trainer import config, console
from trainer.command_line import checked_argv, expand_repeats, fail, user_overrides
from trainer.config.compose import finish, prepare_hydra
from trainer.console import quiet_known_warnings
from trainer.errors import ConfigError, UserFacingError
from trainer.launch import stopping
from trainer.launch.processes import (
    exit_launched_rank,
    inside_launcher,
    launch,
    leave_process_group,
    needs_launch,
    refuse_nodes_without_a_launcher,
    settle_strategy,
)
from trainer.launch.run_dirs import (
    OutputTaken,
    refuse_finished_run_dir,
    restore_earlier_config,
    settle_launched_config,
    watch_for_training,
)
from trainer.launch.stopping import PREEMPTED_EXIT_CODE
from trainer.launch.torchrun import first_failure
from trainer.measure import hardware, metrics
from trainer.paths import CONFIG_DIR

log = logging.getLogger("trainer")

_failed_jobs: List[str] = []


def _record_failure(out_dir: str, cfg, overrides: List[str], error: str, rank_error: Optional[str] = None) -> None:
    """A job that failed before (or outside) ``run`` still leaves a metrics.json, so its report row survives.

    ``rank_error``: a launched job's first failed rank's answer. When another rank failed first,
    torchrun stops the rest with SIGTERM, so rank 0's own record may say "stopped by SIGTERM": the
    failed rank's answer is the reason, and replaces that record's error (its epochs are kept).
    """
    from trainer.run import flags_of  # lazy: no torch before a job starts (trainer/__init__.py)

    path = os.path.join(out_dir, "metrics.json")
    if os.path.exists(path):
        existing = metrics.read(path)
        if existing.get("status") == "failed":
            if rank_error and existing.get("error") != rank_error and not stopping.requested():
                metrics.write(path, dict(existing, error=rank_error))
            return  # run() (or rank 0) already recorded this failure
        if existing.get("epochs"):
            # rank 0's journal (status running, or a record written before the job died): its finished
            # epochs are results, kept; only the status and the reason change
            metrics.write(path, dict(existing, status="failed", error=rank_error or error))
            return
    record = metrics.build(
        status="failed",
        error=rank_error or error,
        recipe=cfg.get("recipe"),
        flags=flags_of(cfg),
        device=None,
        epochs=[],
        summary={},
        peak_memory=None,
        train_loss=None,
        val_acc=None,
        extra={"overrides": list(overrides)},
    )
    metrics.write(path, record)


def _log_status(num, overrides: List[str], out_dir: str) -> None:
    """A launched job's status line, from the metrics.json its rank 0 wrote."""
    try:
        result = metrics.read(os.path.join(out_dir, "metrics.json"))
    except (OSError, ValueError):
        result = {}
    _status(console.status_line(num, overrides, result, out_dir), ok=result.get("status") == "ok")


def _status(line: str, ok: bool) -> None:
    """A sweep job's status line (a warning when the job did not finish)."""
    log.log(logging.INFO if ok else logging.WARNING, line, extra={console.STATUS_LINE: True})


@dataclass
class JobContext:
    """Where one Hydra job runs and how it was asked for (from Hydra's runtime config)."""

    out_dir: str
    overrides: List[str]
    multirun: bool
    num: int  # hydra.job.num in a sweep; 0 for a single run
    config_path: Optional[str]  # .hydra/config.yaml, where the run saves the config it ran

    @classmethod
    def from_hydra(cls) -> "JobContext":
        # lazy: keeps hydra out of train.py's start-up
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        out_dir = hc.runtime.output_dir
        multirun = hc.mode == RunMode.MULTIRUN
        return cls(
            out_dir=out_dir,
            overrides=list(hc.overrides.task),
            multirun=multirun,
            num=hc.job.num if multirun else 0,  # hydra.job.num exists in sweeps only
            config_path=os.path.join(out_dir, hc.output_subdir, "config.yaml")
            if hc.output_subdir is not None
            else None,
        )

    @property
    def label(self) -> str:
        return console.job_label(self.num, self.overrides)


def task(cfg) -> None:
    """One Hydra job: finish the config (scale, model), then run it here or launch its ranks; record the outcome."""
    from trainer import sweep  # lazy: keeps hydra out of train.py's start-up

    job = JobContext.from_hydra()
    console.set_sweep(job.multirun)
    if not job.multirun:
        # a single run in this process (also a launched rank); a local sweep's jobs have the sweep's
        # (SweepCallback.on_multirun_start), and a Slurm job keeps submitit's until fit takes over (or,
        # where it launches the job's processes, until they run: processes.launch)
        stopping.install()
    elif sweep.running() and stopping.requested():
        raise sweep.SweepStopped(stopping.requested())  # the signal came between two jobs
    action = sweep.resume_action(job.out_dir) if job.multirun else "run"
    if job.multirun and action != "keep":
        sweep.announce(job.num, job.overrides)
    if action == "keep":  # finishing a stopped sweep: this job had finished
        _status(console.status_line(job.num, job.overrides, sweep.keep_finished(job.out_dir), job.out_dir), ok=True)
        return
    try:
        cfg = finish(cfg, job.overrides)
        refuse_nodes_without_a_launcher(cfg)
        settle_strategy(cfg)
        _prepare_job_dir(cfg, job, resume=action == "resume")
        if needs_launch(cfg):
            _launch_job(cfg, job)
        else:
            _run_job(cfg, job)
        if job.multirun and sweep.running() and stopping.requested():
            # this job saved (or finished): the sweep ends here. Only a sweep whose jobs run in this
            # process: a Slurm job (submitit) returns its result, and its sweep goes on waiting
            raise sweep.SweepStopped(stopping.requested())
    except UserFacingError as e:
        if not isinstance(
            e, OutputTaken
        ):  # an earlier run's results are not ours to overwrite, even with a failure record
            _record_failure(job.out_dir, cfg, job.overrides, str(e))
        if isinstance(e, ConfigError):  # a resume that stopped on bad input before training: the run's own config back
            restore_earlier_config(job.out_dir)
        if not job.multirun:
            fail(str(e), e.exit_code)
        log.error("%s stopped: %s", job.label, e)
        _failed_jobs.append(job.out_dir)
    except Exception:
        if not job.multirun:
            raise
        log.exception("%s failed; its metrics.json records the error, and the sweep goes on", job.label)
        _failed_jobs.append(job.out_dir)


def _prepare_job_dir(cfg, job: JobContext, resume: bool) -> None:
    """A requeued Slurm job or a stopped sweep job resumes from its last.ckpt; any other job's dir must not hold a result."""
    # lazy: keeps omegaconf out of train.py's start-up
    from omegaconf import open_dict

    from trainer.launch.slurm import resume_if_requeued

    resume_if_requeued(cfg, job.out_dir)
    if resume:  # finishing a stopped sweep: this job stopped after saving
        with open_dict(cfg):
            cfg.ckpt_path = "last"
    if not inside_launcher():  # a launched rank's dir is its parent's, which checked it
        refuse_finished_run_dir(job.out_dir, cfg.ckpt_path, "hydra.sweep.dir" if job.multirun else "hydra.run.dir")


def _launch_job(cfg, job: JobContext) -> None:
    """Start the job's ranks (or the job under another allocator); rank 0 of them writes metrics.json."""
    # lazy: keeps omegaconf out of train.py's start-up, and torch until a job starts (trainer/__init__.py)
    from omegaconf import OmegaConf

    from trainer.launch.slurm import hand_launched_job_to_submitit
    from trainer.switches import switchboard

    # check the config and resolve the switches once here, not once per rank: the ranks get the plan
    config.validate(cfg)  # through the module: a test counts the calls
    plan = switchboard.resolve(cfg, hardware.detect(cfg.accelerator))
    if job.config_path:
        # the job's config (scale applied) before its ranks start: they may fail before they reach
        # run(), whose rank 0 saves it again with the values it settles
        OmegaConf.save(cfg, job.config_path, resolve=True)
    # the child processes run this job in this job's dir
    watch, training_started = watch_for_training(job.out_dir)
    try:
        code = launch(cfg, job.out_dir, job.overrides, quiet=job.multirun, env={**switchboard.plan_env(plan), **watch})
    except BaseException:  # (a second Ctrl-C): the new config stays, the watched file goes
        settle_launched_config(job.out_dir, training_started, bad_input=False)
        raise
    # bad input (exit 2) before the processes trained: the run's own config back
    settle_launched_config(job.out_dir, training_started, bad_input=code == ConfigError.exit_code)
    hand_launched_job_to_submitit(code)  # a submitit job stopped by Slurm: requeued, this process leaves
    if code != 0:
        _record_failure(
            job.out_dir,
            cfg,
            job.overrides,
            f"its processes exited with status {code}; see the logs in {job.out_dir}",
            rank_error=first_failure(os.path.join(job.out_dir, "ranks")),
        )
        if not job.multirun:
            sys.exit(code)
        log.error("%s: its processes exited with status %d; see %s", job.label, code, job.out_dir)
        _failed_jobs.append(job.out_dir)
    elif job.multirun:
        _log_status(job.num, job.overrides, job.out_dir)


def _run_job(cfg, job: JobContext) -> None:
    """Train in this process; say how it went (a preempted single run exits with the requeue code)."""
    # lazy: keeps omegaconf (Slurm's requeue) out of train.py's start-up, and torch until a job starts
    from trainer.launch.slurm import leave_for_requeue
    from trainer.run import run

    result = run(cfg, job.out_dir, job.overrides, config_path=job.config_path)
    leave_for_requeue(result)
    if job.multirun:
        _status(console.status_line(job.num, job.overrides, result, job.out_dir), ok=result.get("status") == "ok")
    else:
        view = (
            f" (TensorBoard: tensorboard --logdir {job.out_dir})" if "tensorboard" in (cfg.get("logger") or {}) else ""
        )
        log.info("results: %s%s", os.path.join(job.out_dir, "metrics.json"), view)
    if result.get("preempted"):
        if not job.multirun:
            print(f"\n{result['error']} (exit code {PREEMPTED_EXIT_CODE})", file=sys.stderr)
            sys.exit(PREEMPTED_EXIT_CODE)
        _failed_jobs.append(job.out_dir)


def main() -> None:
    from trainer import sweep  # lazy: keeps hydra out of train.py's start-up

    quiet_known_warnings()
    sweep.remember_argv(sys.argv[1:])
    try:
        argv = checked_argv(sys.argv[1:])
        if user_overrides(argv) is not None:
            sys.argv[1:] = expand_repeats(argv)
    except ConfigError as e:
        fail(str(e))

    import hydra  # lazy: keeps hydra out of train.py's start-up

    prepare_hydra()
    stopping.clear()
    code = None  # how the process is about to end, once it ends by itself or by sys.exit
    try:
        try:
            hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(task)()
        except (sweep.SweepStopped, stopping.Stopped) as stop:
            if isinstance(stop, stopping.Stopped) and not sweep.running():
                print(f"\n{stop}\n", file=sys.stderr)
                sys.exit(128 + int(signal.Signals[stop.signal_name]))
            sys.exit(sweep.finish_stopped(stop.signal_name))
        if _failed_jobs:
            print(
                f"\n{len(_failed_jobs)} job(s) failed; see metrics.json in: {', '.join(_failed_jobs)}", file=sys.stderr
            )
            sys.exit(1)
        code = 0
    except SystemExit as e:
        code = e.code
        raise
    finally:
        stopping.uninstall_all()
        leave_process_group()
        if code is not None or sys.exc_info()[0] is SystemExit:
            exit_launched_rank(code)  # a torchrun rank ends here; any other exception on its way is left to Python


if __name__ == "__main__":
    main()
