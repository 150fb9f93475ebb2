"""The A/B report: baseline choice, speedup, noise and accuracy flags, failed rows, the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from trainer import console, report


def _job(root, name, flags, times, val_acc=0.5, status="ok", error=None, overrides=(), val_samples=None, accs=None):
    d = root / name
    d.mkdir(parents=True)
    epochs = [
        {
            "epoch": i,
            "time_s": t,
            "samples": 320,
            "samples_per_s": 320 / t,
            "data_wait_s": 0.01,
            "steps": 20,
            "warmup": i == 0,
        }
        for i, t in enumerate(times)
    ]
    for epoch, acc in zip(epochs, accs or []):
        epoch["val_acc"] = acc
    steady = sorted(t for t in times[1:]) or times
    m = {
        "schema": 1,
        "status": status,
        "error": error,
        "recipe": None,
        "flags": {"amp": False, "compile": False, "channels_last": False, "accumulate": 1, "strategy": "auto", **flags},
        "device": {"accelerator": "cpu", "name": "test", "count": 1},
        "epochs": epochs,
        "epoch_time_s": steady[len(steady) // 2] if status == "ok" else None,
        "samples_per_s": 100.0,
        "data_wait_fraction": 0.01,
        "peak_memory_mb": 100.0,
        "train_loss": 1.0,
        "val_acc": val_acc,
        "overrides": list(overrides),
        "val_samples": val_samples,
    }
    (d / "metrics.json").write_text(json.dumps(m))
    return d


def test_rows_baseline_speedup_noise_accuracy_and_failure(tmp_path):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {"amp": True}, [3.0, 1.0, 1.0, 1.0], val_acc=0.50)  # not the baseline even though first
    _job(sweep, "1", {}, [3.0, 2.0, 2.1, 1.9], val_acc=0.50)  # all off -> baseline
    _job(sweep, "2", {"channels_last": True}, [3.0, 1.95, 2.05, 2.0], val_acc=0.40)  # within noise, accuracy drop
    _job(sweep, "3", {"amp": True, "channels_last": True}, [3.0], status="failed", error="RuntimeError: boom")
    _job(sweep, "10", {"amp": True, "channels_last": True}, [2.0])  # single epoch: warm-up only; natural sort after 3
    columns, rows, base = report.build_rows(report.load_jobs([str(sweep)]))
    assert columns[:3] == ["job", "amp", "channels_last"]
    assert [r["job"] for r in rows] == ["0", "1", "2", "3", "10"]
    assert base.name == "1"
    by = {r["job"]: r for r in rows}
    assert by["1"]["speedup"] == 1.0 and "baseline" in by["1"]["notes"]
    assert by["0"]["speedup"] == 2.0 and "within noise" not in by["0"]["notes"]
    assert "within noise" in by["2"]["notes"] and "ACCURACY DROP" in by["2"]["notes"]
    assert by["3"]["status"] == "failed" and "RuntimeError: boom" in by["3"]["notes"] and by["3"]["speedup"] is None
    assert "warm-up only" in by["10"]["notes"]


def test_a_copy_of_metrics_json_inside_a_run_dir_is_not_a_row(tmp_path):
    """W&B keeps a copy of each attempt's metrics.json under <run dir>/wandb/*/files/: the run dir's
    own file is its row, and nothing below it is another."""
    sweep = tmp_path / "sweep"
    for name, flags, times in (("0", {}, [3.0, 2.0, 2.0]), ("1", {"amp": True}, [3.0, 1.0, 1.0])):
        job = _job(sweep, name, flags, times)
        for attempt in ("offline-run-a", "offline-run-b"):
            copy = job / "wandb" / attempt / "files"
            copy.mkdir(parents=True)
            (copy / "metrics.json").write_text((job / "metrics.json").read_text())
    _job(sweep / "nested", "2", {"channels_last": True}, [3.0, 2.0, 2.0])  # a run dir deeper in the sweep dir
    found = report.find_metrics([str(sweep)])
    assert [str(p.relative_to(sweep)) for p in found] == ["0/metrics.json", "1/metrics.json", "nested/2/metrics.json"]
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]))
    assert len(rows) == 3


def test_an_accuracy_drop_within_the_val_sets_sampling_noise_is_not_called_a_drop(tmp_path):
    # 0.80 vs 0.75: on 150 val samples each that is about 1 standard error (noise +-0.094);
    # on 5000 samples it is far outside the noise (+-0.016)
    for sweep, n in (("small", 150), ("large", 5000)):
        _job(tmp_path / sweep, "0", {}, [2, 1, 1, 1], val_acc=0.80, val_samples=n)
        _job(tmp_path / sweep, "1", {"amp": True}, [2, 1, 1, 1], val_acc=0.75, val_samples=n)
    _, small, _ = report.build_rows(report.load_jobs([str(tmp_path / "small")]))
    _, large, _ = report.build_rows(report.load_jobs([str(tmp_path / "large")]))
    assert (
        "ACCURACY DROP" not in small[1]["notes"]
        and "val_acc -0.050 not a significant drop (+-0.094 on 150 val samples)" in small[1]["notes"]
    )
    assert "ACCURACY DROP -0.050" in large[1]["notes"] and "not a significant drop" not in large[1]["notes"]
    assert report.accuracy_noise(0.8, 150, 0.75, 150) == pytest.approx(
        1.96 * (0.8 * 0.2 / 150 + 0.75 * 0.25 / 150) ** 0.5
    )
    assert report.accuracy_noise(0.8, None, 0.75, 150) is None  # older metrics.json: the fixed threshold alone


def test_varied_keys_include_overrides(tmp_path):
    _job(tmp_path, "a", {}, [2, 1, 1], overrides=["data.num_workers=0", "hydra.run.dir=x"])
    _job(tmp_path, "b", {}, [2, 0.5, 0.5], overrides=["data.num_workers=2", "hydra.run.dir=y"])
    jobs = report.load_jobs([str(tmp_path / "a"), str(tmp_path / "b")])
    assert report.varied_keys(jobs) == ["data.num_workers"]
    _, rows, base = report.build_rows(jobs)
    assert base.first.path.name == "a" and rows[1]["speedup"] == 2.0


def test_cli_rebuilds_report_from_several_dirs(tmp_path):
    _job(tmp_path / "day1", "0", {}, [2, 1, 1])
    _job(tmp_path / "day2", "0", {"compile": True}, [9, 0.8, 0.8])
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "trainer.report", str(tmp_path / "day1"), str(tmp_path / "day2"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "| compile |" in (out / "ab_report.md").read_text().replace("| job | compile |", "| compile |")
    assert (out / "ab_report.csv").read_text().count("\n") == 3
    assert (out / "ab_report.png").stat().st_size > 5000
    assert "1.25x" in r.stdout


def test_cli_on_missing_dir_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "trainer.report", str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2 and "no such dir" in r.stderr and "Traceback" not in r.stderr


def test_cli_on_an_out_that_is_a_file_or_a_metrics_json_that_is_no_record_says_so(tmp_path):
    """--out naming a file is one paragraph (it raised FileExistsError); a job whose metrics.json holds a
    JSON list is an unreadable row, beside the others (it raised AttributeError)."""
    from trainer.report.write import main

    _job(tmp_path / "sweep", "0", {}, [2, 1, 1])
    (tmp_path / "sweep" / "1").mkdir()
    (tmp_path / "sweep" / "1" / "metrics.json").write_text("[]")
    taken = tmp_path / "afile"
    taken.write_text("mine")
    r = subprocess.run(
        [sys.executable, "-m", "trainer.report", str(tmp_path / "sweep"), "--out", str(taken)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "that is a file" in r.stderr and "Traceback" not in r.stderr
    assert taken.read_text() == "mine"
    assert main([str(tmp_path / "sweep")]) == 0
    rows = (tmp_path / "sweep" / "ab_report.csv").read_text()
    assert "unreadable metrics.json: a JSON list" in rows


def test_report_does_not_import_torch():
    code = "import sys, trainer.report; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parallel_launcher_gets_a_timing_warning(caplog):
    from omegaconf import OmegaConf

    from trainer.launch import stopping
    from trainer.sweep import SweepCallback

    cb = SweepCallback()
    cb.on_multirun_start(
        OmegaConf.create(
            {"hydra": {"launcher": {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"}}}
        )
    )
    assert "interfere" in caplog.text
    caplog.clear()
    try:
        cb.on_multirun_start(
            OmegaConf.create(
                {"hydra": {"launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}}}
            )
        )
    finally:
        stopping.uninstall_all()  # jobs in this process: it routed the stop signals here
    assert "interfere" not in caplog.text


def _steady(root, name, flags, steady, overrides=()):
    """A job with one warm-up epoch and the given steady epoch times."""
    return _job(root, name, flags, [max(steady) * 2] + list(steady), overrides=overrides)


def test_a_3_percent_gain_with_tight_spreads_is_a_speedup(tmp_path):
    _steady(tmp_path, "0", {}, [1.000, 1.004, 0.998, 1.002, 0.999, 1.001])
    _steady(tmp_path, "1", {"amp": True}, [0.970, 0.972, 0.969, 0.971, 0.968, 0.970])
    _, rows, _ = report.build_rows(report.load_jobs([str(tmp_path)]))
    row = rows[1]
    assert row["speedup"] == pytest.approx(1.031, abs=0.002)
    lo, hi = (float(x) for x in row["speedup_ci"].split("-"))
    assert 1.0 < lo <= row["speedup"] <= hi
    assert "within noise" not in row["notes"]


def test_an_8_percent_gain_with_wide_overlapping_spreads_is_within_noise(tmp_path):
    _steady(tmp_path, "0", {}, [1.00, 0.78, 1.22, 0.90, 1.10])
    _steady(tmp_path, "1", {"amp": True}, [0.92, 0.74, 1.15, 0.84, 1.02])
    _, rows, _ = report.build_rows(report.load_jobs([str(tmp_path)]))
    row = rows[1]
    assert row["speedup"] == pytest.approx(1.087, abs=0.002)
    lo, hi = (float(x) for x in row["speedup_ci"].split("-"))
    assert lo < 1.0 < hi and "within noise" in row["notes"]


def test_repeats_fold_into_one_row_with_their_spread(tmp_path):
    for i, (flags, t) in enumerate(
        [({}, 1.00), ({"amp": True}, 0.80), ({}, 1.04), ({"amp": True}, 0.82), ({}, 0.98), ({"amp": True}, 0.79)]
    ):
        _steady(
            tmp_path, str(i), flags, [t, t * 1.01], overrides=[f"repeat={i // 2}", "amp=" + str(bool(flags)).lower()]
        )
    columns, rows, base = report.build_rows(report.load_jobs([str(tmp_path)]))
    assert "repeat" not in columns and "repeats" in columns
    assert [r["job"] for r in rows] == ["0,2,4", "1,3,5"] and [r["repeats"] for r in rows] == [3, 3]
    assert rows[0]["spread_s"] == "0.985-1.045"  # min-max of the repeats' medians
    assert rows[1]["speedup"] == pytest.approx(1.005 / 0.8040, abs=0.01) and "within noise" not in rows[1]["notes"]
    lo, hi = (float(x) for x in rows[1]["speedup_ci"].split("-"))
    assert lo <= rows[1]["speedup"] <= hi


def test_the_same_settings_from_two_sweeps_are_compared_not_folded(tmp_path):
    _steady(tmp_path / "monday", "0", {}, [1.0, 1.0], overrides=["seed=1"])
    _steady(tmp_path / "tuesday", "0", {}, [0.5, 0.5], overrides=["seed=1"])
    _, rows, _ = report.build_rows(report.load_jobs([str(tmp_path / "monday"), str(tmp_path / "tuesday")]))
    assert [r["job"] for r in rows] == ["monday/0", "tuesday/0"] and rows[1]["speedup"] == 2.0


def test_seed_sweep_folds_too_and_names_stay_unique_across_sweeps(tmp_path):
    _steady(tmp_path / "a", "0", {}, [1.0, 1.0], overrides=["seed=1"])
    _steady(tmp_path / "a", "1", {}, [1.0, 1.0], overrides=["seed=2"])
    _steady(tmp_path / "b", "0", {"amp": True}, [0.5, 0.5], overrides=["seed=1"])
    _, rows, _ = report.build_rows(report.load_jobs([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert [r["job"] for r in rows] == ["a/0,a/1", "b/0"]


def test_the_header_says_how_noise_was_judged(tmp_path):
    _steady(tmp_path, "0", {}, [1.0, 1.0])
    _steady(tmp_path, "1", {"amp": True}, [0.5, 0.5])
    md = report.write_report([str(tmp_path)], str(tmp_path), echo=False)
    assert "bootstrap interval" in md and "contains 1.00x" in md and "speedup_ci" in md


def test_time_to_target_a_faster_epoch_that_needs_more_epochs_loses_and_a_row_that_never_gets_there_says_so(
    tmp_path, monkeypatch
):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [2.0] * 6, accs=[0.5, 0.7, 0.8, 0.9, 0.9, 0.9])  # baseline: best 0.9
    _job(sweep, "1", {"amp": True}, [1.5] * 6, accs=[0.3, 0.5, 0.6, 0.7, 0.8, 0.9])  # faster epochs, slower learning
    _job(sweep, "2", {"channels_last": True}, [1.8] * 6, accs=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8])  # never reaches it
    columns, rows, base = report.build_rows(report.load_jobs([str(sweep)]))  # target auto: 0.9 - 0.01
    at = columns.index("val_acc") + 1
    assert columns[at : at + len(report.TIME_TO_TARGET_COLUMNS)] == report.TIME_TO_TARGET_COLUMNS
    baseline, faster, never = rows
    assert (baseline["time_to_target_s"], baseline["epochs_to_target"]) == (8.0, 4)
    assert faster["speedup"] > 1.3  # the epoch-time table calls it a win ...
    assert (faster["time_to_target_s"], faster["epochs_to_target"]) == (9.0, 6)
    assert faster["time_to_target_speedup"] == pytest.approx(8.0 / 9.0, abs=1e-3)  # ... time to target does not
    assert never["time_to_target_s"] is None and "target not reached" in never["notes"]
    assert baseline["val_share"] is None  # these planted runs recorded no validation time
    # an explicit target
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc=0.75)
    assert [r["time_to_target_s"] for r in rows] == [6.0, 7.5, 10.8]
    # off: no columns
    columns, _, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    assert "time_to_target_s" not in columns
    # the written report says how the target was chosen, and the chart gains the curves: read back
    # from the figure write_report saved (its own, passed through unchanged)
    drawn, real_chart = [], report.chart
    monkeypatch.setattr("trainer.report.write.chart", lambda *args: drawn.append(real_chart(*args)) or drawn[-1])
    markdown = report.write_report([str(sweep)], str(sweep), echo=False)
    assert "target val_acc 0.890 = the baseline's best 0.900 minus 0.01" in markdown
    assert "| 0.89x (1 run) | - | not judged |" in markdown and (sweep / "ab_report.png").stat().st_size > 0
    (figure,) = drawn
    bars, curves = figure.axes  # epoch time, then accuracy against training time
    assert [round(bar.get_width(), 3) for bar in bars.patches] == [2.0, 1.5, 1.8]
    assert curves.get_title() == "time to accuracy: val_acc after each epoch"
    lines = [line for line in curves.get_lines() if line.get_marker() == "o"]
    assert len(lines) == 3  # one curve per row, each the row's training time so far and its val_acc
    planted = {
        2.0: [0.5, 0.7, 0.8, 0.9, 0.9, 0.9],
        1.5: [0.3, 0.5, 0.6, 0.7, 0.8, 0.9],
        1.8: [0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
    }
    for line, (epoch_s, accs) in zip(lines, planted.items()):
        assert list(line.get_xdata()) == pytest.approx([epoch_s * (i + 1) for i in range(6)])
        assert list(line.get_ydata()) == accs
    (target,) = [line for line in curves.get_lines() if line.get_linestyle() == "--"]
    assert list(target.get_ydata()) == [pytest.approx(0.89)] * 2
    # with the target off, the chart has the bars alone
    drawn.clear()
    report.write_report([str(sweep)], str(sweep), echo=False, target_acc="off")
    assert len(drawn[0].axes) == 1


def test_validation_share_is_reported_beside_the_time_to_target_it_is_kept_out_of(tmp_path):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [2.0] * 4, accs=[0.5, 0.7, 0.9, 0.9])
    _job(sweep, "1", {"amp": True}, [1.0] * 4, accs=[0.5, 0.7, 0.9, 0.9])
    for job, val_s in (("0", 0.5), ("1", 1.0)):  # each epoch validated in 0.5 s / 1.0 s
        path = sweep / job / "metrics.json"
        m = json.loads(path.read_text())
        for epoch in m["epochs"]:
            epoch["val_time_s"] = val_s
        path.write_text(json.dumps(m))
    columns, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc=0.9)
    assert "val_share" in columns
    assert rows[0]["val_share"] == pytest.approx(0.5 / 2.5) and rows[1]["val_share"] == pytest.approx(0.5)
    # validation stays out of the time to target: 3 epochs of training each
    assert (rows[0]["time_to_target_s"], rows[1]["time_to_target_s"]) == (6.0, 3.0)
    md = report.write_report([str(sweep)], str(sweep), echo=False, target_acc=0.9)
    assert "val_share is validation's share" in md and "| 0.500 |" in md


def test_time_to_target_speedup_has_an_interval_over_repeats(tmp_path):
    sweep = tmp_path / "sweep"
    for seed, (a, b) in enumerate([(8.0, 4.0), (8.4, 4.2), (7.6, 3.8)]):
        _job(sweep, f"b{seed}", {"seed": seed}, [a / 4] * 4, accs=[0.2, 0.4, 0.6, 0.9])
        _job(sweep, f"f{seed}", {"seed": seed, "amp": True}, [b / 4] * 4, accs=[0.2, 0.4, 0.6, 0.9])
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]))
    fast = next(r for r in rows if r["amp"])
    assert fast["time_to_target_speedup"] == pytest.approx(2.0, abs=1e-3)
    low, high = (float(x) for x in fast["time_to_target_ci"].split("-"))
    # each side's median over 3 resampled repeats is its lowest or highest time with probability 7/27,
    # so both extremes of the ratio (7.6/4.2 and 8.4/3.8, each 6.7% of the draws) lie inside a 95%
    # interval: the interval spans the planted spread, not the one ratio of the medians
    assert low == pytest.approx(7.6 / 4.2, abs=1e-3) and high == pytest.approx(8.4 / 3.8, abs=1e-3)


def test_elapsed_time_counts_a_resumed_partial_epoch_as_a_full_one():
    from trainer.measure.time_to_target import reach, with_elapsed

    epochs = [
        {"epoch": 0, "time_s": 2.0, "steps": 10, "val_time_s": 0.5, "val_acc": 0.4},
        {"epoch": 1, "time_s": 1.0, "steps": 5, "partial": True, "resumed": True, "val_time_s": 0.5, "val_acc": 0.6},
        {"epoch": 2, "time_s": 2.2, "steps": 10, "val_time_s": 0.5, "val_acc": 0.8},
    ]
    timed = with_elapsed(epochs)
    assert [e["elapsed_train_s"] for e in timed] == [2.0, pytest.approx(4.1), pytest.approx(6.3)]
    assert timed[1]["elapsed_estimated"] and [e["elapsed_val_s"] for e in timed] == [0.5, 1.0, 1.5]
    assert reach(epochs, 0.6) == (pytest.approx(4.1), 2) and reach(epochs, 0.95) is None


def _sweep_to_a_target(root):
    """Two jobs whose val_acc reaches 0.75 at epoch 2, 0.89 at epoch 3 and 0.9 at epoch 4 (2 s and 1 s epochs)."""
    sweep = root / "sweep"
    for name, flags, epoch_s in (("0", {}, 2.0), ("1", {"amp": True}, 1.0)):
        _job(sweep, name, flags, [epoch_s] * 4, accs=[0.5, 0.8, 0.895, 0.9])
    return sweep


def _baseline_time_to_target(sweep):
    import csv

    with open(sweep / "ab_report.csv") as f:
        return float(next(csv.DictReader(f))["time_to_target_s"])


@pytest.mark.parametrize(
    "settings, said, seconds",
    [
        (["report.target_acc=0.75"], "target val_acc 0.750 (report.target_acc)", 4.0),
        (["report.target_tolerance=0"], "the baseline's best 0.900 minus 0.0 (report.target_acc=auto)", 8.0),
        ([], "the baseline's best 0.900 minus 0.01 (report.target_acc=auto)", 6.0),
    ],
)
def test_a_sweeps_report_settings_reach_its_ab_report(tmp_path, settings, said, seconds):
    """report.target_acc and report.target_tolerance of a sweep's command line decide the target of the
    A/B report its end writes (Hydra's on_multirun_end, with the config Hydra composes); a tolerance
    of 0 is the baseline's best itself, not the default's 0.01 below it."""
    from hydra import compose, initialize_config_dir

    from trainer.config.compose import CONFIG_DIR, prepare_hydra
    from trainer.sweep import SweepCallback

    sweep = _sweep_to_a_target(tmp_path)
    prepare_hydra()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        config = compose(
            config_name="train", overrides=[f"hydra.sweep.dir={sweep}", *settings], return_hydra_config=True
        )
    SweepCallback().on_multirun_end(config)
    assert said in (sweep / "ab_report.md").read_text()
    assert _baseline_time_to_target(sweep) == seconds


def test_cli_target_acc_and_tolerance_choose_the_target_and_a_bad_value_is_one_paragraph(tmp_path):
    sweep = _sweep_to_a_target(tmp_path)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "trainer.report", str(sweep), *args], capture_output=True, text=True
        )

    r = cli("--target-acc", "0.75")
    assert r.returncode == 0, r.stderr
    assert "target val_acc 0.750" in (sweep / "ab_report.md").read_text() and _baseline_time_to_target(sweep) == 4.0
    r = cli("--target-tolerance", "0")
    assert r.returncode == 0, r.stderr
    assert "best 0.900 minus 0.0 " in (sweep / "ab_report.md").read_text() and _baseline_time_to_target(sweep) == 8.0
    for bad in ("high", "1.5", "0"):
        r = cli("--target-acc", bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
        assert r.stderr.strip() == f"error: --target-acc {bad!r}: allowed are auto, off or a number in (0, 1]"
    r = cli("--target-tolerance", "-0.1")
    assert r.returncode == 2 and r.stderr.strip() == "error: --target-tolerance -0.1: allowed is a number in [0, 1)"


def _to_target_sweep(root):
    """Planted journals of one sweep, each row reaching val_acc 0.9 at epoch 3 or 4 (1 s epochs):
    the baseline and amp=true over seeds 1-3, channels_last=true three times with seed 7
    (repeats of one seed), compile=true once. Times vary across runs, so every ratio with two runs
    a side has an interval."""
    sweep = root / "sweep"
    n = 0

    def job(flags, overrides, epoch_s, reach):
        nonlocal n
        accs = [0.5 + 0.4 * (i + 1 >= reach) for i in range(5)]
        _job(sweep, str(n), flags, [epoch_s] * 5, accs=accs, overrides=overrides)
        n += 1

    for seed, reach in ((1, 3), (2, 4), (3, 3)):
        job({}, [f"seed={seed}"], 1.0 + 0.02 * seed, reach)
        job({"amp": True}, [f"seed={seed}", "amp=true"], 0.8 + 0.02 * seed, reach + (seed == 3))
    for repeat in range(3):
        job({"channels_last": True}, ["seed=7", f"repeat={repeat}", "channels_last=true"], 0.9 + 0.01 * repeat, 3)
    job({"compile": True}, ["seed=1", "compile=true"], 0.7, 4)
    return sweep


def _table_rows(printed: str) -> dict:
    """The console's A/B table as {job: {column header: the cell's text, its lines joined}}, read at the
    column spans its dashed rule gives."""
    lines = printed.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[rule])]

    def cells(line):
        return [line[a : b + (2 if k + 1 < len(spans) else len(line))].strip() for k, (a, b) in enumerate(spans)]

    headers = [" ".join(parts).strip() for parts in zip(*(cells(line) for line in lines[:rule]))]
    rows, current = {}, None
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        parts = cells(line)
        if parts[0]:
            current = rows.setdefault(parts[0], {h: [] for h in headers})
        for h, part in zip(headers, parts):
            if part:
                current[h].append(part)
    return {job: {h: " ".join(v) for h, v in row.items()} for job, row in rows.items()}


def test_each_row_says_what_its_time_to_target_interval_holds_in_md_csv_and_console(tmp_path, capsys):
    import csv

    sweep = _to_target_sweep(tmp_path)
    report.write_report([str(sweep)], str(sweep), target_acc=0.9)
    with open(sweep / "ab_report.csv") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["0,2,4", "1,3,5", "6,7,8", "9"]
    holds = {job: r["time_to_target_ci_holds"] for job, r in rows.items()}
    # seeds against seeds; repeats of one seed; one run: no interval, not judged
    assert holds == {"0,2,4": "", "1,3,5": "seeds", "6,7,8": "timing only", "9": "not judged"}
    assert rows["6,7,8"]["time_to_target_ci"] and not rows["9"]["time_to_target_ci"]
    assert "time to target judged on one seed" in rows["6,7,8"]["notes"]
    assert "time to target not judged" in rows["9"]["notes"] and "judged on one seed" not in rows["1,3,5"]["notes"]
    md = (sweep / "ab_report.md").read_text()
    assert "| time_to_target_ci | time_to_target_ci_holds |" in md
    assert "'seeds' where the row and the baseline each ran several seeds" in md  # the header says how
    assert [
        line.split(" | ")[0] + " | " + line.split(" | ")[-5] for line in md.splitlines() if line[2:3].isdigit()
    ] == [
        "| 0,2,4 | -",
        "| 1,3,5 | seeds",
        "| 6,7,8 | timing only",
        "| 9 | not judged",
    ]
    assert "| 1.14x (1 run) | - | not judged |" in md  # the md's unjudged ratio is marked too
    printed = capsys.readouterr().out
    table = _table_rows(printed)
    assert {job: row["interval holds"] for job, row in table.items()} == {
        "0,2,4": "-",
        "1,3,5": "seeds",
        "6,7,8": "timing only",
        "9": "not judged",
    }
    # the console warns where a ratio is judged on one seed, and says how to judge it across seeds
    assert "job(s) 6,7,8: judged on one seed, so the interval holds timing noise only" in printed.replace("\n", " ")
    assert "repeats=N repeat_seeds=true gives each repeat its own seed" in printed.replace("\n", " ")


def test_an_unjudged_ratio_is_marked_and_one_within_noise_says_so(tmp_path, capsys):
    """The demo's case, one run per row: no time-to-target ratio has an interval, and the console
    shows each as not judged, never as a plain number beside judged ones; a row with one steady
    epoch has no epoch-time interval either. A judged ratio whose interval contains 1.00x says so."""
    sweep = tmp_path / "demo"
    accs = {"pil": [0.5, 0.9, 0.99, 1.0], "turbo": [0.5, 0.9, 0.99, 1.0], "slow": [0.5, 0.8, 0.9, 0.99]}
    _job(sweep, "0", {}, [1.5, 1.0, 1.01, 1.02], accs=accs["pil"], overrides=["data.decoder=pil"])
    _job(sweep, "1", {}, [1.1, 0.75, 0.76, 0.74], accs=accs["turbo"], overrides=["data.decoder=turbo"])
    _job(
        sweep, "2", {"channels_last": True}, [1.5, 0.95, 0.96, 0.94], accs=accs["slow"], overrides=["data.decoder=pil"]
    )
    _job(sweep, "3", {"amp": True}, [1.2, 0.8], accs=[0.5, 0.99], overrides=["data.decoder=pil"])  # 1 steady epoch
    report.write_report([str(sweep)], str(sweep))
    table = _table_rows(capsys.readouterr().out)
    ratios = {job: row["speed-up to target"] for job, row in table.items()}
    # target 0.99: the baseline's 3.51 s (3 epochs) over 2.61 s, 4.35 s (4 epochs) and 2.0 s (2 epochs)
    assert ratios == {"0": "baseline", "1": "1.34x (1 run)", "2": "0.81x (1 run)", "3": "1.75x (1 run)"}
    assert {job: row["interval holds"] for job, row in table.items() if job != "0"} == dict.fromkeys(
        "123", "not judged"
    )
    assert re.fullmatch(r"1\.35x \[1\.3\d-1\.3\d\]", table["1"]["epoch speed-up"]), table["1"]
    assert table["3"]["epoch speed-up"] == "1.26x (not judged)"  # 1.01 s / 0.8 s, one steady epoch
    # only what differs from the baseline names a row; the baseline says all of it
    assert table["0"]["configuration"] == "amp=false channels_last=false data.decoder=pil"
    assert [table[j]["configuration"] for j in "123"] == ["data.decoder=turbo", "channels_last=true", "amp=true"]

    # judged, with an interval that contains 1.00x: "within noise", as the epoch-time speed-up says it
    seeds = _to_target_sweep(tmp_path)
    report.write_report([str(seeds)], str(seeds), target_acc=0.9)
    row = _table_rows(capsys.readouterr().out)["1,3,5"]
    assert row["speed-up to target"] == "0.95x [0.89-1.69] within noise" and row["interval holds"] == "seeds"
    # the chart's bar says "(noise)" for its own, the epoch time's interval only
    from trainer.report.figure import chart

    jobs = report.load_jobs([str(seeds)])
    columns, rows, _ = report.build_rows(jobs, target_acc=0.9)
    (amp,) = [r for r in rows if r["job"] == "1,3,5"]
    assert "time to target within noise" in amp["notes"] and "within noise" not in amp["notes"].split("; ")
    texts = [t.get_text() for t in chart(jobs, columns, rows, 0.9).axes[0].texts]
    assert texts[rows.index(amp)].startswith(f"{amp['epoch_time_s']:.3g} s   {amp['speedup']:.2f}x") and not any(
        "(noise)" in t for t in texts
    )


def test_a_baseline_seed_that_misses_the_target_gives_no_row_a_ratio_to_it_and_every_output_says_why(tmp_path, capsys):
    """Both sides under one rule: a ratio to target only where every run of the baseline reached it.
    Taken over the baseline seeds that did, it would measure against a faster baseline than the one
    that ran (here a significant-looking 0.83x for a row that reached the target in every seed)."""
    import csv

    sweep = tmp_path / "sweep"
    base_accs = ([0.5, 0.7, 0.8, 0.9, 0.92], [0.5, 0.6, 0.7, 0.8, 0.85], [0.5, 0.7, 0.8, 0.9, 0.91])
    for seed, accs in enumerate(base_accs, 1):  # the second seed's best, 0.85, is short of the target 0.9
        _job(sweep, str(seed - 1), {}, [1.0] * 5, accs=accs, overrides=[f"seed={seed}"])
    for seed, last in ((1, 1.0), (2, 1.0), (3, 0.9)):
        _job(
            sweep,
            str(seed + 2),
            {"amp": True},
            [1.0] * 4 + [last],
            accs=[0.5, 0.6, 0.7, 0.8, 0.95],
            overrides=[f"seed={seed}", "amp=true"],
        )
    report.write_report([str(sweep)], str(sweep), target_acc=0.9)
    with open(sweep / "ab_report.csv") as f:
        amp, base = sorted(csv.DictReader(f), key=lambda r: r["amp"] == "False")
    assert "target not reached in 1 of 3 repeats" in base["notes"] and not base["time_to_target_s"]
    assert amp["time_to_target_s"] and not amp["time_to_target_speedup"] and not amp["time_to_target_ci"]
    assert "no ratio to target: the baseline missed it in 1 of 3 repeats" in amp["notes"]
    assert not amp["time_to_target_ci_holds"]  # no ratio, nothing to judge
    printed = capsys.readouterr().out
    row = _table_rows(printed)[amp["job"]]
    assert row["speed-up to target"] == "-" and row["interval holds"] == "-"
    assert (
        f"no time-to-target ratio, job(s) {amp['job']}: the baseline missed it in 1 of 3 repeats; rebuild the report at "
        "a target every baseline run reaches" in " ".join(printed.split())
    )
    # the chart still paints the baseline alone grey (the other rows' notes name the baseline too)
    from trainer.report.figure import chart

    jobs = report.load_jobs([str(sweep)])
    columns, rows, base = report.build_rows(jobs, target_acc=0.9)
    bars, curves = chart(jobs, columns, rows, 0.9).axes
    grey = [bar.get_facecolor()[:3] == pytest.approx((0x9E / 255,) * 3, abs=1e-3) for bar in bars.patches]
    assert grey == [r["job"] == base.name for r in rows] and grey.count(True) == 1
    thick = [line.get_linewidth() == 2.5 for line in curves.get_lines() if line.get_marker() == "o"]
    assert thick == grey
    # a baseline that never reaches an explicit target: the rows that do say why they have no ratio
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc=0.93)
    (amp,) = [r for r in rows if r["amp"]]
    assert amp["time_to_target_s"] and amp["time_to_target_speedup"] is None
    assert "no ratio to target: the baseline missed it in 3 of 3 repeats" in amp["notes"]


def test_a_run_that_never_validated_has_no_time_to_target_rather_than_one_it_missed(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [2.0, 1.0, 1.0, 1.0], accs=[0.5, 0.7, 0.8, 0.9])
    _job(sweep, "1", {"amp": True}, [2.0, 0.5, 0.5, 0.5])  # validation off: no epoch logged a val_acc
    _job(sweep, "2", {"channels_last": True}, [2.0, 1.0, 1.0, 1.0], accs=[0.5, 0.6, 0.6, 0.6])
    for seed in (1, 2, 3):  # a row of three seeds, one of which never validated
        accs = None if seed == 2 else [0.5, 0.7, 0.9, 0.9]
        _job(sweep, str(seed + 2), {"compile": True}, [2.0, 1.0, 1.0, 1.0], accs=accs, overrides=[f"seed={seed}"])
    report.write_report([str(sweep)], str(sweep), target_acc=0.85)
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc=0.85)
    assert "not validated: time to target unknown" in rows[1]["notes"] and "not reached" not in rows[1]["notes"]
    assert "target not reached" in rows[2]["notes"]  # validated, and fell short
    assert "not validated in 1 of 3 repeats: time to target unknown" in rows[3]["notes"]
    assert "not reached" not in rows[3]["notes"] and rows[3]["time_to_target_s"] is None
    printed = capsys.readouterr().out
    table = _table_rows(printed)
    assert table["1"]["time to target"] == "not validated" and table["2"]["time to target"] == "not reached"
    assert table["3,4,5"]["time to target"] == "not validated"
    assert "no time to target, job(s) 3,4,5: not validated in 1 of 3 repeats; validate during training" in " ".join(
        printed.split()
    )


def test_a_warm_up_epoch_is_not_compared_with_steady_epochs(tmp_path, capsys):
    """A row that ran only its warm-up epoch (compile, workers starting) beside a baseline with steady
    epochs has no epoch-time ratio, folded or not, and the line under the console's table says why."""
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [3.0, 1.0, 1.0, 1.0])
    _job(sweep, "1", {"amp": True}, [2.0])  # warm-up only: its 2.0 s against the baseline's steady 1.0 s
    report.write_report([str(sweep)], str(sweep), target_acc="off")
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    assert rows[1]["speedup"] is None and "no speed-up: this row ran only its warm-up epoch" in rows[1]["notes"]
    printed = capsys.readouterr().out
    assert _table_rows(printed)["1"]["epoch speed-up"] == "-"
    assert "no epoch-time ratio, job(s) 1: this row ran only its warm-up epoch; train at least 3 epochs" in " ".join(
        printed.split()
    )
    # a baseline that ran only its warm-up epoch: its 3.0 s is not set against the row's steady 1.0 s
    single = tmp_path / "single"
    _job(single, "0", {}, [3.0])
    _job(single, "1", {"amp": True}, [2.0, 1.0, 1.0, 1.0])
    _, rows, _ = report.build_rows(report.load_jobs([str(single)]), target_acc="off")
    assert rows[0]["epoch_time_s"] == 3.0 and rows[1]["speedup"] is None
    assert "no speed-up: the baseline ran only its warm-up epoch" in rows[1]["notes"]
    # folded: a baseline of warm-up-only seeds gives the other rows no ratio, and says so
    folded = tmp_path / "folded"
    for seed in (1, 2):
        _job(folded, f"b{seed}", {}, [3.0], overrides=[f"seed={seed}"])
        _job(folded, f"a{seed}", {"amp": True}, [2.0, 1.0, 1.0, 1.0], overrides=[f"seed={seed}", "amp=true"])
    _, rows, _ = report.build_rows(report.load_jobs([str(folded)]), target_acc="off")
    (amp,) = [r for r in rows if r["amp"]]
    assert amp["speedup"] is None and "no speed-up: the baseline ran only its warm-up epoch" in amp["notes"]


def test_within_noise_is_judged_on_the_interval_as_written_in_every_output(tmp_path, capsys):
    """An interval bound within 0.0005 of 1.0 is written 1.000: the md, the csv and the console all
    call it within noise (the console reads the written interval; the files once judged the unrounded one)."""
    import csv

    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [3.0, 2.0008, 2.1, 2.2])
    _job(sweep, "1", {"amp": True}, [3.0, 2.0, 1.9, 1.95])
    report.write_report([str(sweep)], str(sweep), target_acc="off")
    with open(sweep / "ab_report.csv") as f:
        amp = list(csv.DictReader(f))[1]
    assert amp["speedup_ci"].startswith("1.000-") and "within noise" in amp["notes"]
    assert _table_rows(capsys.readouterr().out)["1"]["epoch speed-up"].endswith("within noise")
    low = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")[1][1]["speedup_ci"]
    from trainer.report.noise import speedup_interval

    jobs = report.load_jobs([str(sweep)])
    unrounded = speedup_interval(*([j.steady_times()] for j in jobs))[0]  # what rounding decided: 1.0004
    assert 1.0 < unrounded < 1.0005 and low.startswith("1.000-")
    # a bound of 1.001 is not within noise, and the console does not print it as 1.00
    other = tmp_path / "other"
    _job(other, "0", {}, [3.0, 2.0011, 2.1, 2.2])
    _job(other, "1", {"amp": True}, [3.0, 2.0, 1.9, 1.95])
    report.write_report([str(other)], str(other), target_acc="off")
    cell = _table_rows(capsys.readouterr().out)["1"]["epoch speed-up"]
    assert cell.startswith("1.08x [1.001-") and "within noise" not in cell


def test_a_folded_rows_bottleneck_is_its_repeats_majority_and_their_disagreement_is_noted(tmp_path):
    """The row's bottleneck was its first repeat's: "compute" beside the repeats' median data wait of
    30%, when two of three repeats' own verdicts said "input pipeline"."""
    sweep = tmp_path / "sweep"
    for seed, (wait, verdict) in enumerate([(0.24, "compute"), (0.30, "input pipeline"), (0.31, "input pipeline")], 1):
        d = _job(sweep, str(seed - 1), {}, [2.0, 1.0, 1.0, 1.0], overrides=[f"seed={seed}"])
        m = json.loads((d / "metrics.json").read_text())
        m.update(data_wait_fraction=wait, diagnosis={"bottleneck": verdict, "verdict": f"{verdict}: seed {seed}"})
        (d / "metrics.json").write_text(json.dumps(m))
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    (row,) = rows
    assert row["data_wait_fraction"] == 0.3 and row["bottleneck"] == "input pipeline"
    assert "bottleneck differs across repeats: input pipeline 2, compute 1" in row["notes"]
    # the doctor's line under the table quotes a repeat that got the row's verdict (it quoted the first's)
    from trainer.report import render

    (line,) = render.verdict_lines(report.load_jobs([str(sweep)]))
    assert line.endswith(": (2 of 3 repeats) input pipeline: seed 2"), line
    # no majority: said so, not one repeat's verdict
    m = json.loads((sweep / "2" / "metrics.json").read_text())
    m["diagnosis"] = {"bottleneck": "transfer", "verdict": "transfer: seed 3"}
    (sweep / "2" / "metrics.json").write_text(json.dumps(m))
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    assert rows[0]["bottleneck"] == "mixed"
    (line,) = render.verdict_lines(report.load_jobs([str(sweep)]))
    assert line.endswith(": the repeats' verdicts differ: compute 1, input pipeline 1, transfer 1."), line
    # a repeat with no diagnosis (an older record) or an "unknown" one (no whole epoch timed) has no say
    for seed, diagnosis in ((2, None), (3, {"bottleneck": "unknown", "verdict": "unknown: seed 3"})):
        m = json.loads((sweep / str(seed - 1) / "metrics.json").read_text())
        m["diagnosis"] = diagnosis
        (sweep / str(seed - 1) / "metrics.json").write_text(json.dumps(m))
    _, rows, _ = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    assert rows[0]["bottleneck"] == "compute" and "differs" not in rows[0]["notes"]
    (line,) = render.verdict_lines(report.load_jobs([str(sweep)]))
    assert line.endswith(": (1 of 3 repeats) compute: seed 1"), line


def test_the_console_table_fits_120_columns_and_the_files_keep_every_column(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    long_root = "data.root=/mnt/shared/datasets/imagenet-subset-with-a-long-name/train"
    for i, (flags, times) in enumerate(
        [
            ({}, [2.0, 1.00, 0.80, 1.20, 0.90]),
            ({"amp": True}, [2.0, 0.95, 0.75, 1.15, 0.85]),  # within noise
            ({"channels_last": True, "compile": True}, [9.0, 0.50, 0.51, 0.49, 0.50]),
        ]
    ):
        _job(
            sweep,
            str(i),
            flags,
            times,
            accs=[0.2, 0.5, 0.7, 0.7 + 0.01 * i, 0.8],
            overrides=[long_root, "data.batch_size=256", "optim.lr=0.4", f"data.num_workers={4 * i}"],
        )
    _job(
        sweep,
        "3",
        {"channels_last": True},
        [2.0],
        status="failed",
        error="RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total capacity) " * 2,
        overrides=[long_root.replace("train", "val"), "data.num_workers=16"],
    )
    report.write_report([str(sweep)], str(sweep))
    printed = capsys.readouterr().out
    shown = printed.split("\nreport: ")[0].splitlines()  # the table and what it says under it (not the paths)
    assert max(len(line) for line in shown) <= console.TABLE_WIDTH == 120, "\n".join(shown)
    table = _table_rows(printed)
    assert list(table) == ["0", "1", "2", "3"] and table["3"]["verdict"].startswith("FAILED: RuntimeError: CUDA out")
    assert "within noise" in table["1"]["epoch speed-up"]
    assert "samples_per_s" not in printed and "data_wait_fraction" not in printed
    header = (sweep / "ab_report.md").read_text().split("\n| job |")[1].split("\n")[0]
    for column in ("samples_per_s", "data_wait_fraction", "peak_memory_mb", "spread_s", "bottleneck", "notes"):
        assert f" {column} |" in header and column in (sweep / "ab_report.csv").read_text().splitlines()[0]


def _amend(job_dir, **fields):
    """Add or replace fields of a planted job's metrics.json."""
    path = job_dir / "metrics.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_key_one_run_took_from_its_recipe_shows_the_value_each_run_ran_with(tmp_path, capsys):
    """One run set data.image_size on its command line, the other took 224 px from its recipe: the report
    shows each one's own value (from its metrics.json's ``data``, else its .hydra/config.yaml; a config
    group's choice from .hydra/hydra.yaml), not the schema default's 32, which read as one setting and
    left a 68x speed-up with nothing beside it to explain it."""
    import yaml

    def sweep_of(name, record_in):
        sweep = tmp_path / name
        recipe = _job(sweep, "0", {}, [40.0, 34.0, 34.0], overrides=["+recipe=resnet50"])
        _job(sweep, "1", {}, [1.0, 0.5, 0.5], overrides=["data.image_size=32", "model=tiny"])
        if record_in == "metrics.json":
            _amend(recipe, data={"name": "synthetic", "batch_size": 32, "image_size": 224, "num_workers": 0})
        else:
            (recipe / ".hydra").mkdir()
            config = {"recipe": "resnet50", "data": {"image_size": 224}, "model": {"name": "resnet50"}}
            (recipe / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
            choices = {"hydra": {"runtime": {"choices": {"model": "resnet50", "data": "synthetic"}}}}
            (recipe / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(choices))
        return sweep

    for record_in in ("metrics.json", ".hydra"):
        sweep = sweep_of(record_in.strip("."), record_in)
        columns, rows, base = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
        assert "data.image_size" in columns, (record_in, columns)
        assert [r["data.image_size"] for r in rows] == [224, 32], record_in
        assert base.name == "1" and rows[0]["speedup"] == pytest.approx(0.5 / 34.0, abs=1e-3)
    assert [r["model"] for r in rows] == ["resnet50", "tiny"]  # (the .hydra sweep: the group's choice)
    report.write_report([str(sweep)], str(sweep), target_acc="off")
    configuration = _table_rows(capsys.readouterr().out)["0"]["configuration"]
    assert "data.image_size=224" in configuration and "model=resnet50" in configuration, configuration


def test_a_metrics_field_named_like_a_setting_does_not_stand_for_it(tmp_path):
    """metrics.json's compile_cache is the compile cache's state (cold, warm); the setting is in the run's
    .hydra/config.yaml (job): a sweep over compile_cache must show the setting, and its baseline is the
    run at the off value."""
    import yaml

    sweep = tmp_path / "sweep"
    default = _job(sweep, "0", {}, [2.0, 1.0, 1.0], overrides=["compile=true"])
    _job(sweep, "1", {}, [2.0, 0.9, 0.9], overrides=["compile=true", "compile_cache=shared"])
    _amend(default, compile_cache="warm")
    (default / ".hydra").mkdir()
    (default / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"compile": True, "compile_cache": "job"}))
    columns, rows, base = report.build_rows(report.load_jobs([str(sweep)]), target_acc="off")
    assert [r["compile_cache"] for r in rows] == ["job", "shared"] and base.name == "0", (columns, rows)


def _stopped_sweep(tmp_path):
    """A sweep of model.width=4,5,6 with report.target_acc=0.75 in its config, stopped after two jobs."""
    import yaml

    sweep = tmp_path / "sweep"
    for n, epoch_s in ((0, 2.0), (1, 1.0)):
        _job(sweep, str(n), {}, [epoch_s] * 4, accs=[0.5, 0.8, 0.895, 0.9], overrides=[f"model.width={4 + n}"])
    plan = {
        "sweep": 1,
        "state": "running",
        "argv": ["-m", "model.width=4,5,6"],
        "dir": str(sweep),
        "overrides": ["model.width=4,5,6"],
        "jobs": [[f"model.width={w}"] for w in (4, 5, 6)],
    }
    (sweep / "sweep.json").write_text(json.dumps(plan))
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"report": {"target_acc": 0.75, "target_tolerance": 0.01}}))
    return sweep


def test_rebuilding_a_stopped_sweeps_report_gives_the_report_the_sweep_wrote(tmp_path, monkeypatch, capsys):
    """The stop writes the report with its "Not run" list and the sweep's target; a rebuild of the sweep dir
    (``python -m trainer.report SWEEP``, or the job dirs from inside it) reads both from what the sweep
    recorded (sweep.json, multirun.yaml) and writes the same report, not one without them at auto's target."""
    from omegaconf import OmegaConf

    from trainer import sweep as sweep_mod
    from trainer.report.sweep_record import report_settings
    from trainer.report.write import main

    sweep = _stopped_sweep(tmp_path)
    # the sweep's process: its dir, its config's report settings, the console's swept keys (on_multirun_start's)
    monkeypatch.setitem(sweep_mod._state, "sweep_dir", str(sweep))
    monkeypatch.setitem(sweep_mod._state, "report", report_settings(OmegaConf.load(sweep / "multirun.yaml")))
    monkeypatch.setitem(console._state, "swept_keys", ["model.width"])
    sweep_mod.finish_stopped("SIGTERM")
    written = (sweep / "ab_report.md").read_text()
    assert "**Not run** (the sweep was stopped by SIGTERM; finish it with: python train.py" in written
    assert "#2 model.width=6" in written and "target val_acc 0.750 (report.target_acc)" in written
    monkeypatch.setitem(console._state, "swept_keys", None)  # a rebuild's process: no sweep of its own
    assert main([str(sweep)]) == 0
    assert (sweep / "ab_report.md").read_text() == written
    monkeypatch.chdir(sweep)
    assert main(["0", "1"]) == 0
    assert (sweep / "ab_report.md").read_text() == written
    assert main([str(sweep), "--target-acc", "0.8"]) == 0  # said on the command line: that target
    assert "target val_acc 0.800" in (sweep / "ab_report.md").read_text()


def test_a_report_of_other_jobs_does_not_replace_a_sweeps_own_unless_out_says_so(tmp_path, monkeypatch, capsys):
    from trainer.report.write import main

    sweep = _stopped_sweep(tmp_path)
    assert main([str(sweep)]) == 0
    written = (sweep / "ab_report.md").read_text()
    other = _job(tmp_path / "other", "0", {"amp": True}, [1.0, 0.5, 0.5])
    monkeypatch.chdir(sweep)
    capsys.readouterr()
    assert main(["0", str(other)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"error: . ({sweep}) is a sweep dir") and "--out" in said and "\n" not in said.strip(), said
    assert (sweep / "ab_report.md").read_text() == written
    assert main(["0", str(other), "--out", "."]) == 0  # named: replaced
    assert (sweep / "ab_report.md").read_text() != written


def test_an_auto_target_of_0_or_below_gives_no_time_to_target_and_the_header_says_why(tmp_path):
    """A baseline whose best val_acc is 0.0 puts auto's target at -0.010, which every validation reaches:
    every row would "reach" it in its first epoch and a ratio of those times would pass for a
    time-to-target speed-up."""
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [2.0, 2.0, 2.0], accs=[0.0, 0.0, 0.0])
    _job(sweep, "1", {"amp": True}, [1.0, 1.0, 1.0], accs=[0.0, 0.1, 0.2])
    columns, rows, _ = report.build_rows(report.load_jobs([str(sweep)]))
    assert "time_to_target_s" not in columns and "time_to_target_speedup" not in rows[1]
    header = report.write_report([str(sweep)], str(sweep), echo=False).split("\n\n")[1]
    assert "no time to target: the target val_acc -0.010 = the baseline's best 0.000 minus 0.01" in header
    assert "is reached before any training" in header


def test_an_out_under_a_file_is_one_paragraph(tmp_path, capsys):
    from trainer.report.write import main

    _job(tmp_path / "sweep", "0", {}, [2, 1, 1])
    taken = tmp_path / "file.yaml"
    taken.write_text("mine")
    assert main([str(tmp_path / "sweep"), "--out", str(taken / "sub")]) == 2
    said = capsys.readouterr().err
    assert said.strip() == (
        f"error: --out {taken / 'sub'}: {taken} is a file; the report is written into a folder (ab_report.md, .csv, .png)"
    )
    assert taken.read_text() == "mine"


def test_a_run_given_twice_is_one_row(tmp_path):
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [2.0, 1.0, 1.0], overrides=["seed=1"])
    _job(sweep, "1", {"amp": True}, [2.0, 0.5, 0.5], overrides=["seed=1", "amp=true"])
    assert len(report.load_jobs([str(sweep / "0"), str(sweep / "0")])) == 1
    jobs = report.load_jobs([str(sweep), str(sweep / "1"), str(sweep / "1" / "metrics.json")])
    assert [j.path.name for j in jobs] == ["0", "1"]
    _, rows, _ = report.build_rows(jobs, target_acc="off")
    assert [r["job"] for r in rows] == ["0", "1"]


def test_a_run_stopped_at_its_target_is_not_told_to_train_more_epochs(tmp_path, capsys):
    """stop_at_acc ended the row's run after its warm-up epoch (the next one partial) with
    trainer.max_epochs=3: its epoch count was its target's, so "train at least 3 epochs" was wrong advice."""
    sweep = tmp_path / "sweep"
    _job(sweep, "0", {}, [3.0, 1.0, 1.0, 1.0])
    stopped = _job(sweep, "1", {"amp": True}, [2.0, 0.4], overrides=["stop_at_acc=0.8", "trainer.max_epochs=3"])
    epochs = json.loads((stopped / "metrics.json").read_text())["epochs"]
    epochs[1]["partial"] = True
    _amend(stopped, epochs=epochs, stopped_at_acc_epoch=1)
    # the same, stopped after one full steady epoch: a ratio, but no interval
    once = _job(sweep, "2", {"channels_last": True}, [2.0, 0.5], overrides=["stop_at_acc=0.8"])
    _amend(once, stopped_at_acc_epoch=1)
    report.write_report([str(sweep)], str(sweep), target_acc="off")
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "no epoch-time ratio, job(s) 1: this row ran only its warm-up epoch (stop_at_acc stopped it at its target)"
        in said
    )
    assert "speed-up (not judged), job(s) 2: fewer than 2 steady epochs on a side, so no interval; stop_at_acc," in said
    assert said.count("decided how many epochs it trained: time its epochs in a run with stop_at_acc=null") == 2
    assert "train at least 3 epochs" not in said and "train more" not in said
