"""metrics.json (schema 1, see SPEC): assembled from what the run measured, written atomically.

Written after every training epoch (``status: running``, a journal that a kill cannot take back)
and at the end of every run, also a failed one (``status: failed`` with a one-line ``error``), so a
sweep's report can always read every job from disk. A failure never loses an earlier run's
successful result in the same dir (a bad resume must not lose a result).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Optional

SCHEMA = 1


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


def build(
    *,
    status: str,
    error: Optional[str],
    recipe: Optional[str],
    flags: Dict[str, Any],
    device: Dict[str, Any],
    epochs: list,
    summary: Dict[str, Any],
    peak_memory: Optional[float],
    train_loss: Optional[float],
    val_acc: Optional[float],
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    out = {
        "schema": SCHEMA,
        "status": status,
        "error": error,
        "recipe": recipe,
        "flags": flags,
        "device": device,
        "epochs": epochs,
        "epoch_time_s": summary.get("epoch_time_s"),
        "samples_per_s": summary.get("samples_per_s"),
        "data_wait_fraction": summary.get("data_wait_fraction"),
        "peak_memory_mb": peak_memory,
        "train_loss": train_loss,
        "val_acc": val_acc,
    }
    out.update({k: v for k, v in summary.items() if k not in out})
    out.update(extra or {})
    return out


def write(path: str, metrics: Dict[str, Any]) -> str:
    """Atomically write ``metrics`` to ``path``; return the path actually written.

    An ``ok`` result on disk is replaced by a ``running``/``failed`` one only when the new record
    holds every epoch the old one did and more (a resumed run that trained on: its journal carries
    the whole history, and the old summary is kept under ``previous_result``); otherwise the new
    record goes to ``metrics.failed.json`` beside it (a bad resume must not lose a result).
    """
    if metrics.get("status") != "ok":
        old = _ok_result(path)
        if old is not None:
            old_epochs = {e.get("epoch") for e in old.get("epochs") or []}
            new_epochs = {e.get("epoch") for e in metrics.get("epochs") or []}
            if old_epochs and old_epochs < new_epochs:  # it trained on: a strict superset of the result's epochs
                metrics = dict(
                    metrics, previous_result=old.get("previous_result") or {k: old.get(k) for k in _RESULT_KEYS}
                )
            else:
                path = os.path.join(os.path.dirname(path), "metrics.failed.json")
    atomic_write_text(path, json.dumps(metrics, indent=2, default=str) + "\n")
    return path


# the summary of a finished result that a resumed run, training on, keeps beside its journal
_RESULT_KEYS = (
    "status",
    "epoch_time_s",
    "samples_per_s",
    "data_wait_fraction",
    "transfer_fraction",
    "train_loss",
    "val_acc",
)


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync it, then rename it over ``path``."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _ok_result(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("status") == "ok" else None


def read(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)
