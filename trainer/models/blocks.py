"""Which submodules are a model's repeated blocks: the unit for FSDP wrapping and activation
checkpointing (ViT encoder blocks, ResNet bottleneck/basic blocks, timm ``blocks``)."""

from __future__ import annotations

from typing import List

from torch import nn


def repeated_blocks(model: nn.Module) -> List[nn.Module]:
    from torchvision.models.resnet import BasicBlock, Bottleneck
    from torchvision.models.vision_transformer import EncoderBlock

    known = (BasicBlock, Bottleneck, EncoderBlock)
    blocks = [m for m in model.modules() if isinstance(m, known)]
    if blocks:
        return blocks
    # timm and similar: a ModuleList/Sequential attribute named "blocks" or "layers"
    for name in ("blocks", "layers"):
        seq = getattr(model, name, None)
        if isinstance(seq, (nn.ModuleList, nn.Sequential)):
            return list(seq)
    return []
