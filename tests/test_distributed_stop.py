"""A stop signal that reaches the ranks of a multi-process job at different steps (a scheduler signals
each node on its own clock): every rank stops at one agreed step, last.ckpt is saved once, the job
resumes. Also two torchrun agents as two nodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest
import torch
from conftest import ROOT, clean_env, read_metrics, run_cli

from trainer.launch.checkpointing import PREEMPTED_EXIT_CODE

# 32 steps per epoch per rank (256 samples, 2 ranks, batch 4): a stop lands well inside epoch 0
RUN = [
    "data.num_samples=256",
    "data.image_size=16",
    "data.val_samples=32",
    "data.batch_size=4",
    "trainer.max_epochs=2",
    "monitor.enabled=false",
    "checkpoint.every_n_epochs=1",
    "model._target_=spies.SignalNet",
    "strategy=ddp",
]


def _saved_step(run_dir) -> int:
    return int(torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"])


def _stopped_at(m) -> int:
    assert m["status"] == "failed" and m.get("preempted") is True, m.get("error")
    return int(m["error"].split("at step ")[1].split(";")[0])


def _start(*cmd: str):
    """A command in a session of its own (so that a hang can be killed with every process it started;
    forked_python.start_python)."""
    from forked_python import start_python

    return start_python(list(cmd), ROOT, clean_env(), new_session=True)


def _communicate(procs, timeout: float = 240):
    """Every process's output; if any still runs after ``timeout`` (a hang), all are killed, and the test fails."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError("the ranks hung after the stop signal") from None
    return outs


def _stops_at_one_step(proc, out, run_dir) -> int:
    """Both ranks stopped at the same step after saving last.ckpt once; that step."""
    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-4000:]
    m = read_metrics(run_dir)
    step = _stopped_at(m)
    assert step < 32, m["error"]  # inside epoch 0: at a step boundary soon after the first signal
    assert _saved_step(run_dir) == step
    for log_name in ("train.log", "train_rank1.log"):  # each rank logged its own save, at the same step
        text = (run_dir / log_name).read_text()
        assert f"saved {run_dir / 'checkpoints' / 'last.ckpt'} at step {step}" in text, (log_name, text[-2000:])
    assert "Traceback" not in out, out[-4000:]
    return step


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
@pytest.mark.parametrize(
    "signal_name, at",
    [("SIGTERM", "[9,3]"), ("SIGINT", "[3,4]")],
    ids=["sigterm-rank1-first", "ctrl-c-one-step-apart"],
)
def test_ranks_signalled_steps_apart_stop_at_one_step_and_save_once(tmp_path, signal_name, at):
    """The built-in classifier (SignalNet signals from its forward)."""
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", *RUN, "devices=2", f"+model.signal_name={signal_name}", f"+model.at={at}"]
    proc = _start(str(ROOT / "train.py"), *args)
    (out,) = _communicate([proc])
    _stops_at_one_step(proc, out, run_dir)


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_two_ranks_stopped_apart_resume_and_agree_without_a_blocking_read_per_step(tmp_path):
    """SIGUSR1 to rank 0 six steps before rank 1 (a user's own LightningModule): one stop, one save; the
    resumed run then trains its 60 remaining steps per rank with one agreement round per step, no
    broadcast (Lightning's per-step broadcast of the stop flag, read back with ``.item()``: a host-GPU
    sync per step on GPUs, one per step before), and reads of the previous step's all-reduce that
    almost never had to wait."""
    import json

    run_dir = tmp_path / "run"
    args = [
        f"hydra.run.dir={run_dir}", *[a for a in RUN if not a.startswith("model.")], "devices=2",
        "model._target_=spies.SignalWatchedModule", "~model.width", "+model.signal_name=SIGUSR1",
    ]  # fmt: skip
    proc = _start(str(ROOT / "train.py"), *args, "+model.at=[3,9]")
    (out,) = _communicate([proc])
    step = _stops_at_one_step(proc, out, run_dir)

    resumed = run_cli(*args, "+model.at=[]", "ckpt_path=last")  # no signal this time
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1]
    assert _saved_step(run_dir) == 64
    for rank in (0, 1):
        seen = json.loads((run_dir / f"step_loop_rank{rank}.json").read_text())
        assert seen["steps"] == 64 - step >= 50 and seen["rounds"] == seen["steps"], seen  # one round per step
        assert seen["broadcasts"] == 0, seen
        # a read waits only when the other rank is a whole step behind: now and then on a busy machine (3 of 60
        # seen on 2 cores), where a read of the all-reduce just started would wait at nearly every step
        assert seen["blocked"] <= seen["rounds"] // 10, seen


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_two_nodes_signalled_steps_apart_stop_at_one_step(tmp_path):
    """Two torchrun agents as two nodes on this machine (c10d rendezvous on 127.0.0.1), SIGUSR1 reaching
    node 0's rank 6 steps before node 1's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "two_nodes"
    nodes = [
        _start(
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            str(ROOT / "train.py"),
            f"hydra.run.dir={run_dir}",
            *RUN,
            "devices=1",
            "num_nodes=2",
            "+model.signal_name=SIGUSR1",
            "+model.at=[3,9]",
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outs = _communicate(nodes)
    assert [n.returncode for n in nodes] != [0, 0], outs[0][-2000:]
    m = read_metrics(run_dir)
    step = _stopped_at(m)
    assert step < 32 and _saved_step(run_dir) == step, m["error"]
    for out in outs:  # each node's rank says where it stopped: the same step
        assert f"preempted by SIGUSR1 at step {step};" in out, out[-3000:]
