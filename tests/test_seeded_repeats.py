"""repeats=N repeat_seeds=true: each repeat trains with its own seed, so one command gives rows whose
time-to-target interval holds the seeds' variation (the report says 'seeds'), where plain repeats of
one seed hold timing noise only (the report says 'timing only')."""

from __future__ import annotations

import csv

import pytest
from conftest import TINY, read_metrics, run_cli
from test_report import _job

from trainer import report
from trainer.command_line import expand_repeats
from trainer.errors import ConfigError
from trainer.sweep import plan_jobs


def test_repeat_seeds_sweeps_the_seed_from_the_one_given_slowest_first():
    argv = ["-m", "amp=false,true", "repeats=3", "repeat_seeds=true", "seed=7"]
    assert expand_repeats(argv) == ["-m", "seed=7,8,9", "amp=false,true", "repeat_seeds=true"]
    # no seed given: from the schema's default; repeat_seeds=false: repeats of one seed, as before
    assert expand_repeats(["-m", "amp=false,true", "repeats=2", "repeat_seeds=true"])[1] == "seed=42,43"
    assert expand_repeats(["-m", "amp=false,true", "repeats=3", "repeat_seeds=false"])[1] == "repeat=range(3)"
    with pytest.raises(ConfigError, match="needs one integer seed to start from, not 'seed=1,2'"):
        expand_repeats(["-m", "amp=false,true", "repeats=3", "repeat_seeds=true", "seed=1,2"])
    # one repeat: nothing to sweep, the seed stays as given
    assert expand_repeats(["-m", "amp=false,true", "repeats=1", "repeat_seeds=true", "seed=7"]) == [
        "-m",
        "amp=false,true",
        "repeat_seeds=true",
        "seed=7",
    ]


def _planted_sweep(root, argv):
    """The jobs Hydra's basic sweeper makes of ``argv`` (expanded as train.py expands it), each with a
    planted journal: amp=true trains 0.8 s epochs and amp=false 1 s ones; the seed decides the epoch
    that reaches val_acc 0.9 (3 or 4) and the repeat nudges the times, as timing noise does."""
    jobs = plan_jobs([a for a in expand_repeats(argv) if not a.startswith("-")])
    assert jobs and len(jobs) == 6, jobs
    for n, overrides in enumerate(jobs):
        settings = dict(ov.split("=", 1) for ov in overrides)
        seed, repeat = int(settings.get("seed", 42)), int(settings.get("repeat", 0))
        epoch_s = (0.8 if settings["amp"] == "true" else 1.0) + 0.01 * repeat + 0.005 * seed
        reach = 3 + (seed + (settings["amp"] == "true")) % 2
        accs = [0.5 + 0.4 * (i + 1 >= reach) for i in range(5)]
        flags = {"amp": settings["amp"] == "true"}
        _job(root, str(n), flags, [epoch_s] * 5, accs=accs, overrides=overrides)
    report.write_report([str(root)], str(root), echo=False, target_acc=0.9)
    with open(root / "ab_report.csv") as f:
        return list(csv.DictReader(f))


def test_seeded_repeats_fold_into_one_row_whose_interval_holds_the_seeds(tmp_path):
    rows = _planted_sweep(tmp_path / "seeded", ["-m", "amp=false,true", "repeats=3", "repeat_seeds=true"])
    assert [(r["job"], r["amp"], r["repeats"]) for r in rows] == [("0,2,4", "False", "3"), ("1,3,5", "True", "3")]
    assert rows[1]["time_to_target_ci"] and rows[1]["time_to_target_ci_holds"] == "seeds", rows[1]
    assert "judged on one seed" not in rows[1]["notes"]
    # the same command without repeat_seeds: repeats of one seed, judged on timing noise only
    rows = _planted_sweep(tmp_path / "one_seed", ["-m", "amp=false,true", "repeats=3"])
    assert [(r["job"], r["repeats"]) for r in rows] == [("0,2,4", "3"), ("1,3,5", "3")]
    assert rows[1]["time_to_target_ci_holds"] == "timing only" and "judged on one seed" in rows[1]["notes"]


@pytest.mark.slow
def test_a_seeded_repeats_sweep_trains_each_repeat_with_its_seed_and_reports_one_judged_row(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        "channels_last=false,true",
        "repeats=2",
        "repeat_seeds=true",
        "seed=5",
        *[a for a in TINY if not a.startswith("trainer.max_epochs")],
        "trainer.max_epochs=2",
        "report.target_acc=0.05",  # reached at the first validation by every run: each ratio has its times
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seeds = [
        (read_metrics(sweep / str(i))["flags"]["channels_last"], read_metrics(sweep / str(i))["overrides"][0])
        for i in range(4)
    ]
    assert seeds == [(False, "seed=5"), (True, "seed=5"), (False, "seed=6"), (True, "seed=6")]  # interleaved
    assert "seed: 6" in (sweep / "2" / ".hydra" / "config.yaml").read_text().splitlines()  # the job trained with it
    with open(sweep / "ab_report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(row["job"], row["repeats"]) for row in rows] == [("0,2", "2"), ("1,3", "2")]
    assert rows[1]["time_to_target_ci_holds"] == "seeds", rows[1]
    # the console's table names it too
    assert any(line.startswith("1,3 ") and " seeds " in line for line in r.stdout.splitlines()), r.stdout
