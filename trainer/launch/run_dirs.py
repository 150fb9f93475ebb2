"""Where the product may write: never over an earlier run's results.

A run dir that holds a finished or killed run (its ``metrics.json`` says ``ok`` or ``running``, or
it has checkpoints) is only ever resumed (``ckpt_path=last``, or a checkpoint inside it), never
trained into from scratch; a sweep dir that holds an earlier sweep's jobs or report is not swept
into again. Checked by the Hydra callbacks before Hydra writes anything into the dir (its
``.hydra/`` files), and again per job. Light on imports: the report's callback uses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from trainer.errors import ConfigError
from trainer.rank import restart_count


class OutputTaken(ConfigError):
    """The output dir holds an earlier run's results: refused, and nothing is written there (not even a failure record)."""


def _resumes_this_dir(out_dir: str, ckpt_path: Optional[str]) -> bool:
    if not ckpt_path:
        return False
    if ckpt_path == "last" or not os.path.exists(str(ckpt_path)):
        return True  # (a missing file is refused by name when the run resolves it)
    return os.path.realpath(out_dir) in Path(os.path.realpath(str(ckpt_path))).parents


def refuse_finished_run_dir(out_dir: str, ckpt_path: Optional[str], key: str = "hydra.run.dir") -> None:
    if _resumes_this_dir(out_dir, ckpt_path):
        return
    held = []
    try:
        status = json.loads(Path(out_dir, "metrics.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if restart_count() > 0 and status != "ok":
        return  # a job Slurm requeued before it finished reruns in its own dir (trainer/launch/slurm.py)
    if status == "ok":
        held.append("metrics.json of a finished run")
    elif status == "running":
        held.append("metrics.json of a run that was stopped mid-way (status running)")
    directory = Path(out_dir, "checkpoints")
    checkpoints = sorted(p.name for p in directory.glob("*.ckpt")) if directory.is_dir() else []
    if checkpoints:
        held.append(f"checkpoints ({', '.join(checkpoints[:3])}{', ...' if len(checkpoints) > 3 else ''})")
    if held:
        resume = (
            "Resume it with ckpt_path=last (raise trainer.max_epochs to train longer), or choose"
            if checkpoints
            else "Choose"
        )
        raise OutputTaken(
            f"'{key}' ({out_dir}) already holds {' and '.join(held)}; training into it from scratch would overwrite them. "
            f"{resume} a new dir. Nothing was changed."
        )


def refuse_used_sweep_dir(sweep_dir: str, ckpt_path: Optional[str]) -> None:
    if ckpt_path:
        return  # resuming the sweep's jobs (each job checks its own dir)
    root = Path(sweep_dir)
    held = [p for p in (root / "ab_report.md", *sorted(root.glob("*/metrics.json"))) if p.exists()]
    if held:
        raise OutputTaken(
            f"'hydra.sweep.dir={sweep_dir}' already holds an earlier sweep ({held[0].relative_to(root)}"
            f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}); a second sweep would overwrite its jobs and report. "
            "Choose a new sweep dir, rebuild the old report with python -m trainer.report, or resume its jobs with ckpt_path=last. Nothing was changed."
        )
