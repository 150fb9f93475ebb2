"""The schema's other sections, one dataclass each: ``trainer.``, ``optim.``, ``sched.``, ``loss.``,
``scale.``, ``checkpoint.``, ``profiler.``, ``ddp.``, ``fsdp.``, ``runtime.``, ``monitor.``,
``batch_finder.``, ``progressive.``, ``report.`` and ``tune.``.

Apart from ``schema.TrainSchema`` so that the top-level keys (the switchboard) read on their own;
where each section sits in the config is ``TrainSchema``'s field order, and a section's own field
order is its order in ``--cfg job``'s output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from trainer.config.keys import OPTIMIZATION, RECIPE, is_positive, key


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
    gradient_clip_val: Optional[float] = key(
        None, check=(lambda v: v is None or v >= 0, "null (no clipping) or a number >= 0 (0: no clipping)")
    )
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
    momentum: float = key(0.9, check=(lambda v: 0 <= v < 1, "a number in [0, 1)"))
    nesterov: bool = False
    weight_decay: float = key(5e-5, check=(lambda v: v >= 0, "a number >= 0"))
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
    min_lr_ratio: float = key(
        0.0, check=(lambda v: 0 <= v <= 1, "a number in [0, 1]: the last lr as a fraction of the peak")
    )


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
    # A stop signal to a job whose ranks torchrun starts (devices=N on one node): torchrun's agent
    # passes it on, the ranks finish the validation or save in flight, agree on a step and save
    # last.ckpt, and the agent sends SIGKILL to any still running after this long. torchrun's own 30 s
    # lost the checkpoint of a stop during a 40 s validation. A scheduler ends the job after its own
    # grace anyway, so a longer window costs nothing there; under Slurm the job's KillWait or its
    # partition's GraceTime is taken where longer (trainer/launch/slurm.py).
    stop_grace_s: int = key(
        300,
        "seconds a launched job's ranks get after a stop signal to save last.ckpt (torchrun's default: 30)",
        check=(lambda v: v >= 1, "an integer >= 1 (seconds)"),
    )


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
    """Process-level settings applied by re-launching the job (see trainer/launch/processes.py)."""

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
    """The A/B report's time-to-accuracy columns (trainer/measure/time_to_target.py)."""

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
        30.0, "stop probing after this many minutes (the accuracy check still runs)", check=(is_positive, "above 0")
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
        check=(lambda v: math.isfinite(v) and 0 <= v < 1, "a number in [0, 1) (a val_acc difference, e.g. 0.02)"),
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
