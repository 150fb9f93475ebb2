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

    @property
    def changes_pixels_beyond_crop(self) -> bool:
        """A policy or erasing: work per image that a plain crop + flip does not do."""
        return self.policy != "none" or self.random_erasing > 0


def policy_transform(augment: Augmentation):
    """The automatic augmentation policy (a v2 transform on uint8 images), or None."""
    from torchvision.transforms import v2

    if augment.policy == "randaugment":
        return v2.RandAugment(num_ops=augment.num_ops, magnitude=augment.magnitude)
    if augment.policy == "trivialaugment":
        return v2.TrivialAugmentWide()
    if augment.policy == "autoaugment":
        return v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)
    return None


def transforms_for(image_size: int, train: bool, augment, keep_uint8: bool = False):
    """torchvision v2 transforms: they take PIL images and uint8 tensors alike (any decoder).

    ``augment``: an Augmentation, or ``data.augment``'s bool alone. Training: crop + flip, the policy
    (on uint8, as torchvision's reference scripts order it), then float conversion, normalization and
    random erasing. Validation: resize + center crop at the eval size. ``keep_uint8``
    (``data.gpu_normalize``): the device converts and normalizes, so erasing fills with 0 (black) on
    the uint8 image rather than 0 after normalization (the mean colour).
    """
    import torch
    from torchvision.transforms import v2

    from .gpu_transforms import IMAGENET_MEAN, IMAGENET_STD

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
    erasing = [v2.RandomErasing(p=augment.random_erasing, value=0)] if train and augment.random_erasing > 0 else []
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
    from torchvision.transforms import v2

    augment = Augmentation.coerce(augment)
    steps = [s for s in (policy_transform(augment),) if s is not None]
    if augment.random_erasing > 0:
        steps.append(v2.RandomErasing(p=augment.random_erasing, value=0))
    return v2.Compose(steps) if steps else None
