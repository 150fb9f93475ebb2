"""How far from the limit: the model's FLOPs per training sample, and the device's peak.

FLOPs are counted once per run with Lightning's ``measure_flops`` (torch's ``FlopCounterMode``) on a
copy of the run's model whose parameters and buffers are on the meta device (``meta_copy``): no
memory, no compute, and the model is not built again (its modules are copied, its weights are not).
It counts matmuls and convolutions of one forward and backward (of two samples, halved: BatchNorm
refuses a batch of one), per sample (elementwise ops, norms and the optimizer step are not counted,
as in the usual MFU convention). The peak is the datasheet's dense figure for the precision that
runs (fp32, TF32 with tf32=true, bf16, fp16): our own table for the H100 and H200 (SXM, PCIe, NVL),
Lightning's ``get_available_flops`` for other CUDA GPUs; on a CPU or a GPU neither knows, MFU is
null and ``peak_flops_source`` says "unknown".
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any, Callable, Optional, Tuple

import torch
from lightning_fabric.utilities.throughput import get_available_flops, measure_flops

log = logging.getLogger(__name__)


def meta_copy(module):
    """A copy of ``module`` whose parameters and buffers are empty tensors on the meta device: its
    structure, hooks and forward as they are, none of its memory."""
    memo = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


def training_flops_per_sample(module, size: int, rebuild: Optional[Callable[[], Any]] = None) -> Optional[float]:
    """Forward + backward FLOPs of one ``size`` x ``size`` sample through ``module`` (the run's own
    model, counted on a ``meta_copy``: measuring builds no model of its own), or None where they
    cannot be counted. ``rebuild``: the run's builder, for a model that cannot be copied (a user's
    module holding a lock or an open file): built on the meta device then."""
    batch = 2  # not 1: BatchNorm in training mode refuses one value per channel (ResNet's last 1x1 maps)
    try:
        try:
            meta = meta_copy(module).train()
        except Exception:  # not copyable (deepcopy refuses some state): built afresh, on meta
            if rebuild is None:
                raise
            with torch.device("meta"):
                meta = rebuild().train()
        x = torch.empty(batch, 3, size, size, device="meta")
        return float(measure_flops(meta, lambda: meta(x), lambda y: y.float().sum())) / batch
    except Exception as e:  # a model that cannot be copied or run on meta (loads files, no forward, ...)
        log.info(
            "FLOPs not counted (%s: %s): tflops and mfu stay null",
            type(e).__name__,
            str(e).splitlines()[0][:160] if str(e) else "",
        )
        return None


# Dense (no sparsity) peak FLOP/s of one GPU, from NVIDIA's datasheets, by the name torch reports.
# Lightning's table (used for the GPUs not listed here) misses the H200 by its torch name
# ("NVIDIA H200") and lists the H200 and H100 NVL with sparse or two-GPU figures.
# Keys: "fp32" (plain fp32, tf32=false), "tf32" (fp32 matmuls on tensor cores, tf32=true), "bf16", "fp16".
_HOPPER = {
    "H100 SXM": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H100 PCIe": {"fp32": 51.2e12, "tf32": 378.0e12, "bf16": 756.0e12, "fp16": 756.0e12},
    "H100 NVL": {"fp32": 60.0e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "H200 SXM": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "H200 NVL": {"fp32": 60.0e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
}


def hopper_model(device_name: str) -> Optional[str]:
    """Which H100/H200 a torch device name is ("NVIDIA H100 80GB HBM3" -> "H100 SXM"), else None."""
    name = device_name.upper()
    if "GH200" in name:
        return "H100 SXM"  # Grace Hopper's GPU is an H100 (SXM figures)
    for chip in ("H200", "H100"):
        if chip in name:
            if "NVL" in name:
                return f"{chip} NVL"
            if "PCIE" in name:
                return f"{chip} PCIe"
            return f"{chip} SXM"  # "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    return None


def precision_key(precision: str, tf32: bool) -> str:
    if str(precision).startswith("bf16"):
        return "bf16"
    if str(precision).startswith("16"):
        return "fp16"
    return "tf32" if tf32 else "fp32"


def peak_flops(accelerator: str, precision: str, tf32: bool = False) -> Tuple[Optional[float], str]:
    """(one device's dense peak FLOP/s for this precision, where the figure comes from): None and
    "unknown: ..." on a CPU or a GPU neither table knows."""
    key = precision_key(precision, tf32)
    if accelerator != "cuda":
        return None, "unknown: no peak FLOP/s for CPUs"

    name = torch.cuda.get_device_name(torch.cuda.current_device())
    model = hopper_model(name)
    if model:
        return _HOPPER[model][key], f"{model} datasheet, dense {key}"

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(key, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "FLOPs not found for ...": said in peak_flops_source instead
        peak = get_available_flops(torch.device("cuda", torch.cuda.current_device()), dtype)
    if peak:
        return float(peak), f"Lightning's table ({key})"
    return None, f"unknown: no peak FLOP/s known for {name} at {key}"


def mfu(tflops: Optional[float], peak: Optional[float], devices: int) -> Optional[float]:
    """Achieved / peak over all devices of the run."""
    if not tflops or not peak:
        return None
    return round(tflops * 1e12 / (peak * max(1, devices)), 4)
