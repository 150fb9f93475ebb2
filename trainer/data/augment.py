"""The per-image augmentation of real images, built once from the ``data.*`` keys and used by every
format that decodes images (image folders, CIFAR-10, Parquet and WebDataset shards, nvJPEG).

What the published recipes use, from ``torchvision.transforms.v2`` (the reference scripts' own
ops): random-resized crop + flip (``data.augment``; ``data.crop_min_scale`` is the least area
fraction a crop keeps: 0.08 in the ImageNet recipes), an automatic policy after it
(``data.augment_policy``: RandAugment, TrivialAugmentWide or AutoAugment's ImageNet policy), random
erasing after normalization (``data.random_erasing``), and validation's resize + center crop at its
own size (``data.eval_image_size``, ``data.eval_resize_ratio``: torchvision's v2 recipe trains at 176
and validates a 224 crop of a 232 resize). Batch-level mixing (mixup, cutmix) is not per image: see
``mixing.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torchvision.transforms import v2

from trainer.data.gpu_transforms import IMAGENET_MEAN, IMAGENET_STD

CROP_RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's range of aspect ratios (width / height), torchvision's default
POLICIES = ("none", "randaugment", "trivialaugment", "autoaugment")


@dataclass(frozen=True)
class Augmentation:
    """What a transform does to each image; ``Augmentation.of(data_cfg)``. Frozen and picklable: loader
    workers get it with the dataset."""

    crop_flip: bool = True  # data.augment: random-resized crop + horizontal flip in training
    crop_min_scale: float = 0.35
    policy: str = "none"
    magnitude: int = 9  # RandAugment's magnitude (of 31 bins, torchvision's scale)
    num_ops: int = 2  # RandAugment's ops per image
    random_erasing: float = 0.0  # probability per training image
    eval_image_size: Optional[int] = None  # validation's crop side (None: the training size)
    eval_resize_ratio: float = 1.14  # validation resizes the short side to eval size x this, then center-crops

    @classmethod
    def of(cls, data_cfg) -> "Augmentation":
        get = data_cfg.get
        return cls(
            crop_flip=bool(get("augment", True)),
            crop_min_scale=float(get("crop_min_scale", 0.35)),
            policy=str(get("augment_policy", "none")),
            magnitude=int(get("randaugment_magnitude", 9)),
            num_ops=int(get("randaugment_ops", 2)),
            random_erasing=float(get("random_erasing", 0.0)),
            eval_image_size=get("eval_image_size"),
            eval_resize_ratio=float(get("eval_resize_ratio", 1.14)),
        )

    @classmethod
    def coerce(cls, augment) -> "Augmentation":
        """An Augmentation as given, or ``data.augment``'s bool alone (every other key at its default)."""
        return augment if isinstance(augment, Augmentation) else cls(crop_flip=bool(augment))

    @property
    def crop_scale(self) -> tuple:
        return (self.crop_min_scale, 1.0)

    def eval_size(self, image_size: int) -> int:
        return int(self.eval_image_size or image_size)

    def eval_resize(self, image_size: int) -> int:
        return int(round(self.eval_size(image_size) * self.eval_resize_ratio))

    def set_keys(self) -> list:
        """The ``data.*`` keys beyond data.augment set away from their defaults, as key=value."""
        names = {
            "crop_min_scale": "crop_min_scale",
            "policy": "augment_policy",
            "magnitude": "randaugment_magnitude",
            "num_ops": "randaugment_ops",
            "random_erasing": "random_erasing",
            "eval_image_size": "eval_image_size",
            "eval_resize_ratio": "eval_resize_ratio",
        }
        default = Augmentation()
        return [f"data.{key}={getattr(self, f)}" for f, key in names.items() if getattr(self, f) != getattr(default, f)]


def policy_transform(augment: Augmentation):
    """The automatic augmentation policy (a v2 transform on uint8 images), or None."""
    bilinear = v2.InterpolationMode.BILINEAR  # as torchvision's reference presets pass (the ops' default: nearest)
    if augment.policy == "randaugment":
        return v2.RandAugment(num_ops=augment.num_ops, magnitude=augment.magnitude, interpolation=bilinear)
    if augment.policy == "trivialaugment":
        return v2.TrivialAugmentWide(interpolation=bilinear)
    if augment.policy == "autoaugment":
        return v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=bilinear)
    return None


def _erasing(p: float, uint8: bool = False):
    """Random erasing that fills with 0 after normalization: the mean colour. ``uint8``: on a uint8
    image before normalization (data.gpu_normalize), where the same fill is the mean colour's pixels."""
    # the class is made when first used (torchvision is imported then), and found by name (__getattr__ below)
    cls = globals().get("RandomErasingZero") or __getattr__("RandomErasingZero")
    erasing = cls(p=p, value=0)
    erasing.fill = MEAN_PIXELS if uint8 else (0.0, 0.0, 0.0)
    return erasing


# the ImageNet mean as uint8 pixels: what 0 after normalization is before it
MEAN_PIXELS = (124, 116, 104)


def _random_erasing_zero():
    class RandomErasingZero(v2.RandomErasing):
        """torchvision's RandomErasing (its box rule), filling each channel with a Python number
        (``fill``): on a CUDA image (data.decoder=nvjpeg transforms on the device) its own fill is a
        CPU tensor copied in, a host wait per image."""

        fill = (0.0, 0.0, 0.0)

        def transform(self, inpt, params):
            if params["v"] is None:
                return inpt
            i, j, h, w = params["i"], params["j"], params["h"], params["w"]
            out = inpt.clone()
            if len(set(self.fill)) == 1 or out.ndim < 3:
                out[..., i : i + h, j : j + w] = self.fill[0]
            else:
                for c, value in enumerate(self.fill):
                    out[..., c, i : i + h, j : j + w] = value
            return out

    RandomErasingZero.__module__, RandomErasingZero.__qualname__ = __name__, "RandomErasingZero"  # picklable by name
    return RandomErasingZero


def __getattr__(name: str):
    if name == "RandomErasingZero":
        globals()[name] = _random_erasing_zero()
        return globals()[name]
    raise AttributeError(name)


def transforms_for(image_size: int, train: bool, augment, keep_uint8: bool = False):
    """torchvision v2 transforms: they take PIL images and uint8 tensors alike (any decoder).

    ``augment``: an Augmentation, or ``data.augment``'s bool alone. Training: crop + flip, the policy
    (on uint8, as torchvision's reference scripts order it), then float conversion, normalization and
    random erasing. Validation: resize + center crop at the eval size. ``keep_uint8``
    (``data.gpu_normalize``, the default): the batch stays uint8 and is converted and normalized
    after the loader, in one pass over the batch; erasing then fills with the mean colour's pixels,
    what 0 after normalization is.
    """
    augment = Augmentation.coerce(augment)
    steps = [v2.ToImage()]
    if train and augment.crop_flip:
        steps += [
            v2.RandomResizedCrop(image_size, scale=augment.crop_scale, ratio=CROP_RATIO, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    elif train:
        steps += [
            v2.Resize(int(round(image_size * augment.eval_resize_ratio)), antialias=True),
            v2.CenterCrop(image_size),
        ]
    else:
        steps += [
            v2.Resize(augment.eval_resize(image_size), antialias=True),
            v2.CenterCrop(augment.eval_size(image_size)),
        ]
    policy = policy_transform(augment) if train else None
    if policy is not None:
        steps.append(policy)
    erasing = [_erasing(augment.random_erasing, keep_uint8)] if train and augment.random_erasing > 0 else []
    if keep_uint8:  # data.gpu_normalize: the device converts and normalizes
        return v2.Compose(steps + erasing + [v2.ToPureTensor()])
    return v2.Compose(
        steps
        + [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        + erasing
        + [v2.ToPureTensor()]
    )


def uint8_train_steps(augment):
    """The policy and erasing for a format that crops on its own (data=packed): applied to its uint8
    CHW tensor after its crop + flip, or None when there is nothing to apply."""
    augment = Augmentation.coerce(augment)
    steps = [s for s in (policy_transform(augment),) if s is not None]
    if augment.random_erasing > 0:
        steps.append(_erasing(augment.random_erasing, uint8=True))
    return v2.Compose(steps) if steps else None
