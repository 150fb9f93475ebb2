"""Models: the LightningModule that trains any image classifier, a tiny CNN, and the builder."""

from trainer.models.build import build_module

__all__ = ["build_module"]
