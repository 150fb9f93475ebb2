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
from conftest import ROOT, clean_env, read_metrics

pytestmark = pytest.mark.slow

PROBE = ["tune.probe_batches=6", "tune.probe_epochs=4", "tune.verify_epochs=1"]
SLOW_DATA = [
    "data=custom",
    "data.dataset._target_=spies.SlowDataset",
    "+data.dataset.n=48",
    "+data.dataset.sleep_ms=6",
    "+data.val_dataset._target_=spies.SlowDataset",
    "+data.val_dataset.n=16",
    "+data.val_dataset.sleep_ms=0",
    "data.batch_size=8",
    "data.image_size=16",
]


def _env():
    return clean_env()


def _tune(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.tune", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(run_dir: Path) -> list:
    with open(run_dir / "tune_report.csv") as f:
        return list(csv.DictReader(f))


def _best(run_dir: Path) -> list:
    import yaml

    return yaml.safe_load((run_dir / "best.yaml").read_text())["overrides"]


@pytest.mark.whole_machine  # loader workers are a candidate only with a core to spare
def test_a_dataset_that_sleeps_gets_loader_workers_first_and_a_killed_tune_resumes(tmp_path):
    run_dir = tmp_path / "tune"
    args = [f"hydra.run.dir={run_dir}", *SLOW_DATA, *PROBE, "tune.only=[workers,amp]"]
    journal = run_dir / "tune_journal.jsonl"
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.tune", *args],
            cwd=ROOT,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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


@pytest.mark.heavy
def test_compute_flags_are_kept_on_evidence_and_the_guard_rejects_a_faster_candidate_that_costs_accuracy(tmp_path):
    from trainer.measure import hardware

    run_dir = tmp_path / "tune"
    r = _tune(
        f"hydra.run.dir={run_dir}",
        "data.num_samples=256",
        "data.val_samples=128",
        "data.batch_size=16",
        "data.image_size=32",
        "model.width=32",
        *PROBE,
        "tune.verify_epochs=2",
        "tune.only=[amp,channels_last,tf32,narrow]",
        '+tune.extra.narrow="model.width=1"',
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(run_dir)
    probed = [row for row in rows if row["decision"] in ("kept", "dropped")]
    assert rows[0]["decision"] == "baseline" and probed and probed[0]["chosen_by"] == "compute", (
        rows
    )  # the doctor's verdict
    names = {row["candidate"] for row in probed}
    bf16 = hardware.detect("cpu").bf16_native
    assert ({"amp", "channels_last"} if bf16 else {"channels_last"}) <= names, rows
    for row in probed:  # kept exactly when the interval lies above 1.0 (after a second look for keeps)
        lo = float(row["speedup_ci"].split("-")[0])  # rounded to 3 decimals in the CSV
        assert lo >= 1.0 if row["decision"] == "kept" else lo <= 1.0, row
        if row["candidate"] in ("amp", "channels_last"):
            assert row["chosen_by"] == "compute", row
    skipped = {row["candidate"]: row["why"] for row in rows if row["decision"] == "skipped"}
    assert "CPU" in skipped["tf32"]  # what this hardware cannot use is skipped, with the reason
    if not bf16:
        assert "no native bf16" in skipped["amp"]

    narrow = next(row for row in probed if row["candidate"] == "narrow")
    assert narrow["decision"] == "kept", rows  # far fewer FLOPs: clearly faster...
    rejected = [row for row in rows if row["decision"] == "rejected"]
    assert rejected and "model.width=1" in rejected[0]["tried"] and "below the baseline" in rejected[0]["why"], (
        rows
    )  # ...but guarded
    assert not any("model.width" in o for o in _best(run_dir))
    # the guard walks back along the path: every configuration with the narrow model is rejected, and
    # the first without it (if the search kept anything else) is verified; best.yaml is that one when
    # the final back-to-back measurement confirms it, else the configuration as given
    verified = [row for row in rows if row["decision"] == "verified"]
    assert all("model.width=1" in row["tried"] for row in rejected), rejected
    kept_alone = [row for row in probed if row["decision"] == "kept" and "model.width=1" not in row["tried"]]
    if not kept_alone:
        assert verified == [] and _best(run_dir) == [], (verified, rows)
    else:
        assert len(verified) == 1 and verified[0]["tried"] == kept_alone[-1]["tried"], (verified, kept_alone)
        final = next(row for row in rows if row["candidate"] == "final")
        expected = verified[0]["tried"].split() if final["decision"] == "final" else []
        assert final["decision"] in ("final", "not confirmed") and _best(run_dir) == expected, (final, _best(run_dir))

    # best.yaml goes back into train.py as +tuned=PATH (the tune's own, and one that surely has overrides)
    mine = tmp_path / "mine.yaml"
    mine.write_text('overrides:\n  - "channels_last=true"\n  - "data.batch_size=12"\n')
    for path, overrides in (
        (run_dir / "best.yaml", _best(run_dir)),
        (mine, ["channels_last=true", "data.batch_size=12"]),
    ):
        cfg = subprocess.run(
            [sys.executable, "train.py", f"+tuned={path}", "--cfg", "job"],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cfg.returncode == 0, cfg.stderr[-2000:]
        for override in overrides:
            key, value = override.split("=", 1)
            assert f"{key.split('.')[-1]}: {value}" in cfg.stdout, (override, cfg.stdout[:2000])


@pytest.mark.heavy
def test_time_to_target_on_the_compute_bound_case_names_its_objective_and_says_when_the_budget_cannot_hold_it(tmp_path):
    """The planted compute-bound case tuned by time to target: a budget that cannot hold one judgement
    is said before any candidate trains; the same command with a budget resumes (the baseline's
    training is not repeated), drops the narrow model as never reaching the target, and names the
    objective in best.yaml and the report."""
    run_dir = tmp_path / "tune"
    args = [
        f"hydra.run.dir={run_dir}",
        "data.num_samples=256",
        "data.val_samples=128",
        "data.batch_size=16",
        "data.image_size=32",
        "model.width=32",
        "tune.verify_epochs=3",
        "tune.objective=time_to_target",
        "tune.only=[channels_last,narrow]",
        '+tune.extra.narrow="model.width=1"',
        "stop_at_acc=0.2",  # the user's own: the tuner decides where its runs stop
    ]
    r = _tune(*args, "tune.budget_min=0.05")
    assert r.returncode == 2 and "cannot judge a candidate within tune.budget_min=0.05" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (run_dir / "to_target").exists()

    r = _tune(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    baseline_runs = list((run_dir / "verify").glob("*-baseline"))
    assert len(baseline_runs) == 1  # resumed from the journal
    # the baseline trains its whole schedule: its best val_acc sets the target
    assert len(read_metrics(baseline_runs[0])["epochs"]) == 3
    rows = {row["candidate"]: row for row in _rows(run_dir)}
    base = rows["baseline"]
    assert base["time_to_target_s"] and 1 <= int(base["epochs_to_target"]) <= 3, base
    assert rows["narrow"]["decision"] == "dropped" and "did not reach val_acc" in rows["narrow"]["why"], rows["narrow"]
    cl = rows["channels_last"]
    assert cl["decision"] in ("kept", "dropped") and cl["time_to_target_s"], cl
    if cl["decision"] == "kept":
        assert float(cl["speedup_ci"].split("-")[0]) >= 1.0, cl
    header = (run_dir / "best.yaml").read_text().splitlines()
    assert header[1].startswith("# objective: time_to_target (tune.objective): the training time to target val_acc"), (
        header
    )
    report = (run_dir / "tune_report.md").read_text()
    assert "Objective: time_to_target" in report and "| time_to_target_s | epochs_to_target |" in report


@pytest.mark.parametrize(
    "args, expected",
    [
        (["-m", "amp=false,true"], "takes no -m"),
        (["hydra/launcher=slurm_local"], "refuses other launchers"),
        (["amp=false,true"], "lists several values"),
        (["tune.only=[warp_drive]"], "'tune.only' names warp_drive"),
        (["tune.extra.narrow=x"], "takes a leading +"),
        (["tune.probe_epochs=2"], "tune.probe_epochs"),
        (["tune.budget_min=nan"], "tune.budget_min"),
        (["ckpt_path=last"], "cannot start from a checkpoint"),
        (['+tune.extra.typo="modle.width=4"'], "tune.extra.typo"),
    ],
)
def test_the_tuner_refuses_with_one_paragraph(tmp_path, args, expected):
    r = _tune(f"hydra.run.dir={tmp_path / 'tune'}", *args, timeout=120)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("content", ["notes.txt", "metrics.json"])
def test_a_tune_never_writes_into_a_dir_that_is_not_its_own(tmp_path, content):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / content).write_text(json.dumps({"schema": 1, "status": "failed", "epochs": []}))
    r = _tune(f"hydra.run.dir={run_dir}", *PROBE, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in run_dir.iterdir()) == [content]  # not even .hydra/ or tune.log


def test_the_search_on_planted_measurements():
    """The decisions, in-process, on measurements planted per configuration: a flag that helps is
    kept and one that does not is dropped; the user's faster candidate that learns less is kept by
    the search and rejected by the guard; a winner that the final back-to-back measurement does
    not confirm leaves the configuration as given; the budget stops the search."""
    from types import SimpleNamespace

    from trainer.tune.candidates import EXTRA, Candidate, Context
    from trainer.tune.probe import Result
    from trainer.tune.search import Search

    speed = {"amp=true": 0.6, "channels_last=true": 1.0, "model.width=1": 0.5}  # time factor per flag
    calls = []

    def probe(kind, name, config, final_slow=False):
        calls.append((kind, name, tuple(config)))
        t = 1.0
        for ov in config:
            t *= speed.get(ov, 1.0)
        if final_slow and name == "winner-final":
            t = 1.0
        acc = 0.3 if "model.width=1" in config else 0.9
        return Result(
            kind,
            list(config),
            f"/runs/{len(calls)}",
            "ok",
            steady=[[t * f, 100] for f in (0.99, 1.0, 1.01, 1.0)],
            bottleneck="compute",
            val_acc=acc if kind == "verify" else None,
            epoch_samples=100,
        )

    ctx = Context(cuda=False, bf16_native=True, capability=0.0, cores=2, data_name="synthetic", allocators=())
    cands = [
        Candidate("amp", "compute", ("amp=true",)),
        Candidate("channels_last", "compute", ("channels_last=true",)),
        Candidate("narrow", EXTRA, ("model.width=1",)),
    ]
    cfg = SimpleNamespace(budget_min=30, horizon_epochs=10, verify_epochs=1, acc_tolerance=0.02)
    out = Search(probe, cands, ctx, {"amp": False, "channels_last": False}, cfg, lambda: 0.0).run()
    decided = {s.candidate: s.decision for s in out.steps if s.decision in ("kept", "dropped")}
    assert decided == {"amp": "kept", "channels_last": "dropped", "narrow": "kept"}, out.steps
    assert [s.decision for s in out.steps if s.candidate == "accuracy check"] == ["rejected", "verified"]
    assert out.winner == ["amp=true"] and out.speedup == pytest.approx(1 / 0.6, rel=0.02) and out.speedup_ci[0] > 1.0
    retried = [sorted(c[2]) for c in calls if c[1] == "channels_last"]
    assert retried == [
        ["amp=true", "channels_last=true"],
        ["amp=true", "channels_last=true", "model.width=1"],
    ]  # again after narrow

    calls.clear()
    out = Search(lambda k, n, c: probe(k, n, c, final_slow=True), cands, ctx, {}, cfg, lambda: 0.0).run()
    assert out.winner == [] and out.unconfirmed and "keep the configuration as given" in out.verdict

    # a winner that fails when measured again is no winner, whatever its first probe said
    def final_fails(kind, name, config):
        found = probe(kind, name, config)
        if name == "winner-final":
            found.status, found.error = "failed", "RuntimeError: CUDA error: an illegal memory access"
        return found

    calls.clear()
    out = Search(final_fails, cands[:1], ctx, {}, cfg, lambda: 0.0).run()
    assert out.winner == [] and out.unconfirmed and "failed when measured again (RuntimeError" in out.unconfirmed[2]
    (final,) = [s for s in out.steps if s.candidate == "final"]
    assert final.decision == "not confirmed" and "measured again, the winner failed" in final.why
    assert final.speedup is None  # measured once: no speed-up "over both measurements of each" to state
    assert "the best configuration found (amp=true) failed when measured again" in out.verdict, out.verdict

    # a baseline without validation: the accuracy is not checked, and the verdict does not call it safe
    def unvalidated(kind, name, config):
        found = probe(kind, name, config)
        found.val_acc = None
        return found

    calls.clear()
    out = Search(unvalidated, cands[:1], ctx, {}, cfg, lambda: 0.0).run()
    assert out.winner == ["amp=true"] and "accuracy NOT CHECKED" in out.verdict
    assert out.verdict.startswith("fastest configuration: amp=true") and "accuracy-safe" not in out.verdict

    # the guard: a candidate whose run logs no val_acc beside a baseline that has one is rejected
    def no_validation(kind, name, config):
        found = probe(kind, name, config)
        if "model.width=1" in config:
            found.val_acc = None
        return found

    calls.clear()
    out = Search(no_validation, cands[2:], ctx, {}, cfg, lambda: 0.0).run()
    (check,) = [s for s in out.steps if s.candidate == "accuracy check"]
    assert check.decision == "rejected" and "no val_acc to compare" in check.why and out.winner == []

    # an accuracy exactly at the tolerance's edge passes (0.5016 - 0.02 is 0.48160000000000003 in floats)
    def at_the_edge(kind, name, config):
        found = probe(kind, name, config)
        if kind == "verify":
            found.val_acc = 0.4816 if "model.width=1" in config else 0.5016
        return found

    calls.clear()
    out = Search(at_the_edge, cands[2:], ctx, {}, cfg, lambda: 0.0).run()
    assert [s.decision for s in out.steps if s.candidate == "accuracy check"] == ["verified"]

    calls.clear()
    out = Search(probe, cands, ctx, {}, cfg, lambda: 31 * 60.0).run()
    assert (
        out.budget_hit and out.winner == [] and [c[1] for c in calls] == ["baseline", "baseline"]
    )  # its training and its probe
    assert {s.why for s in out.steps if s.decision == "skipped"} == {"the budget ran out first"}


def test_time_to_target_judges_by_epochs_times_epoch_time(tmp_path):
    """tune.objective=time_to_target on planted runs: a flag that makes epochs 30% faster but needs
    twice the epochs loses (the epoch-time objective keeps it); one that makes epochs slower but
    reaches the target in fewer wins; one that never reaches the target is dropped as such; the
    target comes from the baseline's training, and a budget too small for one judgement is said."""
    from types import SimpleNamespace

    from trainer.errors import ConfigError
    from trainer.tune.candidates import Candidate, Context
    from trainer.tune.probe import Result
    from trainer.tune.search import Search

    # per flag: (epoch time factor, epochs to reach 0.9 or None for never)
    plan = {"fast=true": (0.7, 4), "ema=true": (1.05, 1), "narrow=true": (0.5, None)}
    calls = []

    missing = set()  # names of probes that, this time, do not reach the target

    def probe(kind, name, config, extra=()):
        calls.append((kind, name, tuple(config), tuple(extra)))
        t, reach = 1.0, 2
        for ov in config:
            factor, reach = plan[ov]
            t *= factor
        if name in missing:
            reach = None
        epochs = reach if kind == "target" and reach is not None else 5  # a target run stops there
        if kind == "target":
            assert extra == ("stop_at_acc=0.9",), extra  # each probe stops at the target
        acc = [0.5 + (0.4 if reach is not None and i + 1 >= reach else 0.1 * i / 5) for i in range(epochs)]
        times = [3.0 * t] + [t * f for f in (0.99, 1.01, 1.0, 0.98, 1.02)][: epochs - 1]
        return Result(
            kind,
            list(config),
            f"/runs/{len(calls)}",
            "ok",
            steady=[[x, 100] for x in times[1:]],
            bottleneck="compute",
            val_acc=acc[-1],
            curve=[[x, a] for x, a in zip(times, acc)],
            epoch_samples=100,
            wall_s=sum(times),
        )

    ctx = Context(cuda=False, bf16_native=True, capability=0.0, cores=2, data_name="synthetic", allocators=())
    cands = [
        Candidate("fast", "compute", ("fast=true",)),
        Candidate("ema", "epochs to target", ("ema=true",)),
        Candidate("narrow", "compute", ("narrow=true",)),
    ]
    cfg = SimpleNamespace(
        budget_min=30, horizon_epochs=10, verify_epochs=5, acc_tolerance=0.02, objective="time_to_target"
    )
    out = Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=(0.9, 0.01)).run()
    decided = {s.candidate: s for s in out.steps if s.decision in ("kept", "dropped")}
    assert {n: s.decision for n, s in decided.items()} == {"fast": "dropped", "ema": "kept", "narrow": "dropped"}
    assert decided["fast"].epochs_to_target == 4 and decided["fast"].speedup < 1.0, decided["fast"]
    assert "did not reach val_acc 0.900" in decided["narrow"].why
    assert out.winner == ["ema=true"] and out.objective == "time_to_target" and out.target == 0.9
    # baseline 3 + 1 = 4 s to target; ema 3.15 s: 1.27x, confirmed by the final measurement
    assert out.speedup == pytest.approx(4.0 / 3.15, rel=0.02) and out.speedup_ci[0] > 1.0, out
    assert "fastest configuration to val_acc 0.900: ema=true" in out.verdict
    assert [c[0] for c in calls].count("verify") == 1  # the baseline's training is its time to target
    # every probe trained with one seed: the verdict and the report say what the interval holds
    assert "judged on one seed: the interval holds timing noise only" in out.verdict
    assert "repeats=N repeat_seeds=true" in out.verdict
    from trainer.tune.output import write_report

    write_report(tmp_path, [], out, "test machine", cfg, 60.0)
    with open(tmp_path / "tune_report.csv") as f:
        holds = {row["candidate"]: row["speedup_ci_holds"] for row in csv.DictReader(f)}
    assert holds["ema"] == holds["fast"] == holds["final"] == "timing only", holds
    assert "Judged on one seed: the interval holds timing noise only" in (tmp_path / "tune_report.md").read_text()

    # reaching the target is the guard, also when measured again: a winner whose final run misses it stays out
    calls.clear()
    missing.add("winner-final")
    out = Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=(0.9, 0.01)).run()
    final = next(s for s in out.steps if s.candidate == "final")
    assert final.decision == "not confirmed" and "did not reach val_acc 0.900" in final.why, final
    assert out.winner == [] and "did not reach val_acc 0.900 when measured again" in out.verdict, out.verdict
    missing.clear()

    # the incumbent measured again right after a candidate misses the target: that confirms nothing
    calls.clear()
    missing.add("incumbent-again")
    out = Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=(0.9, 0.01)).run()
    (ema,) = [s for s in out.steps if s.candidate == "ema"]
    assert ema.decision == "dropped" and "incumbent measured again did not reach val_acc 0.900" in ema.why, ema
    missing.clear()
    # the baseline's second final run misses it: the final row says its first measurement alone counts
    calls.clear()
    missing.add("baseline-final")
    out = Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=(0.9, 0.01)).run()
    final = next(s for s in out.steps if s.candidate == "final")
    assert "the baseline measured again did not reach val_acc 0.900: its first measurement alone counts" in final.why
    missing.clear()

    # the same planted runs judged by epoch time: the 30%-faster epochs win
    calls.clear()
    cfg.objective = "epoch_time"
    plain = Search(probe, cands[:1], ctx, {}, cfg, lambda: 0.0).run()
    assert [s.decision for s in plain.steps if s.candidate == "fast"] == ["kept"], plain.steps

    cfg.objective, cfg.budget_min = "time_to_target", 0.1  # 6 s: not two more runs of the baseline's 7 s
    with pytest.raises(ConfigError, match="cannot judge a candidate within tune.budget_min=0.1"):
        Search(probe, cands, ctx, {}, cfg, lambda: 7.0, target_spec=(0.9, 0.01)).run()
    cfg.budget_min = 30
    with pytest.raises(ConfigError, match="does not reach val_acc 0.990"):
        Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=(0.99, 0.01)).run()
    with pytest.raises(ConfigError, match="is reached before any training"):  # auto: 0.9 - 1.5
        Search(probe, cands, ctx, {}, cfg, lambda: 0.0, target_spec=("auto", 1.5)).run()


def test_a_probe_scales_the_steps_not_the_epochs_fixed_cost(train):
    """Loader workers that take 1 s to start (non-persistent: every epoch) cost 1 s per epoch, long or
    short: the timer puts that second in the epoch's fixed cost, and a probe's epoch is scaled to the
    full epoch's length by its steps only."""
    from trainer.tune.result import Result, fixed_cost

    # the scaling: 3 s for 16 samples, 2 s of them fixed -> 2 s + 4 x 1 s for 64 samples (not 4 x 3 s)
    assert Result("probe", [], "p", "ok", steady=[[3.0, 16, 2.0]]).epoch_times(full_samples=64, horizon_epochs=1) == [
        6.0
    ]
    assert Result("probe", [], "p", "ok", steady=[[3.0, 16]]).epoch_times(full_samples=64, horizon_epochs=1) == [
        12.0
    ]  # old journals
    # the measurement: a planted 1 s start per epoch lands in the fixed cost, not in the steps
    probe, _ = train(
        "data=custom",
        "data.dataset._target_=spies.SlowStartDataset",
        "+data.dataset.n=64",
        "+data.dataset.startup_s=1.0",
        "data.num_workers=1",
        "data.persistent_workers=false",
        "data.val_samples=0",
        "trainer.limit_val_batches=0",
        "data.batch_size=8",
        "trainer.max_epochs=3",
        # 2 of 8 batches as a fraction: the loader is not cut at the limit, so it never hands over its
        # last batch and no epoch's workers start ahead of it (trainer.data.epoch_ahead): each epoch pays its start
        "trainer.limit_train_batches=0.25",
    )
    steady = [e for e in probe["epochs"] if not e["warmup"]]
    assert steady and all(1.0 <= e["startup_s"] <= fixed_cost(e) < e["time_s"] for e in steady), steady


def test_probes_start_forked_from_the_preloaded_server_unless_told_or_the_environment_differs(tmp_path, monkeypatch):
    """tune.preloaded_probes=true: a probe is the preloaded server's child (its imports paid once), and
    trains as a fresh one does; false, or an environment torch reads at import that differs from the
    server's: a fresh interpreter, the tuner's own child."""
    from types import SimpleNamespace

    from trainer.launch import preloaded
    from trainer.tune.probe import Journal, Prober

    env = clean_env()  # once: computed again after the setenv below, its PYTHONPATH would name the folders twice
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    preloaded.context(env)  # (the tests' forked commands may have started it already, the same way)
    tune = SimpleNamespace(probe_epochs=3, probe_batches=2, verify_epochs=1, budget_min=5.0, objective="epoch_time")
    parents = {}
    for name, preload, extra_env in (
        ("forked", True, {}),
        ("fresh", False, {}),
        ("threads", True, {"OMP_NUM_THREADS": "1"}),
    ):
        for key, value in extra_env.items():
            monkeypatch.setenv(key, value)
        tune.preloaded_probes = preload
        tune.get = lambda key, default=None: getattr(tune, key, default)
        path = tmp_path / f"{name}.ppid"
        user = [
            "data=custom",
            "data.dataset._target_=spies.ParentRecorder",
            f"+data.dataset.path={path}",
            "data.batch_size=4",
            "data.image_size=16",
            "model.width=4",
            "monitor.enabled=false",
        ]
        run_dir = tmp_path / name
        run_dir.mkdir()
        result = Prober(run_dir, user, tune, Journal(run_dir, user, {})).run("probe", "baseline", [])
        assert result.ok, (name, result.error)
        parents[name] = int(path.read_text())
    assert parents["fresh"] == os.getpid() and parents["threads"] == os.getpid()
    assert parents["forked"] != os.getpid()


def test_inductor_modes_are_not_candidates_under_another_compile_backend():
    from trainer.tune.candidates import CATALOGUE, Context

    gpu = Context(cuda=True, bf16_native=True, capability=9.0, cores=16, data_name="synthetic", allocators=())
    for name in ("compile_max_autotune", "compile_reduce_overhead"):
        candidate = next(c for c in CATALOGUE if c.name == name)
        assert candidate.skip(gpu, {"compile_backend": "inductor"}) is None
        assert "compile_backend=aot_eager" in candidate.skip(gpu, {"compile_backend": "aot_eager"})


def test_prefetch_is_reachable_when_the_user_set_loader_workers():
    from types import SimpleNamespace

    from trainer.tune.candidates import CATALOGUE, Context
    from trainer.tune.search import Search

    ctx = Context(cuda=False, bf16_native=True, capability=0.0, cores=4, data_name="imagefolder", allocators=())
    cfg = SimpleNamespace(budget_min=30, horizon_epochs=10, verify_epochs=1, acc_tolerance=0.02)
    by_name = {c.name: c for c in CATALOGUE}
    mine = Search(None, CATALOGUE, ctx, {"data.num_workers": 4, "data.prefetch_factor": 2}, cfg, lambda: 0.0)
    assert "already has workers" in mine._eligible(by_name["workers"], [], [])
    assert mine._eligible(by_name["prefetch"], [], []) is None  # the user's workers are workers too
    none = Search(None, CATALOGUE, ctx, {"data.num_workers": 0, "data.prefetch_factor": 2}, cfg, lambda: 0.0)
    assert "needs loader workers" in none._eligible(by_name["prefetch"], [], [])
    assert (
        none._eligible(by_name["prefetch"], ["data.auto_workers=true", "data.persistent_workers=true"], ["workers"])
        is None
    )


def _offered(objective: str, data_name: str = "imagefolder") -> tuple:
    """(the candidates the search offers in turn on an input-bound run with nothing kept, why each
    other one is not offered) for ``tune.objective``, with the context built as the tuner builds it."""
    from types import SimpleNamespace

    from trainer.tune.candidates import CATALOGUE, Context
    from trainer.tune.search import Search

    hw = SimpleNamespace(accelerator="cpu", bf16_native=True, capability="", cpu_cores=4)
    run_cfg = SimpleNamespace(data=SimpleNamespace(name=data_name), tune=SimpleNamespace(objective=objective))
    tune_cfg = SimpleNamespace(
        budget_min=30, horizon_epochs=10, verify_epochs=1, acc_tolerance=0.02, objective=objective
    )
    search = Search(None, CATALOGUE, Context.of(hw, run_cfg), {"data.decoder": "pil"}, tune_cfg, lambda: 0.0)
    offered = []
    while (cand := search._next("input pipeline", [], [], set(offered))) is not None:
        offered.append(cand.name)
    return offered, {c.name: search._eligible(c, [], []) for c in CATALOGUE if c.name not in offered}


def test_a_probes_time_to_target_and_compile_cost_include_what_the_process_paid_before_its_first_epoch(tmp_path):
    """The first epoch's setup_s (the compiler's warm-up, the first workers' start) and what its
    validation's compile cost (val_compile_s) count in a probe's time to target, as in the report's;
    the compiler's warm-up counts in the compile cost spread over the horizon: compile=true is not
    given a head start."""
    from trainer.measure import time_to_target as ttt
    from trainer.tune.result import from_metrics

    epochs = [
        {"epoch": 0, "time_s": 1.5, "samples": 100, "warmup": True, "setup_s": 2.5, "val_compile_s": 0.5, "val_acc": 0.5},
        {"epoch": 1, "time_s": 1.0, "samples": 100, "val_acc": 0.95},
    ]  # fmt: skip
    metrics = {"status": "ok", "epochs": epochs, "compile_time_s": 1.2, "compile_warmup_s": 2.4, "val_acc": 0.95}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    result = from_metrics("target", ["compile=true"], tmp_path, 9.0, "")
    assert sum(result.to_target(0.9)) == pytest.approx(5.5) == ttt.reach(epochs, 0.9)[0]
    assert result.compile_s == pytest.approx(3.6)


def test_with_validations_within_epochs_a_run_reaches_the_target_where_a_stopped_one_stops(tmp_path):
    """report.val_per_epoch=2 under time_to_target: the baseline's verification (not stopped) and a
    candidate's run to the target (stop_at_acc stops it there) reach 0.9 at the same validation half-way
    through the second epoch; the same configuration is not faster for being stopped (the verification
    was counted to its epoch's end), and both agree with the report's time to target."""
    from trainer.measure import time_to_target as ttt
    from trainer.measure.time_to_target import to_target_interval
    from trainer.tune.result import from_metrics

    def validations(accs, upto=2):
        return [
            {"step": 5 * (k + 1), "fraction": 0.5 * (k + 1), "train_s": 1.0 * (k + 1), "val_acc": a}
            for k, a in enumerate(accs[:upto])
        ]

    first = {"epoch": 0, "time_s": 2.0, "samples": 100, "warmup": True, "setup_s": 1.0, "val_acc": 0.6}
    first["validations"] = validations([0.5, 0.6])
    whole = {"epoch": 1, "time_s": 2.0, "samples": 100, "val_acc": 0.95, "validations": validations([0.9, 0.95])}
    cut = dict(whole, time_s=1.0, samples=50, partial=True, val_acc=0.9, validations=validations([0.9], upto=1))
    results = {}
    for name, epochs in (("verify", [first, whole]), ("target", [first, cut])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"status": "ok", "epochs": epochs}))
        results[name] = from_metrics(name, [], tmp_path / name, 9.0, "")
        assert sum(results[name].to_target(0.9)) == pytest.approx(4.0) == ttt.reach(epochs, 0.9)[0], name
        assert results[name].epochs_to_target(0.9) == 1.5 == ttt.reach(epochs, 0.9)[1], name
    assert results["verify"].to_target(0.97) is None
    # the interval resamples a last half epoch as half a steady epoch (4 s against a whole epoch's 5 s)
    half, whole_epoch = [([3.0, 1.0], [2.0, 2.0], 0.5)] * 2, [([3.0, 2.0], [2.0, 2.0], 1.0)] * 2
    assert to_target_interval(half, whole_epoch) == (pytest.approx(0.8), pytest.approx(0.8))


def test_progressive_resize_and_ema_are_offered_only_when_judged_by_the_time_to_target():
    """They change how many epochs reach the accuracy, not (ema) or not only (progressive_resize) an
    epoch's time: judged by epoch time, progressive_resize would be kept for its cheap small epochs
    whatever they cost in accuracy's epochs, and ema never. Under time_to_target they come after the
    bottleneck's groups, in the catalogue's order."""
    by_epoch, why_not = _offered("epoch_time")
    assert by_epoch and "workers" in by_epoch and "decode_scale" in by_epoch  # the list is there at all
    assert "progressive_resize" not in by_epoch and "ema" not in by_epoch
    for name in ("progressive_resize", "ema"):
        assert "tried with tune.objective=time_to_target" in why_not[name], why_not[name]
    to_target, _ = _offered("time_to_target")
    assert to_target == by_epoch + ["progressive_resize", "ema"]


def test_decode_scale_is_offered_for_every_format_that_decodes_jpegs():
    for data in ("imagefolder", "builtin", "imagenette", "parquet", "webdataset"):
        assert "decode_scale" in _offered("epoch_time", data)[0], data
    offered, why_not = _offered("epoch_time", "synthetic")
    assert "decode_scale" not in offered and why_not["decode_scale"] == "data=synthetic decodes no images"


def test_a_journal_cut_mid_line_resumes_and_a_foreign_one_is_refused(tmp_path):
    from trainer.errors import ConfigError
    from trainer.tune.probe import Journal, Result

    settings = {"probe_batches": 6, "probe_epochs": 4, "verify_epochs": 1}
    journal = Journal(tmp_path, ["amp=true"], settings)
    journal.add(Result("probe", [], "/runs/0", "ok", steady=[[1.0, 10]]))
    journal.add(Result("probe", ["channels_last=true"], "/runs/1", "ok", steady=[[0.9, 10]]))
    text = (tmp_path / "tune_journal.jsonl").read_text()
    (tmp_path / "tune_journal.jsonl").write_text(text[: len(text) - 20])  # killed while appending the second
    again = Journal(tmp_path, ["amp=true"], settings)
    assert again.replay("probe", []).dir == "/runs/0" and again.replay("probe", []) is None  # the n-th request, once
    assert again.replay("probe", ["channels_last=true"]) is None  # the cut one runs again
    with pytest.raises(ConfigError, match="other probe settings"):
        Journal(tmp_path, ["amp=true"], {**settings, "probe_batches": 7})
    with pytest.raises(ConfigError, match="other overrides"):
        Journal(tmp_path, ["amp=false"], settings)


def test_a_refused_resume_of_a_tune_keeps_its_config_files_and_a_damaged_journal_is_named(tmp_path):
    """The journal's settings are checked after Hydra has rewritten the run dir's .hydra/ files: a
    refused resume puts the tune's own back. A journal whose first line is not a tune's says so
    (it read as "a tune of other overrides (none)")."""
    run_dir = tmp_path / "tune"
    (run_dir / ".hydra").mkdir(parents=True)
    header = {
        "tune": 1,
        "overrides": ["model=tiny"],
        "settings": {"probe_batches": 6, "probe_epochs": 4, "verify_epochs": 1},
    }
    (run_dir / "tune_journal.jsonl").write_text(json.dumps(header) + "\n")
    kept = {name: f"- the first tune's {name}\n" for name in ("config.yaml", "overrides.yaml", "hydra.yaml")}
    for name, text in kept.items():
        (run_dir / ".hydra" / name).write_text(text)
    r = _tune(
        "model=tiny", f"hydra.run.dir={run_dir}", "tune.probe_batches=7", "tune.probe_epochs=4", "tune.verify_epochs=1"
    )
    assert r.returncode == 2 and "other probe settings" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()} == kept
    (run_dir / "tune_journal.jsonl").write_text("\x00\x00 not json\n")
    r = _tune("model=tiny", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2 and "does not start with a tune journal's first line" in r.stderr, r.stderr[-2000:]


def test_a_run_to_the_target_is_bounded_by_the_baselines_verification(tmp_path):
    """Under time_to_target every candidate trains to the target: one that hangs (a loader's deadlock)
    is stopped at three times the baseline's verification (at least 300 s), not waited for for ever."""
    from types import SimpleNamespace

    from trainer.tune.probe import Prober, Result

    prober = Prober(tmp_path, [], SimpleNamespace(budget_min=2.0), journal=None)
    assert prober.time_limit_s("probe") == 300.0 and prober.time_limit_s("verify") is None
    assert prober.time_limit_s("target") is None  # no verification yet: nothing to bound it by
    prober._count(Result("verify", [], "/runs/0", "failed", wall_s=900.0))  # a failed one sets nothing
    prober._count(Result("verify", [], "/runs/1", "ok", wall_s=50.0))
    assert prober.time_limit_s("target") == 300.0
    prober._count(Result("verify", [], "/runs/2", "ok", wall_s=400.0))
    assert prober.time_limit_s("target") == 1200.0 and prober.time_limit_s("verify") is None


def test_a_resume_that_asks_for_other_runs_measures_them_and_everything_after_them_again(tmp_path):
    """A tune resumed with a larger budget goes past where the first stopped: from there on nothing is
    served from the journal, so the first tune's end-of-tune runs never answer the new search's
    "measured again right after" or "back to back" requests."""
    from trainer.tune.probe import Journal, Result

    settings = {"probe_batches": 6, "probe_epochs": 4, "verify_epochs": 1}
    first = Journal(tmp_path, [], settings)
    order = [[], ["amp=true"], [], [], ["amp=true"]]  # baseline, amp, incumbent again, baseline-final, winner-final
    for i, config in enumerate(order):
        first.add(Result("probe", config, f"/runs/{i}", "ok", steady=[[1.0, 10]]))
    again = Journal(tmp_path, [], settings)
    assert [again.replay("probe", c).dir for c in order[:3]] == ["/runs/0", "/runs/1", "/runs/2"]  # in order
    assert again.replay("probe", ["amp=true", "channels_last=true"]) is None  # the budget's new candidate
    assert again.replay("probe", []) is None  # its incumbent measured again: now, not the old baseline-final
    lines = (tmp_path / "tune_journal.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3  # the header and the records served; the rest set aside, not deleted:
    (aside,) = tmp_path.glob("tune_journal.set_aside.*.jsonl")
    assert [json.loads(line)["dir"] for line in aside.read_text().splitlines()[1:]] == ["/runs/3", "/runs/4"]
    again.add(Result("probe", ["amp=true", "channels_last=true"], "/runs/5", "ok", steady=[[0.9, 10]]))
    third = Journal(tmp_path, [], settings)
    assert [third.replay("probe", c).dir for c in [*order[:3], ["amp=true", "channels_last=true"]]] == [
        "/runs/0",
        "/runs/1",
        "/runs/2",
        "/runs/5",
    ]


def test_a_bad_tuned_file_is_one_paragraph(tmp_path):
    bad = tmp_path / "best.yaml"
    bad.write_text("amp: true\n")
    r = subprocess.run(
        [sys.executable, "train.py", f"+tuned={bad}"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "no 'overrides:' list" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_dali_is_a_candidate_for_image_files_where_installed_and_then_the_torch_loaders_own_are_not():
    """data.loader=dali: offered on an input-bound image folder (DALI is installed with the tests);
    kept, the torch loader's decoder, cache, prefetch and copy candidates are skipped, saying why;
    and not offered where DALI cannot read the data or run the recipe's augmentation."""
    from types import SimpleNamespace

    from trainer.tune.candidates import CATALOGUE, Context
    from trainer.tune.search import Search

    pytest.importorskip("nvidia.dali")
    offered, _ = _offered("epoch_time")
    assert "dali" in offered, offered
    ctx = Context(cuda=True, bf16_native=True, capability=9.0, cores=16, data_name="imagefolder", allocators=())
    cfg = SimpleNamespace(budget_min=30, horizon_epochs=10, verify_epochs=1, acc_tolerance=0.02)
    by_name = {c.name: c for c in CATALOGUE}
    search = Search(None, CATALOGUE, ctx, {"data.decoder": "pil"}, cfg, lambda: 0.0)
    kept = ["data.loader=dali", "data.auto_workers=true"]
    for name in ("decoder_turbo", "decode_scale", "cache_in_memory", "decoder_nvjpeg", "pin_memory", "device_prefetch"):
        assert search._eligible(by_name[name], [], []) is None or name == "decoder_turbo", name
        assert "data.loader=dali reads" in search._eligible(by_name[name], kept, ["dali"]), name
    packed = Context(cuda=False, bf16_native=True, capability=0.0, cores=4, data_name="packed", allocators=())
    assert "not a folder of image files" in by_name["dali"].skip(packed, {})
    assert "random erasing" in by_name["dali"].skip(ctx, {"data.random_erasing": 0.25})
    assert by_name["dali"].skip(ctx, {"data.augment_policy": "randaugment"}) is None  # DALI's own policies


def test_the_loaders_candidates_are_not_offered_where_synthetic_batches_are_gathered_on_the_device():
    """data=synthetic's default gathers batches where the model trains: no loader whose workers,
    pinning, prefetch or normalization a probe could change, so no probe is spent on them; with
    data.device_resident=false they are offered again."""
    from trainer.tune.candidates import CATALOGUE, Context

    by_name = {c.name: c for c in CATALOGUE}
    ctx = Context(cuda=True, bf16_native=True, capability=9.0, cores=16, data_name="synthetic", allocators=())
    for name in ("workers", "pin_memory", "device_prefetch", "gpu_normalize", "prefetch"):
        assert "data.device_resident=true" in by_name[name].skip(ctx, {"data.device_resident": True}), name
    host = {"data.device_resident": False}
    assert all(
        by_name[n].skip(ctx, host) is None for n in ("workers", "pin_memory", "device_prefetch", "gpu_normalize")
    )
