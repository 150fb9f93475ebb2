"""Checkpoints, resume and failure: no run is lost, no bad input crashes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, clean_env, final_loss, read_metrics, run_cli

LONG = [
    "data.num_samples=1024",
    "data.batch_size=8",
    "data.image_size=16",
    "data.val_samples=16",
    "trainer.max_epochs=3",
    "trainer.log_every_n_steps=8",
    "model.width=8",
]


def _popen(*args: str):
    """``python train.py ARGS`` in the background, to be signalled or killed (forked_python.start_python)."""
    from forked_python import start_python

    return start_python([str(ROOT / "train.py"), *args], ROOT, clean_env())


def _new_checkpoint(directory: Path, since: float, proc: subprocess.Popen, timeout: float = 120) -> bool:
    """Wait until a checkpoint newer than ``since`` exists; False if the process ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if directory.is_dir() and any(p.stat().st_mtime > since for p in directory.glob("*.ckpt")):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def _assert_history(m: dict, epochs: int, longest_process_s: float) -> None:
    numbers = [e["epoch"] for e in m["epochs"]]
    assert numbers == list(range(epochs)), numbers  # every finished epoch, exactly once, in order
    assert all(0 < e["time_s"] <= longest_process_s for e in m["epochs"]), m[
        "epochs"
    ]  # none claims time it did not see
    assert m["epoch_time_s"] is not None


@pytest.mark.slow
@pytest.mark.heavy
def test_kill_9_at_five_random_points_keeps_every_epoch_once_and_matches_an_uninterrupted_run(tmp_path):
    args = [*LONG, "trainer.max_epochs=6", "checkpoint.every_n_steps=7"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run_cli(f"hydra.run.dir={straight}", *args)
    assert r.returncode == 0, r.stderr[-3000:]

    rng = random.Random()
    walls = []
    for _ in range(5):
        start = time.time()
        resume = ["ckpt_path=last"] if list((killed / "checkpoints").glob("*.ckpt")) else []
        proc = _popen(f"hydra.run.dir={killed}", *args, *resume)
        if _new_checkpoint(killed / "checkpoints", start, proc):
            time.sleep(rng.uniform(0.0, 0.6))  # a random point in training
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        walls.append(time.time() - start)
        if (killed / "metrics.json").exists():
            m = read_metrics(killed)
            if m["status"] != "ok":
                assert m["status"] == "running"  # the journal: the finished epochs are on disk
                assert [e["epoch"] for e in m["epochs"]] == list(range(len(m["epochs"])))

    start = time.time()
    r = run_cli(f"hydra.run.dir={killed}", *args, "ckpt_path=last")
    walls.append(time.time() - start)
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(killed)
    assert m["status"] == "ok"
    _assert_history(m, 6, max(walls))
    a, b = final_loss(straight / "checkpoints" / "last.ckpt"), final_loss(killed / "checkpoints" / "last.ckpt")
    assert a == pytest.approx(b, rel=1e-4, abs=1e-5), (a, b)


@pytest.mark.slow
def test_preempted_twice_then_resumed_keeps_the_full_history(tmp_path):
    from trainer.launch.stopping import PREEMPTED_EXIT_CODE

    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", *LONG, "trainer.max_epochs=4", "checkpoint.every_n_steps=7"]
    walls = []
    for attempt in range(2):
        start = time.time()
        proc = _popen(*args, *(["ckpt_path=last"] if attempt else []))
        assert _new_checkpoint(run_dir / "checkpoints", start, proc)
        time.sleep(0.3 + 0.4 * attempt)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        walls.append(time.time() - start)
        assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
        assert "preempted by SIGTERM" in out and "Traceback" not in out
        m = read_metrics(run_dir)
        assert m["status"] == "failed" and m["preempted"] is True
    start = time.time()
    r = run_cli(*args, "ckpt_path=last")
    walls.append(time.time() - start)
    assert r.returncode == 0, r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok"
    _assert_history(m, 4, max(walls))


@pytest.mark.slow
def test_resuming_a_finished_run_keeps_its_result_and_training_on_extends_it(tmp_path):
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", *[a for a in LONG if "max_epochs" not in a], "data.num_samples=256"]
    assert run_cli(*args, "trainer.max_epochs=2").returncode == 0
    before = (run_dir / "metrics.json").read_text()
    r = run_cli(*args, "trainer.max_epochs=2", "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run_dir / "metrics.json").read_text() == before  # the result is unchanged
    assert "had already finished" in r.stdout + r.stderr
    r = run_cli(*args, "trainer.max_epochs=3", "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    m, old = read_metrics(run_dir), json.loads(before)
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1, 2]
    assert m["epochs"][:2] == old["epochs"]  # the earlier epochs keep their own records


def test_compiled_checkpoints_have_clean_keys_and_load_either_way(train, tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    compiled, out_c = train("compile=true", "compile_cache=shared", "checkpoint.enabled=true")
    state = torch.load(out_c / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert state and not any("_orig_mod" in k for k in state)
    eager, out_e = train(
        "compile=false",
        "checkpoint.enabled=true",
        f"ckpt_path={out_c / 'checkpoints' / 'last.ckpt'}",
        "trainer.max_epochs=2",
    )
    assert eager["status"] == "ok" and eager["epochs"][-1]["epoch"] == 1
    again, _ = train(
        "compile=true",
        "compile_cache=shared",
        "checkpoint.enabled=true",
        f"ckpt_path={out_e / 'checkpoints' / 'last.ckpt'}",
        "trainer.max_epochs=3",
    )
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
    from trainer.errors import ConfigError
    from trainer.launch.checkpoint_files import resolve_ckpt_path

    chosen = resolve_ckpt_path("last", str(out))
    assert chosen != str(last) and chosen.endswith(".ckpt")
    with pytest.raises(ConfigError, match="truncated or corrupt") as e:
        resolve_ckpt_path(str(last), str(out))
    assert str(last) in str(e.value)


def test_a_resume_that_cannot_start_keeps_the_epochs_its_run_dir_recorded(train, compose):
    """A killed run's dir (its journal says running), resumed with a typo'd ckpt_path, then with every
    checkpoint torn: the resume stops in one paragraph, and the dir's metrics.json keeps its epochs
    (it was rewritten with none), saying why the resume failed. (A finished run's result is kept by
    metrics.write, which puts a failed resume's record beside it.)"""
    from conftest import TINY

    from trainer.errors import ConfigError
    from trainer.run import run

    first, out = train("checkpoint.enabled=true", "trainer.max_epochs=2")
    assert len(first["epochs"]) == 2
    (out / "metrics.json").write_text(json.dumps(dict(first, status="running")))  # as kill -9 leaves it

    def resume(ckpt: str) -> dict:
        args = [*TINY, "checkpoint.enabled=true", "trainer.max_epochs=3", f"ckpt_path={ckpt}"]
        with pytest.raises(ConfigError):
            run(compose(*args), str(out), args)
        return json.loads((out / "metrics.json").read_text())

    m = resume(str(out / "checkpoints" / "lats.ckpt"))
    assert m["epochs"] == first["epochs"] and m["status"] == "failed" and "lats.ckpt" in m["error"]
    for ckpt in (out / "checkpoints").glob("*.ckpt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    m = resume("last")
    assert m["epochs"] == first["epochs"] and "could be loaded" in m["error"]
    assert m["epoch_time_s"] == first["epoch_time_s"] and m["val_acc"] == first["val_acc"]


def test_a_checkpoint_that_does_not_fit_the_run_is_one_paragraph_naming_what_does_not(train, tmp_path):
    """Lightning found each of these deep in its restore, or at the first step, with a traceback."""
    from trainer.errors import ConfigError

    _, out = train("checkpoint.enabled=true", "trainer.max_epochs=1")
    last = str(out / "checkpoints" / "last.ckpt")
    _, weights_only = train("checkpoint.enabled=true", "checkpoint.save_weights_only=true", "trainer.max_epochs=1")
    plain, empty = tmp_path / "plain.pt", tmp_path / "empty.ckpt"
    torch.save({"net.fc.weight": torch.zeros(2, 2)}, plain)
    empty.write_bytes(b"")
    cases = [
        (
            (f"ckpt_path={last}", "model.width=32"),
            r"holds another model than this run builds \(net\..*in the checkpoint",
        ),
        ((f"ckpt_path={last}", "optim.name=adamw"), r"saved by another optimizer .*optim\.name=sgd"),
        ((f"ckpt_path={weights_only / 'checkpoints' / 'last.ckpt'}",), r"holds the weights only"),
        ((f"ckpt_path={plain}",), r"is not a checkpoint of this trainer .*net\.fc\.weight"),
        ((f"ckpt_path={empty}",), r"truncated or corrupt and cannot be loaded \(EOFError\)"),
        ((f"ckpt_path={out / 'checkpoints'}",), r"points at the folder"),
    ]
    for overrides, says in cases:
        with pytest.raises(ConfigError, match=says):
            train(*overrides, "trainer.max_epochs=2")
    m, _ = train(f"ckpt_path={last}", "trainer.max_epochs=2")  # the same settings resume
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [1], m.get("error")


def test_a_checkpoint_reads_back_through_lightnings_full_fsdp_loader(train):
    """strategy=fsdp resumes a full checkpoint through lightning_fabric's lazy loader, which takes a
    tensor's dtype from its storage's type: numpy's RNG key saved as a uint32 tensor (torch saves its
    storage untyped) failed every such resume ("'UntypedStorage' object has no attribute 'dtype'")."""
    from lightning_fabric.utilities.load import _lazy_load, _materialize_tensors

    m, out = train("checkpoint.enabled=true")
    assert m["status"] == "ok", m.get("error")
    checkpoint = _materialize_tensors(_lazy_load(out / "checkpoints" / "last.ckpt"))  # as FSDPStrategy.load_checkpoint

    def leaves(value):
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, (list, tuple)):
            return [leaf for v in value for leaf in leaves(v)]
        return [value]

    everything = leaves(checkpoint)
    tensors = [t for t in everything if isinstance(t, torch.Tensor)]
    assert checkpoint["state_dict"] and tensors and all(type(v).__name__ != "_NotYetLoadedTensor" for v in everything)
    key = checkpoint["callbacks"]["ResumableState"]["numpy"][1]
    assert isinstance(key, torch.Tensor) and key.shape == (624,) and key.dtype == torch.int64


@pytest.mark.parametrize(
    "saved_as, loader",
    [("int64", "safe_load"), ("int64", "fsdp full checkpoint"), ("uint32 (older checkpoints)", "safe_load")],
)
def test_the_rng_states_resume_where_they_were_saved(tmp_path, saved_as, loader):
    """numpy, python and torch draw after a resume what they would have drawn without one, whichever
    loader reads the checkpoint; checkpoints that hold numpy's key as a uint32 tensor still restore it."""
    import numpy as np
    from lightning_fabric.utilities.load import _lazy_load, _materialize_tensors

    from trainer.callbacks.checkpointing import ResumableState
    from trainer.launch.checkpoint_files import AtomicCheckpointIO, safe_load

    np.random.seed(1234)
    random.seed(1234)
    torch.manual_seed(1234)
    np.random.randn(3)  # somewhere inside the stream, with a gaussian cached
    state = ResumableState().state_dict()
    if saved_as != "int64":
        state["numpy"][1] = torch.from_numpy(state["numpy"][1].numpy().astype(np.uint32))
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"callbacks": {"ResumableState": state}}, path)  # the trainer's writer
    expected = np.random.rand(5), np.random.randn(3), random.random(), torch.rand(3)
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    loaded = safe_load(path) if loader == "safe_load" else _materialize_tensors(_lazy_load(path))
    ResumableState().load_state_dict(loaded["callbacks"]["ResumableState"])
    assert np.array_equal(np.random.rand(5), expected[0]) and np.array_equal(np.random.randn(3), expected[1])
    assert random.random() == expected[2] and torch.equal(torch.rand(3), expected[3])


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    from trainer.launch.checkpoint_files import AtomicCheckpointIO, CheckpointSaveError

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

    with pytest.raises(
        TrainingStopped, match=r"non-finite training loss \(nan\) at step 1;.*Last good checkpoint: none saved yet"
    ):
        train("on_nan=stop", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=1")


def test_nan_loss_is_found_by_the_deferred_read_and_never_reaches_a_checkpoint(train, clear_spies, tmp_path):
    """The guard's values reach the host only through its deferred reads (every log_every_n_steps steps,
    a copy read once it has arrived; the same path as on a GPU): a NaN at step 2 with reads every 4
    steps stops the run at step 3, naming step 2; a checkpoint save reads the flag outright first, so
    one due in between is not written with the NaN in it."""
    import spies

    from trainer.errors import TrainingStopped

    with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 2;") as stopped:
        train(
            "on_nan=stop", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=2",
            "trainer.log_every_n_steps=4", "trainer.max_epochs=2",
        )  # fmt: skip
    assert len(spies.training_snapshots()) == 4  # steps 0-3 ran: found at the read after step 3, not at once
    assert "Last good checkpoint: none saved yet" in str(stopped.value)

    spies.SEEN.clear()
    with pytest.raises(TrainingStopped, match=r"at step 2;"):
        train(
            "on_nan=stop", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=2",
            "trainer.log_every_n_steps=8", "checkpoint.enabled=true", "checkpoint.every_n_steps=3",
        )  # fmt: skip
    assert len(spies.training_snapshots()) == 3  # the save due after step 2 read the flag and stopped there
    assert not list((tmp_path / "run2").glob("checkpoints/*.ckpt"))  # nothing was saved with the NaN in it


def test_nan_guard_does_one_copy_per_step_and_checks_the_window_at_its_end():
    """on_nan=stop's device work per step, counted (not timed): one copy of the loss into the window,
    and the check (a few kernels, none reading a value on the host, and the record's copy to the
    host) only at the window's end. The first bad loss is named by its own step: mid-window, under
    gradient accumulation (a step's losses seen twice), in a resumed run (steps from 100), after an
    outright read (a checkpoint save) part-way; the steps kept to name it stay about a window long."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainer.callbacks.nan_guard import NaNGuard
    from trainer.errors import TrainingStopped

    class Kernels(TorchDispatchMode):  # operations that write data (views left out)
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            alias = func._schema.returns[0].alias_info if func._schema.returns else None
            if alias is None or alias.is_write:
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Trainer:
        log_every_n_steps, global_step = 5, 100

    guard, trainer, per_step = NaNGuard("stop", None), Trainer(), []
    for step in range(100, 110):
        trainer.global_step = step
        loss = torch.tensor([0.5], requires_grad=True) * 2  # a one-element loss of shape [1]
        with Kernels() as kernels:
            guard.on_before_backward(trainer, None, loss)
        per_step.append(kernels.ops)
    quiet = [ops for k, ops in enumerate(per_step) if k % 5 != 4 and k > 0]  # the first call makes the window
    assert all(ops == ["aten.copy_.default"] for ops in quiet), quiet
    assert all(len(per_step[k]) > 3 for k in (4, 9))  # the window's check and its copies to the host
    trainer.global_step = 110
    guard.on_before_backward(trainer, None, torch.tensor(0.5))  # a window of one, checked here:
    with Kernels() as kernels:
        guard._check_window()
    assert kernels.ops and "aten._local_scalar_dense.default" not in kernels.ops, kernels.ops  # no host read

    def steps(numbers, nan_at=(), repeat=1):
        for step in numbers:
            trainer.global_step = step
            for _ in range(repeat):  # gradient accumulation: on_before_backward once per micro-batch
                guard.on_before_backward(trainer, None, torch.tensor(float("nan") if step in nan_at else 0.5))

    steps(range(110, 400), repeat=2)
    assert len(guard._steps) <= 2 * 5 * 2  # clean records let go of their steps
    guard.on_save_checkpoint(trainer, None, {})  # an outright read part-way: clean
    with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 402;"):
        steps(range(400, 420), nan_at=(402, 403), repeat=2)


def test_nan_loss_skip_skips_the_steps(train):
    m, _ = train("on_nan=skip", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=3")
    assert m["status"] == "ok" and m["nan_skipped_steps"] == 8 - 3


@pytest.mark.parametrize("setting", ["optim.zero_grad_to_none=false", "accumulate=2"])
def test_a_skipped_step_changes_no_weight(train, add_callbacks, setting):
    """on_nan=skip skipped the non-finite micro-batch's backward, but the optimizer still stepped with what
    was there: zeros (SGD's momentum and weight decay moved the weights) or, with accumulate, the
    window's other micro-batches' gradients. From the first non-finite forward on, nothing moves."""
    import pytorch_lightning as pl

    weights = []

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            weights.append({k: p.detach().clone() for k, p in pl_module.named_parameters()})

    add_callbacks(Spy())
    m, _ = train("on_nan=skip", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=3", setting)
    assert m["status"] == "ok" and m["nan_skipped_steps"] == 8 - 3, m
    moved = [
        n for n in range(3, len(weights)) if any(not torch.equal(weights[2][k], weights[n][k]) for k in weights[2])
    ]
    if setting == "accumulate=2":  # batches 2 and 3 are one step, skipped whole: only the window before counts
        moved = [
            n for n in range(2, len(weights)) if any(not torch.equal(weights[1][k], weights[n][k]) for k in weights[1])
        ]
    assert moved == [], moved


def _folder_with_a_corrupt_image(root: Path) -> None:
    from PIL import Image

    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (24, 24), (100 * (cls == "a"), 20 * i, 50)).save(root / cls / f"{i}.jpg")
    (root / "a" / "3.jpg").write_bytes(b"not a jpeg at all")


def test_corrupt_image_is_skipped_and_counted(train, tmp_path):
    _folder_with_a_corrupt_image(tmp_path / "imgs")
    m, _ = train(
        "data=imagefolder",
        f"data.root={tmp_path / 'imgs'}",
        "data.val_split=0",
        "data.batch_size=4",
        "data.drop_last=true",
        "trainer.max_epochs=2",
    )
    assert m["status"] == "ok" and m["skipped_samples"] == 2  # once per epoch


def test_corrupt_image_with_stop_names_the_file(tmp_path):
    _folder_with_a_corrupt_image(tmp_path / "imgs")
    r = run_cli(
        f"hydra.run.dir={tmp_path / 'run'}",
        "data=imagefolder",
        f"data.root={tmp_path / 'imgs'}",
        "data.val_split=0",
        "data.batch_size=4",
        "data.on_bad_sample=stop",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 3 and "3.jpg" in r.stderr and "on_bad_sample" in r.stderr
    assert "Traceback" not in r.stderr


def test_image_too_small_for_the_model(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="data.image_size=8"):
        train(
            "model._target_=torchvision.models.vision_transformer.VisionTransformer",
            "~model.width",
            "+model.image_size=16",
            "+model.patch_size=8",
            "+model.num_layers=1",
            "+model.num_heads=2",
            "+model.hidden_dim=8",
            "+model.mlp_dim=8",
            "data.image_size=8",
        )


def test_a_model_size_of_zero_is_named_not_taken_for_the_image_size(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'model.width=0' builds a model with .* empty layer"):
        train("model.width=0")


def test_resuming_a_run_from_before_split_seed_says_its_held_out_images_may_have_moved(compose, tmp_path, caplog):
    from conftest import TINY
    from PIL import Image

    from trainer.run import run

    for c, cls in enumerate(("a", "b")):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for j in range(5):
            Image.new("RGB", (16, 16), (120 * c, 40 * j, 90)).save(tmp_path / "imgs" / cls / f"{j}.jpg")
    folder = [*TINY, "data=imagefolder", f"data.root={tmp_path / 'imgs'}", "data.batch_size=2", "seed=1"]
    out = tmp_path / "run"
    run(compose(*folder, "checkpoint.enabled=true"), str(out))
    record = json.loads((out / "metrics.json").read_text())
    assert record["data"]["split_seed"] == 42
    resume = [*folder, "checkpoint.enabled=true", "ckpt_path=last"]
    run(compose(*resume, "trainer.max_epochs=2"), str(out))
    assert "started before data.split_seed" not in caplog.text  # its record says how it split
    del record["data"]["split_seed"]  # a record written before the key existed
    (out / "metrics.json").write_text(json.dumps(record))
    run(compose(*resume, "trainer.max_epochs=3"), str(out))
    assert "started before data.split_seed" in caplog.text and "drawn with seed=1" in caplog.text


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
    # a resume that finds its checkpoint and then fails before training an epoch (here: a model that
    # cannot run) knows the finished epochs already; it still must not replace the result
    with pytest.raises(ConfigError, match="cannot take"):
        run(
            compose(
                *TINY,
                "checkpoint.enabled=true",
                "ckpt_path=last",
                "model._target_=spies.ProbeNet",
                "~model.width",
                "+model.fail_in_forward=true",
            ),
            str(out),
        )
    assert (out / "metrics.json").read_text() == before
