"""What one job is made of: the config it was asked to run, the parts built for it in order, the
values it settled, and the callbacks its record reads back. ``build`` fills a ``Parts``, ``fit`` trains
it, ``record`` writes whatever is there; a job that fails part-way leaves what it built.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from omegaconf import DictConfig, OmegaConf

from trainer import config as config_mod
from trainer.measure import metrics as metrics_mod
from trainer.rank import global_rank

if TYPE_CHECKING:  # the parts' types, without importing torch and Lightning with this module
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import Strategy

    from trainer.callbacks import BadSampleCounter, EpochTimer, NaNGuard, SystemMonitor
    from trainer.callbacks.checkpointing import PreemptionCallback
    from trainer.data import ImageDataModule
    from trainer.measure.hardware import Hardware
    from trainer.measure.memory import PeakMemory
    from trainer.switches.switchboard import Plan


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

    cfg: DictConfig
    out_dir: str
    overrides: List[str]
    config_path: Optional[str]
    timer: Optional[EpochTimer] = None
    started: float = field(default_factory=time.time)
    # the flags as asked for (batch_size=auto stays "auto"): config values, of any type a key has
    requested: Dict[str, Any] = field(default_factory=dict)
    hw: Optional[Hardware] = None
    plan: Optional[Plan] = None
    ckpt_path: Optional[str] = None
    # the run dir's metrics.json when resuming: its JSON, as written
    previous: Optional[Dict[str, Any]] = None
    datamodule: Optional[ImageDataModule] = None
    module: Optional[pl.LightningModule] = None  # the built-in classifier, or a user's own (model._target_)
    settled: Dict[str, Any] = field(default_factory=dict)  # config values the run decided: any key's type
    strategy: Union[Strategy, str, None] = (
        None  # Lightning's strategy object (built once the model exists), or its name
    )
    peak_flops: Optional[float] = None
    callbacks: Optional[Callbacks] = None
    trainer: Optional[pl.Trainer] = None
    notes: Dict[str, Any] = field(
        default_factory=dict
    )  # extra metrics.json fields (lr_note, resumed_from, ...): JSON values
    config_saved: bool = False
    loggers: List[pl.loggers.Logger] = field(default_factory=list)  # the job's experiment trackers (trainer/tracking/)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.out_dir, "metrics.json")


@dataclass
class Callbacks:
    """The job's own callbacks that its result reads back; ``all`` is every callback given to Lightning."""

    peak: PeakMemory
    preemption: PreemptionCallback
    bad_samples: Optional[BadSampleCounter]
    nan_guard: Optional[NaNGuard]
    monitor: Optional[SystemMonitor]
    all: List[pl.Callback]

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
