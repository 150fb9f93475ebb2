"""Lightning callbacks the trainer adds to runs: epoch timing, profiling, system monitor, NaN guard, step loss, bad-sample count, stop at an accuracy."""

from .bad_samples import BadSampleCounter
from .epoch_timer import EpochTimer
from .nan_guard import NaNGuard
from .profiler import ProfilerCallback
from .step_loss import StepLoss
from .stop_at_acc import StopAtAccuracy
from .system_monitor import SystemMonitor

__all__ = [
    "BadSampleCounter",
    "EpochTimer",
    "NaNGuard",
    "ProfilerCallback",
    "StepLoss",
    "StopAtAccuracy",
    "SystemMonitor",
]
