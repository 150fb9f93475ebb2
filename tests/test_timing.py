"""Numbers a user acts on, each with a planted cause: data wait is time blocked on the loader and
nothing else, transfer is reported apart, FLOPs and the config that ran are recorded."""

from __future__ import annotations

import pytest
import yaml

from trainer.callbacks.epoch_timer import merge_epochs

SLOW_DATA = [
    "data=custom",
    "data.dataset._target_=spies.SlowDataset",
    "+data.dataset.n=64",
    "+data.dataset.sleep_ms=25",
    "data.val_samples=0",
    "trainer.limit_val_batches=0",
]
USER_MODULE = ["model._target_=spies.SlowTransferModule", "~model.width"]


def _with_callback(callback):
    """Run the Trainer with one extra callback (what a user's own callback would be)."""
    import pytorch_lightning as pl

    original = pl.Trainer.__init__

    def init(self, *a, callbacks=None, **kw):
        original(self, *a, callbacks=list(callbacks or []) + [callback], **kw)

    return original, init


def test_a_dataset_that_sleeps_is_data_wait_and_input_bound(train):
    m, _ = train(*SLOW_DATA, "trainer.max_epochs=2")
    assert m["data_wait_fraction"] >= 0.8, m["epochs"]
    assert m["transfer_fraction"] < 0.1
    assert m["diagnosis"]["bottleneck"] == "input pipeline"


def test_a_slow_transfer_is_transfer_not_data_wait(train):
    m, _ = train(*USER_MODULE, "+model.sleep_ms=100", "trainer.max_epochs=2")
    assert m["data_wait_fraction"] <= 0.1, m["epochs"]
    assert m["transfer_fraction"] >= 0.7, m["epochs"]
    steady = [e for e in m["epochs"] if not e["warmup"]]
    assert (
        steady and steady[0]["transfer_s"] <= steady[0]["time_s"] and steady[0]["val_time_s"] >= 2 * 0.1
    )  # 16 val samples = 2 batches, timed apart
    d = m["diagnosis"]
    assert d["bottleneck"] == "host-device transfer" and "on_after_batch_transfer" in d["verdict"], d
    assert not any(s.startswith("data.num_workers") for s in d["try"])


def test_batch_end_work_of_a_callback_is_neither_data_wait_nor_transfer(train):
    import pytorch_lightning as pl
    from spies import SlowBatchEndCallback

    original, init = _with_callback(SlowBatchEndCallback(sleep_ms=100))
    pl.Trainer.__init__ = init
    try:
        m, _ = train("trainer.max_epochs=2")
    finally:
        pl.Trainer.__init__ = original
    steady = [e for e in m["epochs"] if not e["warmup"]]
    assert steady and steady[0]["time_s"] >= 8 * 0.1  # the sleep is in the epoch ...
    assert m["data_wait_fraction"] <= 0.1 and m["transfer_fraction"] <= 0.1, m["epochs"]  # ... but in neither part
    assert m["diagnosis"]["bottleneck"] != "input pipeline"


def test_flops_per_sample_tflops_and_no_mfu_on_cpu(train):
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.models.tiny import TinyCNN

    m, _ = train("trainer.max_epochs=2", "model.width=8")
    net = TinyCNN(num_classes=10, width=8)
    import torch

    counter = FlopCounterMode(display=False)
    with counter:
        net(torch.randn(1, 3, 16, 16)).sum().backward()
    assert m["flops_per_sample"] == counter.get_total_flops() > 0
    assert m["tflops"] == pytest.approx(m["flops_per_sample"] * m["samples_per_s"] / 1e12, rel=1e-3)
    assert (
        m["mfu"] is None and m["peak_flops"] is None and m["peak_flops_source"].startswith("unknown")
    )  # no peak is known for a CPU
    assert m["epochs"] and all("tflops" in e for e in m["epochs"])


def test_mfu_arithmetic():
    from trainer.measure.flops import mfu

    assert mfu(400.0, 989e12, 1) == pytest.approx(0.4044, abs=1e-4)
    assert mfu(400.0, 989e12, 2) == pytest.approx(0.2022, abs=1e-4)
    assert mfu(None, 989e12, 1) is None and mfu(1.0, None, 1) is None


@pytest.mark.parametrize(
    "name, precision, tf32, peak, model",
    [
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", False, 989.4e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "32-true", False, 66.9e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "32-true", True, 494.7e12, "H100 SXM"),
        ("NVIDIA H100 PCIe", "16-mixed", False, 756e12, "H100 PCIe"),
        ("NVIDIA H100 NVL", "bf16-mixed", False, 835.5e12, "H100 NVL"),
        ("NVIDIA H200", "bf16-mixed", False, 989.4e12, "H200 SXM"),  # Lightning's table does not match this name
        ("NVIDIA H200 NVL", "32-true", True, 417.5e12, "H200 NVL"),
        ("NVIDIA GH200 480GB", "bf16-mixed", False, 989.4e12, "H100 SXM"),
    ],
)
def test_hopper_peaks_are_known_by_torchs_device_names(monkeypatch, name, precision, tf32, peak, model):
    import torch

    from trainer.measure.flops import peak_flops

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    value, source = peak_flops("cuda", precision, tf32)
    assert value == peak and source.startswith(model), (value, source)


def test_an_unknown_gpu_has_an_unknown_peak(monkeypatch):
    import torch

    from trainer.measure.flops import peak_flops

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Imaginary GPU 9000")
    value, source = peak_flops("cuda", "bf16-mixed")
    assert value is None and source == "unknown: no peak FLOP/s known for Imaginary GPU 9000 at bf16"


def test_hydra_config_records_what_ran(tmp_path):
    from conftest import TINY, run_cli

    run_dir = tmp_path / "run"
    from PIL import Image

    root = tmp_path / "imgs"
    for c in range(3):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(12):
            Image.new("RGB", (20, 20), (80 * c, 10 * i, 40)).save(root / f"class{c}" / f"{i}.jpg")
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        *TINY,
        "data=imagefolder",
        f"data.root={root}",
        "data.batch_size=auto",
        "batch_finder.max_batch_size=16",
        "lr_scaling=linear",
        "optim.lr=0.1",
        "optim.ref_batch_size=8",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    import json

    m = json.loads((run_dir / "metrics.json").read_text())
    assert isinstance(saved["data"]["batch_size"], int) and saved["data"]["batch_size"] == m["batch_size"] != "auto"
    assert saved["optim"]["lr"] == pytest.approx(m["lr"]) and m["lr"] == pytest.approx(0.1 * m["batch_size"] / 8)
    assert saved["data"]["num_classes"] == 3  # the folder's classes, not the default 10
    assert m["flags"]["data.batch_size"] == "auto"  # what was asked stays in flags


def test_merge_keeps_each_epoch_once_full_beats_partial_newer_beats_older():
    old = [{"epoch": 0, "time_s": 1.0}, {"epoch": 1, "time_s": 1.1}, {"epoch": 2, "time_s": 0.4, "partial": True}]
    new = [
        {"epoch": 1, "time_s": 0.3, "partial": True, "resumed": True},
        {"epoch": 2, "time_s": 1.2},
        {"epoch": 3, "time_s": 1.3},
    ]
    merged = merge_epochs(old, new)
    assert [e["epoch"] for e in merged] == [0, 1, 2, 3]
    assert merged[1]["time_s"] == 1.1 and merged[2]["time_s"] == 1.2  # the full records
    again = merge_epochs(merged, [{"epoch": 3, "time_s": 1.25}])
    assert again[3]["time_s"] == 1.25


def test_flops_are_counted_for_the_recipe_models(compose):
    """Batch-normed nets too (a single sample would trip BatchNorm's training-mode check on 1x1 maps)."""
    from trainer.measure.flops import training_flops_per_sample
    from trainer.models import build_module

    for recipe, at_least in (("resnet50", 1e8), ("vit", 1e7)):
        cfg = compose(f"+recipe={recipe}", "scale=smoke")
        flops = training_flops_per_sample(build_module(cfg), cfg.data.image_size)
        assert flops is not None and flops > at_least, (recipe, flops)


def test_the_flops_of_a_checkpointed_model_are_its_own_and_its_weights_stay_where_they_are(compose):
    """FLOPs are counted on a meta copy of the run's model as prepared (activation checkpointing
    included): the copy's blocks run with the copy's weights, and the count is the model's math, the
    same as without checkpointing (MFU leaves the recomputation out)."""
    from trainer.measure.flops import training_flops_per_sample
    from trainer.models import build_module
    from trainer.switches.model_transforms import apply_activation_checkpointing

    cfg = compose("model=resnet18", "data.image_size=32", "activation_checkpointing=true")
    plain = training_flops_per_sample(build_module(cfg), 32)
    module = build_module(cfg)
    assert apply_activation_checkpointing(module, cfg) > 0
    assert plain is not None and training_flops_per_sample(module, 32) == plain
    assert all(p.device.type == "cpu" for p in module.parameters())


def test_a_model_that_cannot_be_copied_is_counted_on_a_fresh_build():
    """A user's module holding state deepcopy refuses (a lock): its FLOPs come from the run's builder on
    the meta device, as before the copy, rather than staying null."""
    import threading

    from torch import nn

    from trainer.measure.flops import training_flops_per_sample

    class Locked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return self.conv(x)

    assert training_flops_per_sample(Locked(), 8) is None  # not copyable, and no builder given
    conv = 2 * 3 * 4 * 9 * 36  # one sample's 3x3 convolution, 3 -> 4 channels, 6x6 outputs
    assert training_flops_per_sample(Locked(), 8, rebuild=Locked) == 2 * conv  # forward, the weights' gradient


def test_val_samples_counts_what_the_last_validation_saw(train):
    # 20 val samples in batches of 8: all of them (8+8+4), then only the first two batches
    m, _ = train("data.val_samples=20")
    assert m["val_samples"] == 20
    m, _ = train("data.val_samples=20", "trainer.limit_val_batches=2")
    assert m["val_samples"] == 16


def test_each_epoch_record_carries_its_own_validation_and_the_time_elapsed(train):
    """val_acc per epoch in the journal, only for epochs that validated (never the last epoch's value
    carried over), and the training and validation time since the run started: the epochs' times
    plus what the process paid before its first epoch (setup_s, on that epoch only)."""
    m, _ = train("trainer.max_epochs=4", "trainer.check_val_every_n_epoch=2")
    epochs = m["epochs"]
    assert [("val_acc" in e, "val_loss" in e) for e in epochs] == [(False, False), (True, True)] * 2
    assert all(0.0 <= e["val_acc"] <= 1.0 for e in epochs if "val_acc" in e)
    assert epochs[-1]["val_acc"] == pytest.approx(m["val_acc"], abs=1e-6)
    assert epochs[0]["setup_s"] > 0 and not any("setup_s" in e for e in epochs[1:])
    running = 0.0
    for e in epochs:
        running += e["time_s"] + e.get("setup_s", 0.0)
        assert e["elapsed_train_s"] == pytest.approx(running, abs=1e-3)
    assert epochs[-1]["elapsed_val_s"] == pytest.approx(sum(e["val_time_s"] for e in epochs), abs=1e-3)


def test_validating_several_times_per_epoch_records_each_validation_at_its_training_time(train):
    """report.val_per_epoch=4: four validations per epoch (Lightning's val_check_interval), each recorded
    with the epoch's training time when it began and the fraction of the epoch done, so time to target
    resolves to a quarter of an epoch; validation time stays out of the training time."""
    from trainer.measure.time_to_target import reach, validations

    m, _ = train("report.val_per_epoch=4", "trainer.max_epochs=2", "data.val_samples=16")
    assert m["status"] == "ok", m["error"]
    for e in m["epochs"]:
        within = e["validations"]
        assert [v["fraction"] for v in within] == [0.25, 0.5, 0.75, 1.0], within
        assert [v["step"] for v in within] == [2, 4, 6, 8]
        times = [v["train_s"] for v in within]
        assert times == sorted(times) and 0 < times[0] and times[-1] <= e["time_s"] + 1e-3, (times, e["time_s"])
        assert e["val_acc"] == within[-1]["val_acc"]  # the epoch's own: its last validation's
        # each at the run's training time when it began: the epochs before, setup, and this epoch's part
        before = e["elapsed_train_s"] - e["time_s"]
        for v in within:
            assert v["elapsed_train_s"] == pytest.approx(before + v["train_s"], abs=2e-3)
    points = validations(m["epochs"])
    assert [p[1] for p in points] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    first = points[0]
    assert reach(m["epochs"], first[2]) == (first[0], 0.25)  # reached at the first validation: a quarter epoch


def test_a_run_stopped_at_its_target_within_an_epoch_reaches_it_there_not_at_the_epochs_end(train):
    """stop_at_acc with report.val_per_epoch=2: the run stops after the half-epoch validation; its
    time to target is half an epoch's (it was counted as the whole epoch, against a run that went on)."""
    from trainer.measure.time_to_target import reach

    # two classes: whatever the model predicts at the first validation, about half of them are right
    m, _ = train("report.val_per_epoch=2", "trainer.max_epochs=2", "data.num_classes=2", "stop_at_acc=0.01")
    assert m["status"] == "ok", m["error"]
    (epoch,) = m["epochs"]
    assert epoch["partial"] and [v["fraction"] for v in epoch["validations"]] == [0.5], epoch
    assert reach(m["epochs"], epoch["val_acc"]) == (pytest.approx(epoch["validations"][0]["elapsed_train_s"]), 0.5)


def test_time_to_target_finds_the_first_validation_that_reaches_it_within_an_epoch():
    """Planted journal: epoch 0 validated at its end only; epoch 1 four times, reaching 0.8 at its second."""
    from trainer.measure.time_to_target import reach, with_elapsed

    epochs = [
        {"epoch": 0, "time_s": 10.0, "steps": 8, "setup_s": 2.0, "val_time_s": 1.0, "val_acc": 0.5},
        {
            "epoch": 1, "time_s": 8.0, "steps": 8, "val_time_s": 4.0, "val_acc": 0.9,
            "validations": [
                {"step": 2, "fraction": 0.25, "train_s": 2.0, "val_acc": 0.7},
                {"step": 4, "fraction": 0.5, "train_s": 4.1, "val_acc": 0.8},
                {"step": 6, "fraction": 0.75, "train_s": 6.0, "val_acc": 0.85},
                {"step": 8, "fraction": 1.0, "train_s": 8.0, "val_acc": 0.9},
            ],
        },
    ]  # fmt: skip
    timed = with_elapsed(epochs)
    assert [v["elapsed_train_s"] for v in timed[1]["validations"]] == [14.0, 16.1, 18.0, 20.0]
    assert reach(epochs, 0.8) == (16.1, 1.5)
    assert reach(epochs, 0.5) == (12.0, 1)  # epoch 0's end: setup and its whole time
    assert reach(epochs, 0.95) is None


def test_time_to_target_counts_what_compiling_cost_the_validations_as_training_time():
    """Planted journal of a compiled run: epoch 0's validation compiled the evaluation graph (1.5 s of
    its 2.0 s), epoch 1 validated twice within the epoch and its first one compiled again (0.5 s, a
    resumed process). Each reaches its accuracy after paying that compile: it moves from the
    validation's elapsed time to the training's, the sum unchanged."""
    from trainer.measure.time_to_target import reach, with_elapsed

    epochs = [
        {"epoch": 0, "time_s": 10.0, "steps": 8, "setup_s": 2.0, "val_time_s": 2.0, "val_compile_s": 1.5, "val_acc": 0.5},
        {
            "epoch": 1, "time_s": 8.0, "steps": 8, "val_time_s": 1.0, "val_compile_s": 0.5, "val_acc": 0.9,
            "validations": [
                {"step": 4, "fraction": 0.5, "train_s": 4.0, "val_acc": 0.8, "compile_s": 0.5},
                {"step": 8, "fraction": 1.0, "train_s": 8.0, "val_acc": 0.9},
            ],
        },
    ]  # fmt: skip
    timed = with_elapsed(epochs)
    assert [e["elapsed_train_s"] for e in timed] == [13.5, 22.0]
    assert [e["elapsed_val_s"] for e in timed] == [0.5, 1.0]
    assert [v["elapsed_train_s"] for v in timed[1]["validations"]] == [18.0, 22.0]
    assert reach(epochs, 0.5) == (13.5, 1) and reach(epochs, 0.8) == (18.0, 1.5)


def test_a_run_freezes_what_lives_before_it_so_full_collections_skip_it(train):
    """gc.freeze before the process's first job: torch's, Lightning's and Dynamo's objects (hundreds of
    thousands) are left out of every full collection's walk, the one before each job's peak-memory
    measurement and Python's own inside the step loop."""
    import gc

    m, _ = train()
    assert m["status"] == "ok" and gc.get_freeze_count() > 100_000, gc.get_freeze_count()
