"""A sweep's grouping in the trackers: an MLflow parent run and a W&B group for its jobs, and its report.

At the sweep's start (``sweep_start``, from ``trainer.sweep``, before any job) the parent run and the
group are recorded in ``<sweep dir>/trackers.json``, so that each job (``loggers.build``) is a nested
run / group member, and a sweep finished by the same command goes on with them; an unreachable server
is one paragraph before any job. At its end, ``sweep_end`` attaches the A/B report (md, csv, png) to
the parent run / group. These run in the sweep's own process, once per sweep, not in its jobs.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from typing import Any, Dict, List

from trainer.errors import ConfigError
from trainer.measure import metrics as metrics_mod
from trainer.tracking.loggers import (
    NO_SERVER,
    STATE,
    fail_fast_mlflow,
    kind_of,
    logger_entries,
    read_state,
    unreachable_message,
)
from trainer.tracking.record import mlflow_artifacts, wandb_files
from trainer.tracking.redaction import redact_text, redacted_argv

log = logging.getLogger("trainer.tracking")  # the package's one logger, whichever of its modules logs

REPORT_FILES = ("ab_report.md", "ab_report.csv", "ab_report.png")


def sweep_start(config, sweep_dir: str) -> None:
    """The sweep's MLflow parent run and W&B group, recorded for its jobs (resumed when the sweep
    is finished by the same command). One paragraph, exit before any job, if the server is down."""
    entries = logger_entries(config)
    state = read_state(os.path.join(sweep_dir, STATE))
    for name, entry in entries.items():
        kind = kind_of(entry) if isinstance(entry, dict) else ""
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
    with fail_fast_mlflow():
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
    """Attach the A/B report to the sweep's parent run and group (the same table the sweep dir holds).

    ``finished=False``: a stopped sweep's report of what finished, on the MLflow parent run, which stays
    open for the command that finishes the sweep (its report then replaces this one). W&B gets only the
    finished sweep's: a report there is a run of its own in the group, and a second would stay beside it."""
    state = read_state(os.path.join(sweep_dir, STATE))
    files = [os.path.join(sweep_dir, f) for f in REPORT_FILES if os.path.isfile(os.path.join(sweep_dir, f))]
    for name, entry in state.items():
        try:
            if entry.get("parent_run_id"):
                from mlflow.tracking import MlflowClient  # lazy: optional ([mlflow] extra)

                client = MlflowClient(tracking_uri=entry["tracking_uri"])
                mlflow_artifacts(client, entry["parent_run_id"], files, sweep_dir)
                if finished:
                    client.set_terminated(entry["parent_run_id"], "FINISHED")
            elif entry.get("group") and finished:
                _wandb_report_run(entry, files, sweep_dir)
        except Exception as e:
            log.warning("logger=%s: could not attach the A/B report: %s", name, metrics_mod.one_line(e))


def _wandb_report_run(entry: Dict[str, Any], files: List[str], sweep_dir: str) -> None:
    """W&B has no files on a group: the report is a run of the group (job_type ab_report) holding the
    files and the table."""
    import wandb  # lazy: optional ([wandb] extra)

    with redacted_argv():
        run = wandb.init(
            project=entry.get("project"),
            group=entry["group"],
            job_type="ab_report",
            name="ab_report",
            dir=sweep_dir,
            reinit="create_new",
        )
    wandb_files(run, files, sweep_dir)
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
