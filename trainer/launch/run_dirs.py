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
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

from trainer.errors import ConfigError
from trainer.measure.metrics import atomic_write_text
from trainer.rank import is_launched_rank, restart_count


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


# run dir -> (its config folder, that folder's files by name) before this process's run wrote its own
_EARLIER_CONFIG: Dict[str, Tuple[str, Dict[str, str]]] = {}


def keep_earlier_config(out_dir: str, subdir: Optional[str], ckpt_path: Optional[str]) -> None:
    """Before Hydra writes a resumed run's config files (``.hydra/``: config, overrides, hydra), the
    earlier run's are kept in memory: a resume that stops before it trains (``restore_earlier_config``)
    would otherwise leave the run's metrics.json and checkpoints beside the failed attempt's config."""
    if not ckpt_path or not os.path.isfile(os.path.join(out_dir, "metrics.json")):
        return
    if is_launched_rank():
        return  # its launching process kept them, before its own Hydra (and this rank's) wrote the new ones
    keep_config_files(out_dir, subdir)


def keep_config_files(out_dir: str, subdir: Optional[str]) -> None:
    """The config files in ``out_dir/subdir`` (Hydra's ``.hydra/``), kept in memory for
    ``restore_earlier_config`` (also a resumed tune's, ``trainer.tune.app``)."""
    if not subdir:
        return
    folder = os.path.join(out_dir, subdir)
    try:
        files = {p.name: p.read_text() for p in Path(folder).glob("*.yaml") if p.is_file()}
    except (OSError, UnicodeDecodeError):
        return
    _EARLIER_CONFIG[os.path.realpath(out_dir)] = (folder, files)


# a file the process that launched this one waits to see (``watch_for_training``): this run trains
TRAINING_STARTED_ENV = "TRAINER_TRAINING_STARTED_FILE"


def forget_earlier_config(out_dir: str) -> None:
    """The resume got past its checks and trains: its config files are the run's from here on (also
    for the process that launched this one, which holds the earlier ones)."""
    _EARLIER_CONFIG.pop(os.path.realpath(out_dir), None)
    marker = os.environ.get(TRAINING_STARTED_ENV)
    if marker:
        try:
            Path(marker).touch()
        except OSError:
            pass


def watch_for_training(out_dir: str) -> Tuple[dict, Optional[str]]:
    """For a resume whose processes this one launches (torchrun's ranks, the allocator's relaunch): the
    environment that has them say when they start training, and the file they touch then. Their exit
    status alone cannot say it: bad input found mid-epoch (a label file in the first epoch) exits with
    the same 2 as a checkpoint that does not fit. ``({}, None)`` where no earlier config is kept."""
    if os.path.realpath(out_dir) not in _EARLIER_CONFIG:
        return {}, None
    marker = os.path.join(tempfile.mkdtemp(prefix="trainer-launch-"), "training-started")
    return {TRAINING_STARTED_ENV: marker}, marker


def restore_earlier_config(out_dir: str) -> None:
    """A resume that stopped before training (bad input): the run's earlier config files back in place."""
    folder, files = _EARLIER_CONFIG.pop(os.path.realpath(out_dir), (None, {}))
    for name, text in files.items():
        atomic_write_text(os.path.join(folder, name), text)


def settle_launched_config(out_dir: str, training_started: Optional[str], bad_input: bool) -> None:
    """After the processes ``watch_for_training`` watched have ended: the earlier config files back
    where they stopped on ``bad_input`` before training, else the new ones are the run's."""
    trained = bool(training_started) and os.path.exists(training_started)
    if training_started:
        shutil.rmtree(os.path.dirname(training_started), ignore_errors=True)
    if bad_input and not trained:
        restore_earlier_config(out_dir)
    else:
        forget_earlier_config(out_dir)


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
