"""What the trackers get of a job: its params, its figures, and at the end its verdict and files.

Each function here goes to every logger of the run (Lightning's own ``trainer.logger`` is the first
only), from rank 0 only: ``log_params`` (the resolved config under the same flat names as
metrics.json's ``flags``, credentials masked), the per-epoch figures (``EpochTimer``, through
``log_epoch_metrics``: against the epoch, in W&B too) and system readings (``SystemMonitor``, through
``log_metrics``), each epoch's rows written (``flush``), and at the end (``finish``) the doctor's
verdict as a tag and metrics.json, ``.hydra/config.yaml`` and the profile summary as artifacts (redacted
copies), the tracker run closed with the job's status. A tracker that fails at the end costs a warning,
never the result.
"""

from __future__ import annotations

import logging
import os
import tempfile
import weakref
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from trainer.measure import metrics as metrics_mod
from trainer.rank import global_rank
from trainer.tracking.loggers import kind_of, target_of
from trainer.tracking.redaction import redact, redact_text, uploads_of

log = logging.getLogger("trainer.tracking")  # the package's one logger, whichever of its modules logs

# the run's files a tracker keeps beside its numbers (those that exist when the job ends)
ARTIFACTS = ("metrics.json", ".hydra/config.yaml", "profiler/summary.html", "profiler/breakdown.png")
_STATUS = {"ok": "FINISHED", "failed": "FAILED"}


def params_of(cfg, requested: Dict[str, Any]) -> Dict[str, Any]:
    """The resolved config as flat dotted names (``amp``, ``data.batch_size``: metrics.json's flag
    names), and ``requested.<flag>`` where the run settled a flag to another value (batch_size=auto)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("logger", None)  # the trackers' own settings are not the run's parameters
    params = flatten(container)
    for key, value in requested.items():
        if params.get(key) != value:
            params[f"requested.{key}"] = value
    return params


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """A nested config as one level of dotted keys (``optim.lr``): what the trackers take as params."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def log_params(loggers: List[Any], params: Dict[str, Any]) -> None:
    """Every logger gets the params, credentials masked (``redact``); MLflow only those a resumed run
    does not hold yet (its params cannot change, and a resume differs in ``ckpt_path``)."""
    params = redact(params)
    for logger in loggers:
        if kind_of(target_of(logger)) == "mlflow" and global_rank() == 0:
            held = logger.experiment.get_run(logger.run_id).data.params
            changed = sorted(k for k, v in params.items() if k in held and held[k] != str(v)[:250])
            if changed:
                log.info("mlflow keeps this run's first values of %s (a resume may not change params)", changed)
            logger.log_hyperparams({k: v for k, v in params.items() if k not in held})
        else:
            logger.log_hyperparams(params)


def log_metrics(trainer, metrics: Dict[str, float], step: int) -> None:
    """Rank 0: the scalars to every logger of the run (Lightning's ``trainer.logger`` is the first only)."""
    if trainer is None or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def log_epoch_metrics(trainer, metrics: Dict[str, float], epoch: int) -> None:
    """Rank 0: one epoch's figures to every logger, plotted against the epoch.

    The files, TensorBoard and MLflow take the epoch as the step. W&B's x axis for Lightning's metrics
    is ``trainer/global_step`` (WandbLogger logs ``step=`` under that key, and defines it as the x axis
    of every metric): passing the epoch there would put the epoch figures at global steps 0, 1, 2, ...
    So W&B gets the epoch as its own column, ``epoch``, defined as these figures' step metric."""
    if trainer is None or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if kind_of(target_of(logger)) == "wandb":
            _wandb_log_epoch(logger, metrics, epoch)
        else:
            logger.log_metrics(metrics, step=epoch)


EPOCH_STEP = "epoch"  # W&B's step metric of the epoch figures (Lightning logs it with its own metrics too)
_wandb_defined: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()  # per WandbLogger


def _wandb_log_epoch(logger, metrics: Dict[str, float], epoch: int) -> None:
    # one definition per name, not a glob: W&B matches a name against its globs in no set order, so
    # "perf/*" could lose to WandbLogger's "*". ``overwrite``: Lightning's rows carry "epoch" before the
    # first epoch figures, and W&B has by then filed it under "*" (x axis trainer/global_step, synced into
    # every row that has it); merged, that definition would pull trainer/global_step into these rows
    prefix, join = getattr(logger, "_prefix", ""), getattr(logger, "LOGGER_JOIN_CHAR", "-")  # WandbLogger(prefix=)
    prefixed = (lambda key: f"{prefix}{join}{key}") if prefix else (lambda key: key)
    defined = _wandb_defined.setdefault(logger, set())
    run = logger.experiment
    for key in [EPOCH_STEP, *metrics]:
        if key not in defined:
            step = None if key == EPOCH_STEP else prefixed(EPOCH_STEP)
            run.define_metric(prefixed(key), step_metric=step, overwrite=True)
            defined.add(key)
    logger.log_metrics({**metrics, EPOCH_STEP: epoch})  # no step: it would go under trainer/global_step


def flush(trainer) -> None:
    """Rank 0, at each epoch end: every logger writes what it holds (the CSV file otherwise waits for
    100 steps, and a killed run would lose its last epochs' rows while metrics.json keeps them)."""
    if trainer is None or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.save()


def finish(loggers: List[Any], out_dir: str, result: Dict[str, Any]) -> None:
    """Rank 0, after metrics.json is written: the verdict as a tag, the run's files as artifacts, the
    tracker run closed with the job's status. A tracker that fails here costs a warning, never the result."""
    if global_rank() != 0:
        return
    diagnosis = result.get("diagnosis") or {}
    tags = {"trainer.status": result.get("status") or "", "trainer.recipe": str(result.get("recipe"))}
    if diagnosis:
        tags.update(
            {"doctor.verdict": diagnosis.get("verdict", ""), "doctor.bottleneck": diagnosis.get("bottleneck", "")}
        )
    files = [os.path.join(out_dir, f) for f in ARTIFACTS if os.path.isfile(os.path.join(out_dir, f))]
    for logger in loggers:
        try:
            _finish_one(logger, tags, files, out_dir, result.get("status") or "failed")
        except Exception as e:
            log.warning(
                "%s: could not record the result in the tracker: %s", type(logger).__name__, metrics_mod.one_line(e)
            )


def _finish_one(logger, tags: Dict[str, str], files: List[str], out_dir: str, status: str) -> None:
    kind = kind_of(target_of(logger))
    if kind == "mlflow":
        client, run_id = logger.experiment, logger.run_id
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
        mlflow_artifacts(client, run_id, files, out_dir)
        client.set_terminated(run_id, _STATUS.get(status, "FAILED"))
        uri = logger._tracking_uri
        if uri.startswith("http"):
            # redacted: a W&B run of the same job uploads what the console shows
            link = f"{uri.rstrip('/')}/#/experiments/{logger.experiment_id}/runs/{run_id}"
            log.info("mlflow run: %s", redact_text(link))
    elif kind == "wandb":
        run = logger.experiment
        run.summary.update({k.replace(".", "_"): v for k, v in tags.items()})
        if tags.get("doctor.bottleneck"):
            run.tags = tuple(run.tags or ()) + (f"doctor:{tags['doctor.bottleneck']}",)
        wandb_files(run, files, out_dir)
        run.finish(exit_code=0 if status == "ok" else 1)
    elif kind == "tensorboard":
        if tags.get("doctor.verdict"):
            logger.experiment.add_text("doctor/verdict", tags["doctor.verdict"])
        logger.experiment.flush()
    else:
        logger.save()


def _artifact_dir(path: str, out_dir: str) -> Optional[str]:
    rel = os.path.dirname(os.path.relpath(path, out_dir))
    return rel or None


def mlflow_artifacts(client, run_id: str, files: List[str], base: str) -> None:
    """The files as artifacts, at their paths relative to ``base``: redacted copies, uploaded from a temp dir."""
    with tempfile.TemporaryDirectory(prefix="trainer-upload-") as dest:
        for path, upload in zip(files, uploads_of(files, base, dest)):
            client.log_artifact(run_id, upload, artifact_path=_artifact_dir(path, base))


def wandb_files(run, files: List[str], base: str) -> None:
    """The files in the W&B run, at their paths relative to ``base``: redacted copies written into the
    run's own files dir (W&B uploads them from there, at the end or with ``wandb sync``); an image is
    linked as before."""
    for path, upload in zip(files, uploads_of(files, base, run.dir)):
        run.save(upload, base_path=run.dir if upload != path else base, policy="now")
