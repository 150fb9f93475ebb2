"""Scale out on CPU with gloo: DDP, FSDP2, accumulation without sync, sweeps of distributed jobs, two nodes."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, clean_env, final_loss, read_metrics, run_cli

SMALL = [
    "data.num_samples=256",
    "data.image_size=16",
    "data.val_samples=32",
    "trainer.max_epochs=2",
    "model.width=8",
    "monitor.enabled=false",
]


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_ddp_two_processes_match_one_process_at_the_same_global_batch(tmp_path):
    """Also with progressive_resize: each rank resizes its own batches by the same schedule (8 px, then 16)."""
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    # no BatchNorm: per-rank batch statistics would differ from one process's (SyncBatchNorm is GPU-only)
    both = [*SMALL, "+model.batchnorm=false", "progressive_resize=true", "progressive.start_size=8"]
    r = run_cli(f"hydra.run.dir={single}", *both, "data.batch_size=16")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(
        f"hydra.run.dir={ddp}", *both, "strategy=ddp", "devices=2", "data.batch_size=8", "logger=[tensorboard,csv]",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = read_metrics(ddp)
    assert m["status"] == "ok" and m["device"]["count"] == 2
    assert m["epochs"][0]["samples"] == 256 and m["epochs"][0]["steps"] == 16  # samples summed over ranks
    assert (
        [e["image_size"] for e in m["epochs"]] == [8, 16] == [e["image_size"] for e in read_metrics(single)["epochs"]]
    )
    assert "max over ranks" in m["peak_memory_method"]
    a, b = (final_loss(d / "checkpoints" / "last.ckpt", batchnorm=False) for d in (single, ddp))
    assert a == pytest.approx(b, rel=2e-3), (a, b)
    assert (ddp / "train.log").exists() and (ddp / "train_rank1.log").exists()
    # the trackers hear rank 0 only: one row per epoch, one TensorBoard writer
    with open(ddp / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["perf/epoch_time_s"]]
    assert [int(row["step"]) for row in rows] == [e["epoch"] for e in m["epochs"]]
    assert len({p.name.split(".")[-2] for p in ddp.glob("events.out.tfevents.*")}) == 1  # one writing process


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_fsdp2_two_processes_train_save_and_resume(tmp_path):
    run_dir = tmp_path / "fsdp2"
    r = run_cli(f"hydra.run.dir={run_dir}", *SMALL, "strategy=fsdp2", "devices=2", "data.batch_size=8")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert read_metrics(run_dir)["status"] == "ok"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert state["net.fc.weight"].shape == (10, 32)  # consolidated, unsharded
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        *SMALL,
        "strategy=fsdp2",
        "devices=2",
        "data.batch_size=8",
        "ckpt_path=last",
        "trainer.max_epochs=3",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1, 2]


def test_accumulate_under_ddp_syncs_gradients_only_on_stepping_batches(train):
    import pytorch_lightning as pl
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    counts = {}

    class CountAllReduce(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            counts["n"] = 0

            def hook(state, bucket):
                counts["n"] += 1
                return allreduce_hook(state, bucket)

            trainer.strategy.model.register_comm_hook(None, hook)

    original = pl.Trainer.__init__

    def init(self, *a, callbacks=None, **kw):
        original(self, *a, callbacks=list(callbacks or []) + [CountAllReduce()], **kw)

    per_accumulate = {}
    for n in (1, 4):
        pl.Trainer.__init__ = init
        try:
            m, _ = train("strategy=ddp", "devices=1", f"accumulate={n}", "data.num_samples=128", "model.width=4")
        finally:
            pl.Trainer.__init__ = original
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        per_accumulate[n] = counts["n"]
    assert per_accumulate[1] > 0
    assert per_accumulate[1] == 4 * per_accumulate[4]  # 16 batches: 16 syncs vs 4 (one per optimizer step)


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_a_sweep_of_ddp_jobs_makes_one_sweep_dir(tmp_path):
    sweep = tmp_path / "multirun" / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        *SMALL,
        "strategy=ddp",
        "devices=2",
        "data.batch_size=8",
        "amp=false,true",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "multirun").iterdir()) == ["sweep"]  # no duplicate sweeps
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    for job in jobs:
        m = read_metrics(sweep / job)
        assert m["status"] == "ok" and m["device"]["count"] == 2
        assert (sweep / job / "checkpoints" / "last.ckpt").exists()
    assert "| world_size |" in (sweep / "ab_report.md").read_text().replace("| amp | world_size |", "| world_size |")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_two_nodes_with_torchrun_on_localhost(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "two_nodes"
    env = clean_env()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={rank}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                str(ROOT / "train.py"),
                f"hydra.run.dir={run_dir}",
                *SMALL,
                "strategy=ddp",
                "devices=1",
                "num_nodes=2",
                "data.batch_size=8",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["device"]["count"] == 2 and m["flags"]["num_nodes"] == 2


def test_more_cpu_processes_than_cores_is_refused(compose, monkeypatch):
    """...but not in one of srun's tasks, each a rank with its own task's CPUs: where Slurm binds tasks to
    their CPUs, each rank of `sbatch --ntasks-per-node=2 --cpus-per-task=1 ... accelerator=cpu` sees one."""
    from trainer.errors import ConfigError
    from trainer.measure.hardware import Hardware
    from trainer.switches import switchboard

    for key in ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=r"'devices=8'.*devices=1\.\.2"):
        switchboard.resolve(compose("strategy=ddp", "devices=8"), Hardware("cpu", "cpu", 1, 2, False, False))
    switchboard.resolve(compose("strategy=ddp", "devices=2"), Hardware("cpu", "cpu", 1, 2, False, False))
    one_core = Hardware("cpu", "cpu", 1, 1, False, False)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    switchboard.resolve(compose("strategy=ddp", "devices=2"), one_core)  # a task bound to its one CPU
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun's ranks in one task share its CPUs
    with pytest.raises(ConfigError, match=r"'devices=2'"):
        switchboard.resolve(compose("strategy=ddp", "devices=2"), one_core)


def test_strategy_auto_with_several_processes_runs_as_ddp_and_devices_minus_one_means_a_count(
    compose, train, monkeypatch
):
    """strategy=auto with devices=2 (or num_nodes=2) is Lightning's DDP; the job says so in its config, so
    that torchrun starts its ranks (Lightning's own launcher re-ran the command line: a second banner,
    a second sweep under -m). devices=-1 on a CPU is one process (Lightning refused -1 there)."""
    from trainer.launch import processes

    for key in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(key, raising=False)
    for overrides, strategy in (
        (("devices=2", "accelerator=cpu"), "ddp"),
        (("num_nodes=2", "accelerator=cpu"), "ddp"),
        (("devices=1", "accelerator=cpu"), "auto"),
        (("devices=-1", "accelerator=cpu"), "auto"),
        (("devices=2", "accelerator=cpu", "strategy=fsdp2"), "fsdp2"),
    ):
        cfg = compose(*overrides)
        processes.settle_strategy(cfg)
        assert cfg.strategy == strategy, overrides
    cfg = compose("devices=2", "accelerator=cpu")
    processes.settle_strategy(cfg)
    assert processes.launches_ranks(cfg)
    m, _ = train("devices=-1", "accelerator=cpu")
    assert m["status"] == "ok" and m["device"]["count"] == 1, m.get("error")
    # num_nodes=2 as a plain process is refused (tests/test_bad_input.py); where Lightning meets the other
    # nodes itself (NODE_RANK and MASTER_ADDR on each node: its general cluster) it is not
    from trainer.errors import ConfigError

    for key in ("NODE_RANK", "MASTER_ADDR", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "LSB_JOBID"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="'num_nodes=2' needs its processes started on every node"):
        processes.refuse_nodes_without_a_launcher(compose("num_nodes=2"))
    monkeypatch.setenv("NODE_RANK", "1")
    processes.refuse_nodes_without_a_launcher(compose("num_nodes=2"))


def test_a_ddp_job_in_a_slurm_batch_scripts_own_shell_starts_its_ranks_and_srun_tasks_are_the_ranks(
    compose, monkeypatch
):
    """The environments are a local cluster's, read with ``env`` in an sbatch --ntasks-per-node=2 job:
    its batch script's shell (SLURM_NTASKS=2, no job step), and one of srun's two tasks. Run in the
    shell, ``python train.py strategy=ddp devices=2`` is one process that must start its ranks itself
    (taken for a rank, it waited for a second rank nothing would start); srun's tasks are the ranks."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    from trainer.errors import ConfigError
    from trainer.launch import processes, slurm

    for key in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_"))] + ["LOCAL_RANK", "RANK"]:
        monkeypatch.delenv(key, raising=False)
    cfg = compose("strategy=ddp", "devices=2", "accelerator=cpu")
    batch_shell = {"SLURM_JOB_ID": "412", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "0"}
    for key, value in batch_shell.items():
        monkeypatch.setenv(key, value)
    assert not processes.inside_launcher() and processes.launches_ranks(cfg)
    assert slurm.srun_ranks_environment() is None  # Lightning chooses (torchrun's ranks: TorchElastic)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert processes.inside_launcher() and not processes.launches_ranks(cfg)
    # srun's tasks are the ranks, and Lightning is told so also where it would ignore Slurm: a job named
    # interactive (salloc's), where each task started ranks of its own (tests/test_slurm.py runs one)
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert isinstance(slurm.srun_ranks_environment(), SLURMEnvironment)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")  # srun -n 2: one paragraph, not Lightning's traceback
    with pytest.raises(ConfigError, match=r"--ntasks \(-n\) but no --ntasks-per-node"):
        slurm.srun_ranks_environment()
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # srun of one task: that task starts the ranks
    assert not processes.inside_launcher() and processes.launches_ranks(cfg)
    assert slurm.srun_ranks_environment() is None


def test_ddp_knobs_reach_the_strategy(compose):
    from trainer.measure.hardware import Hardware
    from trainer.switches import switchboard

    cfg = compose(
        "strategy=ddp", "devices=2", "ddp.static_graph=true", "ddp.gradient_as_bucket_view=true", "ddp.bucket_cap_mb=5",
        "ddp.broadcast_buffers=false",
    )  # fmt: skip
    hw = Hardware("cpu", "cpu", 1, 2, False, False)
    plan = switchboard.resolve(cfg, hw)
    strategy = switchboard.build_strategy(cfg, plan, hw, torch.nn.Linear(2, 2))
    assert strategy._ddp_kwargs == {
        "static_graph": True,
        "gradient_as_bucket_view": True,
        "find_unused_parameters": False,
        "forward_sync_buffers": False,  # torch 2.13's name (broadcast_buffers before it)
        "bucket_cap_mb": 5,
    }
    assert switchboard.trainer_kwargs(cfg, plan)["sync_batchnorm"] is False
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="sync_batchnorm=true' needs CUDA"):
        switchboard.resolve(compose("strategy=ddp", "devices=2", "sync_batchnorm=true"), hw)
    gpu = Hardware("cuda", "H100", 8, 16, True, True, "9.0")
    plan = switchboard.resolve(compose("strategy=ddp", "devices=2", "sync_batchnorm=true"), gpu)
    assert switchboard.trainer_kwargs(compose("sync_batchnorm=true"), plan)["sync_batchnorm"] is True


def test_a_default_ddp_run_passes_ddp_no_deprecated_argument(compose, tmp_path):
    """torch 2.13 deprecated DDP's ``broadcast_buffers`` for ``forward_sync_buffers``, with a FutureWarning
    in every run that passes it: the default (buffers synced before each forward, DDP's own default)
    passes neither, and DDP, built with the strategy's arguments, warns of nothing."""
    import warnings

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainer.measure.hardware import Hardware
    from trainer.switches import switchboard

    cfg = compose("strategy=ddp", "devices=2")
    hw = Hardware("cpu", "cpu", 1, 2, False, False)
    kwargs = switchboard.build_strategy(cfg, switchboard.resolve(cfg, hw), hw, torch.nn.Linear(2, 2))._ddp_kwargs
    assert not {"broadcast_buffers", "forward_sync_buffers"} & set(kwargs), kwargs
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            DistributedDataParallel(torch.nn.BatchNorm1d(3), **kwargs)
    finally:
        dist.destroy_process_group()
    assert not [w for w in seen if "deprecated" in str(w.message)], [str(w.message) for w in seen]


@pytest.mark.whole_machine  # two ranks: one core each
def test_a_distributed_job_refused_before_launch_keeps_its_report_row(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        *SMALL,
        "strategy=ddp",
        "devices=2",
        "data.batch_size=auto,8",
        "trainer.max_epochs=1",
        cwd=tmp_path,
    )
    assert r.returncode == 1
    failed = read_metrics(sweep / "0")
    assert failed["status"] == "failed" and "single-process only" in failed["error"]
    assert read_metrics(sweep / "1")["status"] == "ok"
    assert ",failed," in (sweep / "ab_report.csv").read_text()


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_a_failing_rank_gives_the_same_paragraph_and_exit_code_as_one_process(tmp_path):
    """Rank 1 alone fails (at init) while rank 0 builds on: torchrun stops rank 0 with SIGTERM, and the
    job still answers with rank 1's paragraph, its exit code, and its answer in metrics.json."""
    bad = [
        "model._target_=rank_spies.RankFailNet",
        "data.image_size=16",
        "data.num_samples=64",
        "trainer.max_epochs=1",
    ]
    one = run_cli(f"hydra.run.dir={tmp_path / 'one'}", *bad, "+model.fail_rank=0")
    two = run_cli(f"hydra.run.dir={tmp_path / 'two'}", *bad, "+model.fail_rank=1", "strategy=fsdp2", "devices=2")
    assert one.returncode == two.returncode == 2, two.stderr[-3000:]
    paragraph = next(line for line in one.stderr.splitlines() if line.startswith("error: "))
    assert "ProbeNet asked to fail" in paragraph
    assert two.stderr.count(paragraph) == 1  # the same words, once
    assert "Traceback" not in two.stderr + two.stdout and "ChildFailedError" not in two.stderr + two.stdout
    assert list((tmp_path / "two" / "ranks").glob("**/stderr.log"))  # the ranks' full output is kept
    # rank 0 was stopped by torchrun, not failed: the job's record is rank 1's answer (trainer.torchrun
    # hands it to the launching process), not rank 0's "stopped by SIGTERM"
    failed = read_metrics(tmp_path / "two")
    assert failed["status"] == "failed" and failed["error"] == f"{read_metrics(tmp_path / 'one')['error']} (rank 1)"


def test_a_rank_stopped_because_another_failed_keeps_its_epochs_under_the_failed_ranks_answer(tmp_path, compose):
    """torchrun stops the other ranks with SIGTERM once one fails: rank 0's record keeps its epochs and
    takes the failed rank's answer as its error (the answer itself comes through torchrun: the test above)."""
    from trainer.cli import _record_failure
    from trainer.measure import metrics

    cfg = compose()
    stopped = metrics.build(
        status="failed", error="stopped by SIGTERM before training started (nothing to save)", recipe=None,
        flags={}, device=None, epochs=[{"epoch": 0, "time_s": 1.0}], summary={}, peak_memory=None,
        train_loss=None, val_acc=None,
    )  # fmt: skip
    metrics.write(str(tmp_path / "metrics.json"), stopped)
    answer = "ProbeNet asked to fail (model init). (rank 1)"
    _record_failure(str(tmp_path), cfg, [], "its processes exited with status 2", rank_error=answer)
    m = metrics.read(str(tmp_path / "metrics.json"))
    assert m["status"] == "failed" and m["error"] == answer and m["epochs"] == stopped["epochs"]
    _record_failure(str(tmp_path / "fresh"), cfg, [], "its processes exited with status 2", rank_error=answer)
    assert metrics.read(str(tmp_path / "fresh" / "metrics.json"))["error"] == answer


def test_a_launched_job_that_dies_keeps_the_epochs_its_journal_recorded(tmp_path, compose):
    """A launched job whose ranks die without a record of their own (killed, out of memory) leaves
    rank 0's journal (status running, the finished epochs): the failure is written over its status
    and error only, never over the epochs it finished."""
    from trainer.cli import _record_failure
    from trainer.measure import metrics

    journal = metrics.build(
        status="running", error=None, recipe=None, flags={"amp": False}, device={"accelerator": "cpu"},
        epochs=[{"epoch": 0, "time_s": 1.0}, {"epoch": 1, "time_s": 0.9}], summary={"epoch_time_s": 0.9},
        peak_memory=None, train_loss=2.1, val_acc=0.4,
    )  # fmt: skip
    metrics.write(str(tmp_path / "metrics.json"), journal)
    _record_failure(str(tmp_path), compose(), [], "its processes exited with signal 9 (SIGKILL)")
    m = metrics.read(str(tmp_path / "metrics.json"))
    assert m["status"] == "failed" and m["error"] == "its processes exited with signal 9 (SIGKILL)"
    assert m["epochs"] == journal["epochs"] and m["val_acc"] == 0.4 and m["flags"] == {"amp": False}


# a launched 2-rank job slow enough to be mid-epoch when a stop comes: 64 steps per rank of at least 80 ms
SLOW_DDP = [
    "data=custom",
    "data.dataset._target_=spies.SlowDataset",
    "+data.dataset.n=512",
    "+data.dataset.sleep_ms=20",
    "data.val_samples=0",
    "trainer.limit_val_batches=0",
    "data.image_size=16",
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "monitor.enabled=false",
    "strategy=ddp",
    "devices=2",
]


def _job_processes(run_dir) -> list:
    """The pids of every process still running this job (its command line names the run dir): the
    launcher, torchrun's agent, the ranks (torchrun starts each in a session of its own)."""
    import os

    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = open(f"/proc/{entry.name}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if f"hydra.run.dir={run_dir}\0" in cmdline + "\0":
                pids.append(int(entry.name))
    return pids


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
@pytest.mark.parametrize("signal_name", ["SIGUSR1"])
def test_a_stop_signal_to_the_launching_process_stops_every_rank_at_one_step_and_they_save(tmp_path, signal_name):
    """A scheduler signals the train.py it started (SIGUSR1: Slurm's --signal=USR1@...): it passes the
    signal to torchrun's agent, which passes it to every rank; the ranks stop at one step, save once,
    and the job exits as one process does, with 75. Rank 0's model sends the signal to the launcher at
    its 3rd step. (SIGTERM, a cloud's preemption, is test_distributed_stop.py's, during a validation
    longer than torchrun's own window.)"""
    import os
    import signal

    from trainer.launch.stopping import PREEMPTED_EXIT_CODE

    run_dir, output = tmp_path / "run", tmp_path / "output.txt"
    with open(output, "w") as console:  # a file, not a pipe: ranks left behind would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *SLOW_DDP,
             "model._target_=rank_spies.StopSignalNet", "+model.to=launcher", "+model.at=[3]",
             f"+model.signal_name={signal_name}"],
            cwd=ROOT, env=clean_env(), stdout=console, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        proc.wait(timeout=300)
        left = _job_processes(run_dir)  # the moment the launcher has ended
        out = output.read_text()
    finally:
        for pid in [proc.pid, *_job_processes(run_dir)]:  # a hang, or ranks left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"ranks still running after the launcher ended: {left}"
    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-4000:]
    m = read_metrics(run_dir)
    assert m["status"] == "failed" and m["preempted"] is True, m.get("error")
    step = int(m["error"].split("at step ")[1].split(";")[0])
    assert f"preempted by {signal_name} at step {step};" in m["error"] and 3 <= step < 64, m["error"]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == step
    for log_name in ("train.log", "train_rank1.log"):  # each rank got the signal and saved at that step
        text = (run_dir / log_name).read_text()
        assert f"{signal_name} received: saved {run_dir / 'checkpoints' / 'last.ckpt'} at step {step}" in text, (
            log_name,
            text[-2000:],
        )


def test_only_rank_0_records_a_run_that_failed_before_its_trainer_existed(compose, tmp_path, monkeypatch):
    """Every rank records its failure, and before Lightning's Trainer exists none knows it is not rank 0
    from the Trainer: the launcher's rank (RANK) decides, so the ranks do not race to write one file."""
    from trainer.run import run

    args = ["model._target_=spies.ProbeNet", "+model.fail_when=init", "data.image_size=16", "data.num_samples=32"]
    for rank, written in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        out = tmp_path / f"rank{rank}"
        with pytest.raises(Exception, match="ProbeNet asked to fail"):
            run(compose(*args), str(out), args)
        assert (out / "metrics.json").exists() == written, rank


def test_trainer_torchrun_help_prints_its_usage_and_torchruns_options():
    """``python -m trainer.torchrun --help`` took ``--help`` for LOG_DIR (torchrun's --log-dir) and ended in
    torchrun's "argument --log-dir/--log_dir: expected one argument"."""
    from forked_python import run_python

    r = run_python(["-m", "trainer.torchrun", "--help"], ROOT, clean_env())
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-2000:]
    assert r.stdout.startswith("usage: python -m trainer.torchrun LOG_DIR"), r.stdout[:500]
    assert "--nproc-per-node" in r.stdout and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in r.stdout


# a rank that ignores SIGTERM (blocked in C++ on a failed peer, or saving for minutes)
SIGTERM_IGNORED = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"


def _graces_of_the_agents_closes(monkeypatch) -> list:
    """trainer.torchrun's graces installed in this process (the agent), and the grace each close of
    the ranks' process context gets, recorded in the returned list; both undone after the test."""
    from torch.distributed.elastic.multiprocessing.api import PContext, SubprocessContext

    from trainer.launch import torchrun

    monkeypatch.setattr(PContext, "close", PContext.close)
    torchrun._grace_by_cause()
    graces = []
    real_close = SubprocessContext._close

    def spy(self, death_sig, timeout=30):
        graces.append(timeout)
        real_close(self, death_sig=death_sig, timeout=timeout)

    monkeypatch.setattr(SubprocessContext, "_close", spy)
    return graces


def _ranks_of_an_agent(tmp_path, args: list):
    """Python processes started as torchrun's agent starts its ranks (one per ``args`` entry)."""
    import os

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    return start_processes(
        "ranks",
        sys.executable,
        args=dict(enumerate(args)),
        envs={rank: dict(os.environ) for rank in range(len(args))},
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
    )


def test_after_a_rank_fails_the_others_get_a_short_grace_before_sigkill(tmp_path, monkeypatch):
    """torchrun's process context closes the other ranks of a failed job with its default grace (30 s
    between SIGTERM and SIGKILL); a rank blocked in C++ on the failed one cannot react to SIGTERM, so
    the job's answer waited those 30 s. trainer.torchrun makes it FAILURE_GRACE_S for a failure (a
    stop signal's grace is the next test's)."""
    import signal

    from trainer.launch import torchrun

    graces = _graces_of_the_agents_closes(monkeypatch)
    pc = _ranks_of_an_agent(tmp_path, [("-c", SIGTERM_IGNORED), ("-c", "import sys; sys.exit(2)")])
    result = pc.wait(timeout=60)
    assert result is not None and result.is_failed() and result.failures[1].exitcode == 2
    assert graces[0] == torchrun.FAILURE_GRACE_S < 30
    assert result.failures[0].exitcode == -signal.SIGKILL  # the stubborn rank was ended after the grace


def test_a_signalled_agent_gives_its_ranks_the_stop_grace_and_a_second_ctrl_c_ends_them(tmp_path, monkeypatch):
    """torchrun's agent, signalled, passes the signal to its ranks and closes them with a grace before
    SIGKILL: torch < 2.12 passes none (its default was 30 s); trainer.torchrun gives them
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT, as torch >= 2.12 does. While they save, the stop signal again (a
    scheduler signals every process of the job, and train.py passes its own on) neither cuts the grace
    short nor reaches the agent's own handler; a second Ctrl-C ends them at once. Here this process is
    the agent, and its rank ignores SIGTERM as if its save took minutes."""
    import os
    import signal
    import threading
    import time

    from trainer.launch import torchrun

    monkeypatch.setenv(torchrun.STOP_GRACE_ENV, "60")
    graces, reached_the_agent = _graces_of_the_agents_closes(monkeypatch), []
    pc = _ranks_of_an_agent(tmp_path, [("-c", SIGTERM_IGNORED)])  # as if its save took minutes
    time.sleep(1)  # the rank has set its handler
    # the agent's own handlers (torch's raise SignalException, which would end its wait for the ranks)
    agents = {
        s: signal.signal(s, lambda signum, frame: reached_the_agent.append(signum))
        for s in (signal.SIGTERM, signal.SIGINT)
    }
    timers = [threading.Timer(t, os.kill, (os.getpid(), s)) for t, s in ((0.5, signal.SIGTERM), (1.5, signal.SIGINT))]
    try:
        for timer in timers:
            timer.start()
        started = time.monotonic()
        pc.close(signal.SIGTERM)  # as torch < 2.12's agent calls it: no grace of its own
        took = time.monotonic() - started
    finally:
        for timer in timers:
            timer.cancel()
        for s, handler in agents.items():
            signal.signal(s, handler)
    assert graces == [60]
    assert reached_the_agent == []
    assert 1 < took < 20, took  # the second Ctrl-C ended the rank, not the grace


def test_a_second_ctrl_c_leaves_the_launcher_waiting_for_its_job_to_end(monkeypatch):
    """Ctrl-C in a terminal reaches the launching train.py and its job's process (torchrun's agent)
    together, twice for a second Ctrl-C: the agent then ends the ranks at once, and the launcher
    waits for that and answers with the job's code, not a KeyboardInterrupt traceback. Here a child
    stands for the agent: it ends at its second SIGINT."""
    import os
    import signal
    import threading

    from trainer.launch import processes, stopping

    agent = (
        "import signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda s, f: got.append(s) or (len(got) == 2 and sys.exit(130)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"

    def ctrl_c() -> None:  # what a terminal does: the whole foreground process group
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(child.pid, signal.SIGINT)

    timers = [threading.Timer(t, ctrl_c) for t in (0.3, 1.0)]
    stopping.clear()
    stopping.install()
    try:
        for timer in timers:
            timer.start()
        code = processes._wait_forwarding_stop(child)
    except KeyboardInterrupt:
        code = "KeyboardInterrupt"
    finally:
        for timer in timers:
            timer.cancel()
        stopping.uninstall_all()
        stopping.clear()
        child.kill()
        child.wait()
    assert code == 130


def test_a_launched_process_killed_by_a_signal_gives_the_shells_exit_status():
    """128 + the signal's number, as torchrun's agent gives it and the README says (Python's negative
    code through sys.exit came out as 244 for SIGUSR2)."""
    from trainer.launch import processes

    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR2)"])
    assert processes._wait_forwarding_stop(child) == 128 + 12
    assert processes._wait_forwarding_stop(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])) == 3


def test_the_journal_written_after_each_epoch_reads_no_metric_lightning_reduces_across_ranks(train, monkeypatch):
    """metrics.json's running record is written by rank 0 alone, from an epoch-end hook: reading
    ``trainer.callback_metrics`` there computes the epoch's ``sync_dist`` metrics, an all-reduce the
    other ranks do not enter at that point. With no validation in the epoch (here limit_val_batches=0)
    the record fell back to reading val_acc from it. Checked in one process: where it is read from."""
    import inspect

    import pytorch_lightning as pl

    from trainer.callbacks import EpochTimer

    read_by_journal = []
    original = pl.Trainer.callback_metrics

    def spied(self):
        if any(
            f.function == "_publish" and isinstance(f.frame.f_locals.get("self"), EpochTimer) for f in inspect.stack()
        ):
            read_by_journal.append(True)
        return original.fget(self)

    monkeypatch.setattr(pl.Trainer, "callback_metrics", property(spied))
    metrics, _ = train("trainer.max_epochs=2", "trainer.limit_val_batches=0")
    assert metrics["status"] == "ok" and len(metrics["epochs"]) == 2
    assert not read_by_journal, "the epoch-end journal read trainer.callback_metrics (a collective under DDP)"


def _fsdp1_one_step(rank: int, port: int, out: str) -> None:
    """One rank: the same small CNN, channels-last, plain and under FSDP1 (as strategy=fsdp wraps it:
    use_orig_params) sharded and unsharded; the largest weight difference after one SGD step."""
    import copy
    import json
    import os

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4))
    x = torch.randn(2, 3, 8, 8)  # the same on both ranks: their averaged gradient is the plain model's
    found = {}
    for sharding in ("FULL_SHARD", "NO_SHARD"):
        plain = copy.deepcopy(net).to(memory_format=torch.channels_last)
        wrapped = FSDP(
            copy.deepcopy(net).to(memory_format=torch.channels_last),
            use_orig_params=True,
            device_id=torch.device("cpu"),
            sharding_strategy=getattr(ShardingStrategy, sharding),
        )
        for model in (plain, wrapped):
            model(x).sum().backward()
            torch.optim.SGD(model.parameters(), lr=1.0, foreach=True).step()
        with FSDP.summon_full_params(wrapped):
            found[sharding] = (wrapped.module[0].weight - plain[0].weight).abs().max().item()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(found, f)
    torch.distributed.destroy_process_group()
    # the measurement is written: leave without the interpreter's teardown, where torch sometimes aborted a
    # rank that had run FSDP on gloo after every line here had run ("terminate called without an active
    # exception", in about 1 of 7 runs under pytest)
    os._exit(0)


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_fsdp1_trains_channels_last_weights_right_only_when_it_shards(tmp_path):
    """Why strategy=fsdp channels_last=true is refused where FSDP1 would not shard (one GPU, NO_SHARD): there
    torch gives a channels-last weight its gradient in the wrong element order, and the step trains on it
    without an error; sharded, it matches the plain model. If torch fixes the unsharded case, this fails:
    lift the refusal (switches/switchboard.py) then."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "found.json"
    torch.multiprocessing.spawn(_fsdp1_one_step, args=(port, str(out)), nprocs=2)
    found = json.loads(out.read_text())
    assert found["FULL_SHARD"] < 1e-6, found  # sharded: the plain model's step
    assert found["NO_SHARD"] > 0.1, found  # unsharded: weights moved by gradients on the wrong elements
