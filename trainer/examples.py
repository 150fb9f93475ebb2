"""Templates for plugging in your own model: copy one into your own package and name it by
``model._target_`` (the README's commands use these, so they run as written).

- ``MyNet``: a plain ``nn.Module`` (images -> logits). The trainer wraps it with the config's
  optimizer, schedule and loss; its ``blocks`` are what ``activation_checkpointing`` and FSDP wrap.
- ``MyLightningModule``: a ``LightningModule`` of your own, trained as it is (its own steps and
  optimizer; no ``forward`` needed). Log ``val/acc`` and ``train/loss_epoch`` to see them in the
  A/B report.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn


class MyNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, depth: int = 2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
                for _ in range(depth)
            ]
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class MyLightningModule(pl.LightningModule):
    def __init__(self, num_classes: int = 10, lr: float = 0.05):
        super().__init__()
        self.net = MyNet(num_classes)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss_epoch", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
