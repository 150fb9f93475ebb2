"""What a run trains on: every ``data=`` format, the Lightning datamodule and its loader objects
(``loaders``), decoders, augmentation, samplers, the data's seeds, DALI, and ``pack`` (the converter
behind ``python -m trainer.pack``).

May use: ``console``, ``measure`` (what the machine is: ``data.auto_workers``), ``config`` and the base
modules; never ``launch``, ``callbacks``, ``run`` (a contract in pyproject.toml), ``models``, ``switches``,
``doctor``, ``tracking``, ``report`` or the commands: the data is used on its own too.

``ImageDataModule`` is imported from here when first asked for, not with the package: ``python -m
trainer.pack`` and ``data.storage`` are used before torch is, and the datamodule imports torch and
Lightning.
"""

__all__ = ["ImageDataModule"]


def __getattr__(name: str):
    if name == "ImageDataModule":
        from trainer.data.datamodule import ImageDataModule  # lazy: no torch before a job starts

        return ImageDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
