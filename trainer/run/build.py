"""Build a job's parts in the order each needs the last: the plan, the trackers, the data and the
model, the values the run settles itself, then the strategy, the callbacks and Lightning's Trainer.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from typing import Any, Dict

import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf, open_dict, read_write

from trainer import config as config_mod
from trainer import tracking
from trainer.callbacks import BadSampleCounter, NaNGuard, ProfilerCallback, StepLoss, StopAtAccuracy, SystemMonitor
from trainer.callbacks.checkpointing import PreemptionCallback, ResumableState, checkpoint_callbacks
from trainer.callbacks.ema import EMA, RawWeightsOfAnEmaCheckpoint
from trainer.console import quiet_known_warnings
from trainer.data.datamodule import ImageDataModule
from trainer.data.progressive import resize_batch, schedule
from trainer.errors import ConfigError, UserFacingError
from trainer.launch.checkpoint_files import AtomicCheckpointIO, resolve_ckpt_path
from trainer.launch.processes import processes_per_node
from trainer.launch.slurm import srun_ranks_environment
from trainer.measure import hardware
from trainer.measure.flops import peak_flops as peak_flops_of
from trainer.measure.flops import training_flops_per_sample
from trainer.measure.memory import PeakMemory
from trainer.models import build_module
from trainer.models.build import check_user_module, user_lightning_module_class
from trainer.models.classifier import ImageClassifier
from trainer.run.checkpoint_fit import check_checkpoint, check_fits, lr_it_resumes_at
from trainer.run.parts import Callbacks, Parts, previous_result, save_config
from trainer.run.record import MetricsJournal
from trainer.switches import model_transforms, switchboard
from trainer.switches.batch_finder import find_batch_size

log = logging.getLogger(__name__)


def build(parts: Parts) -> None:
    """Everything the job needs, in the order it needs it: plan, data, model, settled values, Trainer."""
    _plan(parts)
    _trackers(parts)
    _data_and_model(parts)
    _settle(parts)
    _trainer(parts)


def _plan(parts: Parts) -> None:
    """Check the config, see the hardware, decide precision and strategy, set process-wide state."""
    cfg = parts.cfg
    given = switchboard.launched_plan()  # a launched rank: its launcher checked the config and resolved it
    if given is None:
        config_mod.validate(cfg)
    quiet_known_warnings()
    switchboard.set_cuda_alloc_conf(cfg.cuda_alloc_conf)  # before the first CUDA call
    parts.hw = hardware.detect(cfg.accelerator)
    parts.plan = given or switchboard.resolve(cfg, parts.hw)
    log.info(parts.plan.banner(cfg, parts.hw))
    for warning in parts.plan.warnings:
        log.warning(warning)
    try:
        parts.ckpt_path = resolve_ckpt_path(cfg.ckpt_path, parts.out_dir)
    except UserFacingError:
        # a resume that cannot start (no such checkpoint, none of them readable): the failure record
        # keeps the epochs the dir's metrics.json holds (it was rewritten with none)
        _merge_previous(parts)
        raise
    if parts.ckpt_path:
        _merge_previous(parts)
        _warn_if_the_held_out_images_moved(parts)
        check_checkpoint(parts.ckpt_path)
        parts.notes["resumed_from"] = parts.ckpt_path
        log.info("resuming from %s", parts.ckpt_path)
        # our sampler and ResumableState make mid-epoch resume exact; Lightning cannot see that
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch ended.*")
    # the datamodule's on_after_batch_transfer calls a LightningModule's own after normalizing
    # (see ImageDataModule.on_after_batch_transfer): Lightning's "overridden in both" is expected
    warnings.filterwarnings("ignore", message=".*overridden `on_after_batch_transfer` in both.*")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    switchboard.apply_global_settings(cfg)


def _merge_previous(parts: Parts) -> None:
    """A resumed run's record continues what its dir's metrics.json holds (its epochs first)."""
    parts.previous = previous_result(parts.out_dir)
    parts.timer.previous = (parts.previous or {}).get("epochs") or []


# the formats that hold out data.val_split of a folder or of shards themselves (data.split_seed)
SPLITTING_FORMATS = ("imagefolder", "builtin", "packed", "parquet", "webdataset")


def _warn_if_the_held_out_images_moved(parts: Parts) -> None:
    """A run started before data.split_seed (its record has none) held out images drawn with its own
    seed, and data=packed with one permutation of all images: resumed now, where those differ, it may
    validate on images it trained on. Said, not refused: the weights are sound, the val_acc is not."""
    cfg, earlier = parts.cfg, (parts.previous or {}).get("data") or {}
    if not earlier or "split_seed" in earlier or cfg.data.name not in SPLITTING_FORMATS or not cfg.data.val_split:
        return
    if cfg.data.name == "packed" or cfg.seed != cfg.data.split_seed:
        log.warning(
            "this run was started before data.split_seed: where its data had no val/ folder, the images it held out "
            "were drawn with seed=%s%s, and data.split_seed=%s draws others. Its val_acc from here on may count images "
            "it trained on; train it afresh (or give data.split_seed=%s where data=packed is not used) to compare it.",
            cfg.seed,
            " (data=packed: from one permutation of all images)" if cfg.data.name == "packed" else "",
            cfg.data.split_seed,
            cfg.seed,
        )


def _trackers(parts: Parts) -> None:
    """The experiment trackers, opened before the data is built: a missing package or a server that
    does not answer stops the job here, in one paragraph."""
    parts.loggers = tracking.build(parts.cfg, parts.out_dir, parts.overrides, resuming=parts.ckpt_path is not None)


def _data_and_model(parts: Parts) -> None:
    """The datamodule (it counts the classes), the model for that many classes, its model-side flags."""
    cfg, overrides = parts.cfg, parts.overrides
    user_class = user_lightning_module_class(cfg)
    if user_class is not None:
        check_user_module(user_class, cfg, overrides)  # before any data is read or copied
    ranks_per_node = processes_per_node(cfg) if cfg.strategy != "auto" else 1
    parts.datamodule = ImageDataModule(
        cfg.data, cfg.seed, parts.plan.accelerator, ranks_per_node, channels_last=bool(cfg.channels_last)
    )
    parts.timer.clock.reads(parts.datamodule.prefetch_waits)
    num_classes = parts.datamodule.build()
    # the cores the loader workers leave (the workers count is final once the data is built)
    parts.notes["intra_op_threads"] = switchboard.set_intra_op_threads(parts.datamodule.num_workers, ranks_per_node)
    if num_classes != cfg.data.num_classes:
        _check_given_num_classes(parts, num_classes)
        log.info("data.num_classes set to %d: the dataset has %d classes", num_classes, num_classes)
        _settle_value(parts, "data.num_classes", num_classes)  # the model is built for the classes the data has
    module = build_module(cfg)
    _check_no_empty_layers(module, cfg)
    if user_class is None:  # a factory function may still return a LightningModule of the user's
        check_user_module(module, cfg, overrides)
    normalize_input = _network_normalizes(module, cfg)
    parts.module = model_transforms.prepare_model(module, cfg, normalize_input)
    parts.datamodule.model_normalizes = normalize_input  # uint8 batches reach the network as they are
    _check_input_size(parts.module, parts.datamodule, cfg)
    if cfg.progressive_resize:
        _progressive_sizes(parts)
    if parts.ckpt_path:
        check_fits(parts.ckpt_path, parts.module, cfg)


def _network_normalizes(module, cfg) -> bool:
    """Whether the network itself normalizes a uint8 batch (``model_transforms.ModelInput``): the
    built-in classifier hands the batch to its network untouched unless it mixes batches (mixup and
    cutmix blend float images), and progressive_resize resizes the batch before the step (float). A
    subclass with steps of its own may do float maths on the batch first: it gets float batches."""
    own_steps = any(
        getattr(type(module), step, None) is not getattr(ImageClassifier, step)
        for step in ("training_step", "validation_step", "forward")
    )
    return (
        isinstance(module, ImageClassifier) and not own_steps and module.mixing is None and not cfg.progressive_resize
    )


def _check_given_num_classes(parts: Parts, num_classes: int) -> None:
    """A data.num_classes the user gave that the data contradicts is an error; the default just follows the data."""
    cfg = parts.cfg
    if any(o.lstrip("+").split("=", 1)[0] == "data.num_classes" for o in parts.overrides):
        names = [str(c) for c in parts.datamodule.classes or []]
        listed = f" ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})" if names else ""
        raise ConfigError(
            f"'data.num_classes={cfg.data.num_classes}' was given, but the data ({cfg.data.name}) has {num_classes} classes{listed}. "
            "Drop data.num_classes (it follows the data), or give the number the data has."
        )


def _settle(parts: Parts) -> None:
    """The values the run decides itself: the batch size (data.batch_size=auto) and the scaled lr.

    Then the job's config is complete, and it is saved once as ``.hydra/config.yaml``.
    """
    cfg, plan = parts.cfg, parts.plan
    if cfg.data.batch_size == "auto":
        batch_size, parts.notes["batch_size_reason"] = find_batch_size(
            parts.module, parts.datamodule, cfg, plan.accelerator, plan.amp_dtype
        )
        _settle_value(parts, "data.batch_size", batch_size)
        pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the search consumed random numbers
    lr, parts.notes["lr_note"] = switchboard.scaled_lr(cfg, plan.world_size(parts.hw))
    resumed = (
        lr_it_resumes_at(parts.ckpt_path) if parts.ckpt_path and isinstance(parts.module, ImageClassifier) else None
    )
    if resumed is not None and not math.isclose(resumed, lr, rel_tol=1e-6):
        # recorded as what runs (metrics.json, the trackers, .hydra/config.yaml), and said
        log.warning(
            "resuming at the checkpoint's lr %g: its optimizer and schedule carry on; this config's lr %g "
            "(optim.lr, lr_scaling, the batch) applies to a run started afresh",
            resumed,
            lr,
        )
        parts.notes["lr_note"] += f"; resumed at the checkpoint's lr {resumed:g}, not this config's"
        lr = resumed
    _settle_value(parts, "optim.lr", lr)
    log.info(parts.notes["lr_note"])
    save_config(parts)


def _settle_value(parts: Parts, key: str, value: Any) -> None:
    """The one place the run changes its config (read-only from composition on: ``trainer.run.job.run``):
    a value it settled itself, kept in ``parts.settled`` too."""
    parts.settled[key] = value
    with read_write(parts.cfg), open_dict(parts.cfg):
        OmegaConf.update(parts.cfg, key, value, merge=False)


def _trainer(parts: Parts) -> None:
    """The strategy object (it needs the model), the callbacks, and Lightning's Trainer."""
    cfg, plan = parts.cfg, parts.plan
    parts.timer.flops_per_sample = training_flops_per_sample(
        parts.module, cfg.data.image_size, rebuild=lambda: build_module(cfg)
    )
    parts.timer.track_compiles = bool(cfg.compile)
    parts.peak_flops, parts.notes["peak_flops_source"] = peak_flops_of(plan.accelerator, plan.precision, bool(cfg.tf32))
    parts.timer.peak_flops = parts.peak_flops  # each epoch's MFU in the trackers
    parts.strategy = switchboard.build_strategy(cfg, plan, parts.hw, parts.module)
    parts.callbacks = build_callbacks(parts)
    parts.notes["validated_weights"] = "ema" if cfg.ema else "raw"  # and the checkpoints' state_dict
    # sharded strategies save with their own checkpoint IO
    plugins = [AtomicCheckpointIO()] if cfg.strategy in ("auto", "ddp") else []
    plugins += [env for env in (srun_ranks_environment(),) if env is not None]
    parts.trainer = pl.Trainer(
        **switchboard.trainer_kwargs(cfg, plan, parts.strategy),
        **config_mod.lightning_trainer_args(cfg.trainer),
        enable_progress_bar=_show_progress_bar(cfg),
        plugins=plugins,
        profiler=parts.timer.clock,  # times the loader fetch and the batch transfer (see StepClock)
        callbacks=parts.callbacks.all,
        logger=parts.loggers,
        default_root_dir=parts.out_dir,
        enable_checkpointing=cfg.checkpoint.enabled,
        **_validation_schedule(cfg),
    )
    tracking.log_params(parts.loggers, tracking.params_of(cfg, parts.requested))


def _validation_schedule(cfg) -> Dict[str, Any]:
    """``report.val_per_epoch=N``: validate every 1/N of each epoch's batches (Lightning's own
    ``val_check_interval``); the epoch timer records each validation with its training time."""
    n = cfg.report.val_per_epoch
    return {"val_check_interval": 1.0 / n} if n > 1 else {}


def _show_progress_bar(cfg) -> bool:
    """``trainer.enable_progress_bar=null`` (default): only when stderr is a terminal."""
    show = cfg.trainer.enable_progress_bar
    return sys.stderr.isatty() if show is None else bool(show)


def build_callbacks(parts: Parts) -> Callbacks:
    """Every callback of the job, in one place (the order is the order Lightning calls them in)."""
    cfg, out_dir = parts.cfg, parts.out_dir
    checkpoint_dir = os.path.join(out_dir, "checkpoints")
    found = Callbacks(
        peak=PeakMemory(parts.plan.accelerator),
        preemption=PreemptionCallback(os.path.join(checkpoint_dir, "last.ckpt")),
        bad_samples=BadSampleCounter() if cfg.data.name != "synthetic" else None,
        nan_guard=NaNGuard(cfg.on_nan, checkpoint_dir if cfg.checkpoint.enabled else None)
        if cfg.on_nan != "off"
        else None,
        monitor=SystemMonitor(cfg.monitor.interval_s) if cfg.monitor.enabled else None,
        all=[],
    )
    found.all = [
        parts.timer,
        MetricsJournal(parts),  # after the timer: the epoch it recorded goes into metrics.json
        switchboard.KeepIntraOpThreads(parts.notes["intra_op_threads"]),
        found.peak,
        ResumableState(),
        found.preemption,
        found.monitor,
        found.bad_samples,
        found.nan_guard,
    ]
    if cfg.compile:
        found.all.append(model_transforms.CompileAfterSetup(cfg))
    if cfg.ema:
        found.all.append(EMA(cfg.ema_decay))
    elif parts.ckpt_path and cfg.strategy not in ("fsdp", "fsdp2"):  # (EMA is refused with them)
        found.all.append(RawWeightsOfAnEmaCheckpoint())
    if cfg.stop_at_acc is not None:
        found.all.append(StopAtAccuracy(cfg.stop_at_acc))
    if isinstance(parts.module, ImageClassifier):
        found.all.append(StepLoss())  # a user's module logs its own
    if cfg.profile:
        found.all.append(ProfilerCallback(os.path.join(out_dir, "profiler"), cfg.profiler))
    if _show_progress_bar(cfg):
        # a low refresh rate keeps the bar from costing time on fast steps
        found.all.append(pl.callbacks.TQDMProgressBar(refresh_rate=cfg.trainer.progress_refresh_rate))
    if cfg.checkpoint.enabled:
        found.all += checkpoint_callbacks(cfg.checkpoint, checkpoint_dir)
    found.all = [c for c in found.all if c is not None]
    _check_monitor(cfg, parts.module)
    return found


def _check_monitor(cfg, module) -> None:
    """checkpoint.monitor names a metric the built-in classifier logs (Lightning's ModelCheckpoint found
    out at the first validation's end, with a traceback). A user's module logs its own names."""
    monitor = cfg.checkpoint.monitor
    if cfg.checkpoint.enabled and monitor and isinstance(module, ImageClassifier):
        if monitor not in (*ImageClassifier.LOGGED_METRICS, "epoch", "step"):  # and Lightning's own two
            raise ConfigError(
                f"'checkpoint.monitor={monitor}': the model logs {', '.join(ImageClassifier.LOGGED_METRICS)}; choose one "
                "of those (val/acc with checkpoint.mode=max, a loss with checkpoint.mode=min), or checkpoint.monitor=null."
            )


def _check_no_empty_layers(module, cfg) -> None:
    """A size of 0 among model.* (model.width=0) builds layers with no weights, which failed only at the
    first batch, reported as an image size the model cannot take. Only where a model.* value is 0: a
    module may hold an empty parameter on purpose (a device marker), or one not made yet (Lazy layers)."""
    zero = [f"model.{k}=0" for k, v in cfg.model.items() if type(v) is int and v == 0]
    if not zero:
        return
    empty = [
        (name, tuple(p.shape))
        for name, p in module.named_parameters()
        if not isinstance(p, torch.nn.parameter.UninitializedParameter) and p.numel() == 0
    ]
    if empty:
        name, shape = empty[0]
        raise ConfigError(
            f"'{' '.join(zero)}' builds a model with {len(empty)} empty layer(s) ({name} of shape {list(shape)}). "
            "Give every width or size in model.* at least 1."
        )


def _check_input_size(module, datamodule, cfg) -> None:
    """One sample through the model before training: a too-small image fails here, clearly."""
    if type(module).forward is pl.LightningModule.forward:
        return  # a LightningModule without forward (Lightning does not need one): its own steps decide
    x = datamodule.example_batch(1)[0].repeat(2, 1, 1, 1)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(x)  # channels_last: the model's forward pre-hook converts the input
    except Exception as e:
        raise ConfigError(
            f"The model cannot take data.image_size={cfg.data.image_size} images ({type(e).__name__}: {str(e).splitlines()[0][:200]}). "
            "Use a larger data.image_size (ResNets need about 32 px or more; a ViT needs a multiple of model.patch_size)."
        ) from None
    finally:
        module.train(was_training)


def _progressive_sizes(parts: Parts) -> None:
    """progressive_resize: each epoch's training size, checked against the model and said before training."""
    cfg, p = parts.cfg, parts.cfg.progressive
    full = cfg.data.image_size
    if not cfg.trainer.max_epochs:
        raise ConfigError("'progressive_resize=true' needs trainer.max_epochs (its schedule is laid over the epochs).")
    if p.start_size is not None and not 8 <= p.start_size <= full:
        raise ConfigError(
            f"'progressive.start_size={p.start_size}': allowed are 8 .. data.image_size ({full}), or null (half of it)."
        )
    sizes = schedule(full, cfg.trainer.max_epochs, p.start_size, p.start_epoch, p.end_epoch, p.bucket)
    small = min(sizes)
    x = resize_batch(parts.datamodule.example_batch(1)[0].repeat(2, 1, 1, 1), small)
    was_training = parts.module.training
    parts.module.eval()
    try:
        with torch.no_grad():
            parts.module(x)
    except Exception as e:
        raise ConfigError(
            f"'progressive_resize=true' trains at {small} px first, and this model cannot take {small} px images "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160]}). Set progressive.start_size higher, or "
            "progressive_resize=false (a ViT's position embeddings fix its input size)."
        ) from None
    finally:
        parts.module.train(was_training)
    parts.datamodule.train_sizes = sizes
    parts.timer.train_size, parts.timer.full_size = parts.datamodule.train_size, full
    log.info(
        "progressive_resize: training sizes per epoch %s, validation at %d (%d distinct shapes%s)",
        sizes,
        full,
        len(set(sizes)),
        ": with compile=true at most that many compiled graphs" if cfg.compile else "",
    )
