"""``data.batch_size=auto``: the largest power-of-two batch whose real training step fits.

Why not Lightning's ``BatchSizeFinder``: it only detects CUDA out-of-memory errors, so on a CPU it
grows the batch until the dataset runs out (or the machine swaps), and it cannot respect a memory
budget. This search runs one real step per candidate (forward, backward and an optimizer step, so
optimizer state is counted) under the run's autocast dtype, measures the step's peak memory (CUDA:
max allocated; CPU: RSS high-water mark above the resting RSS), and stops at the first of:

- memory: the next doubling would exceed the budget (CPU: ``batch_finder.memory_budget_mb``, by
  default half of MemAvailable, extrapolated from the last step so that nothing too large is tried;
  CUDA: device memory less ``batch_finder.headroom``, or an out-of-memory error);
- dataset size: a batch larger than the training set;
- cap: ``batch_finder.max_batch_size``.

The model's weights and buffers are restored afterwards. Single-device only: under DDP/FSDP each
rank would search on its own, so those strategies are refused with a clear message.
"""

from __future__ import annotations

import copy
import logging
from typing import Tuple

import torch
import torch.nn.functional as F

from trainer.measure import memory
from trainer.models.optimizers import build_optimizer

log = logging.getLogger(__name__)


def find_batch_size(
    module: torch.nn.Module, datamodule, cfg, accelerator: str, amp_dtype: str | None
) -> Tuple[int, str]:
    """Return (batch size, why the search stopped)."""
    dataset = datamodule.train_set
    bf = cfg.batch_finder
    device = torch.device("cuda" if accelerator == "cuda" else "cpu")
    cap = min(bf.max_batch_size, len(dataset))
    cap_reason = "dataset size" if len(dataset) <= bf.max_batch_size else "cap (batch_finder.max_batch_size)"
    budget = _memory_budget_mb(bf, accelerator, device)
    saved = copy.deepcopy(module.state_dict())
    module.to(device).train()
    optimizer = build_optimizer(module, cfg.optim)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp_dtype or "")

    best, size, reason, last_peak = 0, max(1, bf.start), "", 0.0
    try:
        while True:
            if size > cap:
                reason = f"{cap_reason}: the next size, {size}, exceeds {cap}"
                break
            if accelerator != "cuda" and best and last_peak * size / best > budget:
                reason = (
                    f"memory: batch {size} would need about {last_peak * size / best:.0f} MB "
                    f"(from {last_peak:.0f} MB at {best}), over the {budget:.0f} MB budget"
                )
                break
            try:
                peak = _step_peak_mb(
                    module, optimizer, datamodule.example_batch(size, device), accelerator, autocast_dtype
                )
            except torch.OutOfMemoryError:
                reason = f"memory: batch {size} ran out of device memory"
                break
            if peak > budget:
                reason = f"memory: batch {size} needed {peak:.0f} MB, over the {budget:.0f} MB budget"
                break
            best, last_peak = size, peak
            size *= 2
    finally:
        optimizer.zero_grad(set_to_none=True)
        del optimizer
        module.load_state_dict(saved)
        if accelerator == "cuda":
            torch.cuda.empty_cache()
    if not best:
        best = 1
        reason += "; even the smallest batch did not fit the budget, using 1"
    log.info("data.batch_size=auto: chose %d (%s; peak %.0f MB at %d)", best, reason, last_peak, best)
    return best, reason


def _memory_budget_mb(bf, accelerator: str, device) -> float:
    """CUDA: the device's memory less the headroom; CPU: batch_finder.memory_budget_mb, else half of MemAvailable."""
    if accelerator == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20 * (1 - bf.headroom)
    return bf.memory_budget_mb or memory.mem_available_mb() / 2


def _step_peak_mb(module, optimizer, batch, accelerator: str, autocast_dtype) -> float:
    """One real training step (forward, backward, optimizer step) on ``batch``; its peak memory in MB."""
    x, y = batch
    probe = memory.PeakMemory(accelerator)
    probe.start()
    with torch.autocast(x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = F.cross_entropy(module(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if accelerator == "cuda":
        torch.cuda.synchronize()
    return probe.peak_mb()
