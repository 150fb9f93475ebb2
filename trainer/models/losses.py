"""The training loss (``loss.*``): softmax cross-entropy or a sigmoid per class (BCE), on class
indices or on the soft targets that mixup and cutmix make.

Cross-entropy is torch's own, which takes class probabilities and label smoothing as they are.
BCE follows timm's ``BinaryCrossEntropy`` (the loss of "ResNet strikes back"): index targets become
one-hot, label smoothing spreads ``label_smoothing`` over all classes as cross-entropy does, and
``loss.bce_target_threshold`` turns the (mixed) targets above it into 1 and the rest into 0.
Validation's ``val/loss`` is cross-entropy whatever trains, so runs stay comparable.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


class TrainingLoss:
    def __init__(
        self, name: str = "cross_entropy", label_smoothing: float = 0.0, bce_target_threshold: Optional[float] = None
    ):
        self.name = name
        self.label_smoothing = float(label_smoothing)
        self.bce_target_threshold = bce_target_threshold

    @classmethod
    def of(cls, loss_cfg) -> "TrainingLoss":
        get = loss_cfg.get
        return cls(get("name", "cross_entropy"), get("label_smoothing", 0.0), get("bce_target_threshold"))

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.name == "cross_entropy":
            return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        num_classes = logits.shape[-1]
        if targets.ndim == 1:
            targets = F.one_hot(targets, num_classes)  # num_classes given: no device sync on CUDA
        targets = targets.float()  # soft targets kept in fp32 under amp (autocast computes BCE in fp32)
        if self.label_smoothing > 0:
            targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / num_classes
        if self.bce_target_threshold is not None:
            targets = targets.gt(self.bce_target_threshold).float()
        return F.binary_cross_entropy_with_logits(logits, targets)
