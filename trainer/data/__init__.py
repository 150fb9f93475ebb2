"""Data: datasets (synthetic, image folders, the built-in JPEG set) and the Lightning datamodule."""

from trainer.data.datamodule import ImageDataModule

__all__ = ["ImageDataModule"]
