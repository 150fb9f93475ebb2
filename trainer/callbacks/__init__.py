"""Lightning callbacks the trainer adds to runs: checkpoints and the stop that saves first
(``checkpointing``), epoch timing, profiling, system monitor, NaN guard, step loss, bad-sample count,
stop at an accuracy.

``profile_page`` is the profiler's offline page. May use every part below ``run`` (``switches``,
``models``, ``data``, ``doctor``, ``tracking``, ``launch``, ``console``, ``measure``, ``config``, the base
modules); never ``run``, ``report`` or the commands.
"""

from trainer.callbacks.bad_samples import BadSampleCounter
from trainer.callbacks.epoch_timer import EpochTimer
from trainer.callbacks.nan_guard import NaNGuard
from trainer.callbacks.profiler import ProfilerCallback
from trainer.callbacks.step_loss import StepLoss
from trainer.callbacks.stop_at_acc import StopAtAccuracy
from trainer.callbacks.system_monitor import SystemMonitor

__all__ = [
    "BadSampleCounter",
    "EpochTimer",
    "NaNGuard",
    "ProfilerCallback",
    "StepLoss",
    "StopAtAccuracy",
    "SystemMonitor",
]
