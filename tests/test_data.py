"""Datasets and loader knobs: synthetic determinism, the built-in JPEG set, image folders."""

from __future__ import annotations

import os

import pytest
import torch
from PIL import Image

from trainer.data import ImageDataModule
from trainer.data.synthetic import SyntheticImages


def test_synthetic_is_deterministic_per_seed():
    a, b, c = (SyntheticImages(32, 16, 4, seed) for seed in (1, 1, 2))
    assert torch.equal(a[5][0], b[5][0]) and a[5][1] == b[5][1]
    assert not torch.equal(a[5][0], c[5][0])
    assert a[0][0].dtype == torch.float32 and a[0][0].shape == (3, 16, 16)


def test_builtin_dataset_is_real_jpeg_and_cached(compose, tmp_path):
    cfg = compose(
        "data=builtin",
        f"data.cache_dir={tmp_path}",
        "data.images_per_class=4",
        "data.stored_size=40",
        "data.image_size=32",
        "data.batch_size=4",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 10
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 10 * (4 + 2)
    with Image.open(files[0]) as im:
        assert im.format == "JPEG" and im.size == (40, 40)
    first_mtime = files[0].stat().st_mtime
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8  # normalized after the loader (data.gpu_normalize)
    ImageDataModule(cfg.data, cfg.seed).build()  # second build reuses the cache
    assert files[0].stat().st_mtime == first_mtime


def test_a_builtin_cache_that_cannot_be_written_is_named(tmp_path):
    """A file where the cache folder should be (or any unwritable path): one paragraph, not os.makedirs's traceback."""
    from trainer.data.builtin import ensure_builtin
    from trainer.errors import ConfigError

    taken = tmp_path / "afile"
    taken.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"data=builtin: the trainer's cache .*afile cannot be written"):
        ensure_builtin(str(taken), 4, 40)


def test_a_custom_dataset_of_images_of_different_sizes_is_named_not_a_traceback(train):
    from trainer.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"'data.dataset._target_=spies.MixedSizes' gives samples of different shapes"
    ):
        train("data=custom", "data.dataset._target_=spies.MixedSizes", "+data.dataset.sleep_ms=0", "data.num_workers=0")


def test_a_custom_dataset_that_cannot_be_built_is_named(compose):
    """Hydra's "Error locating target ... set HYDRA_FULL_ERROR" before; the paragraph model._target_ gets now."""
    from trainer.errors import ConfigError

    cfg = compose("data=custom", "data.dataset._target_=no_such_pkg.MyDataset")
    with pytest.raises(
        ConfigError, match=r"the dataset from 'data.dataset._target_=no_such_pkg.MyDataset'.*no_such_pkg"
    ):
        ImageDataModule(cfg.data, cfg.seed).build()


def _make_folder(root, classes=("a", "b", "c"), per_class=5, size=20):
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (size, size), (40 * i, 10 * j, 100)).save(root / cls / f"{j}.jpg")


def test_imagefolder_split_by_ratio(compose, tmp_path):
    _make_folder(tmp_path / "imgs", per_class=10)
    cfg = compose(
        "data=imagefolder",
        f"data.root={tmp_path / 'imgs'}",
        "data.val_split=0.2",
        "data.image_size=16",
        "data.batch_size=2",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 3
    assert len(dm.train_set) == 24 and len(dm.val_set) == 6
    assert not set(dm.train_set.indices) & set(dm.val_set.indices)


def test_imagefolder_train_val_subfolders(compose, tmp_path):
    _make_folder(tmp_path / "ds" / "train", per_class=4)
    _make_folder(tmp_path / "ds" / "val", per_class=2)
    cfg = compose("data=imagefolder", f"data.root={tmp_path / 'ds'}", "data.image_size=16", "data.batch_size=2")
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 3 and len(dm.train_set) == 12 and len(dm.val_set) == 6


def test_loader_knobs_reach_the_dataloader(compose):
    cfg = compose(
        "data.device_resident=false",  # the host loader (data=synthetic's default gathers on the device)
        "data.num_workers=2",
        "data.pin_memory=true",
        "data.persistent_workers=true",
        "data.prefetch_factor=4",
        "data.batch_size=16",
    )
    loader = ImageDataModule(cfg.data, cfg.seed).train_dataloader()
    assert (
        loader.num_workers,
        loader.pin_memory,
        loader.persistent_workers,
        loader.prefetch_factor,
        loader.batch_size,
    ) == (2, True, True, 4, 16)
    cfg = compose(
        "data.device_resident=false", "data.num_workers=0", "data.persistent_workers=true", "data.prefetch_factor=4"
    )
    loader = ImageDataModule(cfg.data, cfg.seed).train_dataloader()
    assert loader.num_workers == 0 and not loader.persistent_workers and loader.prefetch_factor is None


def test_batch_larger_than_dataset_is_a_clear_error(compose, tmp_path):
    import pytest

    from trainer.errors import ConfigError

    _make_folder(tmp_path / "small", per_class=2)
    cfg = compose("data=imagefolder", f"data.root={tmp_path / 'small'}", "data.val_split=0", "data.batch_size=64")
    with pytest.raises(ConfigError, match="data.batch_size=64 is larger than the training set"):
        ImageDataModule(cfg.data, cfg.seed).build()


def test_empty_folder_is_a_clear_error(compose, tmp_path):
    import pytest

    from trainer.errors import ConfigError

    (tmp_path / "empty").mkdir()
    cfg = compose("data=imagefolder", f"data.root={tmp_path / 'empty'}")
    with pytest.raises(ConfigError, match="holds no images"):
        ImageDataModule(cfg.data, cfg.seed).build()


def _jpeg(side: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side + side // 2, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize("decoder", ["pil", "turbo"])
def test_decode_scale_decodes_a_large_jpeg_at_the_smallest_dct_scale_the_crop_allows(decoder):
    """A 512x768 JPEG for 32 px crops: needed_side(32) = 63, so 1/8 (64 px) is allowed, 1/16 does not exist;
    for 128 px crops (needed 250) 1/2 (256 px); off: full size."""
    from trainer.data.decoders import Loader
    from trainer.data.folder import needed_side

    if decoder == "turbo":
        pytest.importorskip("simplejpeg")
    data = _jpeg(512)

    def short_side(image) -> int:
        return min(image.size) if hasattr(image, "size") and not callable(image.size) else min(image.shape[-2:])

    assert needed_side(32) == 63 and needed_side(128) == 250
    assert short_side(Loader(decoder).decode(data)) == 512
    assert short_side(Loader(decoder, min_side=needed_side(32)).decode(data)) == 64
    assert short_side(Loader(decoder, min_side=needed_side(128)).decode(data)) == 256
    assert short_side(Loader(decoder, min_side=needed_side(300)).decode(data)) == 512  # needs more than half
    assert short_side(Loader("torchvision", min_side=needed_side(32)).decode(data)) == 512  # cannot scale


def test_turbo_asks_simplejpeg_for_a_size_only_where_a_smaller_dct_scale_exists(monkeypatch):
    """Asked for a minimum size, simplejpeg decodes about 8% slower even at full scale: data.decoder=turbo
    passes min_height/min_width only for a JPEG at least twice the needed side. Seen on the arguments
    that reach simplejpeg's own decode_jpeg (wrapped, still decoding). Asked for 257 px of a 512 px
    image, libjpeg-turbo would also pick its 5/8 scale (320 px), which PIL's draft has not: the two
    decoders would decode the same file at different sizes."""
    simplejpeg = pytest.importorskip("simplejpeg")
    from trainer.data.decoders import Loader
    from trainer.data.folder import needed_side

    calls = []
    real = simplejpeg.decode_jpeg

    def spy(data, *args, **kwargs):
        calls.append(kwargs)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    data = _jpeg(512)  # 512 x 768
    no_smaller = Loader("turbo", min_side=257).decode(data)  # 1/2 would be 256 px: too small, full size it is
    scaled = Loader("turbo", min_side=needed_side(32)).decode(data)
    Loader("turbo").decode(data)  # decode_scale=off
    assert len(calls) == 3, calls
    sized = [{k: v for k, v in c.items() if k in ("min_height", "min_width")} for c in calls]
    assert sized == [{}, {"min_height": 63, "min_width": 63}, {}]
    assert all(c["fastdct"] and c["fastupsample"] for c in calls)
    assert no_smaller.shape[-2:] == (512, 768) and scaled.shape[-2:] == (64, 96)


def _png16(pixels) -> bytes:
    """A 16-bit PNG (grey for H x W pixels, colour for H x W x 3), written by hand: Pillow writes 16-bit
    grey PNGs only."""
    import struct
    import zlib

    height, width = pixels.shape[:2]
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in pixels)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 16, 2 if pixels.ndim == 3 else 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _lossless_file(kind: str):
    """(encoded bytes, the uint8 CHW pixels every decoder must give) of a 24x16 image of ``kind``."""
    import io

    import numpy as np

    rng = np.random.default_rng(0)
    colour, grey = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), rng.integers(0, 256, (16, 24), dtype=np.uint8)
    deep_colour, deep_grey = rng.integers(0, 65536, (16, 24, 3)), rng.integers(0, 65536, (16, 24))
    buffer = io.BytesIO()
    if kind in ("BMP", "TIFF", "PPM"):
        Image.fromarray(colour).save(buffer, kind)
        return buffer.getvalue(), torch.from_numpy(colour).permute(2, 0, 1)
    if kind == "PGM":
        Image.fromarray(grey).save(buffer, "PPM")  # P5: grey
        return buffer.getvalue(), torch.from_numpy(grey).expand(3, -1, -1)
    if kind == "16-bit grey PNG":
        return _png16(deep_grey), torch.from_numpy((deep_grey >> 8).astype(np.uint8)).expand(3, -1, -1)
    return _png16(deep_colour), torch.from_numpy((deep_colour >> 8).astype(np.uint8)).permute(2, 0, 1)


def test_a_packed_16_bit_grey_png_keeps_its_high_bytes_as_every_decoder_does(tmp_path):
    """python -m trainer.pack (data=packed) decodes with Pillow too: a 16-bit grey image was clipped to white."""
    import numpy as np

    from trainer.data.pack import pack

    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        (tmp_path / "src" / cls / "0.png").write_bytes(_png16(np.full((8, 8), 0x8000 + 0x40 * len(cls))))
    pack(str(tmp_path / "src"), str(tmp_path / "dst"), size=8, fmt="npy", val_split=0)
    images = np.load(tmp_path / "dst" / "images.npy")
    assert images.shape == (2, 8, 8, 3) and (images == 0x80).all(), np.unique(images)


@pytest.mark.parametrize("kind", ["BMP", "TIFF", "PPM", "PGM", "16-bit grey PNG", "16-bit colour PNG"])
def test_every_decoder_gives_the_same_uint8_pixels_for_a_lossless_file_imagefolder_takes(kind):
    """data.decoder changes speed only: a BMP, PPM/PGM or TIFF (which torchvision cannot read) decodes
    under every decoder, and a 16-bit PNG gives its high bytes as uint8 (Pillow alone clipped grey to
    white; torchvision's uint16 broke the batch). Lossless: exactly. Cut short, the file is still
    undecodable (a bad sample), whichever decoder reads it."""
    from torchvision.transforms.functional import pil_to_tensor

    from trainer.data.decoders import DECODE_ERRORS, Loader

    data, expected = _lossless_file(kind)
    for decoder in ("pil", "torchvision", "turbo"):  # turbo without simplejpeg: none of these is a JPEG
        decoded = Loader(decoder).decode(data)
        image = pil_to_tensor(decoded) if isinstance(decoded, Image.Image) else decoded
        assert image.dtype == torch.uint8 and torch.equal(image, expected), (decoder, image.dtype)
        with pytest.raises(DECODE_ERRORS):
            Loader(decoder).decode(data[: len(data) // 2])


def _worst_crop(monkeypatch, crop, image, ratio_end: int):
    """(h, w) of the crop torchvision's RandomResizedCrop takes from ``image`` when it draws the least
    area of its scale range and the ``ratio_end`` (0: least, 1: most) of its ratio range."""
    draws = iter([0, ratio_end] * 10)  # make_params draws the area, then the ratio, per try
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "uniform_", lambda t, lo, hi: t.fill_((lo, hi)[next(draws)]))
        params = crop.make_params([image])
    return params["height"], params["width"]


def _random_resized_crop(image_size: int):
    from torchvision.transforms import v2

    from trainer.data.folder import transforms_for

    crops = [t for t in transforms_for(image_size, True, True).transforms if isinstance(t, v2.RandomResizedCrop)]
    assert len(crops) == 1
    return crops[0]


@pytest.mark.parametrize("image_size", [32, 64, 128, 224])
def test_needed_side_covers_the_smallest_crop_the_train_transform_draws(monkeypatch, image_size):
    """data.decode_scale=auto: an image decoded to needed_side has no crop smaller than image_size,
    at the least area and at either end of the aspect-ratio range (3/4: a narrow crop, 4/3: a flat one),
    on a square image (the least area for a short side) and a 3:2 one; one pixel less and the worst
    crop is smaller (the bound is the true worst case, not a margin)."""
    from trainer.data.folder import needed_side

    crop = _random_resized_crop(image_size)
    side = needed_side(image_size)
    for h, w in [(side, side), (side, side * 3 // 2), (side * 3 // 2, side)]:
        for end in (0, 1):
            assert min(_worst_crop(monkeypatch, crop, torch.zeros(3, h, w), end)) >= image_size, (h, w, end)
    smaller = side - 2
    assert min(_worst_crop(monkeypatch, crop, torch.zeros(3, smaller, smaller), 0)) < image_size


@pytest.mark.parametrize("decoder", ["pil", "turbo"])
def test_decode_scale_never_decodes_so_small_that_the_worst_crop_is_upsampled(monkeypatch, decoder):
    """A 440x440 JPEG for 32 px crops: 1/8 is 55 px, where a crop of 35% of the area at ratio 3/4 is
    28 px wide and would be upsampled; auto decodes it at 1/4 (110 px) instead."""
    import io

    import numpy as np

    from trainer.data.decoders import Loader
    from trainer.data.folder import needed_side

    if decoder == "turbo":
        pytest.importorskip("simplejpeg")
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (440, 440, 3), dtype=np.uint8)).save(buffer, "JPEG")
    decoded = Loader(decoder, min_side=needed_side(32)).decode(buffer.getvalue())
    image = torch.from_numpy(np.array(decoded)).permute(2, 0, 1) if isinstance(decoded, Image.Image) else decoded
    assert min(image.shape[-2:]) == 110
    crop = _random_resized_crop(32)
    for end in (0, 1):
        assert min(_worst_crop(monkeypatch, crop, image, end)) >= 32


def test_decode_scale_follows_the_train_transform(tmp_path):
    """needed_side comes from the train transform as built: without augmentation (resize and center
    crop) validation's resize is all an image needs, with it the smallest random crop."""
    import numpy as np

    from trainer.data import decoders
    from trainer.data.folder import build_image_folders

    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.fromarray(np.zeros((40, 40, 3), dtype=np.uint8)).save(tmp_path / cls / "0.jpg")
    sides = {}
    for augment in (True, False):
        train, _, _ = build_image_folders(str(tmp_path), 32, augment, 0.0, 0, decode_scale="auto")
        assert isinstance(train.loader, decoders.Loader)
        sides[augment] = train.loader.min_side
    assert sides == {True: 63, False: 36}


def test_data_decode_scale_reaches_the_decoder_of_a_run(train, monkeypatch, tmp_path):
    """The flag, end to end: the images a run's loader decodes are smaller with data.decode_scale=auto."""
    from trainer.data import decoders

    seen = []
    real = decoders.Loader.decode
    common = ["data=builtin", f"data.cache_dir={tmp_path}", "data.images_per_class=4", "data.stored_size=256"]
    common += ["data.image_size=32", "data.batch_size=8", "data.num_workers=0", "trainer.max_epochs=1"]
    monkeypatch.setattr(decoders.Loader, "decode", _recording(seen, real))
    train(*common, "data.decode_scale=off", tiny=False)
    full = {min(s) for s in seen}
    seen.clear()
    m, _ = train(*common, "data.decode_scale=auto", tiny=False)
    assert m["flags"]["data.decode_scale"] == "auto"
    assert full == {256} and {min(s) for s in seen} == {64}  # 256 / 4: the smallest with a short side >= 63


def _recording(seen, real):
    def decode(self, data):
        image = real(self, data)
        seen.append(image.size)  # PIL: (width, height)
        return image

    return decode


def test_the_builtin_set_is_the_same_cut_in_several_processes(tmp_path, monkeypatch):
    """A large built-in set is cut and saved by one process per core: the crops are drawn first, in
    one sequence, so the files are the very same as cutting them all in one process."""
    import hashlib

    from trainer.data import builtin

    def digests(root):
        return {p.relative_to(root): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.jpg"))}

    builtin._generate(str(tmp_path / "one"), 6, 24, 0)
    monkeypatch.setattr(builtin, "PARALLEL_FROM", 10)
    monkeypatch.setattr("trainer.measure.hardware.usable_cores", lambda: 2)
    calls = []
    real = builtin._cut
    monkeypatch.setattr(builtin, "_cut", lambda *a: calls.append(a) or real(*a))  # this process's, not the workers'
    builtin._generate(str(tmp_path / "two"), 6, 24, 0)
    assert not calls  # cut in the worker processes, not here
    one, two = digests(tmp_path / "one"), digests(tmp_path / "two")
    assert len(one) == 10 * (6 + 2) and one == two


def test_the_builtin_set_is_cut_in_this_process_where_workers_cannot_start(tmp_path):
    """Code piped to python's stdin has a __main__ that spawned workers cannot import: the set is
    cut in the calling process instead (a process pool restarted such workers forever)."""
    import subprocess
    import sys

    from conftest import ROOT

    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from trainer.data import builtin\n"
        "builtin.PARALLEL_FROM = 10\n"
        "import trainer.measure.hardware as h; h.usable_cores = lambda: 2\n"
        "builtin._generate(%r, 6, 24, 0)\n"
        "print('done')\n"
    ) % (str(ROOT), str(tmp_path / "set"))
    r = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stderr[-2000:]
    assert len(list((tmp_path / "set").rglob("*.jpg"))) == 10 * (6 + 2)


def _image_folder_module(compose, root, *overrides):
    cfg = compose("data=imagefolder", f"data.root={root}", "data.image_size=16", "data.batch_size=2", *overrides)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    return dm


def _val_files(dm) -> list:
    """The held-out images as (class, file name), whichever way the split was made."""
    val = dm.val_set
    samples = val.dataset.samples if hasattr(val, "indices") else val.samples
    indices = val.indices if hasattr(val, "indices") else range(len(samples))
    return sorted((dm.classes[samples[i][1]], samples[i][0].rsplit("/", 1)[-1]) for i in indices)


def test_a_class_called_train_in_a_flat_folder_is_a_class(compose, tmp_path):
    """PASCAL VOC and COCO have a class "train": a train/ of images is that class, not the split layout
    (whose train/ holds class folders), here and in trainer.pack alike."""
    from trainer.data.layout import split_folders

    _make_folder(tmp_path / "voc", classes=("bus", "car", "train"))
    dm = _image_folder_module(compose, tmp_path / "voc", "data.val_split=0.2")
    assert dm.classes == ["bus", "car", "train"] and len(dm.train_set) + len(dm.val_set) == 15
    assert split_folders(str(tmp_path / "voc")) is None  # trainer.pack's test: the same function


def test_a_train_folder_without_val_holds_out_val_split_of_each_class(compose, tmp_path):
    """README: without val/, data.val_split of each class is held out: the images a flat folder of the
    same classes holds out."""
    _make_folder(tmp_path / "ds" / "train", per_class=5)
    dm = _image_folder_module(compose, tmp_path / "ds", "data.val_split=0.2")
    assert dm.val_set is not None and len(dm.train_set) == 12 and len(dm.val_set) == 3
    assert _val_files(dm) == _val_files(_image_folder_module(compose, tmp_path / "ds" / "train", "data.val_split=0.2"))


def test_a_validation_folder_is_the_val_split(compose, tmp_path):
    """validation/ is the held-out split's other name (Parquet exports use it; data=parquet reads it)."""
    _make_folder(tmp_path / "ds" / "train", per_class=4)
    _make_folder(tmp_path / "ds" / "validation", per_class=2)
    dm = _image_folder_module(compose, tmp_path / "ds", "data.val_split=0.2")
    assert len(dm.train_set) == 12 and len(dm.val_set) == 6
    assert {name for _, name in _val_files(dm)} == {"0.jpg", "1.jpg"}


def test_hidden_folders_are_not_classes(compose, tmp_path, caplog):
    """.cache, .ipynb_checkpoints and __MACOSX beside the class folders hold images, but they are not
    classes: read as one, each added a label and shifted the labels of the classes after it."""
    _make_folder(tmp_path / "imgs", classes=("a", "b"))
    _make_folder(tmp_path / "imgs", classes=(".cache", ".ipynb_checkpoints", "__MACOSX"), per_class=1)
    with caplog.at_level("WARNING", logger="trainer.data.layout"):
        dm = _image_folder_module(compose, tmp_path / "imgs", "data.val_split=0")
    assert dm.classes == ["a", "b"] and len(dm.train_set) == 10
    assert any(".ipynb_checkpoints" in r.getMessage() for r in caplog.records)  # said, not silent


def test_a_class_folder_beside_hidden_ones_is_still_one_class(compose, tmp_path):
    from trainer.errors import ConfigError

    _make_folder(tmp_path / "imgs", classes=("a", ".ipynb_checkpoints"))
    with pytest.raises(ConfigError, match=r"one class folder \(a\)"):
        _image_folder_module(compose, tmp_path / "imgs")


def test_a_remote_folder_skips_hidden_folders_as_a_local_one_does(tmp_path):
    import fsspec

    from trainer.data.folder import build_image_folders

    _make_folder(tmp_path / "imgs", classes=("a", "b"))
    _make_folder(tmp_path / "imgs", classes=("__MACOSX",), per_class=1)
    fs = fsspec.filesystem("memory")
    fs.put(f"{tmp_path / 'imgs'}/", f"/hidden-{tmp_path.name}/imgs", recursive=True)
    train, _, classes = build_image_folders(f"memory://hidden-{tmp_path.name}/imgs", 16, False, 0, 0)
    assert classes == ["a", "b"] and len(train) == 10


def test_a_remote_folder_with_subfolders_in_its_classes_holds_out_the_local_ones_val_images(tmp_path):
    """ImageFolder reads a class folder by folder (each sorted), not by whole paths: a remote reader that
    sorted whole paths put ``a/sub/x/...`` before ``a/za_...``, and so held out other images."""
    import fsspec

    from trainer.data.folder import build_image_folders

    for i, cls in enumerate(("a", "b")):  # files named after the subfolder: "sub/..." < "za_..." as whole paths
        _make_folder(tmp_path / "imgs" / cls / "sub", classes=("x",), per_class=3)
        for j in range(3):
            Image.new("RGB", (20, 20), (90 * i, 40 * j, 100)).save(tmp_path / "imgs" / cls / f"za_{j}.jpg")
    fs = fsspec.filesystem("memory")
    fs.put(f"{tmp_path / 'imgs'}/", f"/nested-{tmp_path.name}/imgs", recursive=True)

    def held_out(root: str) -> list:
        _, val, _ = build_image_folders(root, 16, False, 0.5, 7)
        return [val.dataset.samples[i][0].replace(os.sep, "/").split("/imgs/", 1)[1] for i in val.indices]

    local = held_out(str(tmp_path / "imgs"))
    assert held_out(f"memory://nested-{tmp_path.name}/imgs") == local
    assert any("sub" in p for p in local) and any("sub" not in p for p in local)


def test_the_cache_copies_a_class_folder_that_is_a_symlink(compose, tmp_path):
    """ImageFolder follows a symlinked class folder: the cache's copy must hold it too, or the copy
    has a class fewer and the labels after it shift."""
    _make_folder(tmp_path / "elsewhere", classes=("b",))
    _make_folder(tmp_path / "imgs", classes=("a", "c"))
    (tmp_path / "imgs" / "b").symlink_to(tmp_path / "elsewhere" / "b")
    direct = _image_folder_module(compose, tmp_path / "imgs", "data.val_split=0")
    cached = _image_folder_module(compose, tmp_path / "imgs", "data.val_split=0", f"data.cache={tmp_path / 'cache'}")
    assert direct.classes == cached.classes == ["a", "b", "c"]
    assert len(cached.train_set) == len(direct.train_set) == 15


def test_the_cache_refuses_a_symlink_loop_as_the_image_folder_does(compose, tmp_path):
    from trainer.errors import ConfigError

    _make_folder(tmp_path / "imgs", classes=("a", "b"))
    (tmp_path / "imgs" / "a" / "again").symlink_to(tmp_path / "imgs")
    with pytest.raises(ConfigError, match="symlink loop"):
        _image_folder_module(compose, tmp_path / "imgs", f"data.cache={tmp_path / 'cache'}")


def test_a_loop_of_two_symlinks_is_refused(tmp_path):
    """a/x -> b and b/y -> a: neither link points at a folder above it, yet the walk never ends."""
    from trainer.data.folder import check_layout
    from trainer.errors import ConfigError

    _make_folder(tmp_path / "imgs", classes=("a", "b"), per_class=1)
    (tmp_path / "imgs" / "a" / "x").symlink_to(tmp_path / "imgs" / "b")
    (tmp_path / "imgs" / "b" / "y").symlink_to(tmp_path / "imgs" / "a")
    with pytest.raises(ConfigError, match="symlink loop"):
        check_layout(str(tmp_path / "imgs"), "data.root")
