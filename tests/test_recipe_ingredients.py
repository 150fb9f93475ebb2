"""The published recipes' ingredients, each proven to do what its key says (and to fail when it does
nothing): augmentation policies and random erasing change the images, mixup/cutmix make soft
targets from the right pair, stochastic depth drops branches at its rate in training only, the
weight-decay groups, zero-initialized residual blocks, LAMB, repeated augmentation across ranks,
validation at its own resolution and with test-time flip, and the refusals where a key cannot act.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainer.errors import ConfigError


def _picture(size: int = 48) -> torch.Tensor:
    """A uint8 CHW image with structure in every channel (a policy's ops all change it)."""
    y, x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return torch.stack([(x * 5) % 256, (y * 3) % 256, ((x + y) * 2) % 256]).to(torch.uint8)


def _augmented(augment, seed: int, size: int = 32, train: bool = True, keep_uint8: bool = False):
    from trainer.data.augment import transforms_for

    torch.manual_seed(seed)
    return transforms_for(size, train, augment, keep_uint8)(_picture())


@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment", "autoaugment"])
def test_an_augmentation_policy_changes_the_images_after_the_same_crop(policy):
    from trainer.data.augment import Augmentation

    plain = Augmentation()
    with_policy = Augmentation(policy=policy, magnitude=15)
    changed = sum(not torch.equal(_augmented(plain, s), _augmented(with_policy, s)) for s in range(8))
    assert changed >= 5, changed  # the same seed draws the same crop + flip; the policy's ops come after
    assert all(torch.equal(_augmented(with_policy, s), _augmented(with_policy, s)) for s in range(2))  # seeded
    val = Augmentation(policy=policy)
    assert torch.equal(_augmented(val, 0, train=False), _augmented(plain, 1, train=False))  # never in validation


def test_random_erasing_erases_a_rectangle_at_its_probability():
    from trainer.data.augment import Augmentation

    def erased(img):  # erased pixels are exactly 0 in every channel (after normalization: the mean colour)
        return int((img == 0).all(0).sum())

    assert all(erased(_augmented(Augmentation(), s)) == 0 for s in range(10))
    always = [erased(_augmented(Augmentation(random_erasing=1.0), s)) for s in range(10)]
    assert all(n >= 0.02 * 32 * 32 for n in always), always  # torchvision's area range starts at 2%
    half = [erased(_augmented(Augmentation(random_erasing=0.5), s)) > 0 for s in range(60)]
    assert 15 <= sum(half) <= 45, sum(half)
    # with gpu_normalize the uint8 image is erased to the mean colour's pixels: 0 once normalized, as above
    from trainer.data.augment import MEAN_PIXELS
    from trainer.data.gpu_transforms import normalize_uint8

    image = _augmented(Augmentation(random_erasing=1.0), 0, keep_uint8=True)
    box = (image == torch.tensor(MEAN_PIXELS, dtype=torch.uint8).view(3, 1, 1)).all(0)
    assert image.dtype == torch.uint8 and int(box.sum()) >= 0.02 * 32 * 32
    assert normalize_uint8(image)[0][:, box].abs().max() < 0.01


def test_the_crop_scale_and_the_eval_resolution_follow_their_keys(compose):
    from torchvision.transforms import v2

    from trainer.data.augment import Augmentation, transforms_for

    aug = Augmentation.of(
        compose("data.crop_min_scale=0.08", "data.eval_image_size=40", "data.eval_resize_ratio=1.2").data
    )
    crop = next(t for t in transforms_for(32, True, aug).transforms if isinstance(t, v2.RandomResizedCrop))
    assert crop.scale == (0.08, 1.0)
    val = transforms_for(32, False, aug)
    assert [list(t.size) for t in val.transforms if isinstance(t, (v2.Resize, v2.CenterCrop))] == [[48], [40, 40]]
    assert _augmented(aug, 0, train=False).shape == (3, 40, 40) and _augmented(aug, 0).shape == (3, 32, 32)


def test_validation_batches_come_at_the_eval_size_and_training_at_the_image_size(compose, small_images):
    from trainer.data.datamodule import ImageDataModule

    cfg = compose(
        "data=imagefolder",
        f"data.root={small_images}",
        "data.image_size=24",
        "data.eval_image_size=32",
        "data.batch_size=4",
    )
    dm = ImageDataModule(cfg.data)
    dm.build()
    assert next(iter(dm.train_dataloader()))[0].shape[-2:] == (24, 24)
    assert next(iter(dm.val_dataloader()))[0].shape[-2:] == (32, 32)


def test_mixup_makes_soft_targets_of_each_image_and_its_neighbour():
    from trainer.data.mixing import BatchMixing

    images, labels = torch.rand(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    mixed, targets = BatchMixing(0.4, 0.0, num_classes=5)(images, labels, seed=3)
    assert targets.shape == (6, 5) and torch.allclose(targets.sum(1), torch.ones(6))
    lam = float(targets[1, 1])  # image 1 (class 1) mixed with image 4 (class 4): the batch's mirror position
    assert 0 < lam < 1 and torch.isclose(targets[1, 4], torch.tensor(1 - lam))
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.flip(0), atol=1e-6)
    again = BatchMixing(0.4, 0.0, num_classes=5)(images, labels, seed=3)
    assert torch.equal(again[1], targets) and not torch.equal(
        BatchMixing(0.4, 0.0, 5)(images, labels, seed=4)[1], targets
    )


def test_cutmix_pastes_a_box_of_the_neighbour_and_the_targets_hold_its_area():
    from trainer.data.mixing import BatchMixing

    images = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 3, 16, 16).contiguous()
    labels = torch.tensor([0, 1, 2, 3])
    for seed in range(6):
        mixed, targets = BatchMixing(0.0, 1.0, num_classes=4)(images, labels, seed=seed)
        pasted = (mixed[1, 0] == 2).float().mean()  # image 1 holds image 2's value (its mirror) where the box is
        assert torch.allclose(targets.sum(1), torch.ones(4)) and set(mixed[1].unique().tolist()) <= {1.0, 2.0}
        assert torch.isclose(targets[1, 2], pasted, atol=1e-6) and torch.isclose(targets[1, 1], 1 - pasted, atol=1e-6)


def test_with_both_on_each_batch_gets_mixup_or_cutmix():
    from trainer.data.mixing import BatchMixing

    images, labels = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    kinds = set()
    for seed in range(20):
        mixed, _ = BatchMixing(1.0, 1.0, num_classes=4)(images, labels, seed=seed)
        from_self = torch.isclose(mixed, images) | torch.isclose(mixed, images.flip(0))
        kinds.add("cutmix" if bool(from_self.all()) else "mixup")
    assert kinds == {"mixup", "cutmix"}


def test_the_classifier_trains_on_mixed_batches_with_soft_targets(compose):
    from trainer.models import build_module

    cfg = compose("data.mixup_alpha=0.5", "data.cutmix_alpha=1.0", "loss.label_smoothing=0.1", "data.num_classes=4")
    module = build_module(cfg)
    seen = []
    module.net.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    x, y = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    loss = module.training_step((x, y), 0)
    assert torch.isfinite(loss) and not torch.equal(seen[0], x)  # the net saw the mixed batch
    module.mixing = None
    module.training_step((x, y), 0)
    assert torch.equal(seen[1], x)


def test_bce_loss_takes_index_and_soft_targets_with_smoothing_and_a_threshold():
    import torch.nn.functional as F

    from trainer.models.losses import TrainingLoss

    logits, labels = torch.randn(3, 4), torch.tensor([0, 2, 3])
    one_hot = F.one_hot(labels, 4).float()
    assert torch.allclose(TrainingLoss("bce")(logits, labels), F.binary_cross_entropy_with_logits(logits, one_hot))
    smoothed = one_hot * 0.8 + 0.2 / 4
    assert torch.allclose(
        TrainingLoss("bce", 0.2)(logits, labels), F.binary_cross_entropy_with_logits(logits, smoothed)
    )
    soft = torch.tensor([[0.7, 0.3, 0, 0], [0, 0.1, 0.9, 0], [0.5, 0, 0, 0.5]])
    hard = torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]])
    assert torch.allclose(
        TrainingLoss("bce", bce_target_threshold=0.2)(logits, soft), F.binary_cross_entropy_with_logits(logits, hard)
    )
    assert torch.allclose(
        TrainingLoss("cross_entropy", 0.1)(logits, soft), F.cross_entropy(logits, soft, label_smoothing=0.1)
    )


def _dropped_rows(net, block_ends, x):
    """Per branch end: the fraction of samples whose branch output is all zero (dropped)."""
    fractions = {}

    def record(name):
        def hook(module, inputs, output):
            flat = output.flatten(1)
            fractions.setdefault(name, []).append(float((flat == 0).all(1).float().mean()))

        return hook

    handles = [end.register_forward_hook(record(name)) for name, end in block_ends]
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    return {name: sum(v) / len(v) for name, v in fractions.items()}


def test_stochastic_depth_drops_residual_branches_linearly_in_depth_in_training_only():
    from torchvision.models import resnet18

    from trainer.models.regularize import apply_drop_path

    torch.manual_seed(0)
    net = resnet18(num_classes=4)
    assert apply_drop_path(net, 0.6) == 8
    blocks = [net.layer1[0], net.layer2[1], net.layer4[1]]  # rates 0, 0.6 x 3/7, 0.6
    # the hooks registered after apply_drop_path's see the branch's output after the drop
    ends = [(f"b{i}", b.bn2) for i, b in enumerate(blocks)]
    x = torch.rand(400, 3, 16, 16)
    net.train()
    dropped = _dropped_rows(net, ends, x)
    assert dropped["b0"] == 0 and abs(dropped["b1"] - 0.6 * 3 / 7) < 0.08 and abs(dropped["b2"] - 0.6) < 0.08, dropped
    net.eval()
    assert set(_dropped_rows(net, ends, x).values()) == {0.0}


def test_stochastic_depth_reaches_torchvision_vit_and_timm_blocks():
    from timm.layers import DropPath
    from torchvision.models.vision_transformer import VisionTransformer

    from trainer.models.regularize import apply_drop_path

    vit = VisionTransformer(
        image_size=16, patch_size=8, num_layers=3, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3
    )
    assert apply_drop_path(vit, 0.5) == 3
    last = vit.encoder.layers[-1]
    assert len(last.mlp._forward_hooks) == 1 and len(last.dropout._forward_hooks) == 1
    assert not vit.encoder.layers[0].mlp._forward_hooks  # rate 0 for the first block
    import timm

    t = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3, depth=3)
    assert apply_drop_path(t, 0.2) == 3
    assert isinstance(t.blocks[-1].drop_path1, DropPath) and abs(t.blocks[-1].drop_path1.drop_prob - 0.2) < 1e-9
    assert abs(t.blocks[1].drop_path2.drop_prob - 0.1) < 1e-9


def test_zero_init_residual_starts_each_block_as_the_identity():
    from torchvision.models import resnet50

    from trainer.models.regularize import zero_init_residual

    net = resnet50(num_classes=4)
    assert zero_init_residual(net) == 16
    assert all(float(b.bn3.weight.abs().sum()) == 0 for layer in (net.layer1, net.layer4) for b in layer)
    block = net.layer1[1].eval()  # no downsample: its output is relu(input)
    x = torch.rand(2, 256, 8, 8)
    with torch.no_grad():
        assert torch.allclose(block(x), torch.relu(x))


def test_the_model_ingredients_are_applied_by_the_config_and_refused_where_they_cannot_act(compose):
    from trainer.models import build_module

    module = build_module(compose("+recipe=resnet50", "scale=smoke", "zero_init_residual=true", "drop_path_rate=0.1"))
    assert float(module.net.layer1[0].bn3.weight.abs().sum()) == 0
    assert len(module.net.layer4[-1].bn3._forward_hooks) == 1
    with pytest.raises(ConfigError, match="drop_path_rate=0.1: 'model._target_=trainer.models.tiny"):
        build_module(compose("drop_path_rate=0.1"))
    with pytest.raises(ConfigError, match="zero_init_residual=true"):
        build_module(compose("+recipe=vit", "scale=smoke", "zero_init_residual=true"))
    with pytest.raises(ConfigError, match="data.eval_image_size=64"):
        build_module(compose("+recipe=vit", "scale=smoke", "data.eval_image_size=64"))
    with pytest.raises(ConfigError, match="data.mixup_alpha=0.2: these act in the built-in classifier"):
        build_module(compose("model._target_=trainer.examples.MyLightningModule", "data.mixup_alpha=0.2"))


def test_weight_decay_groups_follow_the_norm_and_bias_keys():
    from types import SimpleNamespace

    from trainer.models.optimizers import build_optimizer

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    net(torch.rand(1, 3, 5, 5))
    conv_w, conv_b, bn_w, bn_b, fc_w, fc_b = (
        net[0].weight,
        net[0].bias,
        net[1].weight,
        net[1].bias,
        net[3].weight,
        net[3].bias,
    )

    def groups(norm, bias, name="sgd"):
        cfg = SimpleNamespace(
            name=name, lr=0.1, momentum=0.9, nesterov=False, betas=[0.9, 0.999], weight_decay=0.01, fused="auto"
        )
        cfg.get = lambda k, d=None: {"norm_weight_decay": norm, "bias_weight_decay": bias}.get(k, getattr(cfg, k, d))
        opt = build_optimizer(net, cfg)
        return opt, {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}

    _, wd = groups(0.0, 0.0)
    assert [wd[id(p)] for p in (conv_w, fc_w, conv_b, fc_b, bn_w, bn_b)] == [0.01, 0.01, 0, 0, 0, 0]
    opt, wd = groups(None, 0.0)  # norms decay as the weights do, biases not
    assert [wd[id(p)] for p in (conv_w, bn_w, bn_b, conv_b)] == [0.01, 0.01, 0.01, 0] and len(opt.param_groups) == 3
    _, wd = groups(0.0, None)
    assert [wd[id(p)] for p in (bn_w, conv_b, fc_b)] == [0, 0.01, 0.01]
    from timm.optim import Lamb

    opt, _ = groups(0.0, 0.0, name="lamb")
    before = fc_w.detach().clone()
    net(torch.rand(2, 3, 5, 5)).sum().backward()
    opt.step()
    assert isinstance(opt, Lamb) and not torch.equal(before, fc_w)


def test_repeated_augmentation_repeats_each_sample_on_different_ranks_and_keeps_the_epoch_length():
    from pytorch_lightning.trainer.connectors.data_connector import _get_distributed_sampler
    from pytorch_lightning.trainer.states import RunningStage
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.data.sampler import EpochShuffleSampler, RepeatedSamples, deal_to_ranks

    sampler = EpochShuffleSampler(12, seed=1, repeats=3)
    draws = list(sampler)
    assert len(draws) == 12 and len(set(draws)) == 12  # every draw its own index (its own augmentation seed)
    samples = [d % 12 for d in draws]
    assert samples == [s for s in samples[::3] for _ in range(3)]  # 4 samples, 3 times each, in a row
    assert RepeatedSamples(list(range(12)), 3)[draws[1]] == samples[1]
    loader = DataLoader(RepeatedSamples(list(range(12)), 3), sampler=sampler, batch_size=2)

    def lightnings(rank):  # what Lightning puts in a plain sampler's place for training (shuffle=True)
        return _get_distributed_sampler(loader, True, 0, RunningStage.TRAINING, num_replicas=3, rank=rank)

    def ours(rank):  # the datamodule's own: already distributed, so Lightning leaves it in place
        dealt = deal_to_ranks(sampler, rank, 3)
        assert isinstance(dealt, DistributedSampler)  # (DataConnector._requires_distributed_sampler)
        return dealt

    ranks = [list(ours(r)) for r in range(3)]
    for k in range(4):  # with 3 ranks, the 3 repeats of each sample land one on each rank
        assert [[d % 12 for d in rank][k] for rank in ranks] == [samples[3 * k]] * 3
    assert all(len({d % 12 for d in rank}) == 4 for rank in ranks)  # no rank draws a sample twice
    scattered = [list(lightnings(r)) for r in range(3)]  # Lightning's shuffle first would not keep them apart
    assert any(len({d % 12 for d in rank}) < 4 for rank in scattered), scattered
    sampler.set_epoch(1)
    assert [d % 12 for d in sampler][::3] != samples[::3]


def test_repeats_of_a_sample_are_augmented_differently_without_loader_workers(compose, small_images):
    from trainer.data.datamodule import ImageDataModule

    cfg = compose(
        "data=imagefolder",
        f"data.root={small_images}",
        "data.repeated_augment=2",
        "data.batch_size=4",
        "data.image_size=16",
    )
    dm = ImageDataModule(cfg.data)
    dm.build()
    loader = dm.train_dataloader()
    x, y = next(iter(loader))
    assert len(loader.sampler) == len(dm.train_set) and torch.equal(y[0], y[1]) and torch.equal(y[2], y[3])
    assert not torch.equal(x[0], x[1])  # same image, two different crops


def test_repeated_augmentation_is_refused_where_samples_are_not_drawn_by_index(compose, tmp_path, caplog):
    from trainer.data.datamodule import ImageDataModule

    with pytest.raises(ConfigError, match="data.repeated_augment=3 .*data=parquet cannot"):
        ImageDataModule(compose("data=parquet", f"data.root={tmp_path}", "data.repeated_augment=3").data).build()
    synthetic = ImageDataModule(compose("data.repeated_augment=3").data)  # nothing to augment: said, and off
    with caplog.at_level("INFO"):
        synthetic.build()
    assert synthetic.repeats == 1 and "does nothing with data=synthetic" in caplog.text


def test_test_time_flip_averages_each_image_with_its_mirror(compose):
    from trainer.models import build_module

    module = build_module(compose("eval_hflip=true"))
    seen = []
    module.net.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    module.log = lambda *a, **k: None
    x = torch.rand(2, 3, 16, 16)
    module.validation_step((x, torch.tensor([0, 1])), 0)
    assert len(seen) == 2 and torch.equal(seen[0], x) and torch.equal(seen[1], x.flip(-1))
    module.eval_hflip = False
    module.validation_step((x, torch.tensor([0, 1])), 0)
    assert len(seen) == 3


def test_a_packed_dataset_gets_the_policy_and_erasing_after_its_own_crop(tmp_path, small_images):
    from trainer.data.augment import Augmentation
    from trainer.data.pack import pack
    from trainer.data.packed import PackedImages

    pack(str(small_images), str(tmp_path / "p"), 16)

    def first(augment):
        torch.manual_seed(0)
        return PackedImages(str(tmp_path / "p" / "train"), 16, True, augment, keep_uint8=True)[0][0]

    assert torch.equal(first(True), first(Augmentation()))
    assert not torch.equal(first(Augmentation()), first(Augmentation(policy="autoaugment", random_erasing=1.0)))


def test_the_loss_and_the_schedule_follow_their_keys(compose):
    import torch.nn.functional as F

    from trainer.models import build_module
    from trainer.models.optimizers import warmup_cosine

    module = build_module(compose("loss.name=bce", "data.num_classes=4"))
    x, y = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    module.log = lambda *a, **k: None
    with torch.no_grad():
        expected = F.binary_cross_entropy_with_logits(module(x), F.one_hot(y, 4).float())
        assert torch.allclose(module.training_step((x, y), 0), expected)
    linear, cosine = warmup_cosine(110, 10, 0.0, "linear"), warmup_cosine(110, 10, 0.0, "cosine")
    assert linear(9) == cosine(9) == 1.0 and abs(linear(60) - 0.5) < 1e-9 and abs(linear(35) - 0.75) < 1e-9
    assert abs(cosine(35) - 0.5 * (1 + math.cos(math.pi / 4))) < 1e-9 and linear(110) == 0.0
    from trainer.models.optimizers import build_scheduler

    sched_cfg = compose("sched.name=linear", "sched.warmup_epochs=1").sched
    opt = torch.optim.SGD(module.parameters(), lr=1.0)
    factor = build_scheduler(opt, sched_cfg, total_steps=110, max_epochs=11)["scheduler"].lr_lambdas[0]
    assert abs(factor(35) - 0.75) < 1e-9  # 10 warm-up steps, then a straight line to 0 at step 110


def test_repeats_reach_a_subset_through_the_loaders_batched_fetch():
    """A Subset (an image folder split by data.val_split) has a batched fetch the loader calls: the
    repeats' indices (i + k x n) must reach it as the samples they are."""
    from torch.utils.data import DataLoader, Subset

    from trainer.data.sampler import EpochShuffleSampler, RepeatedSamples

    base = Subset(list(range(100, 120)), list(range(0, 20, 2)))  # 10 samples: 100, 102, ...
    sampler = EpochShuffleSampler(10, seed=0, repeats=2)
    batches = list(DataLoader(RepeatedSamples(base, 2), sampler=sampler, batch_size=5))
    seen = [int(v) for batch in batches for v in batch]
    assert seen == [base[d % 10] for d in sampler] and len(set(seen)) == 5


def test_mixing_leaves_the_global_rngs_alone_and_each_rank_mixes_its_own_way(compose, monkeypatch):
    import random

    from trainer.data.mixing import BatchMixing
    from trainer.models import build_module
    from trainer.models.classifier import ImageClassifier

    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    torch.manual_seed(5)
    random.seed(5)
    before = torch.get_rng_state(), random.getstate()
    for seed in range(4):  # both kinds
        BatchMixing(0.5, 1.0, num_classes=4)(images, labels, seed=seed)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]

    module = build_module(compose("data.mixup_alpha=0.5", "data.num_classes=4"))
    seen = []
    module.net.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    x, y = torch.rand(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    for rank in (0, 0, 1):
        monkeypatch.setattr(ImageClassifier, "global_rank", property(lambda self, r=rank: r))
        module.training_step((x, y), 3)
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[0], seen[2])


def test_packed_validation_comes_at_the_eval_size(tmp_path, small_images):
    from trainer.data.augment import Augmentation
    from trainer.data.pack import pack
    from trainer.data.packed import PackedImages

    pack(str(small_images), str(tmp_path / "p"), 16)
    aug = Augmentation(eval_image_size=24)
    assert PackedImages(str(tmp_path / "p" / "val"), 16, False, aug, keep_uint8=True)[0][0].shape[-2:] == (24, 24)
    assert PackedImages(str(tmp_path / "p" / "train"), 16, True, aug, keep_uint8=True)[0][0].shape[-2:] == (16, 16)


def test_stochastic_depth_reaches_timm_resnets_whose_rate_zero_blocks_hold_none():
    import timm
    from timm.layers import DropPath

    from trainer.models.regularize import apply_drop_path

    net = timm.create_model("resnet18", num_classes=3)
    assert net.layer1[0].drop_path is None
    assert apply_drop_path(net, 0.3) == 8
    assert net.layer1[0].drop_path is None and isinstance(net.layer4[1].drop_path, DropPath)
    assert abs(net.layer4[1].drop_path.drop_prob - 0.3) < 1e-9


def test_custom_data_says_which_image_keys_it_cannot_use(compose, caplog):
    from trainer.data.datamodule import ImageDataModule

    cfg = compose(
        "data=custom",
        "data.dataset._target_=spies.SlowDataset",
        "+data.dataset.sleep_ms=0",
        "data.augment_policy=randaugment",
        "data.eval_image_size=24",
    )
    with caplog.at_level("WARNING"):
        ImageDataModule(cfg.data).build()
    assert "data.augment_policy=randaugment, data.eval_image_size=24: these act in the trainer's own" in caplog.text


def test_under_ddp_the_torch_loader_deals_repeats_itself_so_lightning_leaves_its_sampler(compose, small_images):
    """The datamodule's training loader with data.repeated_augment on a rank of two: its sampler is
    already distributed (Lightning replaces only one that is not) and deals the draws in turn."""
    from types import SimpleNamespace

    from torch.utils.data import DistributedSampler

    from trainer.data import ImageDataModule

    cfg = compose("data=imagefolder", f"data.root={small_images}", "data.repeated_augment=2", "data.image_size=16")
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.trainer = SimpleNamespace(
        world_size=2, global_rank=1, current_epoch=0, limit_train_batches=1.0, limit_val_batches=1.0
    )
    dm.build()
    sampler = dm.train_dataloader().sampler
    assert isinstance(sampler, DistributedSampler) and sampler.shuffle is False and sampler.rank == 1, sampler


@pytest.mark.parametrize("name", ["resnet50_a3", "vit_deit"])
def test_a_recipes_randaugment_runs_at_the_recipes_magnitude_and_ops(compose, name):
    """A3's magnitude 18 and DeiT's 27 reach the RandAugment that transforms the training images (the
    default, 9, would be a silently weaker recipe)."""
    from torchvision.transforms import v2

    from trainer.data.augment import Augmentation, transforms_for

    cfg = compose(f"+recipe={name}")
    magnitude, ops = cfg.data.randaugment_magnitude, cfg.data.randaugment_ops
    assert cfg.data.augment_policy == "randaugment" and magnitude != Augmentation().magnitude
    for uint8 in (False, True):
        steps = transforms_for(cfg.data.image_size, True, Augmentation.of(cfg.data), keep_uint8=uint8).transforms
        (policy,) = [s for s in steps if isinstance(s, v2.RandAugment)]
        assert (policy.magnitude, policy.num_ops) == (magnitude, ops), name


def test_stochastic_depth_scales_the_branches_it_keeps_by_one_over_the_keep_rate():
    """A dropped branch is 0 and a kept one is divided by 1 - rate, so the block's output keeps its
    expectation in training (without the rescale, evaluation would see branches larger than training did)."""
    import timm
    from torchvision.models import resnet18

    from trainer.models.regularize import apply_drop_path

    torch.manual_seed(0)
    net = resnet18(num_classes=4).train()
    end = net.layer4[1].bn2
    raw = []
    end.register_forward_hook(lambda m, i, o: raw.append(o.detach().clone()))  # before the drop's hook
    apply_drop_path(net, 0.6)
    after = []
    end.register_forward_hook(lambda m, i, o: after.append(o.detach().clone()))
    with torch.no_grad():
        net(torch.rand(64, 3, 16, 16))
    before, dropped = raw[0].flatten(1), after[0].flatten(1)
    kept = ~(dropped == 0).all(1)
    assert 0 < int(kept.sum()) < 64
    assert torch.allclose(dropped[kept], before[kept] / (1 - 0.6), rtol=1e-5, atol=1e-6)
    t = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3, depth=3)
    apply_drop_path(t, 0.4)
    drop = t.blocks[-1].drop_path1.train()
    out = drop(torch.ones(256, 4))
    values = torch.unique(out).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - 0.4)), values
