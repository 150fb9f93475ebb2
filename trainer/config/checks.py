"""Every check on user input: the command line before Hydra composes it, the composed config before a run.

The schema sits first in ``configs/train.yaml``'s defaults list, so Hydra itself rejects unknown
keys and wrong types. Hydra's own messages for those are terse and come with a hint about
HYDRA_FULL_ERROR, so ``check_overrides`` looks at the command line first and explains the mistake
in one paragraph (the key, what is allowed, the closest valid key). ``validate`` then checks ranges
and combinations on the composed config, where the hardware is known.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import is_dataclass
from typing import Any, Callable, List, Optional

from trainer.config.schema import GROUPS, TrainSchema
from trainer.config.tables import CHOICES, RANGES, SCHEMA_KEYS
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

# Open nodes: any key below them is allowed (model kwargs, scale overrides).
OPEN_PREFIXES = (
    "model.",
    "scale.overrides.",
    "scales.",
    "data.dataset.",
    "data.val_dataset.",
    "data.storage_options.",
    "tune.extra.",
    "logger.",
)
SECTIONS = sorted({k.split(".")[0] for k in SCHEMA_KEYS if "." in k} | {"model", "scales"})
TOP_LEVEL_FLAGS = [k for k in SCHEMA_KEYS if "." not in k and k not in SECTIONS and k not in GROUPS]


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(SCHEMA_KEYS), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_key_message(key: str) -> str:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    if parent and parent in SCHEMA_KEYS:
        siblings = sorted(
            k.split(".")[-1] for k in SCHEMA_KEYS if k.startswith(parent + ".") and k.count(".") == key.count(".")
        )
        allowed = f"Keys under '{parent}': {', '.join(siblings)}."
    else:
        allowed = f"Top-level flags: {', '.join(TOP_LEVEL_FLAGS)}; sections: {', '.join(SECTIONS)}."
    return (
        f"Unknown config key '{key}'.{_suggest(key)} {allowed} "
        "To add a key the schema does not know (for example an argument of your own model), "
        "put it under model. (model.my_arg=3)."
    )


def check_overrides(
    overrides: List[str], recipes: List[str], group_options: Optional[Callable[[str], List[str]]] = None
) -> None:
    """Check command-line overrides against the schema before Hydra composes anything.

    Raises ConfigError for an unknown key, a value of the wrong type, a value outside its allowed
    set or range, an unknown recipe, or (given ``group_options``: a config group's options) an
    unknown option of a config group. Sweep values (``amp=false,true``) are checked one by one.
    """
    # lazy: keeps hydra and omegaconf out of train.py's start-up
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:  # grammar errors: unbalanced quotes and the like
        raise ConfigError(f"Could not parse the command line: {str(e).splitlines()[0]}") from None
    schema = OmegaConf.structured(TrainSchema)
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_hydra_override() or key.startswith("hydra"):
            continue
        try:
            values = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
        except HydraException:
            continue  # glob(...) over a group: only Hydra's config loader can list its matches
        if key == "recipe":
            for v in values:
                if v not in recipes:
                    raise ConfigError(
                        f"Unknown recipe '{v}' (recipe={v}). Available recipes: {', '.join(recipes)}. "
                        "Recipes are the YAML files in recipes/; select one with +recipe=NAME."
                    )
            continue
        if key in GROUPS:
            if group_options is not None and not ov.is_delete():
                _check_group_choice(key, values, group_options(key))
            continue
        if ov.is_delete():
            continue
        if key not in SCHEMA_KEYS and not key.startswith(OPEN_PREFIXES):
            raise ConfigError(unknown_key_message(key))
        if key.startswith(OPEN_PREFIXES):
            continue
        for v in values:
            try:
                OmegaConf.update(schema, key, v, merge=True)
            except OmegaConfBaseException as e:
                expected = _type_name(SCHEMA_KEYS[key])
                raise ConfigError(
                    f"Bad value for '{key}': {v!r} is not {expected}. "
                    f"{allowed_values(key)}(OmegaConf said: {str(e).splitlines()[0]})"
                ) from None
            _check_value(key, v)


def _check_group_choice(group: str, values: List[Any], options: List[str]) -> None:
    """``data=foo``: Hydra's answer was its own error text (its search path, HYDRA_FULL_ERROR) and exit code 1."""
    if not options:
        return
    for value in values:
        for choice in value if isinstance(value, list) else [value]:
            if choice is None:
                none = " (logger=[] turns every tracker off)" if group == "logger" else ""
                raise ConfigError(f"'{group}=null': choose one of {', '.join(options)}{none}.")
            if str(choice) not in options:
                close = difflib.get_close_matches(str(choice), options, n=1)
                hint = f" Did you mean '{group}={close[0]}'?" if close else ""
                raise ConfigError(
                    f"Unknown {group} '{choice}' ({group}={choice}). Available: {', '.join(options)}.{hint}"
                )


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", str(tp)).replace("typing.", "")
    if name.startswith("Optional["):
        return _type_name(name[len("Optional[") : -1]) + " or null"
    return {"bool": "a boolean (true or false)", "int": "an integer", "float": "a number", "str": "a string"}.get(
        name, f"of type {name}"
    )


def allowed_values(key: str) -> str:
    if key in CHOICES:
        return f"Allowed values: {', '.join(map(str, CHOICES[key]))}. "
    tp = SCHEMA_KEYS.get(key)
    if tp in (bool, "bool"):
        return "Allowed values: true, false. "
    return ""


def _check_value(key: str, value: Any) -> None:
    if key in CHOICES and (
        value not in CHOICES[key] or (isinstance(value, bool) and not any(c is value for c in CHOICES[key]))
    ):
        allowed = ", ".join(str(c).lower() if isinstance(c, bool) else c for c in CHOICES[key])
        raise ConfigError(f"Bad value for '{key}': {value!r}. Allowed values: {allowed}.")
    if key in RANGES and value is not None and not isinstance(value, str):
        ok, what = RANGES[key]
        if not ok(value):
            raise ConfigError(f"Bad value for '{key}': {value!r}. It must be {what}.")
    if key == "data.batch_size" and (isinstance(value, bool) or not (value == "auto" or isinstance(value, int))):
        raise ConfigError(
            f"Bad value for 'data.batch_size': {value!r}. It must be an integer >= 1, or auto (the largest batch that fits)."
        )
    if key == "data.storage_options" and value is not None and not hasattr(value, "keys"):
        raise ConfigError(
            f"Bad value for 'data.storage_options': {value!r}. It must be a mapping passed to fsspec, e.g. +data.storage_options.anon=true."
        )
    if key == "data.download_url" and not (
        value == "auto" or (isinstance(value, str) and value.split("://", 1)[0] in ("http", "https", "ftp", "file"))
    ):
        raise ConfigError(
            f"Bad value for 'data.download_url': {value!r}. It must be auto (torchvision's URL for the dataset) or an "
            "http://, https://, ftp:// or file:// URL of the same archive."
        )
    if key == "data.download_md5" and value not in (None, "auto") and not re.fullmatch(r"[0-9a-fA-F]{32}", str(value)):
        raise ConfigError(
            f"Bad value for 'data.download_md5': {value!r}. It must be auto (torchvision's checksum of the archive), "
            "32 hex digits (an MD5), or null (not checked: only for a mirror you trust)."
        )
    if key == "devices" and not (value == "auto" or (isinstance(value, int) and (value >= 1 or value == -1))):
        raise ConfigError(f"Bad value for 'devices': {value!r}. It must be a positive integer, -1 (all) or auto.")
    if key in ("trainer.limit_train_batches", "trainer.limit_val_batches"):
        if value is None:
            return  # Lightning's default: every batch
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        if not ok or (isinstance(value, float) and value > 1.0):
            raise ConfigError(
                f"Bad value for '{key}': {value!r}. It must be a fraction in [0.0, 1.0], a whole number of batches, or null (all)."
            )


def validate(cfg: Any) -> None:
    """Range and choice checks on a composed config (the parts that do not need the hardware)."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of train.py's start-up

    flat = {
        k: OmegaConf.select(cfg, k) for k in SCHEMA_KEYS if k not in GROUPS and not is_dataclass_type(SCHEMA_KEYS[k])
    }
    for key, value in flat.items():
        _check_value(key, value)
    if cfg.get("on_nan") == "skip" and cfg.get("strategy") != "auto":
        raise ConfigError(
            f"'on_nan=skip' cannot be combined with strategy={cfg.strategy} (several processes): skipping a step on one rank would "
            "leave the others waiting for its gradients (Lightning refuses a skipped step under DDP/FSDP). Use on_nan=stop (the "
            "default) or on_nan=off, or one process (devices=1, strategy=auto)."
        )
    if cfg.get("compile_mode", "default") != "default" and cfg.get("compile_backend", "inductor") != "inductor":
        raise ConfigError(
            f"'compile_mode={cfg.compile_mode}' is a mode of the inductor backend, and compile_backend={cfg.compile_backend}. "
            "Use compile_mode=default with that backend, or compile_backend=inductor."
        )
    if OmegaConf.select(cfg, "trainer.max_epochs") == -1 and OmegaConf.select(cfg, "sched.name") != "constant":
        raise ConfigError(
            f"'trainer.max_epochs=-1' trains until stopped, but sched.name={OmegaConf.select(cfg, 'sched.name')} needs to know how long "
            "training lasts. Use sched.name=constant with max_epochs=-1, or give trainer.max_epochs a number."
        )
    if cfg.get("stop_at_acc") is not None and OmegaConf.select(cfg, "trainer.limit_val_batches") in (0, 0.0):
        raise ConfigError(
            f"'stop_at_acc={cfg.stop_at_acc}' stops when a validated epoch reaches that val_acc, but trainer.limit_val_batches=0 "
            "validates nothing. Give trainer.limit_val_batches a number above 0 (1.0: the whole validation set), or stop_at_acc=null."
        )
    _check_data_root_is_read(cfg)
    model = cfg.get("model") or {}
    if "_target_" not in model:
        raise ConfigError(
            "The config has no model: 'model._target_' is missing. Pick a recipe (+recipe=resnet50 or +recipe=vit), "
            "keep the default tiny model, or name any nn.Module or LightningModule class with model._target_=pkg.module.Class."
        )


def _check_data_root_is_read(cfg: Any) -> None:
    """data.root with a data= that ignores it: without data=imagefolder (forgotten) the run trained on the
    synthetic set, saying nothing. Refused where the data came from the defaults or a recipe; a data=
    the job's own command line chose (a sweep over data=imagefolder,synthetic) is the user's: said, not refused."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of train.py's start-up

    data_name, data_root = OmegaConf.select(cfg, "data.name"), OmegaConf.select(cfg, "data.root")
    if data_root is None or data_name not in ("synthetic", "builtin", "custom"):
        return
    instead = {"custom": "for your Dataset class use +data.dataset.root=..."}.get(
        data_name, f"the run trains on data={data_name}'s own images instead"
    )
    message = (
        f"'data.root={data_root}' is read by data=imagefolder, packed, parquet, webdataset, cifar10 and imagenette, "
        f"and data={data_name} ignores it ({instead}). Add the data= its files are, e.g. data=imagefolder for class "
        "folders of images, or drop data.root."
    )
    if "data" in _chosen_groups():
        log.warning(message)
    else:
        raise ConfigError(message)


def _chosen_groups() -> List[str]:
    """The config groups this Hydra job's own command line chose (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig  # lazy: keeps hydra out of train.py's start-up

    if not HydraConfig.initialized():
        return []
    return [o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task]


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)
