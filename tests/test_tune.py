"""python -m trainer.tune on planted bottlenecks: every probe is a real training run in its own process.

- a dataset that sleeps per sample: the doctor says input pipeline, the tuner tries loader workers
  first and keeps them; killed mid-way, it resumes from its journal without repeating a probe;
- a compute-heavy tiny CNN: the compute flags are kept exactly when their measured interval lies
  above 1.0 (whatever this CPU makes of them), and a candidate of the test's own that trains
  faster but learns far less is kept by the search and then rejected by the accuracy guard;
- the refusals (sweeps, parallel launchers, unknown candidates) and ``+tuned=`` going back into train.py.
"""

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
from conftest import ROOT, clean_env

pytestmark = pytest.mark.slow

PROBE = ["tune.probe_batches=6", "tune.probe_epochs=4", "tune.verify_epochs=1"]
SLOW_DATA = ["data=custom", "data.dataset._target_=probe.SlowDataset", "+data.dataset.n=48", "+data.dataset.sleep_ms=6",
             "+data.val_dataset._target_=probe.SlowDataset", "+data.val_dataset.n=16", "+data.val_dataset.sleep_ms=0",
             "data.batch_size=8", "data.image_size=16"]


def _env():
    return clean_env()


def _tune(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.tune", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def _rows(run_dir: Path) -> list:
    with open(run_dir / "tune_report.csv") as f:
        return list(csv.DictReader(f))


def _best(run_dir: Path) -> list:
    import yaml

    return yaml.safe_load((run_dir / "best.yaml").read_text())["overrides"]


def test_a_dataset_that_sleeps_gets_loader_workers_first_and_a_killed_tune_resumes(tmp_path):
    run_dir = tmp_path / "tune"
    args = [f"hydra.run.dir={run_dir}", *SLOW_DATA, *PROBE, "tune.only=[workers,amp]"]
    journal = run_dir / "tune_journal.jsonl"
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "trainer.tune", *args], cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:  # kill -9 once the baseline's training and its first probe are in the journal
        deadline = time.time() + 240
        while time.time() < deadline and not (journal.exists() and len(journal.read_text().splitlines()) >= 3):
            assert proc.poll() is None, f"the tune ended before it could be killed: {log.read_text()[-2000:]}"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = len(journal.read_text().splitlines()) - 1
    assert finished >= 2

    r = _tune(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming: {finished} finished probes" in r.stdout + r.stderr
    # the finished ones were not run again: one baseline training, one baseline probe before the end's
    assert len(list((run_dir / "verify").glob("*-baseline"))) == 1
    assert len(list((run_dir / "probes").glob("*-baseline"))) == 1

    rows = _rows(run_dir)
    base, first = rows[0], rows[1]
    assert base["decision"] == "baseline"
    assert first["candidate"] == "workers" and first["chosen_by"] == "input pipeline", rows  # the verdict picked it
    assert first["decision"] == "kept" and float(first["speedup_ci"].split("-")[0]) > 1.0, rows
    assert "data.auto_workers=true" in _best(run_dir)
    out = r.stdout + r.stderr
    assert "fastest accuracy-safe configuration: data.auto_workers=true" in out and "best.yaml" in out
    for name in ("tune_report.md", "tune_report.png", "best.yaml"):
        assert (run_dir / name).stat().st_size > 0
    assert "## Path taken" in (run_dir / "tune_report.md").read_text()


def test_compute_flags_are_kept_on_evidence_and_the_guard_rejects_a_faster_candidate_that_costs_accuracy(tmp_path):
    from trainer import hardware

    run_dir = tmp_path / "tune"
    r = _tune(f"hydra.run.dir={run_dir}", "data.num_samples=256", "data.val_samples=128", "data.batch_size=16", "data.image_size=32",
              "model.width=32", *PROBE, "tune.verify_epochs=2", "tune.only=[amp,channels_last,gpu_normalize,narrow]",
              '+tune.extra.narrow="model.width=1"')
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(run_dir)
    assert rows[0]["decision"] == "baseline" and "compute" in (run_dir / "tune.log").read_text()
    probed = [row for row in rows if row["decision"] in ("kept", "dropped")]
    names = {row["candidate"] for row in probed}
    bf16 = hardware.detect("cpu").bf16_native
    assert ({"amp", "channels_last"} if bf16 else {"channels_last"}) <= names, rows
    for row in probed:  # kept exactly when the interval lies above 1.0 (after a second look for keeps)
        lo = float(row["speedup_ci"].split("-")[0])
        assert (row["decision"] == "kept") == (lo > 1.0), row
        if row["candidate"] in ("amp", "channels_last"):
            assert row["chosen_by"] == "compute", row
    skipped = {row["candidate"]: row["why"] for row in rows if row["decision"] == "skipped"}
    assert "CPU" in skipped["gpu_normalize"]  # what this hardware cannot use is skipped, with the reason
    if not bf16:
        assert "no native bf16" in skipped["amp"]

    narrow = next(row for row in probed if row["candidate"] == "narrow")
    assert narrow["decision"] == "kept", rows  # far fewer FLOPs: clearly faster...
    rejected = [row for row in rows if row["decision"] == "rejected"]
    assert rejected and "model.width=1" in rejected[0]["tried"] and "below the baseline" in rejected[0]["why"], rows  # ...but guarded
    assert not any("model.width" in o for o in _best(run_dir))
    verified = [row for row in rows if row["decision"] == "verified"]
    assert len(verified) == 1 or _best(run_dir) == []

    # best.yaml goes back into train.py as +tuned=PATH
    cfg = subprocess.run([sys.executable, "train.py", f"+tuned={run_dir / 'best.yaml'}", "--cfg", "job"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert cfg.returncode == 0, cfg.stderr[-2000:]
    for override in _best(run_dir):
        key, value = override.split("=", 1)
        assert f"{key.split('.')[-1]}: {value}" in cfg.stdout, (override, cfg.stdout[:2000])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["-m", "amp=false,true"], "takes no -m"),
        (["hydra/launcher=slurm_local"], "refuses other launchers"),
        (["amp=false,true"], "lists several values"),
        (["tune.only=[warp_drive]"], "'tune.only' names warp_drive"),
        (["tune.extra.narrow=x"], "takes a leading +"),
        (["tune.probe_epochs=2"], "tune.probe_epochs"),
    ],
)
def test_the_tuner_refuses_with_one_paragraph(tmp_path, args, expected):
    r = _tune(f"hydra.run.dir={tmp_path / 'tune'}", *args, timeout=120)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_tune_never_writes_into_a_training_runs_dir(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps({"schema": 1, "status": "ok", "epochs": []}))
    r = _tune(f"hydra.run.dir={run_dir}", *PROBE, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.json"]


def test_a_bad_tuned_file_is_one_paragraph(tmp_path):
    bad = tmp_path / "best.yaml"
    bad.write_text("amp: true\n")
    r = subprocess.run([sys.executable, "train.py", f"+tuned={bad}"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no 'overrides:' list" in r.stderr and "Traceback" not in r.stderr, r.stderr
