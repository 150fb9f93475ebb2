"""Shared fixtures: configs composed in-process exactly as train.py composes them, and tiny runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

# Small enough for 2 CPU cores: 16 px images, a handful of steps, no checkpoints.
TINY = [
    "data.image_size=16",
    "data.batch_size=8",
    "data.num_samples=64",
    "data.val_samples=16",
    "trainer.max_epochs=1",
    "trainer.log_every_n_steps=1",
    "checkpoint.enabled=false",
]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # one builtin-dataset cache per test session, never the user's ~/.cache
    monkeypatch.setenv("TRAINER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def compose():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.cli import CONFIG_DIR
    from trainer.config import register_schema
    from trainer.scale import apply_scale

    register_schema()

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name="train", overrides=list(overrides))
        return apply_scale(cfg, overrides)

    return _compose


@pytest.fixture
def train(tmp_path, compose):
    """Run one tiny job in-process; returns (metrics, run_dir)."""
    from trainer.run import run

    counter = {"n": 0}

    def _train(*overrides: str, tiny: bool = True):
        counter["n"] += 1
        out = tmp_path / f"run{counter['n']}"
        args = (TINY if tiny else []) + list(overrides)
        return run(compose(*args), str(out), args), out

    return _train


def run_cli(*args: str, cwd=None, timeout: int = 600, env_extra=None) -> subprocess.CompletedProcess:
    """Run train.py as a user would, in a subprocess."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]), **(env_extra or {}))
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())
