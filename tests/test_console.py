"""What a run prints: a header, one line per epoch, the verdict, where the results are; no
dependency chatter (Lightning's tips and notices, the model summary, deprecation warnings), and in
a sweep one status line per job. train.log keeps everything."""

from __future__ import annotations

import logging
import re

import pytest
from conftest import read_metrics, run_cli

from trainer import console

# every line a single smoke run may print on a non-terminal, in order
SINGLE_RUN_LINES = [
    r"device: cpu x1 \(.+, \d+ cores\) \| dtypes: .+ \| amp=false compile=false channels_last=false "
    r"accumulate=1 strategy=auto devices=1 tf32=false cudnn_benchmark=false profile=false",
    r"lr [\d.e-]+ at batch \d+ -> [\d.e-]+ at effective batch \d+ \(lr_scaling=\w+\)|lr [\d.e-]+ \(effective batch \d+; lr_scaling=none\)",
    r"epoch 0: [\d.]+ s train, [\d.]+ samples/s, data wait \d+%, transfer \d+%, val [\d.]+ s \(warm-up\)",
    r"epoch 1: [\d.]+ s train, [\d.]+ samples/s, data wait \d+%, transfer \d+%, val [\d.]+ s",
    r"epoch 2: [\d.]+ s train, [\d.]+ samples/s, data wait \d+%, transfer \d+%, val [\d.]+ s",
    r"doctor: [\w -]+: .+",
    r"results: .+/metrics\.json \(TensorBoard: tensorboard --logdir .+\)",
]


def test_a_smoke_run_prints_a_header_one_line_per_epoch_and_the_verdict(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(f"hydra.run.dir={run_dir}", "scale=smoke", "checkpoint.enabled=false")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == len(SINGLE_RUN_LINES), "\n".join(lines)
    for line, pattern in zip(lines, SINGLE_RUN_LINES):
        assert re.fullmatch(pattern, line), (line, pattern)
    # the console left it out; the log file keeps it
    log = (run_dir / "train.log").read_text()
    assert "`Trainer.fit` stopped" in log and "epoch 2:" in log


def test_the_model_summary_comes_back_on_request(tmp_path):
    r = run_cli(
        f"hydra.run.dir={tmp_path / 'run'}",
        "trainer.model_summary=true",
        "trainer.max_epochs=1",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Trainable params" in r.stdout and "Tip" not in r.stdout + r.stderr


def test_a_sweep_prints_one_status_line_per_job_then_the_table(tmp_path):
    from trainer.measure import hardware

    sweep = tmp_path / "sweep"
    # data.device_prefetch=true on a CPU: every job warns that it does nothing here
    r = run_cli(
        "-m",
        f"hydra.sweep.dir={sweep}",
        "amp=false,true",
        "data.device_prefetch=true",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=2",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    warnings = [line for line in lines + r.stderr.splitlines() if line.startswith("warning:")]
    out = [line for line in lines if not line.startswith("warning:")]
    if not hardware.detect("cpu").bf16_native:  # the plan says, before launching, which job runs emulated bf16
        assert out[0].startswith("#1 amp=true: amp=true runs emulated bf16 on this CPU"), out[0]
        out = out[1:]
    assert out[0] == "Launching 2 jobs locally"
    assert re.fullmatch(r"#0 amp=false: [\d.]+ s/epoch, [\d.]+ samples/s, val_acc [\d.]+, bottleneck: .+", out[1]), out[
        1
    ]
    assert re.fullmatch(r"#1 amp=true: [\d.]+ s/epoch, [\d.]+ samples/s, val_acc [\d.]+, bottleneck: .+", out[2]), out[
        2
    ]
    # the A/B table: a header (two lines), its rule, then a row per job, what differs from the baseline named
    assert out[3].split()[:4] == ["job", "configuration", "epoch", "epoch"] and out[5].startswith("---  ---")
    assert re.match(r"0 +amp=false +[\d.]+ s +baseline ", out[6]) and re.match(
        r"1 +amp=true +[\d.]+ s +[\d.]+x ", out[7]
    )
    assert max(len(line) for line in out[3:8]) <= console.TABLE_WIDTH
    assert any(line.startswith("doctor, job") for line in out[8:])
    assert out[-1] == f"report: {sweep}/ab_report.md (table), {sweep}/ab_report.csv, chart: {sweep}/ab_report.png"
    # per-epoch lines went to each job's train.log only
    assert not any(line.startswith("epoch ") for line in out)
    assert "epoch 1:" in (sweep / "1" / "train.log").read_text()
    # the same warning from both jobs is shown once
    assert len([w for w in warnings if "data.device_prefetch=true needs a CUDA GPU" in w]) == 1, warnings
    assert len(warnings) == len(set(warnings)), warnings
    assert read_metrics(sweep / "1")["status"] == "ok"


def _record(name: str, level: int, message: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    return record


@pytest.fixture
def fresh_console():
    saved = dict(console._state, warned=set(console._state["warned"]))
    console._state.update(sweep=False, swept_keys=None, warned=set())
    yield
    console._state.update(saved)


def test_console_filter_rules(fresh_console):
    keep = console.ConsoleFilter().filter
    assert not keep(_record("pytorch_lightning.utilities.rank_zero", logging.INFO, "GPU available: False"))
    assert keep(_record("pytorch_lightning.callbacks.model_summary", logging.INFO, "  | Name | Type"))
    assert keep(_record("pytorch_lightning.utilities.rank_zero", logging.WARNING, "something real"))
    assert keep(_record("trainer.callbacks.epoch_timer", logging.INFO, "epoch 0: ..."))
    console.set_sweep(True, ["amp"])
    assert not keep(_record("trainer.callbacks.epoch_timer", logging.INFO, "epoch 0: ..."))
    assert keep(_record("trainer.cli", logging.INFO, "#0 amp=false: ...", **{console.STATUS_LINE: True}))
    assert keep(_record("trainer.run", logging.WARNING, "bf16 is emulated"))
    assert not keep(_record("trainer.run", logging.WARNING, "bf16 is emulated"))  # once per sweep
    assert keep(_record("trainer.cli", logging.ERROR, "#1 failed"))
    # a fit that stopped for another reason than its planned length is said
    console.set_sweep(False)
    assert not keep(
        _record("pytorch_lightning.utilities.rank_zero", logging.INFO, "`Trainer.fit` stopped: `max_epochs=3` reached.")
    )
    assert keep(
        _record("pytorch_lightning.utilities.rank_zero", logging.INFO, "`Trainer.fit` stopped: No training batches.")
    )


def test_other_ranks_and_launched_sweep_processes_keep_quiet(fresh_console, monkeypatch):
    keep = console.ConsoleFilter().filter
    monkeypatch.setenv("RANK", "1")
    assert not keep(_record("trainer.callbacks.epoch_timer", logging.INFO, "epoch 0: ..."))
    assert not keep(_record("trainer.run", logging.WARNING, "a warning rank 0 gives too"))
    assert keep(_record("trainer.run", logging.ERROR, "rank 1 failed"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(console.QUIET_ENV, "1")
    console.set_sweep(False)  # a single run, but launched for a sweep job
    assert not keep(_record("trainer.callbacks.epoch_timer", logging.INFO, "epoch 0: ..."))


def test_status_lines_name_the_swept_values(fresh_console):
    assert console.swept_keys(["+recipe=resnet50", "amp=false,true", "seed=range(3)", "data.batch_size=32"]) == [
        "amp",
        "seed",
    ]
    console.set_sweep(True, ["amp", "seed"])
    assert (
        console.job_label(3, ["+recipe=resnet50", "amp=True", "seed=2", "data.batch_size=32"]) == "#3 amp=true seed=2"
    )
    ok = {
        "status": "ok",
        "epoch_time_s": 1.5,
        "samples_per_s": 100.0,
        "val_acc": 0.8,
        "diagnosis": {"bottleneck": "compute"},
    }
    assert (
        console.status_line(0, ["amp=False"], ok, "d")
        == "#0 amp=false: 1.500 s/epoch, 100.0 samples/s, val_acc 0.800, bottleneck: compute"
    )
    failed = {"status": "failed", "error": "boom"}
    assert console.status_line(1, ["amp=True"], failed, "d/1") == "#1 amp=true: failed: boom (d/1)"
    assert console.ConsoleFormatter().format(_record("x", logging.WARNING, "careful")) == "warning: careful"
