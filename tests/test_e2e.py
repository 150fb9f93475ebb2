"""End to end through train.py, the way a user runs it: a sweep, the recipes, and a run that learns."""

from __future__ import annotations

import re

import pytest
from conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow


def test_sweep_runs_jobs_one_after_another_each_with_metrics(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        "scale=smoke",
        "amp=false,true",
        "channels_last=false,true",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=1",
        "checkpoint.enabled=false",
    )
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
    # the A/B report: three files, one row per job, the varied flags as columns, printed too
    for name in ("ab_report.md", "ab_report.csv", "ab_report.png"):
        assert (sweep / name).stat().st_size > 0
    table = (sweep / "ab_report.md").read_text()
    assert "| job | amp | channels_last | world_size | epoch_time_s |" in table and table.count("| ok |") == 4
    assert "job  configuration " in r.stdout and re.search(r"^3 +amp=true\b", r.stdout, re.M)  # the console's table


def test_a_crashing_job_keeps_its_row_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        "model._target_=spies.ProbeNet",
        "~model.width",
        "+model.fail_in_forward=true,false",
        "trainer.max_epochs=2",
        "data.num_samples=64",
        "data.image_size=16",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 1  # something failed, and the exit code says so
    # the failed job's error reaches the console, named by its label
    assert "error: #0 +model.fail_in_forward=true stopped: " in r.stdout and "forward failed on purpose" in r.stdout
    failed, ok = read_metrics(sweep / "0"), read_metrics(sweep / "1")
    assert failed["status"] == "failed" and "forward failed on purpose" in failed["error"]
    assert ok["status"] == "ok"
    rows = (sweep / "ab_report.csv").read_text().splitlines()
    assert len(rows) == 3 and ",failed," in rows[1] and ",ok," in rows[2]


def test_epoch_times_agree_with_an_outside_stopwatch(tmp_path):
    """The trainer's epoch times vs the gaps between its per-epoch log lines (no validation, no
    checkpoints, so consecutive epoch-end lines are one training epoch apart)."""
    import re
    from datetime import datetime

    run_dir = tmp_path / "stopwatch"
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        "data.num_samples=4096",
        "data.val_samples=0",
        "trainer.limit_val_batches=0",
        "trainer.max_epochs=4",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    stamps = [
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        for m in re.finditer(
            r"^\[([\d\- :,]+)\]\[trainer.callbacks.epoch_timer\]\[INFO\] - epoch \d+:",
            (run_dir / "train.log").read_text(),
            re.M,
        )
    ]
    epochs = read_metrics(run_dir)["epochs"]
    assert len(stamps) == len(epochs) == 4
    for k in (1, 2, 3):
        outside = (stamps[k] - stamps[k - 1]).total_seconds()
        inside = epochs[k]["time_s"]
        assert outside > 0.5, "epochs too short for a 5% comparison"
        assert abs(inside - outside) <= 0.05 * outside, (k, inside, outside)


@pytest.mark.parametrize("recipe", ["resnet50", "vit"])
def test_recipe_smoke_runs_through_train_py(tmp_path, recipe):
    run_dir = tmp_path / recipe
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        f"+recipe={recipe}",
        "scale=smoke",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
    )
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
        f"hydra.run.dir={run_dir}",
        "data=builtin",
        "scale=smoke",
        "data.images_per_class=80",
        "trainer.max_epochs=6",
        "trainer.limit_train_batches=1.0",
        "trainer.limit_val_batches=1.0",
        "model.width=16",
        "optim.lr=0.05",
        "checkpoint.enabled=false",
        env_extra={"TRAINER_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["val_acc"] is not None
    assert m["val_acc"] >= 0.4, m


def test_repeats_run_every_configuration_interleaved_and_fold_into_rows(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        "channels_last=false,true",
        "repeats=2",
        "trainer.max_epochs=3",
        "data.num_samples=64",
        "data.image_size=16",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    order = [
        (read_metrics(sweep / str(i))["flags"]["channels_last"], read_metrics(sweep / str(i))["overrides"][0])
        for i in range(4)
    ]
    assert order == [(False, "repeat=0"), (True, "repeat=0"), (False, "repeat=1"), (True, "repeat=1")]  # interleaved
    table = (sweep / "ab_report.md").read_text()
    assert (
        "| 0,2 | false |" in table
        and "| 1,3 | true |" in table
        and "| repeats |" in table.replace("| world_size | repeats |", "| repeats |")
    )
    r = run_cli("repeats=2", "trainer.max_epochs=1")
    assert r.returncode == 2 and "add -m" in r.stderr and "Traceback" not in r.stderr


def test_console_scripts_are_installed_and_answer():
    import os
    import subprocess
    import sys

    bin_dir = os.path.dirname(sys.executable)
    for script, says in (
        ("trainer-report", "Rebuild the A/B report"),
        ("trainer-pack", "packed"),
        ("trainer-train", "train"),
        ("trainer-tune", "tune"),
    ):
        path = os.path.join(bin_dir, script)
        assert os.path.exists(path), f"{script} is not installed next to {sys.executable}"
        r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and says in r.stdout, (script, r.stdout[-500:], r.stderr[-500:])


def test_installing_the_package_keeps_the_torch_already_there():
    """pyproject.toml holds ranges: pip's resolver, asked to install this project into an
    environment that has a torch of the lowest tested version or newer (a CUDA build, say),
    installs only the project. And every exact version CI uses lies inside those ranges."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    from packaging.requirements import Requirement

    from trainer.paths import ROOT

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--quiet",
                "--report",
                report,
                "--no-build-isolation",
                "--no-index",
                "--disable-pip-version-check",
                str(ROOT),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        installs = [item["metadata"]["name"] for item in json.loads(open(report).read())["install"]]
    assert installs == ["trainer-switchboard"], installs

    import tomllib

    requirements = [
        Requirement(s) for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    pins = {k.lower().replace("_", "-"): v for k, v in pins.items()}
    for req in requirements:
        assert req.name.lower() in pins, f"{req.name} has no exact version in constraints.txt"
        assert req.specifier.contains(pins[req.name.lower()]), (
            f"constraints.txt pins {req.name}=={pins[req.name.lower()]}, outside {req}"
        )
