"""The config: its schema, the checks of a config, and composing it.

``schema`` is every key of ``configs/train.yaml`` as Hydra structured configs (the sections in
``schema_sections`` and ``schema_data``), each key declared once with ``keys.key``; ``tables``
derives from those fields what the rest of the trainer reads (the keys, their allowed values and
ranges, metrics.json's flags, the Lightning Trainer's arguments, each key's help); ``checks``
checks the command line before Hydra composes it and the composed config before a run;
``compose`` is the one path from a command line's overrides to a job's config, with ``scale``
(the ``scale=`` preset over a recipe) and ``model_config`` (a retargeted ``model._target_``).

May use: the base modules only (``trainer.errors``, ``trainer.paths``, ``trainer.rank``); every
other package reads its config from here. Importing it loads no torch, Hydra or OmegaConf: the
functions that need Hydra or OmegaConf import them when called.

Below are the names used outside this package, each from the module that defines it; and the
sections' dataclasses, because a config pickled before they moved into ``schema_sections`` and
``schema_data`` (submitit's pickle of a Slurm job still in the queue) names them as ``trainer.config.X``.
"""

from trainer.config.checks import check_overrides, validate
from trainer.config.schema import GROUPS, TrainSchema
from trainer.config.schema_data import DataConfig
from trainer.config.schema_sections import (
    BatchFinderConfig,
    CheckpointConfig,
    DDPConfig,
    FSDPConfig,
    LossConfig,
    MonitorConfig,
    OptimConfig,
    ProfilerConfig,
    ProgressiveConfig,
    ReportConfig,
    RuntimeConfig,
    ScaleConfig,
    SchedConfig,
    TrainerConfig,
    TuneConfig,
)
from trainer.config.tables import (
    FLAG_KEYS,
    OPTIMIZATION_FLAGS,
    RECIPE_FLAGS,
    RUN_SETTINGS,
    SCHEMA_FIELDS,
    SCHEMA_KEYS,
    lightning_trainer_args,
)

__all__ = [
    "FLAG_KEYS",
    "GROUPS",
    "OPTIMIZATION_FLAGS",
    "RECIPE_FLAGS",
    "RUN_SETTINGS",
    "SCHEMA_FIELDS",
    "SCHEMA_KEYS",
    "TrainSchema",
    "check_overrides",
    "lightning_trainer_args",
    "validate",
    # the sections, for configs pickled by an earlier version (see above)
    "BatchFinderConfig",
    "CheckpointConfig",
    "DataConfig",
    "DDPConfig",
    "FSDPConfig",
    "LossConfig",
    "MonitorConfig",
    "OptimConfig",
    "ProfilerConfig",
    "ProgressiveConfig",
    "ReportConfig",
    "RuntimeConfig",
    "ScaleConfig",
    "SchedConfig",
    "TrainerConfig",
    "TuneConfig",
]
