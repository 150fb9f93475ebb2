"""The published recipes (recipes/*.yaml beyond the two A/B baselines): each file's head names its
source and published accuracy and pins its values in a "pinned" block; the composed config must hold
every pinned value (an edit that drifts from the head fails), the README's recipe table must list each
with that accuracy, and the bench row that cuts a recipe's augmentation must cut all of it.

That each recipe composes and trains with ``scale=smoke`` is the README's own command
(``python train.py -m +recipe=... scale=smoke data=builtin``, run by test_readme.py).
"""

from __future__ import annotations

import math
import re

import pytest
import yaml
from conftest import ROOT
from omegaconf import OmegaConf

PUBLISHED = ["resnet50_nvidia", "resnet50_a3", "resnet50_tv2", "vit_deit", "resnet50_ffcv"]


def _head(name: str) -> dict:
    """The recipe file's head: its Source and Published lines, and the pinned key: value lines."""
    lines = (ROOT / "recipes" / f"{name}.yaml").read_text().splitlines()
    head = [line[1:].strip() for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]]
    start = next(i for i, line in enumerate(head) if line.startswith("pinned"))
    pinned = {}
    for line in head[start + 1 :]:
        key, _, value = line.partition(":")
        pinned[key.strip()] = yaml.safe_load(value)
    text = " ".join(head[:start])
    return {"text": text, "pinned": pinned}


def _same(expected, actual) -> bool:
    if isinstance(expected, float) or isinstance(actual, float):
        return actual is not None and math.isclose(float(expected), float(actual), rel_tol=1e-6)
    return expected == actual


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_recipe_holds_the_values_its_head_pins(name, compose):
    head = _head(name)
    assert re.search(r"Source: \S", head["text"]) and re.search(r"Published: ImageNet top-1 [\d.]+", head["text"])
    assert "Follows the effective batch:" in head["text"] and "Not as in the source:" in head["text"]
    assert len(head["pinned"]) >= 15, head["pinned"]
    cfg = compose(f"+recipe={name}")
    assert cfg.recipe == name
    for key, expected in head["pinned"].items():
        actual = OmegaConf.select(cfg, key, default="<missing>")
        if OmegaConf.is_config(actual):
            actual = OmegaConf.to_container(actual)
        assert _same(expected, actual), f"recipes/{name}.yaml: {key} is {actual!r}, its head pins {expected!r}"


def test_a_drifted_value_is_caught(compose, tmp_path, monkeypatch):
    """The pin check itself can fail: a recipe whose body says one thing and head another."""
    cfg = compose("+recipe=resnet50_tv2", "optim.lr=0.4")
    assert not _same(_head("resnet50_tv2")["pinned"]["optim.lr"], OmegaConf.select(cfg, "optim.lr"))


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_readme_lists_the_recipe_with_its_published_accuracy(name):
    top1 = re.search(r"Published: ImageNet top-1 ([\d.]+)", _head(name)["text"]).group(1)
    row = next(
        (line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(f"| `{name}` |")), None
    )
    assert row is not None, f"README's recipe table has no row for {name}"
    assert f"| {top1} |" in row, (top1, row)


def test_smoke_shrinks_each_recipe_and_keeps_its_ingredients(compose):
    for name in PUBLISHED:
        cfg = compose(f"+recipe={name}", "scale=smoke")
        full = compose(f"+recipe={name}")
        assert cfg.data.image_size == 32 and cfg.data.num_classes == 10, name

        def split(c):  # validates at a size of its own
            return c.data.eval_image_size not in (None, c.data.image_size)

        assert (cfg.data.eval_image_size or 32) <= 48 and split(cfg) == split(full), name
        for key in ("data.augment_policy", "data.mixup_alpha", "data.repeated_augment", "loss.name", "optim.name"):
            assert OmegaConf.select(cfg, key) == OmegaConf.select(full, key), (name, key)
    ffcv = compose("+recipe=resnet50_ffcv", "scale=smoke")
    assert ffcv.progressive.start_size < ffcv.data.image_size


def test_the_plain_augment_row_cuts_a_recipe_to_crop_and_flip(compose):
    cfg = compose("+recipe=resnet50_tv2", "+bench=plain_augment")
    assert cfg.data.augment and cfg.data.augment_policy == "none" and cfg.data.random_erasing == 0
    assert cfg.data.mixup_alpha == 0 and cfg.data.cutmix_alpha == 0 and cfg.data.repeated_augment == 1
    assert cfg.optim.lr == compose("+recipe=resnet50_tv2").optim.lr  # nothing else changes
