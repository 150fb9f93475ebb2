"""Experiment trackers (the ``logger`` group): what a team reads in MLflow, W&B and CSV, read back from
the real thing: a live MLflow server on 127.0.0.1, W&B's offline run files, the CSV file."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, clean_env, read_metrics, run_cli

pytestmark = pytest.mark.xdist_group("trackers")  # one MLflow server for these tests

EPOCH_FIGURES = ("perf/epoch_time_s", "perf/samples_per_s", "perf/data_wait_fraction", "perf/transfer_fraction")


def _makefile_parallel_part() -> list:
    """The pytest options of ``make test``'s parallel part (the Makefile's command as written)."""
    import shlex

    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    (line,) = [line for line in recipe.splitlines() if "-m pytest" in line and "not whole_machine" in line]
    return shlex.split(line.split("-m pytest", 1)[1].split(";", 1)[0])


def test_the_tracker_tests_share_one_worker(request, tmp_path):
    """``make test`` starts this module's MLflow server once: its tests carry one xdist group, and the
    Makefile's parallel part schedules by group (``--dist loadgroup``). pytest 9.2 silently broke
    pytest-xdist 3.8's grouping (a node id can no longer be renamed to carry its group), so grouping
    itself is checked, however this suite is run: a module marked as this one runs under the
    Makefile's own ``-n``/``--dist``, and its tests say which worker ran them (two small pytest
    workers for a few seconds; nothing is timed). Under ``make test`` this test's own id shows it too."""
    options = _makefile_parallel_part()
    dist = [options[i + 1] for i, o in enumerate(options) if o == "--dist"] + [
        o.split("=", 1)[1] for o in options if o.startswith("--dist=")
    ]
    assert dist == ["loadgroup"], options
    workers = [options[i + 1] for i, o in enumerate(options) if o in ("-n", "--numprocesses")]
    assert workers and int(workers[0]) > 1, options
    assert pytestmark.name == "xdist_group" and pytestmark.args == ("trackers",), pytestmark
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "test_grouped.py").write_text(
        "import os\nimport pytest\n"
        f"pytestmark = pytest.mark.xdist_group({pytestmark.args[0]!r})\n"
        "@pytest.mark.parametrize('n', range(8))\n"
        "def test_one(n, request):\n"
        f"    open(os.path.join({str(seen)!r}, str(n)), 'w').write("
        "os.environ['PYTEST_XDIST_WORKER'] + ' ' + request.node.nodeid)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "-n", workers[0], "--dist", dist[0], "test_grouped.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [p.read_text().split(" ", 1) for p in seen.iterdir()]
    assert len(ran) == 8, ran
    assert len({worker for worker, _ in ran}) == 1, ran  # one worker for the group
    assert all(nodeid.endswith(f"@{pytestmark.args[0]}") for _, nodeid in ran), ran
    worker = getattr(request.config, "workerinput", None)  # this run: an xdist worker under --dist loadgroup
    if worker and any("loadgroup" in arg for arg in worker.get("mainargv", [])):
        assert request.node.nodeid.endswith("@trackers"), request.node.nodeid


def _state(directory: Path) -> dict:
    return json.loads((directory / "trackers.json").read_text())


def _steps(client, run_id: str, key: str) -> list:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _csv_rows(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_stopped_sweep_finished_later_reaches_mlflow_wandb_and_csv_as_one_sweep(tmp_path, mlflow_server):
    """A channels_last sweep with all three trackers at once (the small model: the recipes reach the
    trackers through the same code, and the suite's time goes to what differs), stopped by SIGTERM in
    job 0's 3rd step (its model signals the sweep's process, once) and finished by the same command:
    one MLflow parent run and one W&B group for both commands, job 0's tracker runs continued."""
    pytest.importorskip("wandb")
    from wandb_records import history, read_run

    from trainer.launch.stopping import PREEMPTED_EXIT_CODE

    sweep = tmp_path / "sweep"
    command = [
        "-m", f"hydra.sweep.dir={sweep}", *TINY, "trainer.max_epochs=2", "logger=[mlflow,wandb,csv]",
        "channels_last=false,true", "profile=true", "model._target_=rank_spies.StopSignalNet", "+model.at=[3]",
        f"+model.once={tmp_path / 'signalled'}",
    ]  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": mlflow_server.uri, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    stopped = run_cli(*command, env_extra=env)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stderr[-3000:]
    assert "preempted by SIGTERM at step 3;" in read_metrics(sweep / "0")["error"] and not (sweep / "1").exists()
    group = _state(sweep)
    client = mlflow_server.client()
    attached = {a.path for a in client.list_artifacts(group["mlflow"]["parent_run_id"])}
    assert "ab_report.md" in attached, attached  # the stopped sweep's report, attached at the stop
    r = run_cli(*command, env_extra=env)  # the same command finishes the sweep
    assert r.returncode == 0, r.stderr[-3000:]
    assert _state(sweep) == group  # the same parent run and group
    client = mlflow_server.client()
    parent = group["mlflow"]["parent_run_id"]
    sweeps = client.search_runs([group["mlflow"]["experiment_id"]], f"tags.`trainer.sweep_dir` = '{sweep.resolve()}'")
    assert [run.info.run_id for run in sweeps] == [parent]  # no second parent run for the second command
    runs = {
        run.data.params["channels_last"]: run
        for run in client.search_runs([group["mlflow"]["experiment_id"]], f"tags.mlflow.parentRunId = '{parent}'")
    }
    assert set(runs) == {"False", "True"}  # one nested run per job (job 0's continued), nothing else
    for num, value in enumerate(("False", "True")):
        run, job = runs[value], sweep / str(num)
        metrics = read_metrics(job)
        journal = [e["time_s"] for e in metrics["epochs"]]
        assert metrics["status"] == "ok" and [e["epoch"] for e in metrics["epochs"]] == [0, 1]
        assert bool(metrics.get("resumed_from")) == (num == 0)
        assert run.info.run_id == _state(job)["mlflow"]["run_id"]
        params = run.data.params
        # the flags under metrics.json's names, and the resolved config beside them
        for flag, flag_value in metrics["flags"].items():
            assert params[flag] == str(flag_value)[:250], flag
        assert params["model._target_"] == "rank_spies.StopSignalNet" and params["data.image_size"] == str(
            metrics["data"]["image_size"]
        )
        for key in EPOCH_FIGURES:
            assert sorted(set(_steps(client, run.info.run_id, key))) == [0, 1], key
        history_ = sorted(client.get_metric_history(run.info.run_id, "perf/epoch_time_s"), key=lambda m: m.timestamp)
        assert _last_per_step((m.step, m.value) for m in history_) == pytest.approx(journal, abs=1e-4)
        assert len({m.step for m in client.get_metric_history(run.info.run_id, "val/acc")}) == 2
        assert client.get_metric_history(run.info.run_id, "system/cpu_busy_cores")
        assert run.data.tags["doctor.verdict"] == metrics["diagnosis"]["verdict"]
        assert run.info.status == "FINISHED" and run.info.run_name == f"channels_last={value}"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"metrics.json", ".hydra", "profiler"} <= artifacts
        profiler = {a.path for a in client.list_artifacts(run.info.run_id, "profiler")}
        assert profiler == {"profiler/summary.html", "profiler/breakdown.png"}
        # W&B: the same job, in the sweep's group, read back from its offline run files: job 0's two
        # attempts are one run (the same id), the second holding the epochs
        attempts = sorted(job.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(attempts) == (2 if num == 0 else 1), attempts
        recorded = [read_run(f) for f in attempts]
        assert {(r["group"], r["id"]) for r in recorded} == {(group["wandb"]["group"], _state(job)["wandb"]["id"])}
        recorded = recorded[-1]
        assert recorded["config"]["channels_last"] == (value == "True")
        assert history(recorded, "perf/epoch_time_s") == pytest.approx(journal, abs=1e-4)
        assert len(history(recorded, "val/acc")) == 2
        assert recorded["summary"]["doctor_verdict"] == metrics["diagnosis"]["verdict"]
        assert {"metrics.json", ".hydra/config.yaml"} <= set(recorded["files"])
        # CSV: every epoch's figures (job 0's file appended to on its resume)
        rows = [row for row in _csv_rows(job / "metrics.csv") if row["perf/epoch_time_s"]]
        assert _last_per_step((int(r["step"]), float(r["perf/epoch_time_s"])) for r in rows) == pytest.approx(
            journal, abs=1e-4
        )
    # the A/B report: on the parent run, and on the W&B group's report run, the same files as the sweep dir
    assert client.get_run(parent).info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(parent)} == {"ab_report.md", "ab_report.csv", "ab_report.png"}
    local = tmp_path / "report"
    client.download_artifacts(parent, "ab_report.md", str(local.mkdir() or local))
    assert (local / "ab_report.md").read_text() == (sweep / "ab_report.md").read_text()
    (report_file,) = sweep.glob("wandb/offline-run-*/run-*.wandb")  # one: the finished sweep's
    report_run = read_run(report_file)
    assert report_run["group"] == group["wandb"]["group"] and report_run["job_type"] == "ab_report"
    assert {"ab_report.md", "ab_report.csv", "ab_report.png"} <= set(report_run["files"])
    # and the table as a W&B table: the CSV's rows, in the table file the run logged
    (kind,) = history(report_run, "ab_report/_type")
    (table_path,) = history(report_run, "ab_report/path")
    assert kind == "table-file" and table_path in report_run["files"], (kind, table_path)
    table = json.loads((report_file.parent / "files" / table_path).read_text())
    header, *rows = _csv_table(sweep / "ab_report.csv")
    assert table["columns"] == header and rows and table["data"] == rows
    assert len(rows) == 2  # one per job: W&B's copies of metrics.json inside the run dirs are not rows


def _csv_table(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _start(run_dir: Path, *extra: str, uri: str, **env: str):
    """``python train.py`` in the background, to be killed (forked_python.start_python)."""
    from forked_python import start_python

    return start_python(
        [str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *extra], ROOT, clean_env(MLFLOW_TRACKING_URI=uri, **env)
    )


@pytest.mark.slow
def test_a_run_killed_with_sigkill_and_resumed_continues_its_mlflow_run_and_csv_file(tmp_path, mlflow_server):
    run_dir, epochs = tmp_path / "run", 6
    args = [*TINY, "data.num_samples=512", f"trainer.max_epochs={epochs}", "checkpoint.enabled=true"]
    args += ["logger=[mlflow,csv]"]
    proc = _start(run_dir, *args, uri=mlflow_server.uri)
    deadline = time.time() + 180
    while time.time() < deadline:  # kill once at least two epochs are in the journal
        if (run_dir / "metrics.json").is_file() and len(read_metrics(run_dir)["epochs"]) >= 2:
            break
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = len(read_metrics(run_dir)["epochs"])
    assert killed_at < epochs, "the run finished before it was killed: nothing was tested"
    first = _state(run_dir)["mlflow"]["run_id"]
    r = run_cli(
        f"hydra.run.dir={run_dir}", *args, "ckpt_path=last", env_extra={"MLFLOW_TRACKING_URI": mlflow_server.uri}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    client = mlflow_server.client()
    runs = client.search_runs(
        [_state(run_dir)["mlflow"]["experiment_id"]], f"tags.`trainer.run_dir` = '{run_dir.resolve()}'"
    )
    assert [run.info.run_id for run in runs] == [first]  # one run for the job, not one per attempt
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.params["ckpt_path"] == "None"  # params keep the first attempt's values
    # the history is continuous: every epoch, no gap, and each epoch's last value is the one the journal
    # kept (an epoch the kill caught before its checkpoint was trained again, and logged again)
    journal = [e["time_s"] for e in read_metrics(run_dir)["epochs"]]
    history = sorted(client.get_metric_history(first, "perf/epoch_time_s"), key=lambda m: m.timestamp)
    assert _last_per_step((m.step, m.value) for m in history) == pytest.approx(journal, abs=1e-4)
    rows = [row for row in _csv_rows(run_dir / "metrics.csv") if row["perf/epoch_time_s"]]
    # the CSV file was appended to, not replaced (Lightning's writer deletes it on a resume)
    assert _last_per_step((int(r["step"]), float(r["perf/epoch_time_s"])) for r in rows) == pytest.approx(
        journal, abs=1e-4
    )


def _kill_after_epochs(proc: subprocess.Popen, run_dir: Path, epochs: int) -> list:
    """SIGKILL (a node lost: no checkpoint, no clean-up) once ``epochs`` are in the journal; its epochs."""
    deadline = time.time() + 180
    while time.time() < deadline:
        if (run_dir / "metrics.json").is_file() and len(read_metrics(run_dir)["epochs"]) >= epochs:
            break
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return read_metrics(run_dir)["epochs"]


@pytest.mark.slow
def test_a_slurm_requeue_before_any_checkpoint_keeps_its_tracker_runs_and_sets_the_old_csv_rows_aside(
    tmp_path, mlflow_server
):
    """A job Slurm requeues before its first checkpoint trains again from epoch 0 in its own dir
    (trainer/launch/slurm.py): it stays one MLflow run and one W&B run, marked as started over; metrics.csv
    starts again with this training, as metrics.json does, and keeps the first attempt's rows beside it."""
    pytest.importorskip("wandb")
    from wandb_records import read_run

    run_dir, epochs = tmp_path / "run", 6
    args = [*TINY, "data.num_samples=512", f"trainer.max_epochs={epochs}", "logger=[mlflow,wandb,csv]"]
    assert "checkpoint.enabled=false" in args
    slurm = {"SLURM_JOB_ID": "4242", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    first_epochs = _kill_after_epochs(_start(run_dir, *args, uri=mlflow_server.uri, **slurm), run_dir, 2)
    assert len(first_epochs) < epochs, "the run finished before it was killed: nothing was tested"
    first = _state(run_dir)
    # the rerun Slurm starts: the same command, SLURM_RESTART_COUNT=1
    r = run_cli(
        f"hydra.run.dir={run_dir}", *args,
        env_extra={"MLFLOW_TRACKING_URI": mlflow_server.uri, **slurm, "SLURM_RESTART_COUNT": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "before a checkpoint was saved: starting over" in r.stdout + r.stderr
    journal = read_metrics(run_dir)["epochs"]
    assert [e["epoch"] for e in journal] == list(range(epochs))  # trained from scratch
    # one tracker run each, continued
    client = mlflow_server.client()
    runs = client.search_runs([first["mlflow"]["experiment_id"]], f"tags.`trainer.run_dir` = '{run_dir.resolve()}'")
    assert [run.info.run_id for run in runs] == [first["mlflow"]["run_id"]]
    assert runs[0].info.status == "FINISHED" and "restart 1" in runs[0].data.tags["trainer.started_over"]
    assert _state(run_dir)["wandb"]["id"] == first["wandb"]["id"]
    attempts = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(attempts) == 2 and {p.name.rsplit("-", 1)[1] for p in attempts} == {first["wandb"]["id"]}
    (rerun_file,) = attempts[-1].glob("run-*.wandb")  # the first attempt's file ends where it was killed
    assert "started-over:restart-1" in read_run(rerun_file)["tags"]
    # the CSV: this training's epochs, and the first attempt's rows set aside
    rows = [row for row in _csv_rows(run_dir / "metrics.csv") if row["perf/epoch_time_s"]]
    assert [int(row["step"]) for row in rows] == list(range(epochs))
    assert [float(row["perf/epoch_time_s"]) for row in rows] == pytest.approx([e["time_s"] for e in journal], abs=1e-4)
    old = [row for row in _csv_rows(run_dir / "metrics.before-restart-1.csv") if row["perf/epoch_time_s"]]
    assert [float(row["perf/epoch_time_s"]) for row in old] == pytest.approx(
        [e["time_s"] for e in first_epochs], abs=1e-4
    )


def _last_per_step(points) -> list:
    """The values of steps 0, 1, ... (the last one logged for each); fails on a missing step."""
    last = dict(points)
    assert sorted(last) == list(range(len(last))), sorted(last)
    return [last[step] for step in range(len(last))]


def test_the_step_loss_a_tracker_gets_is_the_batchs_loss_also_with_accumulate(train):
    """Lightning hands on_train_batch_end the loss it backpropagated, divided by accumulate: train/loss
    showed an accumulate=2 run at half its loss. The first logged value is the first batch's loss from
    the same initial weights, with and without accumulation."""
    first = {}
    for accumulate in (1, 2):
        _, run_dir = train("logger=[csv]", f"accumulate={accumulate}", "trainer.log_every_n_steps=1")
        losses = [float(r["train/loss"]) for r in _csv_rows(run_dir / "metrics.csv") if r.get("train/loss")]
        first[accumulate] = losses[0]
    assert first[2] == pytest.approx(first[1], rel=1e-5), first


def test_an_unreachable_tracking_server_is_one_paragraph_before_training(tmp_path):
    from mlflow_server import _free_port

    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    r = run_cli(f"hydra.run.dir={run_dir}", *TINY, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}", timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"the MLflow tracking server at {uri} did not answer" in r.stderr and "Traceback" not in r.stderr
    assert "epoch 0" not in r.stdout + r.stderr  # stopped before training
    # and a sweep stops before its first job
    sweep = tmp_path / "sweep"
    r = run_cli("-m", f"hydra.sweep.dir={sweep}", *TINY, "logger=mlflow", "amp=false,true", timeout=120,
                env_extra={"MLFLOW_TRACKING_URI": uri})  # fmt: skip
    assert r.returncode == 2 and "did not answer" in r.stderr and "Traceback" not in r.stderr
    assert not (sweep / "0").exists()


def test_a_missing_tracker_package_is_one_paragraph_naming_the_extra(compose, tmp_path, monkeypatch):
    from trainer import tracking
    from trainer.errors import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails as if it were not installed
    monkeypatch.setattr("pytorch_lightning.loggers.wandb._WANDB_AVAILABLE", False)
    cfg = compose(*TINY, "logger=[tensorboard,wandb]")
    with pytest.raises(ConfigError, match=r"logger=wandb needs the wandb package.*trainer-switchboard\[wandb\]"):
        tracking.build(cfg, str(tmp_path), [], resuming=False)


def test_a_typo_under_a_logger_is_one_paragraph_naming_it(compose, tmp_path):
    from trainer import tracking
    from trainer.errors import ConfigError

    cfg = compose(*TINY, "logger=csv", "+logger.csv.flush_every=3")
    with pytest.raises(ConfigError, match=r"logger\.csv could not be built.*flush_every"):
        tracking.build(cfg, str(tmp_path), [], resuming=False)


def test_a_failed_build_closes_the_runs_it_opened_and_a_resume_keeps_other_trackers_ids(compose, tmp_path, monkeypatch):
    """A W&B run opened before a later logger fails is finished (a sweep's next job in this process would
    reuse it); a resume with fewer trackers keeps the others' run ids in trackers.json for a later resume."""
    import wandb

    from trainer import tracking
    from trainer.errors import ConfigError

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose(*TINY, "logger=[wandb,csv]", "+logger.csv.flush_every=3")
    assert list(cfg.logger) == ["wandb", "csv"]
    with pytest.raises(ConfigError, match=r"logger\.csv could not be built"):
        tracking.build(cfg, str(tmp_path), [], resuming=False)
    assert wandb.run is None

    (tmp_path / "trackers.json").write_text(json.dumps({"mlflow": {"run_id": "abc", "tracking_uri": "http://x"}}))
    loggers = tracking.build(compose(*TINY, "logger=wandb"), str(tmp_path), [], resuming=True)
    try:
        state = _state(tmp_path)
        assert state["mlflow"]["run_id"] == "abc" and state["wandb"]["id"], state
    finally:
        loggers[0].experiment.finish()


def test_every_logger_gets_the_epoch_figures_and_tensorboard_stays_the_default(train, compose):
    """Lightning's ``trainer.logger`` is the first logger only: the second must get them too. The params
    hold the batch size the run settled on, and what was asked for as ``requested.data.batch_size``."""
    import yaml

    assert list(compose(*TINY).logger) == ["tensorboard"]
    m, out = train(
        "logger=[tensorboard,csv]", "trainer.max_epochs=2", "monitor.interval_s=0.01",
        "data.batch_size=auto", "batch_finder.max_batch_size=16", "batch_finder.memory_budget_mb=100000",
    )  # fmt: skip
    assert m["batch_size"] == 16 and m["flags"]["data.batch_size"] == "auto"
    rows = _csv_rows(out / "metrics.csv")
    assert [float(row["perf/epoch_time_s"]) for row in rows if row["perf/epoch_time_s"]] == pytest.approx(
        [e["time_s"] for e in m["epochs"]], abs=1e-4
    )
    assert any(row.get("system/cpu_busy_cores") for row in rows)  # the system readings too
    assert list(out.glob("events.out.tfevents.*"))
    params = yaml.safe_load((out / "hparams.yaml").read_text())
    assert params["data.batch_size"] == 16 and params["requested.data.batch_size"] == "auto"
    assert not [k for k in params if k.startswith("requested.") and k != "requested.data.batch_size"], params


def test_no_tracker_at_all_trains_and_records_its_metrics(train, compose, tmp_path):
    """logger=[] or ~logger: a run (and a sweep's start) with no tracker (both raised OmegaConf's
    ValueError with a traceback); metrics.json is the record, nothing is written for a tracker."""
    from trainer.tracking.sweep_group import sweep_start

    for off in ("logger=[]", "~logger"):
        m, out = train(off)
        assert m["status"] == "ok", m.get("error")
        assert not list(out.glob("events.out.tfevents.*")) and not (out / "metrics.csv").exists()
        sweep_start(compose(*TINY, off), str(tmp_path / off))


def test_a_resumed_run_appends_to_its_csv_file(compose, tmp_path):
    """Lightning's CSV writer deletes metrics.csv in a dir that holds one; a run resumed into its dir
    (``ckpt_path=last``) appends under the same header, and the rows before the resume stay as they were."""
    from trainer.run import run

    out = tmp_path / "run"
    # no system monitor: its readings come only in epochs longer than its shortest window (50 ms), so on a
    # loaded machine the resumed run alone had them, and its new columns widened the header under the old rows
    args = [*TINY, "logger=csv", "checkpoint.enabled=true", "monitor.enabled=false"]
    run(compose(*args), str(out), args)
    first = _csv_rows(out / "metrics.csv")
    assert [row["step"] for row in first if row["perf/epoch_time_s"]] == ["0"]
    resumed = [*args, "trainer.max_epochs=2", "ckpt_path=last"]
    m = run(compose(*resumed), str(out), resumed)
    assert m["status"] == "ok" and m["resumed_from"].endswith("last.ckpt")
    rows = _csv_rows(out / "metrics.csv")
    assert rows[: len(first)] == first  # kept, under the same header
    epochs = [row for row in rows if row["perf/epoch_time_s"]]
    assert [int(row["step"]) for row in epochs] == [e["epoch"] for e in m["epochs"]] == [0, 1]
    assert [float(row["perf/epoch_time_s"]) for row in epochs] == pytest.approx(
        [e["time_s"] for e in m["epochs"]], abs=1e-4
    )


def test_values_a_user_sets_on_a_logger_win_over_the_trainers(compose, tmp_path, monkeypatch):
    """The trainer fills in where files go, run names and a sweep's group only where the config leaves
    them null: here a sweep job's dir (the sweep's group recorded beside it), with the user's own."""
    import wandb

    from trainer import tracking
    from trainer.paths import SWEEP_PLAN

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    sweep.mkdir()
    (sweep / SWEEP_PLAN).write_text(json.dumps({"overrides": ["amp=false,true"]}))
    (sweep / "trackers.json").write_text(json.dumps({"wandb": {"group": "the-sweeps-group", "project": "trainer"}}))
    job = sweep / "0"
    users = [
        "logger=[csv,wandb]", f"+logger.csv.save_dir={elsewhere}", "logger.wandb.name=my-run",
        "logger.wandb.group=my-group", f"+logger.wandb.save_dir={elsewhere}",
    ]  # fmt: skip
    loggers = tracking.build(compose(*TINY, *users), str(job), ["amp=true"], resuming=False)
    try:
        csv_logger, wandb_logger = loggers
        assert os.path.abspath(csv_logger.log_dir).startswith(str(elsewhere)), csv_logger.log_dir
        run = wandb_logger.experiment
        assert (run.name, run.group) == ("my-run", "my-group")
        assert str(elsewhere) in run.dir, run.dir
    finally:
        wandb.finish()
    # and where the config leaves them null, the trainer's: the job's dir, its swept values, the sweep's group
    loggers = tracking.build(compose(*TINY, "logger=[csv,wandb]"), str(job), ["amp=true"], resuming=False)
    try:
        csv_logger, wandb_logger = loggers
        assert os.path.abspath(csv_logger.log_dir) == str(job)
        run = wandb_logger.experiment
        assert (run.name, run.group) == ("amp=true", "the-sweeps-group") and str(job) in run.dir
    finally:
        wandb.finish()


def test_wandb_that_cannot_start_a_run_is_one_paragraph_before_training(compose, tmp_path, monkeypatch):
    """Online with no API key (nobody logged in on this machine): W&B's UsageError becomes the trainer's
    one paragraph, saying how to log in or run offline."""
    import wandb

    from trainer import tracking
    from trainer.errors import ConfigError

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/.config/wandb: not logged in
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    wandb.teardown()  # W&B keeps the settings it first read in a process (an earlier test's offline mode)
    try:
        with pytest.raises(ConfigError) as raised:
            tracking.build(compose(*TINY, "logger=wandb"), str(tmp_path / "run"), [], resuming=False)
    finally:
        wandb.teardown()  # nor does a later test get this one's
    message = str(raised.value)
    assert message.startswith("logger=wandb: W&B could not start a run (") and "\n" not in message, message
    assert "WANDB_MODE=offline" in message and "nothing was trained" in message, message
    assert wandb.run is None


def test_mlflow_without_a_tracking_server_is_one_paragraph_saying_how_to_set_one(compose, tmp_path, monkeypatch):
    from trainer import tracking
    from trainer.errors import ConfigError

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose(*TINY, "logger=mlflow")
    with pytest.raises(ConfigError, match=r"logger=mlflow needs a tracking server: set MLFLOW_TRACKING_URI"):
        tracking.build(cfg, str(tmp_path), [], resuming=False)


# ---- what leaves the machine

PLANTED = (
    "+data.storage_options.secret=PLANTED-SECRET",
    "+data.storage_options.client_kwargs.aws_secret_access_key=PLANTED-AWS-KEY",
)


def _files_under(directory: Path) -> list:
    """Every file below ``directory`` (symlinks followed: W&B links the files it uploads)."""
    return [p for p in directory.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_credentials_in_the_config_never_reach_a_tracker(tmp_path, mlflow_server):
    """A secret under data.storage_options and a password in the tracking URI (logger.mlflow.tracking_uri):
    masked in MLflow's params, run name and artifacts, in every W&B offline file and in the CSV logger's
    files, while the run dir's own metrics.json and .hydra/config.yaml keep them (the user's files)."""
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    uri = mlflow_server.uri.replace("http://", "http://alice:PLANTED-PASS@")
    r = run_cli(
        f"hydra.run.dir={run_dir}", *TINY, "logger=[mlflow,wandb,csv]", "profile=true", *PLANTED,
        env_extra={"MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    # planted for real: the user's own files on this machine keep every value
    local = (run_dir / "metrics.json").read_text() + (run_dir / ".hydra" / "config.yaml").read_text()
    assert "PLANTED-SECRET" in local and "PLANTED-AWS-KEY" in local and "PLANTED-PASS" in local
    client = mlflow_server.client()
    run = client.get_run(_state(run_dir)["mlflow"]["run_id"])
    assert run.data.params["data.storage_options.secret"] == "***"
    assert run.data.params["data.storage_options.client_kwargs.aws_secret_access_key"] == "***"
    assert run.data.params["data.image_size"] == "16"  # the rest as it was
    sent = [run.info.run_name, *run.data.params.values(), *run.data.tags.values()]
    assert not [s for s in sent if "PLANTED" in s], sent
    downloaded = tmp_path / "artifacts"
    downloaded.mkdir()
    client.download_artifacts(run.info.run_id, "", str(downloaded))
    artifacts = _files_under(downloaded)
    assert {"metrics.json", "config.yaml", "summary.html"} <= {p.name for p in artifacts}
    assert not [p for p in artifacts if b"PLANTED" in p.read_bytes()]
    uploaded = json.loads((downloaded / "metrics.json").read_text())
    assert "+data.storage_options.secret=***" in uploaded["overrides"]
    assert "secret: '***'" in (downloaded / ".hydra" / "config.yaml").read_text()
    # W&B: its run file (name, config, metadata, console), the files it syncs, its logs
    wandb_files = _files_under(run_dir / "wandb")
    assert any(p.suffix == ".wandb" for p in wandb_files) and any(p.name == "metrics.json" for p in wandb_files)
    assert not [p for p in wandb_files if b"PLANTED" in p.read_bytes()]
    # the CSV logger's files
    for name in ("metrics.csv", "hparams.yaml"):
        assert "PLANTED" not in (run_dir / name).read_text(), name


def test_what_counts_as_a_credential_and_that_no_key_of_the_product_does(compose):
    """The names fsspec, the clouds and HTTP give credentials are masked at any depth; none of the
    product's own keys is (a masked ``data.batch_size`` would make params useless)."""
    from omegaconf import OmegaConf

    from trainer import tracking

    names = ("secret", "key", "token", "password", "aws_secret_access_key", "aws_access_key_id", "api_key")
    for name in (*names, "apiKey", "account_key", "sas_token", "client_secret", "connection_string", "credentials"):
        assert tracking.looks_secret(f"data.storage_options.{name}"), name
    for name in ("key_dim", "monkey", "tokenizer", "max_tokens", "author", "data.root"):
        assert not tracking.looks_secret(name), name
    masked = tracking.redact(
        {"a": {"credentials": {"user": "u", "n": 3, "off": None}, "root": "s3://ak:sk@bucket/x?sig=abc&y=1"}}
    )
    assert masked == {
        "a": {"credentials": {"user": "***", "n": "***", "off": None}, "root": "s3://***@bucket/x?sig=***&y=1"}
    }
    assert tracking.redact_text("+data.storage_options.token='a b'") == "+data.storage_options.token=***"
    for overrides in ([], ["logger=many"], ["logger=wandb"], ["+recipe=resnet50"], ["+recipe=vit"]):
        flat = tracking.params_of(compose(*overrides), {})
        flat.update(tracking.flatten(OmegaConf.to_container(compose(*overrides).logger, resolve=False)))
        assert flat and not [k for k in flat if tracking.looks_secret(k)], overrides


def test_wandb_plots_the_epoch_figures_against_the_epoch(train, monkeypatch):
    """W&B's x axis for Lightning's metrics is ``trainer/global_step``: the epoch figures carry their
    epoch under ``epoch``, defined as their step metric, instead of passing the epoch off as a global step."""
    wandb = pytest.importorskip("wandb")
    from wandb_records import read_run, records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    m, out = train("logger=wandb", "trainer.max_epochs=2")
    wandb.teardown()  # W&B's service writes the run file behind the run: done once the service has stopped
    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    defined = {
        r.metric.name: r.metric.step_metric for r in records(run_file) if r.WhichOneof("record_type") == "metric"
    }
    for key in EPOCH_FIGURES:
        assert defined.get(key) == "epoch", (key, defined)
    rows = [row for row in read_run(run_file)["history"] if "perf/epoch_time_s" in row]
    assert [row["epoch"] for row in rows] == [e["epoch"] for e in m["epochs"]] == [0, 1]
    assert [row["perf/epoch_time_s"] for row in rows] == pytest.approx([e["time_s"] for e in m["epochs"]], abs=1e-4)
    assert not [row for row in rows if "trainer/global_step" in row]  # not an epoch filed as a step
    # Lightning's own metrics keep the global step (an epoch's end is logged at its last step's index)
    last_steps = [8 * (e["epoch"] + 1) - 1 for e in m["epochs"]]  # 64 samples in batches of 8
    assert [row["trainer/global_step"] for row in read_run(run_file)["history"] if "val/acc" in row] == last_steps
    # the doctor's verdict: in the summary, and its bottleneck as a tag
    diagnosis, recorded = m["diagnosis"], read_run(run_file)
    assert diagnosis["bottleneck"] and recorded["summary"]["doctor_bottleneck"] == diagnosis["bottleneck"]
    assert f"doctor:{diagnosis['bottleneck']}" in recorded["tags"], recorded["tags"]
