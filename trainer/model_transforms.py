"""The model-side flags, each applied by one function, in one order (as torchtitan's ``parallelize_*``).

The order, and why:

1. ``apply_activation_checkpointing`` (``activation_checkpointing=true``): wraps each repeated
   block's forward. First, so that whatever comes later (compile, FSDP) sees the checkpointed
   blocks. Under ``strategy=fsdp`` Lightning's FSDPStrategy checkpoints the blocks it wraps instead
   (``fsdp_checkpoint_policy``): checkpointing them twice would recompute twice.
2. ``apply_channels_last`` (``channels_last=true``): weights converted before any wrapper copies
   them (FSDP1 keeps the strides it finds when it flattens; FSDP2 refuses non-contiguous weights,
   so ``switchboard.resolve`` refuses that pair), and a pre-hook converts every 4-D input.
   The batch-size search runs after these two, on the eager model (``trainer.run``).
3. Data parallelism and sharding: Lightning's strategy wraps the model in ``Trainer.fit``
   (DDP; FSDP1 with ``fsdp_block_types``; FSDP2 by ``fully_shard`` in ``configure_model``).
4. ``apply_compile`` (``compile=true``) last, after wrapping: the documented order for FSDP2
   (``fully_shard`` then compile), and under DDP dynamo splits the graph at the gradient buckets
   only when it is compiled inside DDP's forward. ``CompileAfterSetup`` calls it from
   ``on_fit_start``, which Lightning runs after the strategy has set the model up. The compiler's
   per-process start-up is paid before that, in setup (``warm_up_compiler``), so that the first
   step's extra time (``compile_time_s``) is this job's graphs, in a sweep as alone.

Flags 2 and 4 act on the model's *networks*: the LightningModule's direct submodules that hold
parameters (the built-in classifier's ``net``; a user's own LightningModule's ``self.model``,
``self.backbone``, ...). Compiling the networks, not the LightningModule, keeps ``training_step``,
``self.log`` and the optimizer step out of the graph (dynamo would otherwise recompile Lightning's
``log`` once per metric name), works whether a ``training_step`` calls ``self(x)`` or
``self.net(x)``, and compiles in place (``nn.Module.compile``): checkpoint keys carry no
``_orig_mod.``.
"""

from __future__ import annotations

import logging
from typing import List

import pytorch_lightning as pl
import torch
from torch import nn

from .errors import ConfigError

log = logging.getLogger(__name__)


def networks(module: nn.Module) -> List[nn.Module]:
    """The LightningModule's direct submodules that hold parameters; the module itself if none does."""
    found = [child for child in module.children() if any(True for _ in child.parameters())]
    return found or [module]


# ---- 1. activation checkpointing


def fsdp_checkpoint_policy(cfg, block_types: set):
    """``strategy=fsdp``: the block types FSDPStrategy checkpoints itself (``apply_activation_checkpointing`` then does nothing)."""
    return block_types if (cfg.activation_checkpointing and block_types) else None


def apply_activation_checkpointing(module: nn.Module, cfg) -> int:
    """Checkpoint each repeated block (non-reentrant): its activations are recomputed in backward.

    The block's ``forward`` is wrapped in place, so state-dict keys do not change (checkpoints
    load with the flag on or off), and it composes with torch.compile. Returns the number of blocks.
    """
    if not cfg.activation_checkpointing or cfg.strategy == "fsdp":  # fsdp: see fsdp_checkpoint_policy
        return 0
    from torch.utils.checkpoint import checkpoint

    from .models.blocks import repeated_blocks

    blocks = repeated_blocks(module)
    if not blocks:
        raise ConfigError(
            f"'activation_checkpointing=true' found no repeated blocks to checkpoint in {type(module).__name__} "
            "(it looks for torchvision ResNet BasicBlock/Bottleneck, ViT EncoderBlock, or a 'blocks'/'layers' "
            "ModuleList, as in timm). Allowed: activation_checkpointing=false for this model."
        )
    for block in blocks:

        def forward(*args, _inner=block.forward, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)
            return _inner(*args, **kwargs)

        block.forward = forward
    log.info("activation checkpointing: %d blocks", len(blocks))
    return len(blocks)


# ---- 2. memory format


def _to_channels_last(module, args):
    return tuple(
        a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.ndim == 4 else a
        for a in args
    )


def apply_channels_last(module: nn.Module, cfg) -> None:
    if not cfg.channels_last:
        return
    module.to(memory_format=torch.channels_last)
    # inputs follow the weights: a pre-hook on each network converts whatever 4-D batch reaches it,
    # however a LightningModule's step calls it (and it runs inside the compiled region)
    for net in networks(module):
        net.register_forward_pre_hook(_to_channels_last)


def prepare_model(module: nn.Module, cfg) -> nn.Module:
    """Steps 1 and 2: what must happen before the batch-size search and before any wrapper."""
    apply_activation_checkpointing(module, cfg)
    apply_channels_last(module, cfg)
    return module


# ---- 4. compile


def apply_compile(module: nn.Module, cfg) -> List[str]:
    """``compile=true``: compile each network in place; return their names (for the log).

    The only place the product calls the compiler (tests/test_shape.py checks it).
    """
    if not cfg.compile:
        return []
    mode = None if cfg.compile_mode == "default" else cfg.compile_mode
    names = []
    for net in networks(module):
        net.compile(mode=mode)
        names.append(next((name for name, child in module.named_children() if child is net), type(net).__name__))
    return names


def warm_up_compiler(cfg, accelerator: str) -> None:
    """``compile=true``: pay the compiler's per-process start-up now, in setup, not in the first step.

    The first compile in a process also hashes torch's and Triton's sources, loads Inductor and its
    caches, and warms dynamo's tracing of common modules (about 2 s on a 2-core CPU). A later job
    of a local sweep finds all that done, so without this its ``compile_time_s`` read about a second
    shorter than the same job's run alone. A small conv net compiled forward and backward on the
    run's device, then forgotten (``torch.compiler.reset``), leaves only this job's graphs in the
    timed first step.
    """
    if not cfg.compile:
        return
    import os
    from types import SimpleNamespace

    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if accelerator == "cuda" else torch.device("cpu")
    )
    holder = nn.Module()  # its one network: the small conv net, compiled whole
    holder.net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)
    )
    holder.to(device)
    apply_compile(
        holder, SimpleNamespace(compile=True, compile_mode="default")
    )  # default mode: no autotuning of a throwaway net
    holder.net(torch.randn(2, 3, 8, 8, device=device)).sum().backward()
    torch.compiler.reset()


class CompileAfterSetup(pl.Callback):
    """Calls ``apply_compile`` once the strategy has wrapped or sharded the model (see step 4)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.compiled: List[str] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        if not self.compiled:
            self.compiled = apply_compile(pl_module, self.cfg)
            log.info("compile: %s compiled in place (compile_mode=%s)", ", ".join(self.compiled), self.cfg.compile_mode)
