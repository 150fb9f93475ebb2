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
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional

from .errors import ConfigError

# Top-level switchboard flags and the other keys with a fixed set of values: key -> allowed values.
CHOICES: Dict[str, tuple] = {
    "amp_dtype": ("auto", "bf16", "fp16"),
    "compile_mode": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "strategy": ("auto", "ddp", "fsdp", "fsdp2"),
    "accelerator": ("auto", "cpu", "gpu", "cuda"),
    "data.name": ("synthetic", "imagefolder", "builtin", "custom", "packed", "parquet", "webdataset"),
    "data.decoder": ("pil", "torchvision", "turbo", "nvjpeg"),
    "runtime.allocator": ("default", "jemalloc", "tcmalloc"),
    "optim.name": ("sgd", "adamw"),
    "sched.name": ("cosine", "constant"),
    "lr_scaling": ("none", "linear", "sqrt"),
    "on_nan": ("stop", "skip", "off"),
    "data.on_bad_sample": ("skip", "stop"),
    "checkpoint.mode": ("max", "min"),
    "fsdp.sharding_strategy": ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"),
    "optim.fused": ("auto", True, False, "foreach"),
    "trainer.deterministic": (False, True, "warn"),
    "trainer.gradient_clip_algorithm": ("norm", "value"),
}

# Config groups: selecting one of these is not a value override.
GROUPS = ("data", "model", "scale", "recipe", "bench")

# The flags recorded under ``flags`` in metrics.json and compared by the A/B report.
FLAG_KEYS = (
    "amp",
    "amp_dtype",
    "compile",
    "compile_mode",
    "channels_last",
    "accumulate",
    "strategy",
    "devices",
    "num_nodes",
    "profile",
    "tf32",
    "cudnn_benchmark",
    "activation_checkpointing",
    "sync_batchnorm",
    "lr_scaling",
    "cuda_alloc_conf",
    "optim.fused",
    "optim.zero_grad_to_none",
    "data.batch_size",
    "data.num_workers",
    "data.auto_workers",
    "data.gpu_normalize",
    "data.device_prefetch",
    "data.device_resident",
    "data.decoder",
    "data.cache_in_memory",
    "data.cache",
    "runtime.allocator",
)


@dataclass
class DataConfig:
    name: str = "synthetic"
    root: Optional[str] = None  # imagefolder: a folder of class subfolders, or with train/ and val/ inside
    batch_size: Any = 32  # an integer, or "auto": the largest that fits (see batch_finder)
    image_size: int = 32
    num_classes: int = 10
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = None
    drop_last: bool = True
    # synthetic: samples per epoch (a fixed pool of distinct images is cycled through)
    num_samples: int = 1024
    val_samples: int = 256
    # imagefolder without train/ and val/ subfolders: fraction of each class held out for validation
    val_split: float = 0.2
    # builtin: where the generated JPEG folder is cached, and how many images per class it holds
    cache_dir: Optional[str] = None
    images_per_class: int = 100
    stored_size: int = 160
    # augmentation for real images: random resized crop + flip in training
    augment: bool = True
    # an image file that cannot be decoded: skip it (and count it) or stop with its path
    on_bad_sample: str = "skip"
    # input pipeline switches
    auto_workers: bool = False  # pick num_workers from the cores (and ranks) of this machine
    gpu_normalize: bool = False  # ship uint8 batches; convert and normalize on the device
    device_prefetch: bool = False  # CUDA: copy the next batch to the GPU on a side stream during the step
    device_resident: bool = False  # synthetic: keep the images on the device; batches are gathered there
    decoder: str = "pil"  # pil | torchvision | turbo (libjpeg-turbo via simplejpeg) | nvjpeg (CUDA)
    cache_in_memory: bool = False  # keep the encoded image files in RAM after the first read
    cache: Optional[str] = None  # copy data.root to this local folder once (checksummed, resumable), read from there
    # data.root as an fsspec URL: passed to fsspec (e.g. {anon: true}, {endpoint_url: ...}); credentials from AWS_* env vars
    storage_options: Any = None
    # parquet / webdataset: samples are shuffled within windows of this many consecutive samples
    # (after shuffling the row groups / shards); a loader worker holds the blocks one window spans
    shuffle_window: int = 1024
    # data=custom: any map-style Dataset of (image tensor, label) by _target_ (val_dataset optional)
    dataset: Any = None
    val_dataset: Any = None


@dataclass
class TrainerConfig:
    """Passed to ``lightning.Trainer``; only keys whose meaning we keep stable are listed.

    Every value Lightning accepts for these is accepted here too (null where Lightning takes None).
    """

    max_epochs: Optional[int] = 3  # -1: until stopped (needs sched.name=constant); null: Lightning's default
    limit_train_batches: Any = 1.0  # a fraction, a number of batches, or null (all)
    limit_val_batches: Any = 1.0
    log_every_n_steps: Optional[int] = 50
    gradient_clip_val: Optional[float] = None
    gradient_clip_algorithm: str = "norm"
    num_sanity_val_steps: int = 0  # -1: the whole val set
    check_val_every_n_epoch: Optional[int] = 1
    deterministic: Any = False  # false, true or warn
    # null: show the progress bar only when stderr is a terminal
    enable_progress_bar: Optional[bool] = None
    progress_refresh_rate: int = 20
    # Lightning's table of layers and parameter counts before training (off: the console stays short)
    model_summary: bool = False


@dataclass
class OptimConfig:
    name: str = "sgd"
    lr: float = 0.05  # at ref_batch_size (with lr_scaling); the recipes set their own
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-5
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    # the batch size ``lr`` was tuned for: with lr_scaling, lr follows the effective batch size
    ref_batch_size: int = 32
    # optimizer implementation: auto (torch's choice), true (fused kernels), foreach, false (per-parameter loop)
    fused: Any = "auto"
    zero_grad_to_none: bool = True


@dataclass
class SchedConfig:
    name: str = "cosine"
    warmup_epochs: float = 0.0
    min_lr_ratio: float = 0.0


@dataclass
class LossConfig:
    label_smoothing: float = 0.0


@dataclass
class ScaleConfig:
    name: str = "full"
    # merged over the composed config (after the recipe), then the command line is applied again
    overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointConfig:
    """checkpoints/ in the run dir; last.ckpt is always kept and always the newest state."""

    enabled: bool = True
    every_n_epochs: Optional[int] = 1
    every_n_steps: Optional[int] = None
    every_n_minutes: Optional[float] = None
    keep_last_k: int = 1  # periodic checkpoints kept besides last.ckpt (-1: all)
    monitor: Optional[str] = None  # also keep the best by this metric, e.g. val/acc
    mode: str = "max"
    save_weights_only: bool = False


@dataclass
class ProfilerConfig:
    wait: int = 1
    warmup: int = 1
    active: int = 3
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


@dataclass
class FSDPConfig:
    """strategy=fsdp (GPU, Lightning FSDPStrategy); the wrap unit is the recipe's repeated block."""

    sharding_strategy: str = "FULL_SHARD"


@dataclass
class RuntimeConfig:
    """Process-level settings applied by re-launching the job (see trainer/launch.py)."""

    allocator: str = "default"  # default | jemalloc | tcmalloc (LD_PRELOAD; Debian: libjemalloc2, libtcmalloc-minimal4)


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
class TuneConfig:
    """``python -m trainer.tune``: the search's budget and its accuracy guard (training ignores these)."""

    budget_min: float = 30.0  # stop probing after this many minutes (the accuracy check still runs)
    probe_batches: int = 20  # training steps per probe epoch
    probe_epochs: int = 4  # per probe: 1 warm-up epoch, the rest measured
    horizon_epochs: int = 10  # compile time is spread over this many full epochs of the real run
    verify_epochs: int = 3  # the accuracy guard: the winner and the baseline each train this many full epochs
    acc_tolerance: float = 0.02  # the winner's val_acc may be at most this far below the baseline's
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
    repeats: int = 1
    repeat: int = 0
    recipe: Optional[str] = None
    # the switchboard (SPEC): one top-level key per optimization
    amp: bool = False
    amp_dtype: str = "auto"
    compile: bool = False
    compile_mode: str = "default"
    channels_last: bool = False
    accumulate: int = 1
    strategy: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    accelerator: str = "auto"
    profile: bool = False
    tf32: bool = False
    cudnn_benchmark: bool = False
    activation_checkpointing: bool = False
    sync_batchnorm: bool = False  # BatchNorm statistics across ranks (ResNet under ddp)
    # learning rate vs effective batch size (batch x accumulate x world size) relative to optim.ref_batch_size
    lr_scaling: str = "none"
    # PYTORCH_CUDA_ALLOC_CONF for this run (e.g. expandable_segments:True), set before CUDA initializes
    cuda_alloc_conf: Optional[str] = None
    ckpt_path: Optional[str] = None  # a .ckpt file, or "last": the newest good checkpoint of the run dir
    on_nan: str = "stop"  # a non-finite training loss: stop | skip (the step) | off (no check)
    data: DataConfig = field(default_factory=DataConfig)
    model: Dict[str, Any] = field(default_factory=dict)
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
# Open nodes: any key below them is allowed (model kwargs, scale overrides).
OPEN_PREFIXES = ("model.", "scale.overrides.", "scales.", "data.dataset.", "data.val_dataset.", "data.storage_options.", "tune.extra.")
SECTIONS = sorted({k.split(".")[0] for k in SCHEMA_KEYS if "." in k} | {"model", "scales"})
TOP_LEVEL_FLAGS = [k for k in SCHEMA_KEYS if "." not in k and k not in SECTIONS and k not in GROUPS]


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(SCHEMA_KEYS), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_key_message(key: str) -> str:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    if parent and parent in SCHEMA_KEYS:
        siblings = sorted(k.split(".")[-1] for k in SCHEMA_KEYS if k.startswith(parent + ".") and k.count(".") == key.count("."))
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


# Simple per-key ranges: key -> (predicate, description of what is allowed)
RANGES = {
    "repeats": (lambda v: v >= 1, "an integer >= 1 (with -m: how many times to run each configuration)"),
    "accumulate": (lambda v: v >= 1, "an integer >= 1 (1 means no accumulation)"),
    "num_nodes": (lambda v: v >= 1, "an integer >= 1"),
    "data.batch_size": (lambda v: v >= 1, "an integer >= 1, or auto"),
    "data.image_size": (lambda v: v >= 8, "an integer >= 8 (pixels)"),
    "data.num_classes": (lambda v: v >= 2, "an integer >= 2"),
    "data.num_workers": (lambda v: v >= 0, "an integer >= 0 (0 loads in the main process)"),
    "data.prefetch_factor": (lambda v: v is None or v >= 1, "null or an integer >= 1"),
    "data.num_samples": (lambda v: v >= 1, "an integer >= 1"),
    "data.val_split": (lambda v: 0.0 <= v < 1.0, "a fraction in [0, 1)"),
    "data.shuffle_window": (lambda v: v >= 1, "an integer >= 1 (samples shuffled together; 1: row groups / shards in order, each shuffled inside)"),
    "trainer.max_epochs": (lambda v: v is None or v >= -1, "an integer >= 0, -1 (train until stopped) or null"),
    "trainer.log_every_n_steps": (lambda v: v is None or v >= 0, "an integer >= 0 or null"),
    "trainer.num_sanity_val_steps": (lambda v: v >= -1, "an integer >= 0, or -1 (the whole validation set)"),
    "trainer.check_val_every_n_epoch": (lambda v: v is None or v >= 1, "null or an integer >= 1"),
    "optim.lr": (lambda v: v > 0, "a number > 0"),
    "sched.warmup_epochs": (lambda v: v >= 0, "a number >= 0"),
    "loss.label_smoothing": (lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
    "profiler.active": (lambda v: v >= 1, "an integer >= 1"),
    "checkpoint.every_n_epochs": (lambda v: v is None or v >= 1, "null or an integer >= 1"),
    "checkpoint.every_n_steps": (lambda v: v is None or v >= 1, "null or an integer >= 1"),
    "checkpoint.every_n_minutes": (lambda v: v is None or v > 0, "null or a number of minutes > 0"),
    "checkpoint.keep_last_k": (lambda v: v == -1 or v >= 0, "-1 (all) or an integer >= 0"),
}


def _check_value(key: str, value: Any) -> None:
    if key in CHOICES and (value not in CHOICES[key] or (isinstance(value, bool) and not any(c is value for c in CHOICES[key]))):
        allowed = ", ".join(str(c).lower() if isinstance(c, bool) else c for c in CHOICES[key])
        raise ConfigError(f"Bad value for '{key}': {value!r}. Allowed values: {allowed}.")
    if key in RANGES and value is not None and not isinstance(value, str):
        ok, what = RANGES[key]
        if not ok(value):
            raise ConfigError(f"Bad value for '{key}': {value!r}. It must be {what}.")
    if key == "data.batch_size" and (isinstance(value, bool) or not (value == "auto" or isinstance(value, int))):
        raise ConfigError(f"Bad value for 'data.batch_size': {value!r}. It must be an integer >= 1, or auto (the largest batch that fits).")
    if key == "data.storage_options" and value is not None and not hasattr(value, "keys"):
        raise ConfigError(f"Bad value for 'data.storage_options': {value!r}. It must be a mapping passed to fsspec, e.g. +data.storage_options.anon=true.")
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

    flat = {k: OmegaConf.select(cfg, k) for k in SCHEMA_KEYS if k not in GROUPS and not is_dataclass_type(SCHEMA_KEYS[k])}
    for key, value in flat.items():
        _check_value(key, value)
    if cfg.get("on_nan") == "skip" and cfg.get("strategy") != "auto":
        raise ConfigError(
            f"'on_nan=skip' cannot be combined with strategy={cfg.strategy}: skipping a step on one rank would leave the others "
            "waiting for its gradients (Lightning refuses a skipped step under DDP/FSDP). Use on_nan=stop (the default) or on_nan=off."
        )
    if OmegaConf.select(cfg, "trainer.max_epochs") == -1 and OmegaConf.select(cfg, "sched.name") != "constant":
        raise ConfigError(
            f"'trainer.max_epochs=-1' trains until stopped, but sched.name={OmegaConf.select(cfg, 'sched.name')} needs to know how long "
            "training lasts. Use sched.name=constant with max_epochs=-1, or give trainer.max_epochs a number."
        )
    model = cfg.get("model") or {}
    if "_target_" not in model:
        raise ConfigError(
            "The config has no model: 'model._target_' is missing. Pick a recipe (+recipe=resnet50 or +recipe=vit), "
            "keep the default tiny model, or name any nn.Module or LightningModule class with model._target_=pkg.module.Class."
        )


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)
