"""metrics.json (schema 1, see SPEC): assembled from what the run measured, written atomically.

Written at the end of every run, also a failed one (``status: failed`` with a one-line
``error``), so a sweep's report can always read every job from disk. A failure never overwrites
an earlier run's successful metrics.json in the same dir (a bad resume must not lose a result).
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
    """Atomically write ``metrics`` to ``path``; return the path actually written."""
    if metrics.get("status") != "ok" and _holds_ok_result(path):
        path = os.path.join(os.path.dirname(path), "metrics.failed.json")
    atomic_write_text(path, json.dumps(metrics, indent=2, default=str) + "\n")
    return path


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


def _holds_ok_result(path: str) -> bool:
    try:
        with open(path) as f:
            return json.load(f).get("status") == "ok"
    except (OSError, ValueError):
        return False


def read(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)
