"""Run one training job from a composed config; always leave a metrics.json behind.

``run(cfg, out_dir)`` does not depend on Hydra's runtime state, so tests call it in-process with a
config composed by ``hydra.compose``; ``trainer.cli`` calls it once per (sweep) job. It builds the
parts (``trainer.run.build``), fits them (``fit`` below) and records the result
(``trainer.run.record``), in that order, whatever fails.
"""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from trainer import tracking
from trainer.callbacks import EpochTimer
from trainer.errors import UserFacingError
from trainer.launch import stopping
from trainer.launch.run_dirs import forget_earlier_config, refuse_finished_run_dir
from trainer.measure import metrics as metrics_mod
from trainer.rank import is_launched_rank
from trainer.run.build import build
from trainer.run.parts import Parts, flags_of
from trainer.run.record import preempted_of, record
from trainer.switches.model_transforms import compile_scope

log = logging.getLogger(__name__)


def run(cfg, out_dir: str, overrides: Optional[List[str]] = None, config_path: Optional[str] = None) -> Dict[str, Any]:
    """Train one job into ``out_dir``; return its metrics (also written to ``out_dir/metrics.json``).

    metrics.json is a journal: rewritten atomically (``status: running``) after every epoch, so a
    killed run keeps its finished epochs, and a resume merges them with its own. ``config_path``
    (Hydra's ``.hydra/config.yaml``) is rewritten once with the config that actually runs.

    Raises ConfigError for bad input (before anything is built) and re-raises training errors,
    after metrics.json records them.
    """
    freeze_long_lived_objects()
    # as composed: nothing of the job writes its config but the values it settles (build._settle_value)
    OmegaConf.set_readonly(cfg, True)
    parts = Parts(
        cfg=cfg, out_dir=out_dir, overrides=list(overrides or []), config_path=config_path, requested=flags_of(cfg)
    )
    parts.timer = EpochTimer()
    if not is_launched_rank():  # launched ranks: the launching process checked already
        # before the try: a refused dir gets nothing written into it, not even a failure record
        # (in-process callers have no Hydra callback to check it for them)
        refuse_finished_run_dir(out_dir, cfg.get("ckpt_path"))
    status, error = "ok", None
    stopping.stop_during_setup(True)  # until the first step: a stop signal ends the run at once
    try:
        with _compile_scope(parts):
            build(parts)
            forget_earlier_config(out_dir)  # from its first step on, the run's config files are this attempt's
            status, error = fit(parts)
    except BaseException as e:
        status, error = _failure(parts, e)
        raise
    finally:
        stopping.stop_during_setup(False)  # the result below is written whatever arrives now
        final = record(parts, status, error)
        tracking.finish(parts.loggers, parts.out_dir, final)  # after metrics.json: a tracker never costs it
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
    global _FROZEN
    if not _FROZEN:
        gc.collect()
        gc.freeze()
        _FROZEN = True


@contextmanager
def _compile_scope(parts: Parts):
    """compile=true: the job's own compile cache and shape settings (``model_transforms.compile_scope``)."""
    with compile_scope(parts.cfg, parts.out_dir) as cache:
        if cache:
            parts.notes["compile_cache"] = cache["state"]
        yield


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
        return preempted_of(parts.notes, preemption)
    if trainer.interrupted:
        return "failed", "interrupted (KeyboardInterrupt or signal) before the last epoch finished"
    return "ok", None


def _failure(parts: Parts, e: BaseException) -> tuple:
    preemption = parts.callbacks.preemption if parts.callbacks else None
    if preemption is not None and preemption.exit_requested:
        return preempted_of(parts.notes, preemption)
    return "failed", (str(e) if isinstance(e, (UserFacingError, stopping.Stopped)) else metrics_mod.one_line(e))
