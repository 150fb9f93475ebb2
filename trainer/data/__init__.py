"""What a run trains on: every ``data=`` format, the Lightning datamodule, decoders, augmentation,
samplers, the data's seeds, DALI, and ``pack`` (the converter behind ``python -m trainer.pack``).

May use: ``launch``, ``measure`` (what the machine is: ``data.auto_workers``), ``config`` and the base
modules; never ``models``, ``switches``, ``output``, ``report``, ``callbacks``, ``run`` or the commands.

This file imports nothing: ``python -m trainer.pack``, ``data.storage`` and ``dali.installed`` are used
before torch is (the datamodule is ``trainer.data.datamodule.ImageDataModule``).
"""
