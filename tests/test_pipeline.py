"""The input pipeline switches: each one changes what the loader delivers or how it works."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.data.datamodule import ImageDataModule


def _jpeg_folder(root: Path, classes=("a", "b", "c"), per_class=6, size=40) -> Path:
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (size, size), (80 * i, 30 * j, 120)).save(root / cls / f"{j}.jpg", quality=90)
    return root


def _first_batch(compose, *overrides):
    cfg = compose(*overrides)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    return dm, next(iter(dm.train_dataloader()))


def test_gpu_normalize_ships_uint8_and_the_model_normalizes(compose, train, tmp_path):
    host = "data.device_resident=false"  # synthetic batches built on the host, as a loader of real data builds them
    _, (x, _) = _first_batch(compose, host, "data.image_size=16", "data.batch_size=4")
    assert x.dtype == torch.uint8  # the default
    _, (x, _) = _first_batch(compose, host, "data.gpu_normalize=false", "data.image_size=16", "data.batch_size=4")
    assert x.dtype == torch.float32
    root = _jpeg_folder(tmp_path / "imgs")
    _, (x, _) = _first_batch(
        compose,
        "data=imagefolder",
        f"data.root={root}",
        "data.gpu_normalize=true",
        "data.image_size=16",
        "data.batch_size=4",
    )
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16)
    import spies

    spies.SEEN.clear()
    m, _ = train("data.gpu_normalize=true", "model._target_=spies.ProbeNet", "~model.width")
    assert (
        m["status"] == "ok" and spies.SEEN and all(s["input_dtype"] == torch.float32 for s in spies.SEEN)
    )  # converted on the device
    assert m["flags"]["data.gpu_normalize"] is True


@pytest.mark.parametrize("decoder", ["pil", "torchvision", "turbo"])
def test_decoders_deliver_the_same_images(compose, tmp_path, decoder):
    root = _jpeg_folder(tmp_path / "imgs")
    dm, (x, y) = _first_batch(
        compose,
        "data=imagefolder",
        f"data.root={root}",
        f"data.decoder={decoder}",
        "data.augment=false",
        "data.val_split=0",
        "data.image_size=32",
        "data.batch_size=4",
    )
    ref_dm, (ref, _) = _first_batch(
        compose,
        "data=imagefolder",
        f"data.root={root}",
        "data.decoder=pil",
        "data.augment=false",
        "data.val_split=0",
        "data.image_size=32",
        "data.batch_size=4",
    )
    from trainer.data.gpu_transforms import model_input

    assert x.dtype == ref.dtype == torch.uint8  # normalized after the loader (data.gpu_normalize's default)
    # JPEG decoders differ by a few levels
    assert x.shape == ref.shape and torch.allclose(model_input(x), model_input(ref), atol=0.15)
    import importlib.util

    expected = decoder if (decoder != "turbo" or importlib.util.find_spec("simplejpeg")) else "torchvision"
    assert dm.decoder == expected


def test_nvjpeg_without_cuda_falls_back_with_a_message(compose, tmp_path, caplog):
    from trainer.data.decoders import resolve_decoder

    root = _jpeg_folder(tmp_path / "imgs")
    dm, _ = _first_batch(
        compose,
        "data=imagefolder",
        f"data.root={root}",
        "data.decoder=nvjpeg",
        "data.image_size=16",
        "data.batch_size=2",
    )
    assert dm.decoder == "torchvision" and "needs a CUDA GPU" in caplog.text
    assert resolve_decoder("nvjpeg", "cuda") == "nvjpeg"


@pytest.fixture
def device_decode_here(monkeypatch):
    """Run the data.decoder=nvjpeg path on this machine: the same code, with torchvision's CPU decoder."""
    from trainer.data import decoders

    real = decoders.resolve_decoder
    monkeypatch.setattr(
        decoders, "resolve_decoder", lambda name, accelerator: "nvjpeg" if name == "nvjpeg" else real(name, accelerator)
    )


@pytest.mark.parametrize("library", ["torchvision", "nvimgcodec"])
def test_device_decode_ships_file_bytes_and_decodes_whole_batches(
    compose, tmp_path, device_decode_here, monkeypatch, library
):
    """data.decoder=nvjpeg: the workers ship bytes, and the batch's JPEGs are decoded in one call of
    the library data.nvjpeg_library names (its CPU decoder standing in for nvJPEG), to the pixels of
    decoding in the workers; a file that will not decode is skipped, the others kept."""
    from torchvision import io as tvio

    from trainer.data import nvimgcodec_decode
    from trainer.data.device_decode import BytesLoader, DeviceDecoder, EncodedBatch, encoded_collate

    root = _jpeg_folder(tmp_path / "imgs")
    Image.new("RGB", (40, 40), (10, 200, 30)).save(root / "a" / "extra.png")  # not a JPEG: decoded in the worker
    args = (
        "data=imagefolder",
        f"data.root={root}",
        "data.augment=false",
        "data.val_split=0",
        "data.image_size=32",
        "data.batch_size=19",
        "data.drop_last=false",
    )
    dm, batch = _first_batch(compose, *args, "data.decoder=nvjpeg", f"data.nvjpeg_library={library}")
    assert dm.decoder == "nvjpeg" and isinstance(batch, EncodedBatch)
    assert len(batch.jpeg_at) == 18 and len(batch.decoded) == 1  # bytes, not pixels (the PNG decoded in the worker)
    assert batch.data.ndim == 1 and batch.data.numel() == sum(f.numel() for f in batch.files())
    calls = {"torchvision": [], "nvimgcodec": []}
    real_decode, real_codec = tvio.decode_jpeg, nvimgcodec_decode.BatchDecoder.__call__
    monkeypatch.setattr(
        tvio,
        "decode_jpeg",
        lambda data, **kw: (
            calls["torchvision"].append(len(data) if isinstance(data, list) else 1) or real_decode(data, **kw)
        ),
    )
    monkeypatch.setattr(
        nvimgcodec_decode.BatchDecoder,
        "__call__",
        lambda self, files, *a: calls["nvimgcodec"].append(len(files)) or real_codec(self, files, *a),
    )
    x, y = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert calls[library] == [18] and sum(map(len, calls.values())) == 1  # one batched call, by that library
    assert x.dtype == torch.uint8 and x.shape == (19, 3, 32, 32) and y.tolist() == batch.labels.tolist()
    # the same pixels as decoding in the workers (same decoder, same transforms, on a tensor)
    ref_dm, (ref, ref_y) = _first_batch(compose, *args, "data.decoder=torchvision", "data.gpu_normalize=true")
    assert ref_y.tolist() == y.tolist() and (x.int() - ref.int()).abs().max() <= 1
    # a JPEG that will not decode: skipped, the batch's others kept
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8" + bytes(64))
    good = sorted((root / "a").glob("*.jpg"))[:2]
    mixed = encoded_collate([(BytesLoader()(str(p)), k) for k, p in enumerate([good[0], bad, good[1]])], train=False)
    x, y = DeviceDecoder(32, False, False, library=library)(mixed, torch.device("cpu"))
    assert x.shape == (2, 3, 32, 32) and y.tolist() == [0, 2]


def test_nvimgcodec_decodes_into_the_last_batchs_images_only_on_their_stream_and_names_a_failed_decode(tmp_path):
    """BatchDecoder's bookkeeping, nvImageCodec's decoder stood in for by a recorder (its GPU part
    needs a GPU: tests/gpu/test_cuda.py): the last batch's images are decoded into again only on the
    stream they were decoded on (elsewhere nvImageCodec would wait on the host for that stream) and
    for as many files; a file that came back without an image is decoded once more, anew, and nothing
    is reused after it. A file nvImageCodec cannot decode but the CPU can stops the run, named."""
    from trainer.data.nvimgcodec_decode import BatchDecoder
    from trainer.errors import TrainingStopped

    class Recorder:
        def __init__(self, failing=()):
            self.calls, self.failing = [], set(failing)

        def decode(self, streams, images=None, params=None, cuda_stream=0):
            self.calls.append((len(streams), images is not None, cuda_stream))
            out = [None if s in self.failing else f"image of {s}" for s in streams]
            self.failing.clear()  # a failure of the moment (an allocation): the next try succeeds
            return out

    codec, recorder = BatchDecoder(), Recorder()
    for files, stream in [("abc", 7), ("abc", 7), ("abc", 9), ("ab", 9)]:
        assert codec._decode_on(recorder, None, list(files), stream) == [f"image of {f}" for f in files]
    recorder.failing = {"b"}
    assert codec._decode_on(recorder, None, list("abc"), 9) == ["image of a", "image of b", "image of c"]
    codec._decode_on(recorder, None, list("abc"), 9)
    # (files, into the last batch's images, stream): reused on the same stream and length only
    assert recorder.calls == [(3, False, 7), (3, True, 7), (3, False, 9), (2, False, 9), (3, False, 9), (1, False, 9), (3, False, 9)]  # fmt: skip

    root = _jpeg_folder(tmp_path / "imgs")
    good = torch.frombuffer(bytearray(next((root / "a").glob("*.jpg")).read_bytes()), dtype=torch.uint8)
    codec._decoders[("cpu", None)] = Recorder()
    codec._decoders[("cpu", None)].decode = lambda streams, **kw: [None] * len(streams)  # fails a decodable file
    with pytest.raises(
        TrainingStopped, match=r"nvImageCodec could not decode good\.jpg on cpu, though the file decodes"
    ):
        codec([good], torch.device("cpu"), ["good.jpg"])


def test_nvimgcodec_host_threads_are_half_the_cores_this_run_may_use(monkeypatch):
    from trainer.data.nvimgcodec_decode import host_threads

    for cores, threads in ((1, 1), (6, 3), (64, 8)):  # its mask, quota or Slurm allocation; not the machine's
        monkeypatch.setattr("trainer.measure.hardware.usable_cores", lambda cores=cores: cores)
        assert host_threads() == threads, cores


def test_nvimgcodec_not_installed_stops_the_run_before_it_starts_saying_how_to_install_it(monkeypatch):
    import sys

    from trainer.data import nvimgcodec_decode
    from trainer.data.device_decode import DeviceDecoder
    from trainer.errors import ConfigError

    monkeypatch.setattr(nvimgcodec_decode, "_MODULE", None)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails as where it is not installed
    if "nvidia" in sys.modules:  # an earlier import left the submodule on its package
        monkeypatch.delattr(sys.modules["nvidia"], "nvimgcodec", raising=False)
    with pytest.raises(
        ConfigError, match=r"needs NVIDIA's nvImageCodec.*pip install 'nvidia-nvimgcodec-cu1\d\[nvjpeg\]'"
    ):
        DeviceDecoder(32, True, True, library="nvimgcodec")
    DeviceDecoder(32, True, True, library="torchvision")  # the default needs nothing more


def _tensors_of(batch) -> int:
    """How many tensors an EncodedBatch holds: what a loader worker hands to the main process."""
    found = 0
    for name in type(batch).__slots__:
        value = getattr(batch, name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            parts = item if isinstance(item, tuple) else (item,)
            found += sum(isinstance(p, torch.Tensor) for p in parts)
    return found


class _ComputeOps(TorchDispatchMode):
    """Counts the operations that make new data (views and the image decoder's own ops left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        returns = func._schema.returns
        if not name.startswith("image.") and not (returns and returns[0].alias_info is not None):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_device_decode_hands_over_one_buffer_and_crops_the_batch_at_once(compose, tmp_path, device_decode_here, train):
    """data.decoder=nvjpeg: a worker hands over one byte buffer per batch (three tensors: bytes,
    offsets, labels), not one tensor per image; the crop, resize and flip are batched: the decoder
    runs as many operations for 24 images as for 6 (counted, not timed; torchvision's CPU decoder
    stands in for nvJPEG)."""
    root = _jpeg_folder(tmp_path / "imgs", per_class=8)
    counts, crossing = {}, {}
    for n in (6, 24):
        args = (
            "data=imagefolder",
            f"data.root={root}",
            "data.val_split=0",
            "data.image_size=16",
            f"data.batch_size={n}",
        )
        cfg = compose(*args, "data.decoder=nvjpeg", "data.num_workers=1")
        dm = ImageDataModule(cfg.data, cfg.seed)
        dm.build()
        batch = next(iter(dm.train_dataloader()))  # through a real worker process
        assert len(batch) == n
        crossing[n] = _tensors_of(batch)
        decoder = dm.loaders.decoders[train]
        torch.manual_seed(1)  # some image of each batch is flipped (a batch with none skips the flip's operations)
        with _ComputeOps() as counted:
            x, y = decoder(batch, torch.device("cpu"))
        assert x.shape == (n, 3, 16, 16) and x.dtype == torch.uint8 and y.tolist() == batch.labels.tolist()
        counts[n] = counted.ops
    assert crossing == {6: 3, 24: 3}
    assert counts[6] and len(counts[24]) == len(counts[6]), (counts[6], counts[24])


def test_batched_crops_call_the_native_roi_align(monkeypatch):
    """torchvision.ops.roi_align switches to a Python version on CUDA under deterministic algorithms
    (trainer.deterministic), which samples the whole image per output pixel: the batch's crop calls
    the native op itself, so that wrapper is never in the way."""
    import torchvision.ops

    from trainer.data.batched_crops import resized_crops

    def refused(*args, **kwargs):
        raise AssertionError("torchvision.ops.roi_align called")

    monkeypatch.setattr(torchvision.ops, "roi_align", refused)
    monkeypatch.setattr("torchvision.ops.roi_align", refused)
    images = [torch.randint(0, 256, (3, 20, 30), dtype=torch.uint8) for _ in range(3)]
    with _ComputeOps() as counted:
        out = resized_crops(
            images, torch.tensor([[0.0, 0.0, 20.0, 30.0]] * 3, dtype=torch.float64), torch.zeros(3, dtype=torch.bool), 8
        )
    assert out.shape == (3, 3, 8, 8) and "torchvision.roi_align.default" in counted.ops


def test_batched_crops_work_with_their_module_imported_alone():
    """The native op exists once torchvision is imported: the module imports it itself, whoever calls it."""
    code = (
        "import torch\n"
        "from trainer.data.batched_crops import resized_crops\n"
        "images = [torch.zeros(3, 20, 30, dtype=torch.uint8)]\n"
        "boxes = torch.tensor([[0.0, 0.0, 20.0, 30.0]], dtype=torch.float64)\n"
        "print(tuple(resized_crops(images, boxes, torch.zeros(1, dtype=torch.bool), 8).shape))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "(1, 3, 8, 8)", r.stderr[-2000:]


def test_batched_crops_match_torchvisions_per_image_transforms():
    """The batched resample of a crop box is torchvision's resized crop: the same pixels up to rounding
    where the crop is upscaled or kept, and close where it is shrunk (a box filter where torchvision
    uses a triangle one); flips mirror; images of several sizes come back in the batch's order."""
    from torchvision.transforms.v2 import functional as F

    from trainer.data.batched_crops import center_boxes, random_resized_boxes, resized_crops

    g = torch.Generator().manual_seed(0)
    smooth = [
        torch.nn.functional.interpolate(
            torch.rand(1, 3, 6, 8, generator=g) * 255, size=size, mode="bilinear", align_corners=False
        )[0]
        .round()
        .to(torch.uint8)
        for size in [(60, 80), (80, 60), (60, 80), (50, 50)]
    ]
    boxes = torch.tensor(
        [[5.0, 7.0, 40.0, 50.0], [0.0, 0.0, 80.0, 60.0], [10.0, 20.0, 30.0, 30.0], [0.0, 0.0, 50.0, 50.0]]
    )
    flips = torch.tensor([False, True, False, True])
    out = resized_crops(smooth, boxes.double(), flips, 32)
    assert out.shape == (4, 3, 32, 32) and out.dtype == torch.uint8
    for image, box, flip, got in zip(smooth, boxes.tolist(), flips.tolist(), out):
        top, left, h, w = (int(v) for v in box)
        ref = F.resized_crop(image, top, left, h, w, [32, 32], antialias=True)
        ref = F.horizontal_flip(ref) if flip else ref
        assert (got.int() - ref.int()).abs().float().mean() < 1.5, (box, (got.int() - ref.int()).abs().max())
    torch.manual_seed(3)
    drawn = random_resized_boxes([(60, 80)] * 500, (0.35, 1.0), (3 / 4, 4 / 3))
    top, left, h, w = drawn.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 60).all() and (left + w <= 80).all()
    area = h * w / (60 * 80)
    assert 0.34 <= area.min() and area.max() <= 1.0 and area.std() > 0.1  # spread over the scale range
    assert center_boxes([(60, 80)], 36, 32).tolist() == [[60 / 36 * 2, 80 / 48 * 8, 32 * 60 / 36, 32 * 80 / 48]]


def test_device_decode_skips_or_stops_on_a_corrupt_file(compose, tmp_path, device_decode_here):
    from trainer.errors import TrainingStopped

    root = _jpeg_folder(tmp_path / "imgs")
    (root / "b" / "3.jpg").write_bytes(b"\xff\xd8" + b"garbage" * 20)
    args = (
        "data=imagefolder",
        f"data.root={root}",
        "data.val_split=0",
        "data.image_size=16",
        "data.batch_size=18",
        "data.decoder=nvjpeg",
    )
    dm, batch = _first_batch(compose, *args)
    x, y = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert x.shape[0] == y.shape[0] == 17  # the bad file is dropped; BadSampleCounter counts the short batch
    dm, batch = _first_batch(compose, *args, "data.on_bad_sample=stop")
    with pytest.raises(TrainingStopped, match="3.jpg"):
        dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)


def test_device_prefetch_on_cpu_is_a_no_op_with_a_warning(compose, train, caplog):
    from trainer.data.prefetch import DevicePrefetchLoader

    m, _ = train("data.device_prefetch=true")
    assert m["status"] == "ok" and m["flags"]["data.device_prefetch"] is True
    assert "data.device_prefetch=true needs a CUDA GPU" in caplog.text
    cfg = compose("data.device_prefetch=true")
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert not isinstance(dm.train_dataloader(), DevicePrefetchLoader)


class _TransferLog:
    def __init__(self, transfer):
        self.transfer, self.calls, self.at_step = transfer, 0, []

    def __call__(self, batch, device):
        self.calls += 1
        return self.transfer(batch, device)


def test_device_prefetcher_copies_ahead_and_trains_the_same(train, monkeypatch, tmp_path, add_callbacks):
    """The prefetching loader, run stream-less on CPU inside a real fit: same batches, same result,
    each copy made before the step that needs it. The sanity check is slowed down: Lightning runs it
    in ``isolate_rng()`` after it made the training iterator, and a producer started then would draw
    crops the restore undoes (a run that was not reproducible, depending on timing)."""
    import pytorch_lightning as pl

    from trainer.data.loaders.torch_workers import TorchLoaders
    from trainer.data.prefetch import DevicePrefetchLoader

    args = (
        "data=builtin",
        "data.images_per_class=8",
        "data.stored_size=40",
        "data.batch_size=8",
        "trainer.max_epochs=2",
    )
    plain, _ = train(*args)
    logs = []

    def prefetch_device(self):
        return torch.device("cpu")

    real_loader = TorchLoaders.train

    def logged_loader(self, dataset):
        loader = real_loader(self, dataset)
        assert isinstance(loader, DevicePrefetchLoader)
        logs.append(_TransferLog(loader.transfer))
        loader.transfer = logs[-1]
        return loader

    class StepWatch(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            time.sleep(0.05)  # a step long enough for the producer thread to prepare the next batch meanwhile
            logs[0].at_step.append((batch_idx, logs[0].calls))

    real_sanity_check = pl.Trainer._run_sanity_check

    def slow_sanity_check(self):
        time.sleep(0.3)  # inside isolate_rng(): time for a thread started too early to draw
        return real_sanity_check(self)

    monkeypatch.setattr(TorchLoaders, "prefetch_device", prefetch_device)
    monkeypatch.setattr(TorchLoaders, "train", logged_loader)
    monkeypatch.setattr(pl.Trainer, "_run_sanity_check", slow_sanity_check)
    add_callbacks(StepWatch())
    prefetched, _ = train(*args, "data.device_prefetch=true")
    assert prefetched["status"] == "ok"
    import threading

    assert not any(t.name == "trainer-device-prefetch" for t in threading.enumerate())  # none outlives the fit
    assert prefetched["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-6)  # same batches, same order
    assert prefetched["val_acc"] == plain["val_acc"]
    steps = len(logs[0].at_step) // 2
    assert steps >= 4
    for idx, copied in logs[0].at_step[:steps]:
        # batch idx+1 was copied while step idx ran; at most the queue's depth (2) beyond it
        assert min(idx + 2, steps) <= copied <= min(idx + 4, steps), logs[0].at_step


class _SleepyItems(torch.utils.data.Dataset):
    def __init__(self, n: int, sleep_s: float):
        self.n, self.sleep_s = n, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return torch.full((2,), float(i))


@pytest.mark.parametrize(
    "loader_s, transfer_s, step_s, expect",
    [
        (0.0, 0.04, 0.0, "transfer"),  # the step loop waits while its batch is being copied or decoded
        (0.04, 0.0, 0.0, "data wait"),  # ...while the loader fetches it
        (0.01, 0.01, 0.06, "neither"),  # the producer keeps ahead of slower steps: nothing to wait for
    ],
)
def test_the_prefetch_wait_is_attributed_by_what_the_producer_was_doing(loader_s, transfer_s, step_s, expect):
    from trainer.callbacks.step_clock import StepClock
    from trainer.data.prefetch import DevicePrefetchLoader, PrefetchWaits

    def transfer(batch, device):
        time.sleep(transfer_s)
        return batch

    clock, waits = StepClock(), PrefetchWaits()
    clock.reads(waits)  # the loader records its waits, the clock reads them
    clock.active = True
    loader = DevicePrefetchLoader(
        _SleepyItems(12, loader_s), batch_size=1, device=torch.device("cpu"), transfer=transfer, waits=waits
    )
    batches, fetch = iter(loader), 0.0
    for i in range(12):
        t0 = time.perf_counter()
        assert next(batches)[0, 0].item() == i  # in order
        fetch += time.perf_counter() - t0  # what Lightning's fetch action times
        time.sleep(step_s)
    clock.fetch_s = fetch
    waited_transfer, waited_data = clock.transfer_s(), clock.data_wait_s()
    if expect == "transfer":
        assert waited_transfer >= 0.6 * 12 * transfer_s and waited_data < 0.3 * waited_transfer, (
            waited_transfer,
            waited_data,
        )
    elif expect == "data wait":
        assert waited_data >= 0.6 * 12 * loader_s and waited_transfer < 0.3 * waited_data, (
            waited_transfer,
            waited_data,
        )
    else:
        assert waited_transfer + waited_data < 0.2 * 12 * (loader_s + transfer_s), (waited_transfer, waited_data)


class _DeviceTime:
    """A CUDA timing event as StepClock reads it: a moment on the device's clock (seconds here)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def elapsed_time(self, other: "_DeviceTime") -> float:
        return (other.t - self.t) * 1000.0  # milliseconds, as CUDA events answer


def test_prefetch_transfer_on_cuda_is_what_the_device_waited_not_what_the_host_waited():
    """One definition for the prefetch row and the plain row: the time the device's steps waited for
    their batch, on the device's clock. The host waited 10 ms for a batch, 6 of them while the thread
    copied it: with the GPU idle 4 ms of that wait and then stalled 2 ms on the copy, transfer is
    60% of the idle time plus the stall; with the GPU busy throughout (no idle, no stall) it is
    nothing, whatever the host waited. Data wait stays the host's wait on the loader (4 ms)."""
    from trainer.callbacks.step_clock import StepClock
    from trainer.data.prefetch import PrefetchWaits

    clock, waits = StepClock(), PrefetchWaits()
    clock.reads(waits)
    clock.active, clock.cuda_device = True, torch.device("cuda", 0)  # read only as "steps run on CUDA"
    share = waits.add_host_wait((0.0, 0.010), (0.004, 0.012))
    assert share == pytest.approx(0.6)
    waits.add_device_wait((_DeviceTime(0.0), _DeviceTime(0.004)), share, (_DeviceTime(0.004), _DeviceTime(0.006)))
    clock.fetch_s = 0.010
    assert clock.transfer_s() == pytest.approx(0.6 * 0.004 + 0.002)
    assert clock.data_wait_s() == pytest.approx(0.004)

    busy, busy_waits = StepClock(), PrefetchWaits()
    busy.reads(busy_waits)
    busy.active, busy.cuda_device = True, torch.device("cuda", 0)
    share = busy_waits.add_host_wait((0.0, 0.010), (0.0, 0.010))
    busy_waits.add_device_wait((_DeviceTime(1.0), _DeviceTime(1.0)), share, (_DeviceTime(1.0), _DeviceTime(1.0)))
    assert busy.transfer_s() == 0.0  # the host's 10 ms cost the device nothing

    clock.active = False  # validation: the loader's waits are not recorded
    waits.add_host_wait((0.0, 0.010), (0.0, 0.010))
    assert waits.copy_wait_s == pytest.approx(0.006)
    clock.reset()  # a new epoch: the waits start again
    assert waits.copy_wait_s == 0.0 and waits.device_waits == []


def test_a_prefetch_thread_lets_go_of_the_loader_between_epochs_and_passes_errors_on():
    from trainer.data.prefetch import DevicePrefetchLoader

    loader = DevicePrefetchLoader(
        _SleepyItems(8, 0.0), batch_size=2, device=torch.device("cpu"), num_workers=1, persistent_workers=True
    )
    for _ in range(3):  # cut short, then full: the persistent workers' one iterator is reset under a finished thread
        first = iter(loader)
        assert next(first)[0, 0].item() == 0
        assert [b[0, 0].item() for b in loader] == [0, 2, 4, 6]

    import threading

    from trainer.data.prefetch import close_all

    cut = iter(DevicePrefetchLoader(_SleepyItems(64, 0.0), batch_size=2, device=torch.device("cpu")))
    next(cut)  # a loop cut short (limit_train_batches) leaves a producer behind, waiting to hand out more
    assert any(t.name == "trainer-device-prefetch" for t in threading.enumerate())
    close_all()  # the datamodule's teardown
    assert not any(t.name == "trainer-device-prefetch" for t in threading.enumerate())

    def broken(batch, device):
        raise RuntimeError("decode failed on purpose")

    with pytest.raises(RuntimeError, match="on purpose"):
        list(DevicePrefetchLoader(_SleepyItems(4, 0.0), batch_size=2, transfer=broken))


def test_device_prefetch_loader_survives_lightnings_distributed_sampler():
    """Under DDP Lightning re-creates the loader with a DistributedSampler: it must stay a prefetcher."""
    from pytorch_lightning.trainer.states import RunningStage
    from pytorch_lightning.utilities.data import _update_dataloader
    from torch.utils.data.distributed import DistributedSampler

    from trainer.data.prefetch import DevicePrefetchLoader

    def transfer(batch, device):
        return batch

    data = list(range(10))
    loader = DevicePrefetchLoader(data, batch_size=2, device=torch.device("cpu"), transfer=transfer)
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
    new = _update_dataloader(loader, sampler, mode=RunningStage.TRAINING)
    assert isinstance(new, DevicePrefetchLoader) and new.transfer is transfer and new.sampler is sampler
    assert [b.tolist() for b in new] == [[1, 3], [5, 7], [9]]


def test_train_with_device_decode_and_prefetch(train, monkeypatch, device_decode_here):
    from trainer.data.loaders.torch_workers import TorchLoaders

    monkeypatch.setattr(TorchLoaders, "prefetch_device", lambda self: torch.device("cpu"))
    m, _ = train(
        "data=builtin",
        "data.images_per_class=8",
        "data.stored_size=40",
        "data.batch_size=8",
        "data.decoder=nvjpeg",
        "data.device_prefetch=true",
        "data.num_workers=1",
    )
    assert m["status"] == "ok" and m["decoder"] == "nvjpeg" and m["val_acc"] is not None


def test_cache_in_memory_reads_each_file_once(compose, tmp_path, monkeypatch):
    import builtins

    root = _jpeg_folder(tmp_path / "imgs")
    cfg = compose(
        "data=imagefolder",
        f"data.root={root}",
        "data.cache_in_memory=true",
        "data.val_split=0",
        "data.image_size=16",
        "data.batch_size=6",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    opened = []
    real_open = builtins.open

    def counting_open(path, *a, **k):
        if str(path).endswith(".jpg"):
            opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", counting_open)
    for _ in range(2):  # two epochs, main-process loading
        for _batch in dm.train_dataloader():
            pass
    assert len(opened) == 18 and len(set(opened)) == 18  # 18 files, each opened once over two epochs


def test_auto_workers_follow_the_cores(compose, caplog):
    import logging
    import os

    caplog.set_level(logging.INFO)
    cores = len(os.sched_getaffinity(0))
    cfg = compose("data.auto_workers=true")
    assert ImageDataModule(cfg.data, cfg.seed).num_workers == max(0, min(16, cores - 1))
    assert ImageDataModule(cfg.data, cfg.seed, processes_per_node=cores).num_workers == 0
    assert "data.auto_workers" in caplog.text


def test_pack_and_train_from_packed(tmp_path, train):
    src = _jpeg_folder(tmp_path / "imgs", per_class=10)
    dst = tmp_path / "packed"
    r = subprocess.run(
        [sys.executable, "-m", "trainer.pack", str(src), str(dst), "--size", "24"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert {p.name for p in dst.iterdir()} == {"images.npy", "labels.npy", "meta.json"}
    r = subprocess.run([sys.executable, "-m", "trainer.pack", str(src), str(dst)], capture_output=True, text=True)
    assert r.returncode != 0 and "already holds a packed dataset" in (r.stderr + r.stdout)
    m, _ = train("data=packed", f"data.root={dst}", "data.image_size=16", "data.batch_size=4", "data.val_split=0.2")
    assert m["status"] == "ok" and m["epochs"][0]["samples"] == 24


def test_packed_shards_exactly_across_ranks_and_workers(tmp_path):
    """Every sample once per epoch across 2 ranks x 2 workers, with the product's own sampler as
    Lightning wraps it under DDP (DistributedSamplerWrapper around EpochShuffleSampler)."""
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import DataLoader

    from trainer.data.pack import pack
    from trainer.data.packed import PackedImages
    from trainer.data.sampler import EpochShuffleSampler

    src = _jpeg_folder(tmp_path / "imgs", per_class=8)
    pack(str(src), str(tmp_path / "p"), 16)

    class Indexed(PackedImages):
        def __getitem__(self, i):
            return i

    dataset = Indexed(str(tmp_path / "p"), 16, True, True, True)
    orders = []
    for epoch in (1, 2):
        seen, per_rank = [], []
        for rank in range(2):
            sampler = DistributedSamplerWrapper(
                EpochShuffleSampler(len(dataset), seed=3), num_replicas=2, rank=rank, shuffle=False, drop_last=False
            )
            sampler.set_epoch(epoch)
            got = [int(i) for batch in DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2) for i in batch]
            per_rank.append(got)
            seen += got
        # padding may repeat a sample to even out the ranks, never more than one per rank
        assert set(seen) == set(range(len(dataset))) and len(seen) - len(dataset) < 2
        orders.append(per_rank[0])
    assert orders[0] != orders[1]  # reshuffled per epoch through the wrapper


def test_data_only_benchmark_runs(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parent.parent / "scripts" / "bench_data.py"),
            "--config",
            "data.image_size=16 data.num_samples=64 data.batch_size=8",
            "--batches",
            "3",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    (result,) = json.loads(out.read_text())
    assert result["images_per_s"] > 0 and "images/s" in r.stdout


def _copy_in_child(args):
    from trainer.data import cache

    return cache.cached_copy(*args)


def test_data_cache_copies_once_checksummed_resumable_and_locked(tmp_path, monkeypatch, compose):
    import multiprocessing as mp

    from trainer.data import cache

    src = _jpeg_folder(tmp_path / "remote", per_class=4)
    calls = tmp_path / "copy_calls"
    original = cache._copy

    def recording_copy(s, d):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        return original(s, d)

    import os

    monkeypatch.setattr(cache, "_copy", recording_copy)
    with mp.get_context("fork").Pool(2) as pool:  # two "ranks" at once: one copies, the other waits
        paths = pool.map(_copy_in_child, [(str(src), str(tmp_path / "local"))] * 2)
    assert paths[0] == paths[1] and len(calls.read_text().split()) == 1
    local = Path(paths[0])
    assert sorted(p.name for p in (local / "a").iterdir()) == sorted(p.name for p in (src / "a").iterdir())
    manifest = __import__("json").loads((local / "MANIFEST.json").read_text())
    assert len(manifest) == 12 and all(len(v["sha256"]) == 64 for v in manifest.values())

    # an interrupted copy resumes: drop the DONE marker and one file, corrupt another
    (local / "DONE").unlink()
    (local / "b" / "0.jpg").unlink()
    (local / "c" / "1.jpg").write_bytes(b"torn")
    before = (local / "a" / "0.jpg").stat().st_mtime_ns
    cache.cached_copy(str(src), str(tmp_path / "local"))
    assert (local / "b" / "0.jpg").read_bytes() == (src / "b" / "0.jpg").read_bytes()
    assert (local / "c" / "1.jpg").read_bytes() == (src / "c" / "1.jpg").read_bytes()
    assert (local / "a" / "0.jpg").stat().st_mtime_ns == before  # good files are not copied again

    cfg = compose(
        "data=imagefolder",
        f"data.root={src}",
        f"data.cache={tmp_path / 'local'}",
        "data.image_size=16",
        "data.batch_size=2",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    assert str(dm.train_set.dataset.root).startswith(str(local))


def test_a_rank_waits_for_a_copy_another_rank_is_making_instead_of_calling_it_foreign(tmp_path):
    """Rank 1 arrives while rank 0 holds the lock and has made the folder but not yet its marker:
    rank 1 waits, then uses the finished copy (it used to refuse the folder as the user's files)."""
    import fcntl
    import hashlib
    import multiprocessing as mp

    from trainer.data import cache

    src = _jpeg_folder(tmp_path / "remote", per_class=2)
    name = f"remote-{hashlib.sha1(str(src.resolve()).encode()).hexdigest()[:8]}"
    local = tmp_path / "local"
    dst = local / name
    local.mkdir()
    with open(local / f".{name}.lock", "a") as lock:  # "rank 0", mid-copy
        fcntl.flock(lock, fcntl.LOCK_EX)
        (dst / "a").mkdir(parents=True)
        (dst / "a" / ".0.jpg.part").write_bytes(b"half")
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            waiting = pool.apply_async(_copy_in_child, ((str(src), str(local)),))
            time.sleep(1.0)
            assert not waiting.ready()  # blocked on the lock, not refused
            (dst / cache.MARKER).touch()
            (dst / "a" / ".0.jpg.part").unlink()
            cache._copy(cache._LocalSource(src.resolve()), dst)
            (dst / "DONE").write_text("{}")
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert waiting.get(timeout=60) == str(dst)


@pytest.mark.parametrize("name", ["jemalloc", "tcmalloc"])
def test_allocator_is_preloaded_and_recorded(tmp_path, name):
    from conftest import read_metrics, run_cli

    from trainer.launch.processes import find_allocator

    if find_allocator(name) is None:
        pytest.skip(f"{name} is not installed (Debian: libjemalloc2 / libtcmalloc-minimal4; .ci/run installs them)")
    run_dir = tmp_path / name
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        f"runtime.allocator={name}",
        "trainer.max_epochs=1",
        "data.num_samples=64",
        "checkpoint.enabled=false",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    m = read_metrics(run_dir)
    assert m["flags"]["runtime.allocator"] == name and m["allocator"] == name  # really mapped into the process


def test_missing_allocator_is_a_clear_error(compose, monkeypatch):
    from trainer.errors import ConfigError
    from trainer.launch import processes

    monkeypatch.setattr(processes, "find_allocator", lambda name: None)
    with pytest.raises(ConfigError, match="apt-get install libjemalloc2"):
        processes.allocator_env(compose("runtime.allocator=jemalloc"))
    assert processes.allocator_env(compose()) == {}


def test_synthetic_batches_are_gathered_where_the_model_trains_by_default(compose, train, monkeypatch):
    """data=synthetic's default (data.device_resident=true): one uint8 gather per batch on the model's
    device, no workers, no per-sample collate; the same samples as the host loader's, once normalized."""
    from trainer.data.synthetic import DeviceResidentImages

    args = ("data.image_size=16", "data.batch_size=8", "data.num_samples=32", "data.num_workers=2")
    cfg = compose(*args)
    assert cfg.data.device_resident is True
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    loader = dm.train_dataloader()
    assert isinstance(loader.dataset, DeviceResidentImages) and loader.num_workers == 0
    calls = []
    real = DeviceResidentImages.__getitems__
    monkeypatch.setattr(
        DeviceResidentImages, "__getitems__", lambda self, idx: calls.append(len(idx)) or real(self, idx)
    )
    batches = list(loader)
    assert calls == [8, 8, 8, 8]  # one gather per batch, no per-sample collate
    assert all(x.dtype == torch.uint8 for x, _ in batches)  # a quarter of float32's bytes; normalized on the device
    ref = ImageDataModule(compose(*args, "data.device_resident=false").data, cfg.seed)
    ref.build()
    assert not isinstance(ref.train_dataloader().dataset, DeviceResidentImages)
    for (x, y), (rx, ry) in zip(batches, ref.train_dataloader()):  # the same samples, in the same order
        assert torch.equal(y, ry) and torch.equal(x, rx)
    monkeypatch.undo()
    m, _ = train()
    assert m["status"] == "ok" and m["flags"]["data.device_resident"] is True


class _StepBatches(pl.Callback):
    """The dtype of each training batch as ``training_step`` receives it."""

    def __init__(self) -> None:
        self.dtypes = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.dtypes.append(batch[0].dtype)


@pytest.mark.parametrize(
    "extra, in_network",
    [([], True), (["channels_last=true"], True), (["data.mixup_alpha=0.2"], False)],
    ids=["default", "channels_last", "mixup"],
)
def test_the_built_in_classifier_normalizes_uint8_batches_inside_its_network(
    train, add_callbacks, clear_spies, extra, in_network
):
    """The built-in classifier's network converts the uint8 batch itself (ModelInput, at the start of
    its forward: inside the compiled graph with compile=true): the step gets uint8, the network's layers float32
    (NHWC with channels_last). Mixup blends float images, so there the datamodule normalizes first."""
    import spies

    seen = _StepBatches()
    add_callbacks(seen)
    m, _ = train("model._target_=spies.ProbeNet", "~model.width", "trainer.max_epochs=1", *extra)
    assert m["status"] == "ok" and seen.dtypes
    assert set(seen.dtypes) == {torch.uint8 if in_network else torch.float32}
    snaps = spies.training_snapshots()
    assert snaps and all(s["input_dtype"] == torch.float32 for s in snaps)
    assert all(s["input_channels_last"] for s in snaps) == ("channels_last=true" in extra)


def test_the_input_conversion_is_inside_the_compiled_graph(compose):
    """With compile=true the normalization and the NHWC layout are traced into the network's one
    graph (``nn.Module.compile``, as ``apply_compile`` calls it; a forward pre-hook became a graph of
    its own): the graph takes the uint8 batch, normalizes it and runs the layers; the next call runs
    the same graph (a cache of constants dynamo guarded on recompiled it once)."""
    from torch import nn

    from trainer.switches.model_transforms import apply_model_input

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.relu(self.conv(x))

    holder = nn.Module()
    holder.net = Net()
    apply_model_input(holder, compose("channels_last=true"), normalize=True)
    reference = copy.deepcopy(holder.net)
    torch._dynamo.reset()
    holder.net.compile(backend=capture)
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    assert torch.allclose(holder.net(x), reference(x), atol=1e-5)
    assert torch.allclose(holder.net(x + 1), reference(x + 1), atol=1e-5)  # the second step: the same graph
    assert len(graphs) == 1
    nodes = list(graphs[0].graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    assert any(n.meta["example_value"].dtype == torch.uint8 for n in inputs)
    assert any("addcmul" in str(n.target) for n in nodes) and any("conv" in str(n.target) for n in nodes)
    torch._dynamo.reset()


def test_a_copy_of_a_network_converts_its_input_with_its_own_weights(compose):
    """EMA's averaged model is a deep copy: its forward (bound to the copy) runs the copy's weights;
    a pickled network (torch.save of the module, a spawned process) comes back converting its input."""
    from torch import nn

    from trainer.switches.model_transforms import apply_model_input

    holder = nn.Module()
    holder.net = nn.Conv2d(3, 2, 1)
    apply_model_input(holder, compose(), normalize=True)
    twin = copy.deepcopy(holder.net)
    with torch.no_grad():
        twin.weight.zero_()
        twin.bias.fill_(1.0)
    x = torch.randint(0, 256, (1, 3, 4, 4), dtype=torch.uint8)
    assert torch.equal(twin(x), torch.ones(1, 2, 4, 4)) and not torch.equal(holder.net(x), twin(x))
    import pickle

    thawed = pickle.loads(pickle.dumps(twin))
    assert torch.equal(thawed(x), torch.ones(1, 2, 4, 4)) and thawed.weight is not twin.weight


def test_device_resident_needs_synthetic_data(compose, tmp_path):
    from trainer.errors import ConfigError

    cfg = compose("data=imagefolder", f"data.root={_jpeg_folder(tmp_path / 'imgs')}", "data.device_resident=true")
    with pytest.raises(ConfigError, match="data.device_resident"):
        ImageDataModule(cfg.data, cfg.seed).build()


def test_a_step_limit_builds_only_the_batches_it_trains_even_with_persistent_workers(tmp_path):
    """trainer.limit_train_batches / limit_val_batches with persistent loader workers: Lightning stops
    taking batches at the limit, and torch's loader drains whatever its workers queued past it when the
    next epoch starts (built, then thrown away: it made the tuner's short probe epochs with workers look
    slower than they are). The loader now builds exactly the batches the epoch uses, and they are the
    same samples as before: the first of each epoch's order."""
    from conftest import run_cli

    from trainer.data.sampler import EpochShuffleSampler

    train_log, val_log = tmp_path / "train.log", tmp_path / "val.log"
    epochs, steps, val_steps, batch = 3, 3, 2, 4
    result = run_cli(
        "data=custom",
        "data.dataset._target_=spies.FetchLog",
        f"+data.dataset.path={train_log}",
        "+data.dataset.n=64",
        "+data.val_dataset._target_=spies.FetchLog",
        f"+data.val_dataset.path={val_log}",
        "+data.val_dataset.n=32",
        "data.image_size=16",
        f"data.batch_size={batch}",
        "data.num_workers=2",
        "data.persistent_workers=true",
        "data.prefetch_factor=4",
        f"trainer.limit_train_batches={steps}",
        f"trainer.limit_val_batches={val_steps}",
        f"trainer.max_epochs={epochs}",
        "checkpoint.enabled=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trained = [int(line) for line in train_log.read_text().split()]
    # each epoch's indices, as the training sampler orders them (the workers' appends interleave)
    expected = []
    for epoch in range(epochs):
        sampler = EpochShuffleSampler(64, 42)
        sampler.set_epoch(epoch)
        expected += list(sampler)[: steps * batch]
    assert sorted(trained) == sorted(expected), f"{len(trained)} samples built for {len(expected)} trained"
    # validation (no sanity check by default): once per epoch, its first samples each time
    validated = [int(line) for line in val_log.read_text().split()]
    assert sorted(validated) == sorted(list(range(val_steps * batch)) * epochs), len(validated)


def test_a_step_limit_stops_each_rank_at_the_samples_lightnings_own_dealing_gives_it():
    """Under a distributed strategy the capped training sampler is dealt by the datamodule (already
    distributed, so Lightning leaves it in place): each rank's share is Lightning's own
    DistributedSamplerWrapper's, cut at the limit; with one process too (Lightning wraps it then as
    well), with and without repeats."""
    from pytorch_lightning.trainer.connectors.data_connector import _get_distributed_sampler
    from pytorch_lightning.trainer.states import RunningStage
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.data.sampler import EpochShuffleSampler, deal_to_ranks

    for world, repeats in ((3, 1), (1, 1), (1, 2)):
        for rank in range(world):
            lightnings = _get_distributed_sampler(
                DataLoader(range(50), sampler=EpochShuffleSampler(50, seed=5, repeats=repeats), batch_size=4),
                True,
                0,
                RunningStage.TRAINING,
                num_replicas=world,
                rank=rank,
            )
            ours = deal_to_ranks(EpochShuffleSampler(50, seed=5, repeats=repeats), rank, world, 8, distributed=True)
            assert isinstance(ours, DistributedSampler)  # (DataConnector._requires_distributed_sampler)
            for epoch in (0, 1):
                lightnings.set_epoch(epoch)
                ours.set_epoch(epoch)
                assert list(ours) == list(lightnings)[:8] and len(ours) == 8, (world, repeats, rank, epoch)


# host-built synthetic batches (the sampler and step-limit paths of a loader of real data): 70 + 30 samples in batches of 4
STEP_LIMIT_DATA = (
    "data.device_resident=false",
    "data.num_samples=70",
    "data.val_samples=30",
    "data.batch_size=4",
    "data.image_size=8",
)


@pytest.mark.parametrize("limit", [2, 100, 0.5, 0.25, 1.0])
@pytest.mark.parametrize("world", [1, 2])
def test_a_step_limit_leaves_lightning_the_same_count_of_batches_to_train_and_validate(compose, limit, world):
    """Lightning applies its limit (_parse_num_batches) to the loader the datamodule hands it: after the
    datamodule's cut it must come to the count it would on the whole epoch, for an int limit (cut to
    exactly that) and a fraction (left whole: a fraction of a shorter loader would be fewer batches)."""
    from types import SimpleNamespace

    from pytorch_lightning.trainer.connectors.data_connector import _parse_num_batches
    from pytorch_lightning.trainer.states import RunningStage
    from torch.utils.data import DistributedSampler

    cfg = compose(*STEP_LIMIT_DATA)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.trainer = SimpleNamespace(limit_train_batches=limit, limit_val_batches=limit, world_size=world, global_rank=0)
    assert cfg.data.drop_last  # training drops a last partial batch, validation keeps it
    for n, name, stage in (
        (70, "train_dataloader", RunningStage.TRAINING),
        (30, "val_dataloader", RunningStage.VALIDATING),
    ):
        drop = name == "train_dataloader"

        def rank_batches(samples: int, drop: bool = drop) -> int:  # a rank's batches, as Lightning deals them
            per_rank = -(-samples // world)
            return per_rank // 4 if drop else -(-per_rank // 4)

        loader = getattr(dm, name)()
        if isinstance(loader.sampler, DistributedSampler):  # dealt already: its length is this rank's
            handed = len(loader)
        else:
            handed = rank_batches(len(loader.sampler))
        assert _parse_num_batches(stage, handed, limit) == _parse_num_batches(stage, rank_batches(n), limit)
        if isinstance(limit, int) and limit < rank_batches(n):
            assert handed == limit  # cut where Lightning stops
        elif isinstance(loader.sampler, DistributedSampler):
            assert len(loader.sampler) == -(-n // world)  # this rank's whole share
        else:
            assert len(loader.sampler) == n  # the whole set


def test_validation_under_a_step_limit_keeps_the_data_sets_attributes():
    from trainer.data.sampler import FirstSamples

    class Named(list):
        classes = ["cat", "dog"]

    first = FirstSamples(Named(range(10)), 4)
    assert len(first) == 4 and first.classes == ["cat", "dog"] and [first[i] for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        first[4]


def test_a_distributed_strategy_of_one_process_gets_its_capped_sampler_dealt_as_lightning_would(compose):
    from types import SimpleNamespace

    from torch.utils.data import DistributedSampler

    cfg = compose(*STEP_LIMIT_DATA)
    for kwargs, dealt in ((None, False), ({"num_replicas": 1, "rank": 0}, True)):  # single device; ddp devices=1
        dm = ImageDataModule(cfg.data, cfg.seed)
        dm.trainer = SimpleNamespace(
            limit_train_batches=3, limit_val_batches=1.0, world_size=1, global_rank=0, distributed_sampler_kwargs=kwargs
        )
        sampler = dm.train_dataloader().sampler
        assert isinstance(sampler, DistributedSampler) is dealt and len(sampler) == 12


def test_a_resumed_epoch_under_a_step_limit_draws_the_rest_of_its_first_draws_only():
    from trainer.data.sampler import EpochShuffleSampler

    full = list(EpochShuffleSampler(50, 5))
    capped = EpochShuffleSampler(50, 5, stop=12)
    capped.skip[0] = 4  # one batch of 4 trained before the checkpoint
    assert list(capped) == full[4:12] and list(capped) == full[:12]  # the skip applies once


def test_the_training_process_leaves_its_loader_workers_their_cores(train, add_callbacks, monkeypatch):
    """The step's intra-op threads are the cores the loader workers leave (each worker runs one
    thread): 1 worker on 4 cores, 3 threads in every step; the next job of the process (a local
    sweep's) sets its own count again, every core with no workers."""
    monkeypatch.setattr("trainer.measure.hardware.usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # no bound of the user's, as Lightning's launcher reads it
    seen = []

    class Threads(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(torch.get_num_threads())

    add_callbacks(Threads())
    before = torch.get_num_threads()
    try:
        host = ("data.device_resident=false", "trainer.max_epochs=1", "trainer.limit_train_batches=3")
        m, _ = train(*host, "data.num_workers=1")
        assert m["status"] == "ok" and m["intra_op_threads"] == 3 and seen and set(seen) == {3}
        seen.clear()
        m, _ = train(*host)
        assert m["intra_op_threads"] == 4 and seen and set(seen) == {4}
        # through Lightning's DDP launcher (one process here), which sets its own count before training
        seen.clear()
        m, _ = train(*host, "data.num_workers=1", "strategy=ddp")
        assert m["flags"]["strategy"] == "ddp" and m["intra_op_threads"] == 3 and set(seen) == {3}, set(seen)
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_bounds_the_threads_and_launched_ranks_get_their_share_in_it(compose, monkeypatch):
    """The user's OMP_NUM_THREADS bounds the step's threads (torch's own reading of it); the ranks the
    launcher starts through torchrun get their share of the node's cores in it where the user set
    none, and in a rank of the user's own torchrun its default of 1 is not taken as the user's."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    from trainer.launch.processes import ranks_env
    from trainer.launch.torchrun import LAUNCHED_RANKS_ENV, STOP_GRACE_ENV
    from trainer.switches.switchboard import set_intra_op_threads

    monkeypatch.setattr("trainer.measure.hardware.usable_cores", lambda: 8)
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_intra_op_threads(workers=1) == 2 == torch.get_num_threads()
        assert "OMP_NUM_THREADS" not in ranks_env(compose("strategy=ddp", "devices=2"))  # the user's passes on
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert set_intra_op_threads(workers=1) == 7 == torch.get_num_threads()
        assert ranks_env(compose("strategy=ddp", "devices=2"))["OMP_NUM_THREADS"] == "4"
        monkeypatch.setenv("OMP_NUM_THREADS", "4")  # what that rank reads: 4 cores, 3 threads beside 1 worker
        assert set_intra_op_threads(workers=1, processes_per_node=2) == 3
        # a rank of the user's own torchrun with 2 ranks a node: a 1 there is torchrun's default, any
        # other value the user's, also where the user set the stop grace as the README says; in a rank
        # this framework launched (marked so) a 1 is the user's
        assert ranks_env(compose("strategy=ddp", "devices=2"))[LAUNCHED_RANKS_ENV] == "1"
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        monkeypatch.delenv(LAUNCHED_RANKS_ENV, raising=False)
        monkeypatch.setenv(STOP_GRACE_ENV, "300")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert set_intra_op_threads(workers=1, processes_per_node=2) == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_intra_op_threads(workers=1, processes_per_node=2) == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setenv(LAUNCHED_RANKS_ENV, "1")
        assert set_intra_op_threads(workers=1, processes_per_node=2) == 1
    finally:
        torch.set_num_threads(before)


def test_decoded_images_are_let_go_only_once_their_crop_has_run():
    """The nvJPEG path's decoded images are freed into the decode stream's pool, which the next
    decode writes from a stream of its own: a batch is let go two decodes later, as it is where its
    crop's event has passed, and marked as used by the crop's stream where it has not (never a wait
    of the host)."""
    from trainer.data.device_decode import _Held

    class Event:
        def __init__(self, done):
            self.done, self.waited = done, False

        def query(self):
            return self.done

        def synchronize(self):
            self.waited = True

    class Image:
        def __init__(self):
            self.streams = []

        def record_stream(self, stream):
            self.streams.append(stream)

    held = _Held(depth=2)
    batches = [(Event(done), [Image(), Image()], f"stream {k}") for k, done in enumerate([True, False, True])]
    held.held.append(batches[0])
    held.release()
    assert held.held == [batches[0]]  # the newest batch stays until a later one arrives
    held.held.append(batches[1])
    held.release()  # batch 0's crop has run: let go as it is
    assert held.held == [batches[1]] and all(not im.streams for im in batches[0][1])
    held.held.append(batches[2])
    held.release()  # batch 1's crop still queued: its images are marked as read by its stream
    assert held.held == [batches[2]] and all(im.streams == ["stream 1"] for im in batches[1][1])
    assert not any(event.waited for event, _, _ in batches)


class _EpochStarts(pl.Callback):
    """The time each training epoch starts; validation held for ``hold_s`` (a slow validation)."""

    def __init__(self, hold_s: float = 0.5):
        self.starts, self.hold_s = {}, hold_s

    def on_train_epoch_start(self, trainer, pl_module):
        self.starts[trainer.current_epoch] = time.time()

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            time.sleep(self.hold_s)


@pytest.mark.parametrize("persistent, prefetch", [(False, False), (True, True)])
def test_the_next_epochs_workers_build_its_first_batches_while_this_one_validates(
    train, add_callbacks, tmp_path, monkeypatch, persistent, prefetch
):
    """With loader workers, the training loader's next iterator is made when its epoch's last batch is
    taken (also by data.device_prefetch's step-loop side): epoch 1's first batches are built, its
    first samples in its order, before epoch 1 starts, during the validation; after the last epoch
    nothing more is built."""
    from trainer.data.loaders.torch_workers import TorchLoaders
    from trainer.data.sampler import EpochShuffleSampler

    if prefetch:
        monkeypatch.setattr(TorchLoaders, "prefetch_device", lambda self: torch.device("cpu"))

    log = tmp_path / "fetches.log"
    starts = _EpochStarts()
    add_callbacks(starts)
    m, _ = train(
        "data=custom",
        "data.dataset._target_=spies.TimedFetchLog",
        f"+data.dataset.path={log}",
        "+data.dataset.n=32",
        "+data.val_dataset._target_=spies.SlowDataset",
        "+data.val_dataset.n=8",
        "data.batch_size=4",
        "data.num_workers=2",
        f"data.persistent_workers={str(persistent).lower()}",
        "data.prefetch_factor=2",
        "trainer.max_epochs=2",
        f"data.device_prefetch={str(prefetch).lower()}",
    )
    assert m["status"] == "ok"
    fetched = sorted((float(t), int(i)) for t, i in (line.split() for line in log.read_text().splitlines()))
    assert len(fetched) == 64  # two epochs of 32, nothing built for an epoch that does not come
    sampler = EpochShuffleSampler(32, 42)
    sampler.set_epoch(1)
    order = list(sampler)
    epoch1 = fetched[32:]  # epoch 0's iterator ran out before epoch 1's was made
    ahead = [i for t, i in epoch1 if t < starts.starts[1]]
    # at least one batch of epoch 1 built before it started, and only its first batches (the workers'
    # queue: 2 workers x prefetch_factor 2 x batches of 4)
    assert len(ahead) >= 4 and set(ahead) <= set(order[:16]), (ahead, order[:16])
