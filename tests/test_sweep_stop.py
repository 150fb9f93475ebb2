"""Stopping a local sweep: the job in flight saves and the sweep ends there; the same command finishes it."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from conftest import ROOT, clean_env, read_metrics, run_cli

# a planted slow loader: 8 steps of about 0.25 s per epoch, so a signal lands mid-epoch
SLOW = [
    "data=custom",
    "data.dataset._target_=spies.SlowDataset",
    "+data.dataset.n=64",
    "+data.dataset.sleep_ms=30",
    "data.val_samples=0",
    "trainer.limit_val_batches=0",
    "data.image_size=16",
    "data.batch_size=8",
    "trainer.max_epochs=2",
    "checkpoint.enabled=false",
]


def _start_train(*args: str):
    """``python train.py ARGS`` in the background, its output (stdout and stderr) read as one text
    (forked_python.start_python)."""
    from forked_python import start_python

    return start_python([str(ROOT / "train.py"), *args], ROOT, clean_env())


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended before the signal: {proc.communicate()[0][-3000:]}")
        time.sleep(0.02)
    raise AssertionError("timed out")


def _running_epoch_written(job_dir) -> bool:
    try:
        return json.loads((job_dir / "metrics.json").read_text()).get("status") == "running"
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_sigterm_stops_a_sweep_after_the_job_in_flight_saves_and_the_same_command_finishes_it(tmp_path):
    from trainer.launch.stopping import PREEMPTED_EXIT_CODE

    sweep_dir = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep_dir}", *SLOW, "model.width=4,5,6"]
    proc = _start_train(*args)
    _wait_for(lambda: _running_epoch_written(sweep_dir / "0"), proc)  # job 0 finished epoch 0: it is in epoch 1
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)

    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
    assert not (sweep_dir / "1").exists() and not (sweep_dir / "2").exists(), sorted(
        p.name for p in sweep_dir.iterdir()
    )
    job0 = read_metrics(sweep_dir / "0")
    assert job0["status"] == "failed" and job0["preempted"] is True and "preempted by SIGTERM at step" in job0["error"]
    saved_at = int(job0["error"].split("at step ")[1].split(";")[0])
    assert 8 <= saved_at < 16, job0["error"]  # within epoch 1: stopped at the next step boundary, not at the end
    assert (sweep_dir / "0" / "checkpoints" / "last.ckpt").exists()
    report = (sweep_dir / "ab_report.md").read_text()
    assert "**Not run**" in report and "#1 model.width=5" in report and "#2 model.width=6" in report, report
    assert "2 job(s) did not run" in out and f"hydra.sweep.dir={sweep_dir}" in out and "Traceback" not in out, out[
        -3000:
    ]
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "stopped"

    finished = run_cli(*args)  # the same command: finishes the sweep
    assert finished.returncode == 0, finished.stderr[-3000:]
    jobs = [read_metrics(sweep_dir / str(n)) for n in range(3)]
    assert [m["status"] for m in jobs] == ["ok", "ok", "ok"], [m.get("error") for m in jobs]
    assert jobs[0].get("resumed_from", "").endswith("last.ckpt") and [e["epoch"] for e in jobs[0]["epochs"]] == [0, 1]
    assert not jobs[1].get("resumed_from") and not jobs[2].get("resumed_from")
    report = (sweep_dir / "ab_report.md").read_text()
    assert "**Not run**" not in report and report.count("| ok |") == 3, report
    assert json.loads((sweep_dir / "sweep.json").read_text())["state"] == "done"

    again = run_cli(*args)  # a finished sweep is not swept into again
    assert again.returncode == 2 and "already holds an earlier sweep" in again.stderr, again.stderr[-2000:]


@pytest.mark.slow
def test_a_finished_job_of_a_stopped_sweep_is_kept_as_it_ran(tmp_path):
    """Stopped after job 0 finished: re-running keeps job 0's result and the config it ran with (not retrained)."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep_dir}", *SLOW, "model.width=4,5"]
    proc = _start_train(*args)
    _wait_for(lambda: _running_epoch_written(sweep_dir / "1"), proc)  # job 0 finished, job 1 is in its epoch 1
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the same stop as SIGTERM
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out[-3000:]
    first = (sweep_dir / "0" / "metrics.json").read_text()
    config = (sweep_dir / "0" / ".hydra" / "config.yaml").read_text()
    assert json.loads(first)["status"] == "ok"
    stopped = read_metrics(sweep_dir / "1")
    assert stopped["status"] == "failed" and "stopped by Ctrl-C (SIGINT) at step" in stopped["error"], stopped["error"]
    finished = run_cli(*args)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (sweep_dir / "0" / "metrics.json").read_text() == first  # kept as it was
    assert (
        sweep_dir / "0" / ".hydra" / "config.yaml"
    ).read_text() == config  # the config it ran with, not Hydra's rewrite
    resumed = read_metrics(sweep_dir / "1")
    assert resumed["status"] == "ok" and resumed.get("resumed_from", "").endswith("last.ckpt")
    assert (
        "#0 model.width=4" in finished.stdout + finished.stderr
        and "already finished, unchanged" in finished.stdout + finished.stderr
    )


@pytest.mark.slow
def test_sigusr1_stops_a_single_run_after_the_step_in_flight_with_last_ckpt_saved(tmp_path):
    """SIGUSR1 (Slurm's time-limit signal with --signal=USR1@...) is a stop request like SIGTERM: the run
    (one process, no sweep) saves at the end of the step in flight and exits with 75. Its model sends
    the signal to its own process in the 3rd training step."""
    import torch

    from trainer.launch.stopping import PREEMPTED_EXIT_CODE

    run_dir = tmp_path / "run"
    r = run_cli(
        f"hydra.run.dir={run_dir}", "data.image_size=16", "data.batch_size=8", "data.num_samples=64",
        "data.val_samples=16", "trainer.max_epochs=2", "checkpoint.enabled=false",
        "model._target_=rank_spies.StopSignalNet", "+model.signal_name=SIGUSR1", "+model.at=[3]", timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "failed" and m["preempted"] is True and "preempted by SIGUSR1 at step 3;" in m["error"], m
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3  # the step in flight finished, no further one started
    assert "Traceback" not in out, out[-3000:]


def test_a_second_ctrl_c_stops_at_once():
    from trainer.launch import stopping

    stopping.clear()
    assert stopping.install()
    try:
        signal.raise_signal(signal.SIGINT)  # the first: a request, handled at the next safe point
        assert stopping.requested() == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        stopping.uninstall()
        stopping.clear()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_signal_while_a_run_sets_up_stops_it_at_once(tmp_path):
    """Nothing trained yet, nothing to save: the run stops now, says so, and records it."""
    run_dir = tmp_path / "run"
    proc = _start_train(
        f"hydra.run.dir={run_dir}",
        "data=custom",
        "data.dataset._target_=spies.SlowInitDataset",
        "+data.dataset.init_s=60",
        "data.val_samples=0",
    )
    _wait_for(
        lambda: "device: " in ((run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""), proc
    )
    time.sleep(0.5)  # inside the data set's 60 s opening
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert time.time() - sent < 30, "it waited for the data set to open"
    assert "stopped by SIGTERM before training started" in out and "Traceback" not in out, out[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "failed" and m["error"] == "stopped by SIGTERM before training started (nothing to save)"


@pytest.mark.slow
def test_a_sweep_with_emulated_bf16_says_how_long_before_the_slow_job(tmp_path):
    """On a CPU without native bf16 (TRAINER_CPU_FLAGS makes this one look like an AVX2-only one): the
    amp=true job is named before the first job starts, and its expected time is said before it starts."""
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "amp=false,true",
        "trainer.max_epochs=1",
        "checkpoint.enabled=false",
        "data.image_size=16",
        "data.num_samples=64",
        "data.val_samples=16",
        env_extra={"TRAINER_CPU_FLAGS": "fpu sse sse2 avx avx2 fma"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    named = out.index("#1 amp=true: amp=true runs emulated bf16 on this CPU")
    expect = out.index("#1 amp=true: expect about")
    first_done, second_done = out.index("#0 amp=false: "), out.index("#1 amp=true: ", expect + 1)
    assert named < first_done < expect < second_done, out[-3000:]  # named before any job, timed before its own start
    assert "x the " in out[expect:second_done] and "that #0 took in fp32" in out[expect:second_done], out[
        expect:second_done
    ]
    assert "probe of this model measured a bf16 step" in out[named:first_done]


def test_a_stopped_sweeps_launched_job_taken_up_again_resumes_in_its_ranks(compose, tmp_path):
    """Taking up a stopped sweep sets ckpt_path=last on the stopped job's config; a job that runs in
    processes of its own (devices > 1, runtime.allocator) rebuilds their command line from its
    overrides, so the decision goes on it too: without it the ranks trained from scratch."""
    from omegaconf import open_dict

    from trainer.launch.processes import job_overrides

    cfg = compose("strategy=ddp", "devices=2", "amp=true")
    asked = ["strategy=ddp", "devices=2", "amp=true", "hydra.sweep.dir=/s", "hydra.job.num=3"]
    assert job_overrides(cfg, str(tmp_path), asked) == [
        "strategy=ddp",
        "devices=2",
        "amp=true",
        f"hydra.run.dir={tmp_path}",
    ]
    with open_dict(cfg):
        cfg.ckpt_path = "last"  # as cli._prepare_job_dir decides for a stopped job of the sweep
    assert job_overrides(cfg, str(tmp_path), asked)[-2:] == ["ckpt_path=last", f"hydra.run.dir={tmp_path}"]
    given = [*asked, "ckpt_path=/ckpts/a.ckpt"]  # the user's own: kept as given, once
    assert [o for o in job_overrides(cfg, str(tmp_path), given) if o.startswith("ckpt_path")] == [
        "ckpt_path=/ckpts/a.ckpt"
    ]
