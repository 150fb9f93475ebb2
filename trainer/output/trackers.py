"""Experiment trackers: the ``logger`` group's Lightning loggers, and what the product puts in them.

Teams keep their runs in a tracker (MLflow, W&B) or in plain files (TensorBoard, CSV). Each entry of
``cfg.logger`` (``configs/logger/*.yaml``, several at once allowed) is a Lightning logger built with
Hydra's ``instantiate``, so anything the logger accepts can be set from the command line
(``logger.mlflow.tags.team=vision``) and a team can add its own with a ``_target_``. This module adds
what only the product knows, leaving what the user set alone:

- **where and which run**: files in the run dir; the tracker run's id kept in ``<run dir>/trackers.json``,
  so a resumed job (``ckpt_path=last``, a requeued preemption) continues the same tracker run instead
  of opening a new one per attempt; so does a job Slurm requeued before its first checkpoint, which
  trains from epoch 0 again (the run is tagged as started over, and the CSV file starts again, its
  earlier rows set aside);
- **a sweep's grouping**: at the sweep's start (``sweep_start``, from ``trainer.sweep``) an MLflow parent
  run and a W&B group are recorded in ``<sweep dir>/trackers.json``; each job is a nested run / group
  member, and ``sweep_end`` attaches the A/B report (md, csv, png) to the parent run / group;
- **what is logged**: ``log_params`` (the resolved config under the same flat names as metrics.json's
  ``flags``), the per-epoch figures (``EpochTimer``, through ``log_epoch_metrics``: against the epoch,
  in W&B too) and system readings (``SystemMonitor``) to every logger, and at the end (``finish``) the
  doctor's verdict as a tag and metrics.json, ``.hydra/config.yaml`` and the profile summary as artifacts.

**Credentials never leave the machine** through a tracker (``redact``): a config may hold them
(``data.storage_options`` for fsspec, a tracking URI with ``user:pass@``, the command line that set
them). Masked as ``***`` in everything a tracker gets (params, run names, the uploaded files, W&B's
record of the command line; the CSV and TensorBoard loggers' params too): the value of every key whose
name says credential (a word ``secret``, ``password``, ``passwd``, ``passphrase``, ``token``,
``credential(s)``, ``auth``, ``authorization``, ``cookie``, ``signature``; a last word ``key``, as in
``key``, ``api_key``, ``aws_secret_access_key``, ``account_key``; ``..._key_id``; ``connection_string``),
at any depth (``data.storage_options.*``, ``logger.*``), also as ``key=value`` in an override or a
query string; and the userinfo of every URL (``https://***@host``). The run dir's own ``metrics.json``
and ``.hydra/config.yaml`` keep the values (the user's files, on the user's machine): the trackers get
redacted copies.

Only rank 0 talks to a tracker (Lightning's loggers are rank-zero-only; ``finish`` checks the rank too).
A missing tracker package or an unreachable tracking server is one paragraph before training starts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import weakref
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

from omegaconf import OmegaConf

from trainer.errors import ConfigError
from trainer.measure import metrics as metrics_mod
from trainer.rank import global_rank

log = logging.getLogger(__name__)

STATE = "trackers.json"  # in a run dir: its tracker runs; in a sweep dir: the sweep's parent run and group
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}  # the trackers whose package is an optional extra
# the run's files a tracker keeps beside its numbers (those that exist when the job ends)
ARTIFACTS = ("metrics.json", ".hydra/config.yaml", "profiler/summary.html", "profiler/breakdown.png")
REPORT_FILES = ("ab_report.md", "ab_report.csv", "ab_report.png")
_STATUS = {"ok": "FINISHED", "failed": "FAILED"}
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


# ---- building the loggers


def build(cfg, out_dir: str, overrides: List[str], resuming: bool) -> List[Any]:
    """The job's Lightning loggers, one per ``cfg.logger`` entry (an entry set to null is off).

    ``resuming``: from a checkpoint (the tracker runs in trackers.json go on). A job Slurm requeued
    before its first checkpoint starts over in its dir (``slurm.resume_if_requeued``) and continues its
    tracker runs too: one run per job, not per attempt.
    """
    from hydra.utils import instantiate

    from trainer.launch.slurm import restart_count

    entries = OmegaConf.to_container(cfg.get("logger") or {}, resolve=True)
    restart = restart_count()
    started_over = restart if restart and not resuming else 0  # the Slurm restart that trains from epoch 0 again
    previous = _read(os.path.join(out_dir, STATE)) if resuming or restart else {}
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
            logger = _instantiate(instantiate, name, entry, extra)
            if started_over and _kind(entry) == "csv":
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
            kind = _kind(_target_of(logger))
            if kind == "mlflow":
                with _fail_fast_mlflow():
                    logger.experiment.set_terminated(logger.run_id, "FAILED")
            elif kind == "wandb":
                logger.experiment.finish(exit_code=1)
        except Exception as e:
            log.warning("%s: could not close its run: %s", type(logger).__name__, metrics_mod.one_line(e))


def _product_defaults(name, entry, cfg, out_dir, job_name, previous, sweep) -> Dict[str, Any]:
    """What the product sets on a known logger, for each argument the user left unset (null or absent)."""
    kind = _kind(entry)
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


def _kind(entry: Dict[str, Any]) -> str:
    """Which known tracker a logger config builds ('' for a logger the product does not know)."""
    target = str(entry.get("_target_", "")).lower()
    for kind in ("tensorboard", "csv", "mlflow", "wandb"):
        if kind in target.rsplit(".", 1)[-1].lower():
            return kind
    return ""


def _instantiate(instantiate, name: str, entry: Dict[str, Any], extra: Dict[str, Any]):
    from hydra.errors import InstantiationException

    kind = _kind(entry)
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
    kind = _kind({"_target_": type(logger).__module__ + "." + type(logger).__name__})
    if kind == "mlflow":
        uri = logger._tracking_uri
        # MLflow prints the run's link on every status change (Lightning's and ours): finish() logs it once
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        with _fail_fast_mlflow():
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
            with _redacted_argv():
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
def _fail_fast_mlflow() -> Iterator[None]:
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


# ---- what is logged


def params_of(cfg, requested: Dict[str, Any]) -> Dict[str, Any]:
    """The resolved config as flat dotted names (``amp``, ``data.batch_size``: metrics.json's flag
    names), and ``requested.<flag>`` where the run settled a flag to another value (batch_size=auto)."""
    container = OmegaConf.to_container(cfg, resolve=True)
    container.pop("logger", None)  # the trackers' own settings are not the run's parameters
    params = _flatten(container)
    for key, value in requested.items():
        if params.get(key) != value:
            params[f"requested.{key}"] = value
    return params


def _flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def log_params(loggers: List[Any], params: Dict[str, Any]) -> None:
    """Every logger gets the params, credentials masked (``redact``); MLflow only those a resumed run
    does not hold yet (its params cannot change, and a resume differs in ``ckpt_path``)."""
    params = redact(params)
    for logger in loggers:
        if _kind(_target_of(logger)) == "mlflow" and global_rank() == 0:
            held = logger.experiment.get_run(logger.run_id).data.params
            changed = sorted(k for k, v in params.items() if k in held and held[k] != str(v)[:250])
            if changed:
                log.info("mlflow keeps this run's first values of %s (a resume may not change params)", changed)
            logger.log_hyperparams({k: v for k, v in params.items() if k not in held})
        else:
            logger.log_hyperparams(params)


def _target_of(logger) -> Dict[str, str]:
    return {"_target_": type(logger).__module__ + "." + type(logger).__name__}


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
        if _kind(_target_of(logger)) == "wandb":
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
    kind = _kind(_target_of(logger))
    if kind == "mlflow":
        client, run_id = logger.experiment, logger.run_id
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
        _mlflow_artifacts(client, run_id, files, out_dir)
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
        _wandb_files(run, files, out_dir)
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


def _mlflow_artifacts(client, run_id: str, files: List[str], base: str) -> None:
    """The files as artifacts, at their paths relative to ``base``: redacted copies, uploaded from a temp dir."""
    with tempfile.TemporaryDirectory(prefix="trainer-upload-") as dest:
        for path, upload in zip(files, _uploads(files, base, dest)):
            client.log_artifact(run_id, upload, artifact_path=_artifact_dir(path, base))


def _wandb_files(run, files: List[str], base: str) -> None:
    """The files in the W&B run, at their paths relative to ``base``: redacted copies written into the
    run's own files dir (W&B uploads them from there, at the end or with ``wandb sync``); an image is
    linked as before."""
    for path, upload in zip(files, _uploads(files, base, run.dir)):
        run.save(upload, base_path=run.dir if upload != path else base, policy="now")


# ---- what leaves the machine: credentials masked


REDACTED = "***"
# words of a key's name that say it holds a credential (anywhere in the name: ``client_secret``,
# ``aws_session_token``, ``credentials.user``), and those that do as the name's last word (``key``,
# ``api_key``, ``account_key``; not ``key_dim``)
_SECRET_WORDS = frozenset(
    "secret secrets password passwords passwd passphrase token credential credentials creds auth authorization "
    "bearer cookie signature sig".split()
)
_KEY_WORDS = frozenset("key keys apikey secretkey accesskey privatekey accountkey keyid".split())
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@?#'\"<>]+@")
_OVERRIDE = re.compile(r"([+~]{0,2}[A-Za-z_][\w.\-/]*)=(.*)", re.DOTALL)
_ASSIGNMENT = re.compile(r"([A-Za-z_][\w.\-/]*)=('[^']*'|\"[^\"]*\"|[^\s&'\"<>]*)")


def looks_secret(name: str) -> bool:
    """Whether a key's name (a dotted path too) says that its value is a credential."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name)).lower()) if w]
    if not words:
        return False
    return (
        bool(_SECRET_WORDS.intersection(words))
        or words[-1] in _KEY_WORDS
        or words[-2:]
        in (
            ["key", "id"],
            ["connection", "string"],
        )
    )


def _mask(value: Any) -> Any:
    """A credential's value: every leaf masked (None, booleans and empty strings say nothing and stay)."""
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(v) for v in value]
    return value if value is None or isinstance(value, bool) or value == "" else REDACTED


def redact(value: Any) -> Any:
    """A config, a metrics.json or a params dict with its credentials masked: the values under keys that
    look like one, ``user:pass@`` in URLs, and ``key=value`` (overrides, query strings) with such a key."""
    if isinstance(value, dict):
        return {k: _mask(v) if looks_secret(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """Free text (a URL, an override, a page): URL userinfo and ``key=value`` with a credential's key masked."""
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    whole = _OVERRIDE.fullmatch(text)
    if whole and looks_secret(whole.group(1)):  # one override: everything after its '=' is the value
        return f"{whole.group(1)}={REDACTED}"
    return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}" if looks_secret(m.group(1)) else m.group(0), text)


def _redacted_text_of(path: str) -> Optional[str]:
    """The file's text with its credentials masked (JSON and YAML by structure); None for a binary file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        return None  # an image: nothing of the config in it
    try:
        if path.endswith(".json"):
            return json.dumps(redact(json.loads(text)), indent=2) + "\n"
        if path.endswith((".yaml", ".yml")):
            import yaml

            return yaml.safe_dump(redact(yaml.safe_load(text)), sort_keys=False, allow_unicode=True)
    except ValueError:  # yaml's errors are ValueErrors too
        pass
    return redact_text(text)


def _uploads(files: List[str], base: str, dest: str) -> List[str]:
    """What a tracker gets of ``files``: a redacted copy in ``dest`` (same path relative to it as to
    ``base``) of each text file, the file itself for an image. The files in ``base`` stay as they are."""
    out = []
    for path in files:
        text = _redacted_text_of(path)
        if text is None:
            out.append(path)
            continue
        copy = os.path.join(dest, os.path.relpath(path, base))
        metrics_mod.atomic_write_text(copy, text)  # replaces a link there, never writes through it
        out.append(copy)
    return out


@contextmanager
def _redacted_argv() -> Iterator[None]:
    """W&B records the command line in the run's metadata: it reads a copy with credentials masked."""
    saved = list(sys.argv)
    sys.argv[1:] = [redact_text(a) for a in saved[1:]]
    try:
        yield
    finally:
        sys.argv[:] = saved


# ---- a sweep's grouping


def sweep_start(config, sweep_dir: str) -> None:
    """The sweep's MLflow parent run and W&B group, recorded for its jobs (resumed when the sweep
    is finished by the same command). One paragraph, exit before any job, if the server is down."""
    entries = OmegaConf.to_container(config.get("logger") or {}, resolve=True)
    state = _read(os.path.join(sweep_dir, STATE))
    for name, entry in entries.items():
        kind = _kind(entry) if isinstance(entry, dict) else ""
        if kind == "mlflow" and not state.get(name):
            state[name] = _mlflow_parent(name, entry, config, sweep_dir)
        elif kind == "wandb" and not state.get(name):
            state[name] = {"group": entry.get("group") or _group_name(sweep_dir), "project": entry.get("project")}
    if state:
        os.makedirs(sweep_dir, exist_ok=True)
        metrics_mod.atomic_write_text(os.path.join(sweep_dir, STATE), json.dumps(state, indent=2) + "\n")


def _mlflow_parent(name: str, entry: Dict[str, Any], config, sweep_dir: str) -> Dict[str, Any]:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError(
            f"logger={name} needs the mlflow package, which is not installed in this environment. Install it with "
            "pip install 'trainer-switchboard[mlflow]' (or pip install mlflow-skinny), or choose another logger."
        ) from None
    uri = entry.get("tracking_uri")
    if not uri:
        raise ConfigError(NO_SERVER.format(name=name))
    experiment_name = entry.get("experiment_name") or config.get("recipe") or "train"
    with _fail_fast_mlflow():
        try:
            client = MlflowClient(tracking_uri=uri)
            found = client.get_experiment_by_name(experiment_name)
            experiment_id = found.experiment_id if found else client.create_experiment(experiment_name)
            run = client.create_run(
                experiment_id,
                run_name=f"sweep {_group_name(sweep_dir)}",
                tags={"trainer.sweep_dir": os.path.abspath(sweep_dir), **(entry.get("tags") or {})},
            )
        except Exception as e:
            raise ConfigError(unreachable_message(name, uri, e)) from None
    return {
        "tracking_uri": uri,
        "experiment_id": experiment_id,
        "experiment_name": experiment_name,
        "parent_run_id": run.info.run_id,
    }


def sweep_end(sweep_dir: str, finished: bool = True) -> None:
    """Attach the A/B report to the sweep's parent run and group (the same table the sweep dir holds)."""
    state = _read(os.path.join(sweep_dir, STATE))
    files = [os.path.join(sweep_dir, f) for f in REPORT_FILES if os.path.isfile(os.path.join(sweep_dir, f))]
    for name, entry in state.items():
        try:
            if entry.get("parent_run_id"):
                from mlflow.tracking import MlflowClient

                client = MlflowClient(tracking_uri=entry["tracking_uri"])
                _mlflow_artifacts(client, entry["parent_run_id"], files, sweep_dir)
                if finished:
                    client.set_terminated(entry["parent_run_id"], "FINISHED")
            elif entry.get("group"):
                _wandb_report_run(entry, files, sweep_dir)
        except Exception as e:
            log.warning("logger=%s: could not attach the A/B report: %s", name, metrics_mod.one_line(e))


def _wandb_report_run(entry: Dict[str, Any], files: List[str], sweep_dir: str) -> None:
    """W&B has no files on a group: the report is a run of the group (job_type ab_report) holding the
    files and the table."""
    import csv

    import wandb

    with _redacted_argv():
        run = wandb.init(
            project=entry.get("project"),
            group=entry["group"],
            job_type="ab_report",
            name="ab_report",
            dir=sweep_dir,
            reinit="create_new",
        )
    _wandb_files(run, files, sweep_dir)
    for path in files:
        if path.endswith(".csv"):
            with open(path, newline="") as f:
                rows = [[redact_text(cell) for cell in row] for row in csv.reader(f)]
            if rows:
                run.log({"ab_report": wandb.Table(columns=rows[0], data=rows[1:])})
    run.finish()


def _group_name(sweep_dir: str) -> str:
    """A sweep's name in the trackers: its dir, as the user named it (``multirun-2026-11-23-10-00-00``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.normpath(sweep_dir)).strip("-")[-120:]


def _sweep_of(out_dir: str) -> tuple:
    """(the sweep's trackers.json, the keys it varies) when this job is one of a sweep's (its parent
    dir holds the sweep's plan), else ({}, [])."""
    from trainer.output.console import swept_keys
    from trainer.paths import SWEEP_PLAN

    parent = os.path.dirname(os.path.abspath(out_dir))
    plan = _read(os.path.join(parent, SWEEP_PLAN))
    if not plan:
        return {}, []
    return _read(os.path.join(parent, STATE)), swept_keys(plan.get("overrides") or [])


def _read(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
