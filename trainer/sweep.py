"""A local sweep's life: its plan on disk, a stop that ends it after the job in flight, a re-run that finishes it.

Hydra's basic launcher runs a sweep's jobs one after another in this process. Three things here:

- **The plan.** When the sweep starts, ``sweep.json`` in the sweep dir records the command line,
  its overrides and every job the sweep will run (Hydra's own sweep parser expands them, as its
  basic sweeper does), with ``state: running``.
- **A stop.** SIGTERM, SIGUSR1 or Ctrl-C (``trainer.launch.stopping``) during a job: the job saves
  last.ckpt at the next step boundary and stops (``PreemptionCallback``), and the sweep ends there
  (``SweepStopped``) instead of starting its next job. ``finish_stopped`` writes the A/B report of
  what finished, names the jobs that did not run, marks the plan ``stopped`` and says how to finish.
- **What to expect.** Jobs that will be very slow here (amp=true where this CPU only emulates bf16)
  are named before the first job starts, with a short probe's slowdown factor, and each one's
  expected time is said before it starts (from its fp32 twin's measured time). Never refused.
- **Finishing it.** The same command with ``hydra.sweep.dir=<that dir>``: a sweep dir that holds a
  stopped sweep of the same overrides (or one whose process died, on this host) is taken up
  again. A job that finished is kept as it is, not trained again; a stopped job resumes from its
  last.ckpt; the rest run. Anything else in a used sweep dir is still refused (``trainer.launch.run_dirs``).

why longer: Hydra gives a sweep one callback object; the plan file, the resume of a stopped sweep
and the stop between jobs are that object's state and read it together.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf, open_dict

from trainer import console, tracking
from trainer.command_line import fail
from trainer.config import GROUPS
from trainer.config.compose import finish
from trainer.config.scale import reapply_cli
from trainer.console import job_label, swept_keys
from trainer.errors import ConfigError
from trainer.launch import run_dirs, stopping
from trainer.launch.stopping import PREEMPTED_EXIT_CODE
from trainer.measure import hardware, metrics
from trainer.measure.metrics import atomic_write_text
from trainer.measure.sysstats import process_alive
from trainer.paths import SWEEP_PLAN
from trainer.rank import is_launched_rank
from trainer.report import sweep_record
from trainer.report.sweep_record import report_settings
from trainer.report.write import write_report

log = logging.getLogger(__name__)

PLAN = SWEEP_PLAN

# this process's sweep: its dir, and whether it finishes a stopped one (set by on_multirun_start)
_state: Dict[str, Any] = {
    "sweep_dir": None,
    "in_process": False,
    "resuming": False,
    "configs": {},
    "argv": None,
    "slow": {},
    "report": {},  # report.target_acc / target_tolerance of the sweep's config
}


def remember_argv(argv: List[str]) -> None:
    """The command line as the user typed it (trainer.cli), for the "finish it with" hint."""
    _state["argv"] = list(argv)


class SweepStopped(BaseException):
    """The job in flight stopped on a signal: end the sweep here. A BaseException, so that Hydra's
    launcher, which records an ``Exception`` as one job's failure and goes on, lets it through."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def running() -> bool:
    """Whether this process runs a sweep's jobs itself (Hydra's basic launcher: on_multirun_start was
    called here). A Slurm job that submitit started for a sweep does not: its sweep is elsewhere."""
    return _state["sweep_dir"] is not None and _state.get("in_process", False)


def plan_jobs(task_overrides: List[str]) -> Optional[List[List[str]]]:
    """Each job's overrides, in Hydra's basic sweeper's order (None where Hydra cannot expand them here)."""
    try:  # Hydra's private sweeper: in the try, since a plan is a convenience
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(overrides=list(task_overrides))
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception as e:  # a plan is a convenience for the stop report; the sweep runs without it
        log.debug("no sweep plan: %s", e)
        return None


def _write(sweep_dir: str, plan: Dict[str, Any]) -> None:
    atomic_write_text(Path(sweep_dir, PLAN), json.dumps(plan, indent=1) + "\n")


def resumable(sweep_dir: str, task_overrides: List[str]) -> Optional[str]:
    """Why this sweep dir may be taken up again by a sweep of ``task_overrides`` (None: it may not)."""
    plan = sweep_record.read_plan(sweep_dir)
    if not plan or plan.get("overrides") != list(task_overrides):
        return None
    if plan.get("state") == "stopped":
        return f"stopped by {plan.get('signal') or 'a signal'}"
    if (
        plan.get("state") == "running"
        and plan.get("host") == socket.gethostname()
        and not process_alive(int(plan.get("pid") or 0))
    ):
        return "its process ended without finishing it"
    return None


def start(sweep_dir: str, task_overrides: List[str]) -> None:
    """on_multirun_start: record the plan (or take up a stopped sweep's, keeping its finished jobs' configs)."""
    why = resumable(sweep_dir, task_overrides) if Path(sweep_dir, PLAN).exists() else None
    _state.update(sweep_dir=sweep_dir, resuming=bool(why), configs={})
    if why:
        # Hydra rewrites every job's .hydra/config.yaml before the job runs; a finished job's holds the
        # config that actually ran (chosen batch size, scaled lr): kept here and put back (keep_finished)
        for job in sorted(Path(sweep_dir).glob("*/metrics.json")):
            config = job.parent / ".hydra" / "config.yaml"
            if sweep_record.job_status(job.parent) == "ok" and config.exists():
                _state["configs"][str(job.parent.resolve())] = config.read_text()
        log.warning(
            "taking up the sweep in %s (%s): finished jobs are kept, a stopped job resumes from its last.ckpt, the rest run",
            sweep_dir,
            why,
        )
    plan = {
        "sweep": 1,
        "state": "running",
        "argv": _state["argv"] if _state["argv"] is not None else sys.argv[1:],
        "dir": sweep_dir,  # as the command named it: the "finish it with" command says it so (sweep_record)
        "overrides": list(task_overrides),
        "jobs": plan_jobs(task_overrides),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    _write(sweep_dir, plan)


def _job_config(base, overrides: List[str], swept: List[str]):
    """A planned job's config: the sweep's composed config with the job's values and the scale applied
    (as ``trainer.cli.task`` will). None where the sweep varies a config group (that needs Hydra to compose)."""
    if any(key in GROUPS for key in swept):
        return None
    cfg = base.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
        reapply_cli(cfg, overrides)
    return finish(cfg, overrides)


def expect_slow_jobs(config, jobs: Optional[List[List[str]]]) -> None:
    """Before the first job: name the jobs that will be very slow here, and why; their expected time is
    said before each starts (``announce``). Never refuses: the user may want the measurement."""
    _state["slow"] = {}
    if not jobs:
        return
    cpu_bf16 = {}
    swept = (
        swept_keys((sweep_record.read_plan(_state["sweep_dir"]) or {}).get("overrides") or [])
        if _state["sweep_dir"]
        else []
    )
    for num, overrides in enumerate(jobs):
        cfg = _job_config(config, overrides, swept)
        if cfg is None or cfg.accelerator in ("gpu", "cuda"):
            continue
        hw = hardware.detect(cfg.accelerator)
        if hw.accelerator != "cpu":
            continue
        if cfg.amp and cfg.amp_dtype in ("auto", "bf16") and not hw.bf16_native:
            cpu_bf16[num] = cfg
    if not cpu_bf16:
        return
    from trainer.models import build_module  # lazy: no torch before a job starts (trainer/__init__.py)

    first = next(iter(cpu_bf16.values()))
    try:
        factor = hardware.bf16_slowdown(build_module(first), int(first.data.image_size))
    except Exception as e:  # a model that cannot be built here: say it without a figure
        log.debug("bf16 probe failed: %s", e)
        factor = None
    for num in cpu_bf16:
        _state["slow"][num] = factor

    names = ", ".join(job_label(num, jobs[num]) for num in cpu_bf16)
    probe = (
        f"a probe of this model measured a bf16 step at {factor:.1f}x the time of an fp32 one here"
        if factor
        else "expect it several times slower than fp32"
    )
    log.warning(
        "%s: amp=true runs emulated bf16 on this CPU (no AVX512-BF16/AMX): %s. Each one's expected time is said before it "
        "starts; Ctrl-C stops the sweep after the job in flight (the same command with hydra.sweep.dir finishes it later).",
        names,
        probe,
    )


def announce(num: int, overrides: List[str]) -> None:
    """Before a job named by ``expect_slow_jobs``: its expected time, from a finished fp32 twin's."""
    if num not in _state.get("slow", {}):
        return

    factor = _state["slow"][num]
    twin = _finished_twin(num, overrides)
    label = job_label(num, overrides)
    if factor and twin:
        other, wall, steps = twin  # the steps slow down by the factor, setting up does not
        seconds = (wall - steps) + steps * factor
        log.warning(
            "%s: expect about %s (emulated bf16: %.1fx the %s of training and validation that #%s took in fp32)",
            label,
            _duration(seconds),
            factor,
            _duration(steps),
            other,
        )
    elif factor:
        log.warning("%s: expect about %.1fx the time of the same job in fp32 (emulated bf16)", label, factor)


def _finished_twin(num: int, overrides: List[str]) -> Optional[tuple]:
    """(job number, wall seconds, seconds in its epochs) of a finished fp32 job that differs from this one only in
    amp/amp_dtype (else the first finished fp32 one)."""
    sweep_dir, plan = _state["sweep_dir"], sweep_record.read_plan(_state["sweep_dir"] or "") or {}
    mine = {o for o in overrides if not o.lstrip("+~").startswith("amp")}
    finished = []
    for other, other_overrides in enumerate(plan.get("jobs") or []):
        if other == num:
            continue
        try:
            m = json.loads(Path(sweep_dir, str(other), "metrics.json").read_text())
        except (OSError, ValueError):
            continue
        if m.get("status") == "ok" and m.get("wall_time_s") and not m.get("flags", {}).get("amp"):
            same = {o for o in other_overrides if not o.lstrip("+~").startswith("amp")} == mine
            steps = sum((e.get("time_s") or 0) + (e.get("val_time_s") or 0) for e in m.get("epochs") or [])
            finished.append((not same, other, m["wall_time_s"], min(steps, m["wall_time_s"])))
    if not finished:
        return None
    _, other, wall, steps = min(finished)
    return other, wall, steps


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else (f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h")
    )


def done(sweep_dir: str) -> None:
    """on_multirun_end: every job ran."""
    plan = sweep_record.read_plan(sweep_dir)
    if plan:
        plan["state"] = "done"
        _write(sweep_dir, plan)


def resume_action(out_dir: str) -> str:
    """In a sweep being finished: ``keep`` a finished job, ``resume`` one stopped with a checkpoint, else ``run``."""
    if not _state["resuming"]:
        return "run"
    # lazy: no torch before a job starts (trainer/__init__.py)
    from trainer.launch.checkpoint_files import checkpoint_candidates

    status = sweep_record.job_status(Path(out_dir))
    if status == "ok":
        return "keep"
    if status in ("failed", "running") and checkpoint_candidates(out_dir):
        return "resume"
    return "run"


def keep_finished(out_dir: str) -> Dict[str, Any]:
    """A finished job of a sweep being finished: its config put back, its result returned unchanged."""
    config = _state["configs"].get(str(Path(out_dir).resolve()))
    if config is not None:
        metrics.atomic_write_text(Path(out_dir, ".hydra", "config.yaml"), config)
    return dict(metrics.read(os.path.join(out_dir, "metrics.json")), already_finished=True)


def finish_stopped(signal_name: str) -> int:
    """After a stop: mark the plan, write the report of what finished, say what did not run and how to finish.
    The report's "Not run" list and note come from the plan as written here (``sweep_record.unfinished``),
    as a rebuild of the report (``python -m trainer.report``) reads them."""
    sweep_dir = _state["sweep_dir"]
    if not sweep_dir:
        return PREEMPTED_EXIT_CODE
    plan = sweep_record.read_plan(sweep_dir) or {}
    plan.update(state="stopped", signal=signal_name, argv=plan.get("argv") or sys.argv[1:])
    plan.setdefault("dir", sweep_dir)
    _write(sweep_dir, plan)
    unfinished = sweep_record.unfinished(Path(sweep_dir), plan)
    missing = unfinished["not_run"]
    again = sweep_record.finish_command(Path(sweep_dir), plan)
    stopped = sweep_record.stopped_by(plan)
    write_report([sweep_dir], sweep_dir, **unfinished, **_state["report"])
    if not is_launched_rank():
        # the report of what finished, on the parent run / group too; the parent run stays open for the
        # command that finishes the sweep (it attaches the whole report and ends the run)
        tracking.sweep_end(sweep_dir, finished=False)
    print(
        f"\n{stopped} after the job in flight saved its checkpoint; "
        + (f"{len(missing)} job(s) did not run: {'; '.join(missing)}. " if missing else "")
        + f"Finish the sweep (finished jobs are kept, a stopped one resumes) with:\n  {again}\n",
        file=sys.stderr,
        flush=True,
    )
    return PREEMPTED_EXIT_CODE


class SweepCallback(Callback):
    """Hydra's callback for runs and sweeps (configs/train.yaml): guards their output dirs before Hydra
    writes anything there, records a sweep's plan and routes stop signals to it, warns about
    launchers that run jobs in parallel, and writes the A/B report when the sweep ends."""

    def on_run_start(self, config, **kwargs) -> None:
        run_dir = _select(config, "hydra.run.dir")
        if run_dir:
            _refuse_taken(lambda: run_dirs.refuse_finished_run_dir(run_dir, config.get("ckpt_path")))
            run_dirs.keep_earlier_config(run_dir, _select(config, "hydra.output_subdir"), config.get("ckpt_path"))

    def on_multirun_start(self, config, **kwargs) -> None:
        task_overrides = list(_select(config, "hydra.overrides.task") or [])
        swept = console.swept_keys(task_overrides)
        _refuse_resources_the_launcher_cannot_give(config, swept)
        console.set_sweep(True, swept)  # each status line shows what the sweep varies
        sweep_dir = _select(config, "hydra.sweep.dir")
        _state["report"] = report_settings(config)
        if sweep_dir and not is_launched_rank():
            if not resumable(sweep_dir, task_overrides):  # a stopped sweep of the same command is finished instead
                _refuse_taken(lambda: run_dirs.refuse_used_sweep_dir(sweep_dir, config.get("ckpt_path")))
            start(sweep_dir, task_overrides)
            _open_trackers(config, sweep_dir)
            expect_slow_jobs(config, (sweep_record.read_plan(sweep_dir) or {}).get("jobs"))
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if "BasicLauncher" in launcher and not is_launched_rank():
            _state["in_process"] = True
            stopping.install()  # the jobs run in this process: a signal stops the sweep after the job in flight
        one_at_a_time = "BasicLauncher" in launcher or config.hydra.launcher.get("array_parallelism") == 1
        if not one_at_a_time:
            log.warning(
                "hydra/launcher=%s may run jobs in parallel: their epoch times would interfere with each other. "
                "For timing sweeps keep the default launcher (jobs one after another).",
                launcher.rsplit(".", 1)[-1],
            )

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        done(sweep_dir)
        write_report([sweep_dir], sweep_dir, **report_settings(config))
        if not is_launched_rank():
            tracking.sweep_end(sweep_dir)  # the same report, attached to the sweep's parent run / group


def _refuse_resources_the_launcher_cannot_give(config, swept: List[str]) -> None:
    """A launcher whose settings follow ``devices`` or ``num_nodes`` (hydra/launcher=slurm: the tasks and
    GPUs per node, the nodes) reads them once, from the sweep's own config: Hydra's submitit launcher
    resolves its settings when it starts and submits every job as one job array. A sweep over them
    gave every job the resources of the command's value (``devices=1,2``: the second job got one task,
    one CPU or GPU, for two ranks), and ``devices=auto`` or ``-1`` ended in OmegaConf's traceback."""
    raw = OmegaConf.to_container(config.hydra.launcher, resolve=False)
    follows = [k for k in ("devices", "num_nodes") if any(f"${{{k}}}" in str(v) for v in raw.values())]
    launcher = str(raw.get("_target_", "")).rsplit(".", 1)[-1]
    problem = None
    varied = [k for k in follows if k in swept]
    if varied:
        problem = (
            f"the sweep varies {' and '.join(varied)}, but hydra/launcher ({launcher}) asks Slurm for resources once "
            f"for the whole sweep (one job array), by {', '.join(f'{k}={config.get(k)}' for k in varied)} (the value "
            f"without the sweep), for every job. Run one sweep per value, e.g. {varied[0]}=2 with the other keys swept"
        )
    elif "devices" in follows and not (isinstance(config.get("devices"), int) and config.devices > 0):
        problem = (
            f"'devices={config.get('devices')}': hydra/launcher ({launcher}) asks Slurm for that many tasks and GPUs "
            "per node, so it must be a number here, e.g. devices=4"
        )
    if problem and not is_launched_rank():
        fail(f"{problem}.")


def _open_trackers(config, sweep_dir: str) -> None:
    """The sweep's parent run (MLflow) and group (W&B), before any job; a server that does not answer
    ends the sweep here, in one paragraph."""
    try:
        tracking.sweep_start(config, sweep_dir)
    except ConfigError as e:
        fail(str(e), e.exit_code)


def _select(config, key: str):
    return OmegaConf.select(config, key)


def _refuse_taken(check) -> None:
    """Run an output-dir check; a refusal is the user's one paragraph and exit code 2, not Hydra's error report."""
    if is_launched_rank():
        return  # a launched rank runs in its parent's dir, which was checked
    try:
        check()
    except run_dirs.OutputTaken as e:
        fail(str(e), e.exit_code)
