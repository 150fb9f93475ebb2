"""The step loop never makes the host wait for the GPU: every bench row, both recipes shrunk.

torch's sync debug mode (``torch.cuda.set_sync_debug_mode("error")``) raises on every operation
that blocks the host until the GPU catches up (``.item()``, a blocking copy, ``torch.tensor(list,
device="cuda")``). It is switched on from the first step of the second epoch (the first pays for
compile, cuDNN autotuning and the batch-size search, which may wait) until that epoch's steps are
done, before the epoch's own synchronize (the timer's read, once per epoch) and validation. So
every steady step, the fetch and transfer of each next batch, and every callback's batch hooks
run under it. Marked ``gpu``; ``scripts/gpu_check.sh`` runs it.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from conftest import ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/gpu_check.sh on one"),
]

ROWS = sorted(p.stem for p in (ROOT / "configs" / "bench").glob("*.yaml"))
INPUT_ROWS = {
    "workers",
    "prefetch",
    "gpu_normalize",
    "nvjpeg",
    "dali",
    "all",
    "all_turbo",
    "all_nvimgcodec",
}  # rows about the input pipeline: real JPEGs
# smoke scale keeps the recipe's model and batch (32; big_batch and all search it, up to 64)
SMALL = [
    "scale=smoke",
    "accelerator=gpu",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=5",
    "trainer.limit_val_batches=0",
    "checkpoint.enabled=false",
    "batch_finder.max_batch_size=64",
    "monitor.interval_s=0.05",
    "trainer.log_every_n_steps=2",
]  # StepLoss and NaNGuard read every 2 steps: within the checked ones
JPEGS = ["data=builtin", "data.images_per_class=40", "data.stored_size=48"]  # 5+ batches of 64 per epoch
SYNTHETIC = ["data.device_resident=true", "data.num_samples=320"]


class SyncDebugSteps(pl.Callback):
    """First among the callbacks, so that it is on before and off after every other one's step hooks."""

    def __init__(self) -> None:
        self.checked_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0:
            torch.cuda.set_sync_debug_mode("error")
        if torch.cuda.get_sync_debug_mode() == 2:
            self.checked_steps += 1

    def _off(self, *args, **kwargs) -> None:
        torch.cuda.set_sync_debug_mode(0)

    on_validation_start = on_train_epoch_end = on_exception = on_fit_end = _off


def _cases():
    for recipe in ("resnet50", "vit"):
        for row in ROWS:
            if (recipe, row) == ("vit", "progressive"):
                continue  # refused before it runs: a ViT's position embeddings fix its input size (tests/test_switches.py)
            yield pytest.param(recipe, row, JPEGS if row in INPUT_ROWS else SYNTHETIC, id=f"{recipe}-{row}")
    # uint8 batches gathered from the device-resident pool, normalized by the network (ModelInput)
    yield pytest.param(
        "vit", "gpu_normalize", SYNTHETIC + ["data.gpu_normalize=true"], id="vit-gpu_normalize-device_resident"
    )
    # the README's headline: synthetic data's defaults (device-resident), amp and compile
    yield pytest.param("resnet50", "none", ["amp=true", "compile=true", "data.num_samples=320"], id="resnet50-headline")
    # fp16 with loss scaling: the loss scaler must not read its overflow flag on the host
    yield pytest.param("resnet50", "amp", SYNTHETIC + ["amp_dtype=fp16"], id="resnet50-amp-fp16")


@pytest.mark.parametrize("recipe, row, data", list(_cases()))
def test_no_host_sync_inside_the_step_loop(compose, tmp_path, recipe, row, data, add_callbacks):
    from trainer import run as run_mod

    watch = SyncDebugSteps()
    add_callbacks(watch, first=True)
    if row == "dali":
        pytest.importorskip(
            "nvidia.dali", reason="the dali row needs NVIDIA DALI: pip install 'trainer-switchboard[dali]'"
        )
    if row == "all_nvimgcodec":
        pytest.importorskip(
            "nvidia.nvimgcodec", reason="the row needs nvImageCodec: pip install 'trainer-switchboard[nvimgcodec]'"
        )
    args = [f"+recipe={recipe}", f"+bench={row}", *SMALL, *data]
    try:
        m = run_mod.run(compose(*args), str(tmp_path / "run"), args)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert m["status"] == "ok", m["error"]  # a host sync in the checked steps fails the run with its stack's message
    assert watch.checked_steps >= 4, watch.checked_steps  # the check really covered the steady steps


def test_normalizing_a_uint8_batch_does_not_wait_for_the_gpu():
    """The mean and std are built once per device: a batch normalized after the first never copies them again."""
    from trainer.data.gpu_transforms import normalize_uint8

    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, device="cuda")
    normalize_uint8(x)  # the first call on this device builds the constants
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = normalize_uint8(x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert y.dtype == torch.float32 and y.is_cuda


def test_host_reads_arrive_without_a_wait():
    from trainer.callbacks.host_reads import HostReads

    reads, got = HostReads(slots=4), {}
    values = [torch.full((), float(i), device="cuda") for i in range(6)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, v in enumerate(values):
            reads.push(i, v)
            got.update(reads.ready())  # may hand back nothing yet; never waits
    finally:
        torch.cuda.set_sync_debug_mode(0)
    got.update(reads.drain())
    assert len(got) + reads.dropped == 6 and len(got) >= 4 and all(got[k] == float(k) for k in got), (
        got,
        reads.dropped,
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_no_host_sync_in_the_steps_of_a_two_gpu_ddp_run(tmp_path):
    """Two ranks under DDP (NCCL): the second epoch's steps run under sync debug mode "error" in each
    rank, so Lightning's per-step SIGTERM broadcast (a ``.item()``) or any other host wait fails the
    run; the stop agreement runs over gloo on CPU tensors and must not trip it."""
    import json

    from conftest import run_cli

    run_dir = tmp_path / "run"
    r = run_cli(
        f"hydra.run.dir={run_dir}", "accelerator=gpu", "model._target_=spies.WatchedLightningModule", "~model.width",
        "+model.sync_debug=true", "strategy=ddp", "devices=2", "data.num_samples=512", "data.batch_size=16",
        "data.image_size=32", "trainer.max_epochs=2", "trainer.limit_val_batches=0", "data.val_samples=0",
        "checkpoint.enabled=false",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((run_dir / f"step_loop_rank{rank}.json").read_text())
        assert seen["steps"] == 32 and seen["broadcasts"] == 0, seen
