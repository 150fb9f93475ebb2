"""data.loader=dali on a CPU: the files each epoch reads (the torch loader's order, each sample once,
the ranks' shares, a step limit), the transforms against ours on planted images, learning like the
torch loader, and the paragraphs for what it cannot do. Its resume on one and two ranks is
tests/test_loader_resume.py; its GPU decoder tests/gpu/test_dali_gpu.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from conftest import run_cli
from PIL import Image

from trainer.data import ImageDataModule
from trainer.data.augment import Augmentation
from trainer.errors import ConfigError, TrainingStopped

dali = pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is a test dependency: pip install -e '.[test]'")


def _datamodule(compose, root, *overrides, loader="dali"):
    cfg = compose(
        "data=imagefolder",
        f"data.root={root}",
        f"data.loader={loader}",
        "data.image_size=16",
        "data.batch_size=5",
        "data.drop_last=false",
        *overrides,
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    return dm


def _labels(loader, epoch=None) -> list:
    if epoch is not None:
        loader.epoch_of = lambda: epoch
    return [int(y) for _, labels in loader for y in labels]


def test_each_epoch_reads_every_sample_once_in_the_torch_loaders_order(compose, one_per_class):
    from trainer.data.sampler import EpochShuffleSampler

    dm = _datamodule(compose, one_per_class)
    loader = dm.train_dataloader()
    epochs = [_labels(loader, e) for e in (0, 1)]
    assert all(sorted(e) == list(range(23)) for e in epochs) and epochs[0] != epochs[1], epochs
    assert len(loader) == 5  # 23 samples in batches of 5, the last one partial
    for e, labels in enumerate(epochs):  # the epoch's permutation of (seed, epoch), as the torch loader's sampler
        sampler = EpochShuffleSampler(23, dm.seed)
        sampler.set_epoch(e)
        assert labels == list(sampler), e
    torch_dm = _datamodule(compose, one_per_class, loader="torch")
    assert epochs[0] == [int(y) for _, labels in torch_dm.train_dataloader() for y in labels]
    # a mid-epoch resume after 2 batches of epoch 1 reads the rest of that epoch, then whole epochs
    dm.load_state_dict({"position": [1, 2]})
    resumed = dm.train_dataloader()
    assert _labels(resumed, 1) == epochs[1][10:] and _labels(resumed, 1) == epochs[1]
    assert sorted(_labels(dm.val_dataloader(), 0)) == list(range(23))


def test_a_step_limit_reads_only_the_files_of_the_batches_the_epoch_uses(compose, one_per_class):
    """trainer.limit_train_batches / limit_val_batches: the epoch's pipeline reads the first batches'
    files only (DALI's prefetch would otherwise decode past the limit), the same ones as without it."""
    from types import SimpleNamespace

    for world in (1, 2):
        for rank in range(world):
            dm = _datamodule(compose, one_per_class)
            dm.trainer = SimpleNamespace(
                world_size=world,
                global_rank=rank,
                current_epoch=1,
                strategy=SimpleNamespace(root_device=torch.device("cpu")),
                limit_train_batches=1.0,
                limit_val_batches=1.0,
            )
            whole = (_labels(dm.train_dataloader()), _labels(dm.val_dataloader()))
            dm.trainer.limit_train_batches, dm.trainer.limit_val_batches = 2, 1
            train, val = dm.train_dataloader(), dm.val_dataloader()
            assert len(train) == 2 and len(val) == 1
            assert _labels(train) == whole[0][:10] and _labels(val) == whole[1][:5], (world, rank)


def test_ranks_get_the_samples_lightning_deals_the_torch_loaders_ranks(compose, one_per_class):
    """Training: the shares of Lightning's own DistributedSamplerWrapper around the torch loader's
    sampler, as Lightning makes it for a training loader (shuffled by PL_GLOBAL_SEED and the epoch);
    validation: DistributedSampler's unshuffled, padded shares. 23 samples on 2 ranks: 12 each."""
    from types import SimpleNamespace

    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import DistributedSampler

    from trainer.data.sampler import EpochShuffleSampler

    dm = _datamodule(compose, one_per_class)
    for epoch in (0, 1):
        seen, val = [], []
        for r in (0, 1):
            dm.trainer = SimpleNamespace(
                world_size=2,
                global_rank=r,
                current_epoch=epoch,
                strategy=SimpleNamespace(root_device=torch.device("cpu")),
                limit_train_batches=1.0,
                limit_val_batches=1.0,
            )
            lightning = DistributedSamplerWrapper(
                EpochShuffleSampler(23, dm.seed), num_replicas=2, rank=r, shuffle=True
            )
            lightning.set_epoch(epoch)
            seen.append(_labels(dm.train_dataloader()))
            assert seen[-1] == list(lightning), (epoch, r)
            val.append(_labels(dm.val_dataloader()))
            assert val[-1] == list(DistributedSampler(range(23), num_replicas=2, rank=r, shuffle=False)), (epoch, r)
        for shares in (seen, val):
            assert len(shares[0]) == len(shares[1]) == 12 and set(shares[0]) | set(shares[1]) == set(range(23))


def _gradient(path, width=64, height=48):
    """Red rises with x (4 per pixel), green with y (5 per pixel): a crop's pixels say where it came from."""
    x = np.arange(width)[None, :].repeat(height, 0) * 4
    y = np.arange(height)[:, None].repeat(width, 1) * 5
    Image.fromarray(np.stack([x, y, np.full_like(x, 128)], -1).astype(np.uint8)).save(path)
    return str(path)


def _loader(files, train, augmentation, **kwargs):
    from trainer.data.dali import DaliLoader

    samples = [(f, 0) for f in files]
    return DaliLoader(
        samples,
        lambda epoch: list(range(len(samples))),
        lambda: 0,
        len(samples),
        train=train,
        batch_size=len(samples),
        image_size=16,
        augmentation=augmentation,
        threads=2,
        seed_of=lambda epoch: 3,
        **kwargs,
    )


def _pixels(normalized: torch.Tensor) -> torch.Tensor:
    """Normalized CHW batches back to 0-255 pixel values."""
    from trainer.data.gpu_transforms import IMAGENET_MEAN, IMAGENET_STD

    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (normalized * std + mean) * 255


def test_training_crops_and_flips_as_ours_validation_matches_ours(tmp_path):
    """Random-resized crop within data.crop_min_scale..1 of the area and 3/4..4/3 aspect, an even flip,
    ImageNet normalization; validation's resize + center crop equal to torchvision's transform; NHWC
    memory for channels_last and uint8 for gpu_normalize, the same values."""
    from trainer.data.augment import transforms_for

    path = _gradient(tmp_path / "gradient.png")
    augment = Augmentation(crop_min_scale=0.35)
    (images, _), *_ = list(_loader([path] * 96, True, augment))
    px = _pixels(images)
    red, green = px[:, 0], px[:, 1]
    flipped = red[:, :, 0].mean(1) > red[:, :, -1].mean(1)
    # the crop's extent in source pixels: the span of the values over the 16 output pixels, whose
    # centres cover 15/16 of it
    width = (red.amax((1, 2)) - red.amin((1, 2))) / 4 * 16 / 15
    height = (green.amax((1, 2)) - green.amin((1, 2))) / 5 * 16 / 15
    area, aspect = width * height / (64 * 48), width / height
    assert 0.3 <= float(area.min()) < 0.55 and float(area.max()) <= 1.08, sorted(area.tolist())
    assert float(aspect.min()) >= 0.7 and float(aspect.max()) <= 1.42, sorted(aspect.tolist())
    assert 0.25 <= float(flipped.float().mean()) <= 0.75, flipped

    ours = transforms_for(16, False, augment)(Image.open(path).convert("RGB"))
    (val, _), *_ = list(_loader([path], False, augment))
    assert val.shape == (1, 3, 16, 16) and float((val[0] - ours).abs().max()) < 0.1, (val[0] - ours).abs().max()

    (nhwc, _), *_ = list(_loader([path], False, augment, channels_last=True))
    assert (
        nhwc.shape == val.shape and nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    )
    assert torch.equal(nhwc, val)
    (u8, _), *_ = list(_loader([path], False, augment, keep_uint8=True))
    assert u8.dtype == torch.uint8 and float((_pixels(val) - u8.float()).abs().max()) < 0.51


def _sideways_photos(root):
    """Two classes of one 32 px JPEG, left half red and right half blue, tagged EXIF orientation 6
    (a camera held sideways: a viewer that applies the tag turns it so that red is on top)."""
    pixels = np.zeros((32, 32, 3), np.uint8)
    pixels[:, :16, 0], pixels[:, 16:, 2] = 255, 255
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            Image.fromarray(pixels).save(root / split / cls / "0.jpg", exif=exif, quality=95)
    return root


def test_a_photos_exif_orientation_is_left_as_the_torch_loaders_decoders_leave_it(compose, tmp_path):
    """DALI's decoders turn a photo by its EXIF orientation unless told not to; Pillow, torchvision and
    simplejpeg do not: the same file must reach the model the same way under either loader, in
    validation's decoder and in training's cropping one."""
    root = _sideways_photos(tmp_path)
    (torch_val, _), *_ = list(_datamodule(compose, root, loader="torch").val_dataloader())
    dm = _datamodule(compose, root)
    (dali_val, _), *_ = list(dm.val_dataloader())
    difference = (dali_val.float() - torch_val.float()).abs().max()
    assert float(difference) <= 2, difference
    (train, _), *_ = list(dm.train_dataloader())
    red = train.float()[:, 0]  # red in the left or right half (flipped), never in the top or the bottom one
    top_minus_bottom = (red[:, :8].mean((1, 2)) - red[:, 8:].mean((1, 2))).abs()
    left_minus_right = (red[:, :, :8].mean((1, 2)) - red[:, :, 8:].mean((1, 2))).abs()
    assert float(top_minus_bottom.max()) < 10, top_minus_bottom
    assert float(left_minus_right.min()) > 100, left_minus_right


@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment", "autoaugment"])
def test_each_automatic_policy_runs_in_dalis_pipeline_and_changes_the_pixels(tmp_path, policy):
    """data.augment_policy through DALI's own automatic augmentations: the same crops and flips (the
    same seed) with the policy differ from those without it in many images, none in size or type."""
    path = _gradient(tmp_path / "gradient.png")
    plain, augmented = (
        list(_loader([path] * 32, True, Augmentation(policy=p, magnitude=20)))[0][0] for p in ("none", policy)
    )
    assert augmented.shape == plain.shape and augmented.dtype == plain.dtype
    changed = ((augmented - plain).abs().amax((1, 2, 3)) > 0.5).float().mean()
    assert 0.3 <= float(changed) <= 1.0, float(changed)


def test_an_undecodable_file_stops_with_a_paragraph_naming_it(tmp_path):
    good = _gradient(tmp_path / "good.png")
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg" * 20)
    with pytest.raises(TrainingStopped) as e:
        list(_loader([good, str(bad), good], True, Augmentation()))
    assert f"cannot decode {bad}" in str(e.value) and "data.loader=torch" in str(e.value), e.value


@pytest.mark.parametrize(
    "overrides,says",
    [
        (["data=synthetic"], "data=synthetic makes its images in memory"),
        (["data=parquet", "data.root=/nowhere"], "data=parquet holds images inside Parquet row groups"),
        (["data=imagefolder", "data.random_erasing=0.25"], "data.random_erasing=0.25 cannot run"),
    ],
)
def test_what_dali_cannot_do_is_one_paragraph_naming_the_key(compose, overrides, says, small_images):
    cfg = compose(f"data.root={small_images}", *overrides, "data.loader=dali")
    with pytest.raises(ConfigError) as e:
        ImageDataModule(cfg.data, cfg.seed).build()
    assert says in str(e.value) and "data.loader=torch" in str(e.value) and "\n" not in str(e.value), e.value


def test_without_dali_installed_it_says_how_to_install_it(compose, small_images, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what an environment without the wheel imports
    cfg = compose("data=imagefolder", f"data.root={small_images}", "data.loader=dali")
    with pytest.raises(ConfigError) as e:
        ImageDataModule(cfg.data, cfg.seed).build()
    assert "pip install 'trainer-switchboard[dali]'" in str(e.value) and "nvidia-dali-cuda120" in str(e.value)


@pytest.mark.slow
def test_a_refusal_from_train_py_is_one_paragraph_and_exit_2(tmp_path):
    r = run_cli(f"hydra.run.dir={tmp_path / 'run'}", "data=synthetic", "data.loader=dali")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert "error: data.loader=dali reads JPEG files from class folders" in r.stderr


@pytest.mark.slow
def test_learns_like_the_torch_loader_on_the_same_folder(train, small_images):
    """The tiny CNN on the small built-in JPEGs (10 classes), two seeds per loader: both far above
    chance (0.1), and DALI's mean within the spread two seeds of the torch loader show."""
    common = ["data=imagefolder", f"data.root={small_images}", "data.image_size=32", "data.batch_size=16"]
    acc = {}
    for loader in ("torch", "dali"):
        for seed in (1, 2):
            m, _ = train(*common, f"data.loader={loader}", f"seed={seed}", "trainer.max_epochs=6")
            assert m["status"] == "ok" and m["flags"]["data.loader"] == loader, m.get("error")
            assert m["decoder"] == ("dali-cpu" if loader == "dali" else "pil"), m["decoder"]
            assert m["data_wait_fraction"] is not None and len(m["epochs"]) == 6
            assert all(e["data_wait_s"] >= 0 for e in m["epochs"])
            acc.setdefault(loader, []).append(m["val_acc"])
    assert min(acc["torch"] + acc["dali"]) > 0.5, acc
    assert abs(np.mean(acc["dali"]) - np.mean(acc["torch"])) < 0.15, acc


@pytest.mark.slow
def test_a_resume_at_an_epoch_boundary_ends_with_the_straight_runs_weights(train, small_images):
    common = [
        "data=imagefolder",
        f"data.root={small_images}",
        "data.loader=dali",
        "data.image_size=16",
        "data.batch_size=20",
        "trainer.max_epochs=2",
        "checkpoint.enabled=true",
        "checkpoint.keep_last_k=-1",
    ]
    _, straight = train(*common)
    first = next((straight / "checkpoints").glob("epoch000-*.ckpt"))
    _, resumed = train(*common, f"ckpt_path={first}")
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert len(a) > 0 and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_epochs_pipeline_goes_with_its_last_batch(tmp_path, monkeypatch):
    """Lightning takes len() batches and lets the generator go only when it starts the next epoch's:
    the pipeline (and its threads) must not live on through the next epoch or validation."""
    import weakref

    from trainer.data import dali as dali_mod

    made = []
    real = dali_mod.build_pipeline

    def recorded(*args):
        pipe = real(*args)
        made.append(weakref.ref(pipe))
        return pipe

    monkeypatch.setattr(dali_mod, "build_pipeline", recorded)
    path = _gradient(tmp_path / "gradient.png")
    loader = _loader([path] * 10, True, Augmentation())
    loader.batch_size = 4  # 3 batches, the last one partial
    batches = iter(loader)
    got = [next(batches) for _ in range(len(loader))]  # as Lightning asks: no StopIteration
    assert [b[0].shape[0] for b in got] == [4, 4, 2] and made and made[0]() is None


def test_a_recipes_randaugment_reaches_dalis_pipeline_at_its_magnitude_and_ops(compose, tmp_path, monkeypatch):
    """data.loader=dali with resnet50_a3's policy keys: DALI's RandAugment gets magnitude 18 and 2 ops."""
    from nvidia.dali.auto_aug import rand_augment

    real, seen = rand_augment.rand_augment, []

    def spy(images, **kwargs):
        seen.append((kwargs["n"], kwargs["m"]))
        return real(images, **kwargs)

    monkeypatch.setattr(rand_augment, "rand_augment", spy)
    cfg = compose("+recipe=resnet50_a3")
    path = _gradient(tmp_path / "g.jpg")
    list(_loader([path] * 4, True, Augmentation.of(cfg.data)))
    assert seen == [(cfg.data.randaugment_ops, cfg.data.randaugment_magnitude)] and seen[0][1] == 18


@pytest.mark.parametrize("keys", [("data.num_workers=3",), ("data.auto_workers=true",)])
def test_dalis_threads_are_the_loader_workers_the_keys_ask_for(compose, one_per_class, monkeypatch, keys):
    """data.num_workers, or data.auto_workers' count (here of a node of 8 usable cores), is DALI's thread count."""
    from trainer.data import dali as dali_mod
    from trainer.measure import hardware

    monkeypatch.setattr(hardware, "usable_cores", lambda: 8)
    built, real = [], dali_mod.build_pipeline
    monkeypatch.setattr(dali_mod, "build_pipeline", lambda *a: built.append(real(*a)) or built[-1])
    dm = _datamodule(compose, one_per_class, *keys)
    assert dm.num_workers == (3 if keys == ("data.num_workers=3",) else hardware.workers_per_process(8, 1)) > 1
    _labels(dm.train_dataloader())
    assert [p.num_threads for p in built] == [dm.num_workers]
    assert dm.describe_loader() == {"loader": "dali", "decoder": "dali-cpu", "num_workers": dm.num_workers}


def test_repeated_augment_draws_as_the_torch_loaders_under_dali(compose, one_per_class):
    """data.repeated_augment=3 under DALI: each sample of the epoch's permutation three times in a row,
    cut back to the epoch's length, the very labels the torch loader reads."""
    dali_dm = _datamodule(compose, one_per_class, "data.repeated_augment=3")
    torch_dm = _datamodule(compose, one_per_class, "data.repeated_augment=3", loader="torch")
    drawn = _labels(dali_dm.train_dataloader(), 0)
    assert drawn == [int(y) for _, labels in torch_dm.train_dataloader() for y in labels]
    assert len(drawn) == 23 and all(drawn[i] == drawn[i - i % 3] for i in range(23)), drawn
    assert len(set(drawn)) == 8  # ceil(23 / 3) samples, each drawn 3 times (the last one twice)
