"""scripts/gpu_check.sh: its CPU dry run (the same sweeps, shrunk) runs end to end and writes RESULTS.md.

The GPU itself is only there on a GPU machine; here the dry run proves the suite's parts work: the
GPU-marked tests are collected (and skipped), every bench row composes on top of both recipes and
trains, the rows really switch what they name, and the results writer produces each recipe's file.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, clean_env

# the script's own rows, in another order given with --synthetic-rows (the report keeps the order asked for)
# the rows whose plumbing differs (the flags only alone, a compile, the batch search, all on): the others
# (tf32, amp, channels_last) run as the baseline does with one flag more
SYNTHETIC_ROWS = ["baseline", "compile", "big_batch", "all"]
JPEG_ROWS = ["all_turbo", "all"]  # the JPEG table's all-on rows (dali after them where installed)


def _script(*args, **env):
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(PYTHON=sys.executable, **env),
        timeout=1200,
    )


def _jobs(sweep) -> dict:
    jobs = {}
    for p in sweep.glob("*/metrics.json"):
        m = json.loads(p.read_text())
        jobs[next(o for o in m["overrides"] if o.startswith("+bench=")).split("=", 1)[1]] = m
    return jobs


@pytest.mark.slow
@pytest.mark.heavy
def test_gpu_check_dry_run_writes_results(tmp_path):
    # one recipe: the dry run trains the tiny CNN under either recipe, so the second one only doubled
    # the time (the recipes themselves are smoke-tested in test_e2e and the README test)
    # the GPU-marked tests are left out here: the suite itself collects them (skipped without CUDA),
    # and test_the_gpu_tests_outcome_is_read_from_pytests_report reads an outcome like theirs
    # --headline runs the README's first command (synthetic data gathered where the model trains, amp,
    # compile), --ceiling the trainer against a hand-written loop on the same work and --overlap nvJPEG
    # beside a stand-in step: the summary and resnet50's page read them against their targets (a CPU
    # rehearsal: the numbers mean nothing, the plumbing does)
    r = _script(
        "--dry-run", "--skip-tests", "--recipes", "resnet50", "--synthetic-rows", ",".join(SYNTHETIC_ROWS), "--packed",
        "--headline", "--ceiling", "--overlap", "--out", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    summary = r.stdout[r.stdout.index("] summary") :]
    assert (
        "GPU-marked tests: not run" in summary
        and "resnet50 / synthetic: best `" in summary
        and "resnet50 / jpeg: best `" in summary
        and "resnet50 / jpeg targets: best real-image all-on row" in summary
    ), summary
    assert "headline (`python train.py +recipe=resnet50 amp=true compile=true`, ok)" in summary, summary
    assert "ceiling (resnet18, 32 px, batch 8, bf16, channels_last, compile, on cpu): trainer/plain" in summary
    assert "nvJPEG overlap (batch 8, a 5 ms stand-in step, on cpu; decode alone: torchvision" in summary
    # the overlap benchmark's ways, end to end with the CPU decoders of torchvision and nvImageCodec
    overlap = json.loads((tmp_path / "overlap.json").read_text())
    assert [row["way"] for row in overlap["rows"]] == ["compute", "serial", "thread-2", "nvimgcodec-2"]
    assert all(row["images_per_s"] > 0 for row in overlap["rows"]) and overlap["rows"][0]["of_compute"] == 1.0
    assert set(overlap["decode_alone_ms_by_library"]) == {"torchvision", "nvimgcodec"}
    headline = json.loads((tmp_path / "headline" / "metrics.json").read_text())
    assert headline["flags"]["amp"] is True and headline["flags"]["compile"] is True
    assert headline["flags"]["data.device_resident"] is True and headline["recipe"] == "resnet50"
    ceiling = json.loads((tmp_path / "ceiling.json").read_text())
    assert [run["side"] for run in ceiling["runs"]] == ["plain", "trainer"] and ceiling["ratios"][0] > 0
    assert all(run["images_per_s"] > 0 and len(run["epoch_s"]) == 2 for run in ceiling["runs"])
    page = (tmp_path / "resnet50" / "RESULTS.md").read_text()  # written after them, with them
    assert "## The model's ceiling: the targets" in page and "- ceiling (resnet18" in page and "- headline (" in page
    assert "doctor (" in summary and (tmp_path / "gpu_check.log").read_text().count("== [") >= 7
    from trainer.data.dali import installed

    jpeg_rows = JPEG_ROWS + ["dali"] if installed() else JPEG_ROWS  # DALI's row where installed
    tables = {
        "synthetic": SYNTHETIC_ROWS,
        "jpeg": jpeg_rows,
        "jpeg_baseline": ["baseline"],
        "jpeg_packed": ["all"],
        "jpeg_synthetic": ["all"],
    }
    text = (tmp_path / "resnet50" / "RESULTS.md").read_text()
    assert "CPU DRY RUN" in text and "## synthetic" in text and "## jpeg" in text and "train.py -m +recipe=" in text
    assert "GPU-marked tests: not run with this table." in text and "## Real JPEGs end to end: the targets" in text
    results = json.loads((tmp_path / "resnet50" / "results.json").read_text())
    assert results["tests"] == {"ran": False} and set(results["tables"]) == set(tables)
    assert results["tables"]["jpeg"]["best"]["samples_per_s"] > 0 and results["jpeg_targets"]
    assert [row["bench"] for row in results["tables"]["synthetic"]["rows"]] == SYNTHETIC_ROWS
    assert (tmp_path / "resnet50" / "synthetic.png").exists() and (tmp_path / "resnet50" / "jpeg.png").exists()
    for table, names in tables.items():
        with open(tmp_path / "resnet50" / table / "ab_report.csv") as f:
            rows = list(csv.DictReader(f))
        # a one-row sweep varies nothing, so its report has no bench column: the jobs below name it
        assert [row.get("bench", names[0]) for row in rows] == names, table
        assert all(row["status"] == "ok" for row in rows), table
        jobs = _jobs(tmp_path / "resnet50" / table)
        assert sorted(jobs) == sorted(names), table
        every = jobs.get("all")
        if every:
            assert every["flags"]["amp"] is True and every["flags"]["compile"] is True and every["compile_time_s"]
            assert every["flags"]["data.batch_size"] == "auto" and isinstance(every["batch_size"], int)
    synthetic = _jobs(tmp_path / "resnet50" / "synthetic")
    assert synthetic["compile"]["compile_time_s"] and synthetic["big_batch"]["flags"]["data.batch_size"] == "auto"
    assert synthetic["baseline"]["flags"]["amp"] is False and all(
        m["flags"]["data.device_resident"] for m in synthetic.values()
    )
    jpeg = _jobs(tmp_path / "resnet50" / "jpeg")
    assert jpeg["all_turbo"]["flags"]["data.decoder"] == "turbo" and jpeg["all_turbo"]["decoder"] == "turbo"
    assert jpeg["all"]["flags"]["data.decoder"] == "nvjpeg" and jpeg["all"]["decoder"] == "torchvision"  # CPU fallback
    assert jpeg["all_turbo"]["num_workers"] == max(0, min(16, len(os.sched_getaffinity(0)) - 1))
    baseline = _jobs(tmp_path / "resnet50" / "jpeg_baseline")["baseline"]
    assert baseline["flags"]["data.gpu_normalize"] is False and baseline["flags"]["amp"] is False
    assert _jobs(tmp_path / "resnet50" / "jpeg_packed")["all"]["data"]["name"] == "packed"
    beside = _jobs(tmp_path / "resnet50" / "jpeg_synthetic")["all"]
    assert beside["data"]["name"] == "synthetic" and beside["flags"]["data.device_resident"] is True

    # the page written again from the same sweeps, elsewhere: a note, and the environment it ran in
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_results

    ran = json.loads((tmp_path / "resnet50" / "results.json").read_text())
    ran["environment"]["device"] = "NVIDIA H100 80GB HBM3 (cuda, 1 device)"  # as written where the sweeps ran
    (tmp_path / "ran_there.json").write_text(json.dumps(ran))
    note = "the all row was stopped by the check's time limit"
    gpu_results.write(
        "resnet50", [tmp_path / "resnet50" / "synthetic"], tmp_path / "again", dry_run=True, notes=[note],
        environment_from=tmp_path / "ran_there.json",
    )  # fmt: skip
    text = (tmp_path / "again" / "RESULTS.md").read_text()
    assert "- device: NVIDIA H100 80GB HBM3 (cuda, 1 device)" in text and f"## Notes on this run\n\n- {note}" in text
    assert json.loads((tmp_path / "again" / "results.json").read_text())["notes"] == [note]


def test_gpu_check_without_a_gpu_says_so():
    r = _script("--skip-tests")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr
    r = _script("--bogus")
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr


def test_the_gpu_tests_outcome_is_read_from_pytests_report(tmp_path):
    """gpu_check.sh hands pytest's JUnit XML to gpu_results.py: passed, failed (with why) and skipped, counted."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_results

    xml = tmp_path / "gpu_tests.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_cuda" name="test_a"/>'
        '<testcase classname="tests.gpu.test_sync_free" name="test_b[vit-all]"><failure '
        'message="RuntimeError: called a synchronizing CUDA operation">x</failure></testcase>'
        '<testcase classname="tests.gpu.test_cuda" name="test_c"><skipped message="no NVML"/></testcase>'
        "</testsuite></testsuites>"
    )
    outcome = gpu_results.test_outcome(xml)
    assert outcome["passed"] == 1 and outcome["failed"] == 1 and outcome["skipped"] == 1
    assert outcome["failures"] == [
        {
            "test": "tests.gpu.test_sync_free::test_b[vit-all]",
            "message": "RuntimeError: called a synchronizing CUDA operation",
        }
    ]
    assert "1 passed, 1 failed, 1 skipped" in gpu_results._tests_line(
        outcome
    ) and "synchronizing" in gpu_results._tests_line(outcome)
    assert gpu_results.test_outcome(tmp_path / "absent.xml") == {"ran": False}


def test_the_summary_names_the_overhead_against_a_plain_loop(tmp_path, capsys):
    """gpu_check.sh --overhead hands scripts/bench_overhead.py's result to the summary: one line with the
    ratio, its interval and the conclusion against the target."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_results

    result = {
        "settings": {"image_size": 32, "batch_size": 256, "repeats": 3, "device": "cuda"},
        "machine": {"device": "NVIDIA H100 80GB HBM3"},
        "median_ratio": 1.021,
        "ratio_interval_95": [1.004, 1.038],
        "conclusion": "within 5%: the whole 95% interval (1.004-1.038) is at or below 1.05",
    }
    path = tmp_path / "overhead.json"
    path.write_text(json.dumps(result))
    assert gpu_results.main(["--summary", "--overhead", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "overhead (ResNet-18, 32 px, batch 256, on NVIDIA H100 80GB HBM3): trainer/plain per epoch 1.021 "
        "[1.004-1.038] over 3 repeat(s): within 5%" in out
    ), out


def test_short_gpu_runs_merge_into_the_page_each_part_under_the_run_that_measured_it(tmp_path):
    """GPU time comes in short contacts that measure a few parts each: a run replaces the parts it
    measured (a table, the headline, the ceiling, the tests' outcome) and keeps the others from the
    page before, each headed with the run that measured it, also when written again."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_results

    out = tmp_path / "resnet50"
    out.mkdir()
    row = {k: None for k in gpu_results.COLUMNS}
    row.update(bench="all", batch=512, samples_per_s=4503.9, epoch_time_s=3.41, data_wait_fraction=0.037,
               transfer_fraction=0.178, val_acc=0.71, status="ok")  # fmt: skip
    first = {"device": "NVIDIA H100 80GB HBM3 (cuda, 1 device)", "date": "2026-11-01 10:00 UTC", "commit": "abc1234"}
    earlier = {
        "environment": first,
        "tests": {"ran": True, "passed": 60, "failed": 2, "skipped": 1, "failures": []},
        "checks": ["headline (`python train.py +recipe=resnet50 amp=true compile=true`, ok): 1,563 images/s"],
        "tables": {
            "jpeg": {"command": "python train.py -m ...", "rows": [row], "best": row, "headline": ["fastest row"]}
        },
    }  # the shape of a page written before the parts were kept apart
    (out / "results.json").write_text(json.dumps(earlier))
    headline = {
        "status": "ok",
        "samples_per_s": 5550.0,
        "data_wait_fraction": 0.014,
        "diagnosis": {"verdict": "compute"},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(headline))
    ceiling = {
        "settings": {"model": "resnet50", "image_size": 224, "batch_size": 256, "amp": "bf16", "repeats": 2},
        "machine": {"device": "NVIDIA H100 80GB HBM3"}, "median_ratio": 0.9906, "ratio_min": 0.9898,
        "ratio_max": 0.9913, "plain_images_per_s": 5614.2, "trainer_images_per_s": 5561.3, "target_ratio": 1.0, "met": False,
    }  # fmt: skip
    (tmp_path / "ceiling.json").write_text(json.dumps(ceiling))

    def run(commit: str, **parts) -> tuple:
        env = tmp_path / f"{commit}.json"
        env.write_text(json.dumps({"environment": {**first, "date": "2026-11-28 01:40 UTC", "commit": commit}}))
        gpu_results.write("resnet50", [], out, environment_from=env, **parts)
        return (out / "RESULTS.md").read_text(), json.loads((out / "results.json").read_text())

    # one contact: the headline alone (no tests, no table)
    text, written = run("def5678", headline_metrics=tmp_path / "metrics.json")
    assert "- commit: def5678" in text and "5,550 images/s" in text and "1,563" not in text
    assert (
        "100% of the device-resident row" in text
        and "(from an earlier run" not in text.split("## jpeg")[0].split("GPU-marked tests")[0]
    )
    assert (
        "GPU-marked tests: 60 passed, 2 failed, 1 skipped. (from an earlier run: 2026-11-01 10:00 UTC, commit abc1234"
        in text
    )
    assert "## jpeg\n\nFrom an earlier run: 2026-11-01 10:00 UTC, commit abc1234" in text
    assert "the targets (with jpeg from an earlier run)" in text
    assert (
        written["table_runs"]["jpeg"]["commit"] == "abc1234"
        and written["checks_run"]["headline"]["commit"] == "def5678"
    )
    # the next contact: the ceiling alone; the headline stays, under the contact that measured it
    text, written = run("0123abc", ceiling_result=tmp_path / "ceiling.json")
    assert "- commit: 0123abc" in text and "trainer/plain images/s 0.991 (min-max 0.990-0.991, 2 repeat(s))" in text
    assert "5,550 images/s" in text and "(from an earlier run: 2026-11-28 01:40 UTC, commit def5678" in text
    assert "## jpeg\n\nFrom an earlier run: 2026-11-01 10:00 UTC, commit abc1234" in text
    assert written["tests_run"]["commit"] == "abc1234" and written["tests"]["passed"] == 60
    assert written["checks_run"]["ceiling"]["commit"] == "0123abc" and set(written["checks"]) == {"headline", "ceiling"}
    summary = "\n".join(gpu_results.summary([out / "results.json"]))
    assert "resnet50 / jpeg: best `all` 4504 samples/s" in summary and "(from an earlier run: 2026-11-01" in summary


def test_the_ceiling_splits_each_side_into_a_cost_per_step_and_one_per_epoch():
    """bench_ceiling.py --long-batches: each side's epochs at two lengths give its time per step (slope)
    and per epoch (intercept); the plain side gets the longer epochs through its command line."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_ceiling
    import gpu_results

    args = bench_ceiling.parse_args(["--device", "cpu", "--batches", "40", "--long-batches", "120"])
    longer = bench_ceiling.with_batches(args, 120)
    assert longer.batches == 120 and args.batches == 40
    assert bench_ceiling.parse_args(longer.argv).batches == 120 and "40" not in longer.argv
    assert "--long-batches" not in longer.argv  # the plain side's run has one length
    # plain: 45 ms a step and 25 ms an epoch; trainer: 44 ms a step (faster) and 40 ms an epoch
    runs = [
        {"repeat": 1, "side": "plain", "batches": 40, "epoch_s": [9.0, 40 * 0.045 + 0.025]},
        {"repeat": 1, "side": "plain", "batches": 120, "epoch_s": [9.0, 120 * 0.045 + 0.025]},
        {"repeat": 1, "side": "trainer", "batches": 40, "epoch_s": [9.0, 40 * 0.044 + 0.040]},
        {"repeat": 1, "side": "trainer", "batches": 120, "epoch_s": [9.0, 120 * 0.044 + 0.040]},
    ]
    split = bench_ceiling.split_per_step(runs, args)
    assert split["per_step_median_ratio"] == pytest.approx(45 / 44, abs=1e-3)  # above 1: the trainer's step is faster
    assert split["plain_step_ms"] == pytest.approx(45.0) and split["trainer_step_ms"] == pytest.approx(44.0)
    assert split["plain_fixed_ms_per_epoch"] == pytest.approx(25.0)
    assert split["trainer_fixed_ms_per_epoch"] == pytest.approx(40.0)
    line = gpu_results._per_step(split)
    assert "plain/trainer 1.023 (45.0 vs 44.0 ms), fixed per epoch 25.0 vs 40.0 ms" in line
    with pytest.raises(SystemExit):  # the longer epoch must be longer
        bench_ceiling.parse_args(["--batches", "40", "--long-batches", "40"])
