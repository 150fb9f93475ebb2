"""What a run trains on: every ``data=`` format, the Lightning datamodule, decoders, augmentation,
samplers, the data's seeds, DALI, and ``pack`` (the converter behind ``python -m trainer.pack``).

May use: ``launch``, ``measure`` (what the machine is: ``data.auto_workers``), ``config`` and the base
modules; never ``models``, ``switches``, ``output``, ``report``, ``callbacks``, ``run`` or the commands.

``ImageDataModule`` is imported from here when first asked for, not with the package: ``python -m
trainer.pack``, ``data.storage`` and ``dali.installed`` are used before torch is, and the datamodule
imports torch and Lightning.
"""

__all__ = ["ImageDataModule"]


def __getattr__(name: str):
    if name == "ImageDataModule":
        from trainer.data.datamodule import ImageDataModule

        return ImageDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
