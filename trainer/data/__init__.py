"""What a run trains on: every ``data=`` format, the Lightning datamodule, decoders, augmentation,
samplers, the data's seeds, DALI, and ``pack`` (the converter behind ``python -m trainer.pack``).

May use: ``launch``, ``measure`` (what the machine is: ``data.auto_workers``), ``config`` and the base
modules; never ``models``, ``switches``, ``output``, ``report``, ``callbacks``, ``run`` or the commands.
"""

from trainer.data.datamodule import ImageDataModule

__all__ = ["ImageDataModule"]
