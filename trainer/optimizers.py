"""Optimizer and learning-rate schedule from config: SGD or AdamW, linear warm-up then cosine.

Weight decay skips biases and normalization weights (the usual recipe practice). The schedule
steps per optimizer step, so it stays right under gradient accumulation and any epoch length.
"""

from __future__ import annotations

import logging
import math

import torch

log = logging.getLogger(__name__)


def param_groups(model: torch.nn.Module, weight_decay: float):
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _implementation(fused, loss_scaled_on_cuda: bool = False) -> dict:
    """optim.fused -> optimizer kwargs: auto leaves torch's own choice, except under fp16 loss scaling
    on CUDA: there torch's GradScaler reads the overflow flag on the host every step (a device
    sync) unless the optimizer is fused, which takes the flag on the device."""
    if fused is True or (fused == "auto" and loss_scaled_on_cuda):
        return {"fused": True}
    if fused == "foreach":
        return {"foreach": True}
    if fused is False:
        return {"foreach": False, "fused": False}
    return {}


def _check_fused(groups) -> None:
    """Ask now what torch only checks at the first ``step()``: can every parameter use the fused kernel?

    Without this the fallback below could never run: the optimizer builds fine and the run dies at
    its first step instead.
    """
    try:
        from torch.optim.optimizer import _device_dtype_check_for_fused
    except ImportError:  # a torch without the check: the first step() will say it
        return
    for group in groups:
        for p in group["params"] if isinstance(group, dict) else [group]:
            _device_dtype_check_for_fused(p)


def build_optimizer(model: torch.nn.Module, cfg, loss_scaled_on_cuda: bool = False) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "sgd":
        cls, kwargs = torch.optim.SGD, {"lr": cfg.lr, "momentum": cfg.momentum, "nesterov": cfg.nesterov}
    elif cfg.name == "adamw":
        cls, kwargs = torch.optim.AdamW, {"lr": cfg.lr, "betas": tuple(cfg.betas)}
    else:
        raise ValueError(f"unknown optimizer {cfg.name}")  # config.validate rejects it earlier
    impl = _implementation(cfg.get("fused", "auto"), loss_scaled_on_cuda)
    try:
        if impl.get("fused"):
            _check_fused(groups)
        return cls(groups, **kwargs, **impl)
    except (RuntimeError, ValueError) as e:
        if not impl.get("fused"):
            raise
        log.warning(
            "optim.fused=%s: %s has no fused kernel for these parameters (%s); using foreach instead",
            cfg.get("fused", "auto"),
            cls.__name__,
            e,
        )
        return cls(groups, **kwargs, foreach=True)


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float = 0.0):
    """LR multiplier: linear warm-up from ~0 to 1, then cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_scheduler(optimizer, cfg, total_steps: int, max_epochs: int):
    if cfg.name == "constant":
        return None
    warmup_steps = int(round(cfg.warmup_epochs * total_steps / max(1, max_epochs)))
    lam = warmup_cosine(total_steps, warmup_steps, cfg.min_lr_ratio)
    return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lam), "interval": "step"}
