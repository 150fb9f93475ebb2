"""Build and run one training job from a composed config; always leave a metrics.json behind.

``run(cfg, out_dir)`` does not depend on Hydra's runtime state, so tests call it in-process with a
config composed by ``hydra.compose``; ``trainer.cli`` calls it once per (sweep) job.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf, open_dict

from trainer import config as config_mod
from trainer.errors import ConfigError, UserFacingError
from trainer.launch import stopping
from trainer.launch.processes import allocator_loaded
from trainer.measure import metrics as metrics_mod
from trainer.measure.flops import mfu, training_flops_per_sample
from trainer.measure.flops import peak_flops as peak_flops_of
from trainer.measure.memory import PeakMemory
from trainer.output import trackers
from trainer.output.run_dirs import refuse_finished_run_dir
from trainer.rank import global_rank, is_launched_rank

log = logging.getLogger(__name__)


def flags_of(cfg) -> Dict[str, Any]:
    return {k: OmegaConf.select(cfg, k) for k in config_mod.FLAG_KEYS}


@dataclass
class Parts:
    """One job: what it was asked, what was built for it (in build order), and what it settled.

    ``build`` fills the fields in order, so a job that fails part-way leaves what it built, and
    ``record`` reads whatever is there. ``settled`` holds the values the run decided itself (the
    class count the data has, the batch size a search chose, the scaled learning rate): they are set
    on the job's config in one place (``_settle``), which is then saved once as ``.hydra/config.yaml``.
    """

    cfg: Any
    out_dir: str
    overrides: List[str]
    config_path: Optional[str]
    timer: Any = None
    started: float = field(default_factory=time.time)
    requested: Dict[str, Any] = field(default_factory=dict)  # the flags as asked for (batch_size=auto stays "auto")
    hw: Any = None
    plan: Any = None
    ckpt_path: Optional[str] = None
    previous: Optional[Dict[str, Any]] = None  # the run dir's metrics.json when resuming
    datamodule: Any = None
    module: Any = None
    settled: Dict[str, Any] = field(default_factory=dict)
    strategy: Any = None  # Lightning's strategy object (built once the model exists)
    peak_flops: Optional[float] = None
    callbacks: "Callbacks | None" = None
    trainer: Any = None
    notes: Dict[str, Any] = field(default_factory=dict)  # extra metrics.json fields (lr_note, resumed_from, ...)
    config_saved: bool = False
    loggers: List[Any] = field(default_factory=list)  # the job's experiment trackers (trainer/trackers.py)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.out_dir, "metrics.json")


@dataclass
class Callbacks:
    """The job's own callbacks that its result reads back; ``all`` is every callback given to Lightning."""

    peak: Any
    preemption: Any
    bad_samples: Any
    nan_guard: Any
    monitor: Any
    all: List[Any]

    def find(self, kind) -> Any:
        return next((c for c in self.all if isinstance(c, kind)), None)


def run(cfg, out_dir: str, overrides: Optional[List[str]] = None, config_path: Optional[str] = None) -> Dict[str, Any]:
    """Train one job into ``out_dir``; return its metrics (also written to ``out_dir/metrics.json``).

    metrics.json is a journal: rewritten atomically (``status: running``) after every epoch, so a
    killed run keeps its finished epochs, and a resume merges them with its own. ``config_path``
    (Hydra's ``.hydra/config.yaml``) is rewritten once with the config that actually runs.

    Raises ConfigError for bad input (before anything is built) and re-raises training errors,
    after metrics.json records them.
    """
    from trainer.callbacks import EpochTimer

    freeze_long_lived_objects()
    parts = Parts(
        cfg=cfg, out_dir=out_dir, overrides=list(overrides or []), config_path=config_path, requested=flags_of(cfg)
    )
    # after every epoch (rank 0): the run so far, so a kill loses at most the epoch in flight.
    # train_loss: Lightning reduces the epoch's loss only after the epoch-end callbacks, so a
    # running record leaves it out rather than show the previous epoch's value
    parts.timer = EpochTimer(
        on_epoch=lambda: metrics_mod.write(parts.metrics_path, record_of(parts, "running", None, train_loss=False))
    )
    if not is_launched_rank():  # launched ranks: the launching process checked already
        # before the try: a refused dir gets nothing written into it, not even a failure record
        # (in-process callers have no Hydra callback to check it for them)
        refuse_finished_run_dir(out_dir, cfg.get("ckpt_path"))
    status, error = "ok", None
    stopping.stop_during_setup(True)  # until the first step: a stop signal ends the run at once
    try:
        with _compile_scope(parts):
            build(parts)
            status, error = fit(parts)
    except BaseException as e:
        status, error = _failure(parts, e)
        raise
    finally:
        stopping.stop_during_setup(False)  # the result below is written whatever arrives now
        final = record(parts, status, error)
        trackers.finish(parts.loggers, parts.out_dir, final)  # after metrics.json: a tracker never costs it
    return final


_FROZEN = False  # freeze_long_lived_objects has run in this process


def freeze_long_lived_objects() -> None:
    """Once per process, before its first job: what is alive then (torch's, Lightning's and Dynamo's
    modules, about half a million objects) is moved out of the garbage collector's sight (gc.freeze).

    Why: every full collection walks every tracked object. With these, one took 0.2-0.3 s on a
    2-core machine: the collection each job does before it measures its peak memory
    (``memory.PeakMemory``), and each automatic full collection Python starts inside the step loop,
    a pause in the middle of a timed epoch. Frozen, they cost nothing; the job's own objects are
    collected as before. Objects alive at this point live for the whole process anyway.
    """
    import gc

    global _FROZEN
    if not _FROZEN:
        gc.collect()
        gc.freeze()
        _FROZEN = True


@contextmanager
def _compile_scope(parts: Parts):
    """compile=true: the job's own compile cache and shape settings (``model_transforms.compile_scope``)."""
    from trainer.switches.model_transforms import compile_scope

    with compile_scope(parts.cfg, parts.out_dir) as cache:
        if cache:
            parts.notes["compile_cache"] = cache["state"]
        yield


# ---- building the parts, in order


def build(parts: Parts) -> None:
    """Everything the job needs, in the order it needs it: plan, data, model, settled values, Trainer."""
    _plan(parts)
    _trackers(parts)
    _data_and_model(parts)
    _settle(parts)
    _trainer(parts)


def _plan(parts: Parts) -> None:
    """Check the config, see the hardware, decide precision and strategy, set process-wide state."""
    import pytorch_lightning as pl

    from trainer.launch.checkpointing import resolve_ckpt_path
    from trainer.measure import hardware
    from trainer.output.console import quiet_known_warnings
    from trainer.switches import switchboard

    cfg = parts.cfg
    config_mod.validate(cfg)
    quiet_known_warnings()
    switchboard.set_cuda_alloc_conf(cfg.cuda_alloc_conf)  # before the first CUDA call
    parts.hw = hardware.detect(cfg.accelerator)
    parts.plan = switchboard.resolve(cfg, parts.hw)
    log.info(parts.plan.banner(cfg, parts.hw))
    for warning in parts.plan.warnings:
        log.warning(warning)
    parts.ckpt_path = resolve_ckpt_path(cfg.ckpt_path, parts.out_dir)
    if parts.ckpt_path:
        parts.previous = _previous_result(parts.out_dir)
        parts.timer.previous = (parts.previous or {}).get("epochs") or []
        parts.notes["resumed_from"] = parts.ckpt_path
        log.info("resuming from %s", parts.ckpt_path)
        # our sampler and ResumableState make mid-epoch resume exact; Lightning cannot see that
        warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch ended.*")
    # the datamodule's on_after_batch_transfer calls a LightningModule's own after normalizing
    # (see ImageDataModule.on_after_batch_transfer): Lightning's "overridden in both" is expected
    warnings.filterwarnings("ignore", message=".*overridden `on_after_batch_transfer` in both.*")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    switchboard.apply_global_settings(cfg)


def _trackers(parts: Parts) -> None:
    """The experiment trackers, opened before the data is built: a missing package or a server that
    does not answer stops the job here, in one paragraph."""
    parts.loggers = trackers.build(parts.cfg, parts.out_dir, parts.overrides, resuming=parts.ckpt_path is not None)


def _data_and_model(parts: Parts) -> None:
    """The datamodule (it counts the classes), the model for that many classes, its model-side flags."""
    from trainer.data import ImageDataModule
    from trainer.launch.processes import processes_per_node
    from trainer.models import build_module
    from trainer.models.build import check_user_module, user_lightning_module_class
    from trainer.switches import model_transforms

    cfg, overrides = parts.cfg, parts.overrides
    user_class = user_lightning_module_class(cfg)
    if user_class is not None:
        check_user_module(user_class, cfg, overrides)  # before any data is read or copied
    ranks_per_node = processes_per_node(cfg) if cfg.strategy != "auto" else 1
    parts.datamodule = ImageDataModule(
        cfg.data, cfg.seed, parts.plan.accelerator, ranks_per_node, channels_last=bool(cfg.channels_last)
    )
    parts.datamodule.step_clock = parts.timer.clock
    num_classes = parts.datamodule.build()
    if num_classes != cfg.data.num_classes:
        _check_given_num_classes(parts, num_classes)
        log.info("data.num_classes set to %d: the dataset has %d classes", num_classes, num_classes)
        _settle_value(parts, "data.num_classes", num_classes)  # the model is built for the classes the data has
    module = build_module(cfg)
    if user_class is None:  # a factory function may still return a LightningModule of the user's
        check_user_module(module, cfg, overrides)
    parts.module = model_transforms.prepare_model(module, cfg)
    _check_input_size(parts.module, parts.datamodule, cfg)
    if cfg.progressive_resize:
        _progressive_sizes(parts)


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
    import pytorch_lightning as pl

    from trainer.switches import switchboard

    cfg, plan = parts.cfg, parts.plan
    if cfg.data.batch_size == "auto":
        from trainer.switches.batch_finder import find_batch_size

        batch_size, parts.notes["batch_size_reason"] = find_batch_size(
            parts.module, parts.datamodule, cfg, plan.accelerator, plan.amp_dtype
        )
        _settle_value(parts, "data.batch_size", batch_size)
        pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the search consumed random numbers
    lr, parts.notes["lr_note"] = switchboard.scaled_lr(cfg, plan.world_size(parts.hw))
    _settle_value(parts, "optim.lr", lr)
    log.info(parts.notes["lr_note"])
    _save_config(parts)


def _settle_value(parts: Parts, key: str, value: Any) -> None:
    """The one place the run changes its config: a value it settled itself, kept in ``parts.settled`` too."""
    parts.settled[key] = value
    with open_dict(parts.cfg):
        OmegaConf.update(parts.cfg, key, value, merge=False)


def _save_config(parts: Parts) -> None:
    """Rewrite ``.hydra/config.yaml`` with the config that runs (Hydra saved it before scale= and the settled values)."""
    path = parts.config_path
    if parts.config_saved or global_rank() != 0 or not path or not os.path.isdir(os.path.dirname(path)):
        return
    metrics_mod.atomic_write_text(path, OmegaConf.to_yaml(parts.cfg, resolve=True))
    parts.config_saved = True


def _trainer(parts: Parts) -> None:
    """The strategy object (it needs the model), the callbacks, and Lightning's Trainer."""
    import pytorch_lightning as pl

    from trainer.launch.checkpointing import AtomicCheckpointIO
    from trainer.models import build_module
    from trainer.switches import switchboard

    cfg, plan = parts.cfg, parts.plan
    parts.timer.flops_per_sample = training_flops_per_sample(lambda: build_module(cfg), cfg.data.image_size)
    parts.timer.track_compiles = bool(cfg.compile)
    parts.peak_flops, parts.notes["peak_flops_source"] = peak_flops_of(plan.accelerator, plan.precision, bool(cfg.tf32))
    parts.timer.peak_flops = parts.peak_flops  # each epoch's MFU in the trackers
    parts.strategy = switchboard.build_strategy(cfg, plan, parts.hw, parts.module)
    parts.callbacks = build_callbacks(parts)
    parts.notes["validated_weights"] = "ema" if cfg.ema else "raw"  # and the checkpoints' state_dict
    # sharded strategies save with their own checkpoint IO
    plugins = [AtomicCheckpointIO()] if cfg.strategy in ("auto", "ddp") else []
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
    trackers.log_params(parts.loggers, trackers.params_of(cfg, parts.requested))


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
    import pytorch_lightning as pl

    from trainer.callbacks import BadSampleCounter, NaNGuard, ProfilerCallback, StepLoss, StopAtAccuracy, SystemMonitor
    from trainer.callbacks.ema import EMA
    from trainer.launch.checkpointing import PreemptionCallback, ResumableState, checkpoint_callbacks
    from trainer.models.classifier import ImageClassifier
    from trainer.switches import model_transforms

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
    return found


def _check_input_size(module, datamodule, cfg) -> None:
    """One sample through the model before training: a too-small image fails here, clearly."""
    import pytorch_lightning as pl
    import torch

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
    import torch

    from trainer.data.progressive import resize_batch, schedule

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


# ---- fitting


def fit(parts: Parts) -> tuple:
    """``Trainer.fit``; returns (status, error): a preemption or a stop is a failed run that resumes."""
    trainer, preemption = parts.trainer, parts.callbacks.preemption
    try:
        trainer.fit(
            parts.module,
            datamodule=parts.datamodule,
            ckpt_path=parts.ckpt_path,
            weights_only=True if parts.ckpt_path else None,
        )
    except SystemExit:
        # Lightning turns SIGTERM into SIGTERMException (a SystemExit with status 0) after the
        # step in which our PreemptionCallback saved last.ckpt: that is a preemption, not a crash
        if preemption.saved_at_step is None or preemption.exit_requested:
            raise  # a crash; or submitit requeued the job and exits this process: let it
    if preemption.saved_at_step is not None:
        return _preempted(parts.notes, preemption)
    if trainer.interrupted:
        return "failed", "interrupted (KeyboardInterrupt or signal) before the last epoch finished"
    return "ok", None


def _failure(parts: Parts, e: BaseException) -> tuple:
    preemption = parts.callbacks.preemption if parts.callbacks else None
    if preemption is not None and preemption.exit_requested:
        return _preempted(parts.notes, preemption)
    return "failed", (str(e) if isinstance(e, (UserFacingError, stopping.Stopped)) else metrics_mod.one_line(e))


# ---- recording the result


def record(parts: Parts, status: str, error: Optional[str]) -> Dict[str, Any]:
    """The job's metrics.json (rank 0), with the doctor's diagnosis when it trained; returned too."""
    previous = parts.previous
    try:
        _save_config(parts)  # a run that failed before it settled: the config it was given, and what it settled
    except Exception as e:  # metrics.json matters more than the config beside it: it is still written
        log.warning("could not save %s: %s", parts.config_path, metrics_mod.one_line(e))
    if _already_finished(previous, parts.timer, status):
        # resumed from the end of a finished run with nothing left to train: keep its result
        log.info(
            "this run had already finished (epochs %s); its metrics.json is unchanged. Raise trainer.max_epochs to train on.",
            _epoch_span(previous["epochs"]),
        )
        return dict(previous, already_finished=True)
    final = record_of(parts, status, error)
    trainer = parts.trainer
    if status == "ok" and parts.hw is not None and trainer is not None and trainer.is_global_zero:
        final["diagnosis"] = _diagnose(parts, final)
        log.info("doctor: %s", final["diagnosis"]["verdict"])
        for note in final["diagnosis"]["hardware"]:
            log.warning("doctor: %s", note)
    # rank 0 writes, also when the run failed before its Trainer existed (every rank would race to)
    if trainer.is_global_zero if trainer is not None else global_rank() == 0:
        metrics_mod.write(parts.metrics_path, final)
        _profile_page(parts, final)
    return final


def _profile_page(parts: Parts, final: Dict[str, Any]) -> None:
    """profile=true: the offline summary page, now that the doctor has spoken (rank 0)."""
    from trainer.output import profile_page

    if not parts.cfg.profile:
        return
    verdict = (final.get("diagnosis") or {}).get("verdict")
    title = " ".join(parts.overrides) or (parts.cfg.get("recipe") or "train")
    try:
        path = profile_page.write_page(os.path.join(parts.out_dir, "profiler"), verdict, title)
    except Exception as e:  # the traces and metrics.json are the product; the page is a view of them
        log.warning("could not write the profile summary page: %s", metrics_mod.one_line(e))
        return
    if path:
        log.info("profile summary (no network needed): %s", path)


def record_of(parts: Parts, status: str, error: Optional[str], train_loss: bool = True) -> Dict[str, Any]:
    """metrics.json's fields from the parts (whatever was built before a failure)."""
    cfg, timer, trainer, hw, plan = parts.cfg, parts.timer, parts.trainer, parts.hw, parts.plan
    found = parts.callbacks
    peak = found.peak if found else None
    summary = timer.summary(compiled=bool(cfg.compile))
    devices = trainer.world_size if trainer else 1
    summary["mfu"] = mfu(summary.get("tflops"), parts.peak_flops, devices)
    # nothing trained in this process (resumed at the very end): the last record's readings stand
    earlier = parts.previous if (parts.previous and not timer.epochs) else {}
    return metrics_mod.build(
        status=status,
        error=error,
        recipe=cfg.get("recipe"),
        flags=parts.requested,
        device={"accelerator": hw.accelerator, "name": hw.name, "count": devices} if hw else None,
        epochs=timer.history(),
        summary=summary,
        peak_memory=earlier.get("peak_memory_mb") if earlier else (peak.result_mb if peak else None),
        train_loss=earlier.get("train_loss")
        if earlier
        else (_metric(trainer, "train/loss_epoch") if train_loss else None),
        val_acc=earlier.get("val_acc") if earlier else _last_val_acc(timer, trainer),
        extra={
            "precision": plan.precision if plan else None,
            "batch_size": cfg.data.batch_size,
            "lr": cfg.optim.lr,
            "peak_memory_method": peak.method if peak else None,
            "peak_memory_reserved_mb": earlier.get("peak_memory_reserved_mb")
            if earlier
            else (peak.reserved_mb if peak else None),
            "peak_flops": parts.peak_flops,
            "skipped_samples": found.bad_samples.skipped if found and found.bad_samples else 0,
            "nan_skipped_steps": found.nan_guard.skipped if found and found.nan_guard else 0,
            "val_samples": earlier.get("val_samples") if earlier else timer.val_samples,
            "grad_scale": _grad_scale(trainer),
            "stopped_at_acc_epoch": _stopped_at_acc(found),
            "compile_warmup_s": _compile_warmup(found),
            **parts.notes,
            "overrides": parts.overrides,
            "data": {k: cfg.data[k] for k in ("name", "batch_size", "image_size", "num_workers")},
            "num_workers": parts.datamodule.num_workers if parts.datamodule else None,
            "allocator": allocator_loaded(),
            "decoder": parts.datamodule.decoder_in_use if parts.datamodule else None,
            "wall_time_s": round(time.time() - parts.started, 2),
        },
    )


def _compile_warmup(found: "Callbacks | None") -> Optional[float]:
    """compile=true: the seconds the compiler's per-process warm-up took (in the first epoch's ``setup_s``)."""
    from trainer.switches.model_transforms import CompileAfterSetup

    compile_step = found.find(CompileAfterSetup) if found else None
    seconds = compile_step.warmup_s if compile_step is not None else None
    return round(seconds, 3) if seconds is not None else None


def _stopped_at_acc(found: "Callbacks | None") -> Optional[int]:
    """The epoch whose val_acc reached ``stop_at_acc`` and stopped training (None: it did not stop early)."""
    from trainer.callbacks import StopAtAccuracy

    stop = next((c for c in (found.all if found else []) if isinstance(c, StopAtAccuracy)), None)
    return stop.stopped_epoch if stop is not None else None


def _diagnose(parts: Parts, result: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from trainer.callbacks import ProfilerCallback
    from trainer.output import doctor

    trainer, timer, module, monitor = parts.trainer, parts.timer, parts.module, parts.callbacks.monitor
    if monitor is not None and not monitor.samples:
        monitor.sample()
    profiler = parts.callbacks.find(ProfilerCallback)
    device_memory = None
    if parts.hw.accelerator == "cuda":
        device_memory = torch.cuda.get_device_properties(trainer.strategy.root_device).total_memory / 2**20
    # the same epochs data wait is measured on (this process's steady ones); the monitor's tree
    # holds this node's other ranks too (torchrun), so their CPU is not "other processes"
    steady = {e["epoch"] for e in timer.epochs if not e.get("warmup") and not e.get("partial")}
    system = monitor.averages(steady or None) if monitor else {}
    return doctor.diagnose(
        metrics=result,
        system=system,
        hardware=parts.hw.as_dict(),
        flags=result["flags"],
        data=OmegaConf.to_container(parts.cfg.data, resolve=True),
        is_convnet=module is not None and any(isinstance(m, torch.nn.Conv2d) for m in module.modules()),
        h2d_share=profiler.h2d_share if profiler else None,
        device_memory_mb=device_memory,
    )


def _previous_result(out_dir: str) -> Optional[Dict[str, Any]]:
    """What the run dir's metrics.json already holds (a resumed run merges its epochs into it)."""
    try:
        return metrics_mod.read(os.path.join(out_dir, "metrics.json"))
    except (OSError, ValueError):
        return None


def _last_val_acc(timer, trainer) -> Optional[float]:
    """The last validation's val_acc as the epoch records hold it (either name a model logs, the mean
    over ranks), or what the trainer last logged where no epoch recorded one."""
    from trainer.callbacks.epoch_timer import VALIDATION_KEYS

    recorded = [e["val_acc"] for e in timer.history() if e.get("val_acc") is not None]
    if recorded:
        return recorded[-1]
    return next((v for v in (_metric(trainer, n) for n in VALIDATION_KEYS["val_acc"]) if v is not None), None)


def _metric(trainer, name: str) -> Optional[float]:
    if trainer is None:
        return None
    value = trainer.callback_metrics.get(name)
    return round(float(value), 5) if value is not None else None


def _grad_scale(trainer) -> Optional[float]:
    """amp_dtype=fp16: the loss scale the GradScaler ended at (it halves on every skipped step)."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None) if trainer else None
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def _preempted(notes: Dict[str, Any], preemption) -> tuple:
    notes["preempted"] = True
    how = "stopped by Ctrl-C (SIGINT)" if preemption.received == "SIGINT" else f"preempted by {preemption.received}"
    return "failed", f"{how} at step {preemption.saved_at_step}; resume with ckpt_path=last"


def _already_finished(previous: Optional[Dict[str, Any]], timer, status: str) -> bool:
    return (
        bool(previous)
        and previous.get("status") == "ok"
        and status == "ok"
        and not timer.epochs
        and bool(previous.get("epochs"))
    )


def _epoch_span(epochs: List[Dict[str, Any]]) -> str:
    numbers = [e["epoch"] for e in epochs]
    return f"{min(numbers)}-{max(numbers)}" if len(numbers) > 1 else str(numbers[0])
