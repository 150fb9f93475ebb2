"""Recipe ingredients that change the network itself, applied once it is built (``build_module``):
stochastic depth (``drop_path_rate``) and residual branches that start at zero
(``zero_init_residual``).

Both act on the model's residual blocks (``blocks.repeated_blocks``), by what each library's block
is: torchvision's ResNet blocks and ViT encoder blocks, and timm's blocks, which carry their own
``drop_path`` modules and ``zero_init_last``. Stochastic depth drops a block's residual branch per
sample (torchvision's ``stochastic_depth``, "row" mode; timm's ``DropPath`` in timm's blocks), at
``drop_path_rate x i / (n - 1)`` for the i-th of n blocks (DeiT's and timm's linear rule), in
training only. On torchvision blocks it is a forward hook on the branch's last module, so the
weights' names (checkpoints) do not change. A model with no block of these kinds is refused with
what to do instead.
"""

from __future__ import annotations

import functools
from typing import List

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.models.vision_transformer import EncoderBlock
from torchvision.ops import stochastic_depth

from trainer.errors import ConfigError
from trainer.models.blocks import repeated_blocks


def _branch_ends(block: nn.Module) -> List[nn.Module]:
    """The last module of each residual branch of a torchvision block (its output is added to the skip)."""
    if isinstance(block, Bottleneck):
        return [block.bn3]
    if isinstance(block, BasicBlock):
        return [block.bn2]
    if isinstance(block, EncoderBlock):
        return [block.dropout, block.mlp]  # attention's branch ends in its dropout; then the MLP's
    return []


def _drop_branch(rate: float, module: nn.Module, inputs, output):
    return stochastic_depth(output, rate, "row", training=module.training)


def _timm_drop_paths(block: nn.Module) -> List[str]:
    """timm's blocks keep their drop-path modules as attributes (an Identity, or None in its ResNets, at rate 0)."""
    return [name for name in ("drop_path", "drop_path1", "drop_path2") if hasattr(block, name)]


def apply_drop_path(net: nn.Module, rate: float, what: str = "the model") -> int:
    """Stochastic depth on every residual block of ``net``; returns how many blocks got it."""
    blocks = [b for b in repeated_blocks(net) if _branch_ends(b) or _timm_drop_paths(b)]
    if not blocks:
        raise ConfigError(
            f"drop_path_rate={rate}: {what} has no residual block this trainer can drop (torchvision's ResNet and "
            "ViT blocks, timm's blocks). Set drop_path_rate=0, or pass the model's own argument (timm: "
            "+model.drop_path_rate=...)."
        )
    n = len(blocks)
    for i, block in enumerate(blocks):
        block_rate = rate * i / (n - 1) if n > 1 else rate
        if block_rate <= 0:
            continue
        for end in _branch_ends(block):
            end.register_forward_hook(functools.partial(_drop_branch, block_rate))
        for name in _timm_drop_paths(block):
            from timm.layers import DropPath  # lazy: timm is imported only where it is used

            setattr(block, name, DropPath(block_rate))
    return n


def zero_init_residual(net: nn.Module, what: str = "the model") -> int:
    """Each residual block's last normalization weight set to 0 (the block starts as the identity);
    returns how many blocks were set."""
    done = 0
    for block in repeated_blocks(net):
        if isinstance(block, Bottleneck):
            nn.init.zeros_(block.bn3.weight)
        elif isinstance(block, BasicBlock):
            nn.init.zeros_(block.bn2.weight)
        elif callable(getattr(block, "zero_init_last", None)):  # timm's ResNet blocks
            block.zero_init_last()
        else:
            continue
        done += 1
    if not done:
        raise ConfigError(
            f"zero_init_residual=true: {what} has no residual block ending in a normalization layer this trainer "
            "knows (torchvision's and timm's ResNet blocks). Set zero_init_residual=false for this model."
        )
    return done
