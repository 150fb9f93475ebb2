"""How a schema key is declared: ``key()``, the three kinds of flag, and the range predicates of several keys.

Everything said about a key sits in its one dataclass field: its default, its help text, its allowed
values or range, and the kind of flag metrics.json records it as. The trainer's tables (``tables``)
and ``train.py --help`` are derived from those fields, so no key is described in two places.
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Optional

OPTIMIZATION = "optimization"  # a switch that changes how fast the same training runs (SPEC's switchboard)
SETTING = "setting"  # a run setting the A/B report compares too (devices, batch size, workers, profile)
RECIPE = "recipe"  # a recipe's ingredient: changes what is learned (augmentation, regularization, optimizer)


def key(
    default: Any = None,
    help: str = "",
    *,
    choices: tuple = (),
    check: tuple = (),
    flag: str = "",
    lightning: Optional[str] = None,
    factory: Any = None,
) -> Any:
    """A schema field and everything said about it, in one place: its default, its help text, its
    allowed values (``choices``) or range (``check``: a predicate and what it allows), and whether
    it is a flag metrics.json records (``flag``: OPTIMIZATION, SETTING or RECIPE); under ``trainer.``, the
    Lightning Trainer argument it is passed as (``lightning``: "" for none). CHOICES, RANGES,
    FLAG_KEYS, the Trainer's arguments and ``train.py --help`` are derived from these."""
    metadata = {"help": help, "choices": tuple(choices), "check": tuple(check), "flag": flag}
    if lightning is not None:
        metadata["lightning"] = lightning
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def is_positive(v) -> bool:
    return math.isfinite(v) and v > 0


def is_non_negative(v) -> bool:
    return math.isfinite(v) and v >= 0


def is_fraction(v) -> bool:
    return 0 <= v <= 1
