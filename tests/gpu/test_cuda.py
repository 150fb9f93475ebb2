"""What only a CUDA GPU can show: each GPU path really runs, proven from inside the run.

Marked ``gpu`` and skipped without CUDA; ``scripts/gpu_check.sh`` runs them on a GPU machine
(``pytest -m gpu``). Tiny models and images, like the CPU suite: these check behaviour, the
benchmark in the same script measures speed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import pytest
import torch
from spies import training_snapshots

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/gpu_check.sh on one"),
    pytest.mark.usefixtures("clear_spies"),
]

GPU = ["accelerator=gpu"]
PROBE = GPU + ["model._target_=spies.ProbeNet", "~model.width"]
# synthetic batches built on the host and copied, as a loader of real data does (data=synthetic gathers them on the GPU by default)
HOST = "data.device_resident=false"


def _jpeg_folder(root, classes=("a", "b", "c"), per_class=8, size=48):
    from PIL import Image

    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (size + 4 * j, size), (80 * i, 25 * j, 120)).save(root / cls / f"{j}.jpg", quality=90)
    return root


def test_bf16_autocast_runs_on_the_gpu(train):
    m, _ = train(*PROBE, "amp=true")
    seen = training_snapshots()
    assert seen and all(s["device"] == "cuda" and s["autocast"] and s["conv_out_dtype"] == torch.bfloat16 for s in seen)
    assert m["precision"] == "bf16-mixed" and m["device"]["accelerator"] == "cuda"


def test_fp16_loss_scaling_skips_non_finite_steps(train):
    """fp16 autocast with Lightning's GradScaler: a NaN loss skips the step and halves the scale."""
    m, out = train(*PROBE, "amp=true", "amp_dtype=fp16", "+model.nan_after=3", "on_nan=off", "checkpoint.enabled=true")
    seen = training_snapshots()
    assert seen and all(s["conv_out_dtype"] == torch.float16 for s in seen)
    assert m["precision"] == "16-mixed" and m["grad_scale"] is not None
    assert m["grad_scale"] < 65536.0  # GradScaler's initial scale: it backed off on the NaN steps
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert state and all(
        torch.isfinite(v).all() for v in state.values() if v.is_floating_point()
    )  # no NaN reached the weights


def test_compile_runs_on_the_gpu(train):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m, _ = train(*GPU, "compile=true", "model.width=4")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert m["status"] == "ok" and m["compile_time_s"] and m["compile_time_s"] > 0


def test_channels_last_on_the_gpu(train):
    train(*PROBE, "channels_last=true")
    seen = training_snapshots()
    assert seen and all(s["device"] == "cuda" and s["weight_channels_last"] and s["input_channels_last"] for s in seen)


def test_tf32_and_cudnn_benchmark_on_the_gpu(train):
    train(*PROBE, "tf32=true", "cudnn_benchmark=true")
    seen = training_snapshots()
    assert seen and all(s["matmul_precision"] == "high" and s["cudnn_benchmark"] for s in seen)
    assert torch.backends.cuda.matmul.allow_tf32  # off by default in torch: only tf32=true turns it on


def test_device_prefetch_copies_on_a_side_stream(train, monkeypatch):
    """The prefetch thread copies each batch with the loader object's ``to_device`` on its own stream;
    Lightning's transfer hook then gets batches already on the GPU."""
    from trainer.data import datamodule as dm_mod
    from trainer.data.loaders import base

    streams, arrived = [], []
    real_to_device = base.Loaders.to_device
    real_transfer = dm_mod.ImageDataModule.transfer_batch_to_device

    def to_device(self, batch, device):
        if batch[0].device.type == "cpu":  # a real copy (Lightning's hook also sees the batch, already moved)
            streams.append(torch.cuda.current_stream(device) == torch.cuda.default_stream(device))
        return real_to_device(self, batch, device)

    def transfer(self, batch, device, idx):
        arrived.append(batch[0].device.type)  # what Lightning is about to move
        return real_transfer(self, batch, device, idx)

    monkeypatch.setattr(base.Loaders, "to_device", to_device)
    monkeypatch.setattr(dm_mod.ImageDataModule, "transfer_batch_to_device", transfer)
    m, _ = train(*GPU, HOST, "data.device_prefetch=true", "data.num_workers=1")
    assert m["status"] == "ok" and streams and not any(streams)  # every copy on the side stream
    assert arrived and all(d == "cuda" for d in arrived)  # already on the GPU when Lightning gets it
    monkeypatch.undo()
    plain, _ = train(*GPU, HOST, "data.num_workers=1")
    assert m["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-3)  # same batches, same training


def test_device_prefetch_copies_on_one_stream_and_reuses_its_memory_every_epoch():
    """The caching allocator reuses a freed block only for allocations on the stream it was allocated
    on. With a new side stream per epoch each epoch's batches stayed reserved (the memory readings
    grew by a queue of batches per epoch); with one stream the reserved memory stays flat."""
    from trainer.data.prefetch import DevicePrefetchLoader

    device = torch.device("cuda", torch.cuda.current_device())
    streams = []

    def transfer(batch, device):
        streams.append(torch.cuda.current_stream(device).cuda_stream)
        return batch.to(device, non_blocking=True)

    samples = torch.randn(10, 4, 1024, 1024)  # 16 MiB each: every batch gets a block of its own
    loader = DevicePrefetchLoader(samples, batch_size=1, device=device, transfer=transfer, pin_memory=True)
    reserved = []
    for _ in range(8):
        for x in loader:
            (x * 2).sum()
            torch.cuda.synchronize(device)  # the step is done before its batch is let go: no timing in the count
        reserved.append(torch.cuda.memory_reserved(device))
    assert len(set(streams)) == 1 and streams[0] != torch.cuda.default_stream(device).cuda_stream
    assert max(reserved) - reserved[0] < 2 * samples[0].nbytes, [r >> 20 for r in reserved]


@dataclasses.dataclass
class _PairBatch:
    images: torch.Tensor
    labels: torch.Tensor


def test_device_prefetch_marks_every_tensor_of_a_dataclass_batch_as_used_by_the_step(monkeypatch):
    """Lightning moves the tensors of a dataclass batch; each of them must be record_stream-ed on the
    compute stream, or the next copy may reuse its memory while the step reads it."""
    from trainer.data.prefetch import DevicePrefetchLoader

    marked = []
    real = torch.Tensor.record_stream

    def record_stream(self, stream):
        marked.append((self.data_ptr(), stream.cuda_stream))
        return real(self, stream)

    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
    device = torch.device("cuda", torch.cuda.current_device())
    items = [(torch.rand(3, 8, 8), i) for i in range(8)]
    loader = DevicePrefetchLoader(
        items,
        batch_size=4,
        device=device,
        collate_fn=lambda b: _PairBatch(torch.stack([x for x, _ in b]), torch.tensor([y for _, y in b])),
    )
    for batch in loader:
        compute = torch.cuda.current_stream(device).cuda_stream
        assert isinstance(batch, _PairBatch) and batch.images.is_cuda and batch.labels.is_cuda
        assert set(marked) == {(batch.images.data_ptr(), compute), (batch.labels.data_ptr(), compute)}
        marked.clear()


def test_gpu_normalize_ships_uint8_to_the_gpu(train, monkeypatch):
    from trainer.data import datamodule as dm_mod

    shipped = []
    real = dm_mod.ImageDataModule.transfer_batch_to_device
    monkeypatch.setattr(
        dm_mod.ImageDataModule,
        "transfer_batch_to_device",
        lambda self, b, d, i: shipped.append(b[0].dtype) or real(self, b, d, i),
    )
    train(*PROBE, HOST, "data.gpu_normalize=true")
    assert shipped and all(dt == torch.uint8 for dt in shipped)
    seen = training_snapshots()
    assert seen and all(s["input_dtype"] == torch.float32 and s["device"] == "cuda" for s in seen)


NVIMGCODEC = pytest.mark.skipif(
    importlib.util.find_spec("nvidia.nvimgcodec") is None,
    reason="needs NVIDIA's nvImageCodec (pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'; the GPU check carries it)",
)


@pytest.mark.parametrize("library", ["torchvision", pytest.param("nvimgcodec", marks=NVIMGCODEC)])
def test_nvjpeg_decodes_batches_on_the_gpu(compose, train, tmp_path, library):
    from trainer.data import ImageDataModule
    from trainer.data.device_decode import EncodedBatch

    root = _jpeg_folder(tmp_path / "imgs")
    args = (
        "data=imagefolder",
        f"data.root={root}",
        "data.augment=false",
        "data.val_split=0",
        "data.image_size=32",
        "data.batch_size=12",
    )
    cfg = compose(*args, "data.decoder=nvjpeg", f"data.nvjpeg_library={library}")
    dm = ImageDataModule(cfg.data, cfg.seed, accelerator="cuda")
    dm.build()
    assert dm.decoder == "nvjpeg"
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, EncodedBatch) and len(batch.jpeg_at) == 12 and not batch.decoded  # one byte buffer
    x, y = dm.transfer_batch_to_device(batch, torch.device("cuda"), 0)
    assert x.is_cuda and x.dtype == torch.uint8 and x.shape == (12, 3, 32, 32)
    ref_cfg = compose(*args, "data.decoder=torchvision", "data.gpu_normalize=true")
    ref_dm = ImageDataModule(ref_cfg.data, ref_cfg.seed)
    ref_dm.build()
    ref_x, ref_y = next(iter(ref_dm.train_dataloader()))
    assert torch.equal(ref_y, y.cpu())
    assert (x.cpu().float() - ref_x.float()).abs().mean() < 3  # nvJPEG and libjpeg-turbo differ by rounding
    m, _ = train(
        *GPU,
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=32",
        "data.batch_size=4",
        "data.decoder=nvjpeg",
        f"data.nvjpeg_library={library}",
        "data.device_prefetch=true",
        "data.num_workers=1",
    )
    assert m["status"] == "ok" and m["decoder"] == "nvjpeg" and m["flags"]["data.nvjpeg_library"] == library


def test_device_resident_synthetic_lives_on_the_gpu(train):
    from trainer.data.synthetic import DeviceResidentImages, SyntheticImages

    m, _ = train(*PROBE, "data.device_resident=true")
    seen = training_snapshots()
    assert m["status"] == "ok" and seen and all(s["device"] == "cuda" for s in seen)
    dataset = DeviceResidentImages(SyntheticImages(32, 16, 4, seed=0), "cuda")
    x, y = dataset.__getitems__([0, 5, 40])
    assert x.is_cuda and y.is_cuda and x.shape == (3, 3, 16, 16)


def test_fsdp1_wraps_the_blocks_trains_saves_and_resumes(compose, tmp_path):
    """strategy=fsdp (Lightning's FSDPStrategy, GPU only) on the ViT recipe's blocks, then ckpt_path=last."""
    import pytorch_lightning as pl
    from torch.distributed.fsdp import FullyShardedDataParallel

    from trainer.run import run

    wrapped = []

    class CountWrapped(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            wrapped.append(sum(isinstance(m, FullyShardedDataParallel) for m in trainer.strategy.model.modules()))

    original = pl.Trainer.__init__

    def init(self, *a, callbacks=None, **kw):
        original(self, *a, callbacks=list(callbacks or []) + [CountWrapped()], **kw)

    out = str(tmp_path / "fsdp")
    args = GPU + [
        "+recipe=vit",
        "scale=smoke",
        "strategy=fsdp",
        "checkpoint.enabled=true",
        "data.batch_size=16",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=2",
        "trainer.max_epochs=1",
    ]
    pl.Trainer.__init__ = init
    try:
        m = run(compose(*args), out, args)
    finally:
        pl.Trainer.__init__ = original
    assert wrapped and wrapped[0] > 1, wrapped  # the root and every encoder block are FSDP units
    assert m["status"] == "ok" and (tmp_path / "fsdp" / "checkpoints" / "last.ckpt").exists()
    resumed = args[:-1] + ["trainer.max_epochs=2", "ckpt_path=last"]
    m2 = run(compose(*resumed), out, resumed)
    assert m2["status"] == "ok" and m2.get("resumed_from") and len(m2["epochs"]) == 2


def test_fsdp1_clips_fp16_gradients_after_unscaling_them(compose, tmp_path, add_callbacks):
    """strategy=fsdp with fp16, its fused AdamW and clipping by norm: Lightning leaves a fused optimizer's
    gradients scaled (the optimizer unscales them in its step), so clipping them there clipped 65536
    times too hard. The classifier unscales them first; the step then uses gradients of the norm asked for."""
    import math

    import pytorch_lightning as pl

    from trainer.run import run

    seen = []

    class Grads(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):  # after the step: what it stepped with
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            seen.append(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])))  # read after the run

    add_callbacks(Grads())
    args = GPU + [
        "+recipe=vit",
        "scale=smoke",
        "strategy=fsdp",
        "amp=true",
        "amp_dtype=fp16",
        "trainer.gradient_clip_val=0.001",
        "data.batch_size=16",
        "trainer.limit_train_batches=8",
        "trainer.limit_val_batches=0",
        "trainer.max_epochs=1",
        "checkpoint.enabled=false",
    ]
    m = run(compose(*args), str(tmp_path / "run"), args)
    assert m["status"] == "ok" and m["precision"] == "16-mixed", m.get("error")
    norms = [float(n) for n in seen]
    finite = [n for n in norms if math.isfinite(n)]  # a step the scaler skipped (overflow) has none
    assert finite and all(0.5e-3 < n <= 1.001e-3 for n in finite), norms


def test_memory_snapshot_is_written_on_cuda(train):
    m, out = train(
        *GPU,
        "profile=true",
        "profiler.memory_snapshot=true",
        "data.num_samples=96",
        "profiler.skip_first=1",
        "profiler.wait=1",
        "profiler.warmup=1",
        "profiler.active=2",
    )
    snapshot = out / "profiler" / "memory_snapshot_rank0.pickle"
    assert m["status"] == "ok" and snapshot.exists() and snapshot.stat().st_size > 0
    assert m["peak_memory_method"] == "cuda max_memory_allocated"


def test_nvml_readings_reach_the_doctor(train):
    pytest.importorskip("pynvml", reason="NVML readings need nvidia-ml-py (pip install nvidia-ml-py)")
    m, _ = train(*GPU, "monitor.interval_s=0.1", "data.num_samples=256")
    assert m["diagnosis"]["evidence"]["gpu_util"] is not None


def test_batch_size_auto_searches_device_memory(train):
    """A budget of 1% of device memory (headroom 0.99): the search must stop on memory, well below
    the cap and the data set size, not on either of them."""
    m, _ = train(
        *GPU,
        "data.batch_size=auto",
        "batch_finder.headroom=0.99",
        "batch_finder.max_batch_size=65536",
        "data.num_samples=65536",
        "data.image_size=64",
        "model.width=64",
        "trainer.limit_train_batches=2",
    )
    budget_mb = torch.cuda.get_device_properties(0).total_memory / 2**20 * 0.01
    assert m["status"] == "ok" and "memory" in m["batch_size_reason"], m["batch_size_reason"]
    assert 1 <= m["batch_size"] < 65536 and str(round(budget_mb)) in m["batch_size_reason"].replace(".", ""), (
        m["batch_size"],
        m["batch_size_reason"],
    )


def test_cuda_alloc_conf_is_in_effect_in_the_allocator(tmp_path):
    """Set before CUDA starts in the process: expandable segments show in the allocator's own snapshot."""
    import subprocess
    import sys

    from conftest import ROOT, TINY, clean_env

    script = (
        "import sys, torch; sys.argv = ['train.py', *sys.argv[1:]]\n"
        "from trainer.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "segments = torch.cuda.memory_snapshot()\n"
        "print('EXPANDABLE', any(s.get('is_expandable') for s in segments), len(segments))\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            *GPU,
            *TINY,
            "cuda_alloc_conf=expandable_segments:True",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "EXPANDABLE True" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_compute_bound_gpu_run_is_not_called_input_bound(train):
    """Pageable copies wait for the previous step's kernels: that wait is compute, not data wait or transfer."""
    m, _ = train(
        *GPU,
        HOST,
        "data.pin_memory=false",
        "data.num_samples=2048",
        "data.batch_size=256",
        "data.image_size=64",
        # width 96 took about 20 ms a step on an H100, no more than the host's 16 ms to build a batch
        # of 256 (56% data wait); 256 is about 7x the work a step
        "model.width=256",
        "trainer.max_epochs=2",
    )
    assert m["data_wait_fraction"] < 0.25 and m["transfer_fraction"] is not None, m["epochs"]
    assert m["diagnosis"]["bottleneck"] != "input pipeline", m["diagnosis"]
    assert m["tflops"] and m["tflops"] > 0
    name = torch.cuda.get_device_name(0)
    if (
        "H100" in name or "H200" in name
    ):  # the GPUs this product is measured on: their peak is known by torch's own name
        assert m["peak_flops"] and m["peak_flops_source"].startswith(("H100", "H200")) and 0 < m["mfu"] < 1, (
            name,
            m["peak_flops_source"],
        )
    else:
        assert (m["peak_flops"] and 0 < m["mfu"] < 1) or m["peak_flops_source"].startswith("unknown"), m[
            "peak_flops_source"
        ]


def test_the_copy_share_agrees_with_the_trace(train):
    """profile=true on pageable float batches: the doctor's copy share is the HtoD memcpy time over all
    device work, each interval once, as the trace's own GPU events add up."""
    import json

    m, out = train(
        *GPU,
        HOST,
        "profile=true",
        "data.pin_memory=false",
        "data.image_size=128",
        "data.batch_size=64",
        "data.num_samples=1024",
        "profiler.skip_first=2",
        "profiler.wait=1",
        "profiler.warmup=1",
        "profiler.active=3",
    )
    share = m["diagnosis"]["evidence"].get("h2d_share")
    trace = json.loads(next((out / "profiler").glob("*.pt.trace.json")).read_text())
    device = [
        e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    total = sum(e["dur"] for e in device)
    copies = sum(e["dur"] for e in device if "HtoD" in e.get("name", ""))
    assert device and share is not None and share == pytest.approx(copies / total, abs=0.03), (share, copies / total)


def test_nvjpeg_decode_overlaps_the_step_with_device_prefetch(train, compose, tmp_path, monkeypatch, add_callbacks):
    """The batched decode (which ends in a wait for its own stream) runs in the prefetch thread: a step
    slower than the decode never waits for a batch, so neither data wait nor transfer is charged."""
    import threading
    import time

    import pytorch_lightning as pl

    from trainer.data.device_decode import DeviceDecoder

    threads = []
    real = DeviceDecoder.__call__
    monkeypatch.setattr(
        DeviceDecoder,
        "__call__",
        lambda self, b, d: threads.append(threading.current_thread().name) or real(self, b, d),
    )

    class SlowStep(pl.Callback):
        def on_train_start(self, *a):
            threads.clear()  # the batch decoded while the run was built (in this thread) is not a step's

        def on_train_batch_end(self, *a):
            time.sleep(0.05)  # a step the decode of 8 small JPEGs easily keeps up with

    add_callbacks(SlowStep())
    root = _jpeg_folder(tmp_path / "imgs", per_class=24)
    m, _ = train(
        *GPU,
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=32",
        "data.batch_size=8",
        "data.decoder=nvjpeg",
        "data.device_prefetch=true",
        "data.num_workers=2",
        "trainer.max_epochs=3",
        "data.val_split=0",
    )
    assert m["status"] == "ok" and threads and set(threads) == {"trainer-device-prefetch"}, set(threads)
    assert m["transfer_fraction"] < 0.1 and m["data_wait_fraction"] < 0.1, (
        m["transfer_fraction"],
        m["data_wait_fraction"],
    )


def test_nvjpeg_never_writes_into_memory_the_compute_stream_still_reads():
    """torchvision's decoder allocates its outputs on the caller's stream and writes them from a stream
    of its own that does not wait for the caller's: blocks freed while kernels queued on the compute
    stream still read them were handed to it and overwritten (a NaN loss in the fp32 nvjpeg row on an
    H100). Victim tensors of the decoded images' size are read by kernels queued behind a long stall
    and freed before the decode: their sums must come out as written. The decode itself is observed
    (``DeviceDecoder.decode``), and the batched crop after it is left out. The race is on only in tries
    whose decode ends while the victims' reads still wait: torchvision's nvJPEG decode mostly waits for
    all work queued on the device first (on an H100 with torchvision 0.26: 0 of 10 tries from the
    legacy default stream, 2 of 10 from a stream of the caller's own, which this test uses). Too few
    such tries prove nothing: the test then says so as a skip."""
    from torchvision.io import encode_jpeg

    from trainer.data.device_decode import DeviceDecoder, encoded_collate

    device = torch.device("cuda", torch.cuda.current_device())
    side = 128
    n = 8
    encoded = [encode_jpeg(torch.randint(0, 256, (3, side, side), dtype=torch.uint8), quality=90) for _ in range(n)]
    batch = encoded_collate([((e, f"{i}.jpg"), i) for i, e in enumerate(encoded)]).pin_memory()
    decoder = DeviceDecoder(side, train=False, augment=False)
    a = torch.randn(4096, 4096, device=device)
    c = torch.empty_like(a)
    wrong = stalled = 0
    tries = 30
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls: a long stall
    caller = torch.cuda.Stream(device)
    try:
        with torch.cuda.stream(caller):  # a stream of the caller's own (see the docstring)
            for _ in range(tries):
                victims = [
                    torch.full((3 * side * side // 4,), 1.0, device=device) for _ in range(2 * n)
                ]  # images' bytes
                torch.cuda.synchronize(device)
                for _ in range(20):  # tens of ms of work queued ahead of the reads
                    torch.mm(a, a, out=c)
                sums = torch.stack([v.sum() for v in victims])  # queued behind the stall, on the same stream
                read = torch.cuda.Event()
                read.record()
                del victims  # their blocks are free on the compute stream while those reads still wait
                images = decoder.decode(batch, device)
                stalled += not read.query()  # the reads had not run when the decode was done: the race was on
                torch.cuda.synchronize(device)
                wrong += int((sums != 3 * side * side // 4).sum())
                assert len(images) == n and all(im.shape == (3, side, side) for im in images)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert wrong == 0, f"{wrong} of {tries * 2 * n} sums read memory the decoder wrote"
    if stalled < 3:  # the race was hardly on: nothing was proven either way
        pytest.skip(
            f"the decode ended before the victims' reads ran in {stalled} of {tries} tries only: torchvision's nvJPEG "
            "decode mostly waits for the work already queued on the device (2 of 10 tries on an H100, torchvision "
            "0.26), so the race could not be provoked often enough here"
        )


@NVIMGCODEC
def test_nvimgcodec_decodes_into_last_batchs_images_only_after_their_reads_have_run():
    """data.nvjpeg_library=nvimgcodec decodes each batch into the last batch's images, ordered on the
    caller's stream: reads of a batch queued behind a long stall on that stream must see its pixels,
    though the next batch is decoded into the same memory before they run. The race is on only in tries
    whose decode call returns while those reads still wait (a decode that makes the host wait for the
    queued work also cannot run beside a step): with too few such tries the test says so as a skip."""
    from torchvision.io import encode_jpeg

    from trainer.data.nvimgcodec_decode import BatchDecoder

    device = torch.device("cuda", torch.cuda.current_device())
    side, n, tries = 128, 8, 30
    dark = [encode_jpeg(torch.full((3, side, side), 40, dtype=torch.uint8), quality=90) for _ in range(n)]
    light = [encode_jpeg(torch.full((3, side, side), 200, dtype=torch.uint8), quality=90) for _ in range(n)]
    codec = BatchDecoder()
    a = torch.randn(4096, 4096, device=device)
    c = torch.empty_like(a)
    wrong = stalled = reused = 0
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls: a long stall
    caller = torch.cuda.Stream(device)
    try:
        with torch.cuda.stream(caller):
            for _ in range(tries):
                images = codec(dark, device)
                torch.cuda.synchronize(device)
                expected = torch.stack([im.float().sum() for im in images]).cpu()
                for _ in range(20):  # tens of ms of work queued ahead of the reads
                    torch.mm(a, a, out=c)
                sums = torch.stack([im.float().sum() for im in images])  # queued behind the stall
                read = torch.cuda.Event()
                read.record()
                pointers = [im.data_ptr() for im in images]
                del images
                following = codec(light, device)  # into the same images, if the library reuses them
                stalled += not read.query()  # the decode call returned before the reads had run
                reused += [im.data_ptr() for im in following] == pointers
                torch.cuda.synchronize(device)
                wrong += int((sums.cpu() != expected).sum())
                assert len(following) == n and all(im.shape == (3, side, side) for im in following)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert wrong == 0, f"{wrong} of {tries * n} sums read pixels of the batch decoded after them ({reused} reused)"
    if reused < 3:
        pytest.skip(f"nvImageCodec decoded into the last batch's images in {reused} of {tries} tries: nothing raced")
    if stalled < 3:
        pytest.skip(
            f"the decode call returned before the queued reads had run in {stalled} of {tries} tries ({reused} "
            "decoded into the last batch's images): nvImageCodec's decode waited for the work queued on the device"
        )


@pytest.mark.parametrize("busy", [False, True], ids=["gpu-idle", "gpu-busy"])
def test_prefetch_transfer_counts_only_the_time_the_gpu_waited_for_its_batch(busy):
    """A producer whose copy takes 10 ms of host time per batch: with light steps the GPU idles while
    the host waits, and that is transfer; with 30 ms steps the GPU always has queued work while the
    host waits, and transfer is about nothing (it was counted in full when the host's wait was)."""
    from trainer.callbacks.step_clock import StepClock
    from trainer.data.prefetch import DevicePrefetchLoader, PrefetchWaits

    def slow_copy(batch, device):
        time.sleep(0.010)
        return [t.to(device, non_blocking=True) for t in batch]  # a TensorDataset's batch: a list of one

    device = torch.device("cuda", torch.cuda.current_device())
    clock, waits = StepClock(), PrefetchWaits()
    clock.reads(waits)
    clock.active, clock.cuda_device = True, device
    data = torch.utils.data.TensorDataset(torch.randn(24, 256))
    loader = DevicePrefetchLoader(data, batch_size=1, device=device, transfer=slow_copy, waits=waits, pin_memory=True)
    weights = torch.randn(2048, 2048, device=device)
    per_step = 100 if busy else 1  # tens of ms of fp32 matmuls per step on an H100, or almost nothing
    for (x,) in loader:
        for _ in range(per_step):
            weights = torch.tanh(weights @ weights + x.mean()) * 0.5
    torch.cuda.synchronize(device)
    transfer = clock.transfer_s()
    if busy:
        assert transfer < 0.1 * 24 * 0.010, transfer
    else:
        assert transfer > 0.5 * 24 * 0.010, transfer


def test_a_nan_on_the_gpu_is_found_by_the_deferred_read(train):
    """on_nan=stop on a GPU: the flag reaches the host by a non-blocking copy read once it has arrived
    (no step waits for it), and the stop names the first bad step."""
    from trainer.errors import TrainingStopped

    with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 2;"):
        train(*PROBE, "on_nan=stop", "+model.nan_after=2", "trainer.log_every_n_steps=4", "trainer.max_epochs=2")
