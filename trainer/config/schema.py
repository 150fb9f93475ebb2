"""``TrainSchema``, the whole config: the top-level keys (the switchboard) and the sections in order.

``register_schema`` puts it in Hydra's ConfigStore as ``train_schema``, first in
``configs/train.yaml``'s defaults list, so Hydra itself rejects unknown keys and wrong types. Its
field order is the order of ``--cfg job``'s output (tests/golden/). ``GROUPS`` are the config
groups (``configs/<group>/``), which are chosen rather than set: the command-line checks and the
scale preset pass them by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from trainer.config.keys import OPTIMIZATION, RECIPE, SETTING, key
from trainer.config.schema_data import DataConfig
from trainer.config.schema_sections import (
    BatchFinderConfig,
    CheckpointConfig,
    DDPConfig,
    FSDPConfig,
    LossConfig,
    MonitorConfig,
    OptimConfig,
    ProfilerConfig,
    ProgressiveConfig,
    ReportConfig,
    RuntimeConfig,
    ScaleConfig,
    SchedConfig,
    TrainerConfig,
    TuneConfig,
)

# Config groups: selecting one of these is not a value override.
GROUPS = ("data", "model", "scale", "recipe", "bench", "logger")


@dataclass
class TrainSchema:
    seed: int = key(
        42,
        "the random seed of the weights, the data order and the augmentations",
        check=(lambda v: 0 <= v <= 2**32 - 1, "a whole number in 0..4294967295 (numpy's seed range)"),
    )
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
    # experiment trackers: name -> a Lightning logger config (configs/logger/; trainer/tracking/)
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
    from hydra.core.config_store import ConfigStore  # lazy: keeps hydra out of train.py's start-up

    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
