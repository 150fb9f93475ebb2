"""What is trained: the model built from ``model=`` (``build``), the LightningModule that trains any image
classifier (``classifier``), its losses and regularization, its optimizers and schedules (``optimizers``),
and a tiny CNN for tests and the demo (``tiny``; ``trainer.models.tiny.TinyCNN`` is a documented ``_target_``).

May use: ``data`` (the batch mixing and the data's seeds), ``measure``, ``config`` and the base
modules; never ``launch``, ``callbacks``, ``run`` (a contract in pyproject.toml), ``switches``,
``report`` or the commands.
"""

from trainer.models.build import build_module

__all__ = ["build_module"]
