"""What a sweep recorded about itself, read back so that a rebuilt report is the one the sweep wrote.

A sweep (``trainer.sweep``) writes its A/B report when it ends; a stopped one lists the jobs that did
not run and how to finish it, and its target is its config's ``report.target_acc``. A rebuild
(``python -m trainer.report SWEEP_DIR``) has only the sweep dir: the plan in ``sweep.json`` (the
command, every job, its ``state``) and the sweep's config in Hydra's ``multirun.yaml``. The sweep and
the rebuild both take the "Not run" list, its note and the target's settings from here, so they
cannot say them differently.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainer import console
from trainer.measure.time_to_target import AUTO, DEFAULT_TOLERANCE
from trainer.paths import SWEEP_PLAN

SWEEP_CONFIG = "multirun.yaml"  # Hydra's basic sweeper saves the sweep's config there


def is_sweep_dir(path: Path) -> bool:
    """Whether ``path`` is a sweep's own dir (it holds the sweep's plan or Hydra's record of its config)."""
    return (path / SWEEP_PLAN).is_file() or (path / SWEEP_CONFIG).is_file()


def read_plan(sweep_dir) -> Optional[Dict[str, Any]]:
    """The sweep's plan (``sweep.json``: its command, jobs and state), None where it has none."""
    try:
        plan = json.loads(Path(sweep_dir, SWEEP_PLAN).read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def not_run(sweep_dir: Path, plan: Dict[str, Any]) -> List[str]:
    """Labels of the planned jobs with no result in the sweep dir (``#2 amp=true``: the values of
    what the sweep varies, in the sweep's process and in a rebuild's alike)."""
    swept = console.swept_keys(plan.get("overrides") or [])
    labels = []
    for num, overrides in enumerate(plan.get("jobs") or []):
        if job_status(Path(sweep_dir, str(num))) is None:
            varied = [ov for ov in overrides if ov.partition("=")[0].lstrip("+~") in swept]
            labels.append(console.job_label(num, varied))
    return labels


def finish_command(sweep_dir: Path, plan: Dict[str, Any]) -> str:
    """The command that finishes the sweep: its own, in its dir (``hydra.sweep.dir``, as the sweep named it)."""
    where = plan.get("dir") or str(sweep_dir)
    argv = [a for a in plan.get("argv") or [] if not a.startswith(("hydra.sweep.dir=", "+hydra.sweep.dir="))]
    return "python train.py " + " ".join(shlex.quote(a) for a in argv + [f"hydra.sweep.dir={where}"])


def stopped_by(plan: Dict[str, Any]) -> str:
    return f"the sweep was stopped by {plan.get('signal') or 'a signal'}"


def unfinished(sweep_dir: Path, plan: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``write_report``'s ``not_run`` and ``note`` for a sweep that did not run all its jobs ({} for one
    that ended, or has no plan): the stop's own words for a stopped one. ``plan``: the plan as the
    sweep's process holds it (else read from the sweep dir)."""
    plan = plan if plan is not None else read_plan(sweep_dir) or {}
    if plan.get("state") not in ("stopped", "running"):
        return {}
    again = finish_command(sweep_dir, plan)
    if plan["state"] == "stopped":
        note = f"{stopped_by(plan)}; finish it with: {again}"
    else:
        note = (
            f"the sweep has not finished (its {SWEEP_PLAN} says running); if its process ended, finish it with: {again}"
        )
    return {"not_run": not_run(sweep_dir, plan), "note": note}


def report_settings(config) -> Dict[str, Any]:
    """``report.target_acc`` and ``report.target_tolerance`` of a sweep's config, as write_report takes them
    (the defaults only where the config has no such key: a tolerance of 0 is the baseline's best itself)."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of python -m trainer.report's start-up

    target_acc = OmegaConf.select(config, "report.target_acc")
    tolerance = OmegaConf.select(config, "report.target_tolerance")
    return {
        "target_acc": AUTO if target_acc is None else target_acc,
        "tolerance": DEFAULT_TOLERANCE if tolerance is None else tolerance,
    }


def recorded_settings(sweep_dir: Path) -> Dict[str, Any]:
    """The target's settings the sweep ran with, from its ``multirun.yaml`` ({} where there is none)."""
    from omegaconf import OmegaConf  # lazy, as above

    try:
        config = OmegaConf.load(Path(sweep_dir, SWEEP_CONFIG))
        return report_settings(config)
    except Exception:  # no record, or one OmegaConf cannot read: the rebuild's defaults stand
        return {}


def recorded_report(sweep_dir: Path) -> Dict[str, Any]:
    """``write_report``'s arguments as the sweep's end gave them: its target and, for a sweep that did not
    run all its jobs, the "Not run" list and why."""
    return {**recorded_settings(sweep_dir), **unfinished(sweep_dir)}


def job_status(job_dir: Path) -> Optional[str]:
    """The status a job's metrics.json records (None: no readable record: the job has not run)."""
    try:
        return json.loads((job_dir / "metrics.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
