"""Any nn.Module or LightningModule trains by _target_, without editing the package."""

from __future__ import annotations

import importlib.util

import pytest

import probe


def test_user_nn_module_by_target(train):
    metrics, _ = train("model._target_=probe.ProbeNet", "~model.width", "+model.width=4")
    assert metrics["status"] == "ok" and probe.SEEN


def test_user_lightning_module_is_trained_as_is(train):
    probe.ProbeLightningModule.calls.clear()
    metrics, _ = train("model._target_=probe.ProbeLightningModule", "~model.width", "+model.lr=0.05")
    assert metrics["status"] == "ok" and len(probe.ProbeLightningModule.calls) == 8  # 64 samples / batch 8


def test_recipe_models_build_at_smoke_scale(compose):
    from trainer.models import build_module

    for recipe, n_params in (("resnet50", 23_000_000), ("vit", 2_000_000)):
        module = build_module(compose(f"+recipe={recipe}", "scale=smoke"))
        assert sum(p.numel() for p in module.parameters()) > n_params


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="timm is an optional extra")
def test_timm_model_by_name(train):
    metrics, _ = train("model._target_=timm.create_model", "~model.width", "+model.model_name=resnet18", "~model.num_classes", "+model.num_classes=10")
    assert metrics["status"] == "ok"
