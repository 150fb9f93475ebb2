"""Which submodules are a model's repeated blocks: the unit for FSDP wrapping and activation
checkpointing (ViT encoder blocks, ResNet bottleneck/basic blocks, timm ``blocks``/``stages``).

Searched anywhere in the module tree (the model usually arrives wrapped in ``ImageClassifier``):

1. torchvision's own block classes;
2. the children of any ``ModuleList``/``Sequential`` named ``blocks`` or ``layers`` (timm ViT,
   ConvNeXt ``stages.N.blocks``, EfficientNet/MobileNet stages, one level of nesting flattened);
3. modules whose class name says they are blocks (``...Block``, ``Bottleneck``: timm ResNets).

Only the outermost matches are kept, so a block is never wrapped inside another block.
"""

from __future__ import annotations

from typing import List

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.models.vision_transformer import EncoderBlock

CONTAINER_NAMES = ("blocks", "layers")
BLOCK_CLASS_SUFFIXES = ("Block", "Bottleneck")


def repeated_blocks(model: nn.Module) -> List[nn.Module]:
    known = (BasicBlock, Bottleneck, EncoderBlock)
    blocks = [m for m in model.modules() if isinstance(m, known)]
    if not blocks:
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in CONTAINER_NAMES and isinstance(module, (nn.ModuleList, nn.Sequential)):
                for child in module.children():
                    # a stage (EfficientNet: blocks[i] is a Sequential of blocks) is flattened; a block
                    # that happens to be a Sequential of layers (conv, norm, act) is kept whole
                    grandchildren = list(child.children()) if isinstance(child, (nn.ModuleList, nn.Sequential)) else []
                    stage = grandchildren and all(any(True for _ in g.children()) for g in grandchildren)
                    blocks.extend(grandchildren if stage else [child])
    if not blocks:
        blocks = [m for m in model.modules() if type(m).__name__.endswith(BLOCK_CLASS_SUFFIXES)]
    return _outermost([b for b in blocks if any(p.requires_grad for p in b.parameters())])


def _outermost(blocks: List[nn.Module]) -> List[nn.Module]:
    inner = {id(m) for b in blocks for m in b.modules() if m is not b}
    seen, out = set(), []
    for b in blocks:
        if id(b) not in inner and id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out
