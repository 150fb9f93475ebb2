"""How far from the limit: the model's FLOPs per training sample, and the device's peak.

FLOPs are counted once per run with Lightning's ``measure_flops`` (torch's ``FlopCounterMode``) on a
copy of the model built on the meta device: no memory, no compute, about the cost of building the
model. It counts matmuls and convolutions of one forward and backward (of two samples, halved:
BatchNorm refuses a batch of one), per sample (elementwise ops, norms and the optimizer step are
not counted, as in the usual MFU convention). The peak comes
from Lightning's ``get_available_flops`` table (CUDA GPUs it knows, per dtype); on a CPU or an
unknown GPU there is no peak and MFU is null.
"""

from __future__ import annotations

import logging
import warnings
from typing import Optional

log = logging.getLogger(__name__)


def training_flops_per_sample(cfg) -> Optional[float]:
    """Forward + backward FLOPs of one sample of ``cfg``'s model, or None where they cannot be counted."""
    import torch
    from lightning_fabric.utilities.throughput import measure_flops

    from .models import build_module

    size = cfg.data.image_size
    batch = 2  # not 1: BatchNorm in training mode refuses one value per channel (ResNet's last 1x1 maps)
    try:
        with torch.device("meta"):
            module = build_module(cfg)
            x = torch.empty(batch, 3, size, size)
        return float(measure_flops(module, lambda: module(x), lambda y: y.float().sum())) / batch
    except Exception as e:  # a model that cannot be built or run on meta (loads files, no forward, ...)
        log.info("FLOPs not counted (%s: %s): tflops and mfu stay null", type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
        return None


def _dtype(precision: str):
    import torch

    if str(precision).startswith("bf16"):
        return torch.bfloat16
    if str(precision).startswith("16"):
        return torch.float16
    return torch.float32  # Lightning's table turns this into tfloat32 where TF32 matmuls are on


def peak_flops(accelerator: str, precision: str) -> Optional[float]:
    """One device's theoretical peak FLOP/s for this precision, or None (CPU, unknown GPU)."""
    if accelerator != "cuda":
        return None
    import torch
    from lightning_fabric.utilities.throughput import get_available_flops

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "FLOPs not found for ...": said once, in metrics.json's null
        peak = get_available_flops(torch.device("cuda", torch.cuda.current_device()), _dtype(precision))
    return float(peak) if peak else None


def mfu(tflops: Optional[float], peak: Optional[float], devices: int) -> Optional[float]:
    """Achieved / peak over all devices of the run."""
    if not tflops or not peak:
        return None
    return round(tflops * 1e12 / (peak * max(1, devices)), 4)
