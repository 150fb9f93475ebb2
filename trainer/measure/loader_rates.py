"""The input pipelines' own speed on this machine, measured with the model out of the way: images per
core-second of each decoder and of DALI's CPU pipeline (``scripts/bench_loader_per_core.py --save``).

A run measures only the loader it ran. To say which other loader would feed an input-bound run, the
doctor needs what each costs per core on this CPU; the data-only benchmark measures that once per
machine and keeps it here (``$TRAINER_CACHE/loader_rates.json``, else ``~/.cache/trainer``), under
the CPU's name, so a file copied from another machine is not read as this one's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

from trainer.measure.hardware import cpu_name
from trainer.paths import default_cache_dir

FILE = "loader_rates.json"


def rates_path() -> Path:
    return Path(default_cache_dir()) / FILE


def save(per_core: Dict[str, float], size: int, path: Optional[Path] = None) -> Path:
    """Keep ``per_core`` (loader -> images per core-second: ``pil``, ``turbo``, ``dali``, ...) as this CPU's,
    measured at ``size`` px crops."""
    path = path or rates_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu_name(), "size": size, "per_core": {k: round(float(v), 1) for k, v in per_core.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return path


def load(path: Optional[Path] = None) -> Optional[Dict[str, float]]:
    """This CPU's measured per-core rates, or None (never measured here, or unreadable)."""
    path = path or rates_path()
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("cpu") != cpu_name() or not isinstance(record.get("per_core"), dict):
        return None
    return {str(k): float(v) for k, v in record["per_core"].items() if isinstance(v, (int, float)) and v > 0}
