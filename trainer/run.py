"""Build and run one training job from a composed config; always leave a metrics.json behind.

``run(cfg, out_dir)`` does not depend on Hydra's runtime state, so tests call it in-process with a
config composed by ``hydra.compose``; ``trainer.cli`` calls it once per (sweep) job.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf, open_dict

from . import config as config_mod
from . import metrics as metrics_mod
from . import stopping
from .errors import ConfigError, UserFacingError
from .flops import mfu
from .flops import peak_flops as peak_flops_of
from .flops import training_flops_per_sample
from .launch import allocator_loaded
from .outputs import refuse_finished_run_dir
from .memory import PeakMemory
from .rank import global_rank

log = logging.getLogger(__name__)


def flags_of(cfg) -> Dict[str, Any]:
    return {k: OmegaConf.select(cfg, k) for k in config_mod.FLAG_KEYS}


def _trainer_args(cfg) -> Dict[str, Any]:
    t = cfg.trainer
    return {
        "max_epochs": t.max_epochs,
        "limit_train_batches": t.limit_train_batches,
        "limit_val_batches": t.limit_val_batches,
        "log_every_n_steps": t.log_every_n_steps,
        "gradient_clip_val": t.gradient_clip_val,
        "gradient_clip_algorithm": t.gradient_clip_algorithm,
        "num_sanity_val_steps": t.num_sanity_val_steps,
        "check_val_every_n_epoch": t.check_val_every_n_epoch,
        "deterministic": t.deterministic,
    }


def _show_progress_bar(cfg) -> bool:
    """``trainer.enable_progress_bar=null`` (default): only when stderr is a terminal."""
    show = cfg.trainer.enable_progress_bar
    return sys.stderr.isatty() if show is None else bool(show)


def _callbacks(cfg, out_dir: str, timer, extra: List[Any]) -> List[Any]:
    import pytorch_lightning as pl

    from .callbacks import ProfilerCallback
    from .checkpointing import checkpoint_callbacks

    callbacks: List[Any] = [timer, *extra]
    if cfg.profile:
        callbacks.append(ProfilerCallback(os.path.join(out_dir, "profiler"), cfg.profiler))
    if _show_progress_bar(cfg):
        # a low refresh rate keeps the bar from costing time on fast steps
        callbacks.append(pl.callbacks.TQDMProgressBar(refresh_rate=cfg.trainer.progress_refresh_rate))
    if cfg.checkpoint.enabled:
        callbacks += checkpoint_callbacks(cfg.checkpoint, os.path.join(out_dir, "checkpoints"))
    return callbacks


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


def _diagnose(result: Dict[str, Any], cfg, hw, trainer, monitor, module, timer) -> Dict[str, Any]:
    import torch

    from . import doctor
    from .callbacks import ProfilerCallback

    if monitor is not None and not monitor.samples:
        monitor.sample()
    profiler = next((c for c in (trainer.callbacks if trainer else []) if isinstance(c, ProfilerCallback)), None)
    device_memory = None
    if hw.accelerator == "cuda":
        device_memory = torch.cuda.get_device_properties(trainer.strategy.root_device).total_memory / 2**20
    # the same epochs data wait is measured on (this process's steady ones); the monitor's tree
    # holds this node's other ranks too (torchrun), so their CPU is not "other processes"
    steady = {e["epoch"] for e in timer.epochs if not e.get("warmup") and not e.get("partial")}
    system = monitor.averages(steady or None) if monitor else {}
    return doctor.diagnose(
        metrics=result,
        system=system,
        hardware=hw.as_dict(),
        flags=result["flags"],
        data=OmegaConf.to_container(cfg.data, resolve=True),
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


def save_config(cfg, path: Optional[str]) -> None:
    """Rewrite ``.hydra/config.yaml`` with the config that actually ran (chosen batch size, scaled lr, classes)."""
    if path and os.path.isdir(os.path.dirname(path)):
        metrics_mod.atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))


def _metric(trainer, name: str) -> Optional[float]:
    if trainer is None:
        return None
    value = trainer.callback_metrics.get(name)
    return round(float(value), 5) if value is not None else None


def _grad_scale(trainer) -> Optional[float]:
    """amp_dtype=fp16: the loss scale the GradScaler ended at (it halves on every skipped step)."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None) if trainer else None
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def run(cfg, out_dir: str, overrides: Optional[List[str]] = None, config_path: Optional[str] = None) -> Dict[str, Any]:
    """Train one job into ``out_dir``; return its metrics (also written to ``out_dir/metrics.json``).

    metrics.json is a journal: rewritten atomically (``status: running``) after every epoch, so a
    killed run keeps its finished epochs, and a resume merges them with its own. ``config_path``
    (Hydra's ``.hydra/config.yaml``) is rewritten with the config that actually ran.

    Raises ConfigError for bad input (before anything is built) and re-raises training errors,
    after metrics.json records them.
    """
    from .callbacks import EpochTimer

    started = time.time()
    requested = flags_of(cfg)  # as asked for (data.batch_size=auto stays "auto"; the chosen size is batch_size)
    metrics_path = os.path.join(out_dir, "metrics.json")
    datamodule = hw = plan = trainer = peak = preemption = bad_samples = nan_guard = monitor = module = None
    previous: Optional[Dict[str, Any]] = None
    peak_flops = None
    status, error = "ok", None
    notes: Dict[str, Any] = {}

    def result(status: str, error: Optional[str], train_loss: bool = True) -> Dict[str, Any]:
        summary = timer.summary(compiled=bool(cfg.compile))
        devices = trainer.world_size if trainer else 1
        summary["mfu"] = mfu(summary.get("tflops"), peak_flops, devices)
        # nothing trained in this process (resumed at the very end): the last record's readings stand
        earlier = previous if (previous and not timer.epochs) else {}
        return metrics_mod.build(
            status=status,
            error=error,
            recipe=cfg.get("recipe"),
            flags=requested,
            device={"accelerator": hw.accelerator, "name": hw.name, "count": devices} if hw else None,
            epochs=timer.history(),
            summary=summary,
            peak_memory=earlier.get("peak_memory_mb") if earlier else (peak.result_mb if peak else None),
            train_loss=earlier.get("train_loss") if earlier else (_metric(trainer, "train/loss_epoch") if train_loss else None),
            val_acc=earlier.get("val_acc") if earlier else _metric(trainer, "val/acc"),
            extra={
                "precision": plan.precision if plan else None,
                "batch_size": cfg.data.batch_size,
                "lr": cfg.optim.lr,
                "peak_memory_method": peak.method if peak else None,
                "peak_memory_reserved_mb": earlier.get("peak_memory_reserved_mb") if earlier else (peak.reserved_mb if peak else None),
                "peak_flops": peak_flops,
                "skipped_samples": bad_samples.skipped if bad_samples else 0,
                "nan_skipped_steps": nan_guard.skipped if nan_guard else 0,
                "val_samples": earlier.get("val_samples") if earlier else timer.val_samples,
                "grad_scale": _grad_scale(trainer),
                **notes,
                "overrides": list(overrides or []),
                "data": {k: cfg.data[k] for k in ("name", "batch_size", "image_size", "num_workers")},
                "num_workers": datamodule.num_workers if datamodule else None,
                "allocator": allocator_loaded(),
                "decoder": datamodule.decoder if datamodule else None,
                "wall_time_s": round(time.time() - started, 2),
            },
        )

    def journal() -> None:
        """After every epoch (rank 0): the run so far, so a kill loses at most the epoch in flight."""
        # train_loss: Lightning reduces the epoch's loss only after the epoch-end callbacks, so a
        # running record leaves it out rather than show the previous epoch's value
        metrics_mod.write(metrics_path, result("running", None, train_loss=False))

    timer = EpochTimer(on_epoch=journal)
    if "LOCAL_RANK" not in os.environ:  # launched ranks: the launching process checked already
        # before the try: a refused dir gets nothing written into it, not even a failure record
        # (in-process callers have no Hydra callback to check it for them)
        refuse_finished_run_dir(out_dir, cfg.get("ckpt_path"))
    stopping.stop_during_setup(True)  # until the first step: a stop signal ends the run at once
    try:
        config_mod.validate(cfg)
        import warnings

        from .console import quiet_known_warnings

        quiet_known_warnings()

        import pytorch_lightning as pl
        from pytorch_lightning.loggers import TensorBoardLogger

        from . import hardware, model_transforms, switchboard
        from .callbacks import BadSampleCounter, NaNGuard, StepLoss, SystemMonitor
        from .checkpointing import AtomicCheckpointIO, PreemptionCallback, ResumableState, resolve_ckpt_path
        from .data import ImageDataModule
        from .launch import processes_per_node
        from .models import build_module
        from .models.build import check_user_module, user_lightning_module_class
        from .models.classifier import ImageClassifier

        switchboard.set_cuda_alloc_conf(cfg.cuda_alloc_conf)  # before the first CUDA call
        hw = hardware.detect(cfg.accelerator)
        plan = switchboard.resolve(cfg, hw)
        log.info(plan.banner(cfg, hw))
        for warning in plan.warnings:
            log.warning(warning)
        ckpt_path = resolve_ckpt_path(cfg.ckpt_path, out_dir)
        if ckpt_path:
            previous = _previous_result(out_dir)
            timer.previous = (previous or {}).get("epochs") or []
            notes["resumed_from"] = ckpt_path
            log.info("resuming from %s", ckpt_path)
            # our sampler and ResumableState make mid-epoch resume exact; Lightning cannot see that
            warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch ended.*")
        # the datamodule's on_after_batch_transfer calls a LightningModule's own after normalizing
        # (see ImageDataModule.on_after_batch_transfer): Lightning's "overridden in both" is expected
        warnings.filterwarnings("ignore", message=".*overridden `on_after_batch_transfer` in both.*")
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        switchboard.apply_global_settings(cfg)
        model_transforms.warm_up_compiler(cfg, plan.accelerator)

        user_class = user_lightning_module_class(cfg)
        if user_class is not None:
            check_user_module(user_class, cfg, overrides)  # before any data is read or copied
        datamodule = ImageDataModule(cfg.data, cfg.seed, plan.accelerator, processes_per_node(cfg) if cfg.strategy != "auto" else 1)
        datamodule.step_clock = timer.clock
        num_classes = datamodule.build()
        if num_classes != cfg.data.num_classes:
            if any(o.lstrip("+").split("=", 1)[0] == "data.num_classes" for o in overrides or []):
                names = [str(c) for c in datamodule.classes or []]
                listed = f" ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})" if names else ""
                raise ConfigError(
                    f"'data.num_classes={cfg.data.num_classes}' was given, but the data ({cfg.data.name}) has {num_classes} classes{listed}. "
                    "Drop data.num_classes (it follows the data), or give the number the data has."
                )
            log.info("data.num_classes set to %d: the dataset has %d classes", num_classes, num_classes)
            with open_dict(cfg):
                cfg.data.num_classes = num_classes
        module = build_module(cfg)
        if user_class is None:  # a factory function may still return a LightningModule of the user's
            check_user_module(module, cfg, overrides)
        module = model_transforms.prepare_model(module, cfg)
        _check_input_size(module, datamodule, cfg)
        with open_dict(cfg):
            if cfg.data.batch_size == "auto":
                from .batch_finder import find_batch_size

                cfg.data.batch_size, notes["batch_size_reason"] = find_batch_size(
                    module, datamodule, cfg, plan.accelerator, plan.amp_dtype
                )
                pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the search consumed random numbers
            notes["lr_note"] = switchboard.scale_lr(cfg, plan.world_size(hw))
        log.info(notes["lr_note"])
        if global_rank() == 0:
            save_config(cfg, config_path)  # what runs from here on: chosen batch size, scaled lr, classes
        timer.flops_per_sample = training_flops_per_sample(cfg)
        peak_flops, notes["peak_flops_source"] = peak_flops_of(plan.accelerator, plan.precision, bool(cfg.tf32))
        plan.strategy = switchboard.build_strategy(cfg, plan, hw, module)

        checkpoint_dir = os.path.join(out_dir, "checkpoints")
        preemption = PreemptionCallback(os.path.join(checkpoint_dir, "last.ckpt"))
        bad_samples = BadSampleCounter()
        nan_guard = NaNGuard(cfg.on_nan, checkpoint_dir if cfg.checkpoint.enabled else None)
        monitor = SystemMonitor(cfg.monitor.interval_s) if cfg.monitor.enabled else None
        peak = PeakMemory(plan.accelerator)
        extra_callbacks = [peak, ResumableState(), preemption] + ([monitor] if monitor else [])
        extra_callbacks += [bad_samples] if cfg.data.name != "synthetic" else []
        extra_callbacks += [nan_guard] if cfg.on_nan != "off" else []
        extra_callbacks += [model_transforms.CompileAfterSetup(cfg)] if cfg.compile else []
        extra_callbacks += [StepLoss()] if isinstance(module, ImageClassifier) else []  # a user's module logs its own
        # sharded strategies save with their own checkpoint IO
        plugins = [AtomicCheckpointIO()] if cfg.strategy in ("auto", "ddp") else []
        trainer = pl.Trainer(
            **switchboard.trainer_kwargs(cfg, plan),
            **_trainer_args(cfg),
            plugins=plugins,
            profiler=timer.clock,  # times the loader fetch and the batch transfer (see StepClock)
            callbacks=_callbacks(cfg, out_dir, timer, extra_callbacks),
            logger=TensorBoardLogger(save_dir=out_dir, name="", version="", default_hp_metric=False),
            default_root_dir=out_dir,
            enable_checkpointing=cfg.checkpoint.enabled,
            enable_progress_bar=_show_progress_bar(cfg),
            enable_model_summary=cfg.trainer.model_summary,
        )
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True if ckpt_path else None)
        except SystemExit:
            # Lightning turns SIGTERM into SIGTERMException (a SystemExit with status 0) after the
            # step in which our PreemptionCallback saved last.ckpt: that is a preemption, not a crash
            if preemption.saved_at_step is None or preemption.exit_requested:
                raise  # a crash; or submitit requeued the job and exits this process: let it
        if preemption.saved_at_step is not None:
            status, error = _preempted(notes, preemption)
        elif trainer.interrupted:
            status, error = "failed", "interrupted (KeyboardInterrupt or signal) before the last epoch finished"
    except BaseException as e:
        if preemption is not None and preemption.exit_requested:
            status, error = _preempted(notes, preemption)
        else:
            status, error = "failed", (str(e) if isinstance(e, (UserFacingError, stopping.Stopped)) else metrics_mod.one_line(e))
        raise
    finally:
        stopping.stop_during_setup(False)  # the result below is written whatever arrives now
        kept = _already_finished(previous, timer, status)
        if kept:
            # resumed from the end of a finished run with nothing left to train: keep its result
            log.info(
                "this run had already finished (epochs %s); its metrics.json is unchanged. Raise trainer.max_epochs to train on.",
                _epoch_span(previous["epochs"]),
            )
            final = dict(previous, already_finished=True)
        else:
            final = result(status, error)
            if status == "ok" and hw is not None and trainer is not None and trainer.is_global_zero:
                final["diagnosis"] = _diagnose(final, cfg, hw, trainer, monitor, module, timer)
                log.info("doctor: %s", final["diagnosis"]["verdict"])
                for note in final["diagnosis"]["hardware"]:
                    log.warning("doctor: %s", note)
            if trainer is None or trainer.is_global_zero:
                metrics_mod.write(metrics_path, final)
    return final


def _preempted(notes: Dict[str, Any], preemption) -> tuple:
    notes["preempted"] = True
    how = "stopped by Ctrl-C (SIGINT)" if preemption.received == "SIGINT" else f"preempted by {preemption.received}"
    return "failed", f"{how} at step {preemption.saved_at_step}; resume with ckpt_path=last"


def _already_finished(previous: Optional[Dict[str, Any]], timer, status: str) -> bool:
    return bool(previous) and previous.get("status") == "ok" and status == "ok" and not timer.epochs and bool(previous.get("epochs"))


def _epoch_span(epochs: List[Dict[str, Any]]) -> str:
    numbers = [e["epoch"] for e in epochs]
    return f"{min(numbers)}-{max(numbers)}" if len(numbers) > 1 else str(numbers[0])
