"""Experiment trackers: the ``logger`` group's Lightning loggers, and what the product puts in them.

Teams keep their runs in a tracker (MLflow, W&B) or in plain files (TensorBoard, CSV). Each entry of
``cfg.logger`` (``configs/logger/*.yaml``, several at once allowed) is a Lightning logger built with
Hydra's ``instantiate``, so anything the logger accepts can be set from the command line
(``logger.mlflow.tags.team=vision``) and a team can add its own with a ``_target_``. This package adds
what only the product knows, leaving what the user set alone, one module per concern:

- **where and which run** (``loggers``): files in the run dir; the tracker run's id kept in
  ``<run dir>/trackers.json``, so a resumed job (``ckpt_path=last``, a requeued preemption) continues the
  same tracker run instead of opening a new one per attempt; so does a job Slurm requeued before its
  first checkpoint, which trains from epoch 0 again (the run is tagged as started over, and the CSV file
  starts again, its earlier rows set aside);
- **a sweep's grouping** (``sweep_group``): at the sweep's start (``sweep_start``, from ``trainer.sweep``)
  an MLflow parent run and a W&B group are recorded in ``<sweep dir>/trackers.json``; each job is a
  nested run / group member, and ``sweep_end`` attaches the A/B report (md, csv, png) to the parent run /
  group;
- **what is logged** (``record``): ``log_params`` (the resolved config under the same flat names as
  metrics.json's ``flags``), the per-epoch figures (``EpochTimer``, through ``log_epoch_metrics``: against
  the epoch, in W&B too) and system readings (``SystemMonitor``) to every logger, and at the end
  (``finish``) the doctor's verdict as a tag and metrics.json, ``.hydra/config.yaml`` and the profile
  summary as artifacts;
- **credentials never leave the machine** through a tracker (``redaction``: ``redact``): masked as
  ``***`` in everything a tracker gets; the run dir's own files keep the values.

Only rank 0 talks to a tracker (Lightning's loggers are rank-zero-only; ``finish`` checks the rank too).
A missing tracker package or an unreachable tracking server is one paragraph before training starts.

The rest of the trainer calls these through the package (``tracking.build``, ``tracking.finish``, ...):
``__all__`` is what it uses. Inside the package, each module imports a name from the module that defines
it (a test that patches a name patches it there, where it is looked up).

May use: ``launch``, ``console``, ``measure``, ``config`` and the base modules; never torch or the
training code (``run``, ``callbacks``, ``switches``, ``models``, ``data``: a contract in pyproject.toml,
which allows ``csv_logger`` its Lightning base class).
"""

from trainer.tracking.loggers import NO_SERVER, PACKAGES, STATE, build, unreachable_message
from trainer.tracking.record import (
    ARTIFACTS,
    EPOCH_STEP,
    finish,
    flatten,
    flush,
    log_epoch_metrics,
    log_metrics,
    log_params,
    params_of,
)
from trainer.tracking.redaction import REDACTED, looks_secret, redact, redact_text
from trainer.tracking.sweep_group import REPORT_FILES, sweep_end, sweep_start

__all__ = [
    # building the loggers
    "STATE",
    "PACKAGES",
    "NO_SERVER",
    "build",
    "unreachable_message",
    # what is logged
    "ARTIFACTS",
    "EPOCH_STEP",
    "params_of",
    "flatten",
    "log_params",
    "log_metrics",
    "log_epoch_metrics",
    "flush",
    "finish",
    # credentials masked
    "REDACTED",
    "looks_secret",
    "redact",
    "redact_text",
    # a sweep's grouping
    "REPORT_FILES",
    "sweep_start",
    "sweep_end",
]
