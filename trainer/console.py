"""What a run prints on the terminal: our lines, not our dependencies' chatter.

A single run prints a header (device, flags, lr), one line per epoch and the doctor's verdict; a
sweep prints one status line per job and the A/B table at the end. Everything still reaches the
run dir's ``train.log`` in full: the filter and formatter here sit on the console handler only
(Hydra builds both handlers from ``hydra.job_logging`` in configs/train.yaml, which names them).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any, Dict, Iterable, List, Optional, Set

from .rank import global_rank

# Lightning's INFO lines ("GPU available: ...", "TPU available: ...", the LitLogger tip, "Loading
# `train_dataloader` to estimate ...", "`Trainer.fit` stopped: ...") say nothing a user of this
# trainer needs: the header already names the device. They stay in train.log.
_CHATTY_LOGGERS = ("pytorch_lightning", "lightning", "lightning_fabric")

# Lightning's model summary is logged only when asked for (trainer.model_summary=true): let it through
_MODEL_SUMMARY_LOGGER = "pytorch_lightning.callbacks.model_summary"

# A record logged with extra={STATUS_LINE: True} is a sweep job's one line on the console.
STATUS_LINE = "trainer_status_line"

_state: Dict[str, Any] = {"sweep": False, "swept_keys": None, "warned": set()}

# Set for the processes a sweep job launches (its ranks, or a child for runtime.allocator): the
# sweep's own process prints the job's status line, so they stay as quiet as a sweep job.
QUIET_ENV = "TRAINER_QUIET_CONSOLE"


def set_sweep(on: bool, swept_keys: Optional[Iterable[str]] = None) -> None:
    """In a sweep the console shows only each job's status line, warnings (once each) and errors."""
    _state["sweep"] = on or os.environ.get(QUIET_ENV) == "1"
    if swept_keys is not None:
        _state["swept_keys"] = list(swept_keys)


def swept_keys(overrides: Iterable[str]) -> List[str]:
    """The keys a sweep varies: Hydra's sweep syntax (``a,b``, ``range(...)``, ``choice(...)``, ``glob(...)``);
    a list value (``logger=[csv,mlflow]``) is one value, not a sweep."""
    keys = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        value = value.strip()
        if not sep or (value.startswith("[") and value.endswith("]") and "],[" not in value.replace(" ", "")):
            continue
        if "," in value or re.match(r"^(range|choice|glob|interval)\(", value):
            keys.append(key.lstrip("+~"))
    return keys


class ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, STATUS_LINE, False):
            return True
        if record.levelno < logging.ERROR and global_rank() != 0:
            return False  # the other ranks say the same as rank 0 (their logs are in the run dir)
        if record.levelno < logging.WARNING:
            if record.name.split(".", 1)[0] in _CHATTY_LOGGERS and record.name != _MODEL_SUMMARY_LOGGER:
                # ...except a fit that stopped early for a reason other than its planned length
                message = record.getMessage()
                return "stopped:" in message and not re.search(r"`max_(epochs|steps)=[-\d]+` reached", message)
            return not _state["sweep"]
        if _state["sweep"] and record.levelno == logging.WARNING:
            # the same warning from every job of a sweep ("bf16 is emulated here") is said once
            message = record.getMessage()
            warned: Set[str] = _state["warned"]
            if message in warned:
                return False
            warned.add(message)
        return True


class LauncherFilter(logging.Filter):
    """Hydra's launcher lists each job's overrides as it starts it; the job's status line says that."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.WARNING and record.getMessage().lstrip().startswith("#"))


class ConsoleFormatter(logging.Formatter):
    """Plain lines: the message, prefixed with its level only when it is a warning or worse."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {text}"
        return text


_known_warnings_quieted = False


def quiet_known_warnings() -> None:
    """Filter third-party warnings we know are harmless, at their source, each with why."""
    global _known_warnings_quieted
    if _known_warnings_quieted:
        return
    _known_warnings_quieted = True
    # torch 2.14 deprecated ``isinstance(x, LeafSpec)``; Lightning 2.6's own pytree helper still
    # builds LeafSpec() (pytorch_lightning/utilities/_pytree.py). Lightning's bug to fix, not ours
    # nor the user's: nothing they can change.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    # Lightning warns when an epoch has fewer batches than log_every_n_steps: its own step logging
    # would write nothing in that epoch. The trainer writes step values itself (StepLoss: every
    # log_every_n_steps optimizer steps, across epochs), so nothing is lost and there is nothing to set.
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )
    if "SLURM_JOB_ID" not in os.environ:
        # Lightning warns on every run that `srun` exists but is not used whenever Slurm's client is
        # installed. Outside a Slurm job that is a machine that merely has Slurm: not a mistake.
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def job_label(num: Any, overrides: Iterable[str]) -> str:
    """``#2 amp=true channels_last=false``: the job's number and the values of what the sweep varies."""
    overrides = list(overrides)
    keys = _state["swept_keys"]
    shown = [_lower_bools(ov) for ov in overrides if keys is None or ov.partition("=")[0].lstrip("+~") in keys]
    return f"#{num} " + " ".join(shown) if shown else f"#{num}"


def _lower_bools(override: str) -> str:
    """Hydra's sweeper hands each job ``amp=False``; the command line (and the report) say ``amp=false``."""
    key, sep, value = override.partition("=")
    return f"{key}={value.lower()}" if sep and value in ("True", "False") else override


def status_line(num: Any, overrides: Iterable[str], result: Dict[str, Any], out_dir: str) -> str:
    """One line that says how a sweep job went."""
    label = job_label(num, overrides)
    if not result:
        return f"{label}: no metrics.json was written; see {out_dir}"
    if result.get("status") != "ok":
        return f"{label}: {result.get('status', 'failed')}: {result.get('error') or 'see its metrics.json'} ({out_dir})"
    parts = []
    if result.get("epoch_time_s") is not None:
        parts.append(f"{result['epoch_time_s']:.3f} s/epoch")
    if result.get("samples_per_s") is not None:
        parts.append(f"{result['samples_per_s']:.1f} samples/s")
    if result.get("val_acc") is not None:
        parts.append(f"val_acc {result['val_acc']:.3f}")
    bottleneck = (result.get("diagnosis") or {}).get("bottleneck")
    if bottleneck:
        parts.append(f"bottleneck: {bottleneck}")
    if result.get("already_finished"):
        parts.append("already finished, unchanged")
    return f"{label}: " + ", ".join(parts)
