"""data.loader=dali on a GPU: the ``mixed`` decoder (nvJPEG, and the hardware decoder of A100/H100)
hands CUDA batches whose pixels are the CPU pipeline's, and its prefetch overlaps the step: a
compute-heavy run is not called input-bound and the step loop never waits on the host (the bench
row ``dali`` is also in tests/gpu/test_sync_free.py).

Marked ``gpu`` and skipped without CUDA or without DALI; ``scripts/gpu_check.sh`` runs them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/gpu_check.sh on one"),
]
pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI: pip install 'trainer-switchboard[dali]'")

GPU = ["accelerator=gpu"]


def _jpeg_folder(root, classes=("a", "b", "c"), per_class=8, size=48):
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            x = np.linspace(0, 255, size + 4 * j)[None, :].repeat(size, 0)
            pixels = np.stack([x, np.full_like(x, 25 * j), np.full_like(x, 80 * i)], -1).astype(np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{j}.jpg", quality=95)
    return root


def test_the_mixed_decoder_hands_cuda_batches_with_the_cpu_pipelines_pixels(compose, tmp_path):
    from trainer.data import ImageDataModule

    root = _jpeg_folder(tmp_path / "imgs")
    args = ("data=imagefolder", f"data.root={root}", "data.loader=dali", "data.image_size=32", "data.batch_size=6")
    batches = {}
    for accelerator in ("cuda", "cpu"):
        cfg = compose(*args)
        dm = ImageDataModule(cfg.data, cfg.seed, accelerator=accelerator)
        dm.build()
        batches[accelerator] = next(iter(dm.val_dataloader()))
    (x, y), (ref_x, ref_y) = batches["cuda"], batches["cpu"]
    assert x.is_cuda and y.is_cuda and x.dtype == torch.float32 and x.shape == (6, 3, 32, 32), (x.device, y.device)
    assert torch.equal(y.cpu(), ref_y)
    assert float((x.cpu() - ref_x).abs().mean()) < 0.05  # nvJPEG and libjpeg-turbo differ by rounding


def test_dali_on_the_gpu_overlaps_the_step_of_a_compute_heavy_run(train, small_images):
    """DALI's queue holds the next batches while the step runs: the step loop barely waits for data."""
    m, _ = train(
        *GPU,
        "data=imagefolder",
        f"data.root={small_images}",
        "data.loader=dali",
        "data.auto_workers=true",
        "data.image_size=64",
        "data.batch_size=32",
        "model.width=96",
        "trainer.max_epochs=3",
        tiny=False,
    )
    assert m["status"] == "ok" and m["flags"]["data.loader"] == "dali", m.get("error")
    assert m["data_wait_fraction"] < 0.25 and m["diagnosis"]["bottleneck"] != "input pipeline", (
        m["epochs"],
        m["diagnosis"]["verdict"],
    )
