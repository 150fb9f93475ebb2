"""The model-side flags, each applied by one function, in one order (as torchtitan's ``parallelize_*``).

The order, and why:

1. ``apply_activation_checkpointing`` (``activation_checkpointing=true``): wraps each repeated
   block's forward. First, so that whatever comes later (compile, FSDP) sees the checkpointed
   blocks. Under ``strategy=fsdp`` Lightning's FSDPStrategy checkpoints the blocks it wraps instead
   (``fsdp_checkpoint_policy``): checkpointing them twice would recompute twice.
2. ``apply_model_input`` (``channels_last=true``): weights converted before any wrapper copies
   them (FSDP1 keeps the strides it finds when it flattens, and trains them right only when it
   shards; FSDP2 refuses non-contiguous weights: ``switchboard.resolve`` refuses fsdp2 with
   channels_last, and fsdp with it where FSDP1 would not shard), and ``ModelInput`` converts every 4-D input at
   the start of each network's forward; for the built-in classifier it normalizes a uint8 batch
   there too, inside the compiled graph.
   The batch-size search runs after these two, on the eager model (``trainer.run``).
3. Data parallelism and sharding: Lightning's strategy wraps the model in ``Trainer.fit``
   (DDP; FSDP1 with ``fsdp_block_types``; FSDP2 by ``fully_shard`` in ``configure_model``).
4. ``apply_compile`` (``compile=true``) last, after wrapping: the documented order for FSDP2
   (``fully_shard`` then compile), and under DDP dynamo splits the graph at the gradient buckets
   only when it is compiled inside DDP's forward. ``CompileAfterSetup`` calls it from
   ``on_fit_start``, which Lightning runs after the strategy has set the model up. The compiler's
   per-process start-up is paid just before, on the rank's device (``warm_up_compiler``), so that
   the compiling steps' extra time (``compile_time_s``) is this job's graphs, in a sweep as alone.
   ``compile_scope`` gives each job its own on-disk compile cache and, with progressive_resize,
   static shapes per size.

Flags 2 and 4 act on the model's *networks*: the LightningModule's direct submodules that hold
parameters (the built-in classifier's ``net``; a user's own LightningModule's ``self.model``,
``self.backbone``, ...). Compiling the networks, not the LightningModule, keeps ``training_step``,
``self.log`` and the optimizer step out of the graph (dynamo would otherwise recompile Lightning's
``log`` once per metric name), works whether a ``training_step`` calls ``self(x)`` or
``self.net(x)``, and compiles in place (``nn.Module.compile``): checkpoint keys carry no
``_orig_mod.``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional

import pytorch_lightning as pl
import torch
from torch import nn
from torch._dynamo import config as dynamo_config
from torch._dynamo import maybe_mark_dynamic
from torch.utils.checkpoint import checkpoint

from trainer.data.gpu_transforms import normalize_uint8
from trainer.errors import ConfigError
from trainer.models.blocks import repeated_blocks

log = logging.getLogger(__name__)


def networks(module: nn.Module) -> List[nn.Module]:
    """The LightningModule's direct submodules that hold parameters; the module itself if none does."""
    found = [child for child in module.children() if any(True for _ in child.parameters())]
    return found or [module]


# ---- 1. activation checkpointing


def fsdp_checkpoint_policy(cfg, block_types: set):
    """``strategy=fsdp``: the block types FSDPStrategy checkpoints itself (``apply_activation_checkpointing`` then does nothing)."""
    return block_types if (cfg.activation_checkpointing and block_types) else None


def apply_activation_checkpointing(module: nn.Module, cfg) -> int:
    """Checkpoint each repeated block (non-reentrant): its activations are recomputed in backward.

    The block's ``forward`` is wrapped in place, so state-dict keys do not change (checkpoints
    load with the flag on or off), and it composes with torch.compile. Returns the number of blocks.
    """
    if not cfg.activation_checkpointing or cfg.strategy == "fsdp":  # fsdp: see fsdp_checkpoint_policy
        return 0

    blocks = repeated_blocks(module)
    if not blocks:
        raise ConfigError(
            f"'activation_checkpointing=true' found no repeated blocks to checkpoint in {type(module).__name__} "
            "(it looks for torchvision ResNet BasicBlock/Bottleneck, ViT EncoderBlock, or a 'blocks'/'layers' "
            "ModuleList, as in timm). Allowed: activation_checkpointing=false for this model."
        )
    for block in blocks:
        # a partial of the block itself (not a closure over its bound forward): a copy of the model
        # (measure.flops.meta_copy) calls its own block's forward, with its own weights
        block.forward = functools.partial(_checkpointed_forward, block, type(block).forward)
    log.info("activation checkpointing: %d blocks", len(blocks))
    return len(blocks)


def _checkpointed_forward(block, forward, *args, **kwargs):
    """``block``'s own ``forward`` (its class's), recomputed in the backward pass instead of keeping its
    activations: torch's ``checkpoint``, while gradients are on. Not on the meta device, where only the
    model's FLOPs are counted (``measure.flops``): MFU counts the model's math, not the recomputation."""
    on_meta = bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_meta
    if torch.is_grad_enabled() and not on_meta:
        if torch.compiler.is_compiling():
            # compiled, the graph's buffer updates are applied once, after its forward: the recomputation
            # in backward does not fold the batch in again (and Dynamo takes no context of ours here)
            return checkpoint(forward, block, *args, use_reentrant=False, **kwargs)
        context_fn = lambda: (contextlib.nullcontext(), _batchnorm_statistics_kept(block))  # noqa: E731
        return checkpoint(forward, block, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    return forward(block, *args, **kwargs)


@contextlib.contextmanager
def _batchnorm_statistics_kept(block: nn.Module):
    """A checkpointed block's recomputation in backward runs its forward in training mode again, and each
    BatchNorm folded the batch into its running statistics twice (the flag changed the eval model, not
    only memory). Meanwhile their momentum is 0 (the statistics stay); the batch count is put back."""
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    kept = [(m, m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in kept:
            m.momentum = momentum
            m.num_batches_tracked.copy_(count)


# ---- 2. memory format, and the input's conversion inside the network


class ModelInput:
    """The batch as a network takes it, converted at the start of the network's own forward (so with
    ``compile=true`` inside its compiled graph, where Inductor fuses it with the first layer's casts:
    a forward pre-hook would be compiled as a graph of its own, as ``nn.Module.compile`` runs hooks).

    - ``normalize``: a uint8 image batch (device-resident synthetic data, ``data.gpu_normalize``,
      nvJPEG) is converted and normalized here, in one pass (``gpu_transforms.normalize_uint8``),
      instead of by the datamodule before the step. Only for the built-in classifier, whose steps
      hand the batch to the network untouched (``run.build`` decides; the datamodule then leaves
      the batch uint8): a user's LightningModule gets float batches, as documented.
    - ``channels_last``: every 4-D input in NHWC, as the weights are, however a LightningModule's
      step calls the network; a normalized batch is written in that layout directly (no second copy).

    A float batch (the batch-size search's, the data loaders' without data.gpu_normalize) passes
    through the normalization unchanged.
    """

    def __init__(self, normalize: bool, channels_last: bool) -> None:
        self.normalize = normalize
        self.memory_format = torch.channels_last if channels_last else None

    def convert(self, a):
        if not isinstance(a, torch.Tensor) or a.ndim != 4:
            return a
        if self.normalize and a.dtype == torch.uint8:
            return normalize_uint8(a, self.memory_format)
        if self.memory_format is not None:
            return a.contiguous(memory_format=self.memory_format)
        return a


def _forward_with_input(self, *args, **kwargs):
    """A network's forward with its ``ModelInput`` first; the network's ``forward`` as a
    ``functools.partial`` over it (a deep copy, such as EMA's averaged model, binds it to the copy,
    and the network still pickles: a bound method of a function the class lacks does not)."""
    return type(self).forward(self, *(self.model_input.convert(a) for a in args), **kwargs)


def _convert_args(module, args):
    """The pre-hook form of ``_forward_with_input``, for a network with a ``forward`` of its own instance."""
    return tuple(module.model_input.convert(a) for a in args)


def apply_model_input(module: nn.Module, cfg, normalize: bool = False) -> None:
    """``channels_last=true``: the weights converted, and with ``normalize`` (the built-in
    classifier, see ``ModelInput``) the uint8 batch normalized: by each network's forward."""
    if cfg.channels_last:
        module.to(memory_format=torch.channels_last)
    if not (cfg.channels_last or normalize):
        return
    for net in networks(module):
        net.model_input = ModelInput(normalize, bool(cfg.channels_last))
        if "forward" in vars(net):  # a forward of the instance's own (not its class's): a pre-hook instead
            net.register_forward_pre_hook(_convert_args)
        else:
            net.forward = functools.partial(_forward_with_input, net)


def prepare_model(module: nn.Module, cfg, normalize_input: bool = False) -> nn.Module:
    """Steps 1 and 2: what must happen before the batch-size search and before any wrapper.
    ``normalize_input``: the networks normalize a uint8 batch themselves (``ModelInput``)."""
    apply_activation_checkpointing(module, cfg)
    apply_model_input(module, cfg, normalize_input)
    return module


# ---- 4. compile


def apply_compile(module: nn.Module, cfg) -> List[str]:
    """``compile=true``: compile each network in place; return their names (for the log).

    The only place the product calls the compiler (tests/test_shape.py checks it).

    Evaluation compiles a graph of its own (eval mode, no grad), and its batch dimension is marked
    dynamic (``maybe_mark_dynamic`` on dim 0 of each input with the batch's size, in eval mode only).
    Why: a validation set that is not a multiple of the batch size ends on a smaller batch, which a
    static graph recompiles for; marked, the one evaluation graph serves both sizes (but a last batch
    of one sample: dynamo specializes sizes 0 and 1). On an H100 (torch 2.11, ResNet-50, bf16,
    batches of 256 and a last one of 64) the first validation took 13.6 s marked against 28.9 s
    static (10 s to compile the static graph, 18 s to recompile it); later validations ran as fast
    either way. Where every batch is full, the dynamic graph compiles a few seconds longer. Why not
    pad that batch to full size instead: a user's network may return anything (a dict, a loss over
    the batch), so padded rows could not be dropped from its results here. Marked explicitly, it
    does not depend on ``automatic_dynamic_shapes`` (off under progressive_resize,
    ``compile_scope``), and training's graphs stay static.
    """
    if not cfg.compile:
        return []
    mode = None if cfg.compile_mode == "default" else cfg.compile_mode
    backend = getattr(cfg, "compile_backend", "inductor") or "inductor"

    def batch_dynamic_in_eval(net: nn.Module, compiled):
        def call(*args, **kwargs):
            if not net.training:
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0]
                for t in tensors:
                    if t.shape[0] == tensors[0].shape[0]:
                        maybe_mark_dynamic(t, 0)  # lets a size of 1 specialize instead of failing
            return compiled(*args, **kwargs)

        return call

    names = []
    for net in networks(module):
        net.compile(mode=mode, backend=backend)
        # nn.Module.compile's own slot, which __call__ runs (and pickling drops, as it drops the compiled call)
        net._compiled_call_impl = batch_dynamic_in_eval(net, net._compiled_call_impl)
        names.append(next((name for name, child in module.named_children() if child is net), type(net).__name__))
    return names


class _WarmUpNet(nn.Module):
    """The warm-up's small conv net. A class of its own, not an ``nn.Sequential``: torch 2.11's dynamo
    skips the frames of torch.nn's own modules, so a compiled ``nn.Sequential`` of built-in layers
    ran uncompiled there and the warm-up warmed nothing (2.14 traces it)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def warm_up_compiler(device: torch.device, backend: str = "inductor") -> float:
    """Pay the compiler's per-process start-up before the job's own graphs; returns the seconds it took.

    The first compile in a process also hashes torch's and Triton's sources, loads Inductor and its
    caches, and warms dynamo's tracing of common modules (about 2 s on a 2-core CPU). A later job
    of a local sweep finds all that done, so without this its ``compile_time_s`` read about a second
    shorter than the same job's run alone. A small conv net compiled forward and backward on the
    rank's device (the strategy's: under ``srun`` no ``LOCAL_RANK`` says which GPU is this rank's),
    then forgotten (``torch.compiler.reset``), leaves only this job's graphs in its compiling steps.
    It draws no random numbers from the job's generators (``fork_rng``): a compile=true run starts
    from the same state as a compile=false one. Its throwaway kernels go to the shared on-disk cache
    (not the job's own, ``compile_scope``), so that no job pays to generate them again.
    """
    start = time.perf_counter()
    with (
        _inductor_cache_dir(_shared_cache_dir[-1] if _shared_cache_dir else None),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
    ):
        holder = nn.Module()  # its one network: the small conv net, compiled whole
        holder.net = _WarmUpNet()
        holder.to(device)
        # default mode: no autotuning of a throwaway net
        apply_compile(holder, SimpleNamespace(compile=True, compile_mode="default", compile_backend=backend))
        holder.net(torch.randn(2, 3, 8, 8, device=device)).sum().backward()
    torch.compiler.reset()
    return time.perf_counter() - start


def compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process since its last reset (its own counter;
    0 where this torch does not keep it). A training step during which it grows compiled."""
    try:
        from torch._dynamo.utils import counters  # a private API: in the try, which answers 0 without it

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


COMPILE_CACHE = "compile_cache"  # in the run dir: Inductor's and Triton's on-disk caches of this job
_shared_cache_dir: List[Optional[str]] = []  # inside compile_scope: the cache dir outside it (None: Inductor's default)


@contextmanager
def _inductor_cache_dir(directory: Optional[str]) -> Iterator[None]:
    """Inductor's on-disk cache dir (None: its default) for the block; Inductor reads
    ``TORCHINDUCTOR_CACHE_DIR`` at each use (Triton's dir lies under it), and its in-memory caches of
    what it loaded are cleared on both switches, as torch's own ``temporary_cache_dir`` does."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if directory is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    _clear_inductor_caches()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
        _clear_inductor_caches()


@contextmanager
def compile_scope(cfg, out_dir: str) -> Iterator[Dict[str, Any]]:
    """``compile=true``: the compiler's process-wide settings for one job, restored when it ends.

    - **Its own on-disk cache**, ``<run dir>/compile_cache``: Inductor's FX graph and AOTAutograd
      caches, its generated kernels and Triton's, are on disk and on by default, and
      ``torch.compiler.reset()`` does not empty them; with the shared default dir a job's
      ``compile_time_s`` and first epoch depended on whether an earlier job or process had compiled
      the same graphs. Per run dir, every job of a sweep compiles cold, as it would alone on a fresh
      machine, and a resumed job (same dir) finds its own graphs: what it pays is what a restart of
      that job pays. The yielded record (``compile_cache`` in metrics.json) says which: ``cold`` or
      ``warm``. ``compile_cache=shared`` keeps Inductor's own dir (faster repeated runs of the same
      model; their compile times then depend on what ran before, and metrics.json says ``shared``).
    - **Static shapes for progressive_resize**: dynamo's ``automatic_dynamic_shapes`` recompiles the
      second input size as a dynamic graph, which every later size then runs, the final full-size
      epochs included, unlike the baseline's static graph. Off for the job, so each bucket's size gets
      a static graph of its own (the buckets keep the count small: the recompile limit is raised to
      hold them, where dynamo would otherwise fall back to running eagerly). Evaluation's batch
      dimension is the one exception, marked dynamic by ``apply_compile`` with or without this
      setting: a smaller last validation batch compiles no graph of its own.
    """
    if not cfg.compile:
        yield {}
        return

    if cfg.compile_cache == "shared":
        # as it is: the user's, or Inductor's default (one per CPU capability: trainer/__init__.py)
        directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        record = {"dir": directory, "state": "shared"}
    else:
        directory = os.path.abspath(os.path.join(out_dir, COMPILE_CACHE))
        record = {"dir": directory, "state": "warm" if os.path.isdir(directory) and os.listdir(directory) else "cold"}
    patches: Dict[str, Any] = {}
    if cfg.progressive_resize:
        # train sizes (at most one per epoch) + validation's full size, in train and eval mode
        limit = max(8, 2 * int(cfg.trainer.max_epochs or 1) + 2)
        name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
        patches = {"automatic_dynamic_shapes": False, name: max(getattr(dynamo_config, name), limit)}
    _shared_cache_dir.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    try:
        with _inductor_cache_dir(directory), dynamo_config.patch(patches) if patches else nullcontext():
            yield record
    finally:
        _shared_cache_dir.pop()


def _clear_inductor_caches() -> None:
    """Inductor's in-memory caches of what it loaded from the cache dir (what torch's own
    ``temporary_cache_dir`` clears when it switches dirs)."""
    try:
        from torch._inductor.utils import clear_caches  # a private API: in the try, which passes without it

        clear_caches()
    except Exception:
        pass


class CompileAfterSetup(pl.Callback):
    """Warms the compiler up on the rank's device, then calls ``apply_compile`` once the strategy has
    wrapped or sharded the model (see step 4)."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.compiled: List[str] = []
        self.warmup_s: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if not self.compiled:
            self.warmup_s = warm_up_compiler(trainer.strategy.root_device, self.cfg.get("compile_backend", "inductor"))
            self.compiled = apply_compile(pl_module, self.cfg)
            log.info(
                "compile: %s compiled in place (compile_mode=%s, compile_backend=%s)",
                ", ".join(self.compiled),
                self.cfg.compile_mode,
                self.cfg.get("compile_backend", "inductor"),
            )
