"""One path from the command line's overrides to the config a job runs, for every caller.

Hydra composes the config (``train.py`` and ``python -m trainer.tune`` through ``@hydra.main``;
tests and scripts through ``hydra.compose``). ``finish`` then does what Hydra's composition cannot:
it applies the ``scale=`` preset over the recipe (the command line applied again on top, so it
still wins) and rebuilds the model node when ``model._target_`` was pointed at another class.
``compose_for_run`` is both steps for callers without ``@hydra.main``. After ``finish`` the config
changes only where a run resumes (``ckpt_path``: a requeued Slurm job, a stopped sweep's job) and
for the values a run settles itself (``trainer.run.parts.Parts``).
"""

from __future__ import annotations

from typing import Any, Sequence

from trainer.config.schema import register_schema
from trainer.config.tables import CHOICES, OPTIMIZATION_FLAGS, RECIPE_FLAGS, RUN_SETTINGS, SCHEMA_FIELDS, help_text
from trainer.paths import CONFIG_DIR
from trainer.rank import global_rank


def prepare_hydra() -> None:
    """The schema in Hydra's ConfigStore and the resolvers configs/train.yaml uses."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of train.py's start-up

    register_schema()
    rank = str(global_rank())
    OmegaConf.register_new_resolver("trainer_rank_suffix", lambda: "" if rank == "0" else f"_rank{rank}", replace=True)
    OmegaConf.register_new_resolver("trainer_rank0_only", lambda value: value if rank == "0" else None, replace=True)
    OmegaConf.register_new_resolver("trainer_flags_help", flags_help, replace=True)


SWEEP_KEYS = ("repeats", "repeat_seeds", "report.target_acc", "report.val_per_epoch")  # how a sweep is judged


def flags_help() -> str:
    """``train.py --help``'s list of flags: each key's default, allowed values and help, from the schema."""

    def shown(value: Any) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    lines = []
    sections = (
        ("optimizations (the switchboard)", OPTIMIZATION_FLAGS),
        ("run settings", RUN_SETTINGS),
        ("recipe ingredients (change what is learned)", RECIPE_FLAGS),
        ("sweeps (with -m)", SWEEP_KEYS),
    )
    for title, keys in sections:
        lines.append(f"{title}:")
        for key in keys:
            default = SCHEMA_FIELDS[key].default
            allowed = f" [{' | '.join(shown(c) for c in CHOICES[key])}]" if key in CHOICES else ""
            lines.append(f"  {key}={shown(default)}{allowed}  {help_text(key)}".rstrip())
    return "\n".join(lines)


def finish(cfg: Any, overrides: Sequence[str]) -> Any:
    """Hydra's composed config -> the job's config: the scale preset applied, a retargeted model rebuilt."""
    # lazy: keeps hydra out of train.py's start-up
    from trainer.config.model_config import replace_retargeted_model
    from trainer.config.scale import apply_scale

    overrides = list(overrides)
    return replace_retargeted_model(apply_scale(cfg, overrides), overrides)


def compose_for_run(overrides: Sequence[str] = (), config_dir: str = str(CONFIG_DIR)) -> Any:
    """What ``python train.py OVERRIDES`` would run, composed in this process (tests, scripts)."""
    from hydra import compose, initialize_config_dir  # lazy: keeps hydra out of train.py's start-up

    prepare_hydra()
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    return finish(cfg, overrides)
