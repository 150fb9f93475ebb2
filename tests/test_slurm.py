"""The Slurm path on a live cluster: sweeps through hydra/launcher=slurm_local, preemption by
``scontrol requeue`` and by the time-limit signal (submitit's and the batch script's), each
resuming by itself to the same weights as an uninterrupted run, and DDP with two Slurm tasks.

They need a live cluster whose slurm.conf ``SLURM_CONF`` names (``.ci/run`` starts one with
``scripts/slurm/local_cluster.sh up``); without one they skip, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, final_loss, read_metrics, run_cli

from trainer.launch.processes import find_allocator

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.whole_machine]  # one cluster, its 2 CPUs

# ~2 s of training in 512 steps on one CPU, a checkpoint every 7 steps: a preemption lands mid-run (at about
# step 15: the tests signal a job once its first checkpoint exists)
RUN = [
    "seed=42",
    "data.num_samples=1024",
    "data.batch_size=8",
    "data.image_size=16",
    "data.val_samples=16",
    "trainer.max_epochs=4",
    "trainer.log_every_n_steps=8",
    "model.width=8",
    "checkpoint.every_n_steps=7",
]
# Every run that is compared with the uninterrupted one uses one intra-op thread: the preempted sweep
# runs two jobs side by side on the cluster's two CPUs, and a thread count changes the float sums.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def cluster_problem() -> str | None:
    conf = os.environ.get("SLURM_CONF")
    if not conf or not Path(conf).exists():
        return "no Slurm cluster: SLURM_CONF is not set (sudo scripts/slurm/local_cluster.sh up, then export SLURM_CONF=...)"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no Slurm cluster answering ({e})"
    return (
        None
        if r.returncode == 0 and "up" in r.stdout
        else f"the Slurm cluster of {conf} does not answer: {r.stderr.strip()[:200]}"
    )


@pytest.fixture(scope="module")
def cluster():
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    return os.environ["SLURM_CONF"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cluster):
    """The final loss of the same run, straight through, on this machine."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    r = run_cli(f"hydra.run.dir={run_dir}", *RUN, env_extra=ONE_THREAD)
    assert r.returncode == 0, r.stderr[-3000:]
    return final_loss(run_dir / "checkpoints" / "last.ckpt")


def _slurm(*args: str, timeout: int = 60, env: dict | None = None) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def _job_ids() -> list:
    return [line.strip() for line in _slurm("squeue", "-h", "-o", "%A").splitlines() if line.strip()]


def _wait_for(path: Path, proc: subprocess.Popen | None, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"ended before {path} appeared: {proc.stdout.read()[-3000:] if proc.stdout else ''}")
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def _sweep(sweep: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm_local", f"hydra.sweep.dir={sweep}", *args],
        cwd=ROOT,
        env=clean_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _assert_whole_history(m: dict, epochs: int) -> None:
    assert m["status"] == "ok", m.get("error")
    assert [e["epoch"] for e in m["epochs"]] == list(range(epochs)), m["epochs"]


def test_a_sweep_on_slurm_writes_its_report_and_a_failed_job_keeps_its_row(tmp_path, cluster):
    sweep = tmp_path / "sweep"
    proc = _sweep(
        sweep,
        "model._target_=spies.ProbeNet",
        "~model.width",
        "+model.fail_in_forward=true,false",
        "trainer.max_epochs=2",
        "data.num_samples=64",
        "data.image_size=16",
        "checkpoint.enabled=false",
        "hydra.launcher.array_parallelism=2",  # side by side on the cluster's 2 CPUs, which it does not bind
    )
    out, _ = proc.communicate(timeout=300)
    rows = (sweep / "ab_report.csv").read_text().splitlines()
    assert len(rows) == 3 and ",failed," in rows[1] and ",ok," in rows[2], out[-3000:]
    assert "forward failed on purpose" in read_metrics(sweep / "0")["error"]
    # each job keeps to its one allocated CPU (SLURM_CPUS_ON_NODE), though it may run on both
    m = read_metrics(sweep / "1")
    assert m["intra_op_threads"] == 1 and m["diagnosis"]["evidence"]["cpu_cores"] == 1, m["diagnosis"]


def test_a_cancelled_sweep_job_keeps_a_failed_row(tmp_path, cluster):
    """scancel also sends SIGTERM, but no rerun comes: the job saves, returns its failed result, and
    the sweep ends with its report instead of waiting for a requeue."""
    sweep = tmp_path / "sweep"
    proc = _sweep(sweep, *RUN)
    _wait_for(sweep / "0" / "checkpoints" / "last.ckpt", proc)
    (job,) = _job_ids()
    _slurm("scancel", job)
    out, _ = proc.communicate(timeout=300)
    rows = (sweep / "ab_report.csv").read_text().splitlines()
    assert len(rows) == 2 and ",failed," in rows[1] and "preempted by SIGTERM" in rows[1], out[-3000:]


def _sbatch(tmp_path: Path, *args: str, tasks: int = 1, env: dict | None = None, name: str = "train") -> tuple:
    out = _slurm(
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        "--partition=debug",
        "--nodes=1",
        f"--ntasks-per-node={tasks}",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        "--time=10",
        f"--output={tmp_path}/slurm-%j.out",
        str(ROOT / "scripts/slurm/train.sbatch"),
        "accelerator=cpu",
        *args,
        env=env,  # sbatch passes its environment on to the job
    )
    job = out.strip().split(";")[0]
    return job, ROOT / "outputs" / f"slurm-{job}"


ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "PREEMPTED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def _wait_job_gone(job: str, timeout: float = 240) -> str:
    """The job's final accounting line, once it has left the queue *and* the accounting database has
    its end (slurmdbd records it a moment after squeue stops listing the job)."""
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        if job not in _job_ids():
            state = _slurm("sacct", "-X", "-n", "-j", job, "-o", "State,ExitCode").strip()
            if state and state.split()[0] in ENDED:
                return state
        time.sleep(0.5)
    raise AssertionError(f"job {job} not ended after {timeout} s (sacct: {state!r})")


def _array_task(sweep: Path, index: str) -> str:
    """The Slurm id of the sweep's job ``index`` ("12_1"): its submitit folder is named by it."""
    (folder,) = [p.name for p in (sweep / ".submitit").glob(f"*_{index}") if p.is_dir()]
    return folder


# job 1 of the preempted sweep trains in a process its submitit process starts (the allocator's relaunch)
JEMALLOC = find_allocator("jemalloc")


def _wait_for_signals(sweep: Path, proc: subprocess.Popen, signals: dict, deadline_s: float) -> None:
    """Send each job its signals in turn: the first once its first checkpoint exists, the next once
    it has been requeued, resumed and saved again, so each lands mid-training."""
    ready_after = {index: 0.0 for index in signals}  # a last.ckpt newer than this: the job trains on
    deadline = time.time() + deadline_s
    while any(signals.values()) and time.time() < deadline:
        for index, pending in signals.items():
            last = sweep / index / "checkpoints" / "last.ckpt"
            if not pending or ready_after[index] is None or not last.exists():
                continue
            if last.stat().st_mtime > ready_after[index]:
                _slurm(*pending.pop(0), _array_task(sweep, index))
                ready_after[index] = None  # until the requeued job says it resumed
        for index, pending in signals.items():
            if (
                pending
                and ready_after[index] is None
                and f"(restart {2 - len(pending)})" in _submitit_log(sweep, int(index))
            ):
                ready_after[index] = time.time()
        assert proc.poll() is None, f"the sweep ended before its jobs were signalled: {proc.stdout.read()[-3000:]}"
        time.sleep(0.1)
    assert not any(signals.values()), f"signals not sent within {deadline_s} s: {signals}"


@pytest.fixture(scope="module")
def preempted(tmp_path_factory, cluster):
    """Four preemptions in one two-job sweep, since each spends most of its time waiting on Slurm
    (the start, the requeue, the restart), not training. Each job is stopped twice, mid-run: by
    SIGUSR2, what submitit's jobs get signal_delay_s before their time limit (timeout_min <= 10:
    submitit treats it as a time-out), and by ``scontrol requeue`` (SIGTERM: what a preemption with
    PreemptMode=REQUEUE does). Job 0 gets them in that order and trains in submitit's process; job 1
    the other way round, with runtime.allocator=jemalloc, so that it trains in a process its
    submitit process starts, which must save before submitit requeues. Each job runs one intra-op
    thread on its one CPU (two threads each on two shared cores would slow both many times over)."""
    sweep = tmp_path_factory.mktemp("preempted") / "sweep"
    run = [a for a in RUN if JEMALLOC or not a.startswith("trainer.log_every_n_steps=")]
    proc = _sweep(
        sweep,
        *run,
        "runtime.allocator=default,jemalloc" if JEMALLOC else "trainer.log_every_n_steps=8,4",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.array_parallelism=2",
        env=ONE_THREAD,
    )
    time_limit, requeue = ("scancel", "--signal=USR2"), ("scontrol", "requeue")  # the array task's id is added
    try:
        _wait_for_signals(sweep, proc, {"0": [time_limit, requeue], "1": [requeue, time_limit]}, deadline_s=300)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        for folder in (sweep / ".submitit").glob("*_*"):  # nothing of this sweep left running on a failure
            subprocess.run(["scancel", folder.name], capture_output=True, timeout=30)
    return {"sweep": sweep, "returncode": proc.returncode, "out": out}


def _submitit_log(sweep: Path, index: int) -> str:
    return "".join(p.read_text() for p in (sweep / ".submitit").rglob(f"*_{index}_*_log.*"))


def _assert_resumed_to_the_same_weights(preempted, index: int, uninterrupted) -> str:
    sweep = preempted["sweep"]
    assert preempted["returncode"] == 0, preempted["out"][-3000:]
    _assert_whole_history(read_metrics(sweep / str(index)), 4)
    assert final_loss(sweep / str(index) / "checkpoints" / "last.ckpt") == pytest.approx(
        uninterrupted, rel=1e-4, abs=1e-5
    )
    rows = (sweep / "ab_report.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",ok," in row for row in rows[1:]), rows  # the report waited for every requeue
    return _submitit_log(sweep, index)


def test_a_sweep_job_stopped_at_its_time_limit_then_requeued_resumes_each_time_to_the_same_weights(
    preempted, uninterrupted
):
    log = _assert_resumed_to_the_same_weights(preempted, 0, uninterrupted)
    for said in ("SIGUSR2 received: saved", "this job is timed-out", "SIGTERM received: saved", "(restart 2)"):
        assert said in log, (said, log[-3000:])


@pytest.mark.skipif(not JEMALLOC, reason="jemalloc is not installed (Debian: libjemalloc2; .ci/run installs it)")
def test_a_sweep_job_training_in_a_process_it_started_saves_there_before_submitit_requeues_it(preempted, uninterrupted):
    """Slurm's SIGUSR2 reaches every process of the job: the one its submitit process started must
    not die of it unsaved (it is held from it, and stopped by SIGUSR1), and submitit requeues only once
    it has saved; after a SIGTERM stop the job leaves without a result, so the sweep waits for the rerun."""
    log = _assert_resumed_to_the_same_weights(preempted, 1, uninterrupted)
    for said in (
        "SIGTERM received: saved",  # the child, stopped by Slurm's SIGTERM (and its parent's)
        "leaving without a result for this attempt",
        "(restart 1)",
        "SIGUSR2 received: passing SIGUSR1 on to the job's processes",
        "SIGUSR1 received: saved",
        "the job's processes stopped (exit status 75); submitit requeues the job",
        "this job is timed-out",
        "(restart 2)",
    ):
        assert said in log, (said, log[-3000:])


def test_the_batch_script_requeues_itself_at_the_time_limit_signal_and_resumes(tmp_path, cluster, uninterrupted):
    """train.sbatch: SIGUSR1 to the job step (what --signal=USR1@120 sends) -> last.ckpt, exit 75,
    the script requeues the job, the rerun resumes; the same weights as straight through."""
    job, run_dir = _sbatch(tmp_path, *RUN, env=ONE_THREAD)
    try:
        _wait_for(run_dir / "checkpoints" / "last.ckpt", None)
        _slurm("scancel", "--signal=USR1", job)
        state = _wait_job_gone(job)
        script_log = (tmp_path / f"slurm-{job}.out").read_text()
        assert state.split()[0] == "COMPLETED", (state, script_log[-3000:])
        assert "requeueing job" in script_log and "(restart 1)" in script_log, script_log[-3000:]
        _assert_whole_history(read_metrics(run_dir), 4)
        assert final_loss(run_dir / "checkpoints" / "last.ckpt") == pytest.approx(uninterrupted, rel=1e-4, abs=1e-5)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_ddp_with_two_slurm_tasks_and_no_torchrun(tmp_path, cluster):
    """Named interactive (salloc's name for a job), which Lightning reads as "not started by srun": each
    task then started ranks of its own (four in two runs) unless told that srun's tasks are the ranks."""
    job, run_dir = _sbatch(
        tmp_path,
        "data.num_samples=256",
        "data.image_size=16",
        "trainer.max_epochs=2",
        "checkpoint.enabled=false",
        tasks=2,
        name="interactive",
    )
    try:
        state = _wait_job_gone(job)
        script_log = (tmp_path / f"slurm-{job}.out").read_text()
        assert state.split()[0] == "COMPLETED", (state, script_log[-3000:])
        m = read_metrics(run_dir)
        assert m["status"] == "ok" and m["device"]["count"] == 2 and m["flags"]["strategy"] == "ddp"
        assert not (run_dir / "ranks").exists()  # the ranks are Slurm's tasks: no torchrun of ours
        assert (run_dir / "train_rank1.log").exists()
        assert sorted(p.name for p in run_dir.glob("*.log")) == ["train.log", "train_rank1.log"]  # two ranks only
        assert not (run_dir / "metrics.failed.json").exists()
        assert "srun` command is available" not in script_log
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_launched_jobs_stop_grace_is_at_least_slurms(cluster, compose, monkeypatch):
    """A job whose ranks torchrun starts gives them checkpoint.stop_grace_s to save after a stop signal,
    or Slurm's own grace where that is longer: KillWait plus the job's partition's GraceTime, read from
    the cluster (scripts/slurm/local_cluster.sh sets 30 s and, on partition debug, 5 s)."""
    from trainer.launch.processes import stop_grace_s
    from trainer.launch.slurm import grace_s

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert grace_s() is None  # not inside a job
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "debug")
    assert grace_s() == 35
    assert stop_grace_s(compose("checkpoint.stop_grace_s=10")) == 35
    assert stop_grace_s(compose()) == 300
