"""Building the job's loggers: one Lightning logger per ``cfg.logger`` entry, and the tracker run it opens.

Each entry is built with Hydra's ``instantiate``; this module adds what only the product knows, for
each argument the user left unset: where (files in the run dir) and which run. The tracker run's id is
kept in ``<run dir>/trackers.json``, so a resumed job (``ckpt_path=last``, a requeued preemption)
continues the same tracker run instead of opening a new one per attempt; so does a job Slurm requeued
before its first checkpoint, which trains from epoch 0 again (the run is tagged as started over, and the
CSV file starts again, its earlier rows set aside). A job of a sweep reads the sweep's trackers.json
(``sweep_group``) to be a nested run / group member.

The run is opened here, before training, so that a missing tracker package or an unreachable tracking
server is one paragraph before anything is trained; the sweep's parent run shares that check
(``NO_SERVER``, ``unreachable_message``, ``fail_fast_mlflow``).
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from trainer.console import swept_keys
from trainer.errors import ConfigError
from trainer.measure import metrics as metrics_mod
from trainer.paths import SWEEP_PLAN
from trainer.rank import global_rank, restart_count
from trainer.tracking.redaction import redact_text, redacted_argv

log = logging.getLogger("trainer.tracking")  # the package's one logger, whichever of its modules logs

STATE = "trackers.json"  # in a run dir: its tracker runs; in a sweep dir: the sweep's parent run and group
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}  # the trackers whose package is an optional extra
_STARTED_OVER = (  # MLflow's tag on a run whose job trained again from epoch 0
    "Slurm restart {restart} came before any checkpoint: trained again from epoch 0; each step's last value is this "
    "training's"
)
# MLflow 3 refuses the ./mlruns file store unless told otherwise, and its SQLite store needs the full
# mlflow package: a tracking server is the one setup that works with the client alone
NO_SERVER = (
    "logger={name} needs a tracking server: set MLFLOW_TRACKING_URI (e.g. http://127.0.0.1:5000, started with "
    "mlflow server --host 127.0.0.1 --port 5000) or logger.{name}.tracking_uri. With the full mlflow package "
    "installed, a local store works too: logger.{name}.tracking_uri=sqlite:///mlflow.db. Nothing was trained."
)


def build(cfg, out_dir: str, overrides: List[str], resuming: bool) -> List[Any]:
    """The job's Lightning loggers, one per ``cfg.logger`` entry (an entry set to null is off).

    ``resuming``: from a checkpoint (the tracker runs in trackers.json go on). A job Slurm requeued
    before its first checkpoint starts over in its dir (``slurm.resume_if_requeued``) and continues its
    tracker runs too: one run per job, not per attempt.
    """
    entries = logger_entries(cfg)
    restart = restart_count()
    started_over = restart if restart and not resuming else 0  # the Slurm restart that trains from epoch 0 again
    previous = read_state(os.path.join(out_dir, STATE)) if resuming or restart else {}
    sweep, swept = _sweep_of(out_dir)
    shown = [redact_text(o) for o in overrides]  # the run's name in the tracker
    job_name = ",".join(o for o in shown if o.split("=", 1)[0].lstrip("+~") in swept) if swept else ""
    job_name = job_name or ",".join(shown) or cfg.get("recipe") or "train"
    loggers, state = [], {}
    try:
        for name, entry in entries.items():
            if entry is None:
                continue
            if not isinstance(entry, dict) or "_target_" not in entry:
                raise ConfigError(
                    f"logger.{name} must be a logger config with a _target_ (see configs/logger/); got {entry!r}. "
                    "Choose with logger=tensorboard|csv|mlflow|wandb|many, or several: logger=[csv,mlflow]."
                )
            extra = _product_defaults(
                name, entry, cfg, out_dir, job_name, previous.get(name) or {}, sweep.get(name) or {}
            )
            logger = _instantiate(name, entry, extra)
            if started_over and kind_of(entry) == "csv":
                _set_aside_csv(logger, started_over)
            state[name] = _open(name, logger, resumed=bool(previous.get(name)), started_over=started_over)
            loggers.append(logger)
    except BaseException:
        _abandon(loggers)  # a later entry failed: the runs opened before it do not stay RUNNING
        raise
    if global_rank() == 0 and any(state.values()):
        # a resume with fewer trackers keeps the others' run ids for a later resume with them
        merged = {**previous, **{k: v for k, v in state.items() if v}}
        metrics_mod.atomic_write_text(os.path.join(out_dir, STATE), json.dumps(merged, indent=2) + "\n")
    return loggers


def _abandon(loggers: List[Any]) -> None:
    """Close the tracker runs a failed build had opened, as failed (best effort: the build's error is the story)."""
    for logger in loggers:
        try:
            kind = kind_of(target_of(logger))
            if kind == "mlflow":
                with fail_fast_mlflow():
                    logger.experiment.set_terminated(logger.run_id, "FAILED")
            elif kind == "wandb":
                logger.experiment.finish(exit_code=1)
        except Exception as e:
            log.warning("%s: could not close its run: %s", type(logger).__name__, metrics_mod.one_line(e))


def _product_defaults(name, entry, cfg, out_dir, job_name, previous, sweep) -> Dict[str, Any]:
    """What the product sets on a known logger, for each argument the user left unset (null or absent)."""
    kind = kind_of(entry)
    extra: Dict[str, Any] = {}
    if kind in ("tensorboard", "csv"):
        extra = {"save_dir": out_dir, "name": "", "version": ""}
    elif kind == "mlflow":
        if not entry.get("tracking_uri") and not sweep.get("tracking_uri"):
            raise ConfigError(NO_SERVER.format(name=name))
        extra = {
            "experiment_name": sweep.get("experiment_name") or cfg.get("recipe") or "train",
            "run_name": job_name,
            "tags": {"trainer.run_dir": os.path.abspath(out_dir), **(entry.get("tags") or {})},
        }
        if sweep.get("parent_run_id"):
            extra["tags"]["mlflow.parentRunId"] = sweep["parent_run_id"]
        if previous.get("run_id"):
            extra["run_id"] = previous["run_id"]
        if sweep.get("tracking_uri") and not entry.get("tracking_uri"):
            extra["tracking_uri"] = sweep["tracking_uri"]
    elif kind == "wandb":
        extra = {
            "save_dir": out_dir,
            "name": job_name,
            "resume": "allow",
            "job_type": "train",
        }
        if previous.get("id"):
            extra["id"] = previous["id"]  # W&B names a new run itself; a resume continues the one it named
        if sweep.get("group"):
            extra["group"] = sweep["group"]
    # the user's value wins; tags merge (above), and a resume's run id always applies
    return {k: v for k, v in extra.items() if entry.get(k) is None or k in ("tags", "run_id", "id")}


def logger_entries(cfg) -> Dict[str, Any]:
    """The ``logger`` group's entries as plain dicts; none for ``logger=[]`` (an empty node) or ``~logger`` (no key)."""
    chosen = cfg.get("logger")
    return OmegaConf.to_container(chosen, resolve=True) if chosen else {}


def kind_of(entry: Dict[str, Any]) -> str:
    """Which known tracker a logger config builds ('' for a logger the product does not know)."""
    target = str(entry.get("_target_", "")).lower()
    for kind in ("tensorboard", "csv", "mlflow", "wandb"):
        if kind in target.rsplit(".", 1)[-1].lower():
            return kind
    return ""


def _instantiate(name: str, entry: Dict[str, Any], extra: Dict[str, Any]):
    kind = kind_of(entry)
    try:
        return instantiate(entry, **extra)
    except (InstantiationException, ImportError, TypeError, ValueError) as e:
        cause = e.__cause__ or e
        if isinstance(cause, ImportError) or "ModuleNotFoundError" in str(e) or "is not installed" in str(e):
            package = PACKAGES.get(kind, kind or name)
            raise ConfigError(
                f"logger={name} needs the {package} package, which is not installed in this environment. "
                f"Install it with pip install 'trainer-switchboard[{package}]' (or pip install "
                f"{'mlflow-skinny' if package == 'mlflow' else package}), or choose another logger "
                "(logger=tensorboard, csv, mlflow, wandb; several: logger=[csv,mlflow])."
            ) from None
        raise ConfigError(
            f"logger.{name} could not be built: {metrics_mod.one_line(cause)}. "
            f"Check the keys under logger.{name} (configs/logger/{name}.yaml lists the usual ones)."
        ) from None


def _set_aside_csv(logger, restart: int) -> None:
    """A requeued job starting over trains from epoch 0 again: its ``metrics.csv`` starts again with
    it (as metrics.json does), and the earlier attempts' rows are kept beside it as
    ``metrics.before-restart-<N>.csv`` (appended to, the file would hold two trainings' epochs under the
    same steps; Lightning's own CSV writer would delete them)."""
    directory = getattr(logger, "log_dir", None)
    path = os.path.join(directory, "metrics.csv") if directory else ""
    if global_rank() != 0 or not os.path.isfile(path):
        return
    stem, n = os.path.join(directory, f"metrics.before-restart-{restart}"), 1
    target = stem + ".csv"
    while os.path.exists(target):  # never over a file already there
        n += 1
        target = f"{stem}.{n}.csv"
    os.rename(path, target)
    log.warning(
        "requeued before a checkpoint: this attempt trains from epoch 0 again; %s starts again, the earlier "
        "rows are in %s",
        path,
        os.path.basename(target),
    )


def _open(name: str, logger, resumed: bool, started_over: int = 0) -> Dict[str, Any]:
    """Start the tracker run now (rank 0), so an unreachable server stops the job before training,
    and return what a resume needs to find it again. ``started_over``: the Slurm restart that continues
    the run while training from epoch 0 again (marked on the run)."""
    if global_rank() != 0:
        return {}
    kind = kind_of({"_target_": type(logger).__module__ + "." + type(logger).__name__})
    if kind == "mlflow":
        uri = logger._tracking_uri
        # MLflow prints the run's link on every status change (Lightning's and ours): finish() logs it once
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        with fail_fast_mlflow():
            try:
                client = logger.experiment
                run_id = logger.run_id
                if resumed:
                    client.update_run(run_id, status="RUNNING")  # a killed or preempted attempt left it KILLED
                if resumed and started_over:
                    client.set_tag(run_id, "trainer.started_over", _STARTED_OVER.format(restart=started_over))
            except Exception as e:
                raise ConfigError(unreachable_message(name, uri, e)) from None
        return {"run_id": run_id, "experiment_id": logger.experiment_id, "tracking_uri": uri}
    if kind == "wandb":
        try:
            with redacted_argv():
                run = logger.experiment
        except Exception as e:  # wandb's UsageError (no API key), CommError (no server) and the like
            raise ConfigError(
                f"logger={name}: W&B could not start a run ({metrics_mod.one_line(e)}). Log in (wandb login, or "
                "WANDB_API_KEY), or run offline with WANDB_MODE=offline (wandb sync uploads later), or choose another "
                "logger; nothing was trained."
            ) from None
        if resumed and started_over:
            run.tags = tuple(run.tags or ()) + (f"started-over:restart-{started_over}",)
        return {"id": run.id, "project": run.project, "dir": getattr(run, "dir", None)}
    return {}


def unreachable_message(name: str, uri: str, error: BaseException) -> str:
    return (
        f"logger={name}: the MLflow tracking server at {redact_text(str(uri))} did not answer "
        f"({metrics_mod.one_line(error)}). "
        "Start it (mlflow server --host 127.0.0.1 --port 5000 ...), or point MLFLOW_TRACKING_URI or "
        f"logger.{name}.tracking_uri at a reachable one; nothing was trained."
    )


@contextmanager
def fail_fast_mlflow() -> Iterator[None]:
    """MLflow retries an unreachable server for minutes by default; the start-up check asks once."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def target_of(logger) -> Dict[str, str]:
    return {"_target_": type(logger).__module__ + "." + type(logger).__name__}


def _sweep_of(out_dir: str) -> tuple:
    """(the sweep's trackers.json, the keys it varies) when this job is one of a sweep's (its parent
    dir holds the sweep's plan), else ({}, [])."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    plan = read_state(os.path.join(parent, SWEEP_PLAN))
    if not plan:
        return {}, []
    return read_state(os.path.join(parent, STATE)), swept_keys(plan.get("overrides") or [])


def read_state(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
