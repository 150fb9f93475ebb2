"""Build the LightningModule from ``cfg.model``: anything Hydra can instantiate by ``_target_``.

- an ``nn.Module`` (torchvision, timm via ``timm.create_model``, your own class) is wrapped in
  ``ImageClassifier`` with the recipe's optimizer, schedule and loss;
- a ``LightningModule`` is trained as it is (it brings its own steps and optimizers).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from ..errors import ConfigError
from .classifier import ImageClassifier


def build_module(cfg) -> pl.LightningModule:
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    target = cfg.model.get("_target_")
    try:
        obj = instantiate(cfg.model, _convert_="all")
    except InstantiationException as e:
        cause = " ".join(line.strip() for line in str(e.__cause__ or e).splitlines() if line.strip())
        hint = " (timm models need: pip install timm)" if str(target).startswith("timm") else ""
        raise ConfigError(
            f"Could not build the model from 'model._target_={target}'{hint}: {cause}. "
            "model._target_ must name an importable nn.Module or LightningModule class (or a function returning one); "
            "the other model.* keys are passed to it as arguments."
        ) from None
    if isinstance(obj, pl.LightningModule):
        return obj
    if isinstance(obj, torch.nn.Module):
        compile_after_shard = cfg.compile_mode if (cfg.compile and cfg.strategy == "fsdp2") else None
        return ImageClassifier(obj, cfg.optim, cfg.sched, cfg.loss.label_smoothing, on_nan=cfg.on_nan, compile_mode=compile_after_shard)
    raise ConfigError(f"'model._target_={target}' built a {type(obj).__name__}, not an nn.Module or LightningModule.")
