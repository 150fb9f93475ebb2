"""``scale=smoke``: shrink any recipe so that it runs on a laptop CPU in about a minute.

Why this is not a plain Hydra config group: ``+recipe=NAME`` is appended to the end of the defaults
list, so a recipe's values would always beat a ``scale/*.yaml`` file composed before it, and Hydra
only lets a defaults list interpolate choices from its own list. So the ``scale`` group only
selects a set of overrides (``scale.overrides``, plus the recipe's own ``scales.<name>`` block, e.g.
a narrower ViT); they are merged after composition, and the command line is applied again on
top, giving the precedence a user expects: recipe < scale < command line.
"""

from __future__ import annotations

from typing import Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from trainer.config.schema import GROUPS


def apply_scale(cfg: DictConfig, cli_overrides: Iterable[str]) -> DictConfig:
    """Return ``cfg`` with its scale's overrides merged in and the command line re-applied."""
    name = cfg.scale.name
    layers = [cfg.scale.overrides or {}, (cfg.get("scales") or {}).get(name) or {}]
    if not any(len(layer) for layer in layers):
        return cfg
    scaled = cfg.copy()
    with open_dict(scaled):
        for layer in layers:
            scaled.merge_with(OmegaConf.create(OmegaConf.to_container(OmegaConf.create(layer))))
        reapply_cli(scaled, cli_overrides)
    return scaled


def reapply_cli(cfg: DictConfig, overrides: Iterable[str]) -> None:
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.key_or_group
        if ov.is_hydra_override() or key in GROUPS or ov.is_delete() or ov.is_sweep_override():
            continue
        OmegaConf.update(cfg, key, ov.value(), merge=False)
