"""The bad-input matrix: each mistake gets one paragraph naming the key or the file, exit code 2 (3
for a deliberate stop), and no traceback; inputs that are odd but fine (grayscale, CMYK, PNG with
alpha, a text file among the images) simply train.

Cases already covered elsewhere (and counted in the matrix): unknown keys, wrong types, unknown
recipes, fsdp on CPU, fp16 on CPU, a missing data root, a bad model target (test_config); a missing
or corrupt checkpoint, an unwritable output dir, a corrupt image with on_bad_sample=stop
(test_resume); an empty folder, a batch larger than the data (test_data); destinations of pack, a
reused run or sweep dir, a foreign cache dir (test_no_data_lost); a failing rank (test_distributed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_cli
from PIL import Image


def _images(root: Path, classes=("cat", "dog"), per_class=6, mode="RGB", suffix="jpg") -> Path:
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            color = (60 * i, 20 * j, 90, 128)[: len(mode)] if mode in ("RGB", "RGBA", "CMYK") else 40 * i + 10 * j
            Image.new(mode, (20, 20), color).save(root / cls / f"{j}.{suffix}")
    return root


def _one_class(tmp):
    return _images(tmp / "imgs", classes=("only",))


def _loose_images(tmp):
    root = tmp / "imgs"
    root.mkdir()
    for j in range(4):
        Image.new("RGB", (20, 20)).save(root / f"{j}.jpg")
    return root


def _symlink_loop(tmp):
    root = _images(tmp / "imgs")
    os.symlink(root, root / "cat" / "again")
    return root


def _broken_link(tmp):
    root = _images(tmp / "imgs")
    os.symlink(tmp / "gone.jpg", root / "cat" / "unreadable.jpg")  # a file that cannot be opened
    return root


def _undecodable(tmp, bad=("cat", "dog")):
    root = _images(tmp / "imgs", per_class=8)
    for cls in bad:
        for image in (root / cls).iterdir():
            image.write_bytes(b"not an image")
    return root


def _undecodable_class(tmp):
    return _undecodable(tmp, bad=("cat",))


def _three_classes(tmp):
    return _images(tmp / "imgs", classes=("a", "b", "c"))


FOLDER = [
    "data=imagefolder",
    "data.val_split=0",
    "data.batch_size=4",
    "data.image_size=16",
    "trainer.max_epochs=1",
    "checkpoint.enabled=false",
]

CASES = {
    # name: (make data root or None, args, exit code, text the message must hold)
    "one class folder": (_one_class, FOLDER, 2, "one class folder (only)"),
    "images with no class folders": (_loose_images, FOLDER, 2, "no class folders"),
    "a symlink loop in the data root": (_symlink_loop, FOLDER, 2, "symlink loop"),
    "an unreadable file, on_bad_sample=stop": (_broken_link, FOLDER + ["data.on_bad_sample=stop"], 3, "unreadable.jpg"),
    "a batch of nothing but undecodable images, read in a loader worker": (  # the first val batch: 4 of cat's 8
        _undecodable_class,
        [a for a in FOLDER if "val_split" not in a] + ["data.val_split=0.5", "data.num_workers=1"],
        3,
        "no image of a batch of 4 could be decoded (/",  # named: the worker's own record of what it skipped
    ),
    "data.num_classes below the folder's classes": (
        _three_classes,
        FOLDER + ["data.num_classes=2"],
        2,
        "'data.num_classes=2' was given, but the data (imagefolder) has 3 classes",
    ),
    "devices beyond this machine's cores": (
        None,
        ["strategy=ddp", f"devices={len(os.sched_getaffinity(0)) + 1}"],
        2,
        f"'devices={len(os.sched_getaffinity(0)) + 1}'",
    ),
    "several nodes without torchrun or srun": (None, ["num_nodes=2"], 2, "'num_nodes=2' needs its processes started"),
    "repeats without -m": (None, ["repeats=3"], 2, "'repeats=3'"),
    "train until stopped with a cosine schedule": (None, ["trainer.max_epochs=-1"], 2, "'trainer.max_epochs=-1'"),
    "on_nan=skip under DDP": (None, ["on_nan=skip", "strategy=ddp", "devices=1"], 2, "'on_nan=skip'"),
    "lr_scaling for a user's LightningModule": (
        None,
        ["model._target_=trainer.examples.MyLightningModule", "lr_scaling=linear"],
        2,
        "lr_scaling=linear",
    ),
    "a limit of the wrong kind": (None, ["trainer.limit_train_batches=1.5"], 2, "'trainer.limit_train_batches'"),
    "strategy=fsdp2 with a user's LightningModule that does not shard itself": (
        None,
        ["model._target_=trainer.examples.MyLightningModule", "strategy=fsdp2", "compile=true"],
        2,
        "MyLightningModule has none: give it a configure_model",
    ),
    "strategy=fsdp2 with a factory's LightningModule that does not shard itself": (
        None,
        ["model._target_=spies.probe_lightning_module", "strategy=fsdp2"],
        2,
        "ProbeLightningModule has none: give it a configure_model",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_one_paragraph(case, tmp_path):
    make, args, code, says = CASES[case]
    data = [f"data.root={make(tmp_path)}"] if make else []
    r = run_cli(f"hydra.run.dir={tmp_path / 'run'}", *TINY, *args, *data)
    out = r.stdout + r.stderr
    assert r.returncode == code, out[-3000:]
    assert says in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out


@pytest.mark.slow
def test_a_slurm_sweep_over_devices_or_with_devices_auto_is_refused_before_anything_is_submitted(tmp_path):
    """hydra/launcher=slurm asks Slurm for ${devices} tasks and GPUs per node once for the whole sweep: a
    sweep over devices gave its second job one task for two ranks, and devices=auto ended in OmegaConf's
    traceback. Refused before the sweep starts (no cluster is needed to see it: nothing is submitted)."""
    cases = (
        (["devices=1,2"], "the sweep varies devices, but hydra/launcher (SlurmLauncher) asks Slurm for resources once"),
        (["devices=auto", "amp=false,true"], "'devices=auto': hydra/launcher (SlurmLauncher) asks Slurm for that many"),
    )
    for i, (args, says) in enumerate(cases):
        sweep = tmp_path / f"sweep{i}"
        r = run_cli("-m", "hydra/launcher=slurm_local", f"hydra.sweep.dir={sweep}", *TINY, *args)
        out = r.stdout + r.stderr
        assert r.returncode == 2 and says in r.stderr, out[-3000:]
        assert "Traceback" not in out and not any(sweep.iterdir()), out[-3000:]


@pytest.mark.slow
@pytest.mark.whole_machine  # devices=2 needs two cores to pass the devices check
def test_fsdp2_with_a_module_that_does_not_shard_itself_is_refused_before_its_ranks_start(tmp_path):
    """The README's template module under strategy=fsdp2 devices=2: one paragraph from the launching
    process, and no rank started (torchrun's log dir, run_dir/ranks, never made)."""
    run_dir = tmp_path / "run"
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        *TINY,
        "model._target_=trainer.examples.MyLightningModule",
        "strategy=fsdp2",
        "devices=2",
        "compile=true",
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "strategy=fsdp2 shards a model in its configure_model hook" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert not (run_dir / "ranks").exists()


def test_a_recipe_with_a_yaml_error_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    """Through the entry point in-process, with the recipe folder pointed at a copy holding a broken recipe."""
    import shutil
    import sys

    from trainer import cli, command_line

    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    broken = recipes / "broken.yaml"
    broken.write_text("data:\n  image_size: [32\n")
    monkeypatch.setattr(command_line, "RECIPE_DIR", recipes)  # where the recipes are listed and parsed
    monkeypatch.setattr(sys, "argv", ["train.py", "+recipe=broken", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(broken) in err and "line 3" in err and "not valid YAML" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_odd_but_valid_images_train(train, tmp_path):
    """Grayscale and CMYK JPEGs, PNGs with alpha, and a text file among the images: all fine."""
    root = _images(tmp_path / "imgs", classes=("gray",), mode="L")
    _images(root, classes=("cmyk",), mode="CMYK")
    _images(root, classes=("alpha",), mode="RGBA", suffix="png")
    (root / "gray" / "notes.txt").write_text("not an image, and not named like one")
    m, _ = train(
        "data=imagefolder",
        f"data.root={root}",
        "data.val_split=0",
        "data.batch_size=6",
        "data.image_size=16",
        tiny=True,
    )
    assert m["status"] == "ok" and m["skipped_samples"] == 0 and m["epochs"][0]["samples"] == 18


def test_a_truncated_jpeg_is_skipped_and_counted(train, tmp_path):
    root = _images(tmp_path / "imgs")
    whole = (root / "cat" / "0.jpg").read_bytes()
    (root / "cat" / "0.jpg").write_bytes(whole[: len(whole) // 3])
    m, _ = train(
        "data=imagefolder",
        f"data.root={root}",
        "data.val_split=0",
        "data.batch_size=4",
        "data.image_size=16",
        "data.drop_last=false",
    )
    assert m["status"] == "ok" and m["skipped_samples"] == 1 and m["epochs"][0]["samples"] == 11


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_batch_of_nothing_but_undecodable_images_stops_naming_them(compose, tmp_path, split):
    """data.on_bad_sample=skip drops a bad image from its batch; a batch with no image left cannot be
    trained or validated (default_collate raised IndexError), so it stops in one paragraph naming the
    files, as data.decoder=nvjpeg does (read in a loader worker: the matrix above)."""
    from trainer.data import ImageDataModule
    from trainer.errors import TrainingStopped

    root = _undecodable(tmp_path)
    cfg = compose(
        "data=imagefolder", f"data.root={root}", "data.val_split=0.5", "data.batch_size=2", "data.image_size=16"
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    with pytest.raises(TrainingStopped) as stop:
        next(iter(loader))
    said = str(stop.value)
    assert said.startswith("no image of a batch of 2 could be decoded (") and "\n" not in said, said
    assert said.count(str(root)) == 2 and said.count(".jpg") == 2, said  # the batch's two files
