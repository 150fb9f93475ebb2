"""What one job is made of: the config it was asked to run, the parts built for it in order, the
values it settled, and the callbacks its record reads back. ``build`` fills a ``Parts``, ``fit`` trains
it, ``record`` writes whatever is there; a job that fails part-way leaves what it built.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from trainer import config as config_mod
from trainer.measure import metrics as metrics_mod
from trainer.rank import global_rank


def flags_of(cfg) -> Dict[str, Any]:
    return {k: OmegaConf.select(cfg, k) for k in config_mod.FLAG_KEYS}


@dataclass
class Parts:
    """One job: what it was asked, what was built for it (in build order), and what it settled.

    ``build`` fills the fields in order, so a job that fails part-way leaves what it built, and
    ``record`` reads whatever is there. ``settled`` holds the values the run decided itself (the
    class count the data has, the batch size a search chose, the scaled learning rate): they are set
    on the job's config in one place (``_settle``), which is then saved once as ``.hydra/config.yaml``.
    """

    cfg: Any
    out_dir: str
    overrides: List[str]
    config_path: Optional[str]
    timer: Any = None
    started: float = field(default_factory=time.time)
    requested: Dict[str, Any] = field(default_factory=dict)  # the flags as asked for (batch_size=auto stays "auto")
    hw: Any = None
    plan: Any = None
    ckpt_path: Optional[str] = None
    previous: Optional[Dict[str, Any]] = None  # the run dir's metrics.json when resuming
    datamodule: Any = None
    module: Any = None
    settled: Dict[str, Any] = field(default_factory=dict)
    strategy: Any = None  # Lightning's strategy object (built once the model exists)
    peak_flops: Optional[float] = None
    callbacks: "Callbacks | None" = None
    trainer: Any = None
    notes: Dict[str, Any] = field(default_factory=dict)  # extra metrics.json fields (lr_note, resumed_from, ...)
    config_saved: bool = False
    loggers: List[Any] = field(default_factory=list)  # the job's experiment trackers (trainer/output/trackers/)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.out_dir, "metrics.json")


@dataclass
class Callbacks:
    """The job's own callbacks that its result reads back; ``all`` is every callback given to Lightning."""

    peak: Any
    preemption: Any
    bad_samples: Any
    nan_guard: Any
    monitor: Any
    all: List[Any]

    def find(self, kind) -> Any:
        return next((c for c in self.all if isinstance(c, kind)), None)


def save_config(parts: Parts) -> None:
    """Rewrite ``.hydra/config.yaml`` with the config that runs (Hydra saved it before scale= and the settled values)."""
    path = parts.config_path
    if parts.config_saved or global_rank() != 0 or not path or not os.path.isdir(os.path.dirname(path)):
        return
    metrics_mod.atomic_write_text(path, OmegaConf.to_yaml(parts.cfg, resolve=True))
    parts.config_saved = True


def previous_result(out_dir: str) -> Optional[Dict[str, Any]]:
    """What the run dir's metrics.json already holds (a resumed run merges its epochs into it)."""
    try:
        return metrics_mod.read(os.path.join(out_dir, "metrics.json"))
    except (OSError, ValueError):
        return None
