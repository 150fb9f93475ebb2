"""The config schema (Hydra structured configs) and every check on user input.

The schema is registered in Hydra's ConfigStore as ``train_schema`` and sits first in
``configs/train.yaml``'s defaults list, so Hydra itself rejects unknown keys and wrong types.
Hydra's own messages for those are terse and come with a hint about HYDRA_FULL_ERROR, so
``check_overrides`` looks at the command line first and explains the mistake in one paragraph
(the key, what is allowed, the closest valid key). ``validate`` then checks ranges and
combinations on the composed config, where the hardware is known.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional

from trainer.errors import ConfigError

# Config groups: selecting one of these is not a value override.
GROUPS = ("data", "model", "scale", "recipe", "bench", "logger")

OPTIMIZATION = "optimization"  # a switch that changes how fast the same training runs (SPEC's switchboard)
SETTING = "setting"  # a run setting the A/B report compares too (devices, batch size, workers, profile)
RECIPE = "recipe"  # a recipe's ingredient: changes what is learned (augmentation, regularization, optimizer)


def key(
    default: Any = None,
    help: str = "",
    *,
    choices: tuple = (),
    check: tuple = (),
    flag: str = "",
    lightning: Optional[str] = None,
    factory: Any = None,
) -> Any:
    """A schema field and everything said about it, in one place: its default, its help text, its
    allowed values (``choices``) or range (``check``: a predicate and what it allows), and whether
    it is a flag metrics.json records (``flag``: OPTIMIZATION, SETTING or RECIPE); under ``trainer.``, the
    Lightning Trainer argument it is passed as (``lightning``: "" for none). CHOICES, RANGES,
    FLAG_KEYS, the Trainer's arguments and ``train.py --help`` are derived from these."""
    metadata = {"help": help, "choices": tuple(choices), "check": tuple(check), "flag": flag}
    if lightning is not None:
        metadata["lightning"] = lightning
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _positive(v) -> bool:
    return math.isfinite(v) and v > 0


def _non_negative(v) -> bool:
    return math.isfinite(v) and v >= 0


def _fraction(v) -> bool:
    return 0 <= v <= 1


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
        check=(_fraction, "a probability in [0, 1]"),
        flag=RECIPE,
    )
    mixup_alpha: float = key(
        0.0,
        "mixup's Beta(alpha, alpha) per training batch (0: off; with cutmix_alpha, each batch gets one of the two)",
        check=(_non_negative, "0 (off) or a number > 0"),
        flag=RECIPE,
    )
    cutmix_alpha: float = key(
        0.0,
        "cutmix's Beta(alpha, alpha) per training batch (0: off)",
        check=(_non_negative, "0 (off) or a number > 0"),
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
    gpu_normalize: bool = key(False, "ship uint8 batches; convert and normalize on the device", flag=OPTIMIZATION)
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


@dataclass
class TrainerConfig:
    """Lightning Trainer arguments (``lightning_trainer_args``); only those whose meaning we keep stable.

    Every value Lightning accepts for these is accepted here too (null where Lightning takes None).
    The last three set how the console shows the run; each field says what Lightning gets from it.
    """

    max_epochs: Optional[int] = key(
        3,
        "-1: until stopped (needs sched.name=constant); null: Lightning's default",
        check=(lambda v: v is None or v >= -1, "an integer >= 0, -1 (train until stopped) or null"),
    )
    limit_train_batches: Any = 1.0  # a fraction, a number of batches, or null (all)
    limit_val_batches: Any = 1.0
    log_every_n_steps: Optional[int] = key(50, check=(lambda v: v is None or v >= 0, "an integer >= 0 or null"))
    gradient_clip_val: Optional[float] = None
    gradient_clip_algorithm: str = key("norm", choices=("norm", "value"))
    num_sanity_val_steps: int = key(
        0, "-1: the whole val set", check=(lambda v: v >= -1, "an integer >= 0, or -1 (the whole validation set)")
    )
    check_val_every_n_epoch: Optional[int] = key(1, check=(lambda v: v is None or v >= 1, "null or an integer >= 1"))
    deterministic: Any = key(False, "false, true or warn", choices=(False, True, "warn"))
    # null: show the progress bar only when stderr is a terminal (passed as decided: trainer.run)
    enable_progress_bar: Optional[bool] = key(
        None, "the progress bar; null: only when stderr is a terminal", lightning=""
    )
    progress_refresh_rate: int = key(
        20, "steps between progress bar updates (TQDMProgressBar's refresh_rate)", lightning=""
    )
    # Lightning's table of layers and parameter counts before training (off: the console stays short)
    model_summary: bool = key(
        False, "Lightning's table of layers and parameter counts before training", lightning="enable_model_summary"
    )


@dataclass
class OptimConfig:
    name: str = key(
        "sgd", "sgd, adamw, or lamb (timm's LAMB, for large batches)", choices=("sgd", "adamw", "lamb"), flag=RECIPE
    )
    lr: float = key(
        0.05, "at ref_batch_size (with lr_scaling); the recipes set their own", check=(lambda v: v > 0, "a number > 0")
    )
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-5
    # torchvision's reference-script names: the decay of normalization layers' parameters and of biases
    norm_weight_decay: Optional[float] = key(
        0.0,
        "weight decay of normalization layers' weights and biases (null: optim.weight_decay)",
        check=(lambda v: v is None or v >= 0, "null or a number >= 0"),
        flag=RECIPE,
    )
    bias_weight_decay: Optional[float] = key(
        0.0,
        "weight decay of the other layers' biases (null: optim.weight_decay)",
        check=(lambda v: v is None or v >= 0, "null or a number >= 0"),
        flag=RECIPE,
    )
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    # the batch size ``lr`` was tuned for: with lr_scaling, lr follows the effective batch size
    ref_batch_size: int = 32
    # optimizer implementation: auto (torch's choice), true (fused kernels), foreach, false (per-parameter loop)
    fused: Any = key(
        "auto",
        "optimizer kernels: auto (torch's choice), true (fused), foreach, false (a loop)",
        choices=("auto", True, False, "foreach"),
        flag=OPTIMIZATION,
    )
    zero_grad_to_none: bool = key(True, "zero_grad(set_to_none=True): gradients freed, not zeroed", flag=OPTIMIZATION)


@dataclass
class SchedConfig:
    name: str = key(
        "cosine",
        "after the warm-up: cosine or linear (a straight line; with the warm-up, FFCV's triangular schedule) "
        "down to min_lr_ratio, or constant",
        choices=("cosine", "linear", "constant"),
    )
    warmup_epochs: float = key(0.0, check=(lambda v: v >= 0, "a number >= 0"))
    min_lr_ratio: float = 0.0


@dataclass
class LossConfig:
    """The training loss (trainer/models/losses.py); it takes the soft targets mixup and cutmix make."""

    name: str = key(
        "cross_entropy",
        "cross_entropy (softmax), or bce (a sigmoid per class, as in timm's 'ResNet strikes back')",
        choices=("cross_entropy", "bce"),
        flag=RECIPE,
    )
    label_smoothing: float = key(
        0.0,
        "the target's mass spread over all classes",
        check=(lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
        flag=RECIPE,
    )
    bce_target_threshold: Optional[float] = key(
        None,
        "loss.name=bce: targets above this become 1, the rest 0 (timm's BinaryCrossEntropy; null: kept soft)",
        check=(lambda v: v is None or 0 <= v < 1, "null or a number in [0, 1)"),
        flag=RECIPE,
    )


@dataclass
class ScaleConfig:
    name: str = "full"
    # merged over the composed config (after the recipe), then the command line is applied again
    overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointConfig:
    """checkpoints/ in the run dir; last.ckpt is always kept and always the newest state."""

    enabled: bool = True
    every_n_epochs: Optional[int] = key(1, check=(lambda v: v is None or v >= 1, "null or an integer >= 1"))
    every_n_steps: Optional[int] = key(None, check=(lambda v: v is None or v >= 1, "null or an integer >= 1"))
    every_n_minutes: Optional[float] = key(
        None, check=(lambda v: v is None or v > 0, "null or a number of minutes > 0")
    )
    keep_last_k: int = key(
        1,
        "periodic checkpoints kept besides last.ckpt (-1: all)",
        check=(lambda v: v == -1 or v >= 0, "-1 (all) or an integer >= 0"),
    )
    monitor: Optional[str] = None  # also keep the best by this metric, e.g. val/acc
    mode: str = key("max", choices=("max", "min"))
    save_weights_only: bool = False


@dataclass
class ProfilerConfig:
    wait: int = 1
    warmup: int = 1
    active: int = key(3, check=(lambda v: v >= 1, "an integer >= 1"))
    repeat: int = 1
    skip_first: int = 1
    memory: bool = False
    with_stack: bool = False
    record_shapes: bool = False
    # CUDA: record allocator history over the run; writes profiler/memory_snapshot.pickle for
    # https://pytorch.org/memory_viz
    memory_snapshot: bool = False


@dataclass
class DDPConfig:
    """Speed knobs of DistributedDataParallel (strategy=ddp)."""

    static_graph: bool = False
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: Optional[float] = None  # null: torch's default (25 MB)
    find_unused_parameters: bool = False
    # DDP copies rank 0's buffers (BatchNorm's running statistics) to every rank before each forward:
    # one collective per step. Needed where the ranks' buffers drift apart (BatchNorm without
    # sync_batchnorm); false saves it where they agree anyway (sync_batchnorm, no BatchNorm)
    broadcast_buffers: bool = True


@dataclass
class FSDPConfig:
    """strategy=fsdp (GPU, Lightning FSDPStrategy); the wrap unit is the recipe's repeated block."""

    sharding_strategy: str = key("FULL_SHARD", choices=("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"))


@dataclass
class RuntimeConfig:
    """Process-level settings applied by re-launching the job (see trainer/launch.py)."""

    allocator: str = key(
        "default",
        "malloc by LD_PRELOAD (Debian: libjemalloc2, libtcmalloc-minimal4)",
        choices=("default", "jemalloc", "tcmalloc"),
        flag=OPTIMIZATION,
    )


@dataclass
class MonitorConfig:
    """System monitor: CPU, RSS, disk and NVML GPU readings every interval_s seconds."""

    enabled: bool = True
    interval_s: float = 5.0


@dataclass
class BatchFinderConfig:
    """data.batch_size=auto: power-of-two search with a real training step."""

    start: int = 2
    max_batch_size: int = 4096
    # CPU: the most a training step may take above the process's resting RSS (null: half of MemAvailable)
    memory_budget_mb: Optional[float] = None
    # CUDA: fraction of device memory kept free
    headroom: float = 0.1


@dataclass
class ProgressiveConfig:
    """progressive_resize=true: the training image size per epoch (trainer/data/progressive.py)."""

    start_size: Optional[int] = key(None, "the first epochs' size (null: half of data.image_size)")
    start_epoch: int = key(0, "growth starts after this epoch", check=(lambda v: v >= 0, "an integer >= 0"))
    end_epoch: Optional[int] = key(
        None,
        "full size from this epoch on (null: ceil(0.8 x max_epochs) - 1)",
        check=(lambda v: v is None or v >= 0, "null or an integer >= 0"),
    )
    bucket: int = key(
        8, "sizes are multiples of this (fewer compiled shapes)", check=(lambda v: v >= 1, "an integer >= 1")
    )


@dataclass
class ReportConfig:
    """The A/B report's time-to-accuracy columns (trainer/time_to_target.py)."""

    target_acc: Any = key(
        "auto",
        "val_acc each row must reach for time_to_target_s: a number, auto (the baseline's best minus "
        "target_tolerance) or off",
        check=(
            lambda v: v in ("auto", "off") or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1),
            "auto, off or a number in (0, 1]",
        ),
    )
    target_tolerance: float = key(
        0.01, "auto's margin below the baseline's best val_acc", check=(lambda v: 0 <= v < 1, "a number in [0, 1)")
    )
    val_per_epoch: int = key(
        1,
        "validations per training epoch: N > 1 validates every 1/N of its batches (Lightning's "
        "val_check_interval), so time to target resolves to a fraction of an epoch",
        check=(lambda v: 1 <= v <= 100, "an integer from 1 to 100"),
    )


@dataclass
class TuneConfig:
    """``python -m trainer.tune``: the search's budget and its accuracy guard (training ignores these)."""

    budget_min: float = key(
        30.0, "stop probing after this many minutes (the accuracy check still runs)", check=(_positive, "above 0")
    )
    objective: str = key(
        "epoch_time",
        "what a candidate must make faster: epoch_time, or time_to_target (the time to report.target_acc; "
        "also tries the flags that change how many epochs it takes)",
        choices=("epoch_time", "time_to_target"),
    )
    probe_batches: int = key(20, "training steps per probe epoch", check=(lambda v: v >= 1, "at least 1"))
    probe_epochs: int = key(
        4,
        "per probe: 1 warm-up epoch, the rest measured",
        check=(lambda v: v >= 3, "at least 3 (one warm-up epoch and at least two measured ones, to judge the noise)"),
    )
    horizon_epochs: int = key(
        10, "compile time is spread over this many full epochs of the real run", check=(lambda v: v >= 1, "at least 1")
    )
    verify_epochs: int = key(
        3,
        "the accuracy guard: the winner and the baseline each train this many full epochs "
        "(tune.objective=time_to_target: every probe's schedule, its trainer.max_epochs)",
        check=(lambda v: v >= 1, "at least 1"),
    )
    acc_tolerance: float = key(
        0.02,
        "the winner's val_acc may be at most this far below the baseline's",
        check=(lambda v: math.isfinite(v) and v >= 0, "0 or more (a val_acc difference, e.g. 0.02)"),
    )
    preloaded_probes: bool = key(
        True,
        "start each probe forked from a process that has imported torch (saves 3-5 s of imports per probe); "
        "false: a fresh python per probe",
    )
    # restrict the search to these candidates (names as in the tune report; null: all that apply)
    only: Optional[List[str]] = None
    # candidates of your own: name -> overrides, space separated (e.g. tune.extra.narrow='model.width=4')
    extra: Dict[str, str] = field(default_factory=dict)


@dataclass
class TrainSchema:
    seed: int = 42
    # repeats=N (with -m) runs every configuration of the sweep N times, interleaved, and the A/B
    # report folds the repeats into one row with their spread; repeat is which one a job is
    # (set by repeats=N; training does not read it)
    repeats: int = key(
        1,
        "with -m: run every configuration this many times, interleaved",
        check=(lambda v: v >= 1, "an integer >= 1 (with -m: how many times to run each configuration)"),
    )
    repeat: int = 0
    # repeats=N repeat_seeds=true sweeps seed=S,S+1,...,S+N-1 instead of repeat (trainer.command_line.expand_repeats)
    repeat_seeds: bool = key(
        False,
        "with repeats=N: each repeat trains with its own seed (seed, seed+1, ...), so the report's time-to-target "
        "interval holds the seeds' variation, not only timing noise",
    )
    recipe: Optional[str] = None
    # the switchboard (SPEC): one top-level key per optimization
    amp: bool = key(False, "mixed precision (bf16 where native, else fp16 on CUDA)", flag=OPTIMIZATION)
    amp_dtype: str = key(
        "auto", "amp's dtype: auto picks bf16 where native", choices=("auto", "bf16", "fp16"), flag=OPTIMIZATION
    )
    compile: bool = key(False, "torch.compile each network of the model", flag=OPTIMIZATION)
    compile_mode: str = key(
        "default",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        flag=OPTIMIZATION,
    )
    compile_backend: str = key(
        "inductor",
        "torch.compile's backend: inductor (generates fused kernels: the speed-up), aot_eager (captures forward and "
        "backward graphs, runs them with eager kernels: tells a graph-capture problem from a code-generation one, "
        "and compiles in seconds), eager (capture only) or cudagraphs",
        choices=("inductor", "aot_eager", "eager", "cudagraphs"),
        flag=OPTIMIZATION,
    )
    compile_cache: str = key(
        "job",
        "compile's on-disk cache: job (the run dir's own: every job compiles cold, a resume finds its graphs) "
        "or shared (Inductor's default dir: warm across jobs and processes)",
        choices=("job", "shared"),
        flag=SETTING,
    )
    channels_last: bool = key(False, "NHWC memory format for weights and inputs", flag=OPTIMIZATION)
    progressive_resize: bool = key(
        False, "train at a low resolution early, growing to data.image_size (progressive.*)", flag=OPTIMIZATION
    )
    ema: bool = key(
        False,
        "validate and save an exponential moving average of the weights (epochs, not epoch time)",
        flag=OPTIMIZATION,
    )
    # recipe ingredients of the model (trainer/models/regularize.py) and of validation
    drop_path_rate: float = key(
        0.0,
        "stochastic depth: the last residual block's branch is dropped at this rate in training, earlier blocks "
        "at linearly less (torchvision ResNets and ViTs, timm models)",
        check=(lambda v: 0 <= v < 1, "a number in [0, 1)"),
        flag=RECIPE,
    )
    zero_init_residual: bool = key(
        False, "each residual block's last normalization starts at zero (the block starts as the identity)", flag=RECIPE
    )
    eval_hflip: bool = key(
        False, "validation averages each image's logits with its mirror image's (test-time flip)", flag=RECIPE
    )
    ema_decay: float = key(0.999, "ema's decay per optimizer step", check=(lambda v: 0 < v < 1, "a number in (0, 1)"))
    # callbacks.StopAtAccuracy on the val_acc metrics.json records (built in trainer.run)
    stop_at_acc: Optional[float] = key(
        None,
        "stop training once a validated epoch's val_acc reaches this (null: train every epoch)",
        check=(lambda v: v is None or 0 < v <= 1, "null or a number in (0, 1]"),
    )
    accumulate: int = key(
        1,
        "gradient accumulation steps",
        check=(lambda v: v >= 1, "an integer >= 1 (1 means no accumulation)"),
        flag=OPTIMIZATION,
    )
    strategy: str = key(
        "auto",
        "auto (one process), ddp, fsdp (GPU), fsdp2",
        choices=("auto", "ddp", "fsdp", "fsdp2"),
        flag=OPTIMIZATION,
    )
    devices: Any = key(1, "processes per node: a positive integer, -1 (all) or auto", flag=SETTING)
    num_nodes: int = key(1, "machines (Slurm)", check=(lambda v: v >= 1, "an integer >= 1"), flag=SETTING)
    accelerator: str = key("auto", choices=("auto", "cpu", "gpu", "cuda"))
    profile: bool = key(False, "torch.profiler trace of a few steps (TensorBoard's profile tab)", flag=SETTING)
    tf32: bool = key(False, "TF32 matmuls and convolutions (CUDA, Ampere or newer)", flag=OPTIMIZATION)
    cudnn_benchmark: bool = key(False, "cuDNN picks the fastest convolution for each shape", flag=OPTIMIZATION)
    activation_checkpointing: bool = key(
        False, "recompute each repeated block's activations in backward", flag=OPTIMIZATION
    )
    sync_batchnorm: bool = key(False, "BatchNorm statistics across ranks (ResNet under ddp)", flag=OPTIMIZATION)
    # learning rate vs effective batch size (batch x accumulate x world size) relative to optim.ref_batch_size
    lr_scaling: str = key(
        "none", "lr follows the effective batch size", choices=("none", "linear", "sqrt"), flag=SETTING
    )
    # PYTORCH_CUDA_ALLOC_CONF for this run (e.g. expandable_segments:True), set before CUDA initializes
    cuda_alloc_conf: Optional[str] = key(None, "PYTORCH_CUDA_ALLOC_CONF for this run", flag=OPTIMIZATION)
    ckpt_path: Optional[str] = None  # a .ckpt file, or "last": the newest good checkpoint of the run dir
    on_nan: str = key(
        "stop", "a non-finite training loss: stop, skip (the step) or off (no check)", choices=("stop", "skip", "off")
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: Dict[str, Any] = field(default_factory=dict)
    # experiment trackers: name -> a Lightning logger config (configs/logger/; trainer/trackers.py)
    logger: Dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    # per-scale overrides a recipe adds on top of ``scale.overrides`` (e.g. a narrower ViT for smoke)
    scales: Dict[str, Any] = field(default_factory=dict)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    batch_finder: BatchFinderConfig = field(default_factory=BatchFinderConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    progressive: ProgressiveConfig = field(default_factory=ProgressiveConfig)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainSchema)


# ---------------------------------------------------------------------------------------------
# Command-line pre-check: unknown keys and wrong types, with a useful message.


def _schema_keys(cls=TrainSchema, prefix: str = "") -> Dict[str, Any]:
    """Every dotted key of the schema -> its field type (dataclass fields recurse)."""
    keys: Dict[str, Any] = {}
    for f in fields(cls):
        key = prefix + f.name
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            keys[key] = type(default)
            keys.update(_schema_keys(type(default), key + "."))
        else:
            keys[key] = f.type
    return keys


SCHEMA_KEYS = _schema_keys()


def _schema_fields(cls=TrainSchema, prefix: str = ""):
    """(dotted key, dataclass field) for every leaf key of the schema, in declaration order."""
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            yield from _schema_fields(type(default), prefix + f.name + ".")
        else:
            yield prefix + f.name, f


SCHEMA_FIELDS = dict(_schema_fields())
# Derived from the fields' metadata (see ``key``): key -> allowed values; key -> (predicate, what is allowed)
CHOICES: Dict[str, tuple] = {k: f.metadata["choices"] for k, f in SCHEMA_FIELDS.items() if f.metadata.get("choices")}
RANGES: Dict[str, tuple] = {k: f.metadata["check"] for k, f in SCHEMA_FIELDS.items() if f.metadata.get("check")}
# metrics.json's ``flags`` (compared by the A/B report, whose columns follow this order): the
# top-level switches, then the optimizer's, the data's and the runtime's, each in declaration order;
# then the recipe's ingredients in the same order of sections
_FLAG_SECTIONS = ("", "optim", "loss", "data", "runtime")
FLAG_KEYS = tuple(
    sorted(
        (k for k, f in SCHEMA_FIELDS.items() if f.metadata.get("flag")),
        key=lambda k: (SCHEMA_FIELDS[k].metadata["flag"] == RECIPE, _FLAG_SECTIONS.index(k.rpartition(".")[0])),
    )
)
# the two kinds, for ``train.py --help``: what makes the same training faster, and what the run is
OPTIMIZATION_FLAGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == OPTIMIZATION)
RUN_SETTINGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == SETTING)
RECIPE_FLAGS = tuple(k for k in FLAG_KEYS if SCHEMA_FIELDS[k].metadata["flag"] == RECIPE)


def lightning_trainer_args(trainer_cfg) -> Dict[str, Any]:
    """The ``trainer.`` keys as Lightning Trainer keyword arguments (a field's ``lightning`` name, "" for none)."""
    args = {}
    for f in fields(TrainerConfig):
        name = f.metadata.get("lightning", f.name)
        if name:
            args[name] = trainer_cfg[f.name]
    return args


def help_text(key: str) -> str:
    field_ = SCHEMA_FIELDS.get(key)
    return field_.metadata.get("help", "") if field_ is not None else ""


# Open nodes: any key below them is allowed (model kwargs, scale overrides).
OPEN_PREFIXES = (
    "model.",
    "scale.overrides.",
    "scales.",
    "data.dataset.",
    "data.val_dataset.",
    "data.storage_options.",
    "tune.extra.",
    "logger.",
)
SECTIONS = sorted({k.split(".")[0] for k in SCHEMA_KEYS if "." in k} | {"model", "scales"})
TOP_LEVEL_FLAGS = [k for k in SCHEMA_KEYS if "." not in k and k not in SECTIONS and k not in GROUPS]


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(SCHEMA_KEYS), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_key_message(key: str) -> str:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    if parent and parent in SCHEMA_KEYS:
        siblings = sorted(
            k.split(".")[-1] for k in SCHEMA_KEYS if k.startswith(parent + ".") and k.count(".") == key.count(".")
        )
        allowed = f"Keys under '{parent}': {', '.join(siblings)}."
    else:
        allowed = f"Top-level flags: {', '.join(TOP_LEVEL_FLAGS)}; sections: {', '.join(SECTIONS)}."
    return (
        f"Unknown config key '{key}'.{_suggest(key)} {allowed} "
        "To add a key the schema does not know (for example an argument of your own model), "
        "put it under model. (model.my_arg=3)."
    )


def check_overrides(overrides: List[str], recipes: List[str]) -> None:
    """Check command-line overrides against the schema before Hydra composes anything.

    Raises ConfigError for an unknown key, a value of the wrong type, a value outside its allowed
    set or range, or an unknown recipe. Sweep values (``amp=false,true``) are checked one by one.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:  # grammar errors: unbalanced quotes and the like
        raise ConfigError(f"Could not parse the command line: {str(e).splitlines()[0]}") from None
    schema = OmegaConf.structured(TrainSchema)
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_hydra_override() or key.startswith("hydra"):
            continue
        values = list(ov.sweep_iterator()) if ov.is_sweep_override() else [ov.value()]
        if key == "recipe":
            for v in values:
                if v not in recipes:
                    raise ConfigError(
                        f"Unknown recipe '{v}' (recipe={v}). Available recipes: {', '.join(recipes)}. "
                        "Recipes are the YAML files in recipes/; select one with +recipe=NAME."
                    )
            continue
        if key in GROUPS:
            continue  # Hydra lists the options of a group itself if one is wrong
        if ov.is_delete():
            continue
        if key not in SCHEMA_KEYS and not key.startswith(OPEN_PREFIXES):
            raise ConfigError(unknown_key_message(key))
        if key.startswith(OPEN_PREFIXES):
            continue
        for v in values:
            try:
                OmegaConf.update(schema, key, v, merge=True)
            except OmegaConfBaseException as e:
                expected = _type_name(SCHEMA_KEYS[key])
                raise ConfigError(
                    f"Bad value for '{key}': {v!r} is not {expected}. "
                    f"{allowed_values(key)}(OmegaConf said: {str(e).splitlines()[0]})"
                ) from None
            _check_value(key, v)


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", str(tp)).replace("typing.", "")
    if name.startswith("Optional["):
        return _type_name(name[len("Optional[") : -1]) + " or null"
    return {"bool": "a boolean (true or false)", "int": "an integer", "float": "a number", "str": "a string"}.get(
        name, f"of type {name}"
    )


def allowed_values(key: str) -> str:
    if key in CHOICES:
        return f"Allowed values: {', '.join(map(str, CHOICES[key]))}. "
    tp = SCHEMA_KEYS.get(key)
    if tp in (bool, "bool"):
        return "Allowed values: true, false. "
    return ""


def _check_value(key: str, value: Any) -> None:
    if key in CHOICES and (
        value not in CHOICES[key] or (isinstance(value, bool) and not any(c is value for c in CHOICES[key]))
    ):
        allowed = ", ".join(str(c).lower() if isinstance(c, bool) else c for c in CHOICES[key])
        raise ConfigError(f"Bad value for '{key}': {value!r}. Allowed values: {allowed}.")
    if key in RANGES and value is not None and not isinstance(value, str):
        ok, what = RANGES[key]
        if not ok(value):
            raise ConfigError(f"Bad value for '{key}': {value!r}. It must be {what}.")
    if key == "data.batch_size" and (isinstance(value, bool) or not (value == "auto" or isinstance(value, int))):
        raise ConfigError(
            f"Bad value for 'data.batch_size': {value!r}. It must be an integer >= 1, or auto (the largest batch that fits)."
        )
    if key == "data.storage_options" and value is not None and not hasattr(value, "keys"):
        raise ConfigError(
            f"Bad value for 'data.storage_options': {value!r}. It must be a mapping passed to fsspec, e.g. +data.storage_options.anon=true."
        )
    if key == "data.download_url" and not (
        value == "auto" or (isinstance(value, str) and value.split("://", 1)[0] in ("http", "https", "ftp", "file"))
    ):
        raise ConfigError(
            f"Bad value for 'data.download_url': {value!r}. It must be auto (torchvision's URL for the dataset) or an "
            "http://, https://, ftp:// or file:// URL of the same archive."
        )
    if key == "data.download_md5" and value not in (None, "auto") and not re.fullmatch(r"[0-9a-fA-F]{32}", str(value)):
        raise ConfigError(
            f"Bad value for 'data.download_md5': {value!r}. It must be auto (torchvision's checksum of the archive), "
            "32 hex digits (an MD5), or null (not checked: only for a mirror you trust)."
        )
    if key == "devices" and not (value == "auto" or (isinstance(value, int) and (value >= 1 or value == -1))):
        raise ConfigError(f"Bad value for 'devices': {value!r}. It must be a positive integer, -1 (all) or auto.")
    if key in ("trainer.limit_train_batches", "trainer.limit_val_batches"):
        if value is None:
            return  # Lightning's default: every batch
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        if not ok or (isinstance(value, float) and value > 1.0):
            raise ConfigError(
                f"Bad value for '{key}': {value!r}. It must be a fraction in [0.0, 1.0], a whole number of batches, or null (all)."
            )


def validate(cfg: Any) -> None:
    """Range and choice checks on a composed config (the parts that do not need the hardware)."""
    from omegaconf import OmegaConf

    flat = {
        k: OmegaConf.select(cfg, k) for k in SCHEMA_KEYS if k not in GROUPS and not is_dataclass_type(SCHEMA_KEYS[k])
    }
    for key, value in flat.items():
        _check_value(key, value)
    if cfg.get("on_nan") == "skip" and cfg.get("strategy") != "auto":
        raise ConfigError(
            f"'on_nan=skip' cannot be combined with strategy={cfg.strategy}: skipping a step on one rank would leave the others "
            "waiting for its gradients (Lightning refuses a skipped step under DDP/FSDP). Use on_nan=stop (the default) or on_nan=off."
        )
    if cfg.get("compile_mode", "default") != "default" and cfg.get("compile_backend", "inductor") != "inductor":
        raise ConfigError(
            f"'compile_mode={cfg.compile_mode}' is a mode of the inductor backend, and compile_backend={cfg.compile_backend}. "
            "Use compile_mode=default with that backend, or compile_backend=inductor."
        )
    if OmegaConf.select(cfg, "trainer.max_epochs") == -1 and OmegaConf.select(cfg, "sched.name") != "constant":
        raise ConfigError(
            f"'trainer.max_epochs=-1' trains until stopped, but sched.name={OmegaConf.select(cfg, 'sched.name')} needs to know how long "
            "training lasts. Use sched.name=constant with max_epochs=-1, or give trainer.max_epochs a number."
        )
    if cfg.get("stop_at_acc") is not None and OmegaConf.select(cfg, "trainer.limit_val_batches") in (0, 0.0):
        raise ConfigError(
            f"'stop_at_acc={cfg.stop_at_acc}' stops when a validated epoch reaches that val_acc, but trainer.limit_val_batches=0 "
            "validates nothing. Give trainer.limit_val_batches a number above 0 (1.0: the whole validation set), or stop_at_acc=null."
        )
    model = cfg.get("model") or {}
    if "_target_" not in model:
        raise ConfigError(
            "The config has no model: 'model._target_' is missing. Pick a recipe (+recipe=resnet50 or +recipe=vit), "
            "keep the default tiny model, or name any nn.Module or LightningModule class with model._target_=pkg.module.Class."
        )


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)
