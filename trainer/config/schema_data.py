"""The schema's ``data.`` section: the dataset, its augmentation, and the input pipeline's switches.

The largest section by far (every dataset's settings, the recipes' augmentations, the loader's
optimization flags), so it has its own module; ``schema.TrainSchema`` places it under ``data``.
The order of its fields is their order under ``data:`` in ``--cfg job``'s output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trainer.config.keys import OPTIMIZATION, RECIPE, SETTING, is_fraction, is_non_negative, key


@dataclass
class DataConfig:
    name: str = key(
        "synthetic",
        "the dataset",
        choices=(
            "synthetic",
            "imagefolder",
            "builtin",
            "custom",
            "packed",
            "parquet",
            "webdataset",
            "cifar10",
            "imagenette",
        ),
    )
    # imagefolder: a folder of class subfolders, or with train/ and val/ inside; cifar10 / imagenette:
    # files laid out as torchvision's download (read as they are; unset: downloaded into the cache)
    root: Optional[str] = None
    batch_size: Any = key(
        32,
        "per-process batch: an integer, or auto (the largest that fits; see batch_finder)",
        check=(lambda v: v >= 1, "an integer >= 1, or auto"),
        flag=SETTING,
    )
    image_size: int = key(32, "pixels per side", check=(lambda v: v >= 8, "an integer >= 8 (pixels)"))
    num_classes: int = key(10, "follows the data unless given", check=(lambda v: v >= 2, "an integer >= 2"))
    num_workers: int = key(
        0,
        "DataLoader worker processes",
        check=(lambda v: v >= 0, "an integer >= 0 (0 loads in the main process)"),
        flag=SETTING,
    )
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = key(
        None, "batches each worker loads ahead", check=(lambda v: v is None or v >= 1, "null or an integer >= 1")
    )
    drop_last: bool = True
    # synthetic: samples per epoch (a fixed pool of distinct images is cycled through)
    num_samples: int = key(1024, check=(lambda v: v >= 1, "an integer >= 1"))
    val_samples: int = 256
    # imagefolder without train/ and val/ subfolders: fraction of each class held out for validation
    val_split: float = key(0.2, check=(lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1)"))
    # the held-out split's own seed, apart from `seed`: runs of any seed (a seed sweep, repeat_seeds) are
    # judged on the same images, and every format holds out the same ones (trainer.pack's --seed is 42 too).
    # data=synthetic draws its images (val set included) from the run's seed
    split_seed: int = key(
        42,
        "the seed of the data.val_split hold-out (not the run's seed: with a held-out split, every seed validates on the same images)",
        check=(lambda v: 0 <= v <= 2**63 - 1, "a whole number >= 0"),
    )
    # builtin, cifar10, imagenette: the trainer's cache, where the generated JPEG folder or the download
    # is kept (null: $TRAINER_CACHE, else ~/.cache/trainer); builtin: images per class and their size
    cache_dir: Optional[str] = None
    images_per_class: int = 100
    stored_size: int = 160
    # cifar10 / imagenette with data.root unset: the archive fetched once into the cache (trainer/data/standard.py)
    imagenette_size: str = key(
        "160px",
        "imagenette: the archive's image size (short side 160 or 320 px, or full)",
        choices=("160px", "320px", "full"),
    )
    download_url: str = key("auto", "cifar10 / imagenette: the archive's URL (auto: torchvision's; or a mirror's)")
    download_md5: Optional[str] = key(
        "auto",
        "cifar10 / imagenette: the archive's MD5 (auto: torchvision's; null: not checked, for a mirror you trust)",
    )
    # augmentation of real images in training (trainer/data/augment.py); recipes set the rest
    augment: bool = key(True, "random-resized crop + horizontal flip in training", flag=RECIPE)
    crop_min_scale: float = key(
        0.35,
        "the least area fraction a random-resized crop keeps (0.08 in the ImageNet recipes)",
        check=(lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
        flag=RECIPE,
    )
    augment_policy: str = key(
        "none",
        "an automatic augmentation policy after the crop (torchvision v2)",
        choices=("none", "randaugment", "trivialaugment", "autoaugment"),
        flag=RECIPE,
    )
    randaugment_magnitude: int = key(
        9,
        "augment_policy=randaugment: magnitude of its ops (0-30)",
        check=(lambda v: 0 <= v <= 30, "0 to 30"),
        flag=RECIPE,
    )
    randaugment_ops: int = key(
        2, "augment_policy=randaugment: ops per image", check=(lambda v: v >= 1, "an integer >= 1"), flag=RECIPE
    )
    random_erasing: float = key(
        0.0,
        "probability that a training image gets a random rectangle erased",
        check=(is_fraction, "a probability in [0, 1]"),
        flag=RECIPE,
    )
    mixup_alpha: float = key(
        0.0,
        "mixup's Beta(alpha, alpha) per training batch (0: off; with cutmix_alpha, each batch gets one of the two)",
        check=(is_non_negative, "0 (off) or a number > 0"),
        flag=RECIPE,
    )
    cutmix_alpha: float = key(
        0.0,
        "cutmix's Beta(alpha, alpha) per training batch (0: off)",
        check=(is_non_negative, "0 (off) or a number > 0"),
        flag=RECIPE,
    )
    repeated_augment: int = key(
        1,
        "repeated augmentation: each sample this many times per epoch, differently augmented, on different ranks "
        "(the epoch's length is unchanged; 1: off)",
        check=(lambda v: v >= 1, "an integer >= 1 (1: off)"),
        flag=RECIPE,
    )
    eval_image_size: Optional[int] = key(
        None,
        "validation's image size (null: image_size), e.g. train 176 / eval 224",
        check=(lambda v: v is None or v >= 8, "null or an integer >= 8 (pixels)"),
        flag=RECIPE,
    )
    eval_resize_ratio: float = key(
        1.14,
        "validation resizes the short side to this x its image size, then center-crops (1.14 = 256/224)",
        check=(lambda v: v >= 1, "a number >= 1"),
        flag=RECIPE,
    )
    # an image file that cannot be decoded: skip it (and count it) or stop with its path
    on_bad_sample: str = key("skip", choices=("skip", "stop"))
    # input pipeline switches
    auto_workers: bool = key(False, "pick num_workers from the cores (and ranks) of this machine", flag=OPTIMIZATION)
    gpu_normalize: bool = key(
        True,
        "ship uint8 batches; convert and normalize them after the loader, on the device, in one pass over the batch",
        flag=OPTIMIZATION,
    )
    device_prefetch: bool = key(
        False, "CUDA: copy the next batch to the GPU on a side stream during the step", flag=OPTIMIZATION
    )
    device_resident: bool = key(
        False, "synthetic: keep the images on the device; batches are gathered there", flag=OPTIMIZATION
    )
    decoder: str = key(
        "pil",
        "JPEG decoder: pil, torchvision, turbo (libjpeg-turbo via simplejpeg), nvjpeg (CUDA)",
        choices=("pil", "torchvision", "turbo", "nvjpeg"),
        flag=OPTIMIZATION,
    )
    nvjpeg_library: str = key(
        "torchvision",
        "decoder=nvjpeg: whose nvJPEG call decodes, torchvision's decode_jpeg or NVIDIA's nvImageCodec (ordered on a stream)",
        choices=("torchvision", "nvimgcodec"),
        flag=OPTIMIZATION,
    )
    loader: str = key(
        "torch",
        "input pipeline: torch (DataLoader, loader workers) or dali (NVIDIA DALI's threads; nvJPEG on a GPU)",
        choices=("torch", "dali"),
        flag=OPTIMIZATION,
    )
    decode_scale: str = key(
        "off",
        "auto: decode JPEGs at 1/2, 1/4 or 1/8 size where the crop needs no more (pil, turbo)",
        choices=("off", "auto"),
        flag=OPTIMIZATION,
    )
    cache_in_memory: bool = key(False, "keep the encoded image files in RAM after the first read", flag=OPTIMIZATION)
    cache: Optional[str] = key(
        None, "copy data.root to this local folder once (checksummed, resumable), read from there", flag=OPTIMIZATION
    )
    # data.root as an fsspec URL: passed to fsspec (e.g. {anon: true}, {endpoint_url: ...}); credentials from AWS_* env vars
    storage_options: Any = None
    # parquet / webdataset: samples are shuffled within windows of this many consecutive samples
    # (after shuffling the row groups / shards); a loader worker holds the blocks one window spans
    shuffle_window: int = key(
        1024,
        check=(
            lambda v: v >= 1,
            "an integer >= 1 (samples shuffled together; 1: row groups / shards in order, each shuffled inside)",
        ),
    )
    # data=custom: any map-style Dataset of (image tensor, label) by _target_ (val_dataset optional)
    dataset: Any = None
    val_dataset: Any = None
