"""Optimizer and learning-rate schedule from config: SGD, AdamW or LAMB, linear warm-up then cosine.

Weight decay skips normalization layers and biases unless ``optim.norm_weight_decay`` /
``optim.bias_weight_decay`` say otherwise (torchvision's reference-script keys); LAMB is timm's. The schedule
steps per optimizer step, so it stays right under gradient accumulation and any epoch length.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

log = logging.getLogger(__name__)


NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


def param_groups(model: nn.Module, weight_decay: float, norm_weight_decay=0.0, bias_weight_decay=0.0):
    """Parameter groups by weight decay, as torchvision's reference script splits them: normalization
    layers' parameters (``optim.norm_weight_decay``), other biases (``optim.bias_weight_decay``; any
    other 1-d parameter, e.g. a layer scale, goes with them), everything else (``optim.weight_decay``).
    None means "as weight_decay".

    The groups: everything else first, then one group for norms and biases when their decays are
    equal (the defaults: the two groups this trainer always made, so older checkpoints' optimizer
    states still load), else one each. Parameters keep the model's order within a group."""
    norm_ids = {
        id(p)
        for m in model.modules()
        if isinstance(m, NORM_LAYERS) or type(m).__name__.endswith(("Norm", "Norm2d"))
        for p in m.parameters(recurse=False)
    }
    norm_wd = weight_decay if norm_weight_decay is None else norm_weight_decay
    bias_wd = weight_decay if bias_weight_decay is None else bias_weight_decay
    together = norm_wd == bias_wd
    groups = {"decay": [], "norm": [], "bias": []}
    for p in model.parameters():
        if p.requires_grad:
            kind = "norm" if id(p) in norm_ids else "bias" if p.ndim <= 1 else "decay"
            groups["norm" if together and kind == "bias" else kind].append(p)
    out = [
        {"params": groups["decay"], "weight_decay": weight_decay},
        {"params": groups["norm"], "weight_decay": norm_wd},
    ]
    return out if together else [*out, {"params": groups["bias"], "weight_decay": bias_wd}]


def _implementation(fused, on_cuda: bool = False) -> dict:
    """optim.fused -> optimizer kwargs. auto: the fused kernels on CUDA (torch's own choice there is
    foreach: several kernels over every parameter per step where the fused one makes one pass, with
    the same update; and under fp16 loss scaling torch's GradScaler reads the overflow flag on the
    host every step, a device sync, unless the optimizer is fused, which takes the flag on the
    device); torch's own choice elsewhere."""
    if fused is True or (fused == "auto" and on_cuda):
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


def _zero_momentum_for_fused_sgd(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Fused SGD with momentum: start every momentum buffer at zero, before the first step.

    torch's fused SGD makes its buffers with ``torch.empty_like`` at the first step and relies on
    the kernel to fill them (``buf = grad`` on that step); under a loss scaler the kernel returns
    without writing anything when the gradients overflowed, which fp16's first steps at scale 65536
    usually do. The buffers then hold whatever memory they were given, and the next step reads it
    as momentum: NaN weights (a ResNet-50 fp16 run on an H100 stopped at a NaN loss within ten steps).
    Zeros give the first real step exactly the stock update: ``momentum * 0 + (1 - dampening) *
    grad`` is ``grad`` with no dampening (this trainer never sets one). See also
    LibreYOLO/libreyolo#771.
    """
    for group in optimizer.param_groups:
        if not group.get("fused") or not group.get("momentum"):
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return optimizer


def _keep_zero_momentum(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Zero buffers now, and again after a checkpoint's optimizer state is loaded (Lightning loads it
    after the optimizer is built, and a state saved before the first step has no buffers)."""
    optimizer.register_load_state_dict_post_hook(_zero_momentum_for_fused_sgd)
    return _zero_momentum_for_fused_sgd(optimizer)


def build_optimizer(
    model: torch.nn.Module, cfg, loss_scaled_on_cuda: bool = False, on_cuda: bool = False
) -> torch.optim.Optimizer:
    """``on_cuda``: the parameters train on a CUDA device (optim.fused=auto picks the fused kernels);
    ``loss_scaled_on_cuda``: there, under fp16 loss scaling."""
    groups = param_groups(model, cfg.weight_decay, cfg.get("norm_weight_decay", 0.0), cfg.get("bias_weight_decay", 0.0))
    if cfg.name == "sgd":
        cls, kwargs = torch.optim.SGD, {"lr": cfg.lr, "momentum": cfg.momentum, "nesterov": cfg.nesterov}
    elif cfg.name == "adamw":
        cls, kwargs = torch.optim.AdamW, {"lr": cfg.lr, "betas": tuple(cfg.betas)}
    elif cfg.name == "lamb":
        # torch has no LAMB; timm's (the one "ResNet strikes back" trained with) has no fused kernel
        # (optim.fused: foreach or not is all it takes). Under fp16 loss scaling on CUDA a non-fused
        # optimizer makes torch's GradScaler read its overflow flag on the host every step: said.
        from timm.optim import Lamb

        if loss_scaled_on_cuda:
            log.warning(
                "optim.name=lamb has no fused kernel: under fp16 loss scaling the GradScaler reads its overflow "
                "flag on the host every step (a device sync). amp_dtype=bf16 needs no loss scaling."
            )
        fused = cfg.get("fused", "auto")
        foreach = {"foreach": fused == "foreach"} if fused in ("foreach", False) else {}
        return Lamb(groups, lr=cfg.lr, betas=tuple(cfg.betas), **foreach)
    else:
        raise ValueError(f"unknown optimizer {cfg.name}")  # config.validate rejects it earlier
    # sharded parameters (strategy=fsdp2's DTensors) keep torch's own choice under auto: not every
    # fused kernel has a sharding rule for them
    sharded = any(type(p).__name__ == "DTensor" for group in groups for p in group["params"])
    impl = _implementation(cfg.get("fused", "auto"), (on_cuda or loss_scaled_on_cuda) and not sharded)
    try:
        if impl.get("fused"):
            _check_fused(groups)
        optimizer = cls(groups, **kwargs, **impl)
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
    return _keep_zero_momentum(optimizer)


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float = 0.0, decay: str = "cosine"):
    """LR multiplier: linear warm-up from ~0 to 1, then down to ``min_ratio`` along a half cosine
    (``decay="cosine"``) or a straight line (``"linear"``: with the warm-up, FFCV's triangular schedule)."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        left = 1 - progress if decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return min_ratio + (1 - min_ratio) * left

    return factor


def build_scheduler(optimizer, cfg, total_steps: int, max_epochs: int):
    if cfg.name == "constant":
        return None
    warmup_steps = int(round(cfg.warmup_epochs * total_steps / max(1, max_epochs)))
    lam = warmup_cosine(total_steps, warmup_steps, cfg.min_lr_ratio, decay=cfg.name)
    return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lam), "interval": "step"}
