"""Any nn.Module or LightningModule trains by _target_, without editing the package, and every
switch either reaches it or is refused up front."""

from __future__ import annotations

import pytest
import spies
from conftest import TINY, read_metrics, run_cli

# the four kinds of model a user plugs in, each exactly as the README writes it
KINDS = {
    "torchvision": ["model._target_=torchvision.models.resnet18"],
    "timm": ["model._target_=timm.create_model", "+model.model_name=resnet10t"],
    "nn.Module": ["model._target_=trainer.examples.MyNet", "+model.depth=3"],
    "LightningModule": ["model._target_=trainer.examples.MyLightningModule"],
}


def test_retargeting_the_model_drops_the_default_models_keys(compose):
    cfg = compose("model._target_=torchvision.models.resnet18")
    assert set(cfg.model) == {"_target_", "num_classes"}  # no leftover width: 16
    cfg = compose("model._target_=trainer.examples.MyNet", "+model.depth=3", "model.width=4")
    assert dict(cfg.model) == {"_target_": "trainer.examples.MyNet", "depth": 3, "width": 4, "num_classes": 10}
    assert compose("model.width=4").model.width == 4  # not retargeted: the default model keeps its keys


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_model_trains_with_amp_channels_last_and_activation_checkpointing(train, kind, caplog):
    import logging

    caplog.set_level(logging.INFO)
    args = KINDS[kind] + (["lr_scaling=none"] if kind == "LightningModule" else [])
    m, _ = train(*args, "amp=true", "channels_last=true", "activation_checkpointing=true", "data.image_size=32")
    assert m["status"] == "ok" and m["precision"] == "bf16-mixed" and m["epochs"]
    assert "activation checkpointing: " in caplog.text and "activation checkpointing: 0 blocks" not in caplog.text
    if kind in ("nn.Module", "LightningModule"):  # MyNet's blocks, whole (not their single layers)
        assert f"activation checkpointing: {3 if kind == 'nn.Module' else 2} blocks" in caplog.text


def test_a_user_lightning_module_is_trained_as_is(train):
    spies.ProbeLightningModule.calls.clear()
    metrics, _ = train("model._target_=spies.ProbeLightningModule", "+model.lr=0.05")
    assert metrics["status"] == "ok" and len(spies.ProbeLightningModule.calls) == 8  # 64 samples / batch 8


def test_a_user_lightning_module_gets_normalized_float_batches_under_gpu_normalize(train, clear_spies):
    m, _ = train("model._target_=spies.ProbeLightningModule", "data.gpu_normalize=true")
    seen = spies.training_snapshots()
    assert m["status"] == "ok" and seen and all(s["input_dtype"].is_floating_point for s in seen)
    spies.HookLightningModule.hook_dtypes.clear()
    m, _ = train("model._target_=spies.HookLightningModule", "data.gpu_normalize=true")
    # its own on_after_batch_transfer still runs (Lightning alone would call only the datamodule's), on floats
    assert (
        m["status"] == "ok"
        and spies.HookLightningModule.hook_dtypes
        and all(d.is_floating_point for d in spies.HookLightningModule.hook_dtypes)
    )


@pytest.mark.parametrize(
    "args,says",
    [
        (["model._target_=spies.ProbeLightningModule", "lr_scaling=linear"], "lr_scaling=linear"),
        (["model._target_=spies.ProbeLightningModule", "on_nan=skip"], "on_nan=stop"),
        (["model._target_=spies.ProbeLightningModule", "optim.lr=0.3"], "optim.lr"),
    ],
)
def test_switches_that_cannot_reach_a_user_lightning_module_are_refused(train, args, says):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="LightningModule of your own") as e:
        train(*args)
    assert says in str(e.value)


def test_a_recipe_with_a_user_lightning_module_trains_and_says_what_does_not_apply(train, caplog):
    m, _ = train(
        "+recipe=resnet50",
        "scale=smoke",
        "model._target_=trainer.examples.MyLightningModule",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
    )
    assert m["status"] == "ok" and "the recipe's optimizer, schedule, loss and lr_scaling do not apply" in caplog.text


def test_on_nan_skip_under_ddp_is_refused_up_front(compose):
    from trainer.config import validate
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="on_nan=skip.*strategy=ddp"):
        validate(compose("on_nan=skip", "strategy=ddp"))


def test_the_timm_hint_only_when_timm_is_missing(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        train("model._target_=timm.create_model", "+model.model_name=no_such_model_name")
    assert "pip install timm" not in str(e.value) and "no_such_model_name" in str(e.value)


def test_recipe_models_build_at_smoke_scale(compose):
    from trainer.models import build_module

    for recipe, n_params in (("resnet50", 23_000_000), ("vit", 2_000_000)):
        module = build_module(compose(f"+recipe={recipe}", "scale=smoke"))
        assert sum(p.numel() for p in module.parameters()) > n_params


def test_model_resnet18_is_torchvisions_resnet18_for_the_datasets_classes(compose):
    import torchvision

    from trainer.models import build_module

    module = build_module(compose("model=resnet18", "data.num_classes=7"))
    net = next(m for m in module.modules() if isinstance(m, torchvision.models.ResNet))
    assert isinstance(net.layer1[0], torchvision.models.resnet.BasicBlock) and net.fc.out_features == 7
    assert [len(layer) for layer in (net.layer1, net.layer2, net.layer3, net.layer4)] == [2, 2, 2, 2]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torchvision", "timm"])
@pytest.mark.whole_machine  # two ranks: one core each
def test_fsdp2_on_two_processes_shards_the_blocks_of(kind, tmp_path):
    run_dir = tmp_path / kind
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        *TINY,
        *KINDS[kind],
        "strategy=fsdp2",
        "devices=2",
        "data.image_size=32",
        "trainer.max_epochs=2",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert read_metrics(run_dir)["status"] == "ok"
    log = (run_dir / "train.log").read_text()
    assert "fsdp2: " in log and "BasicBlock" in log and "none found" not in log, log[-2000:]
