"""A stop signal that reaches the ranks of a multi-process job at different steps (a scheduler signals
each node on its own clock): every rank stops at one agreed step, last.ckpt is saved once, the job
resumes. Also a stop during a validation longer than torchrun's own window, and two torchrun agents
as two nodes, signalled seconds apart. No test leaves a rank running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
import torch
from conftest import ROOT, clean_env, read_metrics, run_cli

from trainer.launch.stopping import PREEMPTED_EXIT_CODE

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
    """Every process's output. If any still runs after ``timeout`` (a hang), what each process under it
    was doing is printed, all of them end, and the test fails."""
    from hang_report import end_hung

    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                end_hung(p.pid, [])
        raise AssertionError("the ranks hung after the stop signal") from None
    return outs


@pytest.fixture(autouse=True)
def _no_rank_outlives_its_test(tmp_path):
    """torchrun starts each rank in a session of its own, so neither a kill of the command's session nor
    the end of the commands a test forked (conftest) reaches a rank, and a rank whose agent is gone is
    no process's child: whatever still runs with this test's dir on its command line ends here."""
    yield
    import psutil

    left = _processes_of(tmp_path)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


def _processes_of(path) -> list:
    """The processes still running with ``path`` on their command line (a job's agent and ranks name its run dir)."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if any(str(path) in a for a in p.info["cmdline"] or ())]


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


VALIDATION_S = 35  # longer than torchrun's own window after a stop signal (30 s)
STEPS = 64 // 2 // 4  # per rank and epoch, for _validating_run's 64 samples on two ranks


def _validating_run(run_dir, marker, *more: str) -> list:
    """RUN's arguments with 8 steps per rank and epoch, and a model whose first validation a test makes
    last (``+model.val_s=``) and can see start (``marker``): spies.SlowValidationModule."""
    keep = [a for a in RUN if not a.startswith(("model.", "data.num_samples"))]
    model = ["model._target_=spies.SlowValidationModule", "~model.width", f"+model.marker={marker}"]
    return [f"hydra.run.dir={run_dir}", *keep, "data.num_samples=64", *model, *more]


def _wait_for(path, proc, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_sigterm_to_the_launcher_during_a_long_validation_saves_and_resumes(tmp_path):
    """SIGTERM to the launching train.py while its two ranks validate for 35 s. torchrun's agent passes
    it on, and with its own 30 s window it ended the ranks with SIGKILL before they reached a step to
    save at (exit 143, no last.ckpt, no record); checkpoint.stop_grace_s gives them the time. They stop
    at one step early in the next epoch, save once, and the resumed run trains exactly the steps left."""
    import json

    run_dir, marker = tmp_path / "run", tmp_path / "validating"
    args = _validating_run(run_dir, marker, "devices=2")
    proc = _start(str(ROOT / "train.py"), *args, f"+model.val_s={VALIDATION_S}")
    _wait_for(marker, proc)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    (out,) = _communicate([proc])
    assert not _processes_of(run_dir), "the launcher ended before the job's processes"
    step = _stops_at_one_step(proc, out, run_dir)
    assert time.monotonic() - signalled > 30  # the stop did outlast torchrun's own window
    assert STEPS < step <= STEPS + 2, step  # the steps after the validation: one or two, as agreed
    assert "preempted by SIGTERM" in read_metrics(run_dir)["error"]

    resumed = run_cli(*args, "ckpt_path=last")  # no slow validation: the run resumes in the next epoch
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1]
    assert _saved_step(run_dir) == 2 * STEPS
    for rank in (0, 1):
        assert json.loads((run_dir / f"step_loop_rank{rank}.json").read_text())["steps"] == 2 * STEPS - step


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_two_nodes_signalled_seconds_apart_stop_at_one_step_and_resume(tmp_path):
    """Two torchrun agents as two nodes on this machine, meeting by c10d rendezvous on 127.0.0.1. Ctrl-C
    reaches node 0's agent during a 6 s validation and node 1's 3 s later, as from each node's
    terminal; each agent passes it to its rank, both ranks stop at the one step they agree on,
    last.ckpt is saved once, and both nodes resume from it."""
    import json

    run_dir, marker = tmp_path / "two_nodes", tmp_path / "validating"
    args = _validating_run(run_dir, marker, "devices=1", "num_nodes=2")

    def nodes(*more: str) -> list:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=two-nodes-{port}"]
        return [
            _start(
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                *rendezvous,
                str(ROOT / "train.py"),
                *args,
                *more,
            )
            for _ in range(2)
        ]

    first = nodes("+model.val_s=6")
    _wait_for(marker, first[0])
    os.killpg(first[0].pid, signal.SIGINT)  # Ctrl-C in node 0's terminal: its agent's process group
    time.sleep(3)
    os.killpg(first[1].pid, signal.SIGINT)
    outs = _communicate(first)
    assert [n.returncode for n in first] != [0, 0], outs[0][-2000:]
    m = read_metrics(run_dir)
    step = _stopped_at(m)
    assert STEPS < step <= STEPS + 2 and _saved_step(run_dir) == step, m["error"]
    for out in outs:  # each node's rank says where it stopped: the same step
        assert f"stopped by Ctrl-C (SIGINT) at step {step};" in out, out[-3000:]

    resumed = nodes("ckpt_path=last")
    outs = _communicate(resumed)
    assert [n.returncode for n in resumed] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1]
    assert _saved_step(run_dir) == 2 * STEPS
    for rank in (0, 1):
        assert json.loads((run_dir / f"step_loop_rank{rank}.json").read_text())["steps"] == 2 * STEPS - step
