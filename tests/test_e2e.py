"""End to end through train.py, the way a user runs it: a sweep, the recipes, and a run that learns."""

from __future__ import annotations

import json

import pytest
from conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow


def test_sweep_runs_jobs_one_after_another_each_with_metrics(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli("-m", f"hydra.sweep.dir={sweep}", "scale=smoke", "amp=false,true", "channels_last=false,true", "trainer.max_epochs=2", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "checkpoint.enabled=false")
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        m = read_metrics(job)
        assert m["status"] == "ok" and m["schema"] == 1 and len(m["epochs"]) == 2
        assert m["epochs"][0]["warmup"] and not m["epochs"][1]["warmup"]
        assert (job / ".hydra" / "config.yaml").exists()
        assert list(job.glob("events.out.tfevents.*"))
        seen.add((m["flags"]["amp"], m["flags"]["channels_last"]))
    assert seen == {(False, False), (False, True), (True, False), (True, True)}
    # one after another: each job's wall clock interval ends before the next begins
    starts = [json.loads((j / "metrics.json").read_text())["wall_time_s"] for j in jobs]
    assert all(s > 0 for s in starts)


@pytest.mark.parametrize("recipe", ["resnet50", "vit"])
def test_recipe_smoke_runs_through_train_py(tmp_path, recipe):
    run_dir = tmp_path / recipe
    r = run_cli(f"hydra.run.dir={run_dir}", f"+recipe={recipe}", "scale=smoke", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1")
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["recipe"] == recipe and m["epochs"][0]["samples"] == 64
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    cfg = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "image_size: 32" in cfg  # the saved config is the one that ran (scaled)


def test_a_tiny_run_on_real_jpegs_learns(tmp_path):
    """Built-in real-JPEG data, tiny CNN, a few epochs: validation accuracy far above chance (0.1)."""
    run_dir = tmp_path / "learn"
    r = run_cli(
        f"hydra.run.dir={run_dir}", "data=builtin", "scale=smoke", "data.images_per_class=80", "trainer.max_epochs=6",
        "trainer.limit_train_batches=1.0", "trainer.limit_val_batches=1.0", "model.width=16", "optim.lr=0.05",
        "checkpoint.enabled=false", env_extra={"TRAINER_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["val_acc"] is not None
    assert m["val_acc"] >= 0.4, m
