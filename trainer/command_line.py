"""The command line, checked before Hydra composes: for ``train.py`` and ``python -m trainer.tune`` alike.

A typo, a bad value, a mode Hydra would refuse with a stack, an unwritable output dir or a broken
YAML file gets one paragraph here, before anything is composed or written. ``+tuned=PATH`` (a tune's
``best.yaml``) and ``repeats=N`` are expanded into plain overrides, which reach every process a
launcher starts. Its own module, below both commands, so that the tuner checks its command line as
train.py does without importing train.py's entry point.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, List

from trainer.config import SCHEMA_FIELDS, check_overrides
from trainer.errors import ConfigError
from trainer.paths import CONFIG_DIR, RECIPE_DIR

# Hydra options that take a value as the next argument
_OPTS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}
_NO_CHECK = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--info", "-i"}


def recipes() -> List[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


# Hydra modes that exclude each other ("Only one of --run, --multirun, --cfg, ..." is a ValueError traceback)
_MODES = {
    "-m": "--multirun",
    "--multirun": "--multirun",
    "--cfg": "--cfg",
    "-c": "--cfg",
    "--info": "--info",
    "-i": "--info",
    "--shell-completion": "--shell-completion",
    "-sc": "--shell-completion",
}


def check_modes(argv: List[str]) -> None:
    modes = sorted({_MODES[a] for a in argv if a in _MODES})
    if len(modes) > 1:
        raise ConfigError(
            f"{' and '.join(modes)} cannot be combined: Hydra runs one mode at a time. To see a sweep job's config, "
            "give one job's values with --cfg job (e.g. python train.py amp=true --cfg job); to run the sweep, use -m alone."
        )


def user_overrides(argv: List[str]) -> List[str] | None:
    """The key=value overrides in ``argv`` (Hydra's own options skipped); None for --help and the like."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _NO_CHECK:
            return None
        if arg in _OPTS_WITH_VALUE:
            skip = True
            continue
        if arg.startswith("-"):  # Hydra's flags (-m, --multirun, ...); overrides never start with "-"
            continue
        out.append(arg)
    return out


def check_output_dirs(overrides: List[str]) -> None:
    """hydra.run.dir / hydra.sweep.dir given on the command line must be creatable and writable."""
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key.lstrip("+") not in ("hydra.run.dir", "hydra.sweep.dir") or "${" in value or "," in value:
            continue
        try:
            os.makedirs(value, exist_ok=True)
            with tempfile.TemporaryFile(dir=value):
                pass
        except OSError as e:
            raise ConfigError(
                f"'{key}={value}' cannot be used as the output dir: {e.strerror or e} ({type(e).__name__}). "
                "Point it at a writable folder; nothing was written and no earlier result was touched."
            ) from None


def expand_repeats(argv: List[str]) -> List[str]:
    """``repeats=N`` in a sweep becomes ``repeat=range(N)``, placed first so that it varies slowest:
    every configuration runs once, then again, so slow drift of the machine hits all of them alike.

    With ``repeat_seeds=true`` the repeats differ in their seed instead: ``seed=S,S+1,...,S+N-1``
    (S: the command line's ``seed=``, else the schema's default), placed first the same way. The
    report folds them into one row like a seed sweep, and its time-to-target interval then holds the
    seeds' variation; repeats of one seed learn alike, so theirs holds timing noise only."""
    found = [a for a in argv if a.split("=", 1)[0] == "repeats"]
    if not found:
        return argv
    value = found[-1].split("=", 1)[1]
    if "," in value or "(" in value:
        raise ConfigError(f"'repeats={value}' takes one integer (how many times each configuration runs), not a sweep.")
    n = int(value)
    seeded = [a for a in argv if a.split("=", 1)[0].lstrip("+") == "repeat_seeds"]
    per_seed = bool(seeded) and seeded[-1].split("=", 1)[1].strip().lower() in ("true", "yes", "on", "y", "1")
    if n <= 1:
        return [a for a in argv if a not in found]
    if not any(a in ("-m", "--multirun") for a in argv):
        raise ConfigError(
            f"'repeats={n}' runs each configuration of a sweep {n} times: add -m "
            f"(python train.py -m ... repeats={n}); a single run is one repetition."
        )
    rest = [a for a in argv if a not in found]
    sweep = [f"repeat=range({n})"]
    if per_seed:
        seeds = [a for a in rest if a.split("=", 1)[0].lstrip("+") == "seed" and not a.startswith("-")]
        given = seeds[-1].split("=", 1)[1].strip() if seeds else None
        try:
            first_seed = int(given) if given is not None else _default_seed()
        except ValueError:
            raise ConfigError(
                f"'repeats={n} repeat_seeds=true' gives the repeats the seeds seed, seed+1, ... and needs one integer "
                f"seed to start from, not 'seed={given}'. To choose the seeds yourself, sweep them without "
                "repeat_seeds (python train.py -m ... seed=1,2,3): jobs that differ only in their seed fold into one row too."
            ) from None
        rest = [a for a in rest if a not in seeds]
        sweep = ["seed=" + ",".join(str(first_seed + i) for i in range(n))]
    first = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:first] + sweep + rest[first:]


def _default_seed() -> int:
    return int(SCHEMA_FIELDS["seed"].default)


def expand_tuned(argv: List[str]) -> List[str]:
    """``+tuned=PATH`` (a best.yaml of python -m trainer.tune) becomes its overrides, in its place.

    Hydra cannot include a file of overrides, and a config group would not reach the processes a
    launcher starts (Slurm jobs compose again from the overrides): plain overrides reach them all,
    and ``.hydra/overrides.yaml`` records what ran."""
    out: List[str] = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "tuned" and not arg.startswith("-"):
            out += load_tuned(value)
        else:
            out.append(arg)
    return out


def group_options(group: str) -> List[str]:
    """The options of config group ``group`` (data, model, ...): its YAML files in configs/."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def check_config_files(dirs=None) -> None:
    """Every YAML file of the config tree parses (Hydra would answer a broken one with a yaml traceback)."""
    import yaml  # lazy: keeps yaml out of train.py's start-up

    for directory in dirs or (CONFIG_DIR, RECIPE_DIR):
        for path in sorted(Path(directory).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                what = " ".join(str(getattr(e, "problem", None) or e).split())
                context = getattr(e, "context", None)
                raise ConfigError(
                    f"{path}{where}: not valid YAML ({(context + ': ') if context else ''}{what}). "
                    "Fix the file (a recipe, or a config you edited); nothing ran."
                ) from None


def checked_argv(
    argv: List[str], first: Callable[[List[str]], None] | None = None, then: Callable[[List[str]], None] | None = None
) -> List[str]:
    """The command line checked before Hydra composes (train.py's and the tuner's), ``+tuned=`` expanded.

    ``first`` sees the raw arguments after the mode check; ``then`` the expanded overrides before
    the shared checks (which create the output dir). Raises ConfigError."""
    check_modes(argv)
    if first:
        first(argv)
    if user_overrides(argv) is None:
        return argv  # --help and the like: Hydra answers

    argv = expand_tuned(argv)
    overrides = user_overrides(argv)
    if then:
        then(overrides)
    check_config_files()
    # a group's options are this project's config files, unless the command adds configs of its own
    own_configs = any(a.split("=", 1)[0] in ("-cd", "--config-dir", "-cp", "--config-path") for a in argv) or any(
        o.lstrip("+").startswith("hydra.searchpath") for o in overrides
    )
    check_overrides(overrides, recipes(), None if own_configs else group_options)
    check_output_dirs(overrides)
    return argv


def fail(message: str, code: int = ConfigError.exit_code) -> None:
    print(f"\nerror: {message}\n", file=sys.stderr)
    sys.exit(code)


def load_tuned(path: str) -> List[str]:
    """The overrides of a ``best.yaml`` (for ``+tuned=PATH``), with a clear error for anything else."""
    import yaml  # lazy: keeps yaml out of train.py's start-up

    expanded = os.path.expanduser(path)
    try:
        data = yaml.safe_load(Path(expanded).read_text())
    except OSError as e:
        raise ConfigError(
            f"'+tuned={path}': cannot read it ({e.strerror}). Give the best.yaml a tune wrote (python -m trainer.tune ... prints its path)."
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"'+tuned={path}' is not a text file. Give the best.yaml a tune wrote.") from None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"'+tuned={path}' is not valid YAML ({' '.join(str(e).split())[:200]}). Give the best.yaml a tune wrote."
        ) from None
    overrides = data.get("overrides") if isinstance(data, dict) else None
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise ConfigError(
            f"'+tuned={path}' has no 'overrides:' list of key=value strings; it must be a best.yaml written by python -m trainer.tune."
        )
    return overrides
