"""Record a job's result: metrics.json (a journal after every epoch, the final record at the end),
with the doctor's diagnosis and, with profile=true, the offline profile page. Written from whatever
was built, so a job that failed part-way still leaves its record.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf

from trainer import doctor
from trainer.callbacks import ProfilerCallback, StopAtAccuracy, profile_page
from trainer.callbacks.epoch_timer import VALIDATION_KEYS
from trainer.data import dali
from trainer.data.storage import is_remote
from trainer.launch.processes import allocator_loaded
from trainer.measure import loader_rates
from trainer.measure import metrics as metrics_mod
from trainer.measure.flops import mfu
from trainer.rank import global_rank
from trainer.run.parts import Callbacks, Parts, save_config
from trainer.switches.model_transforms import CompileAfterSetup

log = logging.getLogger(__name__)


def record(parts: Parts, status: str, error: Optional[str]) -> Dict[str, Any]:
    """The job's metrics.json (rank 0), with the doctor's diagnosis when it trained; returned too."""
    previous = parts.previous
    try:
        save_config(parts)  # a run that failed before it settled: the config it was given, and what it settled
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


def record_of(parts: Parts, status: str, error: Optional[str], running: bool = False) -> Dict[str, Any]:
    """metrics.json's fields from the parts (whatever was built before a failure).

    ``running``: the journal written after each epoch, on rank 0 alone, from an epoch-end hook. It
    reads no metric Lightning reduces on demand (``trainer.callback_metrics`` computes the epoch's
    ``sync_dist`` metrics when read there: an all-reduce rank 0 would enter alone, which the other
    ranks' next collective would pair with or hang on); so it leaves the train loss out (Lightning
    reduces it after the epoch-end callbacks anyway) and takes val_acc from the epoch records only.
    """
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
        else (None if running else _metric(trainer, "train/loss_epoch")),
        val_acc=earlier.get("val_acc") if earlier else _last_val_acc(timer, None if running else trainer),
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
            "data": {
                k: cfg.data[k] for k in ("name", "batch_size", "image_size", "num_workers", "val_split", "split_seed")
            },
            **(parts.datamodule.describe_loader() if parts.datamodule else {"num_workers": None, "decoder": None}),
            "allocator": allocator_loaded(),
            "wall_time_s": round(time.time() - parts.started, 2),
        },
    )


class MetricsJournal(pl.Callback):
    """After every training epoch, on rank 0: metrics.json rewritten (atomically, ``status: running``)
    with the run so far, so that a kill loses at most the epoch in flight. The run's own callback,
    placed after the epoch timer, whose records it writes."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and self.parts.timer is not None and self.parts.timer.epochs:
            metrics_mod.write(self.parts.metrics_path, record_of(self.parts, "running", None, running=True))


def _compile_warmup(found: "Callbacks | None") -> Optional[float]:
    """compile=true: the seconds the compiler's per-process warm-up took (in the first epoch's ``setup_s``)."""
    compile_step = found.find(CompileAfterSetup) if found else None
    seconds = compile_step.warmup_s if compile_step is not None else None
    return round(seconds, 3) if seconds is not None else None


def _stopped_at_acc(found: "Callbacks | None") -> Optional[int]:
    """The epoch whose val_acc reached ``stop_at_acc`` and stopped training (None: it did not stop early)."""
    stop = next((c for c in (found.all if found else []) if isinstance(c, StopAtAccuracy)), None)
    return stop.stopped_epoch if stop is not None else None


def _diagnose(parts: Parts, result: Dict[str, Any]) -> Dict[str, Any]:
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
    data = OmegaConf.to_container(parts.cfg.data, resolve=True)
    system = monitor.averages(steady or None) if monitor else {}
    return doctor.diagnose(
        metrics=result,
        system=system,
        hardware=parts.hw.as_dict(),
        flags=result["flags"],
        data=data,
        is_convnet=module is not None and any(isinstance(m, torch.nn.Conv2d) for m in module.modules()),
        h2d_share=profiler.h2d_share if profiler else None,
        device_memory_mb=device_memory,
        processes_per_node=getattr(parts.datamodule, "processes_per_node", 1),
        world_size=trainer.world_size,
        loader_rates=loader_rates.load() if parts.hw.accelerator == "cuda" else None,
        facts=doctor.Facts(
            dali_installed=dali.installed(),
            data_remote=data.get("name") in ("imagefolder", "packed", "parquet", "webdataset")
            and is_remote(data.get("root")),
        ),
    )


def _last_val_acc(timer, trainer) -> Optional[float]:
    """The last validation's val_acc as the epoch records hold it (either name a model logs, the mean
    over ranks), or what the trainer last logged where no epoch recorded one."""
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


def preempted_of(notes: Dict[str, Any], preemption) -> tuple:
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
