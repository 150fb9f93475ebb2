"""Where the project's files are: the repository root, the Hydra config tree and the recipes.

Its own module so that the entry point (cli), the process launcher (launch) and scripts can all
find them without importing each other.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "configs"
RECIPE_DIR = ROOT / "recipes"
SWEEP_PLAN = "sweep.json"  # in a sweep dir: the sweep's command and jobs (trainer.sweep)
