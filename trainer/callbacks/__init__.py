"""Lightning callbacks the trainer adds to runs: epoch timing, profiling, system monitor, NaN guard, bad-sample count."""

from .bad_samples import BadSampleCounter
from .epoch_timer import EpochTimer
from .nan_guard import NaNGuard
from .profiler import ProfilerCallback
from .system_monitor import SystemMonitor

__all__ = ["BadSampleCounter", "EpochTimer", "NaNGuard", "ProfilerCallback", "SystemMonitor"]
