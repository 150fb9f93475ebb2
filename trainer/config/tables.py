"""The tables derived from the schema's fields, which the rest of the trainer reads.

Every dotted key with its type (``SCHEMA_KEYS``) and its field (``SCHEMA_FIELDS``); the allowed
values (``CHOICES``) and ranges (``RANGES``) the checks enforce; the flags metrics.json records, in
the A/B report's column order (``FLAG_KEYS``), and their three kinds for ``train.py --help``; the
``trainer.`` section as Lightning Trainer arguments; a key's help. All are computed at import from
what ``keys.key`` put in the fields, so none is a second list to keep in step with the schema.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, Dict

from trainer.config.keys import OPTIMIZATION, RECIPE, SETTING
from trainer.config.schema import TrainSchema
from trainer.config.schema_sections import TrainerConfig


def _schema_keys(cls=TrainSchema, prefix: str = "") -> Dict[str, Any]:
    """Every dotted key of the schema -> its field type (dataclass fields recurse)."""
    keys: Dict[str, Any] = {}
    for f in fields(cls):
        key = prefix + f.name
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            keys[key] = type(default)
            keys.update(_schema_keys(type(default), key + "."))
        else:
            keys[key] = f.type
    return keys


SCHEMA_KEYS = _schema_keys()


def _schema_fields(cls=TrainSchema, prefix: str = ""):
    """(dotted key, dataclass field) for every leaf key of the schema, in declaration order."""
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            yield from _schema_fields(type(default), prefix + f.name + ".")
        else:
            yield prefix + f.name, f


SCHEMA_FIELDS = dict(_schema_fields())
# Derived from the fields' metadata (see ``key``): key -> allowed values; key -> (predicate, what is allowed)
CHOICES: Dict[str, tuple] = {k: f.metadata["choices"] for k, f in SCHEMA_FIELDS.items() if f.metadata.get("choices")}
RANGES: Dict[str, tuple] = {k: f.metadata["check"] for k, f in SCHEMA_FIELDS.items() if f.metadata.get("check")}
# metrics.json's ``flags`` (compared by the A/B report, whose columns follow this order): the
# top-level switches, then the optimizer's, the data's and the runtime's, each in declaration order;
# then the recipe's ingredients in the same order of sections
_FLAG_SECTIONS = ("", "optim", "loss", "data", "runtime")
FLAG_KEYS = tuple(
    sorted(
        (k for k, f in SCHEMA_FIELDS.items() if f.metadata.get("flag")),
        key=lambda k: (SCHEMA_FIELDS[k].metadata["flag"] == RECIPE, _FLAG_SECTIONS.index(k.rpartition(".")[0])),
    )
)
# the two kinds, for ``train.py --help``: what makes the same training faster, and what the run is
OPTIMIZATION_FLAGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == OPTIMIZATION)
RUN_SETTINGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == SETTING)
RECIPE_FLAGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == RECIPE)


def lightning_trainer_args(trainer_cfg) -> Dict[str, Any]:
    """The ``trainer.`` keys as Lightning Trainer keyword arguments (a field's ``lightning`` name, "" for none)."""
    args = {}
    for f in fields(TrainerConfig):
        name = f.metadata.get("lightning", f.name)
        if name:
            args[name] = trainer_cfg[f.name]
    return args


def help_text(key: str) -> str:
    field_ = SCHEMA_FIELDS.get(key)
    return field_.metadata.get("help", "") if field_ is not None else ""
