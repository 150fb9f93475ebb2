"""Lightning callbacks the trainer adds to every run: epoch timing and profiling."""

from .epoch_timer import EpochTimer
from .profiler import ProfilerCallback

__all__ = ["EpochTimer", "ProfilerCallback"]
