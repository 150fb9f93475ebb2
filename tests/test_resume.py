"""Checkpoints, resume and failure: no run is lost, no bad input crashes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, clean_env, final_loss, read_metrics, run_cli

LONG = ["data.num_samples=1024", "data.batch_size=8", "data.image_size=16", "data.val_samples=16", "trainer.max_epochs=3", "trainer.log_every_n_steps=8", "model.width=8"]


def _popen(*args: str) -> subprocess.Popen:
    env = clean_env()
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(pattern: str, directory: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not list(directory.glob(pattern)):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)


@pytest.mark.slow
def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run_cli(f"hydra.run.dir={straight}", *LONG, "checkpoint.every_n_steps=7")
    assert r.returncode == 0, r.stderr[-3000:]

    proc = _popen(f"hydra.run.dir={killed}", *LONG, "checkpoint.every_n_steps=7")
    _wait_for("step*.ckpt", killed / "checkpoints", proc)
    time.sleep(random.uniform(0.0, 1.0))  # a random point in training
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "metrics.json").exists() or read_metrics(killed)["status"] != "ok"

    r = run_cli(f"hydra.run.dir={killed}", *LONG, "checkpoint.every_n_steps=7", "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = read_metrics(killed)
    assert resumed["status"] == "ok" and resumed["resumed_from"].endswith(".ckpt")
    assert [e["epoch"] for e in resumed["epochs"]][-1] == 2
    a, b = final_loss(straight / "checkpoints" / "last.ckpt"), final_loss(killed / "checkpoints" / "last.ckpt")
    assert a == pytest.approx(b, rel=1e-4, abs=1e-5), (a, b)


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_with_the_preemption_code_then_resumes(tmp_path):
    from trainer.checkpointing import PREEMPTED_EXIT_CODE

    run_dir = tmp_path / "run"
    proc = _popen(f"hydra.run.dir={run_dir}", *LONG, "checkpoint.every_n_steps=7")
    _wait_for("step*.ckpt", run_dir / "checkpoints", proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
    assert "preempted by SIGTERM" in out and "Traceback" not in out
    m = read_metrics(run_dir)
    assert m["status"] == "failed" and m["preempted"] is True
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    r = run_cli(f"hydra.run.dir={run_dir}", *LONG, "checkpoint.every_n_steps=7", "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_metrics(run_dir)["status"] == "ok"


def test_compiled_checkpoints_have_clean_keys_and_load_either_way(train, tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    compiled, out_c = train("compile=true", "checkpoint.enabled=true")
    state = torch.load(out_c / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert state and not any("_orig_mod" in k for k in state)
    eager, out_e = train("compile=false", "checkpoint.enabled=true", f"ckpt_path={out_c / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=2")
    assert eager["status"] == "ok" and eager["epochs"][-1]["epoch"] == 1
    again, _ = train("compile=true", "checkpoint.enabled=true", f"ckpt_path={out_e / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=3")
    assert again["status"] == "ok" and again["epochs"][-1]["epoch"] == 2


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, train):
    from trainer.errors import ConfigError

    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "boom": _Payload()}, evil)
    with pytest.raises(ConfigError, match="Refused to load checkpoint") as e:
        train(f"ckpt_path={evil}")
    assert str(evil) in str(e.value)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_truncated_last_checkpoint_falls_back_to_the_previous_good_one(train, tmp_path):
    first, out = train("checkpoint.enabled=true", "checkpoint.keep_last_k=-1", "trainer.max_epochs=2")
    ckpts = out / "checkpoints"
    last = ckpts / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # a torn write
    os.utime(last, None)
    from trainer.checkpointing import resolve_ckpt_path
    from trainer.errors import ConfigError

    chosen = resolve_ckpt_path("last", str(out))
    assert chosen != str(last) and chosen.endswith(".ckpt")
    with pytest.raises(ConfigError, match="truncated or corrupt") as e:
        resolve_ckpt_path(str(last), str(out))
    assert str(last) in str(e.value)


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from trainer.checkpointing import AtomicCheckpointIO, CheckpointSaveError

    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(3)}, target)
    good = target.read_bytes()

    def full_disk(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointSaveError, match="the disk is full"):
        io.save_checkpoint({"w": torch.zeros(3)}, target)
    assert target.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temp file left behind


def test_nan_loss_stops_with_the_step_and_last_checkpoint(train):
    from trainer.errors import TrainingStopped

    with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 1;.*Last good checkpoint: none saved yet"):
        train("on_nan=stop", "model._target_=probe.ProbeNet", "~model.width", "+model.nan_after=1")


def test_nan_loss_skip_skips_the_steps(train):
    m, _ = train("on_nan=skip", "model._target_=probe.ProbeNet", "~model.width", "+model.nan_after=3")
    assert m["status"] == "ok" and m["nan_skipped_steps"] == 8 - 3


def _folder_with_a_corrupt_image(root: Path) -> None:
    from PIL import Image

    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (24, 24), (100 * (cls == "a"), 20 * i, 50)).save(root / cls / f"{i}.jpg")
    (root / "a" / "3.jpg").write_bytes(b"not a jpeg at all")


def test_corrupt_image_is_skipped_and_counted(train, tmp_path):
    _folder_with_a_corrupt_image(tmp_path / "imgs")
    m, _ = train("data=imagefolder", f"data.root={tmp_path / 'imgs'}", "data.val_split=0", "data.batch_size=4", "data.drop_last=true", "trainer.max_epochs=2")
    assert m["status"] == "ok" and m["skipped_samples"] == 2  # once per epoch


def test_corrupt_image_with_stop_names_the_file(tmp_path):
    _folder_with_a_corrupt_image(tmp_path / "imgs")
    r = run_cli(f"hydra.run.dir={tmp_path / 'run'}", "data=imagefolder", f"data.root={tmp_path / 'imgs'}", "data.val_split=0", "data.batch_size=4", "data.on_bad_sample=stop", "checkpoint.enabled=false")
    assert r.returncode == 3 and "3.jpg" in r.stderr and "on_bad_sample" in r.stderr
    assert "Traceback" not in r.stderr


def test_image_too_small_for_the_model(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="data.image_size=8"):
        train("model._target_=torchvision.models.vision_transformer.VisionTransformer", "~model.width", "+model.image_size=16", "+model.patch_size=8", "+model.num_layers=1", "+model.num_heads=2", "+model.hidden_dim=8", "+model.mlp_dim=8", "data.image_size=8")


def test_unwritable_output_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run_cli(f"hydra.run.dir={blocker}/run")
    assert r.returncode == 2 and "hydra.run.dir" in r.stderr and "Traceback" not in r.stderr


def test_a_failed_resume_does_not_overwrite_a_finished_result(compose, tmp_path):
    from conftest import TINY

    from trainer.errors import ConfigError
    from trainer.run import run

    out = tmp_path / "run"
    run(compose(*TINY, "checkpoint.enabled=true"), str(out))
    before = (out / "metrics.json").read_text()
    with pytest.raises(ConfigError, match="does not exist"):
        run(compose(*TINY, f"ckpt_path={tmp_path / 'missing.ckpt'}"), str(out))
    assert (out / "metrics.json").read_text() == before
    assert json.loads((out / "metrics.failed.json").read_text())["status"] == "failed"
    assert (out / "checkpoints" / "last.ckpt").exists()
