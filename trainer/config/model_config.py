"""``model._target_=X`` on the command line replaces the model, not just its class.

Hydra merges an override into the composed node, so ``model._target_=timm.create_model`` kept the
default model's ``width: 16`` and the new class got an argument it does not take. Here, when the
command line names a new ``model._target_``, the model node becomes exactly what the command line
gives (``model.KEY=...`` and ``+model.KEY=...``) plus ``num_classes: ${data.num_classes}``; at build
time ``num_classes`` is passed only to a class or function that takes it (``build_module``).
A recipe or model group entry is untouched when the command line does not retarget it.
"""

from __future__ import annotations

from typing import Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict


def replace_retargeted_model(cfg: DictConfig, overrides: Iterable[str]) -> DictConfig:
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if not any(ov.key_or_group == "model._target_" and not ov.is_delete() for ov in parsed):
        return cfg
    given = [
        ov.key_or_group.split(".")[1] for ov in parsed if ov.key_or_group.startswith("model.") and not ov.is_delete()
    ]
    current = OmegaConf.to_container(cfg.model, resolve=False)
    model = {key: current[key] for key in dict.fromkeys(given) if key in current}
    model.setdefault("num_classes", "${data.num_classes}")
    out = cfg.copy()
    with open_dict(out):
        out.model = OmegaConf.create(model)
    return out
