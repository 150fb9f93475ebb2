"""The switchboard: turns the top-level optimization flags into what actually runs.

Each flag is applied through Lightning's own mechanism where one exists (precision plugin,
``accumulate_grad_batches``, strategy, ``benchmark``) or by one small function (tf32 here; the
model-side flags, activation checkpointing, channels_last and compile, in ``model_transforms``).
``resolve`` decides everything up front and refuses impossible combinations, so a bad flag stops
before any model or data is built.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
from torch.nn.parallel import DistributedDataParallel

from trainer.errors import ConfigError
from trainer.launch.torchrun import LAUNCHED_RANKS_ENV
from trainer.measure import hardware
from trainer.measure.hardware import Hardware
from trainer.models.blocks import repeated_blocks
from trainer.models.build import refuse_unsharded_user_module
from trainer.rank import env_count, srun_rank
from trainer.switches.model_transforms import fsdp_checkpoint_policy

log = logging.getLogger(__name__)


def per_node(accelerator: str, devices, hw: Hardware) -> int:
    """Processes per node for ``devices`` (``auto`` and -1: every GPU, or one process on a CPU)."""
    return devices if isinstance(devices, int) and devices > 0 else (hw.count if accelerator == "cuda" else 1)


@dataclass
class Plan:
    accelerator: str  # "cpu" | "cuda"
    devices: Any
    num_nodes: int
    precision: str  # Lightning precision string
    amp_dtype: str | None  # "bf16" | "fp16" | None (amp off)
    strategy: str  # the strategy= name (the object is built once the model exists: build_strategy)
    warnings: List[str] = field(default_factory=list)

    def world_size(self, hw: Hardware) -> int:
        return per_node(self.accelerator, self.devices, hw) * self.num_nodes

    def banner(self, cfg, hw: Hardware) -> str:
        dtypes = "bf16" + ("" if hw.bf16_native else " (emulated, slow)") + (", fp16" if hw.fp16 else "")

        def on(value: bool) -> str:
            return "true" if value else "false"

        flags = (
            f"amp={self.amp_dtype or 'false'} compile={cfg.compile_mode if cfg.compile else 'false'} "
            f"channels_last={on(cfg.channels_last)} accumulate={cfg.accumulate} strategy={cfg.strategy} "
            f"devices={self.devices} tf32={on(cfg.tf32)} cudnn_benchmark={on(cfg.cudnn_benchmark)} profile={on(cfg.profile)}"
        )
        cap = f" sm{hw.capability}" if hw.capability else ""
        return (
            f"device: {hw.accelerator} x{hw.count} ({hw.name}{cap}, {hw.cpu_cores} cores) | dtypes: {dtypes} | {flags}"
        )


PLAN_ENV = "TRAINER_PLAN"  # the plan a launching process resolved, handed to the processes it starts


def plan_env(plan: Plan) -> Dict[str, str]:
    """The environment that hands ``plan`` to the processes a launcher starts (its ranks, an allocator's
    child): they use it as it is, so a launched job checks and resolves its switches once."""
    return {PLAN_ENV: json.dumps(asdict(plan))}


def launched_plan() -> Optional[Plan]:
    """The plan the launching process resolved for this one, or None (a process that launched itself).
    Taken out of the environment as it is read: a process this one starts resolves its own."""
    text = os.environ.pop(PLAN_ENV, None)
    return Plan(**json.loads(text)) if text else None


def resolve(cfg, hw: Hardware) -> Plan:
    """Decide precision, strategy and devices from the flags; raise ConfigError if impossible."""
    warnings: List[str] = []
    if cfg.accelerator in ("gpu", "cuda") and hw.accelerator != "cuda":
        raise ConfigError(
            "'accelerator' is set to a GPU, but torch sees no CUDA device here. Allowed on this machine: auto, cpu."
        )
    accelerator = hw.accelerator if cfg.accelerator == "auto" else ("cpu" if cfg.accelerator == "cpu" else "cuda")
    amp_dtype, precision = _precision(cfg, hw, accelerator, warnings)

    if cfg.strategy == "fsdp2" and precision == "16-mixed":
        why = (
            "amp_dtype=fp16"
            if cfg.amp_dtype == "fp16"
            else f"amp_dtype=auto, which picks fp16 on this GPU (sm{hw.capability}, no native bf16)"
        )
        raise ConfigError(
            f"'strategy=fsdp2' cannot run fp16 autocast ({why}): Lightning's ModelParallelStrategy takes only 32-true or "
            "bf16-mixed precision (fp16 would need a sharded gradient scaler it does not have). Allowed with strategy=fsdp2: "
            "amp=false, or amp=true amp_dtype=bf16; for fp16 with loss scaling use strategy=fsdp or strategy=ddp."
        )

    devices = cfg.devices
    available = hw.count if accelerator == "cuda" else None
    if accelerator == "cuda" and isinstance(devices, int) and devices > available:
        raise ConfigError(
            f"'devices={devices}' but this machine has {available} CUDA device(s). Allowed: 1..{available}, -1 or auto."
        )

    # srun's tasks are the ranks, each with the CPUs of its own task (where Slurm binds tasks to their
    # CPUs, this process's mask is its task's alone): only the processes of one launcher share the mask
    sharing = 1 if srun_rank() else devices
    if accelerator == "cpu" and isinstance(devices, int) and sharing > hw.cpu_cores:
        raise ConfigError(
            f"'devices={devices}' asks for {devices} CPU processes, but this process may use {hw.cpu_cores} core(s) here: they would "
            f"fight over the cores and every timing would be meaningless. Allowed on this machine: devices=1..{hw.cpu_cores} (or a GPU machine)."
        )
    if cfg.strategy == "fsdp" and accelerator != "cuda":
        raise ConfigError(
            "'strategy=fsdp' needs CUDA GPUs (Lightning's FSDPStrategy refuses CPU). On this machine use "
            "strategy=fsdp2 (FSDP2 via fully_shard, also runs on CPU with gloo), or strategy=ddp / auto."
        )
    _refuse_with_sharding(cfg, per_node(accelerator, devices, hw))
    if cfg.sync_batchnorm and accelerator != "cuda":
        raise ConfigError(
            "'sync_batchnorm=true' needs CUDA GPUs (torch's SyncBatchNorm does not run on CPU). Allowed here: sync_batchnorm=false."
        )
    if cfg.data.batch_size == "auto" and cfg.strategy != "auto":
        raise ConfigError(
            f"'data.batch_size=auto' is single-process only (each rank of strategy={cfg.strategy} would search on its own). "
            "Find the batch once in one process (devices=1, strategy=auto) and pass the number it prints, e.g. data.batch_size=256."
        )
    warnings += _no_effect_here(cfg, accelerator)
    # -1 and auto as the count they mean here (Lightning refuses -1 on a CPU)
    return Plan(
        accelerator, per_node(accelerator, devices, hw), cfg.num_nodes, precision, amp_dtype, cfg.strategy, warnings
    )


def _refuse_with_sharding(cfg, ranks_per_node: int) -> None:
    """Flags whose work a sharded strategy cannot do (or would undo): refused before anything is built."""
    if cfg.strategy == "fsdp2":
        refuse_unsharded_user_module(cfg)  # a module that cannot be sharded, before its ranks start
    if cfg.strategy == "fsdp2" and cfg.channels_last:
        # FSDP1 (strategy=fsdp) keeps each parameter's strides in its flat parameter (torch >= 2.6), so
        # there channels_last weights stay channels-last when it shards; FSDP2 refuses to shard them at all
        raise ConfigError(
            "'strategy=fsdp2' cannot shard channels-last weights (FSDP2's fully_shard takes only contiguous parameters; "
            "it would fail after the data and model are built). Allowed: channels_last=false with strategy=fsdp2, "
            "or channels_last=true with strategy=fsdp on two or more GPUs, ddp or auto."
        )
    sharding = cfg.fsdp.sharding_strategy
    shard_group = ranks_per_node if sharding == "HYBRID_SHARD" else ranks_per_node * cfg.num_nodes
    unsharded = sharding == "NO_SHARD" or shard_group == 1
    if cfg.strategy == "fsdp" and cfg.channels_last and unsharded:
        # FSDP1 run unsharded (torch switches one rank to NO_SHARD) keeps a channels-last weight's strides
        # but gives it a contiguous gradient over the flat gradient's channels-last memory: the values
        # land on the wrong elements and the run trains on them (torch 2.11 and 2.14;
        # tests/test_distributed.py::test_fsdp1_trains_channels_last_weights_right_only_when_it_shards)
        why = "with NO_SHARD" if sharding == "NO_SHARD" else f"and a shard group of one GPU ({sharding})"
        raise ConfigError(
            f"'strategy=fsdp' with 'channels_last=true' {why}: torch's FSDP1 then hands each channels-last weight its "
            "gradient in the wrong element order, and the run would train on it without an error. Allowed: "
            "channels_last=false with strategy=fsdp here, channels_last=true with strategy=auto or ddp, or strategy=fsdp "
            "with a sharding fsdp.sharding_strategy on two or more GPUs."
        )
    if cfg.ema and cfg.strategy in ("fsdp", "fsdp2"):
        # Lightning's weight averaging keeps a whole, unsharded copy of the module (it says so itself)
        raise ConfigError(
            f"'ema=true' keeps an unsharded copy of the whole model, which strategy={cfg.strategy} exists to avoid "
            "(Lightning's EMAWeightAveraging does not shard). Allowed: ema=true with strategy=auto or ddp, or ema=false."
        )
    if cfg.ema and cfg.checkpoint.enabled and cfg.checkpoint.save_weights_only:
        # Lightning skips callbacks' on_save_checkpoint on weights-only saves, where EMA puts its average
        raise ConfigError(
            "'ema=true' with 'checkpoint.save_weights_only=true': a weights-only checkpoint would hold the raw weights "
            "(Lightning leaves callbacks out of weights-only saves, the average among them) while validation used the "
            "average. Allowed: checkpoint.save_weights_only=false (the checkpoint's state_dict is then the average, "
            "the raw weights beside it), or ema=false."
        )


def _no_effect_here(cfg, accelerator: str) -> List[str]:
    """Flags that are on but change nothing on this hardware or with this strategy: said, never refused."""
    said = []
    if cfg.sync_batchnorm and cfg.strategy == "auto":
        said.append("sync_batchnorm=true only matters with more than one process (strategy=ddp/fsdp/fsdp2).")
    if cfg.compile and cfg.compile_mode in ("reduce-overhead",) and accelerator == "cpu":
        said.append("compile_mode=reduce-overhead uses CUDA graphs; on CPU it behaves like the default mode.")
    if cfg.tf32 and accelerator == "cpu":
        said.append("tf32=true only changes CUDA matmuls and convolutions (Ampere or newer); on CPU it has no effect.")
    if cfg.cudnn_benchmark and accelerator == "cpu":
        said.append("cudnn_benchmark=true only affects cuDNN on CUDA; on CPU it has no effect.")
    return said


def _precision(cfg, hw: Hardware, accelerator: str, warnings: List[str]) -> tuple:
    """(amp_dtype, Lightning precision) for amp= and amp_dtype= on this hardware; emulated bf16 is warned about."""
    amp_dtype = None
    precision = "32-true"
    if cfg.amp:
        amp_dtype = cfg.amp_dtype
        if amp_dtype == "auto":
            amp_dtype = "bf16" if (accelerator == "cpu" or hw.bf16_native) else "fp16"
        if amp_dtype == "fp16" and accelerator == "cpu":
            raise ConfigError(
                "'amp_dtype=fp16' needs a CUDA GPU: fp16 autocast with loss scaling is not supported on CPU. "
                "Allowed here: amp_dtype=auto or amp_dtype=bf16 (or amp=false)."
            )
        precision = "bf16-mixed" if amp_dtype == "bf16" else "16-mixed"
        if amp_dtype == "bf16" and not hw.bf16_native:
            where = (
                "this CPU has no AVX512-BF16/AMX"
                if accelerator == "cpu"
                else f"this GPU (sm{hw.capability}) has no native bf16"
            )
            warnings.append(
                f"amp=true with bf16: {where}, so bf16 is emulated and will be SLOWER than fp32 here "
                "(about 30x for a ResNet-50 step on the AVX2 build machines). Measure it, but do not expect a speed-up."
            )
    return amp_dtype, precision


def _no_buffer_sync_per_forward() -> dict:
    """``ddp.broadcast_buffers=false``, the only case passed to DDP: torch 2.13 deprecated DDP's
    ``broadcast_buffers`` (a FutureWarning in every run that names it, the default included) for
    ``forward_sync_buffers``, whose ``False`` still syncs the buffers once at the start, where the
    ranks' buffers are equal anyway."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}  # torch < 2.13


def build_strategy(cfg, plan: Plan, hw: Hardware, module: torch.nn.Module) -> Any:
    """The Lightning strategy object for ``strategy=`` (needs the model: FSDP wraps its repeated blocks)."""
    if cfg.strategy == "ddp":
        kwargs = {
            "static_graph": cfg.ddp.static_graph,
            "gradient_as_bucket_view": cfg.ddp.gradient_as_bucket_view,
            "find_unused_parameters": cfg.ddp.find_unused_parameters,
        }
        if not cfg.ddp.broadcast_buffers:
            kwargs.update(_no_buffer_sync_per_forward())
        if cfg.ddp.bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = cfg.ddp.bucket_cap_mb
        return DDPStrategy(process_group_backend="nccl" if plan.accelerator == "cuda" else "gloo", **kwargs)
    if cfg.strategy == "fsdp":
        block_types = {type(b) for b in repeated_blocks(module)}
        return FSDPStrategy(
            sharding_strategy=cfg.fsdp.sharding_strategy,
            auto_wrap_policy=block_types or None,
            activation_checkpointing_policy=fsdp_checkpoint_policy(cfg, block_types),
            use_orig_params=True,  # needed by torch.compile and by per-parameter optimizer groups
        )
    if cfg.strategy == "fsdp2":
        n = plan.world_size(hw)
        # one consolidated checkpoint file (loads with any strategy) rather than a folder of shards
        return ModelParallelStrategy(data_parallel_size=n, tensor_parallel_size=1, save_distributed_checkpoint=False)
    return "auto"


def apply_global_settings(cfg) -> None:
    """Process-wide state, set at the start of every job: TF32, and torch.compile's caches emptied.

    tf32=false sets full fp32 explicitly (torch's default leaves cuDNN convolutions on TF32),
    so that the A/B baseline really is fp32. A local sweep runs every job in one process, and
    dynamo keeps compiled graphs, guards and automatic-dynamic shapes per code object: without the
    reset a later compile=true job reuses an earlier job's graphs (its compile time reads short),
    recompiles with dynamic shapes where a fresh process would not, and after the recompile limit
    silently runs eagerly. (Inductor's on-disk cache is kept, as it is across processes.)
    """
    torch.compiler.reset()
    torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = bool(cfg.tf32)
    torch.backends.cudnn.allow_tf32 = bool(cfg.tf32)


def set_intra_op_threads(workers: int, processes_per_node: int = 1) -> int:
    """The training process's intra-op threads: its share of the node's cores less its loader workers
    (at least 1), at most the user's ``OMP_NUM_THREADS`` (``thread_bound``); set for this job and
    returned. torch's default is every core, and each loader worker runs one thread of its own, so with
    workers the step's threads and theirs oversubscribed the cores: on a 2-core CPU one worker slowed
    the step more than it fed it. Set at every job's start, so a local sweep's next job gets its own
    count back, and again once Lightning's launcher has set its own (``KeepIntraOpThreads``)."""
    cores = hardware.cores_per_process(hardware.usable_cores(), processes_per_node)
    threads = max(1, cores - workers)
    bound = thread_bound()
    if bound is not None and bound < threads:
        log.info("intra-op threads: %d (OMP_NUM_THREADS; %d cores for this process)", bound, cores)
        threads = bound
    elif workers:
        log.info(
            "intra-op threads: %d (%d cores for this process, %d of them to its loader workers)",
            threads,
            cores,
            workers,
        )
    torch.set_num_threads(threads)
    return threads


def thread_bound() -> Optional[int]:
    """The user's ``OMP_NUM_THREADS`` as a bound on the intra-op threads (torch reads it so too); None
    where unset or not a positive number. In a rank of the user's own torchrun with several ranks per
    node, a 1 is torchrun's default (it sets 1 wherever the variable is unset), not the user's: no
    bound, each rank takes its share of the node's cores. The ranks this framework launches get that
    share in the variable where the user set none (``trainer.launch.processes.ranks_env``, which marks
    them with ``LAUNCHED_RANKS_ENV``): a 1 there is the user's. (Not the stop grace that launcher also
    sets: the README tells users of their own torchrun to set it too.)"""
    n = env_count("OMP_NUM_THREADS")
    torchruns_default = (
        n == 1
        and "TORCHELASTIC_RUN_ID" in os.environ
        and LAUNCHED_RANKS_ENV not in os.environ
        and (env_count("LOCAL_WORLD_SIZE") or 1) > 1
    )
    return None if torchruns_default else n


class KeepIntraOpThreads(pl.Callback):
    """Sets the job's intra-op threads again once Lightning's launcher has run. Lightning's DDP strategy
    launches through ``_SubprocessScriptLauncher`` also where the ranks already exist (srun's tasks,
    one process), and its ``launch`` sets torch's threads to the affinity mask's CPUs over the
    processes wherever ``OMP_NUM_THREADS`` is unset (``_set_num_threads_if_needed``), after the job
    set its own: the loader workers' cores and a Slurm allocation were lost there."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def setup(self, trainer, pl_module, stage: str) -> None:
        torch.set_num_threads(self.threads)


def scaled_lr(cfg, world_size: int) -> tuple:
    """optim.lr for the effective batch size (batch x accumulate x world) per ``lr_scaling``, and a note saying so."""
    effective = int(cfg.data.batch_size) * cfg.accumulate * world_size
    ratio = effective / cfg.optim.ref_batch_size
    factor = {"linear": ratio, "sqrt": ratio**0.5}.get(cfg.lr_scaling, 1.0)
    base = cfg.optim.lr
    lr = base * factor
    if cfg.lr_scaling == "none":
        return lr, f"lr {base:g} (effective batch {effective}; lr_scaling=none)"
    return (
        lr,
        f"lr {base:g} at batch {cfg.optim.ref_batch_size} -> {lr:.4g} at effective batch {effective} (lr_scaling={cfg.lr_scaling})",
    )


def set_cuda_alloc_conf(conf: str | None) -> None:
    """PYTORCH_CUDA_ALLOC_CONF must be set before the CUDA caching allocator initializes."""
    if not conf:
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # CUDA already started in this process (a second sweep job): apply it to the live allocator
        torch.cuda.memory._set_allocator_settings(conf)
        log.warning(
            "cuda_alloc_conf=%s applied to an already initialized CUDA allocator (a previous job started CUDA)", conf
        )


def trainer_kwargs(cfg, plan: Plan, strategy: Any = None) -> dict:
    """Lightning Trainer arguments owned by the switchboard (``strategy``: the object build_strategy made)."""
    return {
        "accelerator": "gpu" if plan.accelerator == "cuda" else "cpu",
        "devices": plan.devices,
        "num_nodes": plan.num_nodes,
        "precision": plan.precision,
        "strategy": plan.strategy if strategy is None else strategy,
        "sync_batchnorm": bool(cfg.sync_batchnorm),
        "accumulate_grad_batches": cfg.accumulate,
        "benchmark": bool(cfg.cudnn_benchmark),
    }
