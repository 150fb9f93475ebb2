"""Where the project's files are: the repository root, the Hydra config tree, the recipes and the cache.

Its own module so that the entry point (cli), the process launcher (launch) and scripts can all
find them without importing each other.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"
RECIPE_DIR = ROOT / "recipes"
SWEEP_PLAN = "sweep.json"  # in a sweep dir: the sweep's command and jobs (trainer.sweep)


def default_cache_dir() -> str:
    """The trainer's own cache (the built-in set, downloaded data sets, the loaders' measured rates):
    $TRAINER_CACHE, else ~/.cache/trainer."""
    return os.environ.get("TRAINER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainer")
